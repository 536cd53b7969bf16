"""lessonlib.calc.reliability: how often to save, and the exact time lost to failures.

The exact expected loss for exponential failures is checked three ways: its
own algebra (doctests and special values), its minimum against Young's and
Daly's intervals, and a Monte-Carlo simulation over a grid that reaches saves
as long as the MTBF.
"""
from __future__ import annotations

import doctest
import math
import statistics

import pytest

from lessonlib.calc import reliability as R
from lessonlib.calc.reliability import (daly_interval, expected_overhead, expected_wall_seconds,
                                        first_order_overhead, optimal_interval, simulate_losses,
                                        simulate_overhead, young_daly_interval, young_interval)


def test_doctests():
    assert doctest.testmod(R).failed == 0


def test_young_interval():
    assert young_interval(300, 86400) == 7200
    assert young_interval(50, 1) == pytest.approx(10.0)
    assert young_daly_interval is young_interval  # the old name still works


@pytest.mark.parametrize("fn", [young_interval, daly_interval, optimal_interval])
@pytest.mark.parametrize("bad, name", [((0, 86400), "checkpoint_seconds"), ((-1, 86400), "checkpoint_seconds"),
                                       ((300, 0), "mtbf_seconds"), ((300, -5), "mtbf_seconds"),
                                       ((float("nan"), 1), "checkpoint_seconds"), ((1, float("inf")), "mtbf_seconds"),
                                       ((True, 1), "checkpoint_seconds"), (("300", 1), "checkpoint_seconds")])
def test_intervals_refuse_bad_input(fn, bad, name):
    with pytest.raises(ValueError, match=name):
        fn(*bad)


def test_the_issue_example_5_minute_save_1_hour_mtbf():
    # The issue's figures: the first-order formula says 40.8 %, the exact expectation 55.5 %.
    c, m = 300.0, 3600.0
    tau = young_interval(c, m)
    assert first_order_overhead(tau, c, m) == pytest.approx(0.408, abs=5e-4)
    assert expected_overhead(tau, c, m) == pytest.approx(0.555, abs=5e-4)
    # and the expression by hand: M (e^{(τ+C)/M} − 1) / τ − 1
    assert expected_overhead(tau, c, m) == pytest.approx(m * (math.exp((tau + c) / m) - 1) / tau - 1, rel=1e-12)


def test_exact_tends_to_first_order_when_saves_are_short():
    # For τ, C << M the two agree to second order: the relative gap is O(τ/M).
    c, m = 1.0, 1e7
    tau = young_interval(c, m)
    assert expected_overhead(tau, c, m) == pytest.approx(first_order_overhead(tau, c, m), rel=2 * tau / m + 1e-6)
    assert expected_overhead(tau, c, m, 500.0) == pytest.approx(first_order_overhead(tau, c, m, 500.0),
                                                                 rel=2 * tau / m + 1e-6)


def test_restart_scales_the_loss_and_does_not_move_the_optimum():
    c, m, r = 300.0, 3600.0, 600.0
    tau = optimal_interval(c, m)
    with_r = 1 + expected_overhead(tau, c, m, r)
    without = 1 + expected_overhead(tau, c, m)
    assert with_r == pytest.approx(without * (m + r) / m, rel=1e-12)
    with pytest.raises(ValueError, match="restart_seconds"):
        expected_overhead(tau, c, m, restart_seconds=-1)
    with pytest.raises(ValueError, match="interval_seconds"):
        expected_overhead(0, c, m)


@pytest.mark.parametrize("c, m", [(10, 86400), (300, 86400), (60, 3600), (300, 3600), (1800, 3600),
                                  (3600, 3600), (7200, 3600)])
def test_optimal_interval_is_the_minimum(c, m):
    best = optimal_interval(c, m)
    at_best = expected_overhead(best, c, m)
    for factor in (0.9, 0.99, 1.01, 1.1):  # a true minimum: every neighbour is worse
        assert expected_overhead(best * factor, c, m) > at_best
    # Young's and Daly's intervals never beat it; Daly's is the closer of the two
    assert expected_overhead(young_interval(c, m), c, m) >= at_best
    assert expected_overhead(daly_interval(c, m), c, m) >= at_best
    assert abs(daly_interval(c, m) / best - 1) <= abs(young_interval(c, m) / best - 1)


