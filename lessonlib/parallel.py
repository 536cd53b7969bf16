"""Splitting training across devices: the arithmetic, and real runs with torch.distributed.

Two kinds of helper live here.

*Calculation helpers* (pure Python; no torch needed at import) give the theory:
Amdahl's law (:func:`amdahl_time`, :func:`amdahl_speedup`,
:func:`speedup_from_share`), the bytes each device sends in a collective
(:func:`ring_allreduce_bytes`, :func:`all_gather_bytes`), the pipeline bubble
(:func:`pipeline_bubble_fraction`, :func:`pipeline_schedule`) and what an
uneven expert load costs (:func:`expert_load_imbalance`).

*Measurement helpers* start real worker processes with
``torch.multiprocessing`` and join them in a ``torch.distributed`` process
group: gloo on CPU processes, NCCL when there is one GPU per process
(:func:`choose_backend` is the one place that choice is made). The functions the
workers run are defined in this module, because a spawned process imports its
function by name and cannot see functions defined in a notebook.

- :func:`run_data_parallel` -- DistributedDataParallel, one process against
  two at the same global batch, with the pieces of the step timed.
- :func:`run_tensor_parallel` -- one matrix multiplication split across
  processes, compared with the unsplit product.
- :func:`run_expert_parallel` -- tokens routed to experts on other processes
  with an all-to-all, compared with computing every expert locally.
- :func:`run_splits` -- the two above in one start of the processes.
- :func:`run_stalled_job` -- a DDP run in which one process stalls once, to
  show that every process waits (and is paid for) meanwhile.

:func:`launch` is the one way processes are started: it picks the backend,
finds a free port, shows a progress bar, and always stops every child it
started (worker error, timeout or interrupt), reporting each worker's
traceback with the likely cause first.

Units: "work units" in the Amdahl helpers are whatever unit the caller uses
(seconds, or the seed's abstract units); bytes are bytes; times measured by the
runners are seconds of wall-clock time.
"""
from __future__ import annotations

import math
import os
import socket
import tempfile
import time
from pathlib import Path

from .checks import amount as _check_amount, count as _check_count, share as _check_share

__all__ = [
    "amdahl_time",
    "amdahl_speedup",
    "speedup_from_share",
    "amdahl_report",
    "ring_allreduce_bytes",
    "all_gather_bytes",
    "pipeline_bubble_fraction",
    "pipeline_schedule",
    "schedule_idle_fraction",
    "expert_load_imbalance",
    "choose_backend",
    "free_port",
    "launch",
    "run_data_parallel",
    "data_parallel_table",
    "run_tensor_parallel",
    "run_expert_parallel",
    "run_splits",
    "run_stalled_job",
    "forecast_model",
    "synthetic_batch",
    "FEATURES",
    "TORCHRUN_SNIPPET",
]


# ---------------------------------------------------------------------------
# Amdahl's law
# ---------------------------------------------------------------------------

def amdahl_time(serial, parallel, devices, communication=0.0) -> float:
    """Time of one job on ``devices`` equal devices, in the units of the inputs.

    ``serial`` work runs in sequence whatever the device count; ``parallel``
    work divides perfectly among the devices; ``communication`` is the time
    the devices spend coordinating (synchronising, exchanging gradients) and
    is paid only when more than one device takes part::

        time = serial + parallel / devices + (communication if devices > 1 else 0)

    The seed's example: 20 serial units and 80 parallel units on 4 devices
    take 20 + 80/4 = 40 units.

    >>> amdahl_time(20, 80, 4)
    40.0

    Raises ``ValueError`` naming the argument for negative or non-finite
    amounts and for a device count that is not a whole number >= 1.
    """
    serial = _check_amount("serial", serial)
    parallel = _check_amount("parallel", parallel)
    devices = _check_count("devices", devices)
    communication = _check_amount("communication", communication)
    return serial + parallel / devices + (communication if devices > 1 else 0.0)


def amdahl_speedup(serial, parallel, devices, communication=0.0) -> float:
    """Speedup on ``devices`` devices: one-device time / ``devices``-device time.

    Dimensionless (×). Same arguments as :func:`amdahl_time`; one device pays
    no communication, so its time is ``serial + parallel``.

    >>> amdahl_speedup(20, 80, 4)
    2.5
    """
    t_many = amdahl_time(serial, parallel, devices, communication)
    t_one = amdahl_time(serial, parallel, 1)
    if t_many == 0:
        raise ValueError("serial, parallel and communication are all zero: there is no work to speed up")
    return t_one / t_many


