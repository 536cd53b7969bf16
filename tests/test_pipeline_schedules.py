"""Interleaved and zero-bubble pipeline schedules: the calc simulator and the real engine's runs."""
from __future__ import annotations

import pytest

from lessonlib.calc.pipeline import (EQUAL_STAGE_TIMES, boundary_bytes, interleaved_bubble_fraction, parse_action, peak_in_flight,
                                     pipeline_bubble_fraction, pipeline_schedule, read_schedule,
                                     schedule_idle_fraction, simulate_actions)

# torch 2.13's own pipeline_order for 2 processes, 2 stages each, 4 micro-batches (None: an empty slot)
INTERLEAVED_2x2x4 = {
    0: ['0F0', '0F1', '2F0', '2F1', None, None, '0F2', '2B0', '0F3', '2B1', '2F2', '0B0', '2F3', '0B1', None, '2B2',
        None, '2B3', None, '0B2', None, '0B3'],
    1: [None, '1F0', '1F1', None, '3F0', '3B0', '3F1', '3B1', '1F2', '1B0', '1F3', '1B1', '3F2', '3B2', '3F3', '3B3',
        None, '1B2', None, '1B3']}
ZBV_2x4 = {
    0: ['0F0', '0F1', '0F2', '3F0', '3I0', '3W0', '3F1', '3I1', '3W1', '0F3', '0I0', '0W0', '3F2', '3I2', '3W2', '0I1',
        '0W1', '3F3', '3I3', '3W3', '0I2', '0W2', '0I3', '0W3'],
    1: [None, '1F0', '2F0', '1F1', '2F1', '2I0', '2W0', '1F2', '1I0', '1W0', '2F2', '2I1', '2W1', '1F3', '1I1', '1W1',
        '2F3', '2I2', '2W2', '1I2', '2I3', '1I3', '1W2', '2W3', '1W3']}


def gpipe_actions(p, m):
    return {s: [f"{s}F{j}" for j in range(m)] + [f"{s}B{j}" for j in range(m)] for s in range(p)}


def one_f_one_b_actions(p, m):
    out = {}
    for s in range(p):
        warm = min(p - s, m)
        acts = [f"{s}F{j}" for j in range(warm)]
        f, b = warm, 0
        while b < m:
            acts.append(f"{s}B{b}")
            b += 1
            if f < m:
                acts.append(f"{s}F{f}")
                f += 1
        out[s] = acts
    return out


def test_interleaved_formula_both_denominators():
    assert interleaved_bubble_fraction(2, 4, 2, of="work") == 1 / 8
    assert interleaved_bubble_fraction(2, 4, 2) == 1 / 9
    assert interleaved_bubble_fraction(4, 8, 1) == pipeline_bubble_fraction(4, 8)  # v = 1 is the plain pipeline
    with pytest.raises(ValueError, match="of"):
        interleaved_bubble_fraction(2, 4, 2, of="useful")
    with pytest.raises(ValueError, match="stages_per_device"):
        interleaved_bubble_fraction(2, 4, 0)


def test_boundary_bytes_is_one_micro_batchs_activations():
    assert boundary_bytes(128, 2, 64) == 2 * 128 * 64 * 2  # bf16 by default
    assert boundary_bytes(128, 2, 64, bytes_per_value=4) == 2 * boundary_bytes(128, 2, 64)
    with pytest.raises(ValueError, match="hidden"):
        boundary_bytes(128, 2, 0)


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 8), (3, 5)])
def test_simulator_reproduces_the_gpipe_and_1f1b_formula(p, m):
    for acts in (gpipe_actions(p, m), one_f_one_b_actions(p, m)):
        idle = schedule_idle_fraction(simulate_actions(acts, {"F": 1.0, "B": 2.0}))
        assert idle == pytest.approx(pipeline_bubble_fraction(p, m), abs=1e-12)
    # and agrees task by task with the GPipe schedule worked out by pipeline_schedule
    sim = sorted((t["process"], t["kind"], t["microbatch"], t["start"]) for t in
                 simulate_actions(gpipe_actions(p, m), {"F": 1.0, "B": 2.0}))
    ref = sorted((t["stage"], t["kind"], t["microbatch"], t["start"]) for t in pipeline_schedule(p, m, 1.0, 2.0))
    assert sim == ref


def test_torchs_interleaved_order_gives_the_interleaved_formula():
    idle = schedule_idle_fraction(simulate_actions(INTERLEAVED_2x2x4, EQUAL_STAGE_TIMES))
    assert idle == pytest.approx(interleaved_bubble_fraction(2, 4, 2), abs=1e-12)
    assert peak_in_flight(INTERLEAVED_2x2x4) == {0: 5, 1: 3}


