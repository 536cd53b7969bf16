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
4. runs ZeRO stage 1 with PyTorch's ``ZeroRedundancyOptimizer`` under DDP,
   counts the optimizer state each rank holds and logs the collectives of its
   forward and backward (DDP's all-reduce) and of its optimizer step (the
   updated parameters broadcast from the rank that owns each).

The worker runs in spawned processes, so it lives here, not in a notebook.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from ...checks import (count as check_count, flag as check_flag, instance as check_instance, positive as check_positive,
                       sequence as check_sequence)
from ..compat import require_all
from .launch import launch
from .collectives import CollectiveLog
from .quiet import known_warnings_silenced

__all__ = ["MODEL", "HeldBytes", "ShardedRank", "ShardingRun", "run_sharding", "local_state_bytes", "build_model",
           "shard_model", "token_batch"]

#: The model sharded on the page: every parameter's first dimension is a
#: multiple of 4, so 2 and 4 ranks split it without padding.
MODEL = dict(vocab=256, seq_len=32, hidden=64, heads=4, layers=2, dropout=0.0)


@dataclass(frozen=True)
class HeldBytes:
    """Bytes one rank holds, by part: ``weights``, ``gradients``, ``optimizer_state`` (Adam's two averages)
    and ``step_counters`` (Adam's per-tensor step counts)."""

    weights: int
    gradients: int
    optimizer_state: int
    step_counters: int


@dataclass(frozen=True)
class ShardedRank:
    """One rank of a sharding run on ``world_size`` processes (:func:`run_sharding`).

    ``n_params`` and ``shapes`` (``n_tensors`` of them) describe the full model; ``zero3`` and ``zero1``
    are the :class:`HeldBytes` of this rank under ``fully_shard`` and under ``ZeroRedundancyOptimizer``;
    ``losses`` is the sharded run's global loss per step and ``reference_losses`` the unsharded copy's on
    the whole batch; ``zero3_collectives`` / ``keep_collectives`` are ``(kind, phase, bytes)`` for each
    collective of one forward and backward, weights freed after forward or kept until backward;
    ``zero1_collectives`` / ``zero1_step_collectives`` are those of ``ZeroRedundancyOptimizer`` under DDP,
    in forward and backward and in the optimizer step (empty in a record made without them).
    """

    rank: int
    world_size: int
    backend: str
    n_params: int
    shapes: tuple
    n_tensors: int
    zero3: HeldBytes
    zero1: HeldBytes
    losses: tuple
    reference_losses: tuple
    zero3_collectives: tuple
    keep_collectives: tuple
    zero1_collectives: tuple = ()
    zero1_step_collectives: tuple = ()

    @classmethod
    def from_worker(cls, d: dict) -> "ShardedRank":
        """The record a worker sent (plain types, as ``torch.load(weights_only=True)`` reads them)."""
        triples = lambda key: tuple(tuple(c) for c in d[key])  # noqa: E731
        return cls(d["rank"], d["world_size"], d["backend"], d["n_params"], tuple(map(tuple, d["shapes"])),
                   d["n_tensors"], HeldBytes(**d["zero3"]), HeldBytes(**d["zero1"]), tuple(d["losses"]),
                   tuple(d["reference_losses"]), triples("zero3_collectives"), triples("keep_collectives"),
                   *(tuple(tuple(c) for c in d.get(k, ())) for k in ("zero1_collectives", "zero1_step_collectives")))


@dataclass(frozen=True)
class ShardingRun:
    """What :func:`run_sharding` measured: ``ranks[N]`` is the tuple of :class:`ShardedRank` on N processes.

    ``ring``: per rank of the whole launch, :func:`~lessonlib.measure.distributed.buckets.ring_all_reduce`
    on all its processes against ``dist.all_reduce`` (dicts: rank, world_size, tensor_bytes, bytes_sent,
    max_diff, allclose); empty where not run.
    """

    ranks: dict
    ring: tuple = ()

    @property
    def n_params(self) -> int:
        """Parameters of the model every run sharded."""
        return next(iter(self.ranks.values()))[0].n_params

    @property
    def n_tensors(self) -> int:
        """Parameter tensors of that model."""
        return next(iter(self.ranks.values()))[0].n_tensors


