"""Start real worker processes in one ``torch.distributed`` process group.

:func:`launch` is the one way the course starts processes: it picks the
backend (:func:`choose_backend`: gloo on CPU processes, NCCL with one GPU per
process), finds a free port, shows a progress bar, and always stops every
child it started (worker error, timeout or interrupt), reporting each worker's
traceback with the likely cause first. The functions the workers run live in
library modules, because a spawned process imports its function by name and
cannot see functions defined in a notebook.
"""
from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

from ...checks import amount as _check_amount, count as _check_count
from ...progress import static_build


def choose_backend(world_size: int = 2) -> tuple[str, str]:
    """The ``(backend, device type)`` for ``world_size`` processes on this machine.

    NCCL on CUDA when there is at least one GPU per process, else gloo on
    CPU processes (one GPU cannot be shared by two NCCL ranks, and gloo is
    what PyTorch ships for CPU tensors). This is the only place the choice
    is made; set ``LESSONLIB_DIST_BACKEND=gloo`` to force gloo on a GPU box.
    """
    world_size = _check_count("world_size", world_size, minimum=1)
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

    torch.set_num_threads(1)
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

    The processes are started with the ``spawn`` method, join one
    ``torch.distributed`` process group (backend from :func:`choose_backend`,
    rendezvous on a free port of 127.0.0.1) and each return a picklable
    result; the list of results, indexed by rank, is returned.

    ``progress`` is a queue the workers may ``put(1)`` on; with
    ``progress_total`` set, a ``tqdm`` bar in the calling process counts those
    ticks. ``timeout`` is in seconds for the whole run.

    Clean-up is guaranteed: whatever happens (a worker raises, the timeout
    passes, the caller is interrupted), every child still alive is
    terminated, then killed, before this function returns or raises.

    The free port is found a moment before the workers bind it; if another
    program takes it in between, the launch is retried once on a new port.
    """
    world_size = _check_count("world_size", world_size, minimum=1)
    timeout = _check_amount("timeout", timeout, allow_zero=False)
    try:
        return _launch_once(target, world_size, args, timeout, progress_total, desc)
    except RuntimeError as exc:
        if "Address already in use" not in str(exc) and "EADDRINUSE" not in str(exc):
            raise
    return _launch_once(target, world_size, args, timeout, progress_total, desc)


def _launch_once(target, world_size, args, timeout, progress_total, desc) -> list:
    import torch
    import torch.multiprocessing as mp

    backend, device_type = choose_backend(world_size)
    ctx = mp.get_context("spawn")
    progress = ctx.SimpleQueue()
    bar = None
    if progress_total and not static_build():  # the static book shows no bar (lessonlib.progress)
        from ...progress import bar as _bar

        bar = _bar(total=progress_total, desc=desc or getattr(target, "__name__", "workers"))
    saved_env = {k: os.environ.get(k) for k in _CHILD_ENV}
    procs = None
    with tempfile.TemporaryDirectory(prefix="lessonlib-dist-") as out_dir:
        try:
            os.environ.update(_CHILD_ENV)  # inherited by the children at spawn
            try:
                procs = mp.start_processes(
                    _entry,
                    args=(world_size, free_port(), backend, device_type, out_dir, target, args, progress),
                    nprocs=world_size,
                    join=False,
                    start_method="spawn",
                )
            finally:
                for k, v in saved_env.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            deadline = time.monotonic() + timeout
            try:
                while not procs.join(timeout=0.2):  # raises if a worker raised
                    while not progress.empty():
                        n = progress.get()
                        if bar is not None:
                            bar.update(n)
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"the {world_size} worker processes did not finish within {timeout:.0f} s")
            except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
                _stop(procs.processes)
                raise RuntimeError(_worker_errors(procs.error_files, exc)) from None
            while not progress.empty():
                n = progress.get()
                if bar is not None:
                    bar.update(n)
            return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=True) for r in range(world_size)]
        finally:
            if bar is not None:
                bar.close()
            if procs is not None:
                _stop(procs.processes)
                for f in procs.error_files:  # torch leaves them in the temp folder
                    try:
                        os.unlink(f)
                    except OSError:
                        pass


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
