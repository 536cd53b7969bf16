"""3.3's stand-in device: compute and link as waits in two threads, timed against exposed_comm."""
import pytest

from lessonlib.calc.overlap import exposed_comm, no_overlap_exposed
from lessonlib.measure.overlap_sim import SimulatedStep, simulate_overlap


@pytest.mark.parametrize("c, m", [(0.004, 0.002), (0.002, 0.004)])
def test_simulated_step_is_never_shorter_than_the_formula(c, m):
    # time.sleep never returns early, so each measured time is at least what the formula says; a machine under
    # load can only add to it, which is why nothing here bounds it from above
    r = simulate_overlap(c, m, 6)
    assert isinstance(r, SimulatedStep)
    assert r.backward >= 6 * c
    assert r.exposed_after >= no_overlap_exposed(m, 6)
    assert r.exposed_overlap >= m  # the last bucket is never hidden
    assert exposed_comm(c, m, 6) >= m


@pytest.mark.parametrize("kwargs, word", [
    (dict(compute_s=-1, comm_s=0.001, buckets=2), "compute_s"), (dict(compute_s=0.001, comm_s=float("nan"), buckets=2), "comm_s"),
    (dict(compute_s=0.001, comm_s=0.001, buckets=0), "buckets"), (dict(compute_s=1.0, comm_s=1.0, buckets=10), "a simulation may take"),
    (dict(compute_s=0.001, comm_s=0.001, buckets=2, repeats=0), "repeats"),
])
def test_simulate_overlap_refuses_bad_arguments(kwargs, word):
    with pytest.raises((ValueError, TypeError), match=word):
        simulate_overlap(**kwargs)