def speedup_from_share(serial_share, devices, communication_share=0.0) -> float:
    """Amdahl speedup from fractions of the one-device time (dimensionless, ×).

    ``serial_share`` is the fraction of the one-device time that cannot be
    divided (0 to 1); ``communication_share`` is the coordination time paid
    with more than one device, as a fraction of the one-device time (>= 0; it
    can exceed 1 -- communication can cost more than the work it serves).

    >>> speedup_from_share(0.2, 4)
    2.5
    """
    serial_share = _check_share("serial_share", serial_share)
    communication_share = _check_amount("communication_share", communication_share)
    return amdahl_speedup(serial_share, 1.0 - serial_share, devices, communication_share)


def amdahl_report(devices, serial_share, communication_share=0.0) -> str:
    """The Amdahl calculator's answer as a short HTML table (for :class:`lessonlib.interactive.Explorer`).

    Times are shares of the one-device step (one device = 100 %); the
    speedup is dimensionless (×) and the efficiency is speedup / devices.
    Same checks as :func:`speedup_from_share`.
    """
    serial_share = _check_share("serial_share", serial_share)
    communication_share = _check_amount("communication_share", communication_share)
    devices = _check_count("devices", devices)
    parallel = 1.0 - serial_share
    comm = communication_share if devices > 1 else 0.0
    total = amdahl_time(serial_share, parallel, devices, communication_share)
    s = speedup_from_share(serial_share, devices, communication_share)
    ceiling = (1.0 / (serial_share + communication_share)) if serial_share + communication_share > 0 else math.inf
    ceiling_txt = "no limit (nothing serial, no communication)" if math.isinf(ceiling) else f"{ceiling:.2f}×"
    return (
        "<table>"
        f"<tr><td>serial part</td><td>{100 * serial_share:.0f} % of the one-device time</td></tr>"
        f"<tr><td>parallel part on {devices} device{'s' if devices > 1 else ''}</td>"
        f"<td>{100 * parallel:.0f} % / {devices} = {100 * parallel / devices:.1f} %</td></tr>"
        f"<tr><td>communication</td><td>{100 * comm:.0f} %</td></tr>"
        f"<tr><th>new time</th><th>{100 * total:.1f} % of the one-device time</th></tr>"
        f"<tr><th>speedup</th><th>{s:.2f}× (not {devices}×)</th></tr>"
        f"<tr><td>efficiency (speedup / devices)</td><td>{100 * s / devices:.0f} %</td></tr>"
        f"<tr><td>ceiling with unlimited devices</td><td>{ceiling_txt}</td></tr>"
        "</table>"
    )


# ---------------------------------------------------------------------------
# Communication volume of collectives
# ---------------------------------------------------------------------------

def ring_allreduce_bytes(n_bytes, devices) -> float:
    """Bytes each device sends in a ring all-reduce of an ``n_bytes`` tensor.

    A ring all-reduce is a reduce-scatter followed by an all-gather; each
    phase passes ``devices - 1`` chunks of ``n_bytes / devices`` around the
    ring, so each device sends ``2 (devices - 1) / devices × n_bytes`` bytes
    (and receives as many). One device sends nothing. The volume per device
    approaches twice the tensor as devices grow: it does not shrink.

    >>> ring_allreduce_bytes(1000, 4)
    1500.0
    """
    n_bytes = _check_amount("n_bytes", n_bytes)
    devices = _check_count("devices", devices)
    return 2.0 * (devices - 1) / devices * n_bytes


def all_gather_bytes(n_bytes, devices) -> float:
    """Bytes each device sends in a ring all-gather that builds an ``n_bytes`` tensor.

    Each device starts with ``n_bytes / devices`` and must end with all of it:
    ``(devices - 1) / devices × n_bytes`` bytes sent per device (half of a ring
    all-reduce, which is a reduce-scatter plus this all-gather).

    >>> all_gather_bytes(1000, 4)
    750.0
    """
    n_bytes = _check_amount("n_bytes", n_bytes)
    devices = _check_count("devices", devices)
    return (devices - 1) / devices * n_bytes


# ---------------------------------------------------------------------------
# Pipeline parallelism
# ---------------------------------------------------------------------------

def pipeline_bubble_fraction(stages, microbatches) -> float:
    """Fraction of a synchronous pipeline's time that each stage sits idle.

    With ``p`` stages, ``m`` micro-batches and equal work per stage, a
    GPipe-style schedule (all forwards, then all backwards, then the update)
    keeps each stage busy for ``m`` slots out of ``m + p - 1``; the idle
    "bubble" is ``(p - 1) / (m + p - 1)`` (dimensionless, 0 to 1).

    >>> pipeline_bubble_fraction(4, 8) == 3 / 11
    True
    """
    p = _check_count("stages", stages)
    m = _check_count("microbatches", microbatches)
    return (p - 1) / (m + p - 1)


