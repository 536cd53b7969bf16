"""lessonlib.calc.amdahl: the calculators, their input checks, and small real gloo runs."""
from __future__ import annotations

import math
import sys

import pytest

from lessonlib.measure.distributed import splits as P
from lessonlib.book.reports import TORCHRUN_SNIPPET
from lessonlib.calc.collectives import all_gather_bytes, ring_allreduce_bytes
from lessonlib.calc.amdahl import amdahl_speedup, amdahl_time, speedup_from_share
from lessonlib.measure.distributed.launch import choose_backend, free_port, launch
from lessonlib.calc.experts import expert_load_imbalance
from lessonlib.calc.pipeline import pipeline_bubble_fraction, pipeline_schedule, schedule_idle_fraction
from lessonlib.measure.distributed.data_parallel import run_data_parallel


# --- Amdahl -----------------------------------------------------------------

def test_seed_example():
    assert amdahl_time(20, 80, 1) == 100
    assert amdahl_time(20, 80, 4) == 40
    assert amdahl_speedup(20, 80, 4) == 2.5
    assert speedup_from_share(0.2, 4) == pytest.approx(2.5)


def test_amdahl_limits_and_communication():
    # the serial share caps the speedup at 1 / serial share
    assert amdahl_speedup(20, 80, 10 ** 9) == pytest.approx(5.0, rel=1e-6)
    # communication is paid only with more than one device
    assert amdahl_time(20, 80, 1, communication=10) == 100
    assert amdahl_time(20, 80, 4, communication=10) == 50
    assert amdahl_speedup(20, 80, 4, communication=10) == 2.0
    # perfectly parallel work: linear speedup
    assert amdahl_speedup(0, 100, 8) == 8
    # communication larger than the work saved: slower than one device
    assert speedup_from_share(0.0, 2, communication_share=0.6) < 1


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: amdahl_time(-1, 80, 4), "serial"),
        (lambda: amdahl_time(20, -80, 4), "parallel"),
        (lambda: amdahl_time(20, 80, 0), "world_size"),
        (lambda: amdahl_time(20, 80, 2.5), "world_size"),
        (lambda: amdahl_time(20, 80, True), "world_size"),
        (lambda: amdahl_time(20, 80, 4, communication=-1), "communication"),
        (lambda: amdahl_time(float("nan"), 80, 4), "serial"),
        (lambda: amdahl_time("20", 80, 4), "serial"),
        (lambda: amdahl_speedup(20, 80, 0), "world_size"),
        (lambda: amdahl_speedup(-20, 80, 4), "serial"),
        (lambda: amdahl_speedup(0, 0, 4), "serial"),
        (lambda: speedup_from_share(1.2, 4), "serial_share"),
        (lambda: speedup_from_share(-0.1, 4), "serial_share"),
        (lambda: speedup_from_share(0.2, 0), "world_size"),
        (lambda: speedup_from_share(0.2, 4, communication_share=-0.1), "communication_share"),
        (lambda: ring_allreduce_bytes(-1, 4), "n_bytes"),
        (lambda: ring_allreduce_bytes(100, 0), "world_size"),
        (lambda: all_gather_bytes(100, 0), "world_size"),
        (lambda: pipeline_bubble_fraction(0, 8), "stages"),
        (lambda: pipeline_bubble_fraction(4, 0), "microbatches"),
        (lambda: pipeline_schedule(4, 8, forward_time=0), "forward_time"),
        (lambda: expert_load_imbalance([3, -1]), "tokens_per_expert"),
        (lambda: expert_load_imbalance([]), "tokens_per_expert"),
        (lambda: expert_load_imbalance([0, 0]), "tokens_per_expert"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# --- communication volume ---------------------------------------------------

def test_amdahl_report_prints_numbers_as_people_write_them():
    """No "256.00× (not 256×)", no "1.00× (not 1×)", 62.5 % not 62 %."""
    import re

    from lessonlib.book.reports import amdahl_report

    text = lambda *a: re.sub(r"<[^>]+>", " ", amdahl_report(*a))  # noqa: E731
    assert "256× (all 256 devices fully used)" in text(256, 0.0) and "not 256" not in text(256, 0.0)
    assert "1× (one device" in text(1, 0.2) and "not 1×" not in text(1, 0.2)
    four = text(4, 0.2)
    assert "2.5× (not 4×)" in four and "62.5 %" in four and "5×" in four
    assert "4.71× (not 8×)" in text(8, 0.1) and "58.8 %" in text(8, 0.1)


def test_ring_allreduce_bytes():
    assert ring_allreduce_bytes(1000, 1) == 0
    assert ring_allreduce_bytes(1000, 2) == 1000
    assert ring_allreduce_bytes(1000, 4) == 1500
    # approaches twice the tensor, never less per device as devices grow
    vols = [ring_allreduce_bytes(1000, n) for n in range(1, 65)]
    assert vols == sorted(vols) and vols[-1] < 2000
    # reduce-scatter + all-gather
    assert ring_allreduce_bytes(1000, 8) == 2 * all_gather_bytes(1000, 8)


# --- pipeline ---------------------------------------------------------------

def test_bubble_fraction():
    assert pipeline_bubble_fraction(4, 8) == 3 / 11
    assert pipeline_bubble_fraction(1, 8) == 0
    assert pipeline_bubble_fraction(4, 1) == 0.75


@pytest.mark.parametrize("p, m", [(1, 1), (2, 1), (4, 8), (4, 32), (8, 3)])
@pytest.mark.parametrize("tf, tb", [(1.0, 1.0), (1.0, 2.0)])
def test_schedule_matches_bubble_formula(p, m, tf, tb):
    tasks = pipeline_schedule(p, m, forward_time=tf, backward_time=tb)
    assert len(tasks) == 2 * p * m
    assert schedule_idle_fraction(tasks) == pytest.approx(pipeline_bubble_fraction(p, m), abs=1e-12)
    # no stage runs two tasks at once
    for s in range(p):
        spans = sorted((t["start"], t["end"]) for t in tasks if t["stage"] == s)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    # makespan: (m + p - 1) slots of forward, then of backward
    assert max(t["end"] for t in tasks) == pytest.approx((m + p - 1) * (tf + tb))


# --- experts ----------------------------------------------------------------

def test_process_load_imbalance():
    from lessonlib.calc.experts import process_load_imbalance

    # two experts a process: process 0 runs 25 + 5 tokens, process 1 runs 5 + 5
    assert process_load_imbalance([25, 5, 5, 5], 2) == pytest.approx(1.5)
    assert process_load_imbalance([25, 5, 5, 5], 1) == pytest.approx(2.5)
    # a busy expert beside an idle one on the same process: balanced processes
    assert process_load_imbalance([20, 0, 10, 10], 2) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="experts_per_process"):
        process_load_imbalance([1, 2, 3], 2)
    with pytest.raises(ValueError, match="experts_per_process"):
        process_load_imbalance([1, 2], 0)


