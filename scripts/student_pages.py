"""The public book shows each exercise as its student copy: no solutions, no hidden tests, no summary.

    python scripts/student_pages.py DEST     copy the sources to DEST and make its exercises student copies

The committed exercise notebooks are the instructor copies, and ``exercises/grading.md`` the instructors' manual
(the public book shows a pointer to the instructors' book in its place). The public book is built from a copy of
the sources (``scripts/book.sh`` without ``--instructor``; ``built_book`` in tests/conftest.py) in which
every exercise notebook is replaced by ``lessonlib.grading.handout.student_notebook`` of it, the
generator that ``exercises/instructor.py student`` uses, and listed in ``execute.exclude_patterns``:
Sphinx renders it as written (the stubs would raise ``NotImplementedError`` if it ran), so the page
and its download button (the page's ``.ipynb``) carry the handout, without outputs.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What a copy of the sources leaves out (the build's own output, environments, caches).
IGNORE = (".git", ".venv", "_build", "__pycache__", ".pytest_cache", ".ipynb_checkpoints")


#: The public book's grading page: where the instructors' manual is.
GRADING_STUB = """# Running the grader

How to hand out the exercises, run the grader on what students hand in, and read what it flags for an
instructor is in the instructors' book, with the exercises' solutions. Build it from a checkout of the course
with `bash scripts/book.sh --instructor`, and keep it off the public site. The exercises themselves, their
objectives and their points are on the [exercises' overview](index.md).
"""


def copy_sources(dest: Path | str, root: Path | str = ROOT) -> Path:
    """Copy the book's sources from ``root`` to ``dest`` (made anew) and return ``dest``."""
    dest = Path(dest)
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(root, dest, ignore=shutil.ignore_patterns(*IGNORE))
    return dest


def make_student_pages(src: Path | str) -> list[str]:
    """Replace every exercise notebook of the source copy ``src`` by its student copy, and have the
    build render them without running them. Returns their paths relative to ``src``.

    Refuses a git checkout: the committed notebooks are the instructor copies.
    """
    import nbformat
    import yaml

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from lessonlib.grading.handout import answer_leaks, exercise_notebooks, lint, student_notebook

    src = Path(src)
    if (src / ".git").exists():
        raise ValueError(f"{src} is a checkout: make the student pages in a copy (copy_sources)")
    rels = []
    for path in exercise_notebooks(src / "exercises").values():
        nb = nbformat.read(path, as_version=4)
        problems = lint(nb, path.name)
        if problems:
            raise ValueError("\n".join(problems))
        student = student_notebook(nb)
        assert not answer_leaks(student), (path.name, answer_leaks(student))
        nbformat.write(student, path)
        rels.append(path.relative_to(src).as_posix())
    if not rels:
        raise ValueError(f"no exercise notebooks in {src / 'exercises'}")
    # The grader's manual tells which questions one library call answers and how the free-text screen decides:
    # instructors' reading, not students'. The public book keeps the page (the overview links it) as a pointer.
    (src / "exercises" / "grading.md").write_text(GRADING_STUB)
    config_path = src / "_config.yml"
    config = yaml.safe_load(config_path.read_text())
    execute = config.setdefault("execute", {})
    execute["exclude_patterns"] = sorted(set(execute.get("exclude_patterns") or []) | set(rels))
    config_path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return rels


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    dest = copy_sources(sys.argv[1])
    print(f"{len(make_student_pages(dest))} exercises as student copies in {dest}")
