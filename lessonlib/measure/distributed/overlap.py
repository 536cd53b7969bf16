"""Communication hidden behind compute, measured on torch.distributed's own engines.

:func:`run_overlap` starts ``world_size`` processes (gloo on CPU, NCCL with a GPU each) that train the same
stack of layers and time, round by round (:func:`lessonlib.measure.rounds.time_rounds`), one forward and backward
with its gradient exchange, each way: ``compute`` (DDP's ``no_sync()``: no exchange); ``sync_after`` (the same,
then one all-reduce of all gradients: nothing hidden); ``ddp`` (small buckets, ``bucket_cap_mb``: each bucket's
all-reduce starts during backward); ``hooks`` (:func:`~lessonlib.measure.distributed.buckets.all_reduce_in_buckets`,
the same mechanism in a few readable lines); ``fsdp`` and ``fsdp_prefetch`` (FSDP2's ``fully_shard`` per layer with
its defaults, and with forward and backward prefetch set by hand); and the communication alone: one all-reduce of
the gradient bytes (``allreduce``), and FSDP's collectives as ``CommDebugMode`` logged them, replayed without
compute (``fsdp_comm``; both FSDP variants issue the same collectives, which the worker checks).
Every ``sync_after`` and ``ddp`` step records its timeline, and its time is that timeline's, so the figure's step
is a step of the table; every FSDP step records its time inside its collectives (``OverlapRow.in_collectives``).
Times are seconds: per round, a step that exchanges runs from the later process's start (after the barrier) to the
last process's end, compute alone is the slower process's own time; over the rounds, the fastest round (the one
least disturbed on a shared machine: medians moved 2-5x from run to run on a loaded 2-core machine), and the
exposed time of every round for its spread. Workers run in spawned processes, so they live here.
"""
from __future__ import annotations

import contextlib
import copy
import statistics
import time
from dataclasses import dataclass, field

from ...checks import amount as _check_amount, count as _check_count, positive as _check_positive
from ...calc.overlap import hidden_share
from ..rounds import Rounds, time_rounds
from .buckets import MAX_SIZE, all_reduce_in_buckets, layer_stack
from .collectives import CollectiveLog, CollectiveTimer
from .launch import MAX_TIMEOUT, MAX_WORLD_SIZE, launch
from .quiet import known_warnings_silenced

__all__ = ["run_overlap", "OverlapRow", "OverlapRun", "VARIANTS", "SEQUENTIAL"]
#: The variants timed, in table order: (name in the rounds, label, name of its communication alone).
VARIANTS = (
    ("sync_after", "DDP no_sync + one all-reduce after backward", "allreduce"),
    ("ddp", "DDP, gradient buckets during backward", "allreduce"),
    ("hooks", "bucket hooks (all_reduce_in_buckets)", "allreduce"),
    ("fsdp", "FSDP2, default prefetch (in backward, the next layer's weights are fetched early)", "fsdp_comm"),
    ("fsdp_prefetch", "FSDP2, prefetch also set by hand for forward and backward", "fsdp_comm"),
)


