"""The instructor's command line: one-line errors for bad options, and a whole run end to end."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from grading_toy import honest, make_course, submit
from lessonlib.grading import cli, handout, sandbox
from lessonlib.grading import manifest as cli_manifest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "exercises" / "instructor.py"
NO_SANDBOX = sandbox.probe()


@pytest.fixture
def course(tmp_path):
    src = make_course(tmp_path)
    sub = tmp_path / "sub"
    submit(sub, "ada/toy.ipynb", honest())
    submit(sub, "bob/toy.ipynb", handout.student_notebook(nbformat.read(src / "toy.ipynb", as_version=4)))
    return src, sub


BAD = [
    (["--jobs", "0"], "--jobs must be between 1 and 256, got 0"),
    (["--jobs", "two"], "--jobs must be a whole number"),
    (["--exercise", "bogus"], "--exercise must be one of toy; got 'bogus'"),
    (["--cell-timeout", "nan"], "--cell-timeout must be more than 0"),
    (["--cell-timeout", "inf"], "--cell-timeout must be more than 0"),
    (["--budget", "-5"], "--budget must be more than 0"),
    (["--budget", "0"], "--budget must be more than 0"),
    (["--memory", "lots"], "--memory must be a size"),
    (["--memory", "1K"], "--memory must be between"),
    (["--csv", "{sub}/grades.csv"], "--csv must not lie inside the submissions folder"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_options_are_rejected_with_one_line(course, tmp_path, capsys, args, message):
    src, sub = course
    args = [a.replace("{sub}", str(sub)) for a in args]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--source", str(src), "grade", str(sub), "--csv", str(tmp_path / "g.csv"), *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.count("\n") == 1 and err.startswith("instructor.py: error: ") and message in err, err
    assert not (tmp_path / "g.csv").exists()


def test_bad_paths_are_rejected_with_one_line(course, tmp_path, capsys):
    src, sub = course
    for argv in (["--source", str(tmp_path / "nowhere"), "check"],
                 ["--source", str(src), "grade", str(tmp_path / "nowhere")],
                 ["--source", str(tmp_path), "grade", str(sub)]):  # a folder without exercises
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and "error:" in err, err


@pytest.mark.slow  # starts a process
def test_a_bad_option_from_the_shell_gives_no_traceback(course):
    src, sub = course
    run = subprocess.run([sys.executable, str(SCRIPT), "--source", str(src), "grade", str(sub), "--jobs", "0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr and run.stderr.count("\n") == 1, run.stderr


@pytest.mark.slow  # starts kernels
@pytest.mark.skipif(bool(NO_SANDBOX), reason=f"no sandbox here: {NO_SANDBOX}")
def test_grade_end_to_end_writes_checked_files_once(course, tmp_path):
    src, sub = course
    out = tmp_path / "out" / "grades.csv"
    key = tmp_path / "config" / "grading.key"  # outside the results folder; made by the first run
    run = subprocess.run([sys.executable, str(SCRIPT), "--source", str(src), "grade", str(sub), "--csv", str(out),
                          "--cell-timeout", "20", "--jobs", "2", "--key", str(key)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    rows = {r["student"]: r for r in csv.DictReader(out.open())}
    assert float(rows["ada"]["total"]) == 7 and float(rows["bob"]["total"]) == 0
    assert "sha256" in run.stdout and "ada" in run.stdout
    details = list(csv.DictReader(out.with_name("grades-details.csv").open()))
    assert {(d["file"], d["question"], d["status"]) for d in details if d["student"] == "bob"} == {
        ("bob/toy.ipynb", q, "failed") for q in ("toy-q1", "toy-q2", "toy-q3")}
    assert key.is_file() and "signed with" in run.stdout
    verify = [sys.executable, str(SCRIPT), "--source", str(src), "verify", str(out), "--key", str(key),
              "--submissions", str(sub)]
    good = subprocess.run(verify, capture_output=True, text=True, timeout=60)
    assert good.returncode == 0, good.stdout + good.stderr
    out.write_text(out.read_text().replace("bob,0", "bob,7"))
    bad = subprocess.run(verify, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "changed after grading" in bad.stdout


@pytest.mark.slow  # starts processes
def test_student_and_check_commands_on_the_real_exercises(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "check"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "no problems" in run.stdout, run.stdout + run.stderr
    out = tmp_path / "handout"
    run = subprocess.run([sys.executable, str(SCRIPT), "student", str(out), "--colab",
                          "github/org/repo/blob/main/handout"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    stems = sorted(handout.exercise_notebooks(ROOT / "exercises"))
    assert sorted(p.stem for p in out.glob("*.ipynb")) == stems
    for path in out.glob("*.ipynb"):
        text = path.read_text()
        assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text and "@grader" not in text, path.name
        nb = nbformat.read(path, as_version=4)
        assert handout.answer_leaks(nb) == [] and "What this exercise showed" not in text, path.name
        assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), path.name
    # the one command the instructors' page on the grader gives is the one run here
    assert "python exercises/instructor.py student handout/\n```" in (ROOT / "exercises" / "grading.md").read_text()
    assert "colab.research.google.com/github/org/repo/blob/main/handout/" in (out / "index.md").read_text()
    # after the deadline: the solutions and each exercise's summary, without the hidden tests or outputs
    sol = tmp_path / "solutions"
    run = subprocess.run([sys.executable, str(SCRIPT), "solutions", str(sol)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert sorted(p.stem for p in sol.glob("*.ipynb")) == stems
    for path in sol.glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        text = path.read_text()
        assert "BEGIN SOLUTION" in text and "What this exercise showed" in text, path.name
        assert "HIDDEN TESTS" not in text and "@grader" not in text, path.name
        assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), path.name


def _written(tmp_path):
    from lessonlib.grading.results import NotebookResult, QuestionResult

    sub = tmp_path / "sub"
    p = submit(sub, "ada/toy.ipynb", honest())
    r = NotebookResult("ada", "toy", "ada/toy.ipynb", sha256=__import__("hashlib").sha256(p.read_bytes()).hexdigest())
    r.questions = [QuestionResult("toy-q1", 2.0, 2.0, "passed")]
    key = tmp_path / "config" / "grading.key"
    cli_manifest.write_results([r], tmp_path / "out" / "grades.csv", key_path=key)
    return sub, tmp_path / "out" / "grades.csv", key


def test_verify_says_what_it_checked_and_fails_on_a_rehashed_edit(tmp_path, capsys):
    import hashlib
    import json

    sub, out, key = _written(tmp_path)
    argv = ["verify", str(out), "--key", str(key), "--submissions", str(sub)]
    assert cli.main(argv) == 0
    assert "match the manifest signed with" in capsys.readouterr().out
    out.write_text(out.read_text().replace("ada,2", "ada,9"))
    m = json.loads(cli_manifest.manifest_path(out).read_text())
    m["files"]["grades.csv"] = hashlib.sha256(out.read_bytes()).hexdigest()  # rehashed without the key
    cli_manifest.manifest_path(out).write_text(json.dumps(m))
    assert cli.main(argv) == 1
    assert "signature does not match" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["verify", str(out), "--submissions", str(tmp_path / "nowhere")])
    assert "--submissions" in capsys.readouterr().err


def test_grade_refuses_a_key_in_the_results_folder(course, tmp_path, capsys):
    src, sub = course
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--source", str(src), "grade", str(sub), "--csv", str(tmp_path / "out" / "g.csv"),
                  "--key", str(tmp_path / "out" / "grading.key"), "--no-sandbox"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--key must not lie in the results folder" in err, err


def test_verify_help_says_what_it_guarantees(capsys):
    with pytest.raises(SystemExit):
        cli.main(["verify", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "byte for byte" in out and "whether the grades are right" in out and "--submissions" in out