def test_expert_load_imbalance():
    assert expert_load_imbalance([10, 10, 10, 10]) == 1.0
    assert expert_load_imbalance([25, 5, 5, 5]) == 2.5


@pytest.mark.parametrize("gpus,nccl,world_size,expected", [
    (0, True, 2, ("gloo", "cpu")),     # no GPU: gloo on CPU processes
    (1, True, 2, ("gloo", "cpu")),     # one GPU cannot be shared by two NCCL ranks
    (2, False, 2, ("gloo", "cpu")),    # a torch build without NCCL
    (2, True, 2, ("nccl", "cuda")),    # one GPU per process
    (8, True, 4, ("nccl", "cuda")),
])
def test_backend_choice(monkeypatch, gpus, nccl, world_size, expected):
    import torch
    import torch.distributed as dist

    monkeypatch.delenv("LESSONLIB_DIST_BACKEND", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: nccl)
    assert choose_backend(world_size) == expected
    monkeypatch.setenv("LESSONLIB_DIST_BACKEND", "gloo")  # forced, even with GPUs
    assert choose_backend(world_size) == ("gloo", "cpu")
    with pytest.raises(ValueError, match="world_size"):
        choose_backend(0)


def test_torchrun_snippet_is_python():
    compile(TORCHRUN_SNIPPET, "<snippet>", "exec")


