"""Valid checkpoints in the wrong place.

No damage to the bytes shows these: a renamed file, a new run started in an
old run's folder, a resume with another seed, two writers in one folder, a
loss log cut mid-line, and file errors (a folder where a file belongs, a file
where a folder belongs, a full disk). Each test here failed before the fix.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from lessonlib.measure import checkpoint, recovery, run_folder
from lessonlib.measure.run_folder import (CheckpointPathError, CheckpointWriteError, FolderInUseError,
                                          RunIdentity, RunMismatchError)

STEPS, EVERY = 60, 5


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    ref = tmp_path_factory.mktemp("reference") / "run"
    recovery.train(ref, steps=STEPS, save_every=EVERY, out=io.StringIO())
    return recovery.read_losses(ref)


def _train(run, **kwargs):
    out = io.StringIO()
    recovery.train(run, **{"steps": STEPS, "save_every": EVERY, "out": out, **kwargs})
    return out.getvalue().splitlines()


def _hex(losses):
    return [v.hex() for v in losses.values()]


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # reaped: the pid names no process now
    return p.pid


# --- 1. a misnamed file -------------------------------------------------------------

def test_a_misnamed_checkpoint_never_shadows_the_run(tmp_path, reference):
    run = tmp_path / "run"
    _train(run, stop_after=30)
    os.rename(run / "checkpoint-00000025.pt", run / "checkpoint-00000099.pt")
    lines = _train(run, steps=40, resume=True)
    assert any(l.startswith("skipped checkpoint-00000099.pt: holds step 25 of run") and "name says step 99" in l
               for l in lines), lines
    assert "resumed after step 30 from checkpoint-00000030.pt" in lines
    assert any(l.startswith("set aside checkpoint-00000099.pt:") for l in lines), lines  # at the first save
    assert (run / "checkpoint-00000099.pt.set-aside").is_file()  # kept for a person to look at, not deleted
    lines = _train(run, resume=True)  # a later resume: the renamed file is out of the way
    assert "resumed after step 40 from checkpoint-00000040.pt" in lines
    assert not any("00000099" in l for l in lines)
    assert [s for s, _ in recovery.checkpoint_files(run)] == [50, 55, 60]  # keep-3 retention counts it no more
    assert _hex(recovery.read_losses(run)) == _hex(reference)


# --- 2. a new run in an old folder; retention and the file just written ------------------------

def test_a_new_run_refuses_an_old_runs_folder_unless_told_to_replace_it(tmp_path):
    run = tmp_path / "run"
    _train(run, steps=40, stop_after=40)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(RunMismatchError, match=r"already holds another run's files \(run \w+ \(seed 0\), "
                                               r"checkpoints of steps 30 to 40, a loss log\).*replace=True"):
        _train(run, steps=20, seed=1)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # nothing was touched
    lines = _train(run, steps=20, seed=1, replace=True)
    assert lines[0].startswith("replaced run ")
    assert [s for s, _ in recovery.checkpoint_files(run)] == [10, 15, 20]  # its own saves, kept
    assert list(recovery.read_losses(run)) == list(range(1, 21))  # one run's log, not two interleaved
    assert recovery.read_run(run).seed == 1
    assert "resumed after step 20 from checkpoint-00000020.pt" in _train(run, steps=30, seed=1, resume=True)


def test_save_checkpoint_keeps_the_file_it_just_wrote(tmp_path):
    said = []
    checkpoint.save_checkpoint({"w": torch.ones(2)}, tmp_path, 5, keep=1)
    path = checkpoint.save_checkpoint({"w": torch.zeros(2)}, tmp_path, 3, keep=1, report=said.append)
    assert path.exists() and recovery.checkpoint_files(tmp_path) == [(3, path)]
    assert torch.equal(checkpoint.load_checkpoint(tmp_path)["w"], torch.zeros(2))
    assert said == ["set aside checkpoint-00000005.pt: step 5 is later than the step just saved (3): "
                    "the run went back to an earlier checkpoint"]
    assert (tmp_path / "checkpoint-00000005.pt.set-aside").is_file()
    run_folder.release_folder(tmp_path)


def test_save_checkpoint_refuses_another_runs_folder(tmp_path):
    a, b = RunIdentity.new(0, {"lr": 1}), RunIdentity.new(0, {"lr": 1})
    checkpoint.save_checkpoint({"x": 1}, tmp_path, 1, run=a)
    with pytest.raises(RunMismatchError, match=f"holds run {a.run_id} \\(seed 0\\).*not run {b.run_id}"):
        checkpoint.save_checkpoint({"x": 2}, tmp_path, 2, run=b)
    checkpoint.save_checkpoint({"x": 2}, tmp_path, 2, run=b, replace=True)
    assert recovery.checkpoint_files(tmp_path)[0][0] == 2 and checkpoint.read_run(tmp_path) == b
    run_folder.release_folder(tmp_path)


# --- 3. whose checkpoint ------------------------------------------------------------

def test_a_resume_with_another_seed_is_refused(tmp_path):
    run = tmp_path / "run"
    _train(run, stop_after=10)
    with pytest.raises(RunMismatchError, match=r"holds run \w+ \(seed 0\).*seed=1, but the run's seed is 0"):
        _train(run, seed=1, resume=True)
    stranger = RunIdentity.new(0, recovery.JOB_CONFIG)  # same seed and settings, another run
    with pytest.raises(RunMismatchError, match="not run " + stranger.run_id):
        checkpoint.load_latest(run, run=stranger)
    with pytest.raises(RunMismatchError, match=r"holds step 10 of run \w+ \(seed 0\) \('.*checkpoint-00000010.pt'\), "
                                               r"not a checkpoint of this run " + stranger.run_id):
        checkpoint.load_checkpoint(run / "checkpoint-00000010.pt", run=stranger)


# --- 4. one writer a folder ------------------------------------------------------------

@pytest.mark.slow  # starts processes
def test_a_second_writer_is_refused_and_a_dead_ones_lock_taken_over(tmp_path):
    run = tmp_path / "run"
    with recovery.TrainingProcess(run, steps=100, save_every=5, step_seconds=0.2) as job:
        assert job.wait_for("step 2")
        holder = run_folder.folder_holder(run)
        assert holder["pid"] == job.proc.pid
        with pytest.raises(FolderInUseError, match=f"being written by another process: pid {job.proc.pid} on host"):
            _train(run, resume=True)
        with pytest.raises(FolderInUseError, match=f"pid {job.proc.pid}"):
            checkpoint.save_checkpoint({"x": 1}, run, 7)
        with pytest.raises(RuntimeError, match=f"cannot resume: run_dir .* is being written by another process: "
                                               f"pid {job.proc.pid}"):
            recovery.run_training(run, resume=True, steps=100)  # a second job, in its own process
        job.kill()  # SIGKILL: the lock file stays, the lock itself goes with the process
    assert (run / "writer.lock").exists() and run_folder.folder_holder(run) is None
    lines = _train(run, steps=100, resume=True)
    assert any(l.startswith(f"took over writer.lock from pid {job.proc.pid} ") for l in lines), lines[:3]
    assert not (run / "writer.lock").exists()  # released when the job returned


@pytest.mark.slow  # starts processes
def test_two_save_loops_in_one_folder(tmp_path):
    """The issue's case: two processes each saving 12 times into one folder (22 of 24 saves had
    failed with a raw FileNotFoundError). Now the first is the folder's writer and the second is
    refused at once, naming it."""
    run, gate = tmp_path / "run", tmp_path / "gate"
    gate.mkdir()
    script = textwrap.dedent(f"""
        import os, pathlib, time
        from lessonlib.measure import checkpoint
        gate = pathlib.Path({str(gate)!r})
        (gate / str(os.getpid())).touch()
        deadline = time.monotonic() + 60
        while len(list(gate.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # both loops start together, however long each took to import torch
        done = 0
        try:
            for step in range(1, 13):
                checkpoint.save_checkpoint({{"w": list(range(20000))}}, {str(run)!r}, step, keep=2)
                done += 1
                time.sleep(0.1)
        except checkpoint.FolderInUseError as err:
            print("refused:", err)
        except Exception as err:
            print("raw:", type(err).__name__, err)
        print("saved", done)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert not any("raw:" in o for o in outs), outs
    saved = sorted(int(o.split("saved ")[-1]) for o in outs)
    assert saved == [0, 12], outs
    winner = procs[[int(o.split("saved ")[-1]) for o in outs].index(12)].pid
    loser = next(o for o in outs if "refused:" in o)
    assert f"pid {winner} on host" in loser and "writer.lock" in loser
    assert [s for s, _ in recovery.checkpoint_files(run)] == [11, 12]
    assert not list(run.glob("*.tmp"))


def test_cleanup_never_deletes_a_live_writers_temporary(tmp_path):
    alive = os.getppid()  # a live process that is not this one
    live = tmp_path / f"checkpoint-00000005.pt.w{alive}-{run_folder._HOST_TAG}.abcd1234.tmp"
    dead = tmp_path / f"checkpoint-00000005.pt.w{_dead_pid()}-{run_folder._HOST_TAG}.abcd1234.tmp"
    for p in (live, dead):
        p.write_bytes(b"half a file")
    assert checkpoint.remove_stray_temporaries(tmp_path) == [dead.name]
    assert live.exists()

    # This process's own save in progress: a cleanup in the middle of it leaves it alone.
    seen = []

    def midway(done, total):
        seen.append(checkpoint.remove_stray_temporaries(tmp_path))

    checkpoint.atomic_save({"w": torch.ones(1000)}, tmp_path / "state.pt", slow_write_seconds=0.05,
                           on_progress=midway)
    assert seen and not any(seen)
    assert torch.equal(checkpoint.load_checkpoint(tmp_path / "state.pt")["w"], torch.ones(1000))


def test_a_stale_lock_is_taken_over_not_obeyed(tmp_path):
    pid = _dead_pid()
    (tmp_path / "writer.lock").write_text(json.dumps({"pid": pid, "host": "h", "started": "then", "command": "x"}))
    said = []
    me = run_folder.acquire_folder(tmp_path, report=said.append)
    assert me["pid"] == os.getpid()
    assert said == [f"took over writer.lock from pid {pid} on host 'h', since then (x): that writer is gone"]
    assert json.loads((tmp_path / "writer.lock").read_text())["pid"] == os.getpid()
    run_folder.release_folder(tmp_path)
    assert not (tmp_path / "writer.lock").exists()


def test_copy_run_leaves_the_writer_lock_behind(tmp_path):
    _train(tmp_path / "a", steps=10, stop_after=5)
    (tmp_path / "a" / "writer.lock").write_text("{}")  # as a killed job leaves it
    copy = recovery.copy_run(tmp_path / "a", tmp_path / "b")
    assert sorted(p.name for p in copy.iterdir()) == ["checkpoint-00000005.pt", "losses.txt", "run.json"]


# --- 5. the loss log ------------------------------------------------------------

def test_a_cut_last_line_of_the_loss_log_is_repaired_before_the_resume_appends(tmp_path, reference):
    run = tmp_path / "run"
    _train(run, stop_after=32)
    log = run / "losses.txt"
    data = log.read_bytes()
    log.write_bytes(data[:-12])  # step 32's line, cut mid-number (a full disk, a power cut)
    assert list(recovery.read_losses(run)) == list(range(1, 32))  # every complete step; the cut one left out
    lines = _train(run, resume=True)
    assert any(l.startswith("repaired losses.txt: removed its cut last line '32 0x") for l in lines), lines
    assert _hex(recovery.read_losses(run)) == _hex(reference)
    assert all(len(line.split()) == 2 for line in log.read_text().splitlines())


def test_read_losses_refuses_a_damaged_line(tmp_path):
    (tmp_path / "losses.txt").write_text("1 0x1.8p+0\n2 0x1.9d7d1831 0x1.85p-1\n3 0x1.0p+0\n")
    with pytest.raises(recovery.CheckpointError, match="line 2 is .* the log is damaged"):
        recovery.read_losses(tmp_path)


# --- 6. file errors name the path and what was expected ---------------------------------------

def test_a_folder_named_like_a_checkpoint(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint-00000010.pt").mkdir(parents=True)
    with pytest.raises(CheckpointPathError, match=r"checkpoint-00000010.pt'.*not files; a checkpoint file belongs"):
        _train(run, steps=20)
    assert not (run / "losses.txt").exists()  # refused before the first step
    with pytest.raises(CheckpointPathError, match=r"cannot save step 10: .*checkpoint-00000010.pt' is a folder"):
        checkpoint.save_checkpoint({"x": 1}, run, 10)
    checkpoint.save_checkpoint({"step": 5}, run, 5)
    said = []
    state, path, _ = checkpoint.load_latest(run, report=said.append)
    assert state["step"] == 5 and said[0].startswith("skipped checkpoint-00000010.pt: a folder")
    run_folder.release_folder(run)


def test_atomic_save_onto_a_folder(tmp_path):
    with pytest.raises(CheckpointPathError, match=r"path '.*' is a folder, but atomic_save writes a file there"):
        checkpoint.atomic_save({"x": 1}, tmp_path)


def test_a_file_where_the_run_folder_belongs(tmp_path):
    f = tmp_path / "not-a-folder"
    f.write_text("x")
    message = r"run_dir '.*not-a-folder' is a file, but a run folder \(holding checkpoints\) was expected"
    for call in (lambda: checkpoint.save_checkpoint({"x": 1}, f, 1), lambda: _train(f, steps=2),
                 lambda: checkpoint.load_latest(f), lambda: checkpoint.checkpoint_files(f)):
        with pytest.raises(CheckpointPathError, match=message):
            call()


def test_a_header_without_parts(tmp_path):
    header = json.dumps({"files": []}).encode()
    (tmp_path / "c.pt").write_bytes(checkpoint.MAGIC + b" " + hashlib.sha256(header).hexdigest().encode()
                                    + b"\n" + header + b"\n")
    with pytest.raises(recovery.CheckpointError, match=r"c.pt: the header has no valid 'parts' list"):
        checkpoint.load_checkpoint(tmp_path / "c.pt")


def test_a_full_disk_names_the_checkpoint_and_keeps_the_previous_one(tmp_path, monkeypatch):
    checkpoint.save_checkpoint({"w": torch.ones(3)}, tmp_path, 5)
    real = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: Full(real(fd, *a, **k)))
    with pytest.raises(CheckpointWriteError, match=r"could not write the checkpoint of step 10 '.*checkpoint-00000010"
                                                   r".pt' \(.* bytes\): No space left on device") as info:
        checkpoint.save_checkpoint({"w": torch.zeros(3)}, tmp_path, 10)
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC and isinstance(info.value, OSError)
    assert not list(tmp_path.glob("*.tmp"))
    assert checkpoint.load_checkpoint(tmp_path)["w"].tolist() == [1.0, 1.0, 1.0]
    run_folder.release_folder(tmp_path)
