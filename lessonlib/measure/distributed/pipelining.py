"""Pipeline parallelism with ``torch.distributed.pipelining``, timed and weighed.

:func:`run_pipelines` starts processes; each holds one *stage*
(a few ``Linear + ReLU`` layers) of a model, or ``v`` stages for the
interleaved and zero-bubble schedules, and runs PyTorch's own schedules:
``ScheduleGPipe`` (all forwards, then all backwards), ``Schedule1F1B``
(after a warm-up, forwards and backwards alternate), ``ScheduleInterleaved1F1B``
(1F1B with ``v`` stages per process, placed in a loop: stage ``k·p + rank``),
``ScheduleInterleavedZeroBubble`` (the same placement, backward split into an
input-gradient pass ``I`` and a weight-gradient pass ``W``) and
``ScheduleZBVZeroBubble`` (two stages per process placed in a V: ``rank`` and
``2p - 1 - rank``, backward split too). Nothing here simulates a schedule:
PyTorch decides the order, and two things are recorded while it runs:

* **when each stage computes**: the stage's ``forward_one_chunk``,
  ``backward_one_chunk`` and ``backward_weight_one_chunk`` (the calls a
  schedule makes for one micro-batch) are wrapped to take a timestamp before
  and after; everything else, waiting for a neighbour's activations or
  gradients included, is idle time;
* **how many activation bytes each stage keeps** at any moment:
  :class:`LiveSavedBytes` counts every tensor autograd saves for backward
  from the moment it is saved until autograd frees it, and keeps the peak.
"""
from __future__ import annotations

from ...checks import reads as _reads

import time

from ...checks import count as check_count, instance as check_instance, mapping as check_mapping, \
    sequence as check_sequence
from ..compat import require_all
from .launch import launch
from .quiet import known_warnings_silenced

__all__ = ["LiveSavedBytes", "stage_module", "stage_indices", "run_pipelines", "idle_share"]

SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZB", "ZBV")
#: Schedules that run several stages per process (``stages_per_process``); the others run one stage
#: per process holding the same layers (``stages_per_process × layers`` of them).
MULTI_STAGE = ("Interleaved1F1B", "InterleavedZB", "ZBV")


class _Held:
    """What autograd stores instead of a saved tensor; its deletion marks the tensor freed."""

    __slots__ = ("owner", "key", "tensor")

    def __init__(self, owner, key, tensor):
        self.owner, self.key, self.tensor = owner, key, tensor

    def __del__(self):
        self.owner._release(self.key)


class LiveSavedBytes:
    """Bytes of activations saved for backward that are alive now, and the peak, per process.

    A context manager around ``torch.autograd.graph.saved_tensors_hooks``: the
    pack hook wraps each saved tensor in a small holder and counts its storage
    (once per storage, however many holders share it); when autograd drops
    the last holder of a storage (after the backward that used it, or when
    the graph is freed) its bytes are subtracted. ``exclude`` lists tensors
    not to count (the parameters, the input batch: they exist anyway).
    ``.live`` and ``.peak`` are bytes.

    The holder keeps a detached view (same storage), never the tensor itself: a ReLU saves its own
    output, and a holder of that tensor would hold its ``grad_fn``, the node that holds the holder, a
    cycle Python's garbage collector cannot see. A full backward breaks it by freeing the node's saved
    tensors; a split backward (``I`` keeps the graph, ``W`` runs only the weights' part) never does, so
    under ZBV every ReLU output but a stage's last would stay alive (and counted) after the step.
    """

    def __init__(self, exclude=()):
        import torch

        tensors = [check_instance("exclude", t, torch.Tensor, "a list of tensors")
                   for t in check_sequence("exclude", exclude, allow_empty=True)]
        self._exclude = {t.untyped_storage().data_ptr() for t in tensors}
        self._refs: dict = {}
        self.live = 0
        self.peak = 0

    def _pack(self, t):
        # _exclude: storages not counted (parameters, input batch); _refs: address -> [holders, bytes]
        # _Held: what autograd keeps instead of t; deleting it calls _release, which subtracts the bytes
        key = t.untyped_storage().data_ptr()
        if key in self._exclude or t.numel() == 0:
            return t
        entry = self._refs.get(key)
        if entry is None:
            n = t.untyped_storage().nbytes()
            self._refs[key] = [1, n]
            self.live += n
            self.peak = max(self.peak, self.live)
        else:
            entry[0] += 1
        return _Held(self, key, t.detach())  # detached: see the class docstring

    @staticmethod
    def _unpack(h):
        return h.tensor if isinstance(h, _Held) else h

    def _release(self, key):
        entry = self._refs.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self._refs[key]

    def __enter__(self):
        import torch

        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def stage_module(hidden: int, layers: int):
    """One pipeline stage: ``layers`` × (``Linear(hidden, hidden)``, ``ReLU``)."""
    from torch import nn

    from ..models import MAX_LAYERS, MAX_PARAMS

    layers = check_count("layers", layers, maximum=MAX_LAYERS)
    hidden = check_count("hidden", hidden)
    if layers * hidden * hidden > MAX_PARAMS:
        raise ValueError(f"layers={layers} of hidden={hidden} give more than the {MAX_PARAMS:,} parameters "
                         "the course's models allow")
    mods = []
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*mods)