def _timed_allreduce_hook(record, bucket):
    """DDP's own all-reduce hook (``default_hooks.allreduce_hook``), with when each bucket was sent and done."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    buf = bucket.buffer()
    start = time.perf_counter()
    fut = default_hooks.allreduce_hook(None, bucket)

    def done(f):  # runs when the all-reduce has finished (gloo: in its own thread)
        record.append({"bucket": bucket.index(), "bytes": buf.numel() * buf.element_size(),
                       "start": start, "end": time.perf_counter()})
        return f.value()
    return fut.then(done)


def _fsdp(base, mesh, device, prefetch: bool):
    from torch.distributed.fsdp import fully_shard

    model = copy.deepcopy(base).to(device)
    for block in model:
        fully_shard(block, mesh=mesh)  # weights freed after forward, gathered again in backward
    fully_shard(model, mesh=mesh)
    if prefetch:  # ask for the next layers' weights early, in both directions
        blocks = list(model)
        for i, block in enumerate(blocks):
            if i + 1 < len(blocks):
                block.set_modules_to_forward_prefetch(blocks[i + 1:i + 3])
            if i > 0:
                block.set_modules_to_backward_prefetch(blocks[max(0, i - 2):i][::-1])
    return model


def _replay(plan, world_size, device):
    """Buffers and a function that issues the logged collectives again, without any compute."""
    import torch
    import torch.distributed as dist

    # the names torch 2.13 prefers; older torch has only the *_tensor ones
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    calls = []
    for kind, n_bytes in plan:
        n = n_bytes // 4  # float32
        full, shard = torch.zeros(n, device=device), torch.zeros(n // world_size, device=device)
        if kind == "all_gather":
            calls.append(lambda full=full, shard=shard: gather(full, shard))
        elif kind == "reduce_scatter":
            calls.append(lambda full=full, shard=shard: scatter(shard, full))
        elif kind == "all_reduce":
            calls.append(lambda full=full: dist.all_reduce(full))
        else:
            raise RuntimeError(f"FSDP issued a collective this replay does not know: {kind}")
    return lambda: [c() for c in calls]


def _overlap_worker(rank, world_size, device, progress, hidden, layers, batch, bucket_cap_mb, rounds, warmup):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    loss_fn = torch.nn.MSELoss()
    g = torch.Generator().manual_seed(100 + rank)  # each process its own share of the batch
    x = torch.randn(batch, hidden, generator=g).to(device)
    y = torch.randn(batch, hidden, generator=g).to(device)
    with known_warnings_silenced():
        base = layer_stack(hidden, layers)
        params = list(base.parameters())
        param_bytes = sum(p.numel() * p.element_size() for p in params)
        # one DDP model for compute, the step with one all-reduce after backward and the bucketed step; its
        # comm hook (DDP's own all-reduce, timed) and a hook per parameter (when its gradient was ready) record
        # the timeline of every timed step, so that the figure's step is one of the table's rounds
        ddp, record, ready = DDP(copy.deepcopy(base).to(device), device_ids=ids, bucket_cap_mb=bucket_cap_mb), [], []
        ddp.register_comm_hook(record, _timed_allreduce_hook)
        for p in ddp.parameters():
            p.register_post_accumulate_grad_hook(lambda p: ready.append(time.perf_counter()))
        hooked = copy.deepcopy(base).to(device)
        finish = all_reduce_in_buckets(hooked, int(bucket_cap_mb * 2**20))
        mesh = DeviceMesh(device.type, list(range(world_size)))
        fsdp = {"fsdp": _fsdp(base, mesh, device, False),
                "fsdp_prefetch": _fsdp(base, mesh, device, True)}
        flat = torch.zeros(param_bytes // 4, device=device)

        def grads(model):
            return torch.cat([(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).reshape(-1)
                              for p in model.parameters()])

        def fwd_bwd(model):
            model.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()

        def now():  # on a GPU, the work queued so far is done first, so that a time means finished work
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return time.perf_counter()

        def compute():
            with ddp.no_sync():
                fwd_bwd(ddp)

        def one_allreduce():  # everything at once, after backward: nothing hidden
            ps = list(ddp.parameters())
            both = torch.cat([p.grad.reshape(-1) for p in ps])
            start = now()
            dist.all_reduce(both)
            comm = [{"bucket": 0, "bytes": both.numel() * both.element_size(), "start": start, "end": now()}]
            both /= world_size
            for p, g_ in zip(ps, both.split([p.numel() for p in ps])):
                p.grad.copy_(g_.view_as(p))
            return comm

        def traced_step(sync_after: bool):
            """One step of DDP, each bucket sent during backward or (``sync_after``) all at once after it.

            Returns its events (perf_counter seconds); the step's time is ``end - forward[0]``."""
            record.clear()
            ready.clear()
            t0 = now()
            ddp.zero_grad(set_to_none=True)
            with (ddp.no_sync() if sync_after else contextlib.nullcontext()):
                out = loss_fn(ddp(x), y)
                t1 = now()
                out.backward()
            comm = one_allreduce() if sync_after else [dict(r) for r in record]
            return {"forward": (t0, t1), "backward": (t1, max(ready)), "end": now(), "comm": comm}

        def hooks():
            fwd_bwd(hooked)
            return finish()

        # --- correctness and structure first: the same gradients whatever the exchange -------
        for _ in range(2):  # DDP rebuilds its buckets after the first step
            record.clear()
            fwd_bwd(ddp)
        ddp_buckets = [r["bytes"] for r in sorted(record, key=lambda r: r["bucket"])]
        reference = grads(ddp)
        traced_step(True)  # the step with one all-reduce after backward
        diffs = {"sync_after": (grads(ddp) - reference).abs().max().item()}
        hook_buckets = hooks()
        diffs["hooks"] = (grads(hooked) - reference).abs().max().item()
        plans = {}
        for name, model in fsdp.items():
            log = CollectiveLog()
            with log:
                fwd_bwd(model)
            plans[name] = [(r.kind, r.n_bytes) for r in log.records]
            diffs[name] = (grads(model) - reference).abs().max().item()
        # prefetch changes when the all-gathers are issued, not which: one replay times both
        if sorted(plans["fsdp"]) != sorted(plans["fsdp_prefetch"]):
            raise RuntimeError(f"FSDP2 with prefetch issued other collectives: {plans}")
        replays = {"fsdp_comm": _replay(plans["fsdp"], world_size, device)}

        tick = (lambda: progress.put(1)) if rank == 0 else None

        events = {"sync_after": [], "ddp": []}  # per round, warm-up included: each traced step's events
        in_collectives = {name: [] for name in fsdp}  # per round: seconds inside FSDP2's collectives
        clocks = {name: CollectiveTimer() for name in fsdp}

        spans = {}  # per communicating case, per round (warm-up included): this process's (start, end)

        def traced(name, clock, sync):
            ev = traced_step(sync)
            events[name].append(ev)
            spans.setdefault(name, []).append((ev["forward"][0], ev["end"]))  # the table's step is the figure's
            clock.add(name, ev["end"] - ev["forward"][0])

        def spanned(name, clock, fn):  # its start and end on the clock every process here shares
            start, _, end = now(), fn(), now()
            spans.setdefault(name, []).append((start, end))
            clock.add(name, end - start)

        def fsdp_step(name, model):
            with clocks[name]:
                fwd_bwd(model)
            in_collectives[name].append(clocks[name].seconds)

        def one_round(clock):
            cases = [("compute", compute), ("sync_after", lambda: traced("sync_after", clock, True)),
                     ("ddp", lambda: traced("ddp", clock, False)),
                     ("hooks", hooks), ("allreduce", lambda: dist.all_reduce(flat))]
            cases += [(name, lambda n=name, m=model: fsdp_step(n, m)) for name, model in fsdp.items()]
            cases += list(replays.items())
            for name, fn in cases:
                dist.barrier()  # every process starts each case together, give or take the OS's wake-up
                if name in events:
                    fn()
                elif name == "compute":  # no exchange: no process waits for another
                    clock.time(name, fn)
                else:
                    spanned(name, clock, fn)

        timed = time_rounds(one_round, rounds, warmup, device=device, num_threads=None, after_round=tick)
    return {
        "rank": rank, "world_size": world_size, "backend": dist.get_backend(), "device": str(device),
        "n_params": sum(p.numel() for p in params), "param_bytes": param_bytes,
        "ddp_bucket_bytes": ddp_buckets, "hook_bucket_bytes": hook_buckets,
        "grad_max_diff": diffs, "grad_max": reference.abs().max().item(), "fsdp_collectives": plans,
        "rounds": timed.seconds, "events": {name: evs[warmup:] for name, evs in events.items()},
        "in_collectives": {name: secs[warmup:] for name, secs in in_collectives.items()},
        "spans": {name: sp[warmup:] for name, sp in spans.items()},
    }


