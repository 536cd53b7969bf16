"""Graded exercises and the instructor workflow (lessonlib.grading, exercises/).

Fast tests use tiny synthetic notebooks and short timeouts. The tests marked
``notebooks`` execute the real exercise notebooks through the grader: the
instructor versions must score full marks, the student copies must run up to
their stubs and score nothing.
"""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from lessonlib import grading

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = ROOT / "exercises"
EXERCISE_PATHS = sorted(grading.exercise_notebooks(EXERCISES).values())


# --------------------------------------------------------------------------
# tiny synthetic exercise
# --------------------------------------------------------------------------

def solution_cell(gid: str, body: str):
    return new_code_cell(
        f"### BEGIN SOLUTION\n{body}\n### END SOLUTION",
        metadata={"nbgrader": {"solution": True, "grade": False, "locked": False,
                               "grade_id": gid, "schema_version": 3, "task": False}})


def check_cell(gid: str, points: float, body: str):
    return new_code_cell(
        body, metadata={"nbgrader": {"grade": True, "solution": False, "locked": True,
                                     "grade_id": gid, "points": points, "schema_version": 3,
                                     "task": False}})


def toy_exercise():
    nb = new_notebook(cells=[
        new_markdown_cell("# Toy exercise"),
        new_code_cell("from lessonlib.grading import check_close, require_number\nbase = 40"),
        solution_cell("toy-a1", "speedup = 100 / base"),
        check_cell("toy-q1", 2, "require_number('speedup', speedup, low=1, high=4)\n"
                                "### BEGIN HIDDEN TESTS\ncheck_close('speedup', speedup, 2.5)\n"
                                "### END HIDDEN TESTS"),
        solution_cell("toy-a2", "state_bytes = 16 * 1000"),
        check_cell("toy-q2", 3, "require_number('state_bytes', state_bytes)\n"
                                "### BEGIN HIDDEN TESTS\nassert state_bytes == 16000, 'bytes per parameter?'\n"
                                "### END HIDDEN TESTS"),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata[grading.META_KEY] = {"id": "toy", "title": "Toy", "objective": 3, "minutes": 5}
    return nb


@pytest.fixture
def toy_course(tmp_path):
    src = tmp_path / "source"
    src.mkdir()
    nbformat.write(toy_exercise(), src / "toy.ipynb")
    return src


def submit(folder: Path, student: str, nb) -> Path:
    d = folder / student
    d.mkdir(parents=True, exist_ok=True)
    path = d / "toy.ipynb"
    if isinstance(nb, str):
        path.write_text(nb)
    else:
        nbformat.write(nb, path)
    return path


def answer(nb, gid: str, code: str):
    """The student copy ``nb`` with the stub of solution cell ``gid`` replaced by ``code``."""
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == gid:
            cell.source = code
    return nb


def scores(result) -> dict[str, float]:
    return {q.grade_id: q.points for q in result.questions}


# --------------------------------------------------------------------------
# student copies
# --------------------------------------------------------------------------

def test_student_copy_has_stubs_and_no_answers():
    student = grading.student_notebook(toy_exercise())
    text = nbformat.writes(student)
    assert "100 / base" not in text and "16 * 1000" not in text
    assert "check_close('speedup', speedup, 2.5)" not in text and "16000" not in text
    assert text.count("raise NotImplementedError()") == 2
    assert grading.answer_leaks(student) == []
    # the visible part of each check and the grading metadata stay
    assert "require_number('speedup'" in text
    assert [g for g, _, _ in grading.check_cells(student)] == ["toy-q1", "toy-q2"]


def test_mark_sets_the_metadata_an_author_would():
    nb = new_notebook(cells=[
        new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION"),
        new_code_cell("# Check ex-q1 (2 points)\nassert x == 1"),
    ])
    nb.metadata[grading.META_KEY] = {"id": "ex", "objective": 1}
    grading.mark(nb)
    assert nb.cells[0].metadata["nbgrader"]["grade_id"] == "ex-a1"
    assert nb.cells[0].metadata["nbgrader"]["solution"] and "hide-cell" in nb.cells[0].metadata["tags"]
    assert grading.check_cells(nb) == [("ex-q1", 2.0, 1)]
    assert grading.lint(nb) == []
    nb.cells[1].metadata["nbgrader"]["points"] = 3
    assert any("disagrees" in p for p in grading.lint(nb))


def test_instructor_only_cells_stay_out_of_student_copies():
    nb = toy_exercise()
    nb.cells.append(new_markdown_cell("## Results: the speedup was 2.5", metadata={"tags": ["instructor-only"]}))
    assert "2.5" not in nbformat.writes(grading.student_notebook(nb))


def test_stub_keeps_indentation_and_unbalanced_markers_are_caught():
    src = "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n"
    out = grading._replace_regions(src, grading.BEGIN_SOLUTION, grading.END_SOLUTION, grading.CODE_STUB)
    assert out == "def f():\n    # YOUR CODE HERE\n    raise NotImplementedError()"
    nb = toy_exercise()
    nb.cells[2].source = "### BEGIN SOLUTION\nx = 1"
    assert any("without" in p for p in grading.lint(nb, "toy"))
    assert grading.lint(toy_exercise(), "toy") == []


def test_answer_checks_give_helpful_messages():
    with pytest.raises(AssertionError, match="empty"):
        grading.require_number("x", None)
    with pytest.raises(AssertionError, match="number"):
        grading.require_number("x", "many")
    with pytest.raises(AssertionError, match="plausible range"):
        grading.require_number("x", 5e12, low=1e9, high=1e11, unit="bytes")
    with pytest.raises(AssertionError, match="expected value"):
        grading.check_close("x", 2.0, 2.5, rel=0.01)
    grading.check_close("x", 2.501, 2.5, rel=0.01)
    with pytest.raises(AssertionError, match="one of"):
        grading.check_choice("kind", "both", "activation", ["activation", "recovery"])


KEY_POINTS = {
    "memory goes down": [["memory", "activation"], ["reduc", "less", "lower", "sav", "fewer"]],
    "time goes up": [["time", "comput", "slower"], ["increas", "more", "slower", "extra", "longer"]],
}


def test_free_text_key_points():
    good = ("Yes. Checkpointing keeps fewer activations, so memory is reduced. "
            "The discarded ones are recomputed, which adds extra compute and training time.")
    grading.check_key_points("answer", good, KEY_POINTS)
    with pytest.raises(AssertionError, match="empty"):
        grading.check_key_points("answer", "", KEY_POINTS)
    with pytest.raises(AssertionError, match="time goes up"):
        grading.check_key_points("answer", "Yes, it is reasonable because it reduces memory use a lot, "
                                           "so the model fits.", KEY_POINTS)


# --------------------------------------------------------------------------
# grading: scores and robustness
# --------------------------------------------------------------------------

@pytest.mark.slow  # starts processes: seconds each
def test_instructor_version_full_marks_student_copy_zero(toy_course, tmp_path):
    src = nbformat.read(toy_course / "toy.ipynb", as_version=4)
    full = grading.grade_notebook(toy_course / "toy.ipynb", src, cell_timeout=20)
    assert scores(full) == {"toy-q1": 2, "toy-q2": 3}, full
    blank = submit(tmp_path / "sub", "blank", grading.student_notebook(src))
    empty = grading.grade_notebook(blank, src, cell_timeout=20)
    assert scores(empty) == {"toy-q1": 0, "toy-q2": 0}
    assert all(q.status == "failed" or "NameError" in q.message for q in empty.questions), empty
    nothing = grading.student_notebook(src)  # answers given, but empty
    answer(nothing, "toy-a1", "speedup = None")
    answer(nothing, "toy-a2", "state_bytes = ''")
    r = grading.grade_notebook(submit(tmp_path / "sub", "nothing", nothing), src, cell_timeout=20)
    assert scores(r) == {"toy-q1": 0, "toy-q2": 0}
    assert all("empty" in q.message for q in r.questions), r.questions


def test_wrong_answer_loses_exactly_that_question(toy_course, tmp_path):
    src = nbformat.read(toy_course / "toy.ipynb", as_version=4)
    nb = grading.student_notebook(src)
    answer(nb, "toy-a1", "speedup = 4.0  # four devices, four times faster")
    answer(nb, "toy-a2", "state_bytes = 16 * 1000")
    r = grading.grade_notebook(submit(tmp_path / "sub", "wrong", nb), src, cell_timeout=20)
    assert scores(r) == {"toy-q1": 0, "toy-q2": 3}
    assert r.questions[0].status == "failed" and "expected value" in r.questions[0].message


def test_checks_are_found_when_an_editor_drops_cell_metadata(toy_course, tmp_path):
    src = nbformat.read(toy_course / "toy.ipynb", as_version=4)
    for cell in src.cells:  # the toy's checks get the first line the real exercises have
        gid = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.source = f"# Check {gid} (n points)\n" + cell.source
    nb = grading.student_notebook(src)
    answer(nb, "toy-a1", "speedup = 2.5")
    answer(nb, "toy-a2", "state_bytes = 0")
    for cell in nb.cells:
        cell.metadata = {}
    r = grading.grade_notebook(submit(tmp_path / "sub", "stripped", nb), src, cell_timeout=20)
    assert scores(r) == {"toy-q1": 2, "toy-q2": 0} and not r.problem, r


def test_student_cannot_weaken_a_check(toy_course, tmp_path):
    src = nbformat.read(toy_course / "toy.ipynb", as_version=4)
    nb = grading.student_notebook(src)
    answer(nb, "toy-a1", "speedup = 4.0")
    answer(nb, "toy-a2", "state_bytes = 16000")
    nb.cells[3].source = "pass  # the check, emptied"
    del nb.cells[5]  # the second check, deleted
    r = grading.grade_notebook(submit(tmp_path / "sub", "sly", nb), src, cell_timeout=20)
    assert scores(r) == {"toy-q1": 0, "toy-q2": 3}
    assert "restored" in r.problem


@pytest.mark.slow  # starts processes: seconds each
def test_grader_survives_loop_syntax_error_dead_kernel_and_junk(toy_course, tmp_path):
    src = nbformat.read(toy_course / "toy.ipynb", as_version=4)
    sub = tmp_path / "sub"
    loop = answer(grading.student_notebook(src), "toy-a1", "while True:\n    pass")
    answer(loop, "toy-a2", "state_bytes = 16000")
    submit(sub, "looper", loop)
    syntax = answer(grading.student_notebook(src), "toy-a1", "speedup = = 2.5")
    answer(syntax, "toy-a2", "state_bytes = 16000")
    submit(sub, "typo", syntax)
    dead = answer(grading.student_notebook(src), "toy-a1", "speedup = 2.5\nimport os; os._exit(1)")
    answer(dead, "toy-a2", "state_bytes = 16000")
    submit(sub, "crasher", dead)
    submit(sub, "junk", "this is not a notebook {")
    renamed = answer(grading.student_notebook(src), "toy-a1", "speedup = 2.5")
    answer(renamed, "toy-a2", "state_bytes = 16000")
    (sub / "dana").mkdir()
    nbformat.write(renamed, sub / "dana" / "Copy of toy (1).ipynb")  # as a Colab download may be named
    (sub / "lost.ipynb").write_text("{}")  # a stray file: its own row
    results = grading.grade_folder(sub, toy_course, cell_timeout=3, budget=60, progress=None)
    by = {r.student: r for r in results}
    assert scores(by["looper"]) == {"toy-q1": 0, "toy-q2": 3}
    assert by["looper"].questions[0].status in ("failed", "error")
    assert "timed out" in by["looper"].problem
    assert scores(by["typo"]) == {"toy-q1": 0, "toy-q2": 3}
    assert any("SyntaxError" in m for _, _, m in by["typo"].cells)
    # the kernel dies in the first answer: the check of that answer is lost, the grader
    # restarts the kernel and the second answer still counts
    assert scores(by["crasher"]) == {"toy-q1": 0, "toy-q2": 3}
    assert "kernel" in by["crasher"].problem
    assert scores(by["dana"]) == {"toy-q1": 2, "toy-q2": 3}  # found by its name despite "Copy of"
    assert scores(by["junk"]) == {"toy-q1": 0, "toy-q2": 0}
    assert "not a readable notebook" in by["junk"].problem
    header, rows = grading.score_table(results)
    assert header[:3] == ["student", "toy-q1", "toy-q2"]
    assert {r[0] for r in rows} == {"looper", "typo", "crasher", "junk", "lost", "dana"}
    out = grading.write_csv(results, tmp_path / "grades.csv")
    table = list(csv.DictReader(out.open()))
    assert {r["student"]: float(r["total"]) for r in table}["typo"] == 3
    assert (tmp_path / "grades-details.csv").exists()


@pytest.mark.slow  # starts processes: seconds each
def test_instructor_command_end_to_end(toy_course, tmp_path):
    script = EXERCISES / "instructor.py"
    out = tmp_path / "student"
    run = subprocess.run([sys.executable, str(script), "--source", str(toy_course), "student", str(out),
                          "--colab", "github/org/repo/blob/main/student"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert (out / "toy.ipynb").exists()
    assert "colab.research.google.com/github/org/repo/blob/main/student/toy.ipynb" in (out / "index.md").read_text()
    sub = tmp_path / "sub"
    good = answer(nbformat.read(out / "toy.ipynb", as_version=4), "toy-a1", "speedup = 100 / 40")
    answer(good, "toy-a2", "state_bytes = 16 * 1000")
    submit(sub, "ada", good)
    submit(sub, "bob", nbformat.read(out / "toy.ipynb", as_version=4))
    run = subprocess.run([sys.executable, str(script), "--source", str(toy_course), "grade", str(sub),
                          "--csv", str(tmp_path / "g.csv"), "--cell-timeout", "20"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "ada" in run.stdout and "bob" in run.stdout
    rows = {r["student"]: r for r in csv.DictReader((tmp_path / "g.csv").open())}
    assert float(rows["ada"]["total"]) == 5 and float(rows["bob"]["total"]) == 0


# --------------------------------------------------------------------------
# the real exercises
# --------------------------------------------------------------------------

def test_there_are_three_exercises_per_chapter_each_tied_to_an_objective():
    assert EXERCISE_PATHS, "no exercise notebooks in exercises/"
    per_chapter: dict[str, int] = {}
    for path in EXERCISE_PATHS:
        meta = nbformat.read(path, as_version=4).metadata[grading.META_KEY]
        assert meta["objective"] in (1, 2, 3), path.name
        per_chapter[meta["chapter"]] = per_chapter.get(meta["chapter"], 0) + 1
    assert sorted(per_chapter) == [1, 2, 3], per_chapter
    assert all(n >= 3 for n in per_chapter.values()), per_chapter


def test_instructor_page_lists_every_exercise_as_it_is():
    """exercises/index.md: one table row per exercise, with its chapter, objective, points and time."""
    import re

    text = (EXERCISES / "index.md").read_text()
    for path in EXERCISE_PATHS:
        nb = nbformat.read(path, as_version=4)
        meta = nb.metadata[grading.META_KEY]
        checks = grading.check_cells(nb)
        row = next((line for line in text.splitlines() if f"]({path.name})" in line), None)
        assert row, f"exercises/index.md has no row linking {path.name}"
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        assert cells[0] == f"[{meta['title']}]({path.name})", cells[0]
        assert cells[1:5] == [str(meta["chapter"]), str(meta["objective"]),
                              f"{len(checks)} ({sum(p for _, p, _ in checks):g})", f"{meta['minutes']} min"], cells
    toc = (ROOT / "_toc.yml").read_text()
    for path in EXERCISE_PATHS:
        assert f"file: exercises/{path.stem}\n" in toc, f"{path.stem} is not under exercises/index in _toc.yml"


@pytest.mark.parametrize("path", EXERCISE_PATHS, ids=lambda p: p.stem)
def test_exercise_structure_and_student_copy(path):
    nb = nbformat.read(path, as_version=4)
    assert grading.lint(nb, path.name) == []
    assert nb.cells[0].source.startswith("# @title Setup"), "first cell must be the shared setup cell"
    student = grading.student_notebook(nb)
    assert grading.answer_leaks(student) == []
    text = nbformat.writes(student)
    assert "What this exercise showed" not in text and "glue(" not in text, "the results summary leaks"
    for cell in nb.cells:
        if grading.is_solution_cell(cell):
            solution = grading._replace_regions(cell.source, grading.BEGIN_SOLUTION, grading.END_SOLUTION, "")
            assert "hide-cell" in cell.metadata.get("tags", []) or not solution.strip(), \
                "solutions are hidden behind a toggle in the book"
    remarked = grading.mark(nbformat.from_dict(nb))  # the metadata follows from what the cells say
    assert [c.metadata for c in remarked.cells] == [c.metadata for c in nb.cells]
    ids = [g for g, _, _ in grading.check_cells(nb)]
    assert len(ids) >= 2 and all(g.startswith(nb.metadata[grading.META_KEY]["id"] + "-") for g in ids)


def empty_answers(src):
    """A student copy in which every name a solution defines is set to None."""
    import ast

    nb = grading.student_notebook(src)
    for cell, original in zip(nb.cells, [c for c in src.cells if grading.INSTRUCTOR_ONLY
                                         not in c.metadata.get("tags", [])]):
        if cell.cell_type == "code" and grading.BEGIN_SOLUTION in original.source:
            body = original.source.split(grading.BEGIN_SOLUTION)[1].split(grading.END_SOLUTION)[0]
            names = []
            for node in ast.parse(body).body:
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                names += [t.id for t in targets if isinstance(t, ast.Name)]
                if isinstance(node, ast.FunctionDef):
                    names.append(node.name)
            cell.source = "\n".join(f"{n} = None" for n in dict.fromkeys(names))
    return nb


@pytest.mark.notebooks
@pytest.mark.parametrize("path", EXERCISE_PATHS, ids=lambda p: p.stem)
def test_instructor_full_marks_student_copy_runs_to_stubs_and_scores_zero(path, tmp_path):
    """Grade three 'students' at once: the instructor's notebook, an untouched student copy,
    and a student copy whose every answer is None."""
    src = nbformat.read(path, as_version=4)
    sub = tmp_path / "submitted"
    for who in ("instructor", "blank", "none"):
        (sub / who).mkdir(parents=True)
    nbformat.write(src, sub / "instructor" / path.name)
    copy = sub / "blank" / path.name
    nbformat.write(grading.student_notebook(src), copy)
    nbformat.write(empty_answers(src), sub / "none" / path.name)
    results = grading.grade_folder(sub, EXERCISES, cell_timeout=60, budget=150, jobs=2, progress=None)
    by = {r.student: r for r in results}
    full, empty = by["instructor"], by["blank"]
    assert by["none"].score == 0, [q for q in by["none"].questions if q.points]

    assert full.score == full.max_score > 0, [q for q in full.questions if q.status != "passed"]
    assert all(status == "ok" for _, status, _ in full.cells), full.cells

    assert empty.score == 0, [q for q in empty.questions if q.points]
    nb = nbformat.read(copy, as_version=4)
    first_stub = min(i for i, c in enumerate(nb.cells) if "raise NotImplementedError()" in c.source)
    for i, status, msg in empty.cells:
        if i < first_stub:
            assert status == "ok", f"cell {i} fails before any stub: {msg}"
        if "raise NotImplementedError()" in nb.cells[i].source:
            assert "NotImplementedError" in msg, (i, status, msg)


@pytest.mark.notebooks
def test_wrong_answer_in_a_real_exercise_loses_exactly_that_question(tmp_path):
    path = EXERCISES / "3c-bubbles-and-paid-capacity.ipynb"
    src = nbformat.read(path, as_version=4)
    nb = nbformat.from_dict(src)  # a copy of the instructor's answers, one made wrong
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "3c-a2":
            cell.source += "\nschedule_idle = 3 / 8  # (p - 1) / (m + p - 1) with m = 4 by mistake"
    r = grading.grade_notebook(submit(tmp_path, "wrong", nb), src, cell_timeout=60)
    lost = {q.grade_id: q.max_points - q.points for q in r.questions}
    assert lost == {"3c-q1": 0, "3c-q2": 2, "3c-q3": 0}, r.questions


def _run_check(path: Path, grade_id: str, namespace: dict) -> None:
    """Execute one check cell of an instructor notebook in ``namespace`` (no kernel)."""
    nb = nbformat.read(path, as_version=4)
    source = next(c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    exec(compile(source, f"{path.name}:{grade_id}", "exec"), namespace)


GOOD_ANSWERS = [
    "Yes. Memory is what blocks us, so checkpointing is a sensible move: it keeps fewer activations and "
    "the memory needed goes down. The price is extra compute, because the dropped activations are "
    "recomputed in backward, so each step takes longer.",
    "I would turn it on. Recomputing activations instead of storing them reduces activation memory a lot. "
    "It costs roughly a third more compute time per step, which is fine when memory is the only blocker.",
]
BAD_ANSWERS = {
    "": "empty",
    "Yes.": "words",
    "Yes, it is reasonable because it reduces the memory we need, so the model finally fits.": "time",
    "Yes, it is reasonable here, but every step will take more time because of the recomputation.": "memory",
    "No. It would reduce memory, but the extra compute makes each step take longer, so it is not worth it.":
        "verdict",
    "Yes, you just have to recompute them. It keeps fewer activations so the memory use is reduced.": "time",
}


@pytest.mark.parametrize("text", GOOD_ANSWERS)
def test_practice_question_accepts_answers_that_make_the_key_points(text):
    _run_check(EXERCISES / "2b-should-they-checkpoint.ipynb", "2b-q2", {"reply": text})


@pytest.mark.parametrize("text,missing", BAD_ANSWERS.items())
def test_practice_question_rejects_answers_that_miss_a_key_point(text, missing):
    with pytest.raises(AssertionError, match=missing):
        _run_check(EXERCISES / "2b-should-they-checkpoint.ipynb", "2b-q2", {"reply": text})


def test_student_and_check_commands_on_the_real_exercises(tmp_path):
    script = EXERCISES / "instructor.py"
    run = subprocess.run([sys.executable, str(script), "check"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "no problems" in run.stdout, run.stdout + run.stderr
    out = tmp_path / "handout"
    run = subprocess.run([sys.executable, str(script), "student", str(out)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in out.glob("*.ipynb")) == [p.name for p in EXERCISE_PATHS]
    for path in out.glob("*.ipynb"):
        text = path.read_text()
        assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text, path.name


def test_score_table_prints_one_block_per_exercise_when_wide():
    results = []
    for student, pts in (("ada", 2.0), ("bob", 0.0)):
        for ex in ("1a", "2b", "3c", "3d"):
            r = grading.NotebookResult(student, ex, f"{ex}.ipynb")
            r.questions = [grading.QuestionResult(f"{ex}-q{i}", pts, 2.0, "passed") for i in range(1, 5)]
            results.append(r)
    text = grading.format_table(results)
    assert text.splitlines()[0] == "1a" and "totals" in text
    assert any(line.split() == ["ada", "8", "8", "8", "8", "32", "32"] for line in text.splitlines())
    header, rows = grading.score_table(results)
    assert len(header) == 1 + 16 + 3 and [r[0] for r in rows] == ["ada", "bob"]
