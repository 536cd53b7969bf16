"""How often to save a recovery checkpoint: the time lost to saves and failures.

Times are in seconds. Pure Python (no torch); the saving itself is
:mod:`lessonlib.measure.recovery`.

The model (the assumptions behind every function here):

* failures arrive at random, independently, at a constant rate: the times
  between them are exponentially distributed with mean ``mtbf_seconds`` (M);
* a failure can strike during work and during a save, but not during the
  restart that follows a failure (the restart takes a fixed ``restart_seconds``, R);
* the job saves after every ``interval_seconds`` (τ) of work, each save
  stalls training for ``checkpoint_seconds`` (C), and a save that a failure
  interrupts is lost (the previous complete checkpoint is kept: atomic writes);
* a failure loses the work since the last complete save.

Under it, one segment of τ work plus its save needs, in expectation,

    (M + R) · (exp((τ + C) / M) − 1)   seconds of wall time,

which is exact (not an approximation). Young's (1974) ``sqrt(2CM)`` minimises
the first-order expansion of it; Daly (2006) gives a higher-order interval;
:func:`optimal_interval` finds the exact minimum.
"""
from __future__ import annotations

import math
import random

from ..checks import amount, count, positive, result

#: The most simulated events (completed chunks plus failures) :func:`simulate_losses`
#: runs: about a second of pure Python. Beyond it the call is refused, not left to run.
MAX_EVENTS = 2_000_000

#: Beyond e**700 a float overflows: (interval + save) / MTBF above this is refused.
_MAX_EXPONENT = 700.0


def _restart(restart_seconds) -> float:
    return amount("restart_seconds", restart_seconds)


def young_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """Young's (1974) first-order optimal work between saves, in seconds:
    ``sqrt(2 * checkpoint_seconds * mtbf_seconds)``.

    It minimises :func:`first_order_overhead`; good when the save is small
    next to the MTBF, too long otherwise (see :func:`optimal_interval`).
    Raises ``ValueError`` for non-positive input.

    >>> young_interval(300, 86400)   # 5-minute save, one failure a day: 2 hours
    7200.0
    """
    c = positive("checkpoint_seconds", checkpoint_seconds)
    m = positive("mtbf_seconds", mtbf_seconds)
    return math.sqrt(2.0 * c * m)


#: The name the course used first; it is Young's interval.
young_daly_interval = young_interval


def daly_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """Daly's (2006) higher-order estimate of the optimal work between saves, in seconds.

    With C the save time and M the MTBF:
    ``sqrt(2CM) * (1 + sqrt(C/(2M))/3 + (C/(2M))/9) - C`` when C < 2M, else M.

    >>> round(daly_interval(300, 86400))
    7001
    """
    c = positive("checkpoint_seconds", checkpoint_seconds)
    m = positive("mtbf_seconds", mtbf_seconds)
    if c >= 2.0 * m:
        return m
    r = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(r) / 3.0 + r / 9.0) - c


def expected_segment_seconds(interval_seconds: float, checkpoint_seconds: float, mtbf_seconds: float,
                             restart_seconds: float = 0.0) -> float:
    """Expected wall time, in seconds, to complete ``interval_seconds`` of work and
    its save, with the failures, redone work and restarts on the way (exact
    under the module's assumptions): ``(M + R) * (exp((τ + C) / M) - 1)``.

    Why: an attempt needs τ + C seconds without a failure, which happens with
    probability p = exp(-(τ + C)/M). The number of failed attempts is
    geometric, (1 - p)/p on average; a failed attempt lasts on average
    M - (τ + C)·p/(1 - p) before the failure, plus R. Adding the last,
    successful attempt, τ + C, gives the expression.
    ``checkpoint_seconds`` may be zero (a free save).
    """
    t = positive("interval_seconds", interval_seconds)
    c = amount("checkpoint_seconds", checkpoint_seconds)
    m = positive("mtbf_seconds", mtbf_seconds)
    r = _restart(restart_seconds)
    if (t + c) / m > _MAX_EXPONENT:
        raise ValueError(f"interval_seconds + checkpoint_seconds ({t + c:g} s) is more than {_MAX_EXPONENT:g} times "
                         f"mtbf_seconds ({m:g} s): the job would essentially never finish a save "
                         "(check the order of the arguments)")
    return result((m + r) * math.expm1((t + c) / m), "interval_seconds, checkpoint_seconds, mtbf_seconds and "
                  "restart_seconds", "an expected time in seconds")