def test_young_overshoots_the_optimum_more_as_saves_grow():
    # The issue's claim: Young's interval is 3 % to 34 % too long for long saves.
    over = [young_interval(c, 3600) / optimal_interval(c, 3600) - 1 for c in (100, 300, 900, 1800)]
    assert over == sorted(over)
    assert 0.03 < over[0] < over[-1]
    assert young_interval(300, 86400) / optimal_interval(300, 86400) - 1 == pytest.approx(0.028, abs=0.002)


def test_expected_wall_adds_whole_and_partial_segments():
    c, m, r = 60.0, 3600.0, 120.0
    seg = R.expected_segment_seconds(600, c, m, r)
    assert expected_wall_seconds(6000, 600, c, m, r) == pytest.approx(10 * seg)
    assert expected_wall_seconds(6300, 600, c, m, r) == pytest.approx(10 * seg + R.expected_segment_seconds(300, c, m, r))


# The grid: save time from 1 % of the MTBF to the MTBF itself, intervals from a quarter of the
# optimum to twice it, with and without a restart. At C = M, τ = τ* the run takes ~6× its work.
GRID = [(c_over_m, f, r_over_m) for c_over_m in (0.01, 0.1, 0.5, 1.0) for f in (0.25, 1.0, 2.0)
        for r_over_m in (0.0, 0.2)]


@pytest.mark.parametrize("c_over_m, factor, r_over_m", GRID)
def test_simulation_agrees_with_the_exact_expression(c_over_m, factor, r_over_m):
    m = 3600.0
    c, r = c_over_m * m, r_over_m * m
    tau = factor * optimal_interval(c, m)
    work = 8 * tau  # a whole number of intervals: the job's expected loss is then exactly expected_overhead
    trials = 1500
    losses = simulate_losses(tau, c, m, work, r, trials=trials, seed=hash((c_over_m, factor, r_over_m)) % 2**32)
    mean = statistics.fmean(losses)
    stderr = statistics.stdev(losses) / math.sqrt(trials)
    exact = expected_overhead(tau, c, m, r)
    # Tolerance: the mean of 1500 independent jobs is normal to a good approximation (CLT), so a
    # correct formula lies within 4 standard errors with probability 0.99994 per point (about
    # 0.997 for the whole 24-point grid). Seeds are fixed, so the test is deterministic.
    assert abs(mean - exact) < 4 * stderr, (mean, exact, stderr)
    # The test has power: the standard error is at most 3 % of the loss, so a formula off by
    # more than ~12 % would fail; the first-order formula, off by 20-70 % at the high-overhead
    # corners, is rejected there.
    assert stderr < 0.03 * exact
    if c_over_m >= 0.5:
        assert abs(mean - first_order_overhead(tau, c, m, r)) > 4 * stderr


def test_simulation_is_seeded_and_checks_input():
    c, m = 300.0, 86400.0
    best = young_interval(c, m)
    same = simulate_overhead(best, c, m, 86400, trials=20, seed=3)
    assert same == simulate_overhead(best, c, m, 86400, trials=20, seed=3)  # a seed gives one answer
    assert same != simulate_overhead(best, c, m, 86400, trials=20, seed=4)  # and the seed is used
    with pytest.raises(ValueError, match="trials"):
        simulate_overhead(best, c, m, 86400, trials=0)
    with pytest.raises(ValueError, match="work_seconds"):
        simulate_overhead(best, c, m, 0)
    with pytest.raises(ValueError, match="iterations"):
        optimal_interval(c, m, iterations=0)


def test_chapter_2_interval_calculator_shows_the_exact_loss():
    from lessonlib.book.reports import interval_report

    html = interval_report(5, 1)          # a 5-minute save, one failure an hour
    assert "55.5%" in html                # exact, at Young's interval
    assert "40.8%" in html                # the first-order figure, named as such
    assert "Daly" in html and "exact optimum" in html and "55.0%" in html
    with pytest.raises(ValueError, match="save_minutes"):
        interval_report(0, 1)
    with pytest.raises(ValueError, match="mtbf_hours"):
        interval_report(5, -1)
    # an MTBF so long that the intervals overflow: once an error that named only an inner argument
    with pytest.raises(ValueError, match=r"save_minutes \(5\) and mtbf_hours \(4.5e\+302\) give no answer"):
        interval_report(5, 4.5e302)


def test_chapter_2_no_longer_credits_young_s_formula_to_daly():
    import nbformat
    from conftest import ROOT

    nb = nbformat.read(ROOT / "chapters/02-two-checkpoints/05-how-often-and-which-kind.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "refined by\nDaly" not in text and "refined by Daly" not in text
    assert "optimal_interval" in text and "daly_interval" in text
