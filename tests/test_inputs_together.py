"""Arguments valid one by one but impossible together, results outside their physical range, and the
structures pages pass between functions.

Each test names the class it covers; each would fail without the check it exercises. No test here
starts a process: the launchers are checked with ``launch`` replaced by a function that fails the
test if it is ever reached, so every refusal is shown to come before any process starts.
"""
import math

import pytest
import torch

from lessonlib.calc.memory import activation_bytes, activation_bytes_per_layer
from lessonlib.calc.planner import layout, plan, propose, single_device_seconds, training_flops
from lessonlib.calc.pricing import activation_bytes_per_device, gpu_hours, implied_utilisation, save_seconds

TINY = 5e-324  # the smallest subnormal float: "positive", and 1 / TINY is inf


# --- layouts: pipeline, tensor and heads must agree ------------------------------------------------

def test_a_pipeline_deeper_than_the_model_is_refused():
    # it used to return 4x the pipeline=2 value: 8 stages, each "holding" one of 2 layers
    with pytest.raises(ValueError, match=r"pipeline \(8\) must be at most layers \(2\)"):
        activation_bytes_per_device(2048, 1, 4096, 32, layers=2, pipeline=8)
    assert activation_bytes_per_device(2048, 1, 4096, 32, layers=2, pipeline=2) > 0  # still answers the valid one


def test_heads_must_divide_hidden_everywhere():
    for call in (lambda: activation_bytes_per_layer(128, 1, 100, 3),      # 100 % 3 != 0
                 lambda: activation_bytes_per_layer(128, 1, 8, 16),       # more heads than width
                 lambda: activation_bytes(128, 1, 100, 3, layers=2),
                 lambda: plan(1000, hidden=8, heads=16),                  # plan used to say "Everything fits"
                 lambda: activation_bytes_per_device(128, 1, 100, 3, layers=4)):
        with pytest.raises(ValueError, match=r"heads \(\d+\) must divide hidden \(\d+\)"):
            call()


def test_the_tensor_degree_must_divide_the_heads_everywhere():
    with pytest.raises(ValueError, match=r"tensor \(3\) must divide heads \(32\)"):
        activation_bytes_per_device(2048, 1, 4096, 32, layers=32, tensor=3)
    with pytest.raises(ValueError, match="tensor_parallel"):
        activation_bytes_per_layer(2048, 1, 4096, 32, tensor_parallel=3)
    with pytest.raises(ValueError, match="tensor_parallel"):
        layout(7.5e9, layers=32, hidden=4096, heads=32, world_size=6, tensor_parallel=3)
    assert all(lay.tensor_parallel in (1, 2, 4, 8) for lay in propose(7.5e9, layers=32, hidden=4096, heads=32))


@pytest.mark.parametrize("e", [1, 3, 8])
def test_bytes_per_value_is_one_of_the_allowed_set(e):
    with pytest.raises(ValueError, match="bytes_per_value must be one of 2, 4"):
        activation_bytes_per_layer(2048, 1, 4096, 32, bytes_per_value=e)


def test_training_flops_checks_the_shape_whatever_the_recompute_setting():
    for kw in (dict(seq_len=0), dict(hidden=-3), dict(layers=2.5), dict(seq_len="2048")):
        for rc in ("none", "full", "attention"):
            with pytest.raises(ValueError, match=next(iter(kw))):
                training_flops(1000, 1000, rc, **{**dict(seq_len=8, hidden=8, layers=2), **kw})
    assert training_flops(10, 100, "none", seq_len=8, hidden=8, layers=2) == 6000.0  # read only when the attention core is rebuilt


# --- results with a physical range -----------------------------------------------------------------