def expected_overhead(interval_seconds: float, checkpoint_seconds: float, mtbf_seconds: float,
                      restart_seconds: float = 0.0) -> float:
    """Expected time lost to saves, redone work and restarts, as a fraction of
    the useful work time (0.05 means the run takes 5 % longer): exact for
    exponential failures under the module's assumptions.

    ``(M + R) * (exp((τ + C) / M) - 1) / τ - 1`` with τ = ``interval_seconds``,
    C = ``checkpoint_seconds``, M = ``mtbf_seconds``, R = ``restart_seconds``
    (may be zero; the others must be positive). The share of wall time that is
    useful work is ``1 / (1 + expected_overhead(...))``.

    >>> round(expected_overhead(young_interval(300, 3600), 300, 3600), 3)   # 5-min save, 1-h MTBF
    0.555
    """
    t = positive("interval_seconds", interval_seconds)
    positive("checkpoint_seconds", checkpoint_seconds)
    return result(expected_segment_seconds(t, checkpoint_seconds, mtbf_seconds, restart_seconds) / t - 1.0,
                  "interval_seconds, checkpoint_seconds and mtbf_seconds", "an overhead")


def first_order_overhead(interval_seconds: float, checkpoint_seconds: float, mtbf_seconds: float,
                         restart_seconds: float = 0.0) -> float:
    """The first-order approximation of :func:`expected_overhead`:
    ``C/τ + (τ/2 + R)/M`` (saves, plus half an interval redone and a restart per
    failure). It is what Young's interval minimises, and it is too low when
    τ or C is not small next to M (40.8 % instead of 55.5 % for a 5-minute save
    and a 1-hour MTBF).

    >>> round(first_order_overhead(young_interval(300, 3600), 300, 3600), 3)
    0.408
    """
    t = positive("interval_seconds", interval_seconds)
    c = positive("checkpoint_seconds", checkpoint_seconds)
    m = positive("mtbf_seconds", mtbf_seconds)
    return result(c / t + (t / 2.0 + _restart(restart_seconds)) / m,
                  "interval_seconds, checkpoint_seconds, mtbf_seconds and restart_seconds", "an overhead")


def optimal_interval(checkpoint_seconds: float, mtbf_seconds: float, iterations: int = 200) -> float:
    """The work between saves, in seconds, that minimises :func:`expected_overhead` exactly.

    The restart time does not move the optimum (it scales the loss by
    (M + R)/M). Setting the derivative of ``(exp((τ + C)/M) - 1)/τ`` to zero
    gives ``(1 - x) * exp(x + C/M) = 1`` with x = τ/M; its left side falls
    from exp(C/M) > 1 at x = 0 to 0 at x = 1, so there is one root in (0, 1),
    found by bisection in at most ``iterations`` halvings (stops at float
    resolution, about 60).

    >>> round(optimal_interval(300, 3600) / young_interval(300, 3600), 3)
    0.869
    """
    c = positive("checkpoint_seconds", checkpoint_seconds)
    m = positive("mtbf_seconds", mtbf_seconds)
    iterations = count("iterations", iterations, maximum=10_000)
    k = c / m
    lo, hi = 0.0, 1.0
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if math.log1p(-mid) + mid + k > 0.0:  # (1 - x) e^(x + C/M) > 1, in logs: no overflow
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi) * m