# --- real gloo runs with two processes ----------------------------------------

@pytest.mark.slow  # starts processes: seconds each
def test_tensor_and_expert_parallel_two_processes():
    out = P.run_splits(
        tp=dict(batch=16, d_in=64, d_out=32),
        ep=(dict(tokens=64, hidden=16, experts_per_rank=2, skew=0.0),
            dict(tokens=64, hidden=16, experts_per_rank=2, skew=4.0)),
        timeout=120,
    )
    for r in out["tensor"]:
        assert r["column_allclose"] and r["row_allclose"]
        assert r["column_max_diff"] <= 1e-5 * max(1.0, r["reference_max"])
        # CollectiveLog counted one all-gather and one all-reduce, each over the whole 16 x 32 float32 output
        assert r["collectives"] == [("all_gather", 16 * 32 * 4), ("all_reduce", 16 * 32 * 4)]
    balanced, skewed = out["expert"]
    for runs in (balanced, skewed):
        for r in runs:
            assert r["allclose"]
            assert sum(r["tokens_per_expert"]) == 2 * 64
    # What the step waits for is the busiest process, counted and timed
    from lessonlib.calc.experts import process_load_imbalance

    for runs in (balanced, skewed):
        wait = P.expert_step_wait(runs)
        per_expert = runs[0]["tokens_per_expert"]
        # each process's experts handled what was routed to them: experts 2r and 2r + 1
        assert wait["tokens_per_process"] == [sum(per_expert[2 * r:2 * r + 2]) for r in range(2)]
        assert wait["process_imbalance"] == pytest.approx(max(wait["tokens_per_process"]) / 64)
        assert wait["process_imbalance"] == process_load_imbalance(per_expert, 2)
        assert wait["process_imbalance"] <= wait["expert_imbalance"]
        assert all(s > 0 for s in wait["seconds_per_process"]) and wait["time_imbalance"] >= 1.0
    # every token that left one rank arrived at the other
    assert balanced[0]["sent_tokens"][1] == balanced[1]["received_tokens"][0]
    assert expert_load_imbalance(skewed[0]["tokens_per_expert"]) > expert_load_imbalance(
        balanced[0]["tokens_per_expert"])


@pytest.mark.slow  # starts processes: seconds each
def test_data_parallel_two_processes():
    res = run_data_parallel(batch_sizes=(16, 64), rounds=2, warmup=1, hidden=64, timeout=120)
    assert res.backend in ("gloo", "nccl") and res.world_size == 2 and res.rounds == 2
    assert res.replica_grads_equal and res.replica_weights_equal
    # DDP's averaged gradient is one process's whole-batch gradient, up to rounding
    assert res.full_batch_grad_max_diff <= 1e-5 * max(1.0, res.full_batch_grad_max)
    # the exchange written out (buckets.average_gradients) averages every gradient byte as DDP does
    assert res.manual_grad_max_diff <= 1e-6 * max(1.0, res.full_batch_grad_max)
    assert res.manual_bytes == res.grad_bytes
    assert res.grad_bytes == 4 * res.n_params
    assert [(r.global_batch, r.per_process_batch) for r in res.rows] == [(16, 8), (64, 32)]
    for row in res.rows:
        for key in ("single", "ddp", "half_compute", "optimizer", "allreduce"):
            assert getattr(row, key) > 0
        assert row.predicted == pytest.approx(row.half_compute + row.optimizer + row.allreduce)
        # Every derived number is computed from the medians shown
        assert row.speedup == pytest.approx(row.single / row.ddp)
        assert row.predicted_speedup == pytest.approx(row.single / row.predicted)
        assert row.predicted_over_measured == pytest.approx(row.predicted / row.ddp)
        # the control: both processes ran the one-process step at once; its throughput ratio from the medians
        assert row.together > 0 and row.concurrent_throughput == pytest.approx(2 * row.single / row.together)
    assert len(res.per_round) == 2 and all(len(v) == 2 for v in res.per_round[0].values())
    _check_table_reconciles(res)


