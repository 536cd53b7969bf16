"""nbgrader round trip with exercises/nbgrader_config.py: generate, then autograde (slow: about a minute).

Needs nbgrader in the environment (``pip install -e ".[nbgrader]"``); skipped without it.
"""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXERCISE = ROOT / "exercises" / "3c-bubbles-and-paid-capacity.ipynb"

pytestmark = pytest.mark.slow


def nbgrader(course: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")  # alembic
    run = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def test_generate_removes_instructor_cells_and_autograde_scores_honestly(tmp_path):
    pytest.importorskip("nbgrader")
    course = tmp_path / "course"
    (course / "source" / "ex3c").mkdir(parents=True)
    shutil.copy(EXERCISE, course / "source" / "ex3c")
    shutil.copy(ROOT / "exercises" / "nbgrader_config.py", course)

    nbgrader(course, "generate_assignment", "ex3c", "--force")
    released = course / "release" / "ex3c" / EXERCISE.name
    text = released.read_text()
    for leak in ("instructor-only", "What this exercise showed", "BEGIN SOLUTION", "HIDDEN TESTS", "@grader"):
        assert leak not in text, leak
    src = nbformat.read(EXERCISE, as_version=4)
    assert sum("instructor-only" in c.metadata.get("tags", []) for c in src.cells) >= 1

    # three students: the instructor's answers, one wrong answer, the untouched release
    solutions = {c.metadata["nbgrader"]["grade_id"]: c.source for c in src.cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    for student, wrong in (("ada", None), ("cy", "3c-a2"), ("bob", "all")):
        nb = nbformat.read(released, as_version=4)
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if gid in solutions and wrong != "all":
                cell.source = solutions[gid].replace("### BEGIN SOLUTION\n", "").replace("\n### END SOLUTION", "")
                if gid == wrong:
                    cell.source += "\nschedule_idle = 3 / 8  # m = 4 by mistake"
        (course / "submitted" / student / "ex3c").mkdir(parents=True)
        nbformat.write(nb, course / "submitted" / student / "ex3c" / EXERCISE.name)

    nbgrader(course, "autograde", "ex3c", "--create")
    nbgrader(course, "export", "--to", str(tmp_path / "grades.csv"))
    scores = {r["student_id"]: float(r["score"]) for r in csv.DictReader((tmp_path / "grades.csv").open())}
    assert scores == {"ada": 7.0, "cy": 5.0, "bob": 0.0}, scores
