"""Small layouts measured: one tiny model trained by 2 processes four ways, beside its one-process step.

:func:`run_layout_check` starts 2 processes (gloo on CPU, NCCL with a GPU each) once. They build one
model, a stack of the course's transformer layers (:class:`~.tensor_parallel.TPBlock`, no dropout,
a mean-squared-error loss on random targets), and time, round after round:

* ``one_process``: rank 0 alone runs the whole batch (the other waits at the next barrier);
* ``data``: DistributedDataParallel, each process half the batch, buckets of about one layer;
* ``zero3``: ``fully_shard`` on every layer (ZeRO-3), each process half the batch;
* ``tensor``: every layer split with the course's :data:`~.tensor_parallel.BLOCK_PLAN` (DTensor);
* ``pipeline``: half the layers on each process, ``torch.distributed.pipelining``'s 1F1B schedule;
* ``half``: each process its half of the batch on its own copy, no communication (the compute a 2-way
  split leaves a process, with both processes computing at once);
* all-reduces of a few sizes, to fit this machine's alpha and beta.

Every layout runs micro-batches of one sequence, as :func:`lessonlib.calc.layout.layout_cost` assumes:
gradients accumulate over them (DDP all-reduces after the last one; ``fully_shard`` gathers and
reduce-scatters for every one). A step is forward and backward, no optimizer step (the layout
model has none). Each timed piece starts after a barrier; a round's time is the slowest rank's.
Times are seconds.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

from ...checks import count as check_count, sequence as check_sequence
from ..rounds import MAX_ROUNDS
from ..compat import require_all
from .launch import launch
from .quiet import known_warnings_silenced

__all__ = ["MODEL", "LAYOUTS", "SWEEP_BYTES", "LayoutCheck", "run_layout_check"]

#: The model every layout trains: ``layers`` transformer layers of ``hidden`` with ``heads`` heads,
#: on ``global_batch`` sequences of ``seq_len`` tokens (float32).
MODEL = dict(layers=2, hidden=128, heads=4, seq_len=64, global_batch=4)
#: The layouts measured, in the order of the table.
LAYOUTS = ("data", "zero3", "tensor", "pipeline")
#: All-reduce sizes for alpha and beta (bytes): from one micro-batch's activations to a layer's gradients.
SWEEP_BYTES = (2 ** 12, 2 ** 15, 2 ** 18, 2 ** 21)


@dataclass
class LayoutCheck:
    """What :func:`run_layout_check` measured, rank 0's view (every time is the slowest rank's).

    ``model`` the :data:`MODEL` it trained, ``n_params`` its parameters, ``backend``;
    ``one_process`` seconds per round of one process's whole step; ``half`` of each process's half of the
    batch, both at once, with no communication; ``steps[name]`` seconds per round of
    each layout of :data:`LAYOUTS`; ``all_reduce`` ``[(bytes, [s per round]), ...]``.
    """

    world_size: int
    backend: str
    model: dict
    n_params: int
    rounds: int
    one_process: list
    half: list = field(default_factory=list)
    steps: dict = field(default_factory=dict)
    all_reduce: list = field(default_factory=list)


def _stack(layers, hidden, heads, seq_len):
    from torch import nn

    from .tensor_parallel import TPBlock

    return nn.Sequential(*[TPBlock(hidden, heads, seq_len, dropout=0.0) for _ in range(layers)])


def _layout_worker(rank, world_size, device, progress, cfg, rounds, sweep):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.distributed.tensor import parallel as tp_styles
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..rounds import time_rounds
    from .tensor_parallel import BLOCK_PLAN

    b, layers = cfg["global_batch"], cfg["layers"]
    half = b // world_size

    def slowest(times):
        t = torch.tensor(times, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.cpu().tolist()

    def timed(probes):
        def one_round(clock):
            for key, fn in probes:
                dist.barrier()  # every rank starts the piece at once
                clock.time(key, fn)
            progress.put(1)
        return time_rounds(one_round, rounds, warmup=1, device=device, num_threads=None).seconds

    with known_warnings_silenced():
        torch.manual_seed(0)  # every process builds the same model and batch
        base = _stack(layers, cfg["hidden"], cfg["heads"], cfg["seq_len"]).to(device)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(b, cfg["seq_len"], cfg["hidden"], generator=g).to(device)
        y = torch.randn(b, cfg["seq_len"], cfg["hidden"], generator=g).to(device)
        xs, ys = x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half]
        mesh = init_device_mesh(device.type, (world_size,))

        def accumulate(model, inputs, targets):
            for i in range(len(inputs)):  # micro-batches of one sequence
                F.mse_loss(model(inputs[i:i + 1]), targets[i:i + 1]).backward()

        # one process, the whole batch: rank 1 does nothing and waits at the next barrier, using no CPU
        one = copy.deepcopy(base)

        def one_step():
            if rank == 0:
                one.zero_grad(set_to_none=True)
                accumulate(one, x, y)


        # data parallel: DDP, buckets of about one layer, its all-reduce after the last micro-batch
        layer_mb = sum(p.numel() * p.element_size() for p in base[0].parameters()) / 2 ** 20
        ddp = DDP(copy.deepcopy(base), bucket_cap_mb=layer_mb,
                  device_ids=[device.index] if device.type == "cuda" else None)

        def data_step():
            ddp.zero_grad(set_to_none=True)
            with ddp.no_sync():
                accumulate(ddp, xs[:-1], ys[:-1])
            accumulate(ddp, xs[-1:], ys[-1:])

        # ZeRO-3: fully_shard on every layer, then the root
        sharded = copy.deepcopy(base)
        for block in sharded:
            fully_shard(block, mesh=mesh)
        fully_shard(sharded, mesh=mesh)

        def zero3_step():
            sharded.zero_grad(set_to_none=True)
            accumulate(sharded, xs, ys)

        # tensor parallel: every layer split by the course's plan (ColwiseParallel / RowwiseParallel)
        split = copy.deepcopy(base)
        for block in split:
            parallelize_module(block, mesh, {k: getattr(tp_styles, v)() for k, v in BLOCK_PLAN.items()})

        def tensor_step():
            split.zero_grad(set_to_none=True)
            accumulate(split, x, y)

        # pipeline: half the layers a process, 1F1B over micro-batches of one sequence
        per = layers // world_size
        stage_mod = copy.deepcopy(base[rank * per:(rank + 1) * per])
        stage = PipelineStage(stage_mod, rank, world_size, device)
        schedule = Schedule1F1B(stage, n_microbatches=b, loss_fn=F.mse_loss)

        def pipeline_step():
            stage_mod.zero_grad(set_to_none=True)
            if rank == 0:
                schedule.step(x)
            else:
                schedule.step(target=y)

        # each process its half of the batch on its own copy, no communication: the compute a 2-way split
        # leaves each process, run by both processes at once (what sharing the machine's cores costs)
        def half_step():
            one.zero_grad(set_to_none=True)
            accumulate(one, xs, ys)

        bufs = {n: torch.ones(n // 4, device=device) for n in sweep}
        # in the same rounds, so that a stretch of load on the machine slows a round of each, not all of one
        probes = [("one", one_step), ("half", half_step), ("data", data_step), ("zero3", zero3_step), ("tensor", tensor_step), ("pipeline", pipeline_step)]
        probes += [(("all_reduce", n), lambda t=bufs[n]: dist.all_reduce(t)) for n in sweep]
        times = {k: slowest(v) for k, v in timed(probes).items()}

    # plain data (the launcher loads results with weights_only=True): the caller builds the LayoutCheck
    return dict(world_size=world_size, backend=dist.get_backend(), model=dict(cfg),
                n_params=sum(p.numel() for p in base.parameters()), rounds=rounds, one_process=times["one"],
                half=times["half"], steps={k: times[k] for k in LAYOUTS}, all_reduce=[(n, times[("all_reduce", n)]) for n in sweep])


def run_layout_check(rounds: int = 5, sweep=SWEEP_BYTES, timeout: float = 240.0) -> LayoutCheck:
    """Time :data:`MODEL`'s step on one process and in each of :data:`LAYOUTS` on 2 processes, in one launch,
    ``rounds`` rounds each (after 1 unmeasured), and all-reduces of each size in ``sweep`` (bytes, multiples
    of 8) for the link's alpha and beta. Returns rank 0's :class:`LayoutCheck`."""
    rounds = check_count("rounds", rounds, maximum=MAX_ROUNDS)
    sizes = [check_count(f"sweep[{i}]", s, maximum=2 ** 26) for i, s in enumerate(check_sequence("sweep", sweep))]
    for s in sizes:
        if s % 8:
            raise ValueError(f"sweep: message sizes must be multiples of 8 bytes (float32 on 2 processes), got {s}")
    if len(set(sizes)) < 2:
        raise ValueError("sweep needs at least two different sizes to fit alpha and beta")
    require_all("fully_shard", "pipeline_stage")  # before starting processes: one clear error on an older torch
    world_size = 2
    per_rank = launch(_layout_worker, world_size, args=(MODEL, rounds, sizes), timeout=timeout,
                      progress_total=2 * (rounds + 1),
                      desc="four layouts on 2 processes")
    return LayoutCheck(**per_rank[0])
