"""A tiny exercise (no torch) and submissions of it, for the grading tests.

Three questions: a number computed from a given value (toy-q1, 2 points), a
byte count (toy-q2, 3 points) and a free-text answer graded by key points
(toy-q3, 2 points). Its hidden tests take their expected values from the
instructor's cells, as the real exercises do.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from lessonlib.grading import handout

GOOD_TEXT = ("Yes, I would turn it on. It keeps fewer activations, so the memory needed goes down. "
             "The recomputation adds extra compute, so each step takes more time.")
SOLUTIONS = {"toy-a1": "speedup = 100 / base", "toy-a2": "state_bytes = 16 * 1000",
             "toy-a3": f"answer = {GOOD_TEXT!r}"}
POINTS = {"toy-q1": 2, "toy-q2": 3, "toy-q3": 2}

KEY_POINTS = '''{
    "a verdict": [["\\\\byes\\\\b", "would turn (it )?on", "sensible", "worth"]],
    "memory goes down": [["memory", "activation"], ["reduc", "less", "lower", "fewer", "down", "sav"]],
    "time goes up": [["time", "comput", "slow"], ["increas", "more", "extra", "longer", "up"]],
}'''


def solution_cell(gid: str, body: str):
    return new_code_cell(
        f"### BEGIN SOLUTION\n{body}\n### END SOLUTION",
        metadata={"nbgrader": {"solution": True, "grade": False, "locked": False,
                               "grade_id": gid, "schema_version": 3, "task": False},
                  "tags": ["hide-cell"]})


def check_cell(gid: str, points: int, visible: str, hidden: str):
    return new_code_cell(
        f"# Check {gid} ({points} point{'s' if points != 1 else ''})\n{visible}\n"
        f"### BEGIN HIDDEN TESTS\n{hidden}\n### END HIDDEN TESTS",
        metadata={"nbgrader": {"grade": True, "solution": False, "locked": True, "grade_id": gid,
                               "points": points, "schema_version": 3, "task": False},
                  "tags": ["hide-input"]})


def toy_exercise():
    nb = new_notebook(cells=[
        new_markdown_cell("# Toy exercise"),
        new_code_cell("from lessonlib.grading import hand_in, require_number\nbase = 40\nprint('base', base)"),
        new_markdown_cell("## Question 1"),
        solution_cell("toy-a1", SOLUTIONS["toy-a1"]),
        check_cell("toy-q1", 2,
                   "from lessonlib.grading import hand_in, require_number\n"
                   "hand_in('toy-q1', speedup=speedup)\n"
                   "require_number('speedup', speedup, low=0.1, high=100)",
                   "from lessonlib.grading import grader, check_close\n"
                   "_expected = 100 / base\n\n\n"
                   "@grader('toy-q1')\n"
                   "def _(got):\n"
                   "    check_close('speedup', got['speedup'], _expected, rel=1e-9, hint='100 / base')"),
        new_markdown_cell("## Question 2"),
        solution_cell("toy-a2", SOLUTIONS["toy-a2"]),
        check_cell("toy-q2", 3,
                   "from lessonlib.grading import hand_in, require_number\n"
                   "hand_in('toy-q2', state_bytes=state_bytes)\n"
                   "require_number('state_bytes', state_bytes, low=1, unit='bytes')",
                   "from lessonlib.grading import grader, check_close\n\n\n"
                   "@grader('toy-q2')\n"
                   "def _(got):\n"
                   "    check_close('state_bytes', got['state_bytes'], 16 * 1000, rel=0, hint='16 bytes each')"),
        new_markdown_cell("## Question 3: explain"),
        solution_cell("toy-a3", SOLUTIONS["toy-a3"]),
        check_cell("toy-q3", 2,
                   "from lessonlib.grading import hand_in\nhand_in('toy-q3', answer=answer)",
                   "from lessonlib.grading import grader, check_key_points\n"
                   f"_KEY_POINTS = {KEY_POINTS}\n\n\n"
                   "@grader('toy-q3')\n"
                   "def _(got):\n"
                   "    check_key_points('answer', got['answer'], _KEY_POINTS)"),
        new_markdown_cell("## What this exercise showed: the speedup was 2.5",
                          metadata={"tags": ["instructor-only"]}),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata[handout.META_KEY] = {"id": "toy", "title": "Toy", "chapter": 1, "objective": 3, "minutes": 5}
    return nb


def make_course(root: Path) -> Path:
    """``root/source/toy.ipynb``; returns the source folder."""
    src = root / "source"
    src.mkdir(parents=True, exist_ok=True)
    nbformat.write(toy_exercise(), src / "toy.ipynb")
    return src


def student(answers: dict[str, str] | None = None, before: dict[str, str] | None = None,
            after: dict[str, str] | None = None):
    """A student copy with the stub of each solution cell in ``answers`` replaced.

    ``before``/``after`` add the student's own code cells before or after the
    cell holding a given grade id (``"toy-q1"``, ``"toy-a2"``...).
    """
    nb = handout.student_notebook(toy_exercise())
    cells = []
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in (before or {}):
            cells.append(new_code_cell(before[gid]))
        if gid in (answers or {}):
            cell.source = answers[gid]
        cells.append(cell)
        if gid in (after or {}):
            cells.append(new_code_cell(after[gid]))
    nb.cells = cells
    return nb


def honest(**overrides):
    """All three answers right, unless overridden (``a1="speedup = 4.0"``)."""
    answers = dict(SOLUTIONS)
    answers.update({f"toy-{k}": v for k, v in overrides.items()})
    return student(answers)


def submit(folder: Path, rel: str, nb) -> Path:
    path = folder / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(nb, (str, bytes)):
        path.write_bytes(nb if isinstance(nb, bytes) else nb.encode())
    else:
        nbformat.write(nb, path)
    return path


def scores(result) -> dict[str, float]:
    return {q.grade_id: q.points for q in result.questions}