def _table_cells(html):
    import re

    rows = re.findall(r"<tr>(.*?)</tr>", html)
    head = re.findall(r"<th>(.*?)</th>", rows[0])
    body = [[c.replace(",", "").replace("×", "") for c in re.findall(r"<td>(.*?)</td>", r)] for r in rows[1:]]
    return head, [[float(c) for c in r] for r in body]


def _check_table_reconciles(res):
    """The numbers printed in the data-parallel table add up and divide as the caption says."""
    from lessonlib.book.reports import data_parallel_table

    html = data_parallel_table(res)
    assert "median" in html  # the statistic is named
    head, body = _table_cells(html)
    assert len(body) == len(res.rows)
    for gb, single, half, opt, ar, pred, ddp, pred_speedup, ideal_speedup, speedup in body:
        assert pred == pytest.approx(half + opt + ar, abs=1e-9)       # the sum of the shown pieces
        ideal = round((single - opt) / res.world_size + opt + ar, 2)  # the ideal-compute step, from shown numbers
        assert ideal_speedup == pytest.approx(round(single / ideal, 2), abs=0.011)  # rounding of the pieces
        assert speedup == pytest.approx(round(single / ddp, 2), abs=1e-9)  # the ratio of the shown steps
        assert pred_speedup == pytest.approx(round(single / pred, 2), abs=1e-9)


def test_data_parallel_table_reconciles_on_skewed_rounds():
    """Medians of sums are not sums of medians: the table must still add up."""
    from lessonlib.book.reports import data_parallel_display_rows

    # rows as run_data_parallel builds them, from rounds where the per-round sum's median
    # (1.21 + 1.11 + 1.14 != 3.88 was the old bug) differs from the sum of medians
    from lessonlib.measure.distributed.data_parallel import DataParallelRow, DataParallelRun

    t = dict(single=0.04460, ddp=0.03116, half_compute=0.00121, optimizer=0.00111, allreduce=0.00114)
    predicted = t["half_compute"] + t["optimizer"] + t["allreduce"]
    row = DataParallelRow(global_batch=32, per_process_batch=16, predicted=predicted, ddp_backward=0.002,
                          speedup=t["single"] / t["ddp"], predicted_speedup=t["single"] / predicted,
                          predicted_over_measured=predicted / t["ddp"], latency=0.0001, **t)
    res = DataParallelRun(world_size=2, backend="gloo", device="cpu", n_params=1, grad_bytes=4,
                          replica_grads_equal=True, replica_weights_equal=True, full_batch_grad_max_diff=0.0,
                          full_batch_grad_max=1.0, rounds=11, rows=[row])
    _check_table_reconciles(res)
    shown = data_parallel_display_rows(res)[0]
    assert shown["predicted"] == pytest.approx(3.46) and shown["speedup"] == pytest.approx(1.43)
    # the ideal-compute prediction: one process's forward and backward halved, the update and exchange whole
    assert shown["ideal_device"] == pytest.approx(round(1e3 * row.ideal_device_step, 2))  # the row's, in ms
    assert shown["ideal_device_speedup"] == pytest.approx(round(44.60 / shown["ideal_device"], 2))
    assert row.ideal_device_step == pytest.approx((t["single"] - t["optimizer"]) / 2 + t["optimizer"] + t["allreduce"])


@pytest.mark.slow  # starts processes: seconds each
def test_worker_failure_is_raised_and_children_cleaned_up():
    import multiprocessing

    with pytest.raises(Exception, match="d_in and d_out"):
        # an odd d_out fails inside the workers after they joined the group
        launch(P._tensor_parallel_worker, 2, args=(4, 8, 7), timeout=60)
    assert multiprocessing.active_children() == []


