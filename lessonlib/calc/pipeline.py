"""Pipeline parallelism: the idle "bubble" of a synchronous pipeline schedule.

Times are in whatever unit the caller gives (e.g. seconds); fractions are
dimensionless. Pure Python (no torch).
"""
from __future__ import annotations

import re
from statistics import median
from dataclasses import dataclass

from ..checks import reads as _reads
from ..checks import (amount as _check_amount, choice as _check_choice, count as _check_count,
                      mapping as _check_mapping, sequence as _check_sequence)

#: The largest schedule :func:`pipeline_schedule` works out: stages × micro-batches
#: (it builds two tasks for each, as Python dicts, for drawing and checking).
MAX_TASK_PAIRS = 100_000


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


def boundary_bytes(seq_len, batch, hidden, bytes_per_value: int = 2) -> int:
    """Bytes one micro-batch sends across one stage boundary, each way (a count of bytes).

    Forward, the last layer of a stage hands the next stage its output, ``batch x seq_len x hidden``
    values of ``bytes_per_value`` bytes; backward, the gradient of that output, the same size, comes
    back. Point-to-point, to the neighbouring stage only.

    >>> boundary_bytes(8192, 1, 16384)  # one 8K-token sequence of a 16,384-wide model in bf16: 256 MiB
    268435456
    """
    s = _check_count("seq_len", seq_len)
    b = _check_count("batch", batch)
    h = _check_count("hidden", hidden)
    e = _check_count("bytes_per_value", bytes_per_value, maximum=8)
    return b * s * h * e


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
    if p * m > MAX_TASK_PAIRS:
        raise ValueError(f"stages × microbatches = {p * m:,} is more than this schedule's limit of "
                         f"{MAX_TASK_PAIRS:,}; pipeline_bubble_fraction gives the bubble of any size")
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
    """Idle share of a schedule: 1 - busy time / (rows × makespan), dimensionless.

    A row is a task's ``"process"`` where it has one (:func:`simulate_actions`), else its ``"stage"``.
    """
    tasks = _check_sequence("tasks", tasks)
    for i, t in enumerate(tasks):
        if not isinstance(t, dict) or not {"start", "end"} <= set(t) or not ({"stage", "process"} & set(t)):
            raise TypeError(f"tasks[{i}] must be a dict with 'stage' (or 'process'), 'start' and 'end', as "
                            f"pipeline_schedule and simulate_actions give, got {t!r:.80}")
        start = _check_amount(f"tasks[{i}]['start']", t["start"])
        if _check_amount(f"tasks[{i}]['end']", t["end"]) < start:
            raise ValueError(f"tasks[{i}] ends before it starts")
    stages = {t["process"] if "process" in t else t["stage"] for t in tasks}  # one row per process (a process may hold several stages)
    makespan = max(t["end"] for t in tasks) - min(t["start"] for t in tasks)
    busy = sum(t["end"] - t["start"] for t in tasks)
    if makespan == 0:
        raise ValueError("tasks take no time at all: the idle share is undefined")
    return 1.0 - busy / (len(stages) * makespan)


def interleaved_bubble_fraction(world_size, microbatches, stages_per_device, of: str = "step") -> float:
    """Idle share of interleaved 1F1B: ``v`` stages per device, ``p`` devices, ``m`` micro-batches.

    Each device holds ``v`` stages of ``1/v`` of its layers, so filling and
    draining the pipeline costs ``(p - 1)`` slots of ``1/v`` of a micro-batch's
    work (Narayanan et al., 2021). Two denominators are in use:

    * ``of="work"``: idle time / useful time = ``(p - 1) / (v·m)``, the paper's form;
    * ``of="step"``: idle time / the whole step = ``(p - 1) / (v·m + p - 1)``,
      the share a timeline shows (the same convention as
      :func:`pipeline_bubble_fraction`, which this is at ``v = 1``).

    An idealised figure: equal stages, free transfers (dimensionless).

    >>> interleaved_bubble_fraction(2, 4, 2, of="work")
    0.125
    >>> round(interleaved_bubble_fraction(2, 4, 2), 4)
    0.1111
    """
    p = _check_count("world_size", world_size)
    m = _check_count("microbatches", microbatches)
    v = _check_count("stages_per_device", stages_per_device, maximum=10**6)
    of = _check_choice("of", of, ("step", "work"))
    return (p - 1) / (v * m) if of == "work" else (p - 1) / (v * m + p - 1)