@pytest.mark.parametrize("call, name", [
    (lambda: gpu_hours(1e24, TINY, 0.4), "peak_flops_per_s"),
    (lambda: gpu_hours(1e24, 1e15, TINY), "utilisation"),
    (lambda: implied_utilisation(1e24, TINY, 1e15), "device_hours"),
    (lambda: save_seconds(1e9, TINY), "bandwidth_bytes_per_s"),
    (lambda: single_device_seconds(1e12, TINY), "device_flops_per_s"),
])
def test_subnormal_positive_numbers_are_refused_by_name(call, name):
    with pytest.raises(ValueError, match=f"{name} is too small"):
        call()


def test_subnormals_are_refused_in_every_function_the_issue_named():
    from lessonlib.book.reports import plan_html
    from lessonlib.calc.comm import collective_seconds
    from lessonlib.calc.goodput import goodput
    from lessonlib.calc.reliability import expected_overhead, first_order_overhead

    for call, name in [(lambda: collective_seconds("all_reduce", 1e9, 8, 0.0, TINY), "beta_bytes_per_s"),
                       (lambda: expected_overhead(TINY, 300, 3600), "interval_seconds"),
                       (lambda: first_order_overhead(TINY, 300, 3600), "interval_seconds"),
                       (lambda: goodput(8, 7.0, 1000.0, TINY), "checkpoint_seconds"),
                       (lambda: plan_html("1.3B", "adam", "bf16_master", 1, 2048, "none", 80, 20, TINY), "device_flops_per_s")]:
        with pytest.raises(ValueError, match=name):
            call()


def test_results_that_overflow_are_refused_not_returned_as_inf():
    from lessonlib.calc.comm import collective_seconds
    from lessonlib.calc.reliability import first_order_overhead

    for call in (lambda: single_device_seconds(1e300, 1e-300), lambda: gpu_hours(1e300, 1e-300, 0.5),
                 lambda: save_seconds(1e300, 1e-300), lambda: first_order_overhead(1e-300, 1e300, 1e300),
                 lambda: collective_seconds("all_reduce", 1e300, 2, 0.0, 1e-300)):
        with pytest.raises(ValueError, match="too large .* to compute in floating point"):
            call()


def test_a_utilisation_above_one_is_refused_and_points_at_active_parameters():
    # DeepSeek-V3: 671B parameters in all, 37B active per token, 14.8T tokens, 2.788M H800-hours at
    # 989 TFLOP/s. The total count gives a utilisation of 6.0 (impossible); the active count, 0.33.
    with pytest.raises(ValueError, match="active parameters"):
        implied_utilisation(6 * 671e9 * 14.8e12, 2.788e6, 989e12)
    assert 0.3 < implied_utilisation(6 * 37e9 * 14.8e12, 2.788e6, 989e12) < 0.35
    with pytest.raises(ValueError, match="total_flops"):
        implied_utilisation(1e300, 1.0, 1e15)  # used to answer 2.8e278


def test_stall_account_refuses_clocks_that_cannot_be():
    from lessonlib.calc.goodput import stall_account

    def runs(wall, cpu):
        return [{"rank": 0, "wall": wall, "cpu": cpu}, {"rank": 1, "wall": wall, "cpu": cpu}]

    ok = stall_account(runs([1.0, 2.0, 5.0, 6.0], [0.9, 1.8, 1.9, 2.8]), 2)
    assert 0 <= ok.cpu_share <= 1 and 0 < ok.goodput <= 1
    with pytest.raises(ValueError, match=r"runs\[0\]\['wall'\] must rise"):     # a clock that runs backwards
        stall_account(runs([1.0, 2.0, 1.5, 6.0], [0.1, 0.2, 0.3, 0.4]), 2)
    with pytest.raises(ValueError, match=r"runs\[0\]\['wall'\] must rise"):     # a step of 0 s
        stall_account(runs([1.0, 2.0, 2.0, 6.0], [0.1, 0.2, 0.3, 0.4]), 2)
    with pytest.raises(ValueError, match="CPU share"):                         # CPU time beyond wall time
        stall_account(runs([1.0, 2.0, 2.1, 3.0], [0.1, 0.2, 3.0, 3.1]), 2)
    with pytest.raises(ValueError, match=r"runs\[0\]\['cpu'\] must never fall"):
        stall_account(runs([1.0, 2.0, 5.0, 6.0], [0.9, 0.5, 0.6, 0.7]), 2)


