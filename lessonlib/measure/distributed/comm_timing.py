"""Communication times measured with gloo (or NCCL), for the latency-bandwidth model.

:func:`run_comm_timing` starts ``world_size`` processes and measures, in one run:

1. a **sweep of all-reduce sizes**: each size timed ``rounds`` times, to fit
   alpha and beta (:func:`lessonlib.calc.comm.fit_alpha_beta`);
2. **all-gather and reduce-scatter** at a few sizes, to check the fitted
   model on collectives it was not fitted to;
3. **DistributedDataParallel**: the buckets DDP all-reduces in every step after
   its first (read from DDP's own logging data once it has rebuilt them), each bucket's all-reduce timed alone, and the
   communication a DDP step exposes (its backward minus the same backward under
   ``no_sync``);
4. **a fully_shard step**: the collectives of one forward and backward,
   logged with sizes (:class:`~lessonlib.measure.distributed.collectives.CollectiveLog`),
   each of them replayed and timed alone, and the whole step timed.

Each timed piece starts after a barrier; a round's time is the slowest rank's
(a collective is done when every rank is done). The collectives are timed
round-robin, one round of every one of them after another, so that a stretch
of time when other programs hog the machine slows a few rounds of each rather
than every round of one. The result keeps every round; the caller reduces
them (the fastest round, on the pages). Times are seconds.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from ...checks import count as check_count, mapping as check_mapping, sequence as check_sequence
from ..rounds import MAX_ROUNDS
from ..compat import require_all
from .launch import launch
from .collectives import CollectiveLog
from .quiet import known_warnings_silenced

__all__ = ["run_comm_timing", "SWEEP_BYTES", "CommTiming", "DDPTiming", "FSDPTiming"]


@dataclass(frozen=True)
class DDPTiming:
    """DDP's gradient all-reduce, timed: ``grad_bytes`` of gradients in buckets of ``bucket_bytes``;
    ``bucket_times`` (seconds per round, per bucket, each bucket all-reduced alone); ``backward`` and
    ``backward_no_sync`` (seconds per round of a backward with and without the all-reduce)."""

    grad_bytes: int
    bucket_bytes: tuple
    bucket_times: tuple
    backward: tuple
    backward_no_sync: tuple


@dataclass(frozen=True)
class FSDPTiming:
    """A ``fully_shard`` step, timed: its ``collectives`` (``(kind, bytes)`` in order) for a model of
    ``n_params`` parameters; ``replay_each`` (seconds per round, per collective replayed alone) and
    ``step`` (seconds per round of the whole step)."""

    collectives: tuple
    n_params: int
    replay_each: tuple
    step: tuple


@dataclass(frozen=True)
class CommTiming:
    """What :func:`run_comm_timing` measured on ``world_size`` processes (rank 0's view; each time the
    slowest rank's): ``all_reduce``, ``all_gather``, ``reduce_scatter`` are ``(bytes, seconds per round)``
    per message size; ``ddp`` a :class:`DDPTiming`; ``fsdp`` an :class:`FSDPTiming`."""

    world_size: int
    backend: str
    all_reduce: tuple
    all_gather: tuple
    reduce_scatter: tuple
    ddp: DDPTiming
    fsdp: FSDPTiming

    @classmethod
    def from_worker(cls, d: dict) -> "CommTiming":
        """The record rank 0 sent (plain types, as ``torch.load(weights_only=True)`` reads them)."""
        sizes = lambda key: tuple((b, tuple(ts)) for b, ts in d[key])  # noqa: E731
        rounds = lambda xs: tuple(tuple(t) for t in xs)  # noqa: E731
        g, f = d["ddp"], d["fsdp"]
        return cls(d["world_size"], d["backend"], sizes("all_reduce"), sizes("all_gather"), sizes("reduce_scatter"),
                   DDPTiming(g["grad_bytes"], tuple(g["bucket_bytes"]), rounds(g["bucket_times"]),
                             tuple(g["backward"]), tuple(g["backward_no_sync"])),
                   FSDPTiming(tuple(tuple(c) for c in f["collectives"]), f["n_params"], rounds(f["replay_each"]),
                              tuple(f["step"])))

#: All-reduce sizes of the sweep, bytes (1 KiB to 16 MiB, float32 tensors).
SWEEP_BYTES = tuple(2 ** k for k in range(10, 25, 2))


def _all_gather(out, part):
    """All-gather ``part`` from every rank into ``out`` (``all_gather_single`` where torch has it)."""
    import torch.distributed as dist

    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in recent torch
    fn(out, part)


def _reduce_scatter(part, full):
    """Sum ``full`` over the ranks and keep this rank's slice in ``part``."""
    import torch.distributed as dist

    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in recent torch
    fn(part, full)


def _timed(fn, device, rounds, warmup=2):
    """Seconds of ``fn()`` per round, this rank's clock, after a barrier each round."""
    return _interleaved([(0, fn)], device, rounds, warmup)[0]


def _slowest(times, device):
    """Per round, the maximum over ranks."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.cpu().tolist()


def _interleaved(probes, device, rounds, warmup=2):
    """Time every ``(key, fn)`` probe once per round, round after round; ``{key: [s per round]}``.

    The course's one timing loop (:func:`lessonlib.measure.rounds.time_rounds`),
    with a barrier before each probe so that every rank starts it together.
    Interleaving spreads each probe's rounds over the whole measurement, so a
    stretch of time when other programs hog the machine slows a few rounds of
    every probe rather than all rounds of one.
    """
    import torch.distributed as dist

    from ..rounds import time_rounds

    def one_round(clock):
        for key, fn in probes:
            dist.barrier()
            clock.time(key, fn)

    # num_threads=None: the worker set its threads when it started
    return time_rounds(one_round, rounds, warmup=warmup, device=device, num_threads=None).seconds


def _comm_worker(rank, world_size, device, progress, sweep, check_bytes, rounds, ddp_hidden, ddp_batch, fsdp_cfg):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..models import TinyGPT, lm_loss
    from .data_parallel import forecast_model, synthetic_batch
    from .fsdp import shard_model

    def ones(n_bytes):
        return torch.ones(n_bytes // 4, device=device)

    with known_warnings_silenced():
        # DDP: the buckets it all-reduces (DDP fixes them in its first backward, and logs them)
        model = forecast_model(ddp_hidden).to(device)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        x, y = (t.to(device) for t in synthetic_batch(ddp_batch))
        share = ddp_batch // world_size
        xs, ys = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        loss_fn = torch.nn.MSELoss()

        def backward():
            ddp.zero_grad(set_to_none=True)
            loss_fn(ddp(xs), ys).backward()

        def backward_no_sync():
            ddp.zero_grad(set_to_none=True)
            with ddp.no_sync():
                loss_fn(ddp(xs), ys).backward()

        # the first steps put every gradient in one bucket; then DDP rebuilds the buckets in the order the
        # gradients came (the first capped at dist._DEFAULT_FIRST_BUCKET_BYTES), as every timed step has them:
        # its logging data shows them from the third step on
        for _ in range(3):
            backward()
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        logged = ddp._get_ddp_logging_data()  # DDP's own record of its buckets (bytes)
        sizes = logged.get("rebuilt_bucket_sizes") or logged.get("bucket_sizes", "")
        bucket_bytes = [int(b) for b in str(sizes).split(",") if b.strip()]
        if sum(bucket_bytes) != grad_bytes:  # an older torch that logs otherwise: one bucket of everything
            bucket_bytes = [grad_bytes]

        # fully_shard: the collectives of one forward and backward, logged with their sizes
        mesh = init_device_mesh(device.type, (world_size,))
        torch.manual_seed(0)
        base = TinyGPT(**fsdp_cfg)
        sharded = shard_model(copy.deepcopy(base).to(device), mesh, reshard=True)
        opt = torch.optim.Adam(sharded.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, fsdp_cfg["vocab"], (2 * world_size, fsdp_cfg["seq_len"]), generator=g).to(device)
        ts, tt = tokens[rank * 2:(rank + 1) * 2], tokens.roll(-1, dims=1)[rank * 2:(rank + 1) * 2]
        log = CollectiveLog()
        with log:
            lm_loss(sharded(ts), tt).backward()
        records = [(r.kind, r.n_bytes) for r in log.records]
        progress.put(1)

        # every collective, interleaved round by round: the sweep, the checks, DDP's buckets, FSDP's sequence
        probes = []
        for n in sweep:
            buf = ones(n)
            probes.append((("all_reduce", n), lambda b=buf: dist.all_reduce(b)))
        for n in check_bytes:
            full, part = ones(n), ones(n // world_size)
            probes.append((("all_gather", n), lambda f=full, p=part: _all_gather(f, p)))
            probes.append((("reduce_scatter", n), lambda f=full, p=part: _reduce_scatter(p, f)))
        for i, n in enumerate(bucket_bytes):
            buf = ones(n)
            probes.append((("bucket", i), lambda b=buf: dist.all_reduce(b)))
        for i, (kind, n) in enumerate(records):
            full, part = ones(n), ones(n // world_size)
            fn = (lambda f=full, p=part: _all_gather(f, p)) if kind == "all_gather" else \
                 (lambda f=full, p=part: _reduce_scatter(p, f))
            probes.append((("fsdp", i), fn))
        times = {k: _slowest(v, device) for k, v in _interleaved(probes, device, rounds).items()}
        progress.put(1)

        # whole steps, which compute: DDP with and without its all-reduce (interleaved), the FSDP step
        ddp_t = _interleaved([("with", backward), ("without", backward_no_sync)], device, rounds)

        def fsdp_step():
            opt.zero_grad(set_to_none=True)
            lm_loss(sharded(ts), tt).backward()
            opt.step()

        step_t = _timed(fsdp_step, device, rounds)
        progress.put(1)

    return {
        "rank": rank, "world_size": world_size, "backend": dist.get_backend(),
        "all_reduce": [(n, times[("all_reduce", n)]) for n in sweep],
        "all_gather": [(n, times[("all_gather", n)]) for n in check_bytes],
        "reduce_scatter": [(n, times[("reduce_scatter", n)]) for n in check_bytes],
        "ddp": {"grad_bytes": grad_bytes, "bucket_bytes": bucket_bytes,
                "bucket_times": [times[("bucket", i)] for i in range(len(bucket_bytes))],
                "backward": _slowest(ddp_t["with"], device), "backward_no_sync": _slowest(ddp_t["without"], device)},
        "fsdp": {"collectives": records, "n_params": sum(p.numel() for p in base.parameters()),
                 "replay_each": [times[("fsdp", i)] for i in range(len(records))],
                 "step": _slowest(step_t, device)},
    }


#: The largest message :func:`run_comm_timing` sends (each rank allocates a few of them).
MAX_MESSAGE_BYTES = 2 ** 30


def _fsdp_config(fsdp) -> dict:
    """``fsdp`` checked in the parent: only :class:`TinyGPT`'s arguments, the rest from its defaults,
    and a model those arguments can build (built on the meta device: its checks run, nothing is allocated)."""
    import inspect

    import torch

    from ..models import TinyGPT

    fsdp = check_mapping("fsdp", fsdp)
    known = {n: p.default for n, p in inspect.signature(TinyGPT.__init__).parameters.items() if n != "self"}
    unknown = sorted(map(str, set(fsdp) - set(known)))
    if unknown:
        raise ValueError(f"fsdp has keys TinyGPT does not take: {', '.join(unknown)}; "
                         f"choose from {', '.join(known)}")
    cfg = {**known, **fsdp}
    try:
        with torch.device("meta"):
            TinyGPT(**cfg)
    except (ValueError, TypeError) as err:
        raise ValueError(f"fsdp does not describe a model: {err}") from None
    return cfg


def run_comm_timing(world_size: int = 2, sweep=SWEEP_BYTES, check_bytes=(2 ** 16, 2 ** 20, 2 ** 22),
                    rounds: int = 9, ddp_hidden: int = 512, ddp_batch: int = 256,
                    fsdp=dict(vocab=256, seq_len=64, hidden=128, heads=4, layers=2, dropout=0.0),
                    timeout: float = 240.0) -> CommTiming:
    """Measure the collectives above on ``world_size`` processes; rank 0's view (every time is the slowest rank's).

    Returns a :class:`CommTiming`. Sizes must be multiples of ``4 * world_size`` bytes.
    """
    from .data_parallel import MAX_SIZE
    from .launch import MAX_WORLD_SIZE

    world_size = check_count("world_size", world_size, minimum=2, maximum=MAX_WORLD_SIZE)
    rounds = check_count("rounds", rounds, maximum=MAX_ROUNDS)  # time_rounds' limit, checked before spawning
    sizes = [check_count(f"sweep[{i}]", s, maximum=MAX_MESSAGE_BYTES) for i, s in enumerate(check_sequence("sweep", sweep))]
    checks = [check_count(f"check_bytes[{i}]", s, maximum=MAX_MESSAGE_BYTES)
              for i, s in enumerate(check_sequence("check_bytes", check_bytes))]
    for name, values in (("sweep", sizes), ("check_bytes", checks)):
        for s in values:
            if s % (4 * world_size):
                raise ValueError(f"{name}: message sizes must be multiples of 4 × world_size bytes, got {s}")
    ddp_batch = check_count("ddp_batch", ddp_batch, maximum=MAX_SIZE)
    if ddp_batch % world_size:
        raise ValueError(f"ddp_batch {ddp_batch} does not divide evenly by world_size={world_size}")
    from .data_parallel import check_forecast_hidden

    ddp_hidden = check_forecast_hidden("ddp_hidden", ddp_hidden)
    fsdp = _fsdp_config(fsdp)
    require_all('fully_shard', 'comm_debug_mode')  # before starting processes: one clear error on an older torch
    per_rank = launch(_comm_worker, world_size,
                      args=(sizes, checks, rounds, ddp_hidden, ddp_batch, fsdp),
                      timeout=timeout, progress_total=3 * world_size, desc=f"communication on {world_size} processes")
    return CommTiming.from_worker(per_rank[0])
