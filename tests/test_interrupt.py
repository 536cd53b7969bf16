"""An interrupted cell leaves no process behind.

A Jupyter stop button, like Ctrl-C, sends SIGINT to the kernel process only,
which raises ``KeyboardInterrupt`` wherever the cell is. Here a child Python
stands in for the kernel: it starts worker processes (with ``launch``, and
with ``recovery.TrainingProcess``), waits until they run, and is sent SIGINT.
Afterwards every worker it started must be gone.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")

HERE = Path(__file__).parent


def _pid_sleeper(rank, world, device, progress, folder, seconds):
    """A worker that says who it is, then waits (run by launch in a spawned process)."""
    Path(folder, f"rank{rank}.pid").write_text(str(os.getpid()))
    time.sleep(seconds)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _interrupt(code: str, folder: Path, expected_pids: int, timeout: float = 120.0) -> tuple[int, str, list[int]]:
    """Run ``code`` in a child Python, SIGINT it once its workers run; return (exit code, stderr, worker pids)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    # A kernel turns SIGINT into KeyboardInterrupt even when it was started with SIGINT ignored
    # (as a shell's background job is): so does this stand-in.
    code = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n" + textwrap.dedent(code)
    kernel = subprocess.Popen([sys.executable, "-c", code], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        while len(list(folder.glob("*.pid"))) < expected_pids:
            assert kernel.poll() is None, kernel.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.1)
        time.sleep(0.3)  # the pid file is written first thing: let the worker settle into its wait
        pids = [int(p.read_text()) for p in folder.glob("*.pid")]
        assert all(_alive(pid) for pid in pids)
        kernel.send_signal(signal.SIGINT)  # the stop button: to the kernel only, not its children
        _, err = kernel.communicate(timeout=60)
    finally:
        if kernel.poll() is None:
            kernel.kill()
            kernel.wait()
    return kernel.returncode, err, pids


def test_interrupting_launch_stops_every_worker(tmp_path):
    code = f"""
        from lessonlib.measure.distributed.launch import launch
        from test_interrupt import _pid_sleeper
        launch(_pid_sleeper, 2, args=({str(tmp_path)!r}, 300.0), timeout=600)
    """
    rc, err, pids = _interrupt(code, tmp_path, expected_pids=2)
    assert "KeyboardInterrupt" in err
    assert rc != 0
    assert len(pids) == 2
    deadline = time.monotonic() + 10  # already reaped by launch; a margin for /proc to catch up
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if _alive(p)] == []


def _pid_sleeper_or_collective(rank, world, device, progress, folder, seconds):
    """Rank 0 says who it is and waits in a collective for rank 1, which says who it is and sleeps."""
    import torch
    import torch.distributed as dist

    Path(folder, f"rank{rank}.pid").write_text(str(os.getpid()))
    if rank == 0:
        dist.all_reduce(torch.ones(2))
    else:
        time.sleep(seconds)


@pytest.mark.parametrize("target, ranks", [(_pid_sleeper, [0, 1]), (_pid_sleeper, [1]),
                                           (_pid_sleeper_or_collective, [1])])
def test_sigint_to_the_workers_alone_ends_the_call_with_keyboard_interrupt(tmp_path, target, ranks):
    """SIGINT that reaches only the workers ended the call with a FileNotFoundError about a temp
    folder (torch's worker wrapper took the interrupt for a clean exit). It must end with KeyboardInterrupt,
    also when the other rank fails after it, having lost its peer inside a collective."""
    import multiprocessing
    import threading

    from lessonlib.measure.distributed.launch import launch

    def interrupt_the_workers():
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)  # let them settle into their wait
        for rank in ranks:
            os.kill(int((tmp_path / f"rank{rank}.pid").read_text()), signal.SIGINT)

    # A shell's background job (nohup, `cmd &`) starts with SIGINT ignored, and spawned workers inherit an
    # ignored SIGINT through exec, so they would sleep through the interrupt. With a Python handler here the
    # workers start with SIGINT at its default, as they do under a terminal or a kernel.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    sender = threading.Thread(target=interrupt_the_workers)
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt, match=f"worker rank ({'|'.join(map(str, ranks))}) was interrupted"):
            launch(target, 2, args=(str(tmp_path), 300.0), timeout=600)
    finally:
        sender.join()
        signal.signal(signal.SIGINT, previous)
    assert multiprocessing.active_children() == []


def test_interrupting_a_training_process_kills_it(tmp_path):
    code = f"""
        from pathlib import Path
        from lessonlib.measure import recovery
        with recovery.TrainingProcess({str(tmp_path / "run")!r}, steps=100, step_seconds=1.0) as job:
            job.wait_for("step 1")
            Path({str(tmp_path)!r}, "job.pid").write_text(str(job.proc.pid))
            job.wait_for("step 100", timeout=600)  # interrupted here, blocked reading the child's output
    """
    rc, err, pids = _interrupt(code, tmp_path, expected_pids=1)
    assert "KeyboardInterrupt" in err
    assert rc != 0
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if _alive(p)] == []


def test_launch_checks_its_arguments_before_starting_anything():
    import multiprocessing

    from lessonlib.measure.distributed.data_parallel import run_data_parallel
    from lessonlib.measure.distributed.launch import launch
    from lessonlib.measure.distributed.splits import run_splits

    def local(rank, world, device, progress):
        return rank

    cases = [
        (lambda: launch(local, 2), "target"),
        (lambda: launch("not a function", 2), "target"),
        (lambda: launch(_pid_sleeper, 10**6), "world_size"),
        (lambda: launch(_pid_sleeper, 2, timeout=float("nan")), "timeout"),
        (lambda: launch(_pid_sleeper, 2, args=[1]), "args"),
        (lambda: run_splits(tp={"batch": 4, "d_in": "8", "d_out": 8}), "tp\\['d_in'\\]"),
        (lambda: run_splits(tp=None), "tp"),
        (lambda: run_splits(ep=({"tokens": 8, "hidden": 4, "experts_per_rank": 1, "skew": -1},)), "skew"),
        (lambda: run_data_parallel(batch_sizes=()), "batch_sizes"),
        (lambda: run_data_parallel(rounds=10**30), "rounds"),
    ]
    for call, name in cases:
        with pytest.raises((ValueError, TypeError), match=name):
            call()
    assert multiprocessing.active_children() == []
