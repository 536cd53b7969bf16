"""Data parallelism measured: DistributedDataParallel against one process.

:func:`run_data_parallel` times one process against ``world_size`` processes
at the same global batch, with the pieces of the step (compute on a share of
the batch, the optimizer step, the all-reduce of the gradient bytes) timed
separately so that the two-process step can be predicted from them.
Times are seconds of wall-clock time.
"""
from __future__ import annotations

import statistics
import time

from ...checks import amount as _check_amount, count as _check_count, sequence as _check_sequence
from ..device import synchronize as _sync
from .launch import MAX_TIMEOUT, MAX_WORLD_SIZE, launch

#: The largest global batch, width and round count :func:`run_data_parallel` accepts.
MAX_SIZE = 65_536


FEATURES = 64  # inputs of the stand-in forecast model (recent sales figures)


def forecast_model(hidden: int = 512, features: int = FEATURES):
    """The retailer's forecast model (:class:`lessonlib.measure.models.ForecastMLP`), seeded.

    ``features`` inputs (recent daily sales), two hidden layers of ``hidden``
    units, one output; built from seed 0 so every process builds the same
    weights.
    """
    import torch

    from ..models import ForecastMLP

    hidden = _check_count("hidden", hidden, maximum=MAX_SIZE)
    features = _check_count("features", features, maximum=MAX_SIZE)
    torch.manual_seed(0)
    return ForecastMLP(window=features, hidden=hidden, depth=2)


def synthetic_batch(global_batch: int, features: int = FEATURES, seed: int = 1):
    """A seeded synthetic batch (same on every process): inputs and targets (``features`` >= 8)."""
    import torch

    global_batch = _check_count("global_batch", global_batch, maximum=MAX_SIZE)
    features = _check_count("features", features, minimum=8, maximum=MAX_SIZE)
    seed = _check_count("seed", seed, minimum=0)

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(global_batch, features, generator=g)
    y = x[:, :8].sum(dim=1, keepdim=True) + 0.1 * torch.randn(global_batch, 1, generator=g)
    return x, y


def _flat_grads(model):
    import torch

    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()])


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
    world_size = _check_count("world_size", world_size, minimum=2, maximum=MAX_WORLD_SIZE)
    rounds = _check_count("rounds", rounds, maximum=1000)
    warmup = _check_count("warmup", warmup, minimum=0, maximum=1000)
    hidden = _check_count("hidden", hidden, maximum=MAX_SIZE)
    sizes = [_check_count("batch_sizes", b, maximum=MAX_SIZE) for b in _check_sequence("batch_sizes", batch_sizes)]
    timeout = _check_amount("timeout", timeout, allow_zero=False, maximum=MAX_TIMEOUT)
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
            row[key] = statistics.median([t[key] for t in merged])
        row["speedup"] = statistics.median([t["single"] / t["ddp"] for t in merged])
        row["predicted_speedup"] = statistics.median([t["single"] / t["predicted"] for t in merged])
        row["predicted_over_measured"] = statistics.median([t["predicted"] / t["ddp"] for t in merged])
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