def test_expert_step_wait_refuses_zero_times_and_experts_that_do_not_divide():
    from lessonlib.measure.distributed.splits import expert_step_wait

    def rank(r, tpe, secs):
        return {"rank": r, "tokens_per_expert": tpe, "tokens_processed": 10, "expert_seconds": secs}

    assert expert_step_wait([rank(0, [30, 10, 10, 10], 0.004), rank(1, [30, 10, 10, 10], 0.002)])["time_imbalance"] > 1
    with pytest.raises(ValueError, match="expert_seconds are all zero"):
        expert_step_wait([rank(0, [30, 10, 10, 10], 0.0), rank(1, [30, 10, 10, 10], 0.0)])
    with pytest.raises(ValueError, match="3 experts, which do not divide evenly over the 2 ranks"):
        expert_step_wait([rank(0, [30, 10, 10], 0.004), rank(1, [30, 10, 10], 0.002)])


# --- measurements: the pieces of a step must belong together ---------------------------------------

def _regression():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1), torch.randn(8, 4)


def test_an_optimizer_built_for_another_model_is_refused():
    from lessonlib.measure.memory import measure_training_memory
    from lessonlib.measure.timing import time_training_step

    model, x = _regression()
    other = torch.optim.Adam(torch.nn.Linear(4, 1).parameters())  # used to report optimizer_state=0
    mse = torch.nn.functional.mse_loss
    with pytest.raises(ValueError, match="optimizer updates 2 of its 2 tensors that are not model's parameters"):
        measure_training_memory(model, x, torch.randn(8, 1), mse, other)
    with pytest.raises(ValueError, match="optimizer"):
        time_training_step(model, x, torch.randn(8, 1), mse, other, rounds=1, warmup=0)
    part = torch.optim.SGD([model.weight], lr=0.1)  # some of the model's parameters (fine-tuning): fine
    assert measure_training_memory(model, x, torch.randn(8, 1), mse, part, track_peak=False).weights > 0


@pytest.mark.parametrize("shape", [(8, 3), (8,), (4, 1)])
def test_targets_that_do_not_fit_the_output_are_refused(shape):
    from lessonlib.measure.memory import measure_training_memory
    from lessonlib.measure.timing import count_flops, time_training_step

    model, x = _regression()
    mse = torch.nn.functional.mse_loss
    targets = torch.randn(*shape)
    with pytest.raises(ValueError, match=rf"targets has shape {tuple(shape)}".replace("(", r"\(").replace(")", r"\)")):
        time_training_step(model, x, targets, mse, torch.optim.SGD(model.parameters(), lr=0.1), rounds=1, warmup=0)
    with pytest.raises(ValueError, match="targets has shape"):
        count_flops(model, x, targets, mse)
    with pytest.raises(ValueError, match="targets has shape"):
        measure_training_memory(model, x, targets, mse, torch.optim.SGD(model.parameters(), lr=0.1))


def test_class_index_targets_still_fit():
    from lessonlib.measure.models import TinyGPT, lm_loss
    from lessonlib.measure.timing import count_flops

    model = TinyGPT(vocab=16, seq_len=8, hidden=16, heads=2, layers=1)
    idx = torch.randint(0, 16, (2, 8))
    assert count_flops(model, idx, idx, lm_loss).forward > 0  # logits (2, 8, 16), targets (2, 8)
    clf = torch.nn.Linear(4, 3)
    assert count_flops(clf, torch.randn(8, 4), torch.randint(0, 3, (8,)), torch.nn.functional.cross_entropy).forward > 0
    with pytest.raises(ValueError, match="class indices"):
        count_flops(clf, torch.randn(8, 4), torch.randint(0, 3, (8, 3)), torch.nn.functional.cross_entropy)


