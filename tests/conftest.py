"""Shared fixtures: the repository root, the notebooks, and the built book."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def course_notebooks() -> list[Path]:
    """Every notebook of the book: chapters and exercises."""
    return sorted(
        p for d in ("chapters", "exercises") for p in (ROOT / d).rglob("*.ipynb")
        if ".ipynb_checkpoints" not in p.parts
    )


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> Path:
    """Build the whole book once, warnings as errors, and return its html folder.

    Set BOOK_HTML=path/to/_build/html to reuse a build (local loops only).
    """
    reuse = os.environ.get("BOOK_HTML")
    if reuse:
        return Path(reuse)
    out = tmp_path_factory.mktemp("book")
    cmd = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(ROOT), "--all", "-W", "-n",
           "--keep-going", "--path-output", str(out)]
    env = dict(os.environ, LESSONLIB_STATIC_BUILD="1")  # as scripts/book.sh does
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500, env=env)
    log = proc.stdout + proc.stderr
    (out / "build.log").write_text(log)
    if proc.returncode != 0:
        pytest.fail(f"jupyter-book build failed (exit {proc.returncode}):\n{log[-6000:]}")
    return out / "_build" / "html"
