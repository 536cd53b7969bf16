"""Sequence parallelism: Korthikanti's formula, and DTensor's SequenceParallel measured against it."""
import pytest

from lessonlib.book import split_reports as R
from lessonlib.calc.memory import activation_bytes_per_layer
from lessonlib.calc.sequence import gathered_input_bytes, sequence_parallel_activation_bytes


def test_formula_is_the_papers_and_divides_the_whole_layer():
    s, b, h, a = 2048, 1, 4096, 32
    assert sequence_parallel_activation_bytes(s, b, h, a, 1) == activation_bytes_per_layer(s, b, h, a, attention="stored")
    for t in (2, 4, 8):
        expected = s * b * h / t * (34 + 5 * a * s / h)  # Korthikanti et al., eq. 5's per-layer form
        assert sequence_parallel_activation_bytes(s, b, h, a, t) == expected
        # tensor parallelism alone keeps 10 sbh whole on every device; SP splits exactly that
        tp_only = activation_bytes_per_layer(s, b, h, a, tensor_parallel=t, attention="stored")
        assert tp_only - sequence_parallel_activation_bytes(s, b, h, a, t) == 10 * s * b * h * (1 - 1 / t)
    assert sequence_parallel_activation_bytes(8, 1, 8, 2, 2, bytes_per_value=4) == (8 * 8 * 66 + 2 * 64 * 9) // 2


def test_gathered_inputs_are_two_whole_inputs_less_their_slices():
    assert gathered_input_bytes(128, 2, 256, 2) == 2 * 2 * 128 * 2 * 256 // 2
    assert gathered_input_bytes(128, 2, 256, 1) == 0


@pytest.mark.parametrize("kwargs, word", [
    (dict(tensor_parallel=3), "tensor_parallel"), (dict(tensor_parallel=0), "tensor_parallel"),
    (dict(bytes_per_value=3), "bytes_per_value"), (dict(heads=3), "heads")])
def test_formula_refuses_layouts_that_do_not_divide(kwargs, word):
    args = dict(seq_len=128, batch=2, hidden=256, heads=4, tensor_parallel=2) | kwargs
    with pytest.raises(ValueError, match=word):
        sequence_parallel_activation_bytes(**args)


@pytest.mark.parametrize("kwargs, word", [
    (dict(world_size=1), "world_size"), (dict(world_size=3), "world_size"), (dict(seq_len=129), "seq_len"),
    (dict(heads=3), "heads"), (dict(hidden=4096), "hidden"), (dict(batch=0), "batch"),
    (dict(timeout=-1), "timeout"), (dict(batch=64, seq_len=1024, heads=8), "values")])
def test_run_refuses_bad_arguments_before_starting_processes(kwargs, word):
    from lessonlib.measure.distributed.sequence_parallel import run_sequence_parallel

    with pytest.raises(ValueError, match=word):
        run_sequence_parallel(**kwargs)


@pytest.mark.slow
def test_sequence_parallel_measured_against_korthikanti(capfd):
    from lessonlib.measure.distributed.sequence_parallel import run_sequence_parallel

    per_rank = run_sequence_parallel(world_size=2, batch=2, seq_len=64, hidden=128, heads=4)
    for r in per_rank:
        cfg = r["config"]
        s, b, h, a = cfg["seq_len"], cfg["batch"], cfg["hidden"], cfg["heads"]
        tp, sp = r["runs"]["tp"], r["runs"]["sp"]
        assert sp["output_shape"] == (b, s // 2, h)  # each process keeps its half of the sequence
        # to the byte: the formula, plus the two gathered inputs DTensor keeps, plus LayerNorm's statistics
        formula = sequence_parallel_activation_bytes(s, b, h, a, 2)
        assert sp["bytes"] - formula == gathered_input_bytes(s, b, h, 2) + R.layernorm_stat_bytes(sp["items"])
        assert tp["bytes"] - activation_bytes_per_layer(s, b, h, a, tensor_parallel=2, attention="stored") == \
            R.layernorm_stat_bytes(tp["items"])
        assert sp["bytes"] < tp["bytes"]
        # the all-reduces become all-gathers and reduce-scatters of the same tensors
        layer = b * s * h * 2
        assert R.traffic_summary(tp["collectives"]) == {"all_reduce": {"count": 4, "bytes": 4 * layer}}
        assert R.traffic_summary(sp["collectives"]) == {"all_gather": {"count": 4, "bytes": 4 * layer},
                                                        "reduce_scatter": {"count": 4, "bytes": 4 * layer}}
        phases = sorted((k, p) for k, p, _ in sp["collectives"])
        assert phases == sorted([("all_gather", "forward")] * 2 + [("reduce_scatter", "forward")] * 2
                                + [("all_gather", "backward")] * 2 + [("reduce_scatter", "backward")] * 2)
        assert sum(sp["comm_counts"].values()) == 8 and sum(tp["comm_counts"].values()) == 4
        c = r["check"]  # float32 rounding of sums taken in another order
        assert c["output_max_diff"] <= 1e-5 * c["output_max"]
        assert c["input_grad_max_diff"] <= 1e-5 * c["input_grad_max"]
    assert "Warning" not in capfd.readouterr().err


def test_the_plan_shown_is_the_plan_run():
    from torch.distributed.tensor import Shard

    from lessonlib.measure.distributed import sequence_parallel as sp

    run = sp._sp_plan()
    assert set(run) == set(sp.SP_PLAN)
    for name, style in run.items():
        shown = sp.SP_PLAN[name]
        assert shown.startswith(type(style).__name__)
        if "input_layouts=Shard(1)" in shown:
            assert style.input_layouts == (Shard(1),)
        if "output_layouts=Shard(1)" in shown:
            assert style.output_layouts == (Shard(1),)


def test_ulysses_sends_two_over_world_size_of_the_rings_bytes():
    """A ring receives world_size - 1 K/V blocks; Ulysses' two all-to-alls send (world_size - 1)/world_size of four
    slices: the ratio is exactly 2/world_size, and both agree at 2 devices."""
    from lessonlib.calc.sequence import context_parallel_bytes_sent

    for world_size in (2, 4, 8, 16):
        ring = context_parallel_bytes_sent("ring", 4096, 2, 256, world_size, 4)
        ulysses = context_parallel_bytes_sent("ulysses", 4096, 2, 256, world_size, 4)
        assert ring == 2 * 4 * (4096 // world_size) * 2 * 256 * (world_size - 1)
        assert ulysses * world_size == 2 * ring
    with pytest.raises(ValueError, match="method"):
        context_parallel_bytes_sent("tree", 4096, 2, 256, 4)
    with pytest.raises(ValueError, match="world_size"):
        context_parallel_bytes_sent("ring", 4096, 2, 256, 3)