def expected_wall_seconds(work_seconds: float, interval_seconds: float, checkpoint_seconds: float,
                          mtbf_seconds: float, restart_seconds: float = 0.0) -> float:
    """Expected wall time, in seconds, of a job with ``work_seconds`` of work that
    saves after every ``interval_seconds`` of work and after its last piece
    (exact under the module's assumptions; the last piece may be shorter)."""
    w = positive("work_seconds", work_seconds)
    t = positive("interval_seconds", interval_seconds)
    full, rest = divmod(w, t)
    wall = full * expected_segment_seconds(t, checkpoint_seconds, mtbf_seconds, restart_seconds)
    if rest > 1e-9 * t:
        wall += expected_segment_seconds(rest, checkpoint_seconds, mtbf_seconds, restart_seconds)
    return result(wall, "work_seconds, interval_seconds, checkpoint_seconds and mtbf_seconds", "a wall time in seconds")


def simulate_losses(interval_seconds: float, checkpoint_seconds: float, mtbf_seconds: float,
                    work_seconds: float, restart_seconds: float = 0.0, trials: int = 200,
                    seed: int = 0) -> list[float]:
    """Monte-Carlo: the time lost, (wall time − work) / work, of each of ``trials`` simulated jobs.

    Each job needs ``work_seconds`` of useful work and saves after every
    ``interval_seconds`` of it (and after the last piece); a save takes
    ``checkpoint_seconds``. Failures come at exponentially distributed times
    with mean ``mtbf_seconds``; a failure during work or a save loses the
    work since the last complete save and costs ``restart_seconds``, during
    which no failure strikes. These are the assumptions of
    :func:`expected_overhead`; the simulation checks its algebra.

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
    r = _restart(restart_seconds)
    trials = count("trials", trials, maximum=MAX_EVENTS)
    seed = count("seed", seed, minimum=0)
    chunks = math.ceil(w / t) if w / t < MAX_EVENTS else math.inf
    exponent = (min(t, w) + c) / m
    events = trials * chunks * math.exp(exponent) if exponent < _MAX_EXPONENT else math.inf
    if events > MAX_EVENTS:
        hint = (" The save and interval are long next to mtbf_seconds, so almost every chunk fails"
                " before it completes: check the order of the arguments (interval_seconds,"
                " checkpoint_seconds, mtbf_seconds, work_seconds)." if exponent > 3 else
                " Use fewer trials or less work_seconds per interval_seconds.")
        raise ValueError(f"trials, work_seconds, interval_seconds, checkpoint_seconds and mtbf_seconds give about "
                         f"{events:.3g} simulated events, more than the simulation's limit of {MAX_EVENTS:,}.{hint}")
    rng = random.Random(seed)
    rate = 1.0 / m
    losses = []
    for _ in range(trials):
        wall, done = 0.0, 0.0
        next_failure = rng.expovariate(rate)
        # (float sums of chunks may fall short of w by a rounding error; the first chunk always runs,
        # however small w is next to t)
        while done == 0.0 or w - done > 1e-9 * t:
            chunk = min(t, w - done)
            if wall + chunk + c <= next_failure:  # the work and its save complete
                wall += chunk + c
                done += chunk
            else:  # fail part-way: lose this chunk, restart, new failure clock
                wall = next_failure + r
                next_failure = wall + rng.expovariate(rate)
        losses.append((wall - w) / w)
    return losses


def simulate_overhead(interval_seconds: float, checkpoint_seconds: float, mtbf_seconds: float,
                      work_seconds: float, restart_seconds: float = 0.0, trials: int = 200,
                      seed: int = 0) -> float:
    """Monte-Carlo measurement of the fraction of time lost: the mean of
    :func:`simulate_losses`. For ``work_seconds`` a whole number of intervals
    its expectation is exactly :func:`expected_overhead`."""
    losses = simulate_losses(interval_seconds, checkpoint_seconds, mtbf_seconds, work_seconds,
                             restart_seconds, trials, seed)
    return sum(losses) / len(losses)
