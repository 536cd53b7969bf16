"""How often to save a recovery checkpoint: the time lost to saves and failures.

Times are in seconds. Pure Python (no torch); the saving itself is
:mod:`lessonlib.measure.recovery`.
"""
from __future__ import annotations

import math
import random

from ..checks import positive


def young_daly_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """Young's optimal time between recovery checkpoints, in seconds:
    ``sqrt(2 * checkpoint_seconds * mtbf_seconds)``.

    ``checkpoint_seconds`` is how long one save stalls training; ``mtbf_seconds``
    the mean time between failures of the whole job. It minimises
    :func:`expected_overhead` (Young 1974; Daly 2006 refines it for saves that
    are not small next to the MTBF). Raises ``ValueError`` for non-positive input.

    >>> young_daly_interval(300, 86400)   # 5-minute save, one failure a day: 2 hours
    7200.0
    """
    c = positive("checkpoint_seconds", checkpoint_seconds)
    m = positive("mtbf_seconds", mtbf_seconds)
    return math.sqrt(2.0 * c * m)


def expected_overhead(interval_seconds: float, checkpoint_seconds: float, mtbf_seconds: float,
                      restart_seconds: float = 0.0) -> float:
    """Expected time lost to checkpointing and failures, as a fraction of the
    useful work time (first order; 0.05 means the run takes 5 % longer).

    Over one interval of ``interval_seconds`` of useful work the job pays

    * ``checkpoint_seconds / interval_seconds``: the saves themselves (large
      when saving too often), and
    * ``(interval_seconds / 2 + restart_seconds) / mtbf_seconds``: a failure
      arrives on average half-way through an interval, so half an interval of
      work is redone, plus the restart (large when saving too rarely).

    The sum is a plain fraction; it is minimised at
    :func:`young_daly_interval`. Valid when the interval and the save are
    small next to the MTBF; :func:`simulate_overhead` checks it.
    ``restart_seconds`` may be zero; the others must be positive.
    """
    t = positive("interval_seconds", interval_seconds)
    c = positive("checkpoint_seconds", checkpoint_seconds)
    m = positive("mtbf_seconds", mtbf_seconds)
    if isinstance(restart_seconds, bool) or not isinstance(restart_seconds, (int, float)) \
            or not math.isfinite(restart_seconds) or restart_seconds < 0:
        raise ValueError(f"restart_seconds must be a non-negative number of seconds, got {restart_seconds!r}")
    return c / t + (t / 2.0 + restart_seconds) / m


def simulate_overhead(interval_seconds: float, checkpoint_seconds: float, mtbf_seconds: float,
                      work_seconds: float, restart_seconds: float = 0.0, trials: int = 200,
                      seed: int = 0) -> float:
    """Monte-Carlo measurement of the fraction of time lost, to compare with
    :func:`expected_overhead`.

    Simulates ``trials`` jobs that need ``work_seconds`` of useful work, save
    every ``interval_seconds`` of work (each save takes ``checkpoint_seconds``),
    and fail at exponentially distributed times with mean ``mtbf_seconds``
    (a failure loses the work since the last completed save and costs
    ``restart_seconds``). Returns the mean of (wall time − work) / work, the
    same quantity :func:`expected_overhead` approximates.
    """
    t = positive("interval_seconds", interval_seconds)
    c = positive("checkpoint_seconds", checkpoint_seconds)
    m = positive("mtbf_seconds", mtbf_seconds)
    w = positive("work_seconds", work_seconds)
    if restart_seconds < 0:
        raise ValueError(f"restart_seconds must be non-negative, got {restart_seconds!r}")
    if not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be a positive integer, got {trials!r}")
    rng = random.Random(seed)
    losses = []
    for _ in range(trials):
        wall, done = 0.0, 0.0
        next_failure = rng.expovariate(1.0 / m)
        while done < w:
            chunk = min(t, w - done)
            cost = chunk + (c if done + chunk < w else 0.0)  # no save after the last chunk
            if wall + cost <= next_failure:
                wall += cost
                done += chunk
            else:  # fail part-way: lose this chunk, restart, new failure clock
                wall = next_failure + restart_seconds
                next_failure = wall + rng.expovariate(1.0 / m)
        losses.append((wall - w) / w)
    return sum(losses) / len(losses)