def test_data_parallel_rejects_bad_input():
    with pytest.raises(ValueError, match="batch_sizes"):
        run_data_parallel(batch_sizes=(33,))
    with pytest.raises(ValueError, match="world_size"):
        run_data_parallel(world_size=1)
    with pytest.raises(ValueError, match="skew"):
        P.run_expert_parallel(skew=-1)


def _one_rank_fails(rank, world_size, device, progress):
    """Rank 1 raises while rank 0 waits in a collective for it."""
    import torch
    import torch.distributed as dist

    if rank == 1:
        raise RuntimeError("rank 1 failed on purpose")
    dist.all_reduce(torch.ones(4))  # never completes: its peer is gone
    return "unreachable"


@pytest.mark.slow  # starts processes: seconds each
def test_a_failing_rank_does_not_hang_its_peer():
    import multiprocessing
    import time

    t0 = time.monotonic()
    with pytest.raises(Exception, match="on purpose"):
        launch(_one_rank_fails, 2, timeout=60)
    assert time.monotonic() - t0 < 45
    assert multiprocessing.active_children() == []


@pytest.mark.slow  # starts processes: seconds each
def test_timeout_kills_the_children():
    import multiprocessing

    # The timeout counts from when the workers exist (starting the fork server comes before it);
    # in 3 s they are running, and asleep for a minute.
    with pytest.raises(TimeoutError):
        launch(_sleeper, 2, args=(60.0,), timeout=3)
    assert multiprocessing.active_children() == []


def _loaded(rank, world_size, device, progress):
    return sorted(m for m in sys.modules if m.startswith("lessonlib.measure.distributed."))


@pytest.mark.slow  # starts processes: seconds each
def test_workers_start_with_the_worker_modules_imported():
    """The fork server imports torch and every library module whose functions workers run, once; a worker
    forked from it has them already (about 1 s of CPU each for the FSDP, DTensor and checkpoint ones)."""
    from pathlib import Path

    from lessonlib.measure.distributed import launch as L

    here = Path(L.__file__).parent
    launching = {p.stem for p in here.glob("*.py") if p.stem != "launch" and "launch(" in p.read_text()}
    assert launching == set(L.WORKER_MODULES), "a module that launches workers is missing from WORKER_MODULES"
    if L._start_method() != "forkserver":
        pytest.skip("no fork server here: each worker imports what it needs")
    wanted = {f"lessonlib.measure.distributed.{m}" for m in L.WORKER_MODULES}
    for loaded in launch(_loaded, 2, timeout=120):
        assert wanted <= set(loaded), sorted(wanted - set(loaded))


def _sleeper(rank, world_size, device, progress, seconds):
    import time

    time.sleep(seconds)


@pytest.mark.slow  # starts processes: seconds each
def test_port_taken_meanwhile_is_retried(monkeypatch):
    import socket

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    ports = [busy.getsockname()[1]]
    real = free_port
    from lessonlib.measure.distributed import launch as L

    monkeypatch.setattr(L, "free_port", lambda: ports.pop() if ports else real())
    try:
        out = launch(P._tensor_parallel_worker, 2, args=(4, 8, 8), timeout=90)
    finally:
        busy.close()
    assert all(r["column_allclose"] for r in out)


def test_amdahl_checks_each_argument_once_along_a_call(monkeypatch):
    """Validate once: speedup_from_share -> amdahl_speedup's core -> the time formula checks world_size once,
    and goodput checks its device count once (it used to pass through job_mtbf_seconds' checks again)."""
    from lessonlib.calc import amdahl as A, goodput as G

    seen = []
    for mod in (A, G):
        real = mod._check_count
        monkeypatch.setattr(mod, "_check_count", lambda name, *a, _r=real, **k: seen.append(name) or _r(name, *a, **k))
    assert A.speedup_from_share(0.2, 4) == pytest.approx(2.5)
    assert A.amdahl_speedup(20, 80, 4) == pytest.approx(2.5)
    G.goodput(8, 7.0, 50_000, 60)
    assert seen == ["world_size"] * 3