def dualpipe_bubble_work_fraction(stages, microbatches, forward=1.0, backward=2.0, weight=1.0) -> float:
    """DualPipe's bubble over the useful time, from DeepSeek-V3's report (Table 2), dimensionless.

    The report gives DualPipe's bubble as ``(p/2 - 1)(F&B + B - 3W)`` against 1F1B's
    ``(p - 1)(F + B)``: ``F`` a forward chunk's time, ``B`` a full backward chunk's, ``W`` its
    weight-gradient part, ``F&B`` a forward and a backward chunk run overlapped (their compute
    adds, ``F + B``: the overlap hides communication, not computation). Divided by the useful
    time of ``m`` micro-batches, ``m (F + B)``. With a backward twice a forward and ``W`` half of
    it: ``(p/2 - 1) · 2 / (3 m)``, two thirds of the ``(p/2 - 1)/m`` one gets by reading the bracket as ``F + B``.

    >>> round(dualpipe_bubble_work_fraction(16, 60), 4)  # DeepSeek-V3's 16 stages
    0.0778
    """
    p = _check_count("stages", stages)
    m = _check_count("microbatches", microbatches)
    f = _check_amount("forward", forward, allow_zero=False)
    b = _check_amount("backward", backward, allow_zero=False)
    w = _check_amount("weight", weight)
    if p % 2:
        raise ValueError(f"stages must be even for DualPipe (its two directions share the stages), got {p}")
    if w > b:
        raise ValueError(f"weight ({w}) is part of backward ({b}): it cannot be larger")
    return (p / 2 - 1) * max(0.0, (f + b) + b - 3 * w) / (m * (f + b))


_ACTION = re.compile(r"^(\d+)(F|B|I|W)(\d+)$")
#: The most actions :func:`simulate_actions` schedules.
MAX_ACTIONS = 200_000


def parse_action(action):
    """``"2I0"`` (torch's way to write an action: stage 2, input-gradient backward, micro-batch 0) ->
    ``(2, "I", 0)``; ``None`` (an empty slot) and non-compute actions such as ``"0REDUCE_GRAD"`` -> ``None``.

    Kinds: ``F`` forward, ``B`` full backward, ``I`` backward for the input gradient only,
    ``W`` backward for the weight gradient only.

    >>> parse_action("2I0"), parse_action(None), parse_action("1REDUCE_GRAD")
    ((2, 'I', 0), None, None)
    """
    if action is None:
        return None
    if not isinstance(action, str):
        raise TypeError(f"action must be a string such as '0F1' or None, got {action!r:.60}")
    if "REDUCE_GRAD" in action or "SEND" in action or "RECV" in action or "SHARD" in action:
        return None
    hit = _ACTION.match(action)
    if hit is None:
        raise ValueError(f"action must look like '<stage><F|B|I|W><microbatch>', e.g. '0F1', got {action!r:.60}")
    return int(hit[1]), hit[2], int(hit[3])


def _actions(actions) -> dict:
    acts = _check_mapping("actions", actions)
    out = {}
    for r, lst in acts.items():
        rank = _check_count("actions (a process)", r, minimum=0, maximum=10**6)
        out[rank] = [a for a in (parse_action(x) for x in _check_sequence(f"actions[{r}]", lst, allow_empty=True)) if a]
    if sum(len(v) for v in out.values()) > MAX_ACTIONS:
        raise ValueError(f"actions hold more than {MAX_ACTIONS:,} compute actions")
    if not any(out.values()):
        raise ValueError("actions hold no compute action")
    return out


