"""lessonlib.book.split_reports: the tables of the split pages, on made-up results (no processes)."""
import dataclasses

import pytest

from lessonlib.book import split_reports as R
from lessonlib.book.tables import table
from lessonlib.calc.comm import Link, collective_seconds
from lessonlib.calc.sharding import zero_state_bytes


def test_markdown_table():
    assert table(["a", "b"], [[1, 2]], markdown=True) == "| a | b |\n|---|---|\n| 1 | 2 |"


def _rank(rank, n, n_params, scale=1.0):
    from lessonlib.measure.distributed.fsdp import ShardedRank

    f = zero_state_bytes(n_params, n, 3, "adam", "fp32")
    held = {"weights": int(f.weights * scale), "gradients": f.gradients, "optimizer_state": f.optimizer_state,
            "step_counters": 8}
    return ShardedRank.from_worker({"rank": rank, "world_size": n, "backend": "gloo", "n_params": n_params,
                                    "shapes": [(n_params,)], "n_tensors": 1, "zero3": held, "zero1": held,
                                    "losses": [5.0], "reference_losses": [5.0], "zero3_collectives": [],
                                    "keep_collectives": []})


def test_sharded_state_rows_compare_with_the_formula():
    from lessonlib.measure.distributed.fsdp import ShardingRun

    run = ShardingRun({2: (_rank(0, 2, 1000), _rank(1, 2, 1000, scale=1.5))})
    rows = R.sharded_state_rows(run)
    bad = [(r["rank"], r["part"]) for r in rows if r["measured"] != r["formula"]]
    assert bad == [(1, "weights")]
    with pytest.raises(TypeError, match="run must be a ShardingRun"):
        R.sharded_state_rows({2: [run.ranks[2][0]]})  # the string-keyed dict of old: refused, named
    table = R.sharded_state_table(run)
    assert "**no**" in table and table.count("yes") == 1


def test_pipeline_memory_rows_expect_m_for_gpipe_and_p_minus_s_for_1f1b():
    one = [100, 60]  # bytes of one micro-batch on stages 0 and 1
    run = {"world_size": 2, "runs": [
        {"schedule": "GPipe", "microbatches": 1, "steps": [{"peak_bytes": one}]},
        {"schedule": "GPipe", "microbatches": 8, "steps": [{"peak_bytes": [800, 480]}]},
        {"schedule": "1F1B", "microbatches": 8, "steps": [{"peak_bytes": [200, 60]}, {"peak_bytes": [200, 60]}]},
    ]}
    rows = R.pipeline_memory_rows(run)
    assert all(r["peak"] == r["expected"] for r in rows)
    assert [r["expected_microbatches"] for r in rows if r["schedule"] == "1F1B"] == [2, 1]
    with pytest.raises(ValueError, match="GPipe"):
        R.pipeline_memory_rows({"world_size": 2, "runs": run["runs"][2:]})


def test_comm_rows_use_the_fastest_round_and_the_model():
    link = Link("test", alpha_s=1e-4, beta_bytes_per_s=1e9)
    from lessonlib.measure.distributed.comm_timing import CommTiming

    res = CommTiming.from_worker({
        "world_size": 2, "backend": "gloo",
        "all_reduce": [(4096, [0.003, 0.001, 0.002])], "all_gather": [], "reduce_scatter": [],
        "ddp": {"grad_bytes": 4096, "bucket_bytes": [4096], "bucket_times": [[0.002, 0.001]],
                "backward": [0.010, 0.012], "backward_no_sync": [0.008, 0.009]},
        "fsdp": {"collectives": [("all_gather", 4096), ("reduce_scatter", 4096)], "n_params": 1024,
                 "replay_each": [[0.002, 0.001], [0.003, 0.002]], "step": [0.05]}})
    rows = {r["what"]: r for r in R.comm_rows(res, link)}
    assert rows["all-reduce"]["measured_s"] == 0.001
    assert rows["all-reduce"]["predicted_s"] == collective_seconds("all_reduce", 4096, 2, 1e-4, 1e9)
    step = next(r for k, r in rows.items() if k.startswith("DDP step"))
    assert step["measured_s"] == pytest.approx(0.010 - 0.008)
    assert "predicted / measured" in R.comm_table(list(rows.values()))
    with pytest.raises(TypeError, match="result must be a CommTiming"):
        R.comm_rows(dataclasses.asdict(res), link)  # the string-keyed dict of old: refused, named


def test_layernorm_stat_bytes_counts_the_per_row_tensors():
    items = [((2, 8, 16), "torch.bfloat16", 512), ((2, 8, 1), "torch.bfloat16", 32), ((2, 8, 1), "x", 32)]
    assert R.layernorm_stat_bytes(items) == 64


def test_zero_report_and_cluster_rows():
    html = R.zero_report("7.5B", 8, 3)
    assert "per device" in html and "bytes per parameter" in html
    with pytest.raises(ValueError, match="model"):
        R.zero_report("nope", 8, 3)
    rows = R.cluster_rows(7_500_000_000, nodes=(1, 8))
    assert rows[0]["gpus"] == 8 and rows[1]["gpus"] == 64
    assert rows[0]["all_reduce_s"] < rows[1]["all_reduce_s"] < rows[1]["zero3_s"]
    # across nodes NCCL's rings use all 8 ports of a node: 6-8x faster than one flat ring through one port
    assert 6 < rows[1]["all_reduce_single_port_s"] / rows[1]["all_reduce_s"] < 8.5
    assert rows[0]["all_reduce_single_port_s"] == rows[0]["all_reduce_s"]  # inside a node there is no port