def pipeline_schedule(stages, microbatches, forward_time=1.0, backward_time=2.0):
    """A GPipe schedule worked out task by task, for drawing and checking.

    Each stage runs its forward passes for micro-batches 0..m-1 in order, then
    its backward passes in the same order. A forward on stage ``s`` waits for
    that micro-batch's forward on stage ``s - 1``; a backward on stage ``s``
    waits for the same micro-batch's backward on stage ``s + 1`` (the last
    stage's backward waits for its own forward). Every task starts as soon as
    its input is ready and its stage is free.

    Returns a list of dicts ``{"stage", "microbatch", "kind" ("F" or "B"),
    "start", "end"}``, times in the units of ``forward_time`` and
    ``backward_time`` (e.g. seconds).
    """
    p = _check_count("stages", stages)
    m = _check_count("microbatches", microbatches)
    tf = _check_amount("forward_time", forward_time, allow_zero=False)
    tb = _check_amount("backward_time", backward_time, allow_zero=False)
    f_end = [[0.0] * m for _ in range(p)]
    b_end = [[0.0] * m for _ in range(p)]
    free = [0.0] * p
    tasks = []
    for s in range(p):  # forwards flow from stage 0 to the last stage
        for j in range(m):
            ready = f_end[s - 1][j] if s > 0 else 0.0
            start = max(ready, free[s])
            f_end[s][j] = free[s] = start + tf
            tasks.append({"stage": s, "microbatch": j, "kind": "F", "start": start, "end": start + tf})
    for s in reversed(range(p)):  # backwards flow from the last stage to stage 0
        for j in range(m):
            ready = b_end[s + 1][j] if s < p - 1 else f_end[s][j]
            start = max(ready, free[s])
            b_end[s][j] = free[s] = start + tb
            tasks.append({"stage": s, "microbatch": j, "kind": "B", "start": start, "end": start + tb})
    return tasks


def schedule_idle_fraction(tasks) -> float:
    """Idle share of a schedule: 1 - busy time / (stages × makespan), dimensionless."""
    if not tasks:
        raise ValueError("tasks must not be empty")
    stages = {t["stage"] for t in tasks}
    makespan = max(t["end"] for t in tasks) - min(t["start"] for t in tasks)
    busy = sum(t["end"] - t["start"] for t in tasks)
    return 1.0 - busy / (len(stages) * makespan)


# ---------------------------------------------------------------------------
# Expert parallelism
# ---------------------------------------------------------------------------

def expert_load_imbalance(tokens_per_expert) -> float:
    """Busiest expert's tokens / mean tokens per expert (dimensionless, >= 1).

    Experts run in parallel and the layer finishes when the busiest one does,
    so this ratio is how much longer the expert layer takes than it would
    with the same tokens spread evenly. 1.0 is perfect balance.

    >>> expert_load_imbalance([10, 10, 10, 10])
    1.0
    >>> expert_load_imbalance([25, 5, 5, 5])
    2.5
    """
    try:
        counts = [float(c) for c in tokens_per_expert]
    except TypeError:
        raise ValueError(f"tokens_per_expert must be a sequence of counts, got {tokens_per_expert!r}") from None
    if not counts:
        raise ValueError("tokens_per_expert must not be empty")
    for c in counts:
        _check_amount("tokens_per_expert", c)
    mean = sum(counts) / len(counts)
    if mean == 0:
        raise ValueError("tokens_per_expert sums to zero: no tokens were routed")
    return max(counts) / mean


# ---------------------------------------------------------------------------
# Launching real worker processes
# ---------------------------------------------------------------------------

TORCHRUN_SNIPPET = """\
# On a machine with several GPUs, the same worker code runs under torchrun,
# which starts one process per GPU and sets RANK, WORLD_SIZE, LOCAL_RANK,
# MASTER_ADDR and MASTER_PORT for each of them:
#
#   torchrun --standalone --nproc-per-node=4 train.py
#
# and in train.py:
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")              # reads the variables torchrun set
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = DDP(build_model().cuda(local_rank), device_ids=[local_rank])
# ... the usual loop: each process reads its own shard of the data
# (torch.utils.data.DistributedSampler), loss.backward() all-reduces the
# gradients, optimizer.step() updates every replica the same way ...
dist.destroy_process_group()
#
# Across machines: torchrun --nnodes=2 --nproc-per-node=8 \\
#     --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 train.py
"""


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
    if progress_total:
        from tqdm.auto import tqdm

        bar = tqdm(total=progress_total, desc=desc or getattr(target, "__name__", "workers"))
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


