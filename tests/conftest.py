"""Shared fixtures: the repository root, the notebooks, and the built book."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def toc_files() -> list[str]:
    """Every page ``_toc.yml`` lists (its root page aside), in reading order, without suffix (``chapters/01-x/02-y``).

    Tests discover the pages from here: adding a page is adding its line to ``_toc.yml``.
    """
    import yaml

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                yield node["file"]
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    return list(walk(yaml.safe_load((ROOT / "_toc.yml").read_text())))


def chapter_notebooks() -> list[Path]:
    """The lesson pages: every notebook ``_toc.yml`` lists under ``chapters/``."""
    return [ROOT / f"{f}.ipynb" for f in toc_files() if f.startswith("chapters/") and (ROOT / f"{f}.ipynb").exists()]


def course_notebooks() -> list[Path]:
    """Every notebook of the book: chapters and exercises."""
    return sorted(
        p for d in ("chapters", "exercises") for p in (ROOT / d).rglob("*.ipynb")
        if ".ipynb_checkpoints" not in p.parts
    )


@pytest.fixture(scope="session")
def built_book(tmp_path_factory, executed_notebooks) -> Path:
    """Build the whole public book once, warnings as errors, and return its html folder.

    The public book, as ``scripts/book.sh`` builds it: each exercise is its student copy, rendered
    without running (scripts/student_pages.py). Chapter notebooks that nbval already ran and passed
    in this run (see the repository's conftest.py) are rendered from those outputs; the others are
    executed by the build. The build works on a copy of the sources, so the committed notebooks stay
    the instructor copies, without outputs.

    Set BOOK_HTML=path/to/_build/html to reuse a build (local loops only).
    """
    reuse = os.environ.get("BOOK_HTML")
    if reuse:
        return Path(reuse)
    import shutil

    import yaml
    from student_pages import copy_sources, make_student_pages

    out = tmp_path_factory.mktemp("book")
    src = copy_sources(out / "src")
    reused = sorted(rel for rel in executed_notebooks if not rel.startswith("exercises/"))
    for rel in reused:
        shutil.copyfile(executed_notebooks[rel], src / rel)
    config = yaml.safe_load((src / "_config.yml").read_text())
    config["execute"]["exclude_patterns"] = reused  # rendered from nbval's outputs
    (src / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    make_student_pages(src)  # the exercises: their student copies, not run
    cmd = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(src), "--all", "-W", "-n",
           "--keep-going", "--path-output", str(out)]
    env = dict(os.environ, LESSONLIB_STATIC_BUILD="1")  # as scripts/book.sh does
    proc = subprocess.run(cmd, cwd=src, capture_output=True, text=True, timeout=1500, env=env)
    log = (f"notebooks rendered from this run's nbval outputs: {len(reused)}\n"
           + "".join(f"  {rel}\n" for rel in reused) + proc.stdout + proc.stderr)
    (out / "build.log").write_text(log)
    if proc.returncode != 0:
        pytest.fail(f"jupyter-book build failed (exit {proc.returncode}):\n{log[-6000:]}")
    return out / "_build" / "html"
