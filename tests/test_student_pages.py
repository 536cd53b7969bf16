"""The public book shows each exercise as its student copy (scripts/student_pages.py); the instructors' book,
built with ``scripts/book.sh --instructor``, shows the instructor copies. (The built pages: tests/test_book.py.)"""
from __future__ import annotations

import shutil

import nbformat
import pytest
import yaml

from conftest import ROOT
from lessonlib.grading.handout import answer_leaks, exercise_notebooks
from student_pages import make_student_pages


def test_the_build_copy_gets_the_student_copies_and_does_not_run_them(tmp_path):
    shutil.copytree(ROOT / "exercises", tmp_path / "exercises")
    shutil.copyfile(ROOT / "_config.yml", tmp_path / "_config.yml")
    rels = make_student_pages(tmp_path)
    stems = exercise_notebooks(ROOT / "exercises")
    assert sorted(rels) == sorted(f"exercises/{stem}.ipynb" for stem in stems)
    for rel in rels:
        nb = nbformat.read(tmp_path / rel, as_version=4)
        assert answer_leaks(nb) == [], rel
        text = "\n".join(c.source for c in nb.cells)
        assert "NotImplementedError" in text and "What this exercise showed" not in text, rel
    config = yaml.safe_load((tmp_path / "_config.yml").read_text())
    assert set(rels) <= set(config["execute"]["exclude_patterns"])  # rendered as written: the stubs would raise
    assert config["execute"]["execute_notebooks"] == "force"  # the chapters still run
    # the grader's manual (which questions one call answers, how the free-text screen decides) is the instructors'
    grading = (tmp_path / "exercises" / "grading.md").read_text()
    assert "--instructor" in grading and "index.md" in grading, grading
    manual = (ROOT / "exercises" / "grading.md").read_text()
    assert len(grading) < len(manual) / 5 and "How the screen decides" not in grading


def test_the_checkout_itself_is_never_rewritten():
    with pytest.raises(ValueError, match="checkout"):
        make_student_pages(ROOT)


def test_the_book_script_builds_the_public_book_unless_told_instructor():
    script = (ROOT / "scripts" / "book.sh").read_text()
    assert "python scripts/student_pages.py" in script and "--instructor) instructor=1" in script
    for page in ("README.md", "CONTRIBUTING.md", "exercises/grading.md", "exercises/index.md"):
        assert "book.sh --instructor" in (ROOT / page).read_text(), page