def _timed(fn, kind, spans, device, stage_index):
    """Wrap a stage's per-micro-batch call to record ``(kind, microbatch, start, end, stage_index)``.

    A backward called with ``full_backward=False`` computes only the input gradient: kind ``I``.
    On CUDA it synchronises before the first timestamp too: an NCCL receive's ``wait()`` does not block the
    host, so without it the clock would start before the received activation arrives.
    """
    import torch

    def inner(chunk, *args, **kwargs):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = fn(chunk, *args, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        k = "I" if kind == "B" and kwargs.get("full_backward", True) is False else kind
        spans.append((k, chunk, t0, time.perf_counter(), stage_index))
        return out
    return inner


def stage_indices(schedule: str, rank: int, world_size: int, stages_per_process: int) -> list:
    """The pipeline stages process ``rank`` holds: ``[rank]`` for one stage per process, a loop
    ``rank, rank + p, ...`` for the interleaved schedules, a V ``rank, 2p - 1 - rank`` for ZBV."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
    p = check_count("world_size", world_size)
    rank = check_count("rank", rank, minimum=0, maximum=p - 1)
    v = check_count("stages_per_process", stages_per_process, maximum=64)
    if schedule not in MULTI_STAGE:
        return [rank]
    if schedule == "ZBV":
        if v != 2:
            raise ValueError(f"ZBV holds exactly 2 stages per process, got stages_per_process={v}")
        return [rank, 2 * p - 1 - rank]
    return [rank + k * p for k in range(v)]


def _build(name, rank, n, v, device, group, hidden, layers):
    """This process's PipelineStage(s) for schedule ``name``, and the modules they hold."""
    import torch
    from torch.distributed.pipelining import PipelineStage

    idx = stage_indices(name, rank, n, v)
    mods = []
    for i in idx:
        torch.manual_seed(1000 + i)  # each stage has its own layers
        mods.append(stage_module(hidden, layers if name in MULTI_STAGE else layers * v).to(device))
    total = n * v if name in MULTI_STAGE else n
    stages = [PipelineStage(mod, i, total, device, group=group) for mod, i in zip(mods, idx)]
    return stages, mods, idx, total


def _run_schedules(rank, n, group, device, progress, configs, hidden, layers, rows, reps, v=1):
    """Ranks 0..n-1 of ``group`` run each ``(schedule, m)`` of ``configs``.

    The steps are interleaved: every configuration is built first, then each round runs one step of
    each in turn, so a change in the machine's load (other programs, a throttled core) falls on every
    schedule alike instead of on whichever happened to run last.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed import pipelining as pl

    classes = {"GPipe": pl.ScheduleGPipe, "1F1B": pl.Schedule1F1B, "Interleaved1F1B": pl.ScheduleInterleaved1F1B,
               "InterleavedZB": pl.ScheduleInterleavedZeroBubble, "ZBV": pl.ScheduleZBVZeroBubble}
    built = []
    for name, m in configs:
        stages, mods, idx, total = _build(name, rank, n, v, device, group, hidden, layers)
        spans: list = []
        for st, i in zip(stages, idx):
            st.forward_one_chunk = _timed(st.forward_one_chunk, "F", spans, device, i)
            st.backward_one_chunk = _timed(st.backward_one_chunk, "B", spans, device, i)
            st.backward_weight_one_chunk = _timed(st.backward_weight_one_chunk, "W", spans, device, i)
        schedule = classes[name](stages if name in MULTI_STAGE else stages[0], n_microbatches=m, loss_fn=F.mse_loss)
        order = getattr(schedule, "pipeline_order", None) or {}
        actions = {int(r): [None if a is None else str(a) for a in acts] for r, acts in order.items()}
        g = torch.Generator().manual_seed(7)
        x = torch.randn(m * rows, hidden, generator=g).to(device)
        y = torch.randn(m * rows, hidden, generator=g).to(device)
        params = [q for mod in mods for q in mod.parameters()]
        args = (x,) if 0 in idx else ()
        kwargs = {"target": y} if total - 1 in idx else {}
        built.append((schedule, mods, spans, actions, [*params, x, y], args, kwargs))
    results = [[] for _ in configs]
    # the schedules wait for their sends and receives through this one function: time each wait
    waits: list = []
    waited = getattr(pl.schedules, "_wait_batch_p2p", None)

    def timed_wait(work):
        t0 = time.perf_counter()
        waited(work)
        if work:
            waits.append((t0, time.perf_counter()))
    if waited is not None:
        pl.schedules._wait_batch_p2p = timed_wait
    try:
        _steps(built, results, reps, rank, group, waits if waited else None, progress)
    finally:
        if waited is not None:
            pl.schedules._wait_batch_p2p = waited
    return results


def _steps(built, results, reps, rank, group, waits, progress):
    """One unmeasured round, then ``reps`` measured rounds of every built configuration, in turn."""
    import torch.distributed as dist

    for rep in range(reps + 1):  # the first round sets the stages up: not measured
        for j, (schedule, mods, spans, actions, exclude, args, kwargs) in enumerate(built):
            spans.clear()
            if waits is not None:
                waits.clear()
            for mod in mods:
                mod.zero_grad(set_to_none=True)
            counter = LiveSavedBytes(exclude=exclude)
            dist.barrier(group=group)
            with counter:
                schedule.step(*args, **kwargs)
            for mod in mods:  # this configuration's gradients are not needed again: free them
                mod.zero_grad(set_to_none=True)
            if rep > 0:
                results[j].append({"spans": list(spans), "peak_bytes": counter.peak, "left_bytes": counter.live,
                                   "actions": actions if rank == 0 else None, "waits": None if waits is None else list(waits)})
            if rep == reps:
                progress.put(1)


def _pipeline_worker(rank, world_size, device, progress, specs):
    import torch.distributed as dist

    out = []
    with known_warnings_silenced():
        for spec in specs:
            n = spec["world_size"]
            # new_group is collective: every process creates it, only ranks 0..n-1 use it
            group = dist.new_group(list(range(n))) if n < world_size else None
            if rank < n:
                out.append(_run_schedules(rank, n, group, device, progress, spec["configs"], spec["hidden"],
                                          spec["layers"], spec["rows"], spec["reps"], spec["stages_per_process"]))
            else:
                out.append(None)
            dist.barrier()  # the others wait here, using no CPU, until the run is over
    return {"rank": rank, "backend": dist.get_backend(), "runs": out}


@_reads("per_rank_spans")
def idle_share(per_rank_spans) -> float:
    """1 - busy time / (processes × makespan) for one step, from each process's spans.

    A span is ``(kind, mb, start, end)`` or ``(kind, mb, start, end, stage_index)``, seconds.

    The makespan runs from the first compute on any stage to the last (the
    clock is the machine's monotonic clock, shared by its processes).
    """
    per_rank = [check_sequence("per_rank_spans", r, allow_empty=True)
                 for r in check_sequence("per_rank_spans", per_rank_spans)]
    spans = [s for rank_spans in per_rank for s in rank_spans]
    if not spans:
        raise ValueError("per_rank_spans holds no spans")
    for s in spans:
        if not isinstance(s, (list, tuple)) or len(s) not in (4, 5):
            raise ValueError(f"per_rank_spans must hold (kind, microbatch, start, end[, stage]) spans, got {s!r}")
    start = min(s[2] for s in spans)
    end = max(s[3] for s in spans)
    busy = sum(s[3] - s[2] for s in spans)
    if end <= start:
        raise ValueError("per_rank_spans must span some time (every span starts where it ends)")
    return 1.0 - busy / (len(per_rank) * (end - start))


def _wait_share(spans, waits) -> float:
    """Time blocked in the schedule's waits for sends and receives, inside the step, over processes × step
    (None where this torch's schedules have no ``_wait_batch_p2p`` to time)."""
    if any(w is None for w in waits):
        return None
    every = [s for rank_spans in spans for s in rank_spans]
    start, end = min(s[2] for s in every), max(s[3] for s in every)
    inside = sum(max(0.0, min(b, end) - max(a, start)) for rank_waits in waits for a, b in rank_waits)
    return inside / (len(spans) * (end - start))


def _spec(world_size, microbatches, schedules, hidden, layers, rows, reps, stages_per_process) -> dict:
    from .launch import MAX_WORLD_SIZE

    world_size = check_count("world_size", world_size, minimum=2, maximum=MAX_WORLD_SIZE)
    ms = [check_count("microbatches", m, maximum=1024) for m in check_sequence("microbatches", microbatches)]
    for s in check_sequence("schedules", schedules):
        if s not in SCHEDULES:
            raise ValueError(f"unknown schedule {s!r}; choose from {', '.join(SCHEDULES)}")
    from ..models import MAX_LAYERS, MAX_PARAMS

    v = check_count("stages_per_process", stages_per_process, maximum=8)
    if v > 1 and "ZBV" in schedules and v != 2:
        raise ValueError(f"ZBV holds exactly 2 stages per process, got stages_per_process={v}")
    if v == 1 and any(s in MULTI_STAGE for s in schedules):
        raise ValueError("the interleaved and zero-bubble schedules need stages_per_process >= 2")
    # 1F1B-like schedules need m >= world_size; the flexible interleaved ones need m a multiple of the rounds
    configs = [(s, m) for s in schedules for m in ms
               if (s == "GPipe" or m >= world_size) and (s not in MULTI_STAGE or m % max(1, m // world_size) == 0)]
    if not configs:
        raise ValueError(f"no schedule of {list(schedules)} runs with microbatches={ms} on world_size={world_size}")
    hidden, layers = check_count("hidden", hidden), check_count("layers", layers, maximum=MAX_LAYERS)
    if layers * hidden * hidden > MAX_PARAMS:
        raise ValueError(f"layers={layers} of hidden={hidden} give more than the {MAX_PARAMS:,} parameters "
                         "the course's models allow")
    return {"world_size": world_size, "configs": configs, "hidden": hidden, "layers": layers,
            "rows": check_count("rows", rows, maximum=1_000_000), "reps": check_count("reps", reps, maximum=100),
            "stages_per_process": v}


def run_pipelines(specs, timeout: float = 240.0) -> list:
    """Run PyTorch's schedules on real processes; measured busy spans and activation peaks, one result per spec.

    ``specs`` is a list of dicts, one per pipeline: ``world_size`` (stages,
    one process each), ``microbatches`` (the counts m to run), and optionally
    ``schedules`` (of :data:`SCHEDULES`; default GPipe and 1F1B), ``hidden``,
    ``layers`` (each stage is :func:`stage_module`), ``rows`` (examples per
    micro-batch, the same for every m, so the work per micro-batch does not
    change), ``reps`` (measured steps after one unmeasured set-up step) and
    ``stages_per_process`` ``v`` (the interleaved and zero-bubble schedules
    hold ``v`` stages of ``layers`` layers per process, :func:`stage_indices`;
    GPipe and 1F1B then hold one stage of ``v × layers`` layers, the same
    model). All but GPipe need m >= world_size; smaller m run with GPipe only. One launch of
    ``max(world_size)`` processes serves every spec (each start costs
    seconds); a pipeline on fewer processes uses ranks 0..n-1 while the
    others wait.

    Each result is ``{"world_size", "backend", "runs": [...]}``; each run is
    ``{"schedule", "microbatches", "steps": [...]}`` and each step has
    ``spans`` (per rank, ``(kind, microbatch, start_s, end_s, stage_index)``,
    kind ``F``, ``B``, or ``I`` and ``W`` for a backward split into its input-
    and weight-gradient passes, seconds on the machine's monotonic clock,
    shared by its processes), ``actions`` (the schedule's own
    ``pipeline_order``: per rank, the compute actions in order, as torch
    writes them, e.g. ``"2F0"`` = stage 2, forward, micro-batch 0), ``idle_share``
    (:func:`idle_share`), ``wait_share`` (of the same whole, the time blocked waiting for a
    send or receive to finish: the rest of the idle time is the schedule's own code between calls),
    ``peak_bytes`` (per rank: the most activation bytes
    alive at once) and ``left_bytes`` (per rank, after the step: 0 when every
    activation was freed).
    """
    defaults = dict(schedules=("GPipe", "1F1B"), hidden=512, layers=4, rows=64, reps=2, stages_per_process=1)
    checked = []
    for i, spec in enumerate(check_sequence("specs", specs)):
        spec = check_mapping(f"specs[{i}]", spec)
        unknown = sorted(map(str, set(spec) - set(defaults) - {"world_size", "microbatches"}))
        missing = sorted({"world_size", "microbatches"} - set(spec))
        if unknown or missing:
            raise ValueError(f"specs[{i}] " + (f"has unknown keys {unknown}" if unknown else f"lacks {missing}")
                             + "; it takes world_size, microbatches and optionally " + ", ".join(defaults))
        try:
            checked.append(_spec(**{**defaults, **spec}))
        except (ValueError, TypeError) as err:
            raise type(err)(f"specs[{i}]: {err}") from None
    world_size = max(s["world_size"] for s in checked)
    require_all('pipeline_stage')  # before starting processes: one clear error on an older torch
    per_rank = launch(_pipeline_worker, world_size, args=(checked,), timeout=timeout,
                      progress_total=sum(s["world_size"] * len(s["configs"]) for s in checked),
                      desc=f"pipelines on {world_size} processes")
    results = []
    for j, spec in enumerate(checked):
        n = spec["world_size"]
        runs = []
        for i, (name, m) in enumerate(spec["configs"]):
            steps = []
            for k in range(spec["reps"]):
                at = [per_rank[r]["runs"][j][i][k] for r in range(n)]
                spans = [a["spans"] for a in at]
                steps.append({"spans": spans, "idle_share": idle_share(spans), "actions": at[0]["actions"],
                              "wait_share": _wait_share(spans, [a["waits"] for a in at]),
                              "peak_bytes": [a["peak_bytes"] for a in at],
                              "left_bytes": [a["left_bytes"] for a in at]})
            runs.append({"schedule": name, "microbatches": m, "steps": steps})
        results.append({"world_size": n, "backend": per_rank[0]["backend"], "rows": spec["rows"],
                        "hidden": spec["hidden"], "layers": spec["layers"],
                        "stages_per_process": spec["stages_per_process"], "runs": runs})
    return results
