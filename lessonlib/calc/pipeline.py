"""Pipeline parallelism: the idle "bubble" of a synchronous pipeline schedule.

Times are in whatever unit the caller gives (e.g. seconds); fractions are
dimensionless. Pure Python (no torch).
"""
from __future__ import annotations

from ..checks import amount as _check_amount, count as _check_count, sequence as _check_sequence

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
    """Idle share of a schedule: 1 - busy time / (stages × makespan), dimensionless."""
    tasks = _check_sequence("tasks", tasks)
    for i, t in enumerate(tasks):
        if not isinstance(t, dict) or not {"stage", "start", "end"} <= set(t):
            raise TypeError(f"tasks[{i}] must be a dict with 'stage', 'start' and 'end', as pipeline_schedule "
                            f"gives, got {t!r:.80}")
        start = _check_amount(f"tasks[{i}]['start']", t["start"])
        if _check_amount(f"tasks[{i}]['end']", t["end"]) < start:
            raise ValueError(f"tasks[{i}] ends before it starts")
    stages = {t["stage"] for t in tasks}
    makespan = max(t["end"] for t in tasks) - min(t["start"] for t in tasks)
    busy = sum(t["end"] - t["start"] for t in tasks)
    if makespan == 0:
        raise ValueError("tasks take no time at all: the idle share is undefined")
    return 1.0 - busy / (len(stages) * makespan)