def test_peak_memory_refuses_a_module_for_track_instead_of_answering_tracker_missing():
    from lessonlib.measure.memory import peak_memory

    model = torch.nn.Linear(4, 1)
    with pytest.raises(TypeError, match="track must be a list or tuple"):
        peak_memory(lambda: model(torch.randn(2, 4)), track=model)  # used to return (result, None)
    with pytest.raises(TypeError, match=r"track\[1\] must be a module, an optimizer or a tensor"):
        peak_memory(lambda: 1, track=[model, "weights"])


# --- the launchers: structured arguments refused in the parent --------------------------------------

@pytest.fixture
def no_processes(monkeypatch):
    """Replace every launcher's ``launch`` by one that fails the test: refusals must come first."""
    import importlib

    def never(*a, **k):
        raise AssertionError("a process was started for arguments that should have been refused")

    for mod in ("fsdp", "sharded_checkpoint", "tensor_parallel", "comm_timing", "pipelining", "splits",
                "data_parallel"):
        monkeypatch.setattr(importlib.import_module(f"lessonlib.measure.distributed.{mod}"), "launch", never)


@pytest.mark.parametrize("lr", [math.nan, math.inf, -math.inf, 0.0, -1e-3, True, 1e30, "1e-3", None])
def test_learning_rates_are_checked_before_any_process_starts(lr, no_processes, tmp_path):
    from lessonlib.measure.distributed.fsdp import run_sharding
    from lessonlib.measure.distributed.sharded_checkpoint import save_sharded

    with pytest.raises(ValueError, match="lr "):
        run_sharding(lr=lr)
    with pytest.raises(ValueError, match="lr "):
        save_sharded(tmp_path / "ckpt", lr=lr)


def test_async_path_is_checked_before_any_process_starts(no_processes, tmp_path):
    from lessonlib.measure.distributed.sharded_checkpoint import save_sharded

    with pytest.raises(ValueError, match="async_path must be another folder"):
        save_sharded(tmp_path / "ckpt", async_path=tmp_path / "ckpt")
    with pytest.raises((TypeError, ValueError), match="async_path"):
        save_sharded(tmp_path / "ckpt", async_path=3.5)


@pytest.mark.parametrize("call, message", [
    (lambda: __import__("lessonlib.measure.distributed.comm_timing", fromlist=["x"]).run_comm_timing(check_bytes=2.0 ** 20),
     "check_bytes must be a list or tuple"),
    (lambda: __import__("lessonlib.measure.distributed.comm_timing", fromlist=["x"]).run_comm_timing(sweep=4096),
     "sweep must be a list or tuple"),
    (lambda: __import__("lessonlib.measure.distributed.comm_timing", fromlist=["x"]).run_comm_timing(fsdp=dict(width=64)),
     "fsdp has keys TinyGPT does not take: width"),
    (lambda: __import__("lessonlib.measure.distributed.comm_timing", fromlist=["x"]).run_comm_timing(fsdp=dict(seq_len=10**6)),
     "fsdp does not describe a model: seq_len must be at most"),
    (lambda: __import__("lessonlib.measure.distributed.comm_timing", fromlist=["x"]).run_comm_timing(
        fsdp=dict(hidden=100, heads=3)), "fsdp does not describe a model"),
    (lambda: __import__("lessonlib.measure.distributed.fsdp", fromlist=["x"]).run_sharding(world_sizes=4),
     "world_sizes must be a list or tuple"),
    (lambda: __import__("lessonlib.measure.distributed.tensor_parallel", fromlist=["x"]).run_tensor_parallel(mlp=(4, 64)),
     r"mlp must be \(batch, seq, hidden\): 3 numbers, got 2"),
    (lambda: __import__("lessonlib.measure.distributed.tensor_parallel", fromlist=["x"]).run_tensor_parallel(
        mlp=(4, 64, 128, 9)), "mlp must be .* 3 numbers, got 4"),        # the 4th value used to be dropped
    (lambda: __import__("lessonlib.measure.distributed.tensor_parallel", fromlist=["x"]).run_tensor_parallel(
        block=(2, 128, 256, 4, 1)), "block must be .* 4 numbers, got 5"),
    (lambda: __import__("lessonlib.measure.distributed.tensor_parallel", fromlist=["x"]).run_tensor_parallel(mlp=64),
     "mlp must be a list or tuple"),
    (lambda: __import__("lessonlib.measure.distributed.tensor_parallel", fromlist=["x"]).run_tensor_parallel(
        block=(2, 10**6, 256, 4)), "block's seq_len must be at most"),
    (lambda: __import__("lessonlib.measure.distributed.tensor_parallel", fromlist=["x"]).run_tensor_parallel(
        block=(2, 128, 250, 4)), "heads .* must divide its hidden"),
    (lambda: __import__("lessonlib.measure.distributed.tensor_parallel", fromlist=["x"]).run_tensor_parallel(
        mlp=(4, 64, 129)), "world_size=2 must divide mlp's hidden"),
    (lambda: __import__("lessonlib.measure.distributed.pipelining", fromlist=["x"]).run_pipelines(
        [{"world_size": 2, "microbatches": 4}]), r"specs\[0\]: microbatches must be a list or tuple"),
    (lambda: __import__("lessonlib.measure.distributed.pipelining", fromlist=["x"]).run_pipelines(
        [{"world_size": 2, "microbatches": [4], "hiden": 8}]), r"specs\[0\] has unknown keys \['hiden'\]"),
    (lambda: __import__("lessonlib.measure.distributed.splits", fromlist=["x"]).run_splits(ep=3),
     "ep must be a list or tuple"),
])
def test_structured_launcher_arguments_are_refused_in_the_parent(call, message, no_processes):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


