"""ZeRO and FSDP measured: what each rank keeps, what the step sends, and the loss.

:func:`run_sharding` starts ``world_size`` processes (gloo on CPU, NCCL with
a GPU each) and in each of them:

1. trains the course's :class:`~lessonlib.models.TinyGPT` sharded with
   PyTorch's ``fully_shard`` (FSDP2, ZeRO stage 3) for a few Adam steps, each
   rank on its share of the batch, and beside it an unsharded copy on the
   whole batch: the two loss sequences should agree;
2. counts, from the local shards (``DTensor.to_local()``), the bytes of
   weights, gradients and Adam state each rank holds;
3. logs the collectives of one forward and backward
   (:class:`~lessonlib.measure.distributed.collectives.CollectiveLog`), once
   with the weights freed after forward (``reshard_after_forward=True``, the
   ZeRO-3 pattern) and once kept until backward (``False``);
4. runs ZeRO stage 1 with PyTorch's ``ZeroRedundancyOptimizer`` under DDP
   and counts the optimizer state each rank holds.

The worker runs in spawned processes, so it lives here, not in a notebook.
"""
from __future__ import annotations

import copy

from ...checks import count as check_count
from .launch import launch
from .collectives import CollectiveLog
from .quiet import known_warnings_silenced

__all__ = ["MODEL", "run_sharding", "local_state_bytes"]

#: The model sharded on the page: every parameter's first dimension is a
#: multiple of 4, so 2 and 4 ranks split it without padding.
MODEL = dict(vocab=256, seq_len=32, hidden=64, heads=4, layers=2, dropout=0.0)


def _bytes(t) -> int:
    return t.numel() * t.element_size()


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def local_state_bytes(model, optimizer) -> dict:
    """Bytes this rank holds: ``weights``, ``gradients``, ``optimizer_state`` (Adam's two
    averages) and ``step_counters`` (Adam's per-tensor step counts), read from the local shards."""
    import torch

    params = list(model.parameters())
    out = {
        "weights": sum(_bytes(_local(p)) for p in params),
        "gradients": sum(_bytes(_local(p.grad)) for p in params if p.grad is not None),
        "optimizer_state": 0,
        "step_counters": 0,
    }
    for state in optimizer.state.values():
        for key, v in state.items():
            if isinstance(v, torch.Tensor):
                out["step_counters" if key == "step" else "optimizer_state"] += _bytes(_local(v))
    return out


def _build(seed: int = 0):
    import torch

    from ..models import TinyGPT

    torch.manual_seed(seed)
    return TinyGPT(**MODEL)


def _batch(global_batch: int, seed: int = 1):
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, MODEL["vocab"], (global_batch, MODEL["seq_len"]), generator=g)
    y = torch.randint(0, MODEL["vocab"], (global_batch, MODEL["seq_len"]), generator=g)
    return x, y


def _shard(model, mesh, reshard: bool):
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    return model


def _sharding_worker(rank, world, device, progress, steps, global_batch, lr):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..models import lm_loss

    with known_warnings_silenced():
        mesh = init_device_mesh(device.type, (world,))
        base = _build()
        shapes = [tuple(p.shape) for p in base.parameters()]
        n_params = sum(p.numel() for p in base.parameters())
        x, y = (t.to(device) for t in _batch(global_batch))
        share = global_batch // world
        xs, ys = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]

        # --- ZeRO-3 with fully_shard, against an unsharded copy on the whole batch -------------
        ref = copy.deepcopy(base).to(device)
        ref_opt = torch.optim.Adam(ref.parameters(), lr=lr)
        model = _shard(copy.deepcopy(base).to(device), mesh, reshard=True)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        ref_losses, losses = [], []
        log = CollectiveLog()
        for step in range(steps):
            ref_opt.zero_grad(set_to_none=True)
            ref_loss = lm_loss(ref(x), y)
            ref_loss.backward()
            ref_opt.step()
            ref_losses.append(ref_loss.item())

            opt.zero_grad(set_to_none=True)
            if step == 0:
                with log:
                    loss = lm_loss(model(xs), ys)
                    loss.backward()
            else:
                loss = lm_loss(model(xs), ys)
                loss.backward()
            held = local_state_bytes(model, opt)  # gradients are present between backward and step
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)  # the global loss: the mean of the ranks' equal shares
            losses.append(mean.item() / world)
            progress.put(1)
        state = local_state_bytes(model, opt)
        state["gradients"] = held["gradients"]
        zero3_records = [(r.kind, r.phase, r.n_bytes) for r in log.records]

        # --- the same step with the weights kept from forward to backward ----------------------
        keep = _shard(copy.deepcopy(base).to(device), mesh, reshard=False)
        log_keep = CollectiveLog()
        with log_keep:
            lm_loss(keep(xs), ys).backward()
        keep_records = [(r.kind, r.phase, r.n_bytes) for r in log_keep.records]

        # --- ZeRO-1: full weights and gradients, optimizer state split by whole tensors -------
        ddp_model = copy.deepcopy(base).to(device)
        ddp = DDP(ddp_model, device_ids=[device.index] if device.type == "cuda" else None)
        zro = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=lr)
        zro.zero_grad(set_to_none=True)
        lm_loss(ddp(xs), ys).backward()
        zro.step()
        zero1 = local_state_bytes(ddp_model, zro.optim)
        progress.put(1)

    return {
        "rank": rank,
        "world_size": world,
        "backend": dist.get_backend(),
        "n_params": n_params,
        "shapes": shapes,
        "zero3": state,
        "zero1": zero1,
        "losses": losses,
        "reference_losses": ref_losses,
        "zero3_collectives": zero3_records,
        "keep_collectives": keep_records,
        "n_tensors": len(shapes),
    }


def run_sharding(world_size: int = 2, steps: int = 4, global_batch: int = 8, lr: float = 1e-3,
                 timeout: float = 180.0) -> list:
    """Run the sharding measurements on ``world_size`` processes; one dict per rank.

    Each dict: ``n_params`` and ``shapes`` (the full model), ``zero3`` and
    ``zero1`` (bytes held by this rank under fully_shard and under
    ZeroRedundancyOptimizer: ``weights``, ``gradients``, ``optimizer_state``,
    ``step_counters``), ``losses`` (the sharded run's global loss per step)
    and ``reference_losses`` (the unsharded copy on the whole batch),
    ``zero3_collectives`` / ``keep_collectives`` (``(kind, phase, bytes)``
    for each collective of one forward and backward, weights freed after
    forward or kept). ``global_batch`` sequences are split evenly over the ranks.
    """
    world_size = check_count("world_size", world_size, minimum=2)
    steps = check_count("steps", steps)
    global_batch = check_count("global_batch", global_batch)
    if global_batch % world_size:
        raise ValueError(f"global_batch {global_batch} does not divide evenly by world_size={world_size}")
    return launch(_sharding_worker, world_size, args=(steps, global_batch, lr), timeout=timeout,
                  progress_total=world_size * (steps + 1), desc=f"sharding on {world_size} processes")
