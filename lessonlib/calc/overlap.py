"""Communication hidden behind compute: how much of it a step still waits for.

Data parallelism exchanges gradients in *buckets*: as soon as backward has
produced every gradient of one bucket, that bucket's all-reduce starts while
backward goes on computing the next bucket's gradients. A bucket's
communication is hidden when compute is still running; the last bucket's is
never hidden (there is no compute left to run beside it).
Times are seconds (or any one unit used for every argument). Pure Python (no torch).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import amount as _check_amount, count as _check_count, positive as _check_positive


def exposed_comm(t_compute_per_bucket, t_comm_per_bucket, buckets) -> float:
    """Communication time a step still waits for after backward's last bucket, in the inputs' unit.

    Backward produces ``buckets`` equal buckets of gradients, one every
    ``t_compute_per_bucket``; each bucket's all-reduce takes
    ``t_comm_per_bucket``, starts when its gradients are ready and when the
    previous bucket's all-reduce has finished (one link, used in turn).
    The exposed time is when the last all-reduce ends minus when backward ends::

        exposed = max(t_comm, buckets * (t_comm - t_compute) + t_compute)

    With compute >= communication per bucket only the last bucket is exposed
    (``t_comm_per_bucket``, whatever the bucket count); with communication
    longer than compute, the link is the bottleneck and the exposed time grows
    with every bucket.

    >>> exposed_comm(2.0, 1.0, 8)    # compute-bound: only the last bucket shows
    1.0
    >>> exposed_comm(1.0, 2.0, 8)    # comm-bound: 8 * (2 - 1) + 1
    9.0
    """
    c = _check_amount("t_compute_per_bucket", t_compute_per_bucket)
    m = _check_amount("t_comm_per_bucket", t_comm_per_bucket)
    b = _check_count("buckets", buckets)
    # bucket i (1-based) is ready at i*c and the link frees at end_{i-1}: end_i = max(i*c, end_{i-1}) + m.
    # With m <= c the link is free whenever a bucket is ready (end_b = b*c + m); with m > c it never rests
    # after the first bucket (end_b = c + b*m). tests/test_overlap.py checks this against that event loop.
    return max(m, b * (m - c) + c)


def no_overlap_exposed(t_comm_per_bucket, buckets) -> float:
    """Exposed communication when every bucket waits for backward to finish: ``buckets * t_comm_per_bucket``."""
    m = _check_amount("t_comm_per_bucket", t_comm_per_bucket)
    b = _check_count("buckets", buckets)
    return b * m


@dataclass
class HiddenShare:
    """Share of the communication a step did not wait for.

    ``raw`` = (t_serial - t_step) / t_comm, unclipped: negative when the
    overlapped step took *longer* than the serial one (the overlap cost more
    than it hid, e.g. communication and compute competing for the same cores),
    above 1 when it saved more than the communication (noise, or other
    savings). ``share`` is ``raw`` clipped to [0, 1], the fraction a reader
    can call hidden.
    """

    share: float
    raw: float


def hidden_share(t_serial, t_step, t_comm) -> HiddenShare:
    """How much of ``t_comm`` the step ``t_step`` hid, against ``t_serial`` (the same work with none hidden).

    ``t_serial``: the step with the communication after the compute (nothing
    hidden: compute + communication); ``t_step``: the overlapped step;
    ``t_comm``: the communication alone (> 0). Seconds, or any one unit.

    >>> hidden_share(10.0, 7.0, 4.0).share   # 3 of the 4 units of communication were hidden
    0.75
    >>> hidden_share(10.0, 11.0, 4.0).raw    # overlap made the step longer
    -0.25
    """
    t_serial = _check_amount("t_serial", t_serial)
    t_step = _check_amount("t_step", t_step)
    t_comm = _check_positive("t_comm", t_comm)
    raw = (t_serial - t_step) / t_comm
    return HiddenShare(share=min(1.0, max(0.0, raw)), raw=raw)