# --- report and plot functions fed measured results ------------------------------------------------

def _shard_run(losses=(5.0, 4.5), reference=(5.0, 4.5), zero1=None):
    """A two-rank ShardingRun (what run_sharding returns), rank 0's zero1 replaced by ``zero1`` if given."""
    from lessonlib.measure.distributed.fsdp import ShardedRank, ShardingRun

    held = {"weights": 2000, "gradients": 2000, "optimizer_state": 4000, "step_counters": 8}
    ranks = tuple(ShardedRank.from_worker(
        {"rank": r, "world_size": 2, "backend": "gloo", "n_params": 1000, "shapes": [(1000,)], "n_tensors": 1,
         "losses": list(losses), "reference_losses": list(reference), "zero3": held,
         "zero1": (zero1 if zero1 is not None and r == 0 else {**held, "weights": 4000, "gradients": 4000}),
         "zero3_collectives": [], "keep_collectives": []}) for r in (0, 1))
    return ShardingRun({2: ranks})


def test_report_functions_refuse_a_zero_reference_a_missing_phase_and_a_short_tuple():
    from lessonlib.book import split_reports as R
    from lessonlib.book.reports import data_parallel_table, timing_table
    from lessonlib.measure.timing import StepTiming

    # a zero reference: loss_table divides by the reference loss (ZeroDivisionError before)
    with pytest.raises(ValueError, match="run .*a zero where a measurement is divided by"):
        R.loss_table(_shard_run(reference=(0.0, 4.5)))
    # a missing phase: timing_table reads every phase (KeyError before)
    secs = {"prediction": 1.0, "forward": 1.0, "backward": 2.0, "optimizer": 1.0, "step": 4.0}
    t = StepTiming(seconds=secs, ratios=dict(secs), shares={k: 0.25 for k in secs}, rounds={})
    with pytest.raises(ValueError, match="t is not the result timing_table reads: it lacks the key 'loss'"):
        timing_table(t)
    # a short tuple: a collective record without its bytes (ValueError "not enough values to unpack" before)
    with pytest.raises(ValueError, match="records"):
        R.tp_collective_table([("all_reduce", "forward")], {})
    # a negative or non-finite measurement, named where it sits
    with pytest.raises(ValueError, match=r"run.*zero1.*optimizer_state.* must be finite"):
        R.zero1_table(_shard_run(zero1={"weights": 1, "gradients": 1, "optimizer_state": math.nan, "step_counters": 8}))
    # a zero one-process time: the speedups divide by it
    from lessonlib.measure.distributed.data_parallel import DataParallelRow, DataParallelRun

    row = DataParallelRow(global_batch=8, per_process_batch=4, single=0.0, ddp=0.0, half_compute=0.0, optimizer=0.0,
                          allreduce=0.0, predicted=0.0, ddp_backward=0.0, speedup=1.0, predicted_speedup=1.0,
                          predicted_over_measured=1.0, latency=0.0)
    run = DataParallelRun(world_size=2, backend="gloo", device="cpu", n_params=1, grad_bytes=4,
                          replica_grads_equal=True, replica_weights_equal=True, full_batch_grad_max_diff=0.0,
                          full_batch_grad_max=1.0, rounds=1, rows=[row])
    with pytest.raises(ValueError, match="result .*a zero where a measurement is divided by"):
        data_parallel_table(run)
    with pytest.raises(ValueError, match="rows"):
        R.comm_table([{"what": "x", "bytes": 4096, "measured_s": 0.0, "predicted_s": 1e-3}])


