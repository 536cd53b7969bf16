"""Start real worker processes in one ``torch.distributed`` process group.

:func:`launch` is the one way the course starts processes: it picks the
backend (:func:`choose_backend`: gloo on CPU processes, NCCL with one GPU per
process), finds a free port, shows a progress bar, and always stops every
child it started (worker error, timeout or interrupt), reporting how each
worker ended with the root cause first. The functions the workers run live in
library modules, because a started process imports its function by name and
cannot see functions defined in a notebook.

Workers start from a fork server (``multiprocessing``'s ``forkserver``): a
clean process, started on first use and kept until the caller (a notebook's
kernel) exits, that has imported torch and the worker modules once, so a
worker skips those imports.
Two idle workers start in about 0.4 s here, against 2 s with ``spawn``. Like
``spawn``, it never copies the caller's state; unlike ``fork``, it is safe
after torch has started threads or CUDA.

Nothing outlives the caller, even one killed alone (SIGKILL or SIGTERM to the
kernel only, or the out-of-memory killer): the workers follow the caller
(:mod:`.worker`), the fork server and ``multiprocessing``'s resource tracker
leave once the caller and the workers are gone, and the fork server then
removes the caller's temp folder (:mod:`.fork_server`).
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import tempfile
import threading
import time

from ...checks import amount as _check_amount, count as _check_count, function as _check_function, \
    instance as _check_instance, text as _check_text
from ...progress import progress as _progress
from .fork_server import OWNER_VARIABLE
from .worker import Ending, Progress, failure_report, read_record, result_path, run_rank, take_ticks

#: The most processes :func:`launch` starts (each is a full Python with torch).
MAX_WORLD_SIZE = 64
#: The longest :func:`launch` waits for its workers, in seconds (a day).
MAX_TIMEOUT = 86_400.0
#: How long a worker asked to stop (SIGTERM) may take before it is killed (SIGKILL), in seconds.
#: Python ends at SIGTERM at once unless the code ignores it; waiting longer only delays the error.
STOP_GRACE = 1.0
#: The environment variable that forces a backend, and the values it accepts (unset or empty: choose).
BACKEND_VARIABLE = "LESSONLIB_DIST_BACKEND"
BACKENDS = ("gloo", "nccl")
#: The library's modules whose functions :func:`launch` runs in its workers.
WORKER_MODULES = ("data_parallel", "scaling", "splits", "fsdp", "tensor_parallel", "pipelining", "comm_timing",
                  "sharded_checkpoint", "sequence_parallel", "ring_attention", "overlap", "layout_check")
#: What the fork server imports once, before it forks any worker: first its own clean-up
#: (:mod:`.fork_server`), then torch, and the worker modules with what they import
#: (torch.distributed's FSDP, DTensor and checkpoint code: about 1 s of CPU, which every
#: worker would otherwise spend again).
_PRELOAD = [f"{__package__}.fork_server", "torch", "torch.distributed"] + \
    [f"{__package__}.{name}" for name in WORKER_MODULES]


def choose_backend(world_size: int = 2) -> tuple[str, str]:
    """The ``(backend, device type)`` for ``world_size`` processes on this machine.

    NCCL on CUDA when there is at least one GPU per process, else gloo on
    CPU processes (one GPU cannot be shared by two NCCL ranks, and gloo is
    what PyTorch ships for CPU tensors). This is the only place the choice
    is made. ``LESSONLIB_DIST_BACKEND`` forces it: ``gloo`` (CPU processes,
    even on a GPU box) or ``nccl`` (refused, with the reason, where this
    machine lacks NCCL or one CUDA device per process); unset or empty, the
    choice above. Any other value is refused with a ``ValueError``.
    """
    world_size = _check_count("world_size", world_size, minimum=1, maximum=MAX_WORLD_SIZE)
    raw = os.environ.get(BACKEND_VARIABLE, "")
    forced = raw.strip().lower()
    if forced not in ("",) + BACKENDS:
        raise ValueError(f"{BACKEND_VARIABLE}={raw!r} is not a backend launch can use: set it to "
                         f"{' or '.join(repr(b) for b in BACKENDS)}, or unset it to let launch choose")
    import torch
    import torch.distributed as dist

    if forced == "gloo":
        return "gloo", "cpu"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = gpus >= world_size and dist.is_nccl_available()
    if forced == "nccl" and not nccl:
        raise ValueError(f"{BACKEND_VARIABLE}='nccl' needs NCCL and one CUDA device per process: "
                         f"{world_size} processes, {gpus} CUDA device(s), NCCL "
                         f"{'available' if dist.is_nccl_available() else 'not available'} in this torch; "
                         f"set it to 'gloo', or unset it to let launch choose")
    return ("nccl", "cuda") if nccl else ("gloo", "cpu")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Environment for the children: one thread each (two processes on two cores
# must not each start a pool of two), and glibc settings that stop the
# allocator from handing memory back to the OS between steps, which makes the
# optimizer step jitter (measured on these machines).
_CHILD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MALLOC_MMAP_THRESHOLD_": "33554432",
    "MALLOC_TRIM_THRESHOLD_": "4294967296",
}


def launch(target, world_size: int = 2, args: tuple = (), timeout: float = 180.0,
           progress_total: int | None = None, desc: str | None = None) -> list:
    """Run ``target(rank, world_size, device, progress, *args)`` in ``world_size`` processes.

    The processes are started from a fork server (see the module's notes), join one
    ``torch.distributed`` process group (backend from :func:`choose_backend`,
    rendezvous on a free port of 127.0.0.1) and each return a picklable
    result; the list of results, indexed by rank, is returned.

    ``progress`` is an object the workers may ``put(1)`` on (like a queue's); with
    ``progress_total`` set, a bar in the calling process
    (:func:`lessonlib.progress.progress`) counts those ticks. ``timeout`` is in seconds for the whole run.

    When a worker fails, ``RuntimeError`` names the root cause first: the
    first rank to fail on its own, with its traceback, or its exit code or
    signal when it left none; ranks that failed only because a peer went
    away, and ranks that were stopped, come after it. An interrupt ends the
    call with ``KeyboardInterrupt``, whether it reached the caller (Ctrl-C,
    the Jupyter stop button) or only the workers (SIGINT to them).

    Clean-up is guaranteed: whatever happens (a worker raises, the timeout
    passes, the caller is interrupted, even while the workers are still being
    started), every child still alive is terminated, then killed after
    :data:`STOP_GRACE` seconds, before this function returns or raises; a
    second interrupt during that clean-up is held back until it is done. If the
    caller itself is killed, its workers and helpers follow it within moments
    (see the module's notes). The arguments are checked before any process starts:
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


@contextlib.contextmanager
def _environment(values: dict):
    """Set ``values`` in ``os.environ`` for the block, then put back what was there."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _WorkerFailed(Exception):
    """A worker ended with a non-zero exit code (raised inside :func:`_ticks`)."""


def _launch_once(target, world_size, args, timeout, progress_total, desc) -> list:
    import multiprocessing
    import multiprocessing.util

    import torch
    import torch.multiprocessing as mp  # its context passes tensors through shared memory

    backend, device_type = choose_backend(world_size)
    method = _start_method()
    ctx = mp.get_context(method)
    env = dict(_CHILD_ENV)
    if method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)  # takes effect when the server starts, on first use
        env[OWNER_VARIABLE] = f"{os.getpid()}:{multiprocessing.util.get_temp_dir()}"
    ticks_in, ticks_out = ctx.Pipe(duplex=False)  # the workers' progress ticks (worker.Progress)
    # The workers watch `follow` for its end of file; `keep`, its only writing end, stays here
    # and is closed only once every worker has ended (see worker._follow_owner).
    follow, keep = ctx.Pipe(duplex=False)
    procs = []
    ended = {}  # rank -> (exit code, time.monotonic() when this process saw it end)
    before = set(multiprocessing.active_children())  # children of ours that existed already
    with tempfile.TemporaryDirectory(prefix="lessonlib-dist-") as out_dir:
        try:
            with _environment(env):  # inherited through the fork server, which starts with the first launch
                port = free_port()
                for rank in range(world_size):
                    p = ctx.Process(target=run_rank, name=f"lessonlib-rank{rank}",
                                    args=(rank, world_size, port, backend, device_type, out_dir, target, args,
                                          Progress(ticks_out), follow))
                    p.start()
                    procs.append(p)
            ticks = _ticks(procs, ended, ticks_in, time.monotonic() + timeout, world_size, timeout)
            if progress_total:  # a bar live; one summary line in the static book build
                ticks = _progress(ticks, desc=desc or getattr(target, "__name__", "workers"),
                                  total=progress_total)
            try:
                for _ in ticks:
                    pass
            except _WorkerFailed:
                with _interrupts_held():
                    stopped = _stop(procs)
                _raise_failure(procs, ended, stopped, out_dir)
            missing = [r for r in range(world_size) if not result_path(out_dir, r).exists()]
            if missing:  # e.g. a target that called sys.exit(0)
                _raise_failure(procs, ended, set(), out_dir)
            return [torch.load(result_path(out_dir, r), weights_only=True) for r in range(world_size)]
        finally:
            with _interrupts_held():
                # An interrupt while the workers were being started can leave one that
                # is not in procs yet: it is found among our children.
                strays = [p for p in multiprocessing.active_children() if p not in before and p not in procs]
                _stop(procs + strays)
                for end in (keep, follow, ticks_in, ticks_out):
                    end.close()


def _raise_failure(procs, ended, stopped, out_dir):
    """Raise what the workers' endings say: ``KeyboardInterrupt`` or ``RuntimeError``, the root cause first."""
    now = time.monotonic()
    endings = [Ending(rank, p.exitcode, ended.get(rank, (None, now))[1], p in stopped, read_record(out_dir, rank),
                      result_path(out_dir, rank).exists()) for rank, p in enumerate(procs)]
    message, interrupted = failure_report(endings)
    if interrupted:
        raise KeyboardInterrupt(message) from None
    raise RuntimeError(message) from None


def _ticks(procs, ended, ticks_in, deadline, world_size, timeout):
    """Yield once per tick the workers ``put`` on their ``progress`` (read from ``ticks_in``), until they all finish.

    Records in ``ended`` each worker's exit code and when it was seen; raises
    :class:`_WorkerFailed` when one ended with an error, and TimeoutError once
    ``deadline`` (a ``time.monotonic()`` value) has passed.
    """
    from multiprocessing.connection import wait

    waiting = {p.sentinel: rank for rank, p in enumerate(procs)}
    while waiting:
        for sentinel in wait(list(waiting), timeout=0.2):
            rank = waiting.pop(sentinel)
            procs[rank].join()
            ended[rank] = (procs[rank].exitcode, time.monotonic())
        yield from range(take_ticks(ticks_in))
        if any(code != 0 for code, _ in ended.values()):
            raise _WorkerFailed
        if waiting and time.monotonic() > deadline:
            raise TimeoutError(f"the {world_size} worker processes did not finish within {timeout:.0f} s")
    yield from range(take_ticks(ticks_in))


def _stop(processes, grace: float = STOP_GRACE) -> set:
    """Terminate every process still alive, kill those alive ``grace`` seconds later; reap them all.

    Returns the processes that had to be stopped.
    """
    stopped = set()
    for p in processes:
        if p.is_alive():
            p.terminate()
            stopped.add(p)
    deadline = time.monotonic() + grace
    for p in processes:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.is_alive():  # it ignores SIGTERM, or is stuck where Python cannot act on it
            p.kill()
            p.join(timeout=5.0)
    return stopped