#: The variant that hides nothing by construction: the hidden share of DDP's variants is measured against it.
SEQUENTIAL = "sync_after"


@dataclass
class OverlapRow:
    """One variant of :func:`run_overlap` (seconds, timed as the module's docstring says; the fastest round).

    ``step``: forward + backward + the exchange; ``comm``: its communication
    alone; ``exposed`` = step − compute (the time the exchange added).
    The hidden share is measured against the step that sends everything after
    backward (:data:`SEQUENTIAL`, named in ``measured_against``): ``hidden_raw``
    = (sequential − step) / (sequential − compute), the share of the
    sequential step's exchange time that this step saved (negative: it took
    longer than the sequential step), ``hidden`` that clipped to [0, 1]. FSDP's
    variants have no measured sequential counterpart: for them
    ``measured_against`` is ``""`` and the shares are 0, not a measurement.
    ``in_collectives`` (FSDP's variants; 0 for the others): the seconds that the step of ``step``'s round, on the
    process that started it last, spent inside its all-gathers and reduce-scatters, waits included.
    """

    variant: str
    label: str
    step: float
    comm: float
    exposed: float
    hidden: float
    hidden_raw: float
    measured_against: str = ""
    in_collectives: float = 0.0
    exposed_rounds: tuple = ()  # step − compute in every round: on shared cores too wide for a per-round share

    @property
    def exposed_quartiles(self) -> tuple:
        """(lower quartile, median, upper quartile) of ``exposed_rounds`` (step − compute in every round, each
        from the same round), seconds: the median and its interquartile range (the middle half of the rounds).
        One round gives its own value three times."""
        if not self.exposed_rounds:
            raise ValueError(f"{self.variant}: no rounds were recorded")
        if len(self.exposed_rounds) == 1:
            return (self.exposed_rounds[0],) * 3
        return tuple(statistics.quantiles(self.exposed_rounds, n=4, method="inclusive"))


