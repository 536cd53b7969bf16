import numpy as np
import pytest

from lessonlib import checks


def test_count_accepts_whole_numbers_and_rejects_the_rest():
    assert checks.count("layers", 4) == 4
    assert checks.count("n_params", 7.5e9) == 7_500_000_000   # a whole-valued float
    assert checks.count("devices", np.int64(8)) == 8
    assert checks.count("warmup", 0, minimum=0) == 0
    for bad, msg in [(0, "layers must be positive"), (-3, "layers must be positive"),
                     (2.5, "layers must be a whole number"), (True, "boolean"),
                     ("4", "whole number"), (float("nan"), "whole number")]:
        with pytest.raises(ValueError, match=msg):
            checks.count("layers", bad)
    with pytest.raises(ValueError, match="world_size must be at least 2, got 1"):
        checks.count("world_size", 1, minimum=2)


def test_amount_positive_share_and_choice():
    assert checks.amount("serial", 0) == 0.0
    with pytest.raises(ValueError, match="serial must be zero or positive"):
        checks.amount("serial", -1)
    with pytest.raises(ValueError, match="mtbf_seconds must be positive"):
        checks.positive("mtbf_seconds", 0)
    with pytest.raises(ValueError, match="finite"):
        checks.positive("mtbf_seconds", float("inf"))
    assert checks.share("serial_share", 1) == 1.0
    with pytest.raises(ValueError, match="serial_share is a fraction and must be at most 1"):
        checks.share("serial_share", 1.2)
    with pytest.raises(ValueError, match="unknown optimizer 'lion'; choose one of 'sgd', 'adam'"):
        checks.choice("optimizer", "lion", ("sgd", "adam"))


# --- the examples an outside fuzz named -------------------------------------------

def test_errors_name_the_argument_as_the_caller_spelled_it():
    from lessonlib.book.reports import plan_html
    from lessonlib.calc.planner import plan
    from lessonlib.measure.models import TinyGPT

    with pytest.raises(ValueError, match="batch_per_device must be positive"):
        plan(1000, batch_per_device=0)
    with pytest.raises(ValueError, match="train_tokens must be a whole number"):
        plan(1000, train_tokens=2.5, device_flops_per_s=1e12)
    with pytest.raises(ValueError, match="device_GB must be positive"):
        plan_html("1.3B", "adam", "bf16_master", 1, 2048, "none", device_GB=0)
    with pytest.raises(ValueError, match="dropout must be below 1"):
        TinyGPT(vocab=8, seq_len=4, hidden=8, heads=2, layers=1, dropout=1.5)


def test_what_used_to_hang_or_pass_silently_is_refused_at_once():
    import time

    from lessonlib.book.reports import plan_html
    from lessonlib.calc.pipeline import MAX_TASK_PAIRS, pipeline_schedule
    from lessonlib.calc.recompute import predicted_flops_ratio
    from lessonlib.calc.reliability import MAX_EVENTS, simulate_overhead

    t0 = time.process_time()
    # a learner swaps the save time and the MTBF: the simulation would never end
    with pytest.raises(ValueError, match="check the order of the arguments"):
        simulate_overhead(7200, 86400, 300, 10 * 86400, trials=200)
    with pytest.raises(ValueError, match=f"limit of {MAX_TASK_PAIRS:,}"):
        pipeline_schedule(10**6, 10**6)
    with pytest.raises(ValueError, match="backward_to_forward must be finite"):
        predicted_flops_ratio(1.0, float("nan"))
    with pytest.raises(ValueError, match="batch_per_device must be a whole number"):
        plan_html("1.3B", "adam", "bf16_master", "8" * 10**6, 2048, "none", 80)  # no 1.3 GB string first
    assert time.process_time() - t0 < 5  # refused before any work (CPU time: immune to a busy machine)
    with pytest.raises(ValueError, match="trials"):  # the simulation's cap applies to its trials too
        simulate_overhead(3600, 60, 86400, 10 * 86400, trials=MAX_EVENTS + 1)


