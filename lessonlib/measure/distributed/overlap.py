"""Communication hidden behind compute, measured on torch.distributed's own engines.

:func:`run_overlap` starts ``world_size`` processes (gloo on CPU, NCCL with a GPU each) that train the same
stack of layers and time, round by round (:func:`lessonlib.measure.rounds.time_rounds`), one forward and backward
with its exchange, each way its ``engine`` names: always ``compute`` (DDP's ``no_sync()``: no exchange); DDP's
``sync_after`` (then one all-reduce of all gradients: nothing hidden), ``ddp`` (small buckets, ``bucket_cap_mb``,
each all-reduced during backward) and ``hooks`` (:func:`~lessonlib.measure.distributed.buckets.all_reduce_in_buckets`,
the same in a few readable lines), with one all-reduce of the gradient bytes alone (``allreduce``); or FSDP2's
``fsdp`` and ``fsdp_prefetch`` (``fully_shard`` per layer, with its defaults and with prefetch set by hand both
ways), with their collectives as ``CommDebugMode`` logged them replayed without compute (``fsdp_comm``).
Every ``sync_after`` and ``ddp`` step records its timeline (the figure's step is a round of the table); every
FSDP step its time inside its collectives. Seconds: per round, a step that exchanges runs from the later
process's start (after the barrier) to the last process's end, compute alone is the slower process's own time.
``OverlapRow`` keeps the fastest round (the least disturbed: the figure draws it) and every round's exposed time;
``OverlapRun.per_round`` every round, for the medians the pages print. Workers run in spawned processes.
"""
from __future__ import annotations

import contextlib
import copy
import statistics
import time
from dataclasses import dataclass, field

from ...checks import amount as _check_amount, choice as _check_choice, count as _check_count
from ...checks import positive as _check_positive
from ...calc.overlap import hidden_share
from ..compat import require_all
from ..rounds import Rounds, quartiles, time_rounds
from .buckets import MAX_SIZE, all_reduce_in_buckets, layer_stack
from .collectives import CollectiveLog, CollectiveTimer
from .launch import MAX_TIMEOUT, MAX_WORLD_SIZE, launch
from .quiet import known_warnings_silenced

__all__ = ["run_overlap", "OverlapRow", "OverlapRun", "VARIANTS", "ENGINES", "SEQUENTIAL"]
#: The variants timed, in table order: (name in the rounds, label, name of its communication alone).
#: DDP's three come first, FSDP2's two after (``ENGINES`` says which ``engine`` times which).
VARIANTS = (
    ("sync_after", "DDP no_sync + one all-reduce after backward", "allreduce"),
    ("ddp", "DDP, gradient buckets during backward", "allreduce"),
    ("hooks", "bucket hooks (all_reduce_in_buckets)", "allreduce"),
    ("fsdp", "FSDP2, default prefetch (in backward, the next layer's weights are fetched early)", "fsdp_comm"),
    ("fsdp_prefetch", "FSDP2, prefetch also set by hand for forward and backward", "fsdp_comm"),
)
#: ``run_overlap``'s ``engine``: the variants it times (compute alone is timed with either).
ENGINES = {"ddp": ("sync_after", "ddp", "hooks"), "fsdp": ("fsdp", "fsdp_prefetch")}
#: The capabilities (:mod:`lessonlib.measure.compat`) each engine needs: pages guard 3.5's FSDP2 run with them.
NEEDS = {"ddp": (), "fsdp": ("fully_shard", "comm_debug_mode")}


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


