"""nbgrader round trip with exercises/nbgrader_config.py: generate, then autograde.

Builds its own environment (marked ``environments``): a virtual environment
that sees this one's packages (lessonlib, torch) and adds nbgrader from PyPI
(about 30 s), then runs ``nbgrader generate_assignment`` and ``nbgrader
autograde`` on exercise 3c (about a minute on two cores).
"""
from __future__ import annotations

import csv
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import colab_env as ce

ROOT = Path(__file__).resolve().parents[1]
EXERCISE = ROOT / "exercises" / "3c-bubbles-and-paid-capacity.ipynb"

pytestmark = pytest.mark.environments


@pytest.fixture(scope="module")
def nbgrader_python(tmp_path_factory) -> Path:
    """A venv with nbgrader that also sees this environment's site-packages (kernels need lessonlib)."""
    venv = tmp_path_factory.mktemp("nbgrader-env") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    purelib = subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                      text=True).strip()
    # processed like a site folder: this environment's own .pth files (the editable lessonlib) apply
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages())
    Path(purelib, "course-environment.pth").write_text(lines)
    ce.install(python, "nbgrader>=0.9")
    alembic = venv / "bin" / "alembic"  # nbgrader runs `alembic`; an installer skips its script when
    if not alembic.exists():             # alembic was already installed where the .pth points
        alembic.write_text(f"#!/bin/sh\nexec {python} -m alembic \"$@\"\n")
        alembic.chmod(0o755)
    return python


def nbgrader(python: Path, course: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{python.parent}:{os.environ.get('PATH', '')}")
    run = subprocess.run([str(python), "-m", "nbgrader", *args], cwd=course, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def test_generate_removes_instructor_cells_and_autograde_scores_honestly(nbgrader_python, tmp_path):
    course = tmp_path / "course"
    (course / "source" / "ex3c").mkdir(parents=True)
    shutil.copy(EXERCISE, course / "source" / "ex3c")
    shutil.copy(ROOT / "exercises" / "nbgrader_config.py", course)

    nbgrader(nbgrader_python, course, "generate_assignment", "ex3c", "--force")
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

    nbgrader(nbgrader_python, course, "autograde", "ex3c", "--create")
    nbgrader(nbgrader_python, course, "export", "--to", str(tmp_path / "grades.csv"))
    scores = {r["student_id"]: float(r["score"]) for r in csv.DictReader((tmp_path / "grades.csv").open())}
    # the points come from the exercise's own grade cells: cy loses exactly the checks that read schedule_idle
    points = {c.metadata["nbgrader"]["grade_id"]: float(c.metadata["nbgrader"]["points"]) for c in src.cells
              if c.metadata.get("nbgrader", {}).get("grade")}
    lost = sum(float(c.metadata["nbgrader"]["points"]) for c in src.cells
               if c.metadata.get("nbgrader", {}).get("grade") and "schedule_idle" in c.source)
    assert 0 < lost < sum(points.values()), points
    assert scores == {"ada": sum(points.values()), "cy": sum(points.values()) - lost, "bob": 0.0}, (scores, points)