@dataclass
class OverlapRun:
    """What :func:`run_overlap` measured.

    ``hidden``, ``layers``: the width and depth of :func:`layer_stack` that ran.
    ``compute``: seconds of forward + backward with no exchange (fastest round).
    ``rows``: one :class:`OverlapRow` per variant (:data:`VARIANTS`).
    The hidden share has one definition, each row's (see :class:`OverlapRow`): against the
    measured sequential step. ``param_bytes``: bytes of the parameters (float32);
    ``ddp_bucket_bytes``: the bytes of each bucket DDP all-reduced in one step
    (recorded by a comm hook); ``hook_bucket_bytes``: the same for
    :func:`all_reduce_in_buckets`. ``grad_max_diff``: per variant, the largest
    difference of its averaged gradient from DDP's (``grad_max``: the largest
    gradient entry, for scale). ``fsdp_collectives``: per FSDP variant, the
    ``(kind, bytes)`` of each collective of one step. ``timeline``: rank by
    rank, per DDP variant, the step of the round its ``step`` comes from (every such step is traced;
    the latest ``end`` is the row's ``step``), seconds from the later rank's start: ``forward``,
    ``backward`` (until the last gradient was ready), ``end`` and ``comm``
    (per bucket, in the order they started: ``start``, ``end``, ``bytes``). ``per_round``: all the rounds.
    """

    world_size: int
    backend: str
    device: str
    hidden: int
    layers: int
    n_params: int
    param_bytes: int
    bucket_cap_bytes: int
    ddp_bucket_bytes: list
    hook_bucket_bytes: list
    grad_max_diff: dict
    grad_max: float
    fsdp_collectives: dict
    compute: float
    rounds: int
    rows: list = field(default_factory=list)
    timeline: list = field(default_factory=list)
    per_round: dict = field(default_factory=dict)


def _relative_timeline(per_rank, chosen):
    """Each traced variant's events in round ``chosen[name]`` on every rank, in seconds from that step's
    latest start over ranks (the earlier rank's first events are negative), keyed by the variant's label."""
    labels = {name: label for name, label, _ in VARIANTS}
    out = [{} for _ in per_rank]
    for name in per_rank[0]["events"]:
        variant, i_round = labels[name], chosen[name]
        t0 = max(r["events"][name][i_round]["forward"][0] for r in per_rank)
        for i, r in enumerate(per_rank):
            ev = r["events"][name][i_round]
            out[i][variant] = {"forward": tuple(t - t0 for t in ev["forward"]),
                               "backward": tuple(t - t0 for t in ev["backward"]), "end": ev["end"] - t0,
                               "comm": [{"bucket": c["bucket"], "bytes": c["bytes"], "start": c["start"] - t0,
                                         "end": c["end"] - t0} for c in sorted(ev["comm"], key=lambda c: c["start"])]}
    return out