def interleaved_actions(p, v, m):
    """Interleaved 1F1B's compute order, written out as torch's ``ScheduleInterleaved1F1B`` builds it: rounds of
    ``r = m // (m // p)`` micro-batches, chunk after chunk; a warm-up of ``(v - 1) r + 2(p - 1 - rank)``
    forwards (at most the ``m v`` a process runs), then one forward and one backward in turn, then the rest."""
    r = m // max(1, m // p)
    out = {}
    for rank in range(p):
        warm = min(m * v, (v - 1) * r + 2 * (p - 1 - rank))
        done = {"F": {}, "B": {}}

        def act(kind, stage):
            mb = done[kind].get(stage, 0)
            done[kind][stage] = mb + 1
            return f"{stage}{kind}{mb}"

        fwd = [act("F", (k // r) % v * p + rank) for k in range(m * v)]
        bwd = [act("B", (v - 1 - (k // r) % v) * p + rank) for k in range(m * v)]
        acts = fwd[:warm]
        for k in range(m * v - warm):
            acts += [fwd[warm + k], bwd[k]]
        out[rank] = acts + bwd[m * v - warm:]
    return out


def test_interleaved_order_matches_torchs():
    assert interleaved_actions(2, 2, 4) == {r: [a for a in acts if a] for r, acts in INTERLEAVED_2x2x4.items()}


@pytest.mark.parametrize("p,v,m", [(4, 2, 2), (4, 3, 4), (8, 4, 8), (4, 2, 6), (4, 3, 12), (8, 2, 24)])
def test_stage_in_flight_is_the_simulated_peak(p, v, m):
    """The calculator's count on every device against the simulator, on settings no page uses: m below p, m = p
    (the first device's warm-up capped at the m v forwards of its step: a factor 1 over 1F1B's p), m neither, and
    m several p (the factor 1 + (p - 1) / (p v))."""
    from lessonlib.calc.stage_memory import stage_in_flight
    acts = interleaved_actions(p, v, m)
    simulate_actions(acts, EQUAL_STAGE_TIMES)  # a valid order: every action runs
    peaks = peak_in_flight(acts)
    assert {r: stage_in_flight(p, m, v, rank=r) * v for r in range(p)} == peaks
    if m == p:
        assert peaks[0] == m * v < p * v + p - 1
    if m % p == 0 and m > p:
        assert peaks[0] / v == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert stage_in_flight(p, m, rank=p - 1) == peak_in_flight(one_f_one_b_actions(p, m))[p - 1] == 1  # 1F1B


def test_zero_bubble_leaves_one_slot_per_process():
    tasks = simulate_actions(ZBV_2x4, EQUAL_STAGE_TIMES)
    assert {t["kind"] for t in tasks} == {"F", "I", "W"}
    # 3 units of work for each of 2 stages × 4 micro-batches per process, one unit to reach process 1
    assert schedule_idle_fraction(tasks) == pytest.approx(1 / 25, abs=1e-12)
    # a chunk stays held until its W
    assert peak_in_flight(ZBV_2x4) == {0: 4, 1: 4}
    assert peak_in_flight(ZBV_2x4, chunk_bytes={0: 2, 1: 3, 2: 3, 3: 3}) == {0: 9, 1: 12}


def test_actions_are_checked():
    assert parse_action("12W3") == (12, "W", 3)
    with pytest.raises(ValueError, match="action"):
        parse_action("F0")
    with pytest.raises(ValueError, match="never comes"):
        simulate_actions({0: ["0B0", "0F0"]}, EQUAL_STAGE_TIMES)
    with pytest.raises(ValueError, match="durations"):
        simulate_actions({0: ["0F0"]}, {"B": 1.0})
    with pytest.raises(ValueError, match="chunk_bytes"):
        peak_in_flight({0: ["0F0", "1F0"]}, chunk_bytes={0: 1})


def test_replay_is_a_lower_bound_on_the_measured_idle_share():
    # process 1's forward starts 0.5 s after its input was ready (a transfer): measured idles more than replay
    spans = [[("F", 0, 0.0, 1.0, 0), ("B", 0, 4.5, 6.5, 0)],
             [("F", 0, 1.5, 2.5, 1), ("B", 0, 2.5, 4.5, 1)]]
    r = read_schedule(spans)
    assert r.order == {0: ["0F0", "0B0"], 1: ["1F0", "1B0"]}
    assert r.replay_idle < r.measured_idle
    assert r.replay_idle == pytest.approx(1 - 6 / 12)
    assert r.equal_stage_idle == pytest.approx(pipeline_bubble_fraction(2, 1))


def test_stage_placement():
    from lessonlib.measure.distributed.pipelining import stage_indices

    assert stage_indices("Interleaved1F1B", 1, 2, 2) == [1, 3]
    assert stage_indices("ZBV", 1, 2, 2) == [1, 2]
    assert stage_indices("1F1B", 1, 2, 2) == [1]
    with pytest.raises(ValueError, match="stages_per_process"):
        stage_indices("ZBV", 0, 2, 3)


def test_run_pipelines_refuses_bad_specs_before_starting():
    from lessonlib.measure.distributed.pipelining import run_pipelines

    with pytest.raises(ValueError, match="stages_per_process"):
        run_pipelines([dict(world_size=2, microbatches=(4,), schedules=("ZBV",))])
    with pytest.raises(ValueError, match="stages_per_process"):
        run_pipelines([dict(world_size=2, microbatches=(4,), schedules=("ZBV",), stages_per_process=3)])


@pytest.mark.slow
def test_interleaved_and_zero_bubble_run_as_planned():
    from lessonlib.measure.distributed.pipelining import run_pipelines

    run, = run_pipelines([dict(world_size=2, microbatches=(4,), stages_per_process=2, hidden=64, layers=1, rows=8,
                               reps=1, schedules=("Interleaved1F1B", "InterleavedZB", "ZBV"))])
    one = 8 * 64 * 4  # rows × hidden × float32 bytes
    for r in run["runs"]:
        st = r["steps"][0]
        got = read_schedule(st["spans"])
        assert got.order == {k: [a for a in plan if a] for k, plan in st["actions"].items()}
        assert got.replay_idle <= got.measured_idle + 1e-6
        kinds = {a[1] for acts in got.order.values() for a in acts}
        assert kinds == ({"F", "B"} if r["schedule"] == "Interleaved1F1B" else {"F", "I", "W"})
        for proc in (0, 1):
            if r["schedule"] == "Interleaved1F1B":  # the stage's input (not stage 0's) and its ReLU's output
                predicted = peak_in_flight(got.order, chunk_bytes={s: one * (1 + (s > 0)) for s in range(4)})
                assert st["peak_bytes"][proc] == predicted[proc] and st["left_bytes"][proc] == 0
            else:  # between I and W at least the Linear's input, which W needs (stage 0's is the batch)
                at_least = peak_in_flight(got.order, chunk_bytes={s: one * (s > 0) for s in range(4)})
                assert st["peak_bytes"][proc] >= at_least[proc]
                assert st["left_bytes"][proc] == 0  # a split backward frees every saved tensor too


@pytest.mark.parametrize("p,m", [(2, 1), (2, 3), (2, 8), (3, 4), (4, 5), (4, 8), (3, 5)])
def test_fixed_unequal_stage_times_never_idle_less_than_the_formula(p, m):
    # Each stage keeps its own forward and backward time for every micro-batch (a fixed per-stage time):
    # the slowest stage sets the pace, so imbalance only raises the idle share above (p-1)/(m+p-1), for
    # GPipe at any m and for 1F1B with more micro-batches than stages (at m = p, 1F1B's order can lose a
    # few points: it is not covered here). Only calls that differ from one micro-batch to the next (a short
    # first forward, a short last backward) can bring such a run below it.
    import random
    rng = random.Random(p * 100 + m)
    for _ in range(200):
        times = {(s, k, j): t for s in range(p) for k, t in
                 (("F", rng.uniform(0.2, 3.0)), ("B", rng.uniform(0.2, 6.0))) for j in range(m)}
        for acts in (gpipe_actions(p, m), one_f_one_b_actions(p, m)) if m > p else (gpipe_actions(p, m),):
            idle = schedule_idle_fraction(simulate_actions(acts, times))
            assert idle >= pipeline_bubble_fraction(p, m) - 1e-12
    # while per-call variation can go below it: a short first forward and a short last backward
    times = {(s, k, j): 1.0 if k == "F" else 2.0 for s in range(p) for k in "FB" for j in range(m)}
    times.update({(0, "F", 0): 0.1, (0, "B", m - 1): 0.2})
    if m > 1:  # with one micro-batch every call is its stage's only one: nothing varies
        assert schedule_idle_fraction(simulate_actions(gpipe_actions(p, m), times)) < pipeline_bubble_fraction(p, m)


def test_fixed_stage_replay_uses_each_stages_median_times():
    # stage 0's first forward is short (0.5 s, the others 1 s): the fixed-stage replay gives it 1 s like the rest
    spans = [[("F", 0, 0.0, 0.5, 0), ("F", 1, 0.5, 1.5, 0), ("F", 2, 1.5, 2.5, 0), ("B", 0, 5.0, 7.0, 0),
              ("B", 1, 7.0, 9.0, 0), ("B", 2, 9.0, 11.0, 0)],
             [("F", 0, 0.5, 1.5, 1), ("F", 1, 1.5, 2.5, 1), ("F", 2, 2.5, 3.5, 1), ("B", 0, 3.5, 5.5, 1),
              ("B", 1, 5.5, 7.5, 1), ("B", 2, 7.5, 9.5, 1)]]
    r = read_schedule(spans)
    assert r.fixed_stage_idle == pytest.approx(pipeline_bubble_fraction(2, 3))  # equal stages once fixed
    assert r.replay_idle < r.fixed_stage_idle  # the short first forward alone brings it below the formula
