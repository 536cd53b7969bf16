"""Start real worker processes in one ``torch.distributed`` process group.

:func:`launch` is the one way the course starts processes: it picks the
backend (:func:`choose_backend`: gloo on CPU processes, NCCL with one GPU per
process), finds a free port, shows a progress bar, and always stops every
child it started (worker error, timeout or interrupt), reporting each worker's
traceback with the likely cause first. The functions the workers run live in
library modules, because a started process imports its function by name and
cannot see functions defined in a notebook.

Workers start from a fork server (``multiprocessing``'s ``forkserver``): a
clean process, started on first use and kept until the caller (a notebook's
kernel) exits, that has imported torch and the worker modules once, so a
worker skips those imports.
Two idle workers start in about 0.4 s here, against 2 s with ``spawn``. Like
``spawn``, it never copies the caller's state; unlike ``fork``, it is safe
after torch has started threads or CUDA.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

from ...checks import amount as _check_amount, count as _check_count, function as _check_function, \
    instance as _check_instance, text as _check_text
from ...progress import progress as _progress

#: The most processes :func:`launch` starts (each is a full Python with torch).
MAX_WORLD_SIZE = 64
#: The longest :func:`launch` waits for its workers, in seconds (a day).
MAX_TIMEOUT = 86_400.0
#: The library's modules whose functions :func:`launch` runs in its workers.
WORKER_MODULES = ("data_parallel", "splits", "fsdp", "tensor_parallel", "pipelining", "comm_timing",
                  "sharded_checkpoint")
#: What the fork server imports once, before it forks any worker: torch, and the worker modules with
#: what they import (torch.distributed's FSDP, DTensor and checkpoint code: about 1 s of CPU, which
#: every worker would otherwise spend again).
_PRELOAD = ["torch", "torch.distributed"] + [f"{__package__}.{name}" for name in WORKER_MODULES]


def choose_backend(world_size: int = 2) -> tuple[str, str]:
    """The ``(backend, device type)`` for ``world_size`` processes on this machine.

    NCCL on CUDA when there is at least one GPU per process, else gloo on
    CPU processes (one GPU cannot be shared by two NCCL ranks, and gloo is
    what PyTorch ships for CPU tensors). This is the only place the choice
    is made; set ``LESSONLIB_DIST_BACKEND=gloo`` to force gloo on a GPU box.
    """
    world_size = _check_count("world_size", world_size, minimum=1, maximum=MAX_WORLD_SIZE)
    forced = os.environ.get("LESSONLIB_DIST_BACKEND")
    import torch
    import torch.distributed as dist

    if forced == "gloo":
        return "gloo", "cpu"
    if (
        torch.cuda.is_available()
        and torch.cuda.device_count() >= world_size
        and dist.is_nccl_available()
    ):
        return "nccl", "cuda"
    return "gloo", "cpu"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Environment for the children: one thread each (two processes on two cores
# must not each start a pool of two), and glibc settings that stop the
# allocator from handing memory back to the OS between steps, which makes the
# optimizer step jitter (measured on these machines, see DESIGN.md).
_CHILD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MALLOC_MMAP_THRESHOLD_": "33554432",
    "MALLOC_TRIM_THRESHOLD_": "4294967296",
}


def _entry(rank, world_size, port, backend, device_type, out_dir, target, args, progress):
    """Runs inside each spawned process: join the group, run ``target``, save its result."""
    import torch
    import torch.distributed as dist

    from ..device import threads

    if device_type == "cuda":
        torch.cuda.set_device(rank)
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
    )
    try:
        with threads(1):  # two processes on two cores must not each start a pool of two
            result = target(rank, world_size, device, progress, *args)
        tmp = Path(out_dir) / f"rank{rank}.tmp"
        torch.save(result, tmp)
        os.replace(tmp, Path(out_dir) / f"rank{rank}.pt")  # complete or absent, never half-written
    finally:
        dist.destroy_process_group()
    # Success: the result is on disk. Leave at once rather than through the
    # interpreter's slow tear-down of torch (about a second per process here).
    os._exit(0)


def launch(target, world_size: int = 2, args: tuple = (), timeout: float = 180.0,
           progress_total: int | None = None, desc: str | None = None) -> list:
    """Run ``target(rank, world_size, device, progress, *args)`` in ``world_size`` processes.

    The processes are started from a fork server (see the module's notes), join one
    ``torch.distributed`` process group (backend from :func:`choose_backend`,
    rendezvous on a free port of 127.0.0.1) and each return a picklable
    result; the list of results, indexed by rank, is returned.

    ``progress`` is a queue the workers may ``put(1)`` on; with
    ``progress_total`` set, a bar in the calling process
    (:func:`lessonlib.progress.progress`) counts those ticks. ``timeout`` is in seconds for the whole run.

    Clean-up is guaranteed: whatever happens (a worker raises, the timeout
    passes, the caller is interrupted with ``KeyboardInterrupt`` or the
    Jupyter stop button, even while the workers are still being started),
    every child still alive is terminated, then killed, before this function
    returns or raises; a second interrupt during that clean-up is held back
    until it is done. The arguments are checked before any process starts:
    ``target`` a function importable by name, ``world_size`` from 1 to
    :data:`MAX_WORLD_SIZE`, ``timeout`` up to :data:`MAX_TIMEOUT` seconds.

    The free port is found a moment before the workers bind it; if another
    program takes it in between, the launch is retried once on a new port.
    """
    _check_function("target", target)
    if not hasattr(target, "__module__") or not hasattr(target, "__qualname__") or "<locals>" in target.__qualname__ \
            or target.__module__ == "__main__" and not _main_is_importable():
        raise ValueError(f"target {target!r} must be a function defined at the top of a library module: "
                         f"started processes import it by name and cannot see a notebook's functions")
    world_size = _check_count("world_size", world_size, minimum=1, maximum=MAX_WORLD_SIZE)
    _check_instance("args", args, tuple, "a tuple of extra arguments for target")
    timeout = _check_amount("timeout", timeout, allow_zero=False, maximum=MAX_TIMEOUT)
    if progress_total is not None:
        progress_total = _check_count("progress_total", progress_total, minimum=0)
    if desc is not None:
        _check_text("desc", desc, allow_empty=True)
    try:
        return _launch_once(target, world_size, args, timeout, progress_total, desc)
    except RuntimeError as exc:
        if "Address already in use" not in str(exc) and "EADDRINUSE" not in str(exc):
            raise
    return _launch_once(target, world_size, args, timeout, progress_total, desc)


def _start_method() -> str:
    """``forkserver`` where the platform has it (Linux, macOS), else ``spawn`` (Windows)."""
    import multiprocessing

    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _main_is_importable() -> bool:
    import sys

    return bool(getattr(sys.modules.get("__main__"), "__file__", None))


@contextlib.contextmanager
def _interrupts_held():
    """Hold back Ctrl-C / the Jupyter stop button while children are being stopped.

    A second interrupt during clean-up would leave children running; it is
    remembered and raised as ``KeyboardInterrupt`` once clean-up is done.
    Only the main thread can set signal handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got = []
    previous = signal.signal(signal.SIGINT, lambda *_: got.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if got:
        raise KeyboardInterrupt


def _launch_once(target, world_size, args, timeout, progress_total, desc) -> list:
    import multiprocessing

    import torch
    import torch.multiprocessing as mp

    backend, device_type = choose_backend(world_size)
    method = _start_method()
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)  # takes effect when the server starts, on first use
    progress = ctx.SimpleQueue()
    saved_env = {k: os.environ.get(k) for k in _CHILD_ENV}
    procs = None
    before = set(multiprocessing.active_children())  # children of ours that existed already
    with tempfile.TemporaryDirectory(prefix="lessonlib-dist-") as out_dir:
        try:
            # inherited by the children (through the fork server, which starts with the first launch)
            os.environ.update(_CHILD_ENV)
            try:
                procs = mp.start_processes(
                    _entry,
                    args=(world_size, free_port(), backend, device_type, out_dir, target, args, progress),
                    nprocs=world_size,
                    join=False,
                    start_method=method,
                )
            finally:
                for k, v in saved_env.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            ticks = _ticks(procs, progress, time.monotonic() + timeout, world_size, timeout)
            if progress_total:  # a bar live; one summary line in the static book build
                ticks = _progress(ticks, desc=desc or getattr(target, "__name__", "workers"),
                                  total=progress_total)
            try:
                for _ in ticks:
                    pass
            except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
                with _interrupts_held():
                    _stop(procs.processes)
                raise RuntimeError(_worker_errors(procs.error_files, exc)) from None
            return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=True) for r in range(world_size)]
        finally:
            with _interrupts_held():
                # procs is None when the interrupt came while the workers were being
                # started: the ones already running are found among our children.
                started = procs.processes if procs is not None else []
                strays = [p for p in multiprocessing.active_children() if p not in before and p not in started]
                _stop(list(started) + strays)
                for f in procs.error_files if procs is not None else ():  # torch leaves them in the temp folder
                    try:
                        os.unlink(f)
                    except OSError:
                        pass


