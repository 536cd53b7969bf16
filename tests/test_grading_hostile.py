"""Hostile and unlucky submissions: each ends with its honest score or a clear row, never a forged grade.

One class of the toy exercise (tests/grading_toy.py) is graded once, in the
bubblewrap sandbox, two notebooks at a time; each test then reads the rows
of the submissions it is about. The classes follow the issue "Grading a real
class: grades that students cannot forge":

* changing the checking environment from inside the notebook (library
  helpers, an IPython input transformer, the standard library, a name a hidden
  test used, forged hand-in outputs);
* reading the instructor notebooks and running the solutions;
* writing outside the submission's folder (a classmate's file, the installed
  library, a detached process that rewrites the CSV later);
* colliding identities (nested folders, ``bob.ipynb`` beside ``bob/``, two
  files of one exercise);
* losing a notebook's marks by accident (mangled metadata, a cell that looks
  like a check, an edited or deleted check);
* learning the answer from feedback; padding free text with key words;
* exhausting memory; and the accidents the grader always survived (a loop,
  a syntax error, ``os._exit``, 500 MB of output, a file that is not a
  notebook, odd file names).

The command line's bad options are in test_grading_cli.py.
"""
from __future__ import annotations

import csv
import hashlib
import resource
import time
from pathlib import Path

import pytest

import lessonlib
from grading_toy import GOOD_TEXT, POINTS, honest, make_course, scores, student, submit
from procs import processes_with
from lessonlib.grading import autograde, sandbox
from lessonlib.grading.results import display_name

FULL = {"toy-q1": 2, "toy-q2": 3, "toy-q3": 2}
LIBRARY = Path(lessonlib.__file__).resolve().parent  # the installed package, on the grader's side
MARKER = "lessonlib-hostile-detached-7f3a"  # in the command line of the detached process
KEY = b"hostile-class-key-" * 2  # the instructor's key, outside the results folder
NOT_UTF8 = b"zo\xeb".decode("utf-8", "surrogateescape")  # "zoë" unzipped as Latin-1
FORMULAS = ['=HYPERLINK("evil.example","x")', "+SUM(1;2)", "-2+3", "@SUM(1)"]
LOOKALIKES = ["kim\nnewline", "kim newline", "Zo\u00eb", "Zoe\u0308"]

pytestmark = [pytest.mark.slow,  # starts kernels: about a minute for the whole class
              pytest.mark.skipif(bool(sandbox.probe()), reason=f"no sandbox here: {sandbox.probe()}")]


def _library_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(LIBRARY.rglob("*.py")):
        h.update(p.read_bytes())
    return h.hexdigest()


