"""lessonlib.grading, piece by piece: hand-in data, checks, feedback, free text, alignment, tables.

No kernels here (the hostile suite and test_exercises.py run those).
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
import subprocess
import sys

import pytest

from grading_toy import GOOD_TEXT, honest, make_course, student, submit, toy_exercise
from lessonlib.grading import (Flag, answers, autograde, check_choice, check_close, check_key_points, graders,
                               grader, hand_in, reference, require_number)
from lessonlib.grading.autograde import Cell, NotebookResult, QuestionResult


# ----- plain data out of the kernel ---------------------------------------------

def test_hand_in_sends_plain_data_that_decodes_to_the_same_values():
    import numpy as np

    value = {"n": 3, "x": 0.25, "big": 7_500_000_000, "s": "text", "none": None, "flag": True,
             "seq": (1, 2.5), "keep": {2, 4}, "rows": {64: {"single": 0.1}, 1024: {"single": 0.2}},
             "np": np.float32(0.5), "arr": np.arange(3), "nan": float("nan")}
    plain = {k: answers.to_plain(v, k) for k, v in value.items()}
    back = graders.decode_answers(json.loads(json.dumps(plain)))
    assert back["rows"] == {64: {"single": 0.1}, 1024: {"single": 0.2}}  # integer keys survive
    assert back["keep"] == {2, 4} and back["seq"] == [1, 2.5] and back["arr"] == [0, 1, 2]
    assert back["np"] == 0.5 and back["big"] == 7_500_000_000 and math.isnan(back["nan"])
    assert {k: back[k] for k in ("n", "x", "s", "none", "flag")} == {k: value[k] for k in ("n", "x", "s", "none", "flag")}


@pytest.mark.parametrize("bad,why", [
    (lambda: 1, "plain data"), (object(), "plain data"), ("x" * 30_000, "too long"),
    ({(1, 2): 3}, "keys"), ([[[[[[[[1]]]]]]]], "nested"), (list(range(5000)), "too many"),
])
def test_hand_in_refuses_what_is_not_plain_data(bad, why):
    with pytest.raises(TypeError, match=why):
        answers.to_plain(bad, "x")


def test_hand_in_records_each_call_and_the_grader_takes_them_once(capsys):
    answers.take()
    hand_in("t-q1", x=1.5)
    hand_in("t-q1", x=2.5)
    assert "t-q1: handed in x" in capsys.readouterr().out
    assert [e["answers"]["x"] for e in json.loads(answers.take())] == [1.5, 2.5]
    assert json.loads(answers.take()) == []
    with pytest.raises(ValueError, match="grade_id"):
        hand_in("../evil", x=1)
    with pytest.raises(ValueError, match="at least one"):
        hand_in("t-q1")


def test_decode_rejects_objects_it_did_not_make():
    for bad in ({"$dict": [[[1], 2]]}, {"__class__": "os.system"}, {"$set": [[1]]}, {"$float": "1e999"}):
        with pytest.raises(ValueError):
            graders.decode(bad)


# ----- checks and their feedback ----------------------------------------------------

def test_shape_checks_give_helpful_messages():
    with pytest.raises(AssertionError, match="empty"):
        require_number("x", None)
    with pytest.raises(AssertionError, match="number"):
        require_number("x", "many")
    with pytest.raises(AssertionError, match="plausible range"):
        require_number("x", 5e12, low=1e9, high=1e11, unit="bytes")
    with pytest.raises(AssertionError, match="one of"):
        check_choice("kind", "both", "activation", ["activation", "recovery"])
    check_close("x", 2.501, 2.5, rel=0.01)


@pytest.mark.parametrize("expected", [2.5, 0.0132, 16_000, 7.2e-5, 3.1e11, -4.0])
@pytest.mark.parametrize("factor", [0.5, 0.95, 1.05, 3.0, 1000.0, 1e-3, -1.0])
def test_feedback_never_gives_the_expected_value_away(expected, factor):
    value = expected * factor
    with pytest.raises(AssertionError) as err:
        check_close("answer", value, expected, rel=0.03, hint="a hint")
    msg = str(err.value).replace(f"{value:g}", "<value>")
    for leak in {f"{expected:g}", f"{expected:.3g}", f"{expected:.2g}", f"{abs(factor):.3g}",
                 f"{1 / abs(factor):.3g}"} - {"1"}:
        assert leak not in msg, (leak, msg)
    assert "a hint" in msg
    assert any(w in msg for w in ("too large", "too small", "sign", "zero")), msg


def test_feedback_says_the_direction_and_a_unit_mix_up():
    with pytest.raises(AssertionError, match="too small"):
        check_close("t", 1.0, 2.0)
    with pytest.raises(AssertionError, match="far too large.*units"):
        check_close("bytes", 16e9, 16e6)
    with pytest.raises(AssertionError, match="wrong sign"):
        check_close("t", -2.0, 2.0)


def test_grader_checks_at_once_in_a_notebook_and_registers_in_the_reference(capsys):
    hand_in("t-q2", x=3.0)

    @grader("t-q2")
    def _(got):
        check_close("x", got["x"], 3.0)

    assert "t-q2 ✓" in capsys.readouterr().out
    hand_in("t-q3", x=4.0)
    with pytest.raises(AssertionError, match="not right"):
        @grader("t-q3")
        def _(got):
            check_close("x", got["x"], 3.0)
    with pytest.raises(AssertionError, match="was not handed in"):
        @grader("t-q3")
        def _(got):
            got["y"]


def test_reference_runs_the_notebook_without_solutions(tmp_path):
    src = make_course(tmp_path)
    registry = reference.load(src / "toy.ipynb")
    assert sorted(registry) == ["toy-q1", "toy-q2", "toy-q3"]
    assert graders.MODE == "live" and "toy-q1" not in graders.REGISTRY  # restored for this process
    ok = reference.run_check(registry["toy-q1"], graders.decode_answers({"speedup": 2.5}), 5)
    assert ok == ("passed", "")
    status, msg = reference.run_check(registry["toy-q1"], graders.decode_answers({"speedup": "2.5"}), 5)
    assert status == "failed" and "number" in msg
    status, msg = reference.run_check(registry["toy-q3"], graders.decode_answers({"answer": "Yes. " * 20}), 5)
    assert status == "flagged"


def test_reference_check_that_hangs_is_stopped():
    def hang(got):
        while True:
            pass
    assert reference.run_check(hang, graders.Answers(), 0.2)[0] == "error"


@pytest.mark.slow  # starts a process
def test_reference_process_answers_malformed_requests_and_keeps_going(tmp_path):
    src = make_course(tmp_path)
    lines = [json.dumps({"id": 1, "question": "toy-q1", "answers": {"speedup": 2.5}}),
             "not json", json.dumps({"id": 3, "question": "toy-q9", "answers": {}}),
             json.dumps({"id": 4, "question": "toy-q1", "answers": {"speedup": {"$dict": "x"}}}),
             json.dumps({"id": 5, "question": "toy-q2", "answers": {"state_bytes": 16000}})]
    run = subprocess.run([sys.executable, "-m", "lessonlib.grading.reference", str(src / "toy.ipynb")],
                         input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60)
    replies = [json.loads(line) for line in run.stdout.splitlines()]
    assert replies[0] == {"ready": True, "questions": ["toy-q1", "toy-q2", "toy-q3"]}
    assert [r["status"] for r in replies[1:]] == ["passed", "failed", "error", "failed", "passed"]
    assert "base 40" in run.stderr  # what the instructor's cells print stays off the protocol


# ----- free text -------------------------------------------------------------------

KEYS = {"verdict": [["\\byes\\b"]], "memory down": [["memory"], ["less", "down"]],
        "time up": [["time"], ["more", "up"]]}


def test_free_text_needs_each_point_in_its_own_well_formed_sentence():
    check_key_points("a", "Yes, it is the right call here. The memory needed goes down a lot. "
                          "Each step takes more time than before.", KEYS)
    with pytest.raises(Flag, match="malformed or repeated"):
        check_key_points("a", "Yes it is. Memory less, memory less. Time more, time more.", KEYS)
    with pytest.raises(Flag, match="share sentences"):
        check_key_points("a", "Yes, the memory goes down and the time goes up for it.", KEYS)
    with pytest.raises(Flag, match="did not find: time up"):
        check_key_points("a", "Yes, it is the right call here. The memory needed goes down a lot.", KEYS)
    with pytest.raises(Flag, match="share sentences"):  # the same sentence twice is one sentence
        check_key_points("a", "Yes, it is the call. The memory goes down, so the time goes up. "
                              "The memory goes down, so the time goes up.", KEYS)
    with pytest.raises(AssertionError, match="words"):
        check_key_points("a", "Yes, less memory.", KEYS)


def test_well_formed_is_a_screen_for_keyword_lists():
    assert graders.well_formed("It keeps fewer activations, so memory goes down.")
    for bad in ("Memory less, memory less.", "memory less time more", "Yes.", "time time time more"):
        assert not graders.well_formed(bad), bad


# ----- reading submissions and putting the checks in ----------------------------------

def _cells(nb):
    return [Cell(c.cell_type, c.source, c.get("metadata", {}).get("nbgrader", {}).get("grade_id")) for c in nb.cells]


def _plan(nb):
    ex = autograde.Exercise.load_notebook(toy_exercise())
    return autograde.plan_cells(ex.copy_cells, ex.checks, _cells(nb))


def test_checks_are_found_by_their_text_and_place_not_by_metadata():
    steps = _plan(honest())
    assert [s.grade_id for s in steps if s.grade_id] == ["toy-q1", "toy-q2", "toy-q3"]
    assert not any(s.restored for s in steps)
    # metadata stripped (as some editors do): the same plan
    nb = honest()
    for c in nb.cells:
        c.metadata = {}
    assert [(s.source, s.grade_id) for s in _plan(nb)] == [(s.source, s.grade_id) for s in steps]


def test_a_pasted_copy_of_a_check_stays_the_students_cell():
    nb = student({"toy-a1": "speedup = 2.5"}, after={"toy-a1": "x = 1  # my scratch cell"})
    check_q1 = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "toy-q1")
    nb.cells.append(check_q1.copy())  # a pasted duplicate of check q1 (its metadata too), at the end
    steps = _plan(nb)
    assert [s.grade_id for s in steps if s.grade_id] == ["toy-q1", "toy-q2", "toy-q3"]  # each check once
    assert steps[-1].grade_id is None and steps[-1].source == check_q1.source  # the copy runs as the student's
    assert "x = 1  # my scratch cell" in [s.source for s in steps]


def test_read_cells_survives_damage(tmp_path):
    p = tmp_path / "n.ipynb"
    p.write_text(json.dumps({"cells": [
        {"cell_type": "code", "source": ["a = 1\n", "b = 2"], "metadata": "junk"},
        "not a cell", {"cell_type": "wizard", "source": "x"}, {"cell_type": "code", "source": 5},
        {"cell_type": "markdown", "source": "# hi", "metadata": {"nbgrader": {"grade_id": 7}}}]}))
    cells, notes = autograde.read_cells(p)
    assert [(c.type, c.source) for c in cells] == [("code", "a = 1\nb = 2"), ("raw", "x"), ("code", ""),
                                                   ("markdown", "# hi")]
    assert len(notes) == 3
    for raw, why in ((b"\xff\xfe", "not JSON"), (b"[]", "not a notebook"), (b'{"worksheets": []}', "nbformat 3"),
                     (b'{"cells": 3}', "no list")):
        p.write_bytes(raw)
        with pytest.raises(autograde.NotANotebook, match=why):
            autograde.read_cells(p)
    link = tmp_path / "link.ipynb"
    link.symlink_to(p)
    with pytest.raises(autograde.NotANotebook, match="link"):
        autograde.read_cells(link)


def test_submissions_are_identified_by_their_relative_path(tmp_path):
    for rel in ("ada/toy.ipynb", "section-1/ada/toy.ipynb", "bob.ipynb", "bob/toy.ipynb",
                "x/.ipynb_checkpoints/toy-checkpoint.ipynb", "notes.txt"):
        submit(tmp_path, rel, honest())
    found = {s.rel: s.student for s in autograde.find_submissions(tmp_path)}
    assert found == {"ada/toy.ipynb": "ada", "section-1/ada/toy.ipynb": "section-1/ada",
                     "bob.ipynb": "bob.ipynb", "bob/toy.ipynb": "bob"}


# ----- the table and the files ------------------------------------------------------

def _result(student, exercise, pts, path=None, duplicate=False):
    r = NotebookResult(student, exercise, path or f"{student}/{exercise}.ipynb", duplicate=duplicate)
    r.questions = [QuestionResult(f"{exercise}-q{i}", p, 2.0, "passed" if p else "failed") for i, p in enumerate(pts, 1)]
    return r


def test_score_table_rows_add_up_and_duplicates_are_not_counted():
    results = [_result("ada", "1a", [2, 2]), _result("ada", "2b", [2, 0]),
               _result("bob", "1a", [2, 2], "bob/1a.ipynb", True), _result("bob", "1a", [0, 0], "bob/x.ipynb", True)]
    header, rows = autograde.score_table(results)
    assert header == ["student", "1a-q1", "1a-q2", "2b-q1", "2b-q2", "total", "max", "notes"]
    by = {r[0]: r for r in rows}
    assert by["ada"][1:7] == [2, 2, 2, 0, 6, 8]
    assert by["bob"][1:3] == ["", ""] and by["bob"][5] == 0


def test_results_are_written_atomically_with_a_manifest_and_verified(tmp_path):
    results = [_result("ada", "1a", [2, 2]), _result("bob", "1a", [2, 0])]
    manifest = autograde.write_results(results, tmp_path / "g.csv", key=b"k" * 32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g-details.csv", "g-manifest.json", "g.csv"]
    assert manifest["files"]["g.csv"] == json.loads((tmp_path / "g-manifest.json").read_text())["files"]["g.csv"]
    assert autograde.verify(tmp_path / "g.csv", key=b"k" * 32) == []
    (tmp_path / "g.csv").write_text((tmp_path / "g.csv").read_text().replace("bob,2,0,2", "bob,2,2,4"))
    assert any("changed after grading" in p for p in autograde.verify(tmp_path / "g.csv", key=b"k" * 32))


def test_score_table_prints_one_block_per_exercise_when_wide():
    results = []
    for student_, pts in (("ada", 2.0), ("bob", 0.0)):
        for ex in ("1a", "2b", "3c", "3d"):
            results.append(_result(student_, ex, [pts] * 4))
    text = autograde.format_table(results)
    assert text.splitlines()[0] == "1a" and "totals" in text
    assert any(line.split() == ["ada", "8", "8", "8", "8", "32", "32"] for line in text.splitlines())


def test_grade_folder_rejects_bad_arguments(tmp_path):
    src = make_course(tmp_path)
    for kwargs, why in (({"jobs": 0}, "jobs"), ({"jobs": 1.5}, "jobs"), ({"cell_timeout": float("nan")}, "cell_timeout"),
                        ({"budget": -5}, "budget"), ({"exercise": "bogus"}, "exercise")):
        with pytest.raises(ValueError, match=why):
            autograde.grade_folder(tmp_path, src, sandbox=None, progress=None, **kwargs)


def test_good_text_of_the_toy_passes_its_own_check(tmp_path):
    registry = reference.load(make_course(tmp_path) / "toy.ipynb", questions=["toy-q3"], given=False)
    assert reference.run_check(registry["toy-q3"], graders.decode_answers({"answer": GOOD_TEXT}), 5)[0] == "passed"


@pytest.mark.slow  # starts a process
def test_the_student_side_imports_nothing_else_from_lessonlib_and_no_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import lessonlib.grading\n"
            "from lessonlib.grading import hand_in, require_number, check_close, grader\n"
            "print(sorted(m for m in sys.modules if m.startswith('lessonlib')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == str(["lessonlib", "lessonlib.grading", "lessonlib.grading.answers",
                                      "lessonlib.grading.graders"])


@pytest.mark.slow  # starts a process
def test_an_instructor_notebook_whose_checks_need_a_solution_stops_the_run(tmp_path):
    import nbformat

    src = make_course(tmp_path)
    nb = nbformat.read(src / "toy.ipynb", as_version=4)
    # a hidden test that reads the solution's name: in the reference process no solution ran
    nb.cells[4].source = nb.cells[4].source.replace("_expected = 100 / base", "_expected = speedup")
    nbformat.write(nb, src / "toy.ipynb")
    submit(tmp_path / "sub", "ada/toy.ipynb", honest())
    with pytest.raises(autograde.ReferenceFailed, match="NameError: name 'speedup' is not defined"):
        autograde.grade_folder(tmp_path / "sub", src, sandbox=None, progress=None)


# ----- one student cannot spoil the class's files --------------------------

def _flagged(student, text):
    r = _result(student, "1a", [2])
    r.questions.append(QuestionResult("1a-q2", 0.0, 2.0, "flagged", "to read", answer_text=text))
    return r


HOSTILE_NAMES = [b"zo\xeb".decode("utf-8", "surrogateescape"), "lone\ud800", "=HYPERLINK(\"http://x\",\"y\")",
                 "+SUM(1;2)", "-2+3", "@SUM(1)", "\tTAB", " =pad"]


def test_names_that_are_not_utf8_and_lone_surrogates_reach_every_file_safely(tmp_path):
    results = [_result(n, "1a", [2, 2], path=f"{n}/1a.ipynb") for n in HOSTILE_NAMES]
    results += [_flagged("ada", "\ud800 what I think"), _flagged("bea", "=1+1 is my answer")]
    manifest = autograde.write_results(results, tmp_path / "g.csv", key=b"k" * 32)
    table = autograde.format_table(results)
    table.encode("utf-8")  # printable
    text = (tmp_path / "g.csv").read_text(encoding="utf-8")
    details = (tmp_path / "g-details.csv").read_text(encoding="utf-8")
    assert "zo\\xeb" in text and "lone\\ud800" in text  # the raw name is still identifiable
    assert "zo\\xeb" in table and "zo\\xeb/1a.ipynb" in manifest["submissions"]
    assert "\\ud800 what I think" in details
    assert autograde.verify(tmp_path / "g.csv", key=b"k" * 32) == []


def test_formulas_never_reach_a_spreadsheet_and_numbers_stay_numbers(tmp_path):
    results = [_result(n, "1a", [2, 0], path=f"{n}/1a.ipynb") for n in HOSTILE_NAMES]
    results += [_flagged("bea", "=1+1 is my answer"), _result("cy", "1a", [1.5, 0])]
    autograde.write_results(results, tmp_path / "g.csv", key=b"k" * 32)
    for name in ("g.csv", "g-details.csv"):
        rows = list(csv.reader((tmp_path / name).open(encoding="utf-8")))
        for row in rows:
            for cell in row:
                assert not cell.lstrip(" ").startswith(("=", "+", "-", "@", "\t", "\r")), (name, cell)
    rows = {r["student"]: r for r in csv.DictReader((tmp_path / "g.csv").open(encoding="utf-8"))}
    assert "'-2+3" in rows and "'=HYPERLINK(\"http://x\",\"y\")" in rows and "'@SUM(1)" in rows
    assert rows["cy"]["1a-q1"] == "1.5" and rows["cy"]["total"] == "1.5" and rows["'-2+3"]["1a-q1"] == "2"
    details = list(csv.DictReader((tmp_path / "g-details.csv").open(encoding="utf-8")))
    assert "'=1+1 is my answer" in {d["answer_to_read"] for d in details}
    assert results_csv_cell_cases() == ["'=x", "'+x", "'-x", "'@x", "'\tx", "'\rx", "x", "3", "-2", "2.5"]


def results_csv_cell_cases():
    from lessonlib.grading.results import csv_cell

    return [csv_cell(v) for v in ("=x", "+x", "-x", "@x", "\tx", "\rx", "x", 3.0, -2, 2.5)]


@pytest.mark.parametrize("a,b", [("kim\nnewline", "kim newline"), ("Zo\u00eb", "Zoe\u0308"), ("x" * 70 + "1", "x" * 70 + "2"),
                                 ("ada", "ADA"), ("ada\u200b", "ada")])
def test_names_that_look_alike_are_flagged_in_both_rows(a, b):
    header, rows = autograde.score_table([_result(a, "1a", [2]), _result(b, "1a", [0]), _result("zed", "1a", [2])])
    notes = {r[0]: r[-1] for r in rows}
    assert "looks like another row" in notes[a] and "looks like another row" in notes[b], notes
    assert "looks like" not in notes["zed"]
    assert len(rows) == 3  # flagged, never merged


def test_the_table_shows_control_characters_as_escapes():
    text = autograde.format_table([_result("kim\nnewline", "1a", [2]), _result("kim newline", "1a", [0])])
    assert "kim\\nnewline" in text and "kim newline" in text


# ----- verify: what it guarantees ---------------------------------------------------

def _graded_folder(tmp_path):
    sub = tmp_path / "sub"
    results = []
    for who in ("ada", "bob"):
        p = submit(sub, f"{who}/1a.ipynb", honest())
        r = _result(who, "1a", [2, 2 if who == "ada" else 0])
        r.sha256 = hashlib.sha256(p.read_bytes()).hexdigest()
        results.append(r)
    return sub, results


def test_verify_needs_the_key_a_rehashed_edit_does_not_pass(tmp_path):
    key = b"s" * 32
    out = tmp_path / "out" / "g.csv"
    _, results = _graded_folder(tmp_path)
    autograde.write_results(results, out, key=key)
    assert autograde.verify(out, key=key) == []
    # edit a row and recompute every hash in the manifest: without the key the signature fails
    out.write_text(out.read_text().replace("bob,2,0,2", "bob,2,2,4"))
    m = json.loads(autograde.manifest_path(out).read_text())
    m["files"]["g.csv"] = hashlib.sha256(out.read_bytes()).hexdigest()
    autograde.manifest_path(out).write_text(json.dumps(m))
    assert any("signature does not match" in p for p in autograde.verify(out, key=key))
    assert any("another key" in p for p in autograde.verify(out, key=b"t" * 32))


def test_verify_checks_the_submissions_it_stored(tmp_path):
    key = b"s" * 32
    sub, results = _graded_folder(tmp_path)
    out = tmp_path / "out" / "g.csv"
    autograde.write_results(results, out, key=key)
    assert autograde.verify(out, key=key, submissions=sub) == []
    (sub / "bob" / "1a.ipynb").write_text((sub / "bob" / "1a.ipynb").read_text().replace("16 * 1000", "16000"))
    submit(sub, "eve/1a.ipynb", honest())
    problems = autograde.verify(out, key=key, submissions=sub)
    assert any("bob/1a.ipynb changed after grading" in p for p in problems), problems
    assert any("eve/1a.ipynb was not graded" in p for p in problems), problems
    (sub / "ada" / "1a.ipynb").unlink()
    assert any("ada/1a.ipynb is missing" in p for p in autograde.verify(out, key=key, submissions=sub))


def test_the_key_is_made_once_outside_the_results_and_refused_inside(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("LESSONLIB_GRADING_KEY", raising=False)
    path = autograde.default_key_path()
    assert path == tmp_path / "config" / "lessonlib" / "grading.key"
    _, results = _graded_folder(tmp_path)
    autograde.write_results(results, tmp_path / "out" / "g.csv")
    key = autograde.load_key()
    assert path.stat().st_mode & 0o077 == 0  # readable by its owner only
    assert autograde.verify(tmp_path / "out" / "g.csv") == []
    assert autograde.load_key() == key  # made once
    with pytest.raises(ValueError, match="key_path .* results folder"):
        autograde.write_results(results, tmp_path / "out" / "g.csv", key_path=tmp_path / "out" / "k.key")
    with pytest.raises(FileNotFoundError, match="no grading key"):
        autograde.load_key(tmp_path / "nowhere.key")


# ----- answers that must agree; claims, not words -------------------------

def test_a_check_sees_what_the_notebook_handed_in_to_its_other_questions(capsys):
    got = graders.decode_answers({"plan": {"$set": [2, 4]}, "@t-q1": {"$dict": [["plan", {"$set": [2, 4]}]]}})
    assert dict(got) == {"plan": {2, 4}} and got.answers_to("t-q1")["plan"] == {2, 4}
    with pytest.raises(AssertionError, match="nothing was handed in to t-q9"):
        got.answers_to("t-q9")
    with pytest.raises(ValueError, match="malformed"):
        graders.decode_answers({"@t-q1": 3})
    hand_in("t-q4", plan={1, 2})
    hand_in("t-q5", plan={1, 3})
    with pytest.raises(AssertionError, match="agree"):
        @grader("t-q5")
        def _(got):
            assert got["plan"] == got.answers_to("t-q4")["plan"], "the plans should agree"


def test_autograde_passes_other_answers_and_drops_a_students_own(tmp_path):
    handed = autograde._handed_by_question({3: "t-q1", 5: "t-q2"}, {
        3: [{"question": "t-q1", "answers": {"plan": [1], "@t-q2": "forged"}}],
        5: [{"question": "t-q2", "answers": {"n": 1}}]})
    assert handed == {"t-q1": {"plan": [1]}, "t-q2": {"n": 1}}
    sent = autograde._with_others({"n": 1}, handed, "t-q2")
    got = graders.decode_answers(sent)
    assert dict(got) == {"n": 1} and set(got.others) == {"t-q1"} and got.answers_to("t-q1") == {"plan": [1]}


def test_free_text_negated_or_misconceived_is_flagged_not_passed():
    good = "Yes, it is the right call here. The memory needed goes down a lot. Each step takes more time than before."
    check_key_points("a", good, KEYS)
    with pytest.raises(Flag, match="negated or hedged where it speaks of: memory down"):
        check_key_points("a", "Yes, it is the right call here. The memory needed does not go down at all. "
                              "Each step takes more time than before.", KEYS)
    with pytest.raises(Flag, match="negated"):
        check_key_points("a", good.replace("takes more time", "never takes more time"), KEYS)
    wrong = {"saving to disk frees memory": [["disk"], ["memory"], ["free", "less", "down"]]}
    with pytest.raises(Flag, match="misconception: saving to disk frees memory"):
        check_key_points("a", good + " Saving it to disk frees memory too.", KEYS, misconceptions=wrong)
    check_key_points("a", good, KEYS, misconceptions=wrong)
    assert graders.negated("It doesn\u2019t help.") and not graders.negated("Another note on memory.")


def test_a_negation_turns_its_own_clause_only():
    """A negation about something else leaves a plain claim standing; one about the point's subject flags
    the answer wherever it stands (an ordinary right answer says "it does not change the gradients")."""
    good = "Yes, it is the right call here. The memory needed goes down a lot. Each step takes more time than before."
    check_key_points("a", good + " It does not change the gradients.", KEYS)
    check_key_points("a", good.replace("goes down a lot.", "goes down without changing the result."), KEYS)
    check_key_points("a", good.replace("The memory", "It does not change the maths, but the memory"), KEYS)
    for turned in ("The memory goes down, but not by much.", "So the memory does not go down.",
                   "The memory goes down without any more time."):
        with pytest.raises(Flag, match="negated"):
            check_key_points("a", good + " " + turned, KEYS)
    assert graders.clauses("It cuts memory, but it does not change the result") == \
        ["It cuts memory", "it does not change the result"]
    assert graders.turned("It does not cut memory", [["it"], ["memory"]])
    assert not graders.turned("It does not change the gradients", [["it"], ["memory"]])
