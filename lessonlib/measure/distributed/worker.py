"""One worker process that :mod:`.launch` starts: its entry point, its tie to the caller, and how it ended.

Each worker runs :func:`run_rank`, which

- ties the worker's life to the calling process (a notebook's kernel). The
  worker's parent is the fork server, not the caller, so a parent-death
  signal cannot say that the caller is gone; instead the worker watches a
  pipe whose only writer is the caller, and at its end of file (the caller
  was killed, by SIGKILL, SIGTERM or the out-of-memory killer) it removes
  the launch's temp folder and leaves at once;
- joins the process group, runs the target, saves its result as
  ``rank<r>.pt`` in the launch's folder;
- on failure writes ``rank<r>.error.json``: the traceback, whether it was an
  interrupt (SIGINT), and when (``time.monotonic()``, a clock that every
  process on the machine shares, in seconds).

The process management is ours rather than ``torch.multiprocessing.start_processes``'s:
where that keeps its error files has changed between torch releases (2.1 has no
``error_files``), and it takes a worker's SIGINT for a clean exit.

:func:`failure_report` reads those records with the exit codes the caller saw
and orders the ranks so that the root cause comes first.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from ...checks import (choice as check_choice, count as check_count, function as check_function,
                       instance as check_instance, path as check_path, sequence as check_sequence)

#: The exit code of a worker that was interrupted (SIGINT): 128 + 2, as a shell reports it.
INTERRUPTED_EXIT = 130
#: The exit code of a worker that left because its caller was gone (nobody reads it).
ORPHANED_EXIT = 125
#: Words in a traceback that say a rank failed because a peer went away first (gloo's messages).
LOST_PEER = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


class Progress:
    """The ``progress`` a worker's target gets: ``put(n)`` adds ``n`` ticks to the caller's bar.

    A pipe rather than a ``multiprocessing`` queue: a queue's lock is a named
    semaphore (``/dev/shm/sem.mp-*``) that only the resource tracker removes
    when its owner dies, and a caller killed with its process group takes the
    tracker with it. Each tick is one write of a few bytes, which the pipe
    keeps whole when several workers write at once (POSIX, below ``PIPE_BUF``).
    """

    def __init__(self, connection):
        if not callable(getattr(connection, "send_bytes", None)):
            raise TypeError("connection must be the writing end of a multiprocessing Pipe, "
                            f"got {type(connection).__name__}")
        self._connection = connection

    def put(self, n: int = 1) -> None:
        self._connection.send_bytes(int(n).to_bytes(8, "little", signed=True))


def take_ticks(connection) -> int:
    """The ticks the workers have sent so far on ``connection``, the pipe's reading end (reads without waiting)."""
    if not (callable(getattr(connection, "poll", None)) and callable(getattr(connection, "recv_bytes", None))):
        raise TypeError("connection must be the reading end of a multiprocessing Pipe, "
                        f"got {type(connection).__name__}")
    total = 0
    while connection.poll():
        total += int.from_bytes(connection.recv_bytes(), "little", signed=True)
    return total


def result_path(out_dir, rank: int) -> Path:
    """Where rank ``rank`` saves its result in the folder ``out_dir``."""
    return check_path("out_dir", out_dir) / f"rank{check_count('rank', rank, minimum=0)}.pt"


def _record_path(out_dir, rank: int) -> Path:
    """Where rank ``rank`` writes how it failed."""
    return Path(out_dir) / f"rank{rank}.error.json"


def run_rank(rank, world_size, port, backend, device_type, out_dir, target, args, progress, owner):
    """The entry point of worker ``rank`` of ``world_size`` (the process :func:`.launch.launch` starts): join the
    group on ``port`` with ``backend`` on ``device_type``, run ``target(rank, world_size, device, progress, *args)``,
    leave its result or a record of its failure in ``out_dir``, then exit. ``owner`` is the pipe end whose closing
    says the caller is gone. Its arguments are checked before anything starts (launch checked them already)."""
    rank, world_size = check_count("rank", rank, minimum=0), check_count("world_size", world_size)
    if rank >= world_size:
        raise ValueError(f"rank must be below world_size={world_size}, got {rank}")
    check_count("port", port, maximum=65535)
    check_choice("backend", backend, ("gloo", "nccl"))
    check_choice("device_type", device_type, ("cpu", "cuda"))
    check_path("out_dir", out_dir)
    check_function("target", target)
    check_instance("args", args, tuple, "a tuple")
    check_instance("progress", progress, Progress, "a Progress")
    _die_with_parent()
    _follow_owner(owner, out_dir)
    try:
        _join_and_run(rank, world_size, port, backend, device_type, out_dir, target, args, progress)
    except KeyboardInterrupt:
        _leave(out_dir, rank, interrupted=True, code=INTERRUPTED_EXIT)
    except Exception:  # SystemExit passes: multiprocessing makes it the exit code
        _leave(out_dir, rank, interrupted=False, code=1)
    # Success: the result is on disk. Leave at once rather than through the
    # interpreter's slow tear-down of torch (about a second per process here).
    _flush()
    os._exit(0)


def _join_and_run(rank, world_size, port, backend, device_type, out_dir, target, args, progress):
    import torch
    import torch.distributed as dist

    from ..device import threads

    if device_type == "cuda":
        torch.cuda.set_device(rank)
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        try:
            with threads(1):  # two processes on two cores must not each start a pool of two
                result = target(rank, world_size, device, progress, *args)
        except BaseException as exc:
            # Record the failure before the process group goes: tearing it down closes the connections,
            # and a peer that then fails "after a peer went away" must find this rank's record already
            # written, or the launcher may stop this rank before it says what went wrong first.
            _write_record(out_dir, rank, interrupted=isinstance(exc, KeyboardInterrupt))
            raise
        tmp = result_path(out_dir, rank).with_suffix(".tmp")
        torch.save(result, tmp)
        os.replace(tmp, result_path(out_dir, rank))  # complete or absent, never half-written
    finally:
        dist.destroy_process_group()