def _attacks(course: Path) -> dict[str, object]:
    """Relative path -> notebook (or raw bytes) of every submission in the class."""
    src, sub, out = course / "source", course / "submitted", course / "out"
    victim = sub / "victim" / "toy.ipynb"
    subs: dict[str, object] = {}

    # --- honest baselines -------------------------------------------------
    subs["honest/toy.ipynb"] = honest()
    subs["wrong/toy.ipynb"] = honest(a1="speedup = 4.0  # four devices, four times faster")
    subs["victim/toy.ipynb"] = honest()

    # --- change the checking environment ----------------------------------
    subs["patch-helpers/toy.ipynb"] = honest(a1=(
        "import lessonlib.grading as g, lessonlib.grading.graders as c, lessonlib.grading.answers as a\n"
        "for m in (g, c, a):\n"
        "    for name in ('check_close', 'require_number', 'check_choice', 'check_key_points', 'check_one_of'):\n"
        "        setattr(m, name, lambda *args, **kwargs: None)\n"
        "c.MODE = 'live'\n"
        "speedup = 4.0"))
    subs["input-transformer/toy.ipynb"] = honest(
        a1=("def _forge(lines):\n"
            "    if any('hand_in(' in line for line in lines):\n"
            "        return ['print(\"all checks passed ✓\")\\n']\n"
            "    return lines\n"
            "get_ipython().input_transformers_post.append(_forge)\n"
            "speedup = 4.0"),
        a2="state_bytes = 1", a3="answer = 'memory less time more yes'")
    subs["patch-stdlib/toy.ipynb"] = honest(
        a1=("import math, re, json, builtins\n"
            "math.isclose = lambda *a, **k: True\n"
            "re.search = lambda *a, **k: True\n"
            "speedup = 4.0"),
        a3="answer = 'memory memory memory less less less time more'")
    subs["redefine-given/toy.ipynb"] = honest(a1="base = 100  # the hidden test used base\nspeedup = 100 / base")
    subs["forged-output/toy.ipynb"] = honest(a1=(
        "from IPython.display import display\n"
        "display({'application/vnd.lessonlib.answer+json': {'question': 'toy-q1', 'answers': {'speedup': 2.5}}},"
        " raw=True)\n"
        "speedup = 4.0"))
    subs["forged-hook/toy.ipynb"] = honest(a2=(
        "from lessonlib.grading import hand_in\n"
        "def _again(result):\n"
        "    hand_in('toy-q2', state_bytes=16000)\n"
        "get_ipython().events.register('post_run_cell', _again)\n"
        "state_bytes = 1"))
    subs["own-hand-in/toy.ipynb"] = honest(a1=(
        "from lessonlib.grading import hand_in\n"
        "hand_in('toy-q1', speedup=2.5)  # from the student's own cell: ignored\n"
        "speedup = 4.0"))

    # --- read the instructor notebooks and run the solutions ---------------
    subs["read-instructor/toy.ipynb"] = student({"toy-a1": (
        "import json, os, pathlib, lessonlib\n"
        f"places = [pathlib.Path({str(src)!r}) / 'toy.ipynb',\n"
        "          pathlib.Path(lessonlib.__file__).resolve().parents[1] / 'exercises',\n"
        f"          pathlib.Path({str(Path(__file__).resolve().parents[1] / 'exercises')!r}),\n"
        "          pathlib.Path(lessonlib.__file__).resolve().parents[1]]\n"
        "seen = []\n"
        "for p in places:\n"
        "    for f in ([p] if p.suffix else sorted(p.glob('*.ipynb')) if p.is_dir() else []):\n"
        "        try:\n"
        "            nb = json.loads(f.read_text())\n"
        "        except OSError:\n"
        "            continue\n"
        "        seen.append(str(f))\n"
        "        for cell in nb['cells']:\n"
        "            if '### BEGIN SOLUTION' in ''.join(cell['source']):\n"
        "                exec(''.join(cell['source']))\n"
        "speedup = globals().get('speedup')")})

    # --- write outside its folder ------------------------------------------
    subs["overwrite-classmate/toy.ipynb"] = honest(a1=(
        "import pathlib, shutil\n"
        "broke = []\n"
        f"for target in [pathlib.Path({str(victim)!r}), pathlib.Path('../victim/toy.ipynb')]:\n"
        "    try:\n"
        "        target.write_text('{}')\n"
        "        broke.append(str(target))\n"
        "    except OSError:\n"
        "        pass\n"
        f"shutil.rmtree({str(sub / 'honest')!r}, ignore_errors=True)\n"
        "speedup = 100 / base"))
    subs["change-library/toy.ipynb"] = honest(a1=(
        "import pathlib, sys, lessonlib\n"
        "evil = 'def check_close(*a, **k):\\n    return None\\n'\n"
        f"for root in [pathlib.Path(lessonlib.__file__).parent, pathlib.Path({str(LIBRARY)!r}),\n"
        "             pathlib.Path(sys.prefix)]:\n"
        "    for f in list(root.rglob('graders.py'))[:5] + list(root.rglob('checks.py'))[:5] + [root / 'grading' / 'evil.py']:\n"
        "        try:\n"
        "            f.write_text(evil)\n"
        "        except OSError:\n"
        "            pass\n"
        "speedup = 4.0"))
    subs["detached/toy.ipynb"] = honest(a1=(
        "import subprocess, sys\n"
        "code = ('import os, time\\n'\n"
        "        'if os.fork() == 0:\\n'\n"
        "        '    os.setsid()\\n'\n"
        "        '    time.sleep(2)\\n'\n"
        f"        '    open({str(out / 'grades.csv')!r}, \"w\").write(\"student,total\\\\nattacker,999\\\\n\")\\n')\n"
        f"subprocess.Popen([sys.executable, '-c', code, {MARKER!r}], start_new_session=True,\n"
        "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "speedup = 4.0"))

    # --- identities -----------------------------------------------------------
    subs["section-1/ada/toy.ipynb"] = honest()
    subs["section-1/bea/toy.ipynb"] = honest(a2="state_bytes = 0")
    subs["bob.ipynb"] = honest(a1="speedup = 4.0")
    subs["bob/toy.ipynb"] = honest(a2="state_bytes = 0")
    subs["carl/toy.ipynb"] = honest()
    subs["carl/Copy of toy.ipynb"] = honest(a1="speedup = 4.0")

    # --- accidents to metadata and cells -----------------------------------------
    mangled = honest()
    mangled.metadata = {"exercise": "garbage", "kernelspec": 7}
    for cell in mangled.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid == "toy-q1":
            cell.metadata = {"nbgrader": "garbage", "tags": 5}
        elif gid == "toy-a2":
            cell.metadata = {"nbgrader": {"grade_id": ["not", "a", "string"], "grade": True}}
        elif cell.cell_type == "markdown":
            cell.metadata = {"nbgrader": None}
    subs["mangled-metadata/toy.ipynb"] = mangled
    broken_source = honest()
    subs["broken-source/toy.ipynb"] = broken_source  # its a2 source becomes a number below
    subs["header-lookalike/toy.ipynb"] = student(
        {"toy-a1": "speedup = 100 / base", "toy-a3": f"answer = {GOOD_TEXT!r}"},
        before={"toy-q2": "# Check toy-q2 (3 points)\n# my own cell: the answer to question 2\nstate_bytes = 16 * 1000"},
        after={"toy-q1": "# Check toy-q1 (2 points)\nprint('my notes: speedup is', speedup)"})
    edited = honest()
    for cell in edited.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "toy-q1":
            cell.source = "pass  # the check, emptied"
    edited.cells = [c for c in edited.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "toy-q2"]
    subs["edited-checks/toy.ipynb"] = edited

    # --- feedback and free text -----------------------------------------------
    subs["close-guess/toy.ipynb"] = honest(a1="speedup = 2.54")
    subs["padded-text/toy.ipynb"] = honest(a3="answer = 'Memory less, memory less. Time more, time more.'")
    subs["keyword-salad/toy.ipynb"] = honest(a3="answer = 'yes memory less time more compute activation fewer extra'")

    # --- resources and accidents ------------------------------------------------
    subs["memory-hog/toy.ipynb"] = honest(a1="hog = bytearray(3 * 1024 ** 3)\nspeedup = 100 / base")
    subs["memory-creep/toy.ipynb"] = honest(a2=(
        "chunks = []\n"
        "try:\n"
        "    while True:\n"
        "        chunks.append(bytearray(100 * 1024 ** 2))\n"
        "finally:\n"
        "    chunks = None"))
    subs["looper/toy.ipynb"] = honest(a1="while True:\n    pass")
    subs["typo/toy.ipynb"] = honest(a1="speedup = = 2.5")
    subs["crasher/toy.ipynb"] = honest(a1="speedup = 2.5\nimport os; os._exit(1)")
    subs["shouter/toy.ipynb"] = honest(a2="print('x' * 500_000_000)\nstate_bytes = 16 * 1000")
    subs["chatterbox/toy.ipynb"] = honest(a2="for _ in range(50):\n    print('y' * 10_000_000)\nstate_bytes = 16 * 1000")
    subs["junk/toy.ipynb"] = b"this is not a notebook {"
    subs["lost.ipynb"] = b"{}"
    subs["o'dd; name\n(1)/Copy of toy (1).ipynb"] = honest()
    subs["ünï cödé/-toy.ipynb"] = honest()

    # --- one student against the class's files --------------------------
    for name in NOT_UTF8, *FORMULAS, *LOOKALIKES:
        subs[f"{name}/toy.ipynb"] = honest()
    subs["surrogate/toy.ipynb"] = honest(a3='answer = "\\ud800 memory less, memory less. time more, time more."')
    subs["formula-text/toy.ipynb"] = honest(a3="answer = '=HYPERLINK(\"http://evil\",\"x\") memory less, memory less, time more, time more, yes yes.'")
    return subs


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade the whole hostile class once; returns ``(results by path, context)``."""
    course = tmp_path_factory.mktemp("course")
    src = make_course(course)
    sub = course / "submitted"
    out = course / "out"
    out.mkdir()
    for rel, nb in _attacks(course).items():
        submit(sub, rel, nb)
    # a damaged source field: JSON that nbformat would refuse
    import json

    p = sub / "broken-source" / "toy.ipynb"
    raw = json.loads(p.read_text())
    for cell in raw["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "toy-a2":
            cell["source"] = 12345
    p.write_text(json.dumps(raw))
    victim_before = hashlib.sha256((sub / "victim" / "toy.ipynb").read_bytes()).hexdigest()
    library_before = _library_digest()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.monotonic()
    results = autograde.grade_folder(sub, src, cell_timeout=4, budget=40, jobs=2,
                                     memory_bytes=1024 ** 3, progress=None)
    seconds = time.monotonic() - t0
    rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    manifest = autograde.write_results(results, out / "grades.csv", key=KEY)
    table = autograde.format_table(results)
    return {r.path: r for r in results}, dict(
        course=course, sub=sub, out=out, results=results, manifest=manifest, table=table, seconds=seconds,
        victim_before=victim_before, library_before=library_before, grader_rss_growth=rss_growth)


def _row(ctx, student):
    header, rows = autograde.score_table(ctx["results"])
    return dict(zip(header, next(r for r in rows if r[0] == student)))


# ----- the baselines ----------------------------------------------------------

def test_honest_and_wrong_baselines(graded):
    by, _ = graded
    assert scores(by["honest/toy.ipynb"]) == FULL, by["honest/toy.ipynb"]
    assert scores(by["wrong/toy.ipynb"]) == {"toy-q1": 0, "toy-q2": 3, "toy-q3": 2}
    assert not by["honest/toy.ipynb"].problem


# ----- changing the checking environment -----------------------------------------

def test_patched_check_helpers_do_not_pass_a_wrong_answer(graded):
    by, _ = graded
    r = by["patch-helpers/toy.ipynb"]
    assert scores(r) == {"toy-q1": 0, "toy-q2": 3, "toy-q3": 2}, r.questions
    assert r.questions[0].status == "failed"


def test_an_input_transformer_that_swallows_the_checks_hands_nothing_in(graded):
    by, _ = graded
    r = by["input-transformer/toy.ipynb"]
    assert scores(r) == {"toy-q1": 0, "toy-q2": 0, "toy-q3": 0}, r.questions
    assert all("no answer" in q.message or q.status in ("failed", "flagged") for q in r.questions)


def test_a_patched_standard_library_does_not_pass_a_wrong_answer(graded):
    by, _ = graded
    r = by["patch-stdlib/toy.ipynb"]
    assert scores(r) == {"toy-q1": 0, "toy-q2": 3, "toy-q3": 0}, r.questions
    assert r.questions[2].status == "flagged"  # keywords without sentences: a person reads it


def test_redefining_a_name_the_hidden_test_used_changes_nothing(graded):
    by, _ = graded
    r = by["redefine-given/toy.ipynb"]
    assert scores(r) == {"toy-q1": 0, "toy-q2": 3, "toy-q3": 2}, r.questions


def test_forged_hand_in_outputs_count_for_nothing(graded):
    by, _ = graded
    # a hand-in shown or made by the student's own cell is ignored; the check cell's own counts
    assert scores(by["forged-output/toy.ipynb"]) == {"toy-q1": 0, "toy-q2": 3, "toy-q3": 2}
    assert scores(by["own-hand-in/toy.ipynb"]) == {"toy-q1": 0, "toy-q2": 3, "toy-q3": 2}
    # a hook that hands in a second time while the check cell runs: flagged, no points
    r = by["forged-hook/toy.ipynb"]
    q2 = next(q for q in r.questions if q.grade_id == "toy-q2")
    assert q2.points == 0 and q2.status == "flagged" and "more than once" in q2.message, q2


# ----- reading the instructor's notebooks ------------------------------------------

def test_instructor_notebooks_cannot_be_read_from_a_submission(graded):
    by, _ = graded
    r = by["read-instructor/toy.ipynb"]
    # had any instructor notebook been readable, its solutions would have set speedup = 2.5
    assert scores(r) == {"toy-q1": 0, "toy-q2": 0, "toy-q3": 0}, r.questions


# ----- writing outside its folder ----------------------------------------------------

def test_a_classmates_submission_cannot_be_overwritten(graded):
    by, ctx = graded
    victim = ctx["sub"] / "victim" / "toy.ipynb"
    assert hashlib.sha256(victim.read_bytes()).hexdigest() == ctx["victim_before"]
    assert scores(by["victim/toy.ipynb"]) == FULL
    assert (ctx["sub"] / "honest" / "toy.ipynb").exists()
    assert scores(by["overwrite-classmate/toy.ipynb"]) == FULL  # its own answers were right


def test_the_installed_library_cannot_be_changed(graded):
    by, ctx = graded
    assert _library_digest() == ctx["library_before"]
    assert not (LIBRARY / "grading" / "evil.py").exists()
    assert scores(by["change-library/toy.ipynb"]) == {"toy-q1": 0, "toy-q2": 3, "toy-q3": 2}
    # submissions graded after it (the victim, the honest student) kept their honest marks
    assert scores(by["victim/toy.ipynb"]) == FULL and scores(by["wrong/toy.ipynb"])["toy-q1"] == 0


def test_no_process_outlives_grading_and_the_csv_stays_as_written(graded):
    by, ctx = graded
    assert processes_with(MARKER) == []
    time.sleep(3)  # the detached process would have written by now
    assert processes_with(MARKER) == []
    assert autograde.verify(ctx["out"] / "grades.csv", key=KEY, submissions=ctx["sub"]) == []
    rows = {r["student"]: r for r in csv.DictReader((ctx["out"] / "grades.csv").open(encoding="utf-8"))}
    assert "attacker" not in rows and float(rows["detached"]["total"]) == 5
    # the printed table and the CSV are the same rows
    for name, row in rows.items():
        if name.startswith("'"):  # a formula, neutralised in the CSV only
            name = name[1:]
        line = next(line for line in ctx["table"].splitlines() if line.split("  ")[0].strip() ==
                    display_name(name))
        assert line.split()[-2:] == [row["total"], row["max"]], (line, row)


# ----- identities ----------------------------------------------------------------

def test_nested_folders_are_separate_students(graded):
    _, ctx = graded
    assert _row(ctx, "section-1/ada")["total"] == 7
    assert _row(ctx, "section-1/bea")["total"] == 4
    assert not any(r[0] == "section-1" for r in autograde.score_table(ctx["results"])[1])


def test_a_file_beside_a_folder_of_the_same_name_are_two_rows_that_add_up(graded):
    _, ctx = graded
    header, rows = autograde.score_table(ctx["results"])
    qcols = [h for h in header if h.startswith("toy-q")]
    assert _row(ctx, "bob.ipynb")["total"] == 5 and _row(ctx, "bob")["total"] == 4
    for row in rows:
        d = dict(zip(header, row))
        assert d["total"] == sum(d[q] for q in qcols if d[q] != ""), d


def test_two_files_of_one_exercise_are_flagged_never_merged(graded):
    by, ctx = graded
    row = _row(ctx, "carl")
    assert row["total"] == 0 and all(row[q] == "" for q in POINTS)
    assert "2 files for toy" in row["notes"] and "Copy of toy.ipynb" in row["notes"]
    assert by["carl/toy.ipynb"].duplicate and by["carl/Copy of toy.ipynb"].duplicate
    assert scores(by["carl/toy.ipynb"]) == FULL  # each file's own result is kept in the details


# ----- accidents to metadata and cells ---------------------------------------------

def test_mangled_metadata_costs_nothing(graded):
    by, _ = graded
    r = by["mangled-metadata/toy.ipynb"]
    assert scores(r) == FULL, r.questions


def test_a_damaged_source_costs_at_most_its_question(graded):
    by, _ = graded
    r = by["broken-source/toy.ipynb"]
    assert scores(r) == {"toy-q1": 2, "toy-q2": 0, "toy-q3": 2}, r.questions
    assert "damaged source" in r.problem


def test_a_student_cell_that_looks_like_a_check_is_not_replaced(graded):
    by, _ = graded
    r = by["header-lookalike/toy.ipynb"]
    # question 2's stub was left, but the student's own "# Check toy-q2" cell answered it
    assert scores(r) == FULL, (r.questions, r.cells)


def test_an_edited_or_deleted_check_is_restored_in_place(graded):
    by, _ = graded
    r = by["edited-checks/toy.ipynb"]
    assert scores(r) == FULL, r.questions
    assert "restored: toy-q1, toy-q2" in r.problem


# ----- feedback and free text ------------------------------------------------------

def test_feedback_says_what_is_wrong_without_the_expected_value(graded):
    by, _ = graded
    for path, value in (("close-guess/toy.ipynb", 2.54), ("wrong/toy.ipynb", 4.0)):
        q1 = by[path].questions[0]
        assert q1.points == 0 and "too large" in q1.message and "100 / base" in q1.message, q1
        for leak in ("2.5 ", "2.50", "40", f"{value / 2.5:.3g}"):
            assert leak not in q1.message.replace(f"{value:g}", ""), (leak, q1.message)


def test_free_text_padded_with_key_words_is_flagged_for_a_person(graded):
    by, ctx = graded
    for path in ("padded-text/toy.ipynb", "keyword-salad/toy.ipynb"):
        q3 = by[path].questions[2]
        assert q3.points == 0 and q3.status == "flagged", q3
        assert q3.answer_text, "the details CSV shows the answer to read"
    assert "toy-q3 flagged" in _row(ctx, "padded-text")["notes"]
    assert by["honest/toy.ipynb"].questions[2].status == "passed"


# ----- resources and the old accidents ------------------------------------------------

def test_memory_is_capped_per_process(graded):
    by, _ = graded
    hog = by["memory-hog/toy.ipynb"]
    assert scores(hog) == {"toy-q1": 0, "toy-q2": 3, "toy-q3": 2}, hog.cells
    assert any("MemoryError" in m for _, _, m in hog.cells)
    creep = by["memory-creep/toy.ipynb"]
    assert scores(creep) == {"toy-q1": 2, "toy-q2": 0, "toy-q3": 2}, creep.cells


def test_the_grader_survives_loops_typos_crashes_floods_and_junk(graded):
    by, ctx = graded
    assert scores(by["looper/toy.ipynb"]) == {"toy-q1": 0, "toy-q2": 3, "toy-q3": 2}
    assert "timed out" in by["looper/toy.ipynb"].problem
    assert scores(by["typo/toy.ipynb"]) == {"toy-q1": 0, "toy-q2": 3, "toy-q3": 2}
    assert any("SyntaxError" in m for _, _, m in by["typo/toy.ipynb"].cells)
    assert scores(by["crasher/toy.ipynb"]) == {"toy-q1": 0, "toy-q2": 3, "toy-q3": 2}
    assert "kernel" in by["crasher/toy.ipynb"].problem
    assert scores(by["shouter/toy.ipynb"]) == FULL and scores(by["chatterbox/toy.ipynb"]) == FULL
    assert ctx["grader_rss_growth"] < 300 * 1024 ** 2, "500 MB of output went through the grader's memory"
    for junk in ("junk/toy.ipynb", "lost.ipynb"):
        assert by[junk].score == 0 and "not a readable notebook" in by[junk].problem or \
            "cannot tell" in by[junk].problem, by[junk]
    assert scores(by["o'dd; name\n(1)/Copy of toy (1).ipynb"]) == FULL
    assert scores(by["ünï cödé/-toy.ipynb"]) == FULL
    rows = list(csv.DictReader((ctx["out"] / "grades.csv").open(encoding="utf-8")))
    assert "o'dd; name\n(1)" in {r["student"] for r in rows}  # odd names survive the CSV round trip
    assert "\n(1)" not in ctx["table"]  # and stay on one line in the printed table



# ----- one student against the class's files -------------------------------

def test_a_name_that_is_not_utf8_and_a_lone_surrogate_spoil_nothing(graded):
    by, ctx = graded
    # the run wrote all three files (the fixture would have raised) and they are UTF-8 throughout
    for name in ("grades.csv", "grades-details.csv", "grades-manifest.json"):
        (ctx["out"] / name).read_bytes().decode("utf-8")
    rows = {r["student"]: r for r in csv.DictReader((ctx["out"] / "grades.csv").open(encoding="utf-8"))}
    assert float(rows["zo\\xeb"]["total"]) == 7  # the raw name, identifiable: the byte shown as \\xeb
    assert scores(by[f"{NOT_UTF8}/toy.ipynb"]) == FULL
    assert "zo\\xeb" in ctx["table"] and "zo\\xeb/toy.ipynb" in ctx["manifest"]["submissions"]
    q3 = by["surrogate/toy.ipynb"].questions[2]
    assert q3.status == "flagged" and q3.points == 0
    details = list(csv.DictReader((ctx["out"] / "grades-details.csv").open(encoding="utf-8")))
    read = {d["answer_to_read"] for d in details if d["student"] == "surrogate" and d["question"] == "toy-q3"}
    assert read == {"\\ud800 memory less, memory less. time more, time more."}


def test_no_cell_of_the_csv_files_is_a_formula(graded):
    _, ctx = graded
    for name in ("grades.csv", "grades-details.csv"):
        for row in csv.reader((ctx["out"] / name).open(encoding="utf-8")):
            for cell in row:
                assert not cell.lstrip(" ").startswith(("=", "+", "-", "@", "\t", "\r")), (name, cell)
    rows = {r["student"]: r for r in csv.DictReader((ctx["out"] / "grades.csv").open(encoding="utf-8"))}
    for name in FORMULAS:
        assert float(rows["'" + name]["total"]) == 7, name  # the name kept, shown as text; numbers stay numbers
    details = list(csv.DictReader((ctx["out"] / "grades-details.csv").open(encoding="utf-8")))
    assert any(d["answer_to_read"].startswith("'=HYPERLINK") for d in details if d["student"] == "formula-text")


def test_names_that_print_alike_are_flagged_in_both_rows(graded):
    _, ctx = graded
    header, rows = autograde.score_table(ctx["results"])
    notes = {r[0]: r[-1] for r in rows}
    for a, b in (LOOKALIKES[:2], LOOKALIKES[2:]):
        assert "looks like another row" in notes[a] and "looks like another row" in notes[b], (a, b)
        assert _row(ctx, a)["total"] == _row(ctx, b)["total"] == 7  # two rows, never merged
    assert "kim\\nnewline" in ctx["table"] and "looks like" not in notes["honest"]


def test_verify_finds_an_edited_submission_and_a_rehashed_csv(graded, tmp_path):
    import json
    import shutil

    _, ctx = graded
    out, sub = tmp_path / "out", tmp_path / "sub"
    shutil.copytree(ctx["out"], out)
    shutil.copytree(ctx["sub"], sub, symlinks=True)
    assert autograde.verify(out / "grades.csv", key=KEY, submissions=sub) == []
    victim = sub / "honest" / "toy.ipynb"
    victim.write_text(victim.read_text().replace("16 * 1000", "16000"))
    assert any("honest/toy.ipynb changed after grading" in p
               for p in autograde.verify(out / "grades.csv", key=KEY, submissions=sub))
    (out / "grades.csv").write_text((out / "grades.csv").read_text(encoding="utf-8").replace("\nwrong,0", "\nwrong,2"),
                                    encoding="utf-8")
    m = json.loads((out / "grades-manifest.json").read_text())
    m["files"]["grades.csv"] = hashlib.sha256((out / "grades.csv").read_bytes()).hexdigest()
    (out / "grades-manifest.json").write_text(json.dumps(m))
    assert any("signature does not match" in p for p in autograde.verify(out / "grades.csv", key=KEY))


# ----- forged marks: measurements taken on trust, answers that must agree -------------------

MEASURE = ("import time\n"
           "pieces = {}\n"
           "for name in ('a', 'b'):\n"
           "    t0 = time.perf_counter()\n"
           "    sum(range(20000))\n"
           "    pieces[name] = time.perf_counter() - t0\n"
           "print(pieces)")


def meter_exercise():
    """Two questions: a total from measured pieces (its measuring cell declared), and a plan that must be
    the one an earlier question handed in."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    from grading_toy import check_cell, solution_cell
    from lessonlib.grading import handout

    nb = new_notebook(cells=[
        new_markdown_cell("# Meter"),
        new_code_cell(MEASURE, metadata={"grading": {"measures": {"meter-q1": {"pieces": "pieces"}}}}),
        solution_cell("meter-a1", "total = pieces['a'] + pieces['b']"),
        check_cell("meter-q1", 2, "from lessonlib.grading import hand_in\nhand_in('meter-q1', total=total, pieces=pieces)",
                   "from lessonlib.grading import grader, check_close\n\n\n@grader('meter-q1')\ndef _(got):\n"
                   "    p = got['pieces']\n"
                   "    check_close('total', got['total'], p['a'] + p['b'], rel=1e-9, hint='add the pieces')"),
        solution_cell("meter-a2", "plan = {2, 4}"),
        check_cell("meter-q2", 1, "from lessonlib.grading import hand_in\nhand_in('meter-q2', plan=plan)",
                   "from lessonlib.grading import grader\n\n\n@grader('meter-q2')\ndef _(got):\n"
                   "    assert got['plan'] == {2, 4}, 'not the plan'"),
        solution_cell("meter-a3", "count = 2 * len(plan)"),
        check_cell("meter-q3", 1, "from lessonlib.grading import hand_in\nhand_in('meter-q3', plan=plan, count=count)",
                   "from lessonlib.grading import grader\n\n\n@grader('meter-q3')\ndef _(got):\n"
                   "    assert got['plan'] == got.answers_to('meter-q2')['plan'], 'the plan of question 2, please'\n"
                   "    assert got['count'] == 2 * len(got['plan']), 'twice the plan'"),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata[handout.META_KEY] = {"id": "meter", "title": "Meter", "chapter": 3, "objective": 3, "minutes": 5}
    return nb


def _meter_submission(a1="total = pieces['a'] + pieces['b']", a2="plan = {2, 4}", a3="count = 2 * len(plan)",
                      measure=MEASURE):
    from lessonlib.grading import handout

    nb = handout.student_notebook(meter_exercise())
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        cell.source = {"meter-a1": a1, "meter-a2": a2, "meter-a3": a3}.get(gid, cell.source)
    nb.cells = [c for c in nb.cells if c.source != MEASURE or measure is not None]
    for c in nb.cells:
        if c.source == MEASURE and measure is not None:
            c.source = measure
    return nb


TYPED = "pieces = {'a': 0.001, 'b': 0.002}\ntotal = 0.003"


@pytest.fixture(scope="module")
def graded_meter(tmp_path_factory):
    import nbformat

    course = tmp_path_factory.mktemp("meter")
    (course / "source").mkdir()
    nbformat.write(meter_exercise(), course / "source" / "meter.ipynb")
    subs = {
        "honest": _meter_submission(),
        "typed-in": _meter_submission(a1=TYPED, measure=None),  # the measuring cell deleted
        "overwritten": _meter_submission(a1=TYPED),  # measured, then replaced by typed-in times
        "edited-meter": _meter_submission(measure="pieces = {'a': 0.001, 'b': 0.002}\nprint(pieces)"),
        "wrong-total": _meter_submission(a1="total = pieces['a']"),
        "swapped-plan": _meter_submission(a3="plan = set()\ncount = 0"),  # q3 answered for another plan
    }
    for who, nb in subs.items():
        submit(course / "submitted", f"{who}/meter.ipynb", nb)
    results = autograde.grade_folder(course / "submitted", course / "source", cell_timeout=20, budget=60, jobs=2,
                                     progress=None)
    return {r.student: r for r in results}


def test_typed_in_measurements_are_flagged_measured_ones_pass(graded_meter):
    by = graded_meter
    assert scores(by["honest"]) == {"meter-q1": 2, "meter-q2": 1, "meter-q3": 1}, by["honest"].questions
    for who, why in (("typed-in", "missing, edited or did not run"), ("overwritten", "not what the measuring cell"),
                     ("edited-meter", "missing, edited or did not run")):
        q1 = by[who].questions[0]
        assert q1.status == "flagged" and q1.points == 0 and why in q1.message, (who, q1)
    q1 = by["wrong-total"].questions[0]
    assert q1.status == "failed" and "add the pieces" in q1.message  # a wrong answer stays wrong


def test_an_answer_that_must_agree_with_an_earlier_one_is_compared(graded_meter):
    r = graded_meter["swapped-plan"]
    assert scores(r) == {"meter-q1": 2, "meter-q2": 1, "meter-q3": 0}, r.questions
    assert "the plan of question 2" in r.questions[2].message