# ---------------------------------------------------------------------------
# Worker: data parallelism with DistributedDataParallel
# ---------------------------------------------------------------------------

FEATURES = 64  # inputs of the stand-in forecast model (recent sales figures)


def forecast_model(hidden: int = 512, features: int = FEATURES):
    """The retailer's forecast model (:class:`lessonlib.models.ForecastMLP`), seeded.

    ``features`` inputs (recent daily sales), two hidden layers of ``hidden``
    units, one output; built from seed 0 so every process builds the same
    weights.
    """
    import torch

    from .models import ForecastMLP

    torch.manual_seed(0)
    return ForecastMLP(window=features, hidden=hidden, depth=2)


def synthetic_batch(global_batch: int, features: int = FEATURES, seed: int = 1):
    """A seeded synthetic batch (same on every process): inputs and targets."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(global_batch, features, generator=g)
    y = x[:, :8].sum(dim=1, keepdim=True) + 0.1 * torch.randn(global_batch, 1, generator=g)
    return x, y


def _flat_grads(model):
    import torch

    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()])


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _data_parallel_worker(rank, world, device, progress, batch_sizes, rounds, warmup, hidden):
    """Time one process against ``world`` processes at the same global batch.

    Per round, interleaved so that machine noise hits every phase alike:
    1. the one-process step: rank 0 trains its own copy on the whole batch
       while the other ranks wait at a barrier (idle: gloo waits in a blocking
       receive);
    2. the data-parallel step: every rank on its share of the batch, DDP
       all-reducing the gradients inside ``backward``; the optimizer step is
       timed separately;
    3. the pieces: forward+backward on the share with no gradient exchange
       (``no_sync``) and one all-reduce of a tensor as large as the gradients.
    Times are seconds; the per-round maximum over ranks is kept (a step is
    done when the slowest rank is done).
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    loss_fn = torch.nn.MSELoss()
    model = forecast_model(hidden).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    solo = forecast_model(hidden).to(device)  # the one-process run (used on rank 0)
    solo_opt = torch.optim.Adam(solo.parameters(), lr=1e-3)
    n_params = sum(p.numel() for p in model.parameters())
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    flat = torch.zeros(n_params, device=device)

    # --- correctness first: one DDP backward on the first batch size ---------
    b0 = batch_sizes[0]
    x, y = (t.to(device) for t in synthetic_batch(b0))
    share = b0 // world
    xs, ys = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
    ddp.zero_grad(set_to_none=True)
    loss_fn(ddp(xs), ys).backward()
    g = _flat_grads(model)
    gathered = [torch.empty_like(g) for _ in range(world)]
    dist.all_gather(gathered, g)
    replicas_equal = all(torch.equal(gathered[0], other) for other in gathered[1:])
    solo.zero_grad(set_to_none=True)
    loss_fn(solo(x), y).backward()  # same weights, whole batch, one process
    full_batch_diff = (g - _flat_grads(solo)).abs().max().item()
    full_batch_scale = _flat_grads(solo).abs().max().item()

    def step_solo(x, y):
        solo_opt.zero_grad(set_to_none=True)
        loss_fn(solo(x), y).backward()
        solo_opt.step()

    results = []
    for b in batch_sizes:
        x, y = (t.to(device) for t in synthetic_batch(b))
        share = b // world
        xs, ys = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        rows = []
        for r in range(warmup + rounds):
            t = {}
            dist.barrier()
            if rank == 0:  # 1. one process, whole batch
                _sync(device); t0 = time.perf_counter()
                step_solo(x, y)
                _sync(device); t["single"] = time.perf_counter() - t0
            else:
                t["single"] = 0.0
            dist.barrier()
            # 2. data-parallel step: compute + all-reduce in backward, then update
            _sync(device); t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss_fn(ddp(xs), ys).backward()
            _sync(device); t1 = time.perf_counter()
            opt.step()
            _sync(device); t2 = time.perf_counter()
            t["ddp_backward"] = t1 - t0
            t["optimizer"] = t2 - t1
            t["ddp"] = t2 - t0
            dist.barrier()
            # 3a. compute on the share alone (no gradient exchange)
            _sync(device); t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with ddp.no_sync():
                loss_fn(ddp(xs), ys).backward()
            _sync(device); t["half_compute"] = time.perf_counter() - t0
            dist.barrier()
            # 3b. the all-reduce of the gradient bytes alone
            _sync(device); t0 = time.perf_counter()
            dist.all_reduce(flat)
            _sync(device); t["allreduce"] = time.perf_counter() - t0
            if r >= warmup:
                rows.append(t)
            if rank == 0:
                progress.put(1)
        results.append({"global_batch": b, "rounds": rows})
    # after all the training, the replicas must still hold identical weights
    w = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ws = [torch.empty_like(w) for _ in range(world)]
    dist.all_gather(ws, w)
    weights_equal = all(torch.equal(ws[0], other) for other in ws[1:])
    return {
        "rank": rank,
        "world_size": world,
        "backend": dist.get_backend(),
        "device": str(device),
        "n_params": n_params,
        "grad_bytes": grad_bytes,
        "replica_grads_equal": replicas_equal,
        "full_batch_grad_max_diff": full_batch_diff,
        "full_batch_grad_max": full_batch_scale,
        "replica_weights_equal": weights_equal,
        "sweep": results,
    }


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def run_data_parallel(batch_sizes=(32, 128, 512, 2048), rounds: int = 15, warmup: int = 3,
                      hidden: int = 512, world_size: int = 2, timeout: float = 240.0) -> dict:
    """Measure DistributedDataParallel against one process, batch size by batch size.

    Starts ``world_size`` processes (gloo on CPU, NCCL with a GPU each), each
    with one thread, and runs :func:`_data_parallel_worker`. Every global
    batch in ``batch_sizes`` must divide evenly by ``world_size``.

    Returns a dict with ``n_params``, ``grad_bytes`` (bytes of the gradients
    the all-reduce carries), ``backend``, the correctness checks
    (``replica_grads_equal``, ``replica_weights_equal``: bitwise;
    ``full_batch_grad_max_diff``: largest difference between the DDP gradient
    and one process's whole-batch gradient) and ``rows``: one dict per batch
    size with the medians over rounds, in seconds, of ``single`` (one process,
    whole batch), ``ddp`` (measured data-parallel step), ``half_compute``,
    ``optimizer``, ``allreduce``, ``predicted`` (= half_compute + optimizer +
    allreduce), and the medians of the per-round ratios ``speedup`` (= single
    / ddp) and ``predicted_over_measured``.
    """
    world_size = _check_count("world_size", world_size, minimum=2)
    rounds = _check_count("rounds", rounds)
    warmup = _check_count("warmup", warmup, minimum=0)
    hidden = _check_count("hidden", hidden)
    sizes = [_check_count("batch_sizes", b) for b in batch_sizes]
    if not sizes:
        raise ValueError("batch_sizes must not be empty")
    for b in sizes:
        if b % world_size:
            raise ValueError(f"batch_sizes: global batch {b} does not divide evenly by world_size={world_size}")
    per_rank = launch(
        _data_parallel_worker, world_size,
        args=(sizes, rounds, warmup, hidden), timeout=timeout,
        progress_total=len(sizes) * (rounds + warmup), desc="DDP rounds",
    )
    rows = []
    for i, b in enumerate(sizes):
        rounds_by_rank = [res["sweep"][i]["rounds"] for res in per_rank]
        merged = []
        for k in range(len(rounds_by_rank[0])):
            t = {key: max(rr[k][key] for rr in rounds_by_rank) for key in rounds_by_rank[0][k]}
            t["predicted"] = t["half_compute"] + t["optimizer"] + t["allreduce"]
            merged.append(t)
        row = {"global_batch": b, "per_process_batch": b // world_size}
        for key in ("single", "ddp", "half_compute", "optimizer", "allreduce", "predicted", "ddp_backward"):
            row[key] = _median([t[key] for t in merged])
        row["speedup"] = _median([t["single"] / t["ddp"] for t in merged])
        row["predicted_speedup"] = _median([t["single"] / t["predicted"] for t in merged])
        row["predicted_over_measured"] = _median([t["predicted"] / t["ddp"] for t in merged])
        rows.append(row)
    r0 = per_rank[0]
    return {
        "world_size": world_size,
        "backend": r0["backend"],
        "device": r0["device"],
        "n_params": r0["n_params"],
        "grad_bytes": r0["grad_bytes"],
        "replica_grads_equal": all(r["replica_grads_equal"] for r in per_rank),
        "replica_weights_equal": all(r["replica_weights_equal"] for r in per_rank),
        "full_batch_grad_max_diff": max(r["full_batch_grad_max_diff"] for r in per_rank),
        "full_batch_grad_max": r0["full_batch_grad_max"],
        "rounds": rounds,
        "rows": rows,
    }


def data_parallel_table(result: dict) -> str:
    """An HTML table of :func:`run_data_parallel`'s rows (times in milliseconds)."""
    cols = [("global_batch", "global batch", "{:,}"), ("single", "1 process: step", "{:.2f}"),
            ("half_compute", "2 proc.: compute on half", "{:.2f}"), ("optimizer", "optimizer step", "{:.2f}"),
            ("allreduce", "all-reduce", "{:.2f}"), ("predicted", "predicted step", "{:.2f}"),
            ("ddp", "measured step", "{:.2f}"), ("predicted_speedup", "predicted speedup", "{:.2f}×"),
            ("speedup", "measured speedup", "{:.2f}×")]
    head = "".join(f"<th>{label}</th>" for _, label, _ in cols)
    body = []
    for row in result["rows"]:
        cells = []
        for key, _, fmt in cols:
            v = row[key]
            if key in ("single", "half_compute", "optimizer", "allreduce", "predicted", "ddp"):
                v = 1e3 * v  # seconds -> ms
            cells.append(f"<td>{fmt.format(v)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return ("<table><caption>Medians over rounds; times in ms; speedup = one-process step / "
            "two-process step</caption><tr>" + head + "</tr>" + "".join(body) + "</table>")


# ---------------------------------------------------------------------------
# Workers: tensor parallelism and expert parallelism (one launch for both)
# ---------------------------------------------------------------------------

def _tensor_parallel_worker(rank, world, device, progress, batch, d_in, d_out):
    """Y = X @ W split two ways across ``world`` processes, against the unsplit product.

    Column split: each rank holds a block of W's columns, computes its block
    of Y's columns, and an all-gather assembles Y. Row split: each rank holds
    a block of X's columns and the matching block of W's rows; its product is
    a partial sum of the whole Y, and an all-reduce adds the partials.
    """
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(2)
    x = torch.randn(batch, d_in, generator=g).to(device)
    w = torch.randn(d_in, d_out, generator=g).to(device)  # every rank builds the same X, W
    reference = x @ w  # the unsplit product
    if d_out % world or d_in % world:
        raise ValueError("d_in and d_out must divide evenly by the number of processes")
    # column-parallel + all-gather
    cols = d_out // world
    y_local = x @ w[:, rank * cols:(rank + 1) * cols]
    parts = [torch.empty_like(y_local) for _ in range(world)]
    dist.all_gather(parts, y_local.contiguous())
    y_col = torch.cat(parts, dim=1)
    # row-parallel + all-reduce
    rows = d_in // world
    y_row = x[:, rank * rows:(rank + 1) * rows] @ w[rank * rows:(rank + 1) * rows, :]
    dist.all_reduce(y_row)
    progress.put(1)
    return {
        "rank": rank,
        "shape": tuple(reference.shape),
        "weight_bytes_per_rank": w.numel() * w.element_size() // world,
        "output_bytes": reference.numel() * reference.element_size(),
        "column_max_diff": (y_col - reference).abs().max().item(),
        "column_equal": torch.equal(y_col, reference),
        "column_allclose": torch.allclose(y_col, reference, rtol=1e-5, atol=1e-5),
        "row_max_diff": (y_row - reference).abs().max().item(),
        "row_allclose": torch.allclose(y_row, reference, rtol=1e-5, atol=1e-5),
        "reference_max": reference.abs().max().item(),
    }


def run_tensor_parallel(batch: int = 64, d_in: int = 256, d_out: int = 512,
                        world_size: int = 2, timeout: float = 120.0) -> list:
    """Split one matmul across ``world_size`` processes; one result dict per rank.

    Each dict has ``column_max_diff`` / ``column_allclose`` (column split,
    all-gather) and ``row_max_diff`` / ``row_allclose`` (row split,
    all-reduce): the largest absolute difference from the unsplit ``X @ W``
    and whether it is within float32 rounding (rtol = atol = 1e-5).
    """
    world_size = _check_count("world_size", world_size, minimum=2)
    for name, v in (("batch", batch), ("d_in", d_in), ("d_out", d_out)):
        _check_count(name, v)
    if d_in % world_size or d_out % world_size:
        raise ValueError(f"d_in and d_out must divide evenly by world_size={world_size}")
    return launch(_tensor_parallel_worker, world_size, args=(batch, d_in, d_out), timeout=timeout)


def _route(x, gate_w, bias):
    """Top-1 routing: the expert with the highest gate score for each token."""
    return (x @ gate_w + bias).argmax(dim=1)


def _expert_parallel_worker(rank, world, device, progress, tokens, d_model, experts_per_rank, skew):
    """Tokens on every rank routed (top-1) to experts spread over the ranks.

    Each rank owns ``experts_per_rank`` experts (small MLPs). A token whose
    expert lives on another rank travels there in an all-to-all, is processed,
    and travels back in a second all-to-all. ``skew`` is added to expert 0's
    gate score, sending it more tokens (load imbalance).
    """
    import torch
    import torch.distributed as dist

    n_experts = world * experts_per_rank
    torch.manual_seed(3)  # every rank builds the same router and experts
    gate_w = torch.randn(d_model, n_experts).to(device)
    bias = torch.zeros(n_experts, device=device)
    bias[0] = skew
    experts = [torch.nn.Sequential(torch.nn.Linear(d_model, 2 * d_model), torch.nn.ReLU(),
                                   torch.nn.Linear(2 * d_model, d_model)).to(device)
               for _ in range(n_experts)]
    g = torch.Generator().manual_seed(10 + rank)  # each rank has its own tokens
    x = torch.randn(tokens, d_model, generator=g).to(device)
    with torch.no_grad():
        expert_of = _route(x, gate_w, bias)
        reference = torch.empty_like(x)  # what one device with every expert would compute
        for e in range(n_experts):
            reference[expert_of == e] = experts[e](x[expert_of == e])

        # 1. sort tokens by the rank that owns their expert; tell the others how many come
        owner = expert_of // experts_per_rank
        order = torch.argsort(owner, stable=True)
        send_counts = torch.bincount(owner, minlength=world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        send_split, recv_split = send_counts.tolist(), recv_counts.tolist()
        # 2. all-to-all: tokens (and their expert ids) to the ranks that own the experts
        payload = torch.cat([x[order], expert_of[order].to(x.dtype).unsqueeze(1)], dim=1)
        received = torch.empty(sum(recv_split), d_model + 1, device=device)
        dist.all_to_all_single(received, payload, output_split_sizes=recv_split, input_split_sizes=send_split)
        # 3. the local experts process what arrived
        rx, rexp = received[:, :-1], received[:, -1].long()
        out = torch.empty_like(rx)
        for e in range(rank * experts_per_rank, (rank + 1) * experts_per_rank):
            out[rexp == e] = experts[e](rx[rexp == e])
        local_load = torch.bincount(rexp - rank * experts_per_rank, minlength=experts_per_rank)
        # 4. all-to-all back, then undo the sort
        back = torch.empty(tokens, d_model, device=device)
        dist.all_to_all_single(back, out, output_split_sizes=send_split, input_split_sizes=recv_split)
        y = torch.empty_like(x)
        y[order] = back
    loads = [torch.empty_like(local_load) for _ in range(world)]
    dist.all_gather(loads, local_load)
    progress.put(1)
    itemsize = x.element_size()
    return {
        "rank": rank,
        "tokens_per_expert": torch.cat(loads).tolist(),
        "sent_tokens": send_split,
        "received_tokens": recv_split,
        "bytes_sent_out": (tokens - send_split[rank]) * (d_model + 1) * itemsize,
        "max_diff": (y - reference).abs().max().item(),
        "equal": torch.equal(y, reference),
        "allclose": torch.allclose(y, reference, rtol=1e-5, atol=1e-6),
    }


def run_expert_parallel(tokens: int = 256, d_model: int = 32, experts_per_rank: int = 2,
                        skew: float = 0.0, world_size: int = 2, timeout: float = 120.0) -> list:
    """Route ``tokens`` tokens per process to experts on ``world_size`` processes.

    ``skew`` (>= 0, gate-score units) favours expert 0 to create imbalance.
    Returns one dict per rank: ``tokens_per_expert`` (all experts, in order),
    ``sent_tokens``/``received_tokens`` per rank, ``bytes_sent_out`` (bytes
    this rank sent to other ranks in the first all-to-all), and
    ``max_diff``/``allclose``: the routed result against computing every
    expert locally.
    """
    world_size = _check_count("world_size", world_size, minimum=2)
    _check_count("tokens", tokens)
    _check_count("d_model", d_model)
    _check_count("experts_per_rank", experts_per_rank)
    skew = _check_amount("skew", skew)
    return launch(_expert_parallel_worker, world_size,
                  args=(tokens, d_model, experts_per_rank, skew), timeout=timeout)


def _splits_worker(rank, world, device, progress, tp_args, ep_args_list):
    """Tensor-parallel check and expert-parallel runs in one process group."""
    tp = _tensor_parallel_worker(rank, world, device, progress, *tp_args)
    eps = [_expert_parallel_worker(rank, world, device, progress, *a) for a in ep_args_list]
    return {"tensor": tp, "expert": eps}


def run_splits(tp=dict(batch=64, d_in=256, d_out=512),
               ep=(dict(tokens=256, d_model=32, experts_per_rank=2, skew=0.0),),
               world_size: int = 2, timeout: float = 120.0) -> dict:
    """:func:`run_tensor_parallel` and several :func:`run_expert_parallel` runs in one launch.

    Starting processes costs seconds (each imports torch), so a page that
    shows both runs them together. Returns ``{"tensor": [per-rank dicts],
    "expert": [[per-rank dicts] for each ep config]}``.
    """
    world_size = _check_count("world_size", world_size, minimum=2)
    tp_args = (tp["batch"], tp["d_in"], tp["d_out"])
    if tp["d_in"] % world_size or tp["d_out"] % world_size:
        raise ValueError(f"tp: d_in and d_out must divide evenly by world_size={world_size}")
    ep_list = [(e["tokens"], e["d_model"], e["experts_per_rank"], _check_amount("skew", e["skew"])) for e in ep]
    per_rank = launch(_splits_worker, world_size, args=(tp_args, ep_list), timeout=timeout,
                      progress_total=world_size * (1 + len(ep_list)), desc="split runs")
    return {
        "tensor": [r["tensor"] for r in per_rank],
        "expert": [[r["expert"][i] for r in per_rank] for i in range(len(ep_list))],
    }


# ---------------------------------------------------------------------------
# Worker: a stalled data-parallel job (paid time against progress)
# ---------------------------------------------------------------------------

def _stall_worker(rank, world, device, progress, steps, stall_step, stall_seconds, stall_rank, hidden, batch):
    """Train with DDP for ``steps`` steps; before step ``stall_step`` rank ``stall_rank`` stalls.

    The stall (a ``time.sleep``) stands for anything that stops one process:
    a slow data read, a hung peer, a failing machine. Every rank records, per
    step, the wall-clock time at the end of the step and the CPU time its
    process used (seconds, ``time.process_time``: all its threads).
    """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = forecast_model(hidden).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    x, y = (t.to(device) for t in synthetic_batch(batch))
    share = batch // world
    xs, ys = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
    loss_fn = torch.nn.MSELoss()
    import torch.distributed as dist

    dist.barrier()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    wall, cpu = [], []
    for step in range(steps):
        if step == stall_step and rank == stall_rank:
            time.sleep(stall_seconds)
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(xs), ys).backward()  # the all-reduce inside waits for every rank
        opt.step()
        _sync(device)
        wall.append(time.perf_counter() - wall0)
        cpu.append(time.process_time() - cpu0)
        if rank == 0:
            progress.put(1)
    return {"rank": rank, "wall": wall, "cpu": cpu}


def run_stalled_job(steps: int = 60, stall_step: int = 30, stall_seconds: float = 2.0, stall_rank: int = 1,
                    hidden: int = 256, batch: int = 256, world_size: int = 2, timeout: float = 120.0) -> list:
    """A short DDP run in which one process stalls once; what every process paid for it.

    Returns one dict per rank: ``wall`` (seconds since the start, at the end of
    each step) and ``cpu`` (CPU seconds its process had used by then). Every
    rank's step ``stall_step`` lasts at least ``stall_seconds``: the gradient
    all-reduce cannot finish until the stalled process arrives.
    """
    world_size = _check_count("world_size", world_size, minimum=2)
    steps = _check_count("steps", steps)
    stall_step = _check_count("stall_step", stall_step, minimum=0)
    if stall_step >= steps:
        raise ValueError(f"stall_step must be below steps={steps}, got {stall_step}")
    stall_seconds = _check_amount("stall_seconds", stall_seconds)
    stall_rank = _check_count("stall_rank", stall_rank, minimum=0)
    if stall_rank >= world_size:
        raise ValueError(f"stall_rank must be below world_size={world_size}, got {stall_rank}")
    hidden = _check_count("hidden", hidden)
    batch = _check_count("batch", batch)
    if batch % world_size:
        raise ValueError(f"batch {batch} does not divide evenly by world_size={world_size}")
    return launch(_stall_worker, world_size,
                  args=(steps, stall_step, stall_seconds, stall_rank, hidden, batch),
                  timeout=timeout, progress_total=steps, desc="DDP steps")