def _write_record(out_dir, rank, interrupted: bool) -> None:
    """Write how this rank failed (the exception being handled), unless it is written already: the first
    record, made where the failure happened, keeps its time."""
    path = _record_path(out_dir, rank)
    if path.exists():
        return
    record = {"traceback": traceback.format_exc(), "interrupted": interrupted, "time": time.monotonic()}
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
    except OSError:  # the folder is gone: the caller is, too
        pass


def _leave(out_dir, rank, interrupted: bool, code: int) -> None:
    """Write how this rank failed (the exception being handled), then exit with ``code``."""
    _write_record(out_dir, rank, interrupted)
    _flush()
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the fork server) dies (``prctl(PR_SET_PDEATHSIG)``).

    Written with ctypes: torch's own helper for it is private.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _follow_owner(owner, out_dir) -> None:
    """Leave as soon as the caller is gone: a thread waits for the end of file of ``owner``.

    ``owner`` is the reading end of a pipe that only the caller writes to (it never
    does). The caller closes it only after every worker has ended, so an end of file
    while this worker runs means that the caller was killed: nobody will read a
    result or remove the launch's folder, so the worker removes it and leaves.
    ``os._exit`` works even while the main thread waits inside a collective.
    """
    def watch():
        try:
            owner.recv_bytes()
        except (EOFError, OSError):
            pass
        shutil.rmtree(out_dir, ignore_errors=True)
        os._exit(ORPHANED_EXIT)

    threading.Thread(target=watch, name="lessonlib-follow-caller", daemon=True).start()


@dataclass
class Ending:
    """How one worker ended, as the caller saw it.

    ``exitcode`` as ``multiprocessing`` gives it (negative: the signal that
    ended it); ``seen`` the ``time.monotonic()`` (s) at which the caller saw it
    end; ``stopped`` whether the caller had to stop it (SIGTERM, then SIGKILL);
    ``record`` what the worker wrote about its failure, if anything;
    ``saved`` whether it saved its result.
    """

    rank: int
    exitcode: int | None
    seen: float
    stopped: bool
    record: dict | None
    saved: bool = False


def read_record(out_dir, rank: int) -> dict | None:
    """The failure record rank ``rank`` wrote in ``out_dir``, or None (it wrote none, or one that cannot be read)."""
    check_path("out_dir", out_dir)
    check_count("rank", rank, minimum=0)
    try:
        record = json.loads(_record_path(out_dir, rank).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("traceback"), str):
        return None
    if not isinstance(record.get("time"), (int, float)) or isinstance(record.get("time"), bool):
        return None
    return record


def _exit_words(exitcode) -> str:
    if exitcode is None:
        return "did not end"
    if exitcode < 0:
        try:
            return f"was ended by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was ended by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _kind(e: Ending) -> int:
    """0 interrupted, 1 a cause (failed on its own), 2 a lost peer's echo, 3 stopped by the caller."""
    if (e.record and e.record.get("interrupted")) or e.exitcode == -signal.SIGINT:
        return 0
    if e.record:
        return 2 if any(m in e.record["traceback"] for m in LOST_PEER) else 1
    if e.stopped and e.exitcode in (-signal.SIGTERM, -signal.SIGKILL):
        return 3
    return 1


def _when(e: Ending) -> float:
    """When it failed: the time it wrote in its record, else when the caller saw it end (later)."""
    return e.record["time"] if e.record else e.seen


def failure_report(endings: list[Ending]) -> tuple[str, bool]:
    """``(message, interrupted)`` for the workers that did not succeed, the root cause first.

    The order: interrupted ranks, then ranks that failed on their own (an
    exception, an exit code or a signal without a traceback) by the time they
    failed, then ranks whose traceback says a peer went away (a consequence,
    even when it was written before the caller saw the peer's exit), then
    ranks the caller stopped. ``interrupted`` is true when a worker was
    interrupted (SIGINT): the caller then raises ``KeyboardInterrupt``.
    """
    for i, e in enumerate(check_sequence("endings", endings, allow_empty=True)):
        check_instance(f"endings[{i}]", e, Ending, "an Ending")
    failed = [e for e in endings if e.exitcode != 0 or e.record or not e.saved]
    if not failed:
        return "", False
    failed.sort(key=lambda e: (_kind(e), _when(e), e.rank))
    first = failed[0]
    interrupted = _kind(first) == 0
    parts = []
    for i, e in enumerate(failed):
        how = _exit_words(e.exitcode)
        if _kind(e) == 0:
            what = f"rank {e.rank} was interrupted (SIGINT) and {how}"
        elif _kind(e) == 3:
            what = f"rank {e.rank} was still running and was stopped ({how})"
        elif e.record:
            echo = " after a peer went away" if _kind(e) == 2 else ""
            what = f"rank {e.rank} raised an exception{echo}, then {how}"
        elif e.exitcode == 0:
            what = f"rank {e.rank} exited with code 0 before it saved a result"
        else:
            what = f"rank {e.rank} {how} without a Python traceback"
        head = f"{what} (the first to fail)" if i == 0 else what
        parts.append(f"-- {head} --" + (f"\n{e.record['traceback']}" if e.record else ""))
    summary = (f"worker rank {first.rank} was interrupted" if interrupted else
               f"{len(failed)} of {len(endings)} worker processes did not succeed; rank {first.rank} failed first")
    return summary + ".\n\n" + "\n".join(parts), interrupted
