"""How launch reports and bounds a failed launch.

- The root cause comes first: the first rank to fail on its own, with its exit
  code or signal when it left no traceback, before the ranks that failed only
  because it went away.
- A survivor that ignores SIGTERM is killed after a short grace, instead of
  delaying the error by 30 s.
- ``LESSONLIB_DIST_BACKEND`` refuses what it cannot use, naming itself.
- launch does not depend on torch's private ``ProcessContext.error_files``
  (torch 2.1 has none).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from lessonlib.measure.distributed import launch as L
from lessonlib.measure.distributed.launch import choose_backend, launch
from lessonlib.measure.distributed.worker import Ending, failure_report

LOST = "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:4242: Connection reset by peer."


def _exits_then_peer_fails(rank, world_size, device, progress):
    """Rank 1 leaves with os._exit(3), no traceback; rank 0 then fails in a collective."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    if rank == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(4))


def _fails_beside_a_survivor(rank, world_size, device, progress, folder):
    """Rank 0 ignores SIGTERM and sleeps; rank 1 fails once rank 0 is asleep, noting when."""
    import torch.distributed as dist

    if rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.barrier()
    if rank == 1:
        Path(folder, "failed_at").write_text(repr(time.monotonic()))
        raise RuntimeError("rank 1 failed on purpose")
    time.sleep(120)


def _returns_rank(rank, world_size, device, progress):
    return rank * 10


def _raises(rank, world_size, device, progress):
    raise ValueError(f"the workers' real error, from rank {rank}")


# --- the root cause first ------------------------------------------------------

@pytest.mark.slow  # starts processes: seconds
def test_a_rank_that_exits_without_a_traceback_is_named_first():
    with pytest.raises(RuntimeError) as caught:
        launch(_exits_then_peer_fails, 2, timeout=120)
    text = str(caught.value)
    assert text.startswith("2 of 2 worker processes did not succeed; rank 1 failed first"), text[:500]
    heads = [line for line in text.splitlines() if line.startswith("-- ")]
    assert heads[0] == "-- rank 1 exited with code 3 without a Python traceback (the first to fail) --"
    # rank 0 comes after its cause: it lost its peer in all_reduce, or was stopped before it noticed, or (a race
    # seen on a loaded machine) it wrote its lost-peer traceback and the stop reached it before it exited
    assert heads[1] in ("-- rank 0 raised an exception after a peer went away, then exited with code 1 --",
                        "-- rank 0 raised an exception after a peer went away, then was ended by signal SIGTERM --",
                        "-- rank 0 was still running and was stopped (was ended by signal SIGTERM) --"), heads
    assert multiprocessing.active_children() == []


def test_the_root_cause_is_ordered_first_whatever_the_caller_saw_first():
    """A race seen in the wild: rank 0's lost-peer traceback is written (t=10.0) before the caller sees
    rank 1's exit (t=10.5); rank 1 still comes first, then the echo, then the rank that was stopped."""
    endings = [
        Ending(0, 1, 10.6, False, {"traceback": LOST, "interrupted": False, "time": 10.0}),
        Ending(1, 3, 10.5, False, None),
        Ending(2, -signal.SIGTERM, 10.7, True, None),
        Ending(3, 0, 10.7, False, None, saved=True),
    ]
    text, interrupted = failure_report(endings)
    assert not interrupted
    assert text.startswith("3 of 4 worker processes did not succeed; rank 1 failed first")
    heads = [line for line in text.splitlines() if line.startswith("-- ")]
    assert heads == ["-- rank 1 exited with code 3 without a Python traceback (the first to fail) --",
                     "-- rank 0 raised an exception after a peer went away, then exited with code 1 --",
                     "-- rank 2 was still running and was stopped (was ended by signal SIGTERM) --"]


def test_among_causes_the_first_in_time_comes_first():
    crash = Ending(0, -signal.SIGSEGV, 5.0, False, None)
    error = Ending(1, 1, 5.2, False, {"traceback": "ValueError: bad shape", "interrupted": False, "time": 4.0})
    text, _ = failure_report([crash, error])
    assert "rank 1 failed first" in text and text.index("bad shape") < text.index("SIGSEGV")
    text, _ = failure_report([Ending(0, -signal.SIGSEGV, 3.0, False, None), error])
    assert "rank 0 failed first" in text and "was ended by signal SIGSEGV without a Python traceback" in text
    # an exit code 0 without a result is a failure too
    text, _ = failure_report([Ending(0, 0, 1.0, False, None, saved=False), Ending(1, 0, 1.0, False, None, True)])
    assert "rank 0 exited with code 0 before it saved a result" in text
    assert failure_report([Ending(0, 0, 1.0, False, None, saved=True)]) == ("", False)