def test_plot_functions_refuse_what_they_cannot_draw():
    from lessonlib.book.speedup_plots import stall_figure
    from lessonlib.book.split_plots import plot_pipeline_timelines
    from lessonlib.book.plots import plot_timing
    from lessonlib.measure.timing import StepTiming

    secs = {"prediction": 1.0, "forward": 1.0, "backward": 2.0, "optimizer": 1.0, "step": 4.0}
    t = StepTiming(seconds=secs, ratios=dict(secs), shares={}, rounds={})
    with pytest.raises(ValueError, match="timings is not the result plot_timing reads: it lacks the key 'loss'"):
        plot_timing({"a": t})
    spans = [[("F", 0, 0.0)], [("F", 0, 1.0, 2.0)]]  # a span cut short
    run = {"world_size": 2, "runs": [{"schedule": "GPipe", "microbatches": 1, "steps": [{"spans": spans,
                                                                                       "idle_share": 0.5}]}]}
    with pytest.raises(ValueError, match="run is not the result plot_pipeline_timelines reads"):
        plot_pipeline_timelines(run, 1)
    runs = [{"rank": r, "wall": [1.0, 2.0, 5.0], "cpu": [0.5, 1.0, -1.0]} for r in (0, 1)]
    with pytest.raises(ValueError, match=r"runs\[0\]\['cpu'\]\[2\] must be zero or positive"):
        stall_figure(runs, 2, 3.0)


@pytest.mark.parametrize("call, message", [
    (lambda m: m.data_parallel.run_data_parallel(hidden=65536), "hidden=65,536 gives no model the workers can build"),
    (lambda m: m.comm_timing.run_comm_timing(ddp_hidden=65536), "ddp_hidden=65,536 gives no model"),
    (lambda m: m.splits.run_stalled_job(hidden=65536), "hidden=65,536 gives no model"),
    (lambda m: m.splits.run_expert_parallel(tokens=65536, hidden=4096), "tokens, hidden and experts_per_rank"),
    (lambda m: m.splits.run_splits(tp=dict(batch=65536, d_in=65536, d_out=2)), r"tp: batch × d_in"),
    (lambda m: m.splits.run_splits(ep=[dict(tokens=256, hidden=4096, experts_per_rank=8, skew=0.0)]), r"ep\[0\]"),
])
def test_sizes_the_workers_cannot_hold_are_refused_in_the_parent(call, message, no_processes):
    import importlib
    from types import SimpleNamespace

    mods = SimpleNamespace(**{n: importlib.import_module(f"lessonlib.measure.distributed.{n}")
                              for n in ("data_parallel", "comm_timing", "splits")})
    with pytest.raises(ValueError, match=message):
        call(mods)