def _bytes(t) -> int:
    return t.numel() * t.element_size()


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def local_state_bytes(model, optimizer) -> dict:
    """Bytes this rank holds: ``weights``, ``gradients``, ``optimizer_state`` (Adam's two
    averages) and ``step_counters`` (Adam's per-tensor step counts), read from the local shards."""
    import torch

    check_instance("model", model, torch.nn.Module, "a torch.nn.Module")
    check_instance("optimizer", optimizer, torch.optim.Optimizer, "a torch.optim.Optimizer")
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


def build_model(seed: int = 0):
    """The :class:`~lessonlib.measure.models.TinyGPT` of :data:`MODEL`, its weights drawn from ``seed``
    (the same on every process that passes the same seed)."""
    import torch

    from ..models import TinyGPT

    seed = check_count("seed", seed, minimum=0)
    torch.manual_seed(seed)
    return TinyGPT(**MODEL)


def token_batch(global_batch: int, seed: int = 1):
    """``global_batch`` random token sequences of :data:`MODEL`'s shape and their targets, from ``seed``:
    the batch every run of this module trains on (the same on every process)."""
    import torch

    from ...checks import count

    global_batch = count("global_batch", global_batch, maximum=4096)
    seed = count("seed", seed, minimum=0)
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, MODEL["vocab"], (global_batch, MODEL["seq_len"]), generator=g)
    y = torch.randint(0, MODEL["vocab"], (global_batch, MODEL["seq_len"]), generator=g)
    return x, y


def shard_model(model, mesh, reshard: bool):
    """``model`` (a TinyGPT: its ``blocks``) with ``fully_shard`` applied to each block and then to the
    whole, over the device mesh ``mesh``; ``reshard`` frees the gathered weights after forward (ZeRO-3) or
    keeps them until backward. Returns the model, sharded in place."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from ..models import check_module

    check_module("model", model)
    if not isinstance(getattr(model, "blocks", None), torch.nn.Sequential):
        raise TypeError(f"model must have blocks to shard one by one (a TinyGPT), got {type(model).__name__}")
    check_instance("mesh", mesh, DeviceMesh, "a DeviceMesh")
    check_flag("reshard", reshard)

    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    return model


def _shard_on(rank, n, mesh, device, base, steps, global_batch, lr):
    """Everything measured with ``n`` processes (ranks 0..n-1 of ``mesh``); this process is ``rank``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..models import lm_loss

    group = mesh.get_group()
    x, y = (t.to(device) for t in token_batch(global_batch))
    share = global_batch // n
    xs, ys = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]

    # --- ZeRO-3 with fully_shard, against an unsharded copy on the whole batch -------------
    ref = copy.deepcopy(base).to(device)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=lr)
    model = shard_model(copy.deepcopy(base).to(device), mesh, reshard=True)
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
        dist.all_reduce(mean, group=group)  # the global loss: the mean of the ranks' equal shares
        losses.append(mean.item() / n)
    state = local_state_bytes(model, opt)
    state["gradients"] = held["gradients"]

    # --- the same step with the weights kept from forward to backward ----------------------
    keep = shard_model(copy.deepcopy(base).to(device), mesh, reshard=False)
    log_keep = CollectiveLog()
    with log_keep:
        lm_loss(keep(xs), ys).backward()

    # --- ZeRO-1: full weights and gradients, optimizer state split by whole tensors -------
    ddp_model = copy.deepcopy(base).to(device)
    ddp = DDP(ddp_model, device_ids=[device.index] if device.type == "cuda" else None, process_group=group)
    zro = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=lr, process_group=group)
    zro.zero_grad(set_to_none=True)
    log_z1, log_z1_step = CollectiveLog(), CollectiveLog()
    with log_z1:  # DDP: its buffers broadcast in forward, the gradients all-reduced in backward
        lm_loss(ddp(xs), ys).backward()
    with log_z1_step:  # each rank updates the tensors it owns, then broadcasts them to the others
        zro.step()

    shapes = [tuple(p.shape) for p in base.parameters()]
    return {
        "rank": rank,
        "world_size": n,
        "backend": dist.get_backend(group),
        "n_params": sum(p.numel() for p in base.parameters()),
        "shapes": shapes,
        "n_tensors": len(shapes),
        "zero3": state,
        "zero1": local_state_bytes(ddp_model, zro.optim),
        "losses": losses,
        "reference_losses": ref_losses,
        "zero3_collectives": [(r.kind, r.phase, r.n_bytes) for r in log.records],
        "keep_collectives": [(r.kind, r.phase, r.n_bytes) for r in log_keep.records],
        "zero1_collectives": [(r.kind, r.phase, r.n_bytes) for r in log_z1.records],
        "zero1_step_collectives": [(r.kind, r.phase, r.n_bytes) for r in log_z1_step.records],
    }