def _overlap_worker(rank, world_size, device, progress, hidden, layers, batch, bucket_cap_mb, rounds, warmup,
                    engine):
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
        fsdp = ({"fsdp": _fsdp(base, mesh, device, False), "fsdp_prefetch": _fsdp(base, mesh, device, True)}
                if engine == "fsdp" else {})
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
        diffs, hook_buckets, plans, replays = {}, [], {}, {}
        if engine == "ddp":
            traced_step(True)  # the step with one all-reduce after backward
            diffs["sync_after"] = (grads(ddp) - reference).abs().max().item()
            hook_buckets = hooks()
            diffs["hooks"] = (grads(hooked) - reference).abs().max().item()
        for name, model in fsdp.items():
            log = CollectiveLog()
            with log:
                fwd_bwd(model)
            plans[name] = [(r.kind, r.n_bytes) for r in log.records]
            diffs[name] = (grads(model) - reference).abs().max().item()
        if fsdp:  # prefetch changes when the all-gathers are issued, not which: one replay times both
            if sorted(plans["fsdp"]) != sorted(plans["fsdp_prefetch"]):
                raise RuntimeError(f"FSDP2 with prefetch issued other collectives: {plans}")
            replays = {"fsdp_comm": _replay(plans["fsdp"], world_size, device)}

        tick = (lambda: progress.put(1)) if rank == 0 else None

        # per round, warm-up included: each traced step's events
        events = {"sync_after": [], "ddp": []} if engine == "ddp" else {}
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
            cases = [("compute", compute)]
            if engine == "ddp":
                cases += [("sync_after", lambda: traced("sync_after", clock, True)),
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

    ``step``: forward + backward + the exchange; ``comm``: its communication alone; ``exposed`` = step −
    compute (the time the exchange added). ``hidden_raw`` = (sequential − step) / (sequential − compute), against
    the step that sends everything after backward (:data:`SEQUENTIAL`, named in ``measured_against``): the share
    of its exchange time this step saved (negative: longer), ``hidden`` that clipped to [0, 1]. FSDP's variants
    have no sequential counterpart: ``measured_against`` is ``""`` and the shares 0, not a measurement.
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
        return quartiles(self.exposed_rounds)


@dataclass
class OverlapRun:
    """What :func:`run_overlap` measured.

    ``hidden``, ``layers``: the width and depth of :func:`layer_stack` that ran.
    ``compute``: seconds of forward + backward with no exchange (fastest round).
    ``rows``: one :class:`OverlapRow` per variant the ``engine`` timed (:data:`ENGINES`), each with the
    one definition of the hidden share. ``param_bytes``: bytes of the parameters (float32);
    ``ddp_bucket_bytes``, ``hook_bucket_bytes``: each bucket's bytes in one step of DDP (recorded by a comm
    hook) and of :func:`all_reduce_in_buckets`. ``grad_max_diff``: per variant, the largest difference of its
    averaged gradient from DDP's (``grad_max``: the largest entry, for scale). ``fsdp_collectives``: per FSDP
    variant, the ``(kind, bytes)`` of each collective of one step. ``timeline``: rank by rank, per DDP variant,
    the step of its row's (fastest) round, seconds from the later rank's start: ``forward``, ``backward`` (until
    the last gradient was ready), ``end`` and ``comm`` (per bucket as started: ``start``, ``end``, ``bytes``).
    ``per_round``: every round of each case.
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

    def median(self, name: str) -> float:
        """Median seconds over the rounds of ``name`` (a variant, ``compute``, ``allreduce`` or ``fsdp_comm``)."""
        return statistics.median(self.per_round[name])


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
                rounds: int = 7, warmup: int = 1, world_size: int = 2, timeout: float = 180.0,
                engine: str = "ddp") -> OverlapRun:
    """Time DDP's (``engine="ddp"``) or FSDP2's (``"fsdp"``) overlap of communication with backward.

    ``engine`` picks the variants (:data:`ENGINES`; FSDP2's need ``fully_shard``, named by ``Unavailable``
    on a torch without). Each process runs :func:`layer_stack` (``layers`` blocks of width ``hidden``) on its
    own ``batch`` rows; DDP's buckets hold about ``bucket_cap_mb`` MiB (2**20 bytes). ``rounds`` timed rounds
    after ``warmup``. Returns an :class:`OverlapRun`; each row from its fastest round, so a row adds up:
    exposed = step − compute, hidden = (sequential − step) / (sequential − compute) for DDP's variants.
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
    engine = _check_choice("engine", engine, ENGINES)
    require_all(*NEEDS[engine])  # before starting processes: one clear error on an older torch
    if hidden % world_size:
        raise ValueError(f"hidden={hidden} does not divide evenly by world_size={world_size} (FSDP shards rows)")
    per_rank = launch(_overlap_worker, world_size, args=(hidden, layers, batch, bucket_cap_mb, rounds, warmup, engine),
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
    serial = fastest.get(SEQUENTIAL, 0.0)
    # the round each step comes from (the fastest), and in it the process that started last: its own time lies
    # inside the step's, so what it spent inside its collectives is part of the step
    chosen = {name: merged.seconds[name].index(fastest[name]) for name in merged.seconds}
    later = {name: max(range(world_size), key=lambda k: per_rank[k]["spans"][name][chosen[name]][0])
             for name in per_rank[0]["spans"]}
    for name, label, comm_name in [v for v in VARIANTS if v[0] in ENGINES[engine]]:
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