def run_overlap(hidden: int = 256, layers: int = 8, batch: int = 32, bucket_cap_mb: float = 0.5,
                rounds: int = 7, warmup: int = 1, world_size: int = 2, timeout: float = 180.0) -> OverlapRun:
    """Time DDP's and FSDP2's overlap of communication with backward on ``world_size`` processes.

    Each process runs :func:`layer_stack` (``layers`` blocks of width
    ``hidden``) on its own ``batch`` rows; DDP's buckets hold about
    ``bucket_cap_mb`` MiB (2**20 bytes). ``rounds`` timed rounds after
    ``warmup`` (see the module's docstring for the cases). Returns an
    :class:`OverlapRun`; every row is computed from the fastest rounds' times, so the table's
    numbers add up: exposed = step − compute, hidden = (sequential − step) / (sequential − compute)
    for DDP's variants, where sequential is the step that sends everything after backward.
    """
    world_size = _check_count("world_size", world_size, minimum=2, maximum=MAX_WORLD_SIZE)
    hidden = _check_count("hidden", hidden, minimum=2 * world_size, maximum=MAX_SIZE)
    layers = _check_count("layers", layers, minimum=2, maximum=64)
    batch = _check_count("batch", batch, maximum=MAX_SIZE)
    bucket_cap_mb = _check_positive("bucket_cap_mb", bucket_cap_mb, maximum=1024.0)
    if bucket_cap_mb * 2**20 < 1:
        raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r} is less than one byte")
    rounds = _check_count("rounds", rounds, maximum=1000)
    warmup = _check_count("warmup", warmup, minimum=0, maximum=1000)
    timeout = _check_amount("timeout", timeout, allow_zero=False, maximum=MAX_TIMEOUT)
    if hidden % world_size:
        raise ValueError(f"hidden={hidden} does not divide evenly by world_size={world_size} (FSDP shards rows)")
    per_rank = launch(_overlap_worker, world_size, args=(hidden, layers, batch, bucket_cap_mb, rounds, warmup),
                      timeout=timeout, progress_total=rounds + warmup, desc="overlap rounds")
    merged = Rounds.slowest([r["rounds"] for r in per_rank])
    # A step that exchanges runs from the later process's start to the last end: the barrier releases the processes
    # a little apart, and the earlier one's wait for the later one is that offset, not communication (one clock here)
    for name in per_rank[0]["spans"]:
        merged.seconds[name] = [max(s[1] for s in per_round) - max(s[0] for s in per_round)
                                for per_round in zip(*(r["spans"][name] for r in per_rank))]
    fastest = {k: min(v) for k, v in merged.seconds.items()}
    compute = fastest["compute"]
    rows = []
    serial = fastest[SEQUENTIAL]
    # the round each step comes from (the fastest), and in it the process that started last: its own time lies
    # inside the step's, so what it spent inside its collectives is part of the step
    chosen = {name: merged.seconds[name].index(fastest[name]) for name in merged.seconds}
    later = {name: max(range(world_size), key=lambda k: per_rank[k]["spans"][name][chosen[name]][0])
             for name in per_rank[0]["spans"]}
    for name, label, comm_name in VARIANTS:
        step, comm = fastest[name], fastest[comm_name]
        share = raw = 0.0
        against = ""
        if comm_name == "allreduce" and serial > compute:  # DDP's family: the sequential step was measured
            h = hidden_share(serial, step, serial - compute)
            share, raw, against = h.share, h.raw, SEQUENTIAL
        in_comm = per_rank[later[name]]["in_collectives"][name][chosen[name]] if name.startswith("fsdp") else 0.0
        rows.append(OverlapRow(variant=name, label=label, step=step, comm=comm, exposed=step - compute,
                               hidden=share, hidden_raw=raw, measured_against=against, in_collectives=in_comm,
                               exposed_rounds=tuple(t - c for t, c in zip(merged.seconds[name],
                                                                          merged.seconds["compute"]))))
    r0 = per_rank[0]
    return OverlapRun(
        world_size=world_size, backend=r0["backend"], device=r0["device"], hidden=hidden, layers=layers,
        n_params=r0["n_params"], param_bytes=r0["param_bytes"], bucket_cap_bytes=int(bucket_cap_mb * 2**20),
        ddp_bucket_bytes=r0["ddp_bucket_bytes"], hook_bucket_bytes=r0["hook_bucket_bytes"],
        grad_max_diff={k: max(r["grad_max_diff"][k] for r in per_rank) for k in r0["grad_max_diff"]},
        grad_max=max(r["grad_max"] for r in per_rank), fsdp_collectives=r0["fsdp_collectives"],
        compute=compute, rounds=rounds, rows=rows,
        timeline=_relative_timeline(per_rank, chosen), per_round={k: list(v) for k, v in merged.seconds.items()},
    )