def _ticks(procs, progress, deadline, world_size, timeout):
    """Yield once per tick the workers ``put`` on ``progress``, until they all finish.

    Raises what ``procs.join`` raises when a worker fails, and TimeoutError
    once ``deadline`` (a ``time.monotonic()`` value) has passed.
    """
    while not procs.join(timeout=0.2):  # raises if a worker raised
        while not progress.empty():
            yield from range(progress.get())
        if time.monotonic() > deadline:
            raise TimeoutError(f"the {world_size} worker processes did not finish within {timeout:.0f} s")
    while not progress.empty():
        yield from range(progress.get())


_LOST_PEER = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def _worker_errors(error_files, exc) -> str:
    """Every failed worker's traceback, the likely cause first.

    When one rank raises, its peers usually fail next with a lost connection
    inside a collective; those tracebacks are listed after the others.
    """
    import pickle

    found = []
    for rank, path in enumerate(error_files):
        try:
            with open(path, "rb") as fh:
                found.append((rank, pickle.load(fh)))
        except (OSError, EOFError, pickle.UnpicklingError):
            pass
    if not found:
        return f"a worker process failed: {exc}"
    found.sort(key=lambda rt: (any(m in rt[1] for m in _LOST_PEER), rt[0]))
    parts = [f"-- rank {rank} --\n{tb}" for rank, tb in found]
    return f"{len(found)} worker process(es) failed; the first listed is the likely cause.\n\n" + "\n".join(parts)


def _stop(processes, grace: float = 5.0) -> None:
    """Terminate, then kill, every process still alive; reap them all."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace
    for p in processes:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(timeout=grace)