# --- a survivor that ignores SIGTERM -----------------------------------------------

@pytest.mark.slow  # starts processes: seconds
def test_a_survivor_that_ignores_sigterm_is_killed_after_a_short_grace(tmp_path):
    with pytest.raises(RuntimeError, match="on purpose") as caught:
        launch(_fails_beside_a_survivor, 2, args=(str(tmp_path),), timeout=120)
    waited = time.monotonic() - float((tmp_path / "failed_at").read_text())
    # From rank 1's failure to the error: the caller's next look (0.2 s), SIGTERM, STOP_GRACE, SIGKILL,
    # and a margin for a loaded two-core machine. Before the fix torch waited 30 s before its SIGKILL.
    assert waited < L.STOP_GRACE + 5.0, waited
    assert "rank 0 was still running and was stopped (was ended by signal SIGKILL)" in str(caught.value)
    assert multiprocessing.active_children() == []


# --- LESSONLIB_DIST_BACKEND ---------------------------------------------------------

def _gpus(monkeypatch, n, nccl=True):
    import torch
    import torch.distributed as dist

    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: nccl)


@pytest.mark.parametrize("value", ["glo", "mpi", "cpu", "nccl2", "auto", "1"])
def test_an_unknown_backend_is_refused_with_the_variable_and_the_allowed_values(monkeypatch, value):
    _gpus(monkeypatch, 0)
    monkeypatch.setenv("LESSONLIB_DIST_BACKEND", value)
    with pytest.raises(ValueError, match=r"LESSONLIB_DIST_BACKEND='[^']*' is not a backend .*'gloo' or 'nccl'"):
        choose_backend(2)
    # and launch refuses it before it starts anything
    with pytest.raises(ValueError, match="LESSONLIB_DIST_BACKEND"):
        launch(_returns_rank, 2)
    assert multiprocessing.active_children() == []


def test_the_backend_variable_forces_what_this_machine_can_run(monkeypatch):
    _gpus(monkeypatch, 2)
    for value, expected in [("", ("nccl", "cuda")), ("gloo", ("gloo", "cpu")), (" Gloo ", ("gloo", "cpu")),
                            ("nccl", ("nccl", "cuda")), ("NCCL", ("nccl", "cuda"))]:
        monkeypatch.setenv("LESSONLIB_DIST_BACKEND", value)
        assert choose_backend(2) == expected, value
    # nccl where it cannot run: refused, with the reason
    monkeypatch.setenv("LESSONLIB_DIST_BACKEND", "nccl")
    with pytest.raises(ValueError, match=r"LESSONLIB_DIST_BACKEND='nccl' needs .* 4 processes, 2 CUDA device"):
        choose_backend(4)
    _gpus(monkeypatch, 0)
    with pytest.raises(ValueError, match="0 CUDA device"):
        choose_backend(2)


# --- no private attributes of torch's process context --------------------------------

@pytest.mark.slow  # starts processes: seconds each
def test_launch_works_with_a_torch_whose_process_context_has_no_error_files(monkeypatch):
    """torch 2.1's ProcessContext has no ``error_files``; launch raised that AttributeError in its clean-up,
    after the workers succeeded, and hid their real error when they failed."""
    from torch.multiprocessing import ProcessContext

    made = ProcessContext.__init__

    def like_torch_2_1(self, processes, error_files):
        made(self, processes, error_files)
        del self.error_files

    monkeypatch.setattr(ProcessContext, "__init__", like_torch_2_1)
    assert launch(_returns_rank, 2, timeout=120) == [0, 10]
    with pytest.raises(RuntimeError, match="the workers' real error, from rank"):
        launch(_raises, 2, timeout=120)
    assert multiprocessing.active_children() == []


def test_run_rank_checks_its_arguments_before_it_starts_anything(tmp_path):
    """The worker's entry point (made public for launch) refuses what launch would never pass, naming it,
    before it watches its parent or joins a group: nothing to clean up, no process exit."""
    from lessonlib.measure.distributed.worker import Progress, run_rank

    class Pipe:
        def send_bytes(self, b):
            pass

    good = dict(rank=0, world_size=2, port=29500, backend="gloo", device_type="cpu", out_dir=tmp_path,
                target=print, args=(), progress=Progress(Pipe()), owner=None)
    for name, bad in (("rank", 2), ("world_size", 0), ("port", 70000), ("backend", "mpi"), ("device_type", "tpu"),
                      ("out_dir", 3), ("target", "f"), ("args", [1]), ("progress", None)):
        with pytest.raises((ValueError, TypeError), match=name if name != "rank" else "rank must be below"):
            run_rank(**{**good, name: bad})