def simulate_actions(actions, durations) -> list:
    """Run each process's action list in order, every action as early as its inputs allow.

    ``actions`` maps a process to its list of actions as torch writes them
    (``"0F1"``, ``"3I0"``, ``None`` for an empty slot), e.g. a schedule's
    ``pipeline_order``. ``durations`` maps a kind (``"F"``, ``"B"``, ``"I"``,
    ``"W"``) to its time, the same for every stage (the idealised equal-stage
    pipeline), or ``(stage, kind, microbatch)`` to the time of that one action
    (a replay of measured times); seconds or any unit. Dependencies: a forward
    needs the previous stage's forward of that micro-batch; a backward
    (``B`` or ``I``) needs its own forward and the next stage's backward of the
    micro-batch (the last stage: its own forward, which computes the loss); a
    ``W`` needs its ``I``. Transfers take no time.

    Returns task dicts ``{"process", "stage_index", "kind", "microbatch", "start", "end"}``
    for :func:`schedule_idle_fraction` and :func:`peak_in_flight`.
    """
    acts = _actions(actions)
    durs = _check_mapping("durations", durations)
    for k, d in durs.items():
        _check_amount(f"durations[{k!r}]", d)
    last = max(a[0] for lst in acts.values() for a in lst)
    done: dict = {}
    free = {r: 0.0 for r in acts}
    pos = {r: 0 for r in acts}
    tasks = []

    def needs(stage, kind, mb):
        if kind == "F":  # a forward needs the previous stage's output for this micro-batch
            return [(stage - 1, "F", mb)] if stage > 0 else []
        if kind == "W":  # a weight gradient needs the input gradient pass of its own stage
            return [(stage, "I", mb)]
        # a backward (B or I) needs its own forward, and the gradient from the next stage's backward: listed as
        # "B", which end_of reads as that stage's I when the schedule split its backward
        return [(stage, "F", mb)] + ([(stage + 1, "B", mb)] if stage < last else [])

    def end_of(key):  # a later stage's backward is B or I, whichever the schedule ran
        if key in done:
            return done[key]
        if key[1] == "B":
            return done.get((key[0], "I", key[2]))
        return None

    remaining = sum(len(v) for v in acts.values())
    while remaining:
        moved = False
        for r, lst in acts.items():
            while pos[r] < len(lst):
                stage, kind, mb = lst[pos[r]]
                ends = [end_of(k) for k in needs(stage, kind, mb)]
                if any(e is None for e in ends):
                    break
                d = durs.get((stage, kind, mb), durs.get(kind))
                if d is None:
                    raise ValueError(f"durations has no time for {stage}{kind}{mb} (give its kind or the action)")
                start = max([free[r], *ends])
                done[(stage, kind, mb)] = free[r] = start + d
                tasks.append({"process": r, "stage_index": stage, "kind": kind, "microbatch": mb,
                              "start": start, "end": start + d})
                pos[r] += 1
                remaining -= 1
                moved = True
        if not moved:
            stuck = {r: f"{lst[pos[r]][0]}{lst[pos[r]][1]}{lst[pos[r]][2]}" for r, lst in acts.items() if pos[r] < len(lst)}
            raise ValueError(f"actions cannot all run: each process waits for an action that never comes ({stuck})")
    return tasks


