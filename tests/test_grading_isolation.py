"""What a hostile class still got, closed: bounded waits, a tighter sandbox, safe reads.

* a hand-in over ZeroMQ's message cap no longer hangs the run: the student's
  row says the kernel stopped answering, the class is graded, and the run's
  scratch folder is gone; so it is after SIGTERM, and after SIGKILL at the next run;
* the sandbox's pid 1 holds none of the grader's environment or paths, its
  user is not root on the host, shared memory and ``/tmp`` count against the
  memory cap, and the sockets' folder is neither at its host path nor writable;
* what a student left is read without following links, and the reference
  process refuses checkpoints whose tensors claim more than their storage;
* a 2 MB cell costs no quadratic diff; an nbformat 3 notebook is graded.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import nbformat
import pytest

from grading_toy import honest, make_course, scores, submit
from procs import processes_with
from lessonlib.grading import autograde, limits, reference, runs, sandbox, submission

FULL = {"toy-q1": 2, "toy-q2": 3, "toy-q3": 2}
WHY = sandbox.probe()
needs_sandbox = pytest.mark.skipif(bool(WHY), reason=f"no sandbox here: {WHY}")
ROOT = Path(__file__).resolve().parents[1]


# ----- the sandbox, without a kernel ----------------------------------------------

@pytest.fixture
def box(tmp_path):
    (tmp_path / "runtime").mkdir()
    (tmp_path / "scratch").mkdir()
    sandbox.plain_lessonlib(tmp_path / "runtime")
    sandbox.prepare(tmp_path / "scratch")
    return sandbox.Sandbox(runtime=tmp_path / "runtime", memory_bytes=512 * 1024 ** 2, cpu_seconds=60)


def run_inside(box, tmp_path, code, timeout=90, **kwargs):
    cmd = box.command([sys.executable, "-c", textwrap.dedent(code)], tmp_path / "scratch", **kwargs)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@needs_sandbox
def test_pid_1_shows_neither_the_graders_environment_nor_its_paths(box, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADER_SECRET_TOKEN", "s3cr3t-value-1234")
    run = run_inside(box, tmp_path, """
        import json
        out = {}
        for name in ("environ", "cmdline"):
            try:
                out[name] = open(f"/proc/1/{name}", "rb").read().decode(errors="replace")
            except OSError as exc:  # not even readable: a process of another user
                out[name] = ""
        import os
        out["own"] = dict(os.environ)
        print(json.dumps(out))
    """)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    for where in ("environ", "cmdline"):
        assert "s3cr3t" not in seen[where] and "GRADER_SECRET" not in seen[where], seen[where][:300]
        assert str(tmp_path) not in seen[where], f"a host path in /proc/1/{where}: {seen[where][:300]}"
    assert "GRADER_SECRET_TOKEN" not in seen["own"]


@pytest.mark.slow
@needs_sandbox
@pytest.mark.skipif(os.geteuid() != 0, reason="only a root grader has root-only files to hide")
def test_root_only_files_are_closed_to_the_sandbox(box, tmp_path):
    secret = tmp_path / "runtime" / "root-only.txt"  # bound read-only, like every system folder
    secret.write_text("only root reads this")
    os.chmod(secret, 0o600)
    run = run_inside(box, tmp_path, """
        import os
        try:
            print("read:", open("/opt/lessonlib/root-only.txt").read())
        except OSError as exc:
            print("refused:", type(exc).__name__)
        print("uid:", os.getuid(), os.getgid(), os.getgroups())
        print("caps:", [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")])
    """)
    assert run.returncode == 0, run.stderr
    assert "refused: PermissionError" in run.stdout and "only root" not in run.stdout, run.stdout
    assert f"uid: {sandbox.SANDBOX_UID} {sandbox.SANDBOX_UID} []" in run.stdout
    assert "caps: ['0000000000000000']" in run.stdout


HOG = """
import mmap, os, sys
step = 16 * 1024 ** 2
reached = 0
try:
    if sys.argv[1] == "shared":
        m = mmap.mmap(-1, 1536 * 1024 ** 2, flags=mmap.MAP_SHARED)  # not in RLIMIT_DATA
        for off in range(0, len(m), step):
            m[off:off + step] = b"x" * step
            reached += step
            print(reached, flush=True)
    else:
        with open("/tmp/fill", "wb") as f:  # tmpfs pages: in no process's memory at all
            while reached < 1536 * 1024 ** 2:
                f.write(b"x" * step)
                f.flush()
                reached += step
                print(reached, flush=True)
except OSError as exc:
    print("stopped:", type(exc).__name__, flush=True)
"""


@pytest.mark.slow
@needs_sandbox
@pytest.mark.parametrize("how", ["shared", "tmp"])
def test_shared_memory_and_tmp_count_against_the_memory_cap(box, tmp_path, how):
    cap = box.memory_bytes  # 512 MiB: a third of what the hog asks for
    groups = box.new_cgroups()
    try:
        cmd = box.command([sys.executable, "-c", HOG, how], tmp_path / "scratch", cgroups=groups)
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        limits.remove_cgroups(groups)
    reached = max([int(x) for x in run.stdout.split() if x.isdigit()] or [0])
    assert reached >= 64 * 1024 ** 2, ("the hog never got going", run.stdout[-200:], run.stderr[-300:])
    # stopped (killed by the cgroup, or /tmp full) before the 1.5 GiB it asked for, and below the cap:
    # whatever the interpreter itself holds counts too, so it stops short of the cap, never past it
    assert reached < cap, (how, reached / 2 ** 20, run.returncode, run.stdout[-200:], run.stderr[-300:])
    assert run.returncode != 0 or "stopped:" in run.stdout, run.stdout[-200:]
    if not groups:  # no cgroup here: /tmp is size-capped, but shared memory is not
        pytest.skip("no writable cgroup on this machine: only /tmp's size cap was checked")


@pytest.mark.slow
@needs_sandbox
def test_tmp_and_dev_shm_are_writable_by_the_sandbox_user(box, tmp_path):
    run = run_inside(box, tmp_path, """
        import multiprocessing, os
        multiprocessing.Lock()  # a POSIX semaphore in /dev/shm: what torch.multiprocessing needs
        open("/tmp/x", "w").write("ok")
        print("uid", os.getuid(), "ok")
    """)
    assert run.returncode == 0 and f"uid {sandbox.SANDBOX_UID} ok" in run.stdout, run.stderr[-500:]


@pytest.mark.slow
@needs_sandbox
def test_the_sockets_folder_is_not_at_its_host_path_and_not_writable(box, tmp_path):
    conn = tmp_path / "conn"
    conn.mkdir()
    sandbox.prepare(tmp_path / "scratch", conn)
    (conn / "kernel-inside.json").write_text("{}")
    sandbox.seal(conn)  # what the runner does once the kernel's sockets exist
    try:
        run = run_inside(box, tmp_path, f"""
            import os
            print("host path seen:", os.path.exists({str(conn)!r}))
            print("listed:", sorted(os.listdir("{sandbox.CONN_MOUNT}")))
            for target in ("{sandbox.CONN_MOUNT}/evil", "{sandbox.CONN_MOUNT}/kernel-inside.json"):
                try:
                    open(target, "w").write("x")
                    print("wrote", target)
                except OSError as exc:
                    print("refused", type(exc).__name__)
            try:
                os.chmod("{sandbox.CONN_MOUNT}", 0o777)
                print("chmod ok")
            except OSError:
                print("chmod refused")
        """, shared=conn)
    finally:
        sandbox.unseal(conn)
    assert run.returncode == 0, run.stderr
    assert "host path seen: False" in run.stdout and "listed: ['kernel-inside.json']" in run.stdout, run.stdout
    assert "wrote" not in run.stdout, run.stdout
    if os.geteuid() == 0:  # a grader that is not root shares its user with the sandbox (see sandbox.seal)
        assert "chmod refused" in run.stdout
    assert not (conn / "evil").exists()


# ----- what a student left: links are not followed ----------------------------------

def _scratch_with(tmp_path, layout: str) -> tuple[Path, Path]:
    host = tmp_path / "host"  # a grader's folder the student names by its host path
    host.mkdir()
    (host / "ckpt.pt").write_text("HOST SECRET")
    scratch = tmp_path / "scratch"
    (scratch / "handin").mkdir(parents=True)
    if layout == "handin is a link":
        (scratch / "handin").rmdir()
        (scratch / "handin").symlink_to(host, target_is_directory=True)
    elif layout == "question folder is a link":
        (scratch / "handin" / "q1").symlink_to(host, target_is_directory=True)
    elif layout == "file is a link":
        (scratch / "handin" / "q1").mkdir()
        (scratch / "handin" / "q1" / "ckpt.pt").symlink_to(host / "ckpt.pt")
    elif layout == "fifo":
        (scratch / "handin" / "q1").mkdir()
        os.mkfifo(scratch / "handin" / "q1" / "ckpt.pt")
    return scratch, host


@pytest.mark.parametrize("layout", ["handin is a link", "question folder is a link", "file is a link", "fifo"])
def test_a_link_in_the_hand_in_folder_never_reaches_a_host_file(tmp_path, layout):
    scratch, _ = _scratch_with(tmp_path, layout)
    dest = tmp_path / "trusted" / "q1"
    folder, why = submission.copy_handin(scratch, ["handin", "q1"], dest)
    copied = {p.name: p.read_text() for p in dest.iterdir()} if dest.exists() else {}
    assert "HOST SECRET" not in copied.values(), copied
    if layout.endswith("is a link") and layout != "file is a link":
        assert folder is None and "not a folder" in why, (folder, why)
    else:  # the folder is real: the odd entry is named for the check, not copied
        assert folder == dest and copied == {".not-a-file": "ckpt.pt"}, copied


def test_copy_handin_copies_regular_files_and_caps_their_size(tmp_path):
    q = tmp_path / "scratch" / "handin" / "q1"
    q.mkdir(parents=True)
    (q / "ckpt.pt").write_bytes(b"x" * 1000)
    folder, why = submission.copy_handin(tmp_path / "scratch", ["handin", "q1"], tmp_path / "t1")
    assert why == "" and (folder / "ckpt.pt").read_bytes() == b"x" * 1000
    folder, why = submission.copy_handin(tmp_path / "scratch", ["handin", "q1"], tmp_path / "t2", max_bytes=999)
    assert folder is None and "too large" in why
    assert submission.copy_handin(tmp_path / "scratch", ["handin", "q2"], tmp_path / "t3") == (None, "")
    with pytest.raises(ValueError, match="parts"):
        submission.copy_handin(tmp_path / "scratch", ["..", "q1"], tmp_path / "t4")


# ----- the reference process: checkpoints that claim more than they hold -------------------

def test_tensors_larger_than_their_storage_are_refused():
    torch = pytest.importorskip("torch")
    reference.check_tensors({"model": {"w": torch.ones(4, 4)}, "step": 7})  # an honest state: fine
    with pytest.raises(AssertionError, match="storage of 4 bytes"):
        reference.check_tensors({"model": {"w": torch.zeros(1).expand(2 ** 20, 1)}})
    with pytest.raises(AssertionError, match="MiB: refused"):  # a size cap, whatever the strides
        reference.check_tensors([torch.zeros(1, dtype=torch.uint8).expand(reference.MAX_TENSOR_BYTES + 1)])


REFERENCE_NB = '''
import torch
_w = torch.ones(4096)

@grader("ck-q1")
def _(got):
    loaded = torch.load(got.folder / "ckpt.pt", weights_only=True)
    assert torch.allclose(loaded["w"], _w), "the saved weights are not the model's"
'''


@pytest.mark.slow
def test_the_reference_process_refuses_a_stride_0_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    from nbformat.v4 import new_code_cell, new_notebook

    from lessonlib.grading import handout

    check = new_code_cell("# Check ck-q1 (1 point)\nfrom lessonlib.grading import hand_in\n"
                          f"{handout.BEGIN_HIDDEN}\n{REFERENCE_NB}\n### END HIDDEN TESTS",
                          metadata={"nbgrader": {"grade": True, "solution": False, "locked": True,
                                                 "grade_id": "ck-q1", "points": 1, "schema_version": 3}})
    nb_path = tmp_path / "ck.ipynb"
    nbformat.write(new_notebook(cells=[check]), nb_path)
    honest_dir, bomb_dir = tmp_path / "honest", tmp_path / "bomb"
    honest_dir.mkdir()
    bomb_dir.mkdir()
    torch.save({"w": torch.ones(4096)}, honest_dir / "ckpt.pt")
    # 2**16 rows of one shared element: a 1.5 kB file; allclose against 4096 broadcasts to 1 GiB
    torch.save({"w": torch.zeros(1).expand(2 ** 16, 1)}, bomb_dir / "ckpt.pt")
    assert (bomb_dir / "ckpt.pt").stat().st_size < 4096
    ref = reference.Reference(nb_path, tmp_path / "work", check_timeout=60, memory_bytes=1536 * 1024 ** 2)
    try:
        ref.start()
        assert ref.check("ck-q1", {}, honest_dir) == ("passed", "")
        status, message = ref.check("ck-q1", {}, bomb_dir)
        assert status == "failed" and "storage of 4 bytes" in message, (status, message)
        assert ref.check("ck-q1", {}, honest_dir) == ("passed", ""), "the next student is checked as before"
    finally:
        ref.stop()


HOG_CHECK = '''
import mmap

@grader("hog-q1")
def _(got):
    n = int(got["bytes"])
    if got["how"] == "shared":  # pages no RLIMIT_DATA counts: only the cgroup stops them
        m = mmap.mmap(-1, n, flags=mmap.MAP_SHARED)
        for off in range(0, n, 4096):  # every page
            m[off] = 1
    else:
        bytearray(n)
'''


@pytest.mark.slow
def test_the_reference_process_is_memory_capped(tmp_path):
    from nbformat.v4 import new_code_cell, new_notebook

    from lessonlib.grading import handout

    check = new_code_cell(f"# Check hog-q1 (1 point)\n{handout.BEGIN_HIDDEN}\n{HOG_CHECK}\n### END HIDDEN TESTS",
                          metadata={"nbgrader": {"grade": True, "solution": False, "locked": True,
                                                 "grade_id": "hog-q1", "points": 1, "schema_version": 3}})
    nbformat.write(new_notebook(cells=[check]), tmp_path / "hog.ipynb")
    cap = 384 * 1024 ** 2
    ref = reference.Reference(tmp_path / "hog.ipynb", tmp_path / "work", check_timeout=60, memory_bytes=cap)
    try:
        assert ref.check("hog-q1", {"bytes": 2 ** 20, "how": "private"}) == ("passed", "")
        status, message = ref.check("hog-q1", {"bytes": 2 * cap, "how": "private"})
        assert status == "failed" and "more memory" in message, (status, message)
        if not limits.cgroup_parents():
            pytest.skip("no writable cgroup here: shared memory is capped by nothing but the machine")
        with pytest.raises(reference.ReferenceFailed):  # killed by the cgroup: that check fails, alone
            ref.check("hog-q1", {"bytes": 2 * cap, "how": "shared"})
        assert ref.check("hog-q1", {"bytes": 2 ** 20, "how": "private"}) == ("passed", ""), "restarted"
    finally:
        ref.stop()


# ----- time bombs and old notebooks -----------------------------------------------------

def test_a_2_mb_cell_in_place_of_a_check_is_never_diffed(monkeypatch):
    from grading_toy import student, toy_exercise

    ex = autograde.Exercise.load_notebook(toy_exercise(), "toy.ipynb")
    nb = student({"toy-a1": "speedup = 100 / base"})
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "toy-q1":
            cell.source = "# Check toy-q1 (2 points)\n" + "x = 1  # padding\n" * 120_000  # 2 MB
    compared = []
    real = submission.difflib.SequenceMatcher

    class Counting(real):
        def __init__(self, isjunk=None, a="", b="", autojunk=True):
            if isinstance(a, str):
                compared.append(len(a) * len(b))
            super().__init__(isjunk, a, b, autojunk)

    monkeypatch.setattr(submission.difflib, "SequenceMatcher", Counting)
    cells = [submission.Cell(c.cell_type, c.source, None) for c in nb.cells]
    steps = submission.plan_cells(ex.copy_cells, ex.checks, cells)
    # character-level work stays within a few times the longest check's length squared
    longest = max(len(v) for _, v in ex.checks.values())
    assert max(compared, default=0) <= (4 * longest) ** 2, (max(compared), longest)
    assert [s.grade_id for s in steps if s.grade_id] == ["toy-q1", "toy-q2", "toy-q3"]
    assert next(s for s in steps if s.grade_id == "toy-q1").restored


def test_a_notebook_of_too_many_cells_is_refused(tmp_path):
    p = tmp_path / "many.ipynb"
    cell = {"cell_type": "code", "source": "1", "metadata": {}, "outputs": [], "execution_count": None}
    p.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                             "cells": [cell] * (submission.MAX_CELLS + 1)}))
    with pytest.raises(submission.NotANotebook, match="cells"):
        submission.read_cells(p)


def _v3(nb) -> str:
    return nbformat.writes(nbformat.convert(nb, 3), version=3)


def test_an_nbformat_3_notebook_reads_as_its_version_4(tmp_path):
    nb = honest()
    (tmp_path / "v4.ipynb").write_text(nbformat.writes(nb))
    (tmp_path / "v3.ipynb").write_text(_v3(nb))
    assert "worksheets" in json.loads((tmp_path / "v3.ipynb").read_text())
    v4, notes4 = submission.read_cells(tmp_path / "v4.ipynb")
    v3, notes3 = submission.read_cells(tmp_path / "v3.ipynb")
    code = lambda cells: [c.source for c in cells if c.type == "code"]  # noqa: E731
    assert code(v3) == code(v4) and notes4 == [] and notes3 == ["an nbformat 3 notebook, converted to version 4"]
    (tmp_path / "bad.ipynb").write_text(json.dumps({"worksheets": 7, "nbformat": 3}))
    with pytest.raises(submission.NotANotebook):
        submission.read_cells(tmp_path / "bad.ipynb")


# ----- a class: a hand-in over the message cap, an old notebook, an honest student ------------

BIG_TAKE = ("import lessonlib.grading.answers as _a\n"
            "_a.take = lambda: 'x' * 5_000_000  # over ZeroMQ's message cap\n"
            "speedup = 100 / base")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course = tmp_path_factory.mktemp("isolation")
    src = make_course(course)
    sub = course / "submitted"
    submit(sub, "honest/toy.ipynb", honest())
    submit(sub, "big-take/toy.ipynb", honest(a1=BIG_TAKE))
    submit(sub, "old-format/toy.ipynb", _v3(honest()).encode())
    t0 = time.monotonic()
    results = autograde.grade_folder(sub, src, cell_timeout=4, budget=60, jobs=2, memory_bytes=1024 ** 3,
                                     progress=None)
    return {r.path: r for r in results}, time.monotonic() - t0


@pytest.mark.slow
@needs_sandbox
def test_a_hand_in_over_the_message_cap_fails_only_its_student(graded):
    by, seconds = graded
    big = by["big-take/toy.ipynb"]
    assert scores(big) == {"toy-q1": 0, "toy-q2": 0, "toy-q3": 0}, big.cells
    assert all(q.status == "error" and "does not answer" in q.message for q in big.questions), big.questions
    assert scores(by["honest/toy.ipynb"]) == FULL
    # bounded: every request waits at most TAKE_TIMEOUT, and the notebook its budget (60 s) with restarts
    assert seconds < 3 * 60, seconds
    mine = [d for d in Path(tempfile.gettempdir()).glob("lessonlib-grading-*")
            if (d / ".owner").exists() and (d / ".owner").read_text().split()[0] == str(os.getpid())]
    assert mine == [], "the run's scratch folder was left behind"


@pytest.mark.slow
@needs_sandbox
def test_an_nbformat_3_notebook_is_graded_with_a_note(graded):
    by, _ = graded
    r = by["old-format/toy.ipynb"]
    assert scores(r) == FULL, (r.problem, r.cells)
    assert "nbformat 3" in r.problem


# ----- the run's scratch folder: removed after SIGTERM, and after SIGKILL at the next run ---------

GRADER = """
import sys
from lessonlib.grading import autograde
autograde.grade_folder(sys.argv[1], sys.argv[2], cell_timeout=60, budget=120, jobs=2,
                       memory_bytes=1024 ** 3, progress=lambda line: print(line, flush=True))
"""


@pytest.mark.slow
@needs_sandbox
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_a_terminated_grader_stops_its_kernels_and_removes_its_folder(tmp_path, how):
    src = make_course(tmp_path)
    marker = f"looper-{os.getpid()}-{int(how)}"
    looper = ("import subprocess, sys, time\n"  # a child whose command line carries the marker, then a loop
              f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {marker!r}])\n"
              "while True:\n    time.sleep(1)")
    for name in ("a", "b", "c"):
        submit(tmp_path / "sub", f"{name}/toy.ipynb", honest(a1=looper))
    tmp = Path(tempfile.mkdtemp(prefix="lt-"))  # short: a Unix socket's path holds at most 107 bytes
    env = dict(os.environ, TMPDIR=str(tmp))
    # SIGINT at its default in the grader, as under a terminal: a shell's background job (nohup, `cmd &`)
    # starts with SIGINT ignored, and the grader would inherit that through exec and sleep through the signal
    grader = subprocess.Popen([sys.executable, "-c", GRADER, str(tmp_path / "sub"), str(src)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not processes_with(marker) and time.monotonic() < deadline and grader.poll() is None:
            time.sleep(0.2)  # until a kernel runs the loop
        assert grader.poll() is None, grader.communicate()
        assert processes_with(marker), "grading never started"
        time.sleep(1)
        grader.send_signal(how)
        grader.wait(timeout=90)  # not the 3 x 120 s budget of the class
    finally:
        if grader.poll() is None:
            grader.kill()
            grader.wait()
    assert grader.returncode != 0
    deadline = time.monotonic() + 10
    while (processes_with(marker) or processes_with(str(src))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(marker) == [], "a sandboxed process outlived its grader"
    assert processes_with(str(src)) == [], "the reference process outlived its grader"
    left = list(tmp.iterdir())
    tmp.rmdir() if not left else None
    assert left == [], f"left behind: {left}"


def test_a_folder_left_by_a_killed_grader_goes_with_the_next_run():
    base = Path(tempfile.mkdtemp(prefix="lk-"))  # short: see the test below
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = base / "lessonlib-grading-stale"
    (stale / "scratch").mkdir(parents=True)
    (stale / ".owner").write_text(f"{dead.pid} 12345")
    alive = base / "lessonlib-grading-alive"
    alive.mkdir()
    (alive / ".owner").write_text(f"{os.getpid()} {runs._start_time(os.getpid())}")
    other = base / "lessonlib-grading-someone-elses"  # no owner file: not this code's, kept
    other.mkdir()
    try:
        with runs.grading_folder(base) as folder:
            assert folder.exists() and not stale.exists() and alive.exists() and other.exists()
        assert not folder.exists()
    finally:
        shutil.rmtree(base)


def test_a_temporary_folder_too_deep_for_unix_sockets_is_refused_up_front(tmp_path):
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    with pytest.raises(ValueError, match="TMPDIR"):
        with runs.grading_folder(deep):
            pass
    assert list(deep.iterdir()) == []



# ----- where the sandbox runs -------------------------------------------------------

def _bwrap_or_skip() -> str:
    try:
        return sandbox.bwrap_path()
    except sandbox.SandboxError as exc:
        pytest.skip(str(exc))


def test_where_bwrap_is_installed_the_sandbox_runs():
    """The grading tests skip themselves when the sandbox cannot run; with bwrap installed (the test
    extras bring it), that would hide a broken sandbox as skips, so here it is a failure."""
    _bwrap_or_skip()
    assert WHY == "", f"bwrap is installed but the sandbox does not run: {WHY}"


@pytest.mark.slow
def test_the_sandbox_runs_a_python_environment_that_lives_under_tmp():
    """A checkout under /tmp (a CI clone, a learner's scratch copy): the sandbox mounts its own /tmp, so
    the folders above the environment must be made inside it, passable by the sandbox's user."""
    bwrap = _bwrap_or_skip()
    with tempfile.TemporaryDirectory(prefix="venv-under-tmp-", dir="/tmp") as tmp:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", f"{tmp}/venv"], check=True)
        code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                "from lessonlib.grading import sandbox; print(repr(sandbox.probe()))")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LESSONLIB_BWRAP": bwrap}
        out = subprocess.run([f"{tmp}/venv/bin/python", "-c", code], env=env, capture_output=True, text=True,
                             timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "''", f"the sandbox failed for a Python environment under /tmp: {out.stdout}"