def _sharding_worker(rank, world_size, device, progress, world_sizes, steps, global_batch, lr):
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    import torch

    from .buckets import ring_all_reduce

    # The ring all-reduce of page 3.4 on every process of this launch: its bytes counted as sent.
    g = torch.Generator().manual_seed(20 + rank)
    mine = torch.randn(4096, generator=g).to(device)
    summed, reference = mine.clone(), mine.clone()
    sent = ring_all_reduce(summed)
    dist.all_reduce(reference)
    ring = {"rank": rank, "world_size": world_size, "tensor_bytes": mine.numel() * mine.element_size(),
            "bytes_sent": sent, "max_diff": (summed - reference).abs().max().item(),
            "allclose": torch.allclose(summed, reference, rtol=1e-5, atol=1e-5)}
    out = {"ring": ring}
    with known_warnings_silenced():
        base = build_model()
        for n in world_sizes:
            # Every process takes part in creating the mesh (it makes a process group); only
            # ranks 0..n-1 work on it, the others wait at the barrier without using the CPU.
            mesh = DeviceMesh(device.type, list(range(n)))
            if rank < n:
                out[n] = _shard_on(rank, n, mesh, device, base, steps, global_batch, lr)
                progress.put(1)
            dist.barrier()
    return out


#: The most steps and sequences per step the sharding runs take (each rank trains the small model).
MAX_STEPS = 1000
MAX_GLOBAL_BATCH = 4096


def run_sharding(world_sizes=(2, 4), steps: int = 4, global_batch: int = 8, lr: float = 1e-3,
                 timeout: float = 180.0) -> ShardingRun:
    """Run the sharding measurements on each process count in ``world_sizes``: a :class:`ShardingRun`.

    One launch of ``max(world_sizes)`` processes serves every count: with N
    processes, ranks 0..N-1 shard over a device mesh of their own while the
    others wait (starting processes costs seconds each; they are started once).

    ``run.ranks[N]`` holds one :class:`ShardedRank` per rank (what it holds, its
    losses, the collectives it logged). ``global_batch`` sequences are split evenly over the ranks.
    """
    from ..precision import MAX_LR
    from .launch import MAX_WORLD_SIZE

    sizes = sorted({check_count(f"world_sizes[{i}]", n, minimum=2, maximum=MAX_WORLD_SIZE)
                    for i, n in enumerate(check_sequence("world_sizes", world_sizes))})
    steps = check_count("steps", steps, maximum=MAX_STEPS)
    global_batch = check_count("global_batch", global_batch, maximum=MAX_GLOBAL_BATCH)
    lr = check_positive("lr", lr, maximum=MAX_LR)  # NaN, inf, 0, negative, True: refused before any process starts
    for n in sizes:
        if global_batch % n:
            raise ValueError(f"global_batch {global_batch} does not divide evenly by {n} processes")
    require_all('fully_shard', 'comm_debug_mode')  # before starting processes: one clear error on an older torch
    per_rank = launch(_sharding_worker, sizes[-1], args=(sizes, steps, global_batch, lr), timeout=timeout,
                      progress_total=sum(sizes), desc=f"sharding on {', '.join(map(str, sizes))} processes")
    return ShardingRun({n: tuple(ShardedRank.from_worker(r[n]) for r in per_rank[:n]) for n in sizes},
                       ring=tuple(r["ring"] for r in per_rank))