def peak_in_flight(actions, chunk_bytes=None) -> dict:
    """Per process, the most (stage, micro-batch) chunks whose activations are held at once.

    A chunk is held from its forward until its last backward pass: ``B``,
    or ``W`` when the backward is split (the weight gradient needs the
    stage's inputs). ``actions`` as for :func:`simulate_actions`. Without
    ``chunk_bytes`` the count is in chunks (one stage's activations for one
    micro-batch); with it (a mapping stage -> bytes one micro-batch keeps on
    that stage) the peak is in bytes.

    >>> peak_in_flight({0: ["0F0", "0F1", "0B0", "0B1"], 1: ["1F0", "1B0", "1F1", "1B1"]})
    {0: 2, 1: 1}
    """
    acts = _actions(actions)
    size = None
    if chunk_bytes is not None:
        size = {_check_count("chunk_bytes (a stage)", k, minimum=0): _check_amount(f"chunk_bytes[{k}]", b)
                for k, b in _check_mapping("chunk_bytes", chunk_bytes).items()}
        missing = sorted({a[0] for lst in acts.values() for a in lst} - set(size))
        if missing:
            raise ValueError(f"chunk_bytes has no bytes for stage(s) {missing}")
    out = {}
    for r, lst in acts.items():
        split = {(s, mb) for s, k, mb in lst if k == "W"}
        held = peak = 0
        for s, k, mb in lst:
            one = 1 if size is None else size[s]
            if k == "F":
                held += one
                peak = max(peak, held)
            elif k == "W" or (k == "B" and (s, mb) not in split):
                held -= one
        out[r] = peak
    return out


#: Idealised action times for :func:`read_schedule`: a backward costs two forwards, split evenly into
#: its input-gradient and weight-gradient passes (B = I + W).
EQUAL_STAGE_TIMES = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}


@dataclass(frozen=True)
class ScheduleReading:
    """One recorded pipeline step read against the schedule's dependencies (shares dimensionless).

    ``order``: per process, the actions in the order they ran (``"2F0"``);
    ``measured_idle``: 1 - busy / (processes × step), from the timestamps;
    ``replay_idle``: the same actions, each with its own measured time, every
    one started as soon as its inputs and its process allow (transfers free):
    no real run of those actions can idle less, so it is a lower bound on
    ``measured_idle``; ``fixed_stage_idle``: the same order with every action of a stage and kind
    taking that stage's median measured time for the kind (unequal stages, but no call varying
    from one micro-batch to the next: for GPipe, and for 1F1B with more micro-batches than stages,
    it never idles less than the equal-stage figure, since the slowest stage sets the pace; so a
    replay below that figure comes from the calls' variation and rounding); ``equal_stage_idle``: the same order with
    :data:`EQUAL_STAGE_TIMES` on every stage (the idealised figure the bubble
    formulas give); ``peak_chunks``: per process, the most stage micro-batches
    held at once (:func:`peak_in_flight`).
    """

    order: dict
    measured_idle: float
    replay_idle: float
    fixed_stage_idle: float
    equal_stage_idle: float
    peak_chunks: dict


@_reads("spans")
def read_schedule(spans) -> ScheduleReading:
    """Read one step's spans (per process, ``(kind, microbatch, start_s, end_s, stage)``) as a schedule."""
    per = [_check_sequence("spans", r) for r in _check_sequence("spans", spans)]
    order, durations, tasks = {}, {}, []
    for proc, rows in enumerate(per):
        ran = sorted(rows, key=lambda s: s[2])
        for kind, mb, a, b, stage in ran:
            durations[(stage, kind, mb)] = b - a
            tasks.append({"process": proc, "start": a, "end": b})
        order[proc] = [f"{stage}{kind}{mb}" for kind, mb, _, _, stage in ran]
    measured = schedule_idle_fraction(tasks)
    replay = schedule_idle_fraction(simulate_actions(order, durations))
    by_kind: dict = {}
    for (stage, kind, _), d in durations.items():
        by_kind.setdefault((stage, kind), []).append(d)
    typical = {key: median(ds) for key, ds in by_kind.items()}
    fixed = schedule_idle_fraction(simulate_actions(order, {k: typical[(k[0], k[1])] for k in durations}))
    equal = schedule_idle_fraction(simulate_actions(order, EQUAL_STAGE_TIMES))
    return ScheduleReading(order, measured, replay, fixed, equal, peak_in_flight(order))