@pytest.mark.parametrize("value", [np.int64(4), np.int32(4), 4.0, np.float64(4.0), 4])
def test_numpy_integers_and_whole_floats_are_counts(value):
    assert checks.count("devices", value) == 4 and type(checks.count("devices", value)) is int


@pytest.mark.parametrize("value, message", [(True, "boolean"), (np.bool_(True), "boolean"),
                                            (float("nan"), "whole number"), (float("inf"), "whole number"),
                                            (10**400, "at most"), ("4", "whole number")])
def test_bool_nan_inf_and_overflow_are_refused_clearly(value, message):
    with pytest.raises(ValueError, match=f"devices .*{message}|devices must be at most"):
        checks.count("devices", value)
    if not isinstance(value, str):
        with pytest.raises(ValueError, match="serial"):
            checks.amount("serial", value if value is not True else True)


# --- subnormal positives, results in range, measured structures ----------------------------

def test_positive_refuses_subnormal_numbers_that_divide_into_infinity():
    with pytest.raises(ValueError, match="bandwidth is too small to divide by, got 5e-324"):
        checks.positive("bandwidth", 5e-324)
    assert checks.positive("bandwidth", 2.3e-308) == 2.3e-308   # the smallest normal floats still pass
    assert checks.amount("alpha", 5e-324) == 5e-324             # an amount that may be zero is never a divisor here


def test_result_refuses_what_has_no_physical_meaning():
    assert checks.result(0.5, "a and b", "a utilisation", high=1.0) == 0.5
    with pytest.raises(ValueError, match="a and b give a utilisation of 6, above 1.*hint"):
        checks.result(6.0, "a and b", "a utilisation", high=1.0, hint="hint")
    with pytest.raises(ValueError, match="a and b give a time of inf"):
        checks.result(float("inf"), "a and b", "a time")
    with pytest.raises(ValueError, match="below 0"):
        checks.result(-1.0, "a and b", "bytes")


def test_measured_names_where_a_bad_number_sits():
    ok = {"runs": [{"wall": [1.0, 2.0], "ok": True, "name": "x", "peak": None}]}
    assert checks.measured("run", ok) is ok
    with pytest.raises(ValueError, match=r"run\['runs'\]\[0\]\['wall'\]\[1\] must be finite, got nan"):
        checks.measured("run", {"runs": [{"wall": [1.0, float("nan")]}]})
    with pytest.raises(ValueError, match=r"run\['x'\] must be zero or positive"):
        checks.measured("run", {"x": -1})
    assert checks.measured("run", {"x": -1}, signed=True)
    from lessonlib.measure.memory import MemoryLedger

    with pytest.raises(ValueError, match=r"ledger\.weights must be a number, got 'x'"):
        checks.measured("ledger", MemoryLedger(weights="x", gradients=1, optimizer_state=1, activations=1))


def test_reads_turns_a_structure_of_the_wrong_shape_into_an_error_naming_it():
    @checks.reads("run")
    def first_ratio(run, scale=1.0):
        """Reads run['steps'][0] / run['reference']."""
        if scale > 10:
            raise ValueError(f"scale must be at most 10, got {scale}")
        return run["steps"][0] / run["reference"] * scale

    assert first_ratio({"steps": [2.0], "reference": 4.0}) == 0.5
    for bad, why in [({"steps": [2.0]}, "lacks the key 'reference'"),
                     ({"steps": [], "reference": 1.0}, "shorter than it must be"),
                     ({"steps": [2.0], "reference": 0.0}, "a zero where a measurement is divided by"),
                     ({"steps": ["2"], "reference": 1.0}, "a value of the wrong kind"),
                     ({"steps": [1e308], "reference": 1e-308}, "not finite")]:
        with pytest.raises(ValueError, match=f"run .*{why}"):
            first_ratio(bad)
    with pytest.raises(ValueError, match="^scale must be at most 10"):  # an error naming an argument passes as it is
        first_ratio({"steps": [2.0], "reference": 4.0}, scale=11)
    assert first_ratio.__doc__.startswith("Reads") and first_ratio.__name__ == "first_ratio"
