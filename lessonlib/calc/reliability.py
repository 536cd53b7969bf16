"""How often to save a recovery checkpoint: the time lost to saves and failures.

Times are in seconds. Pure Python (no torch); the saving itself is
:mod:`lessonlib.measure.recovery`.
"""
from __future__ import annotations

import math
import random

from ..checks import amount, count, positive

#: The most simulated events (completed chunks plus failures) :func:`simulate_overhead`
#: runs: about a second of pure Python. Beyond it the call is refused, not left to run.
MAX_EVENTS = 2_000_000


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
    restart_seconds = amount("restart_seconds", restart_seconds)
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

    The simulation has a stated size limit: its expected number of events,
    ``trials × chunks × e^((interval + save) / MTBF)`` (a chunk of work and
    its save complete only when no failure falls inside them), must stay
    below :data:`MAX_EVENTS`. A save that is long next to the MTBF (often two
    arguments swapped) is refused at once with a ``ValueError`` saying so,
    instead of running for ever.
    """
    t = positive("interval_seconds", interval_seconds)
    c = positive("checkpoint_seconds", checkpoint_seconds)
    m = positive("mtbf_seconds", mtbf_seconds)
    w = positive("work_seconds", work_seconds)
    restart_seconds = amount("restart_seconds", restart_seconds)
    trials = count("trials", trials, maximum=MAX_EVENTS)
    seed = count("seed", seed, minimum=0)
    chunks = math.ceil(w / t)
    exponent = (min(t, w) + c) / m
    events = trials * chunks * math.exp(exponent) if exponent < 700 else math.inf
    if events > MAX_EVENTS:
        hint = (" The save and interval are long next to mtbf_seconds, so almost every chunk fails"
                " before it completes: check the order of the arguments (interval_seconds,"
                " checkpoint_seconds, mtbf_seconds, work_seconds)." if exponent > 3 else
                " Use fewer trials or less work_seconds per interval_seconds.")
        raise ValueError(f"simulate_overhead would run about {events:.3g} simulated events, more than its "
                         f"limit of {MAX_EVENTS:,}.{hint}")
    rng = random.Random(seed)
    losses = []
    budget = 20 * MAX_EVENTS  # a hard stop far above the estimate, in case it is ever wrong
    for _ in range(trials):
        wall, done = 0.0, 0.0
        next_failure = rng.expovariate(1.0 / m)
        while done < w:
            budget -= 1
            if budget < 0:
                raise ValueError(f"simulate_overhead stopped after {20 * MAX_EVENTS:,} events: the failures "
                                 f"(mtbf_seconds={m:g}) are too frequent for this interval_seconds and checkpoint_seconds")
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
