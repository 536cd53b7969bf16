"""The layout search (lessonlib.calc.layout): its memory and time model checked piece by piece against
independent arithmetic, its refusals, and its answers for the published runs."""
import dataclasses
import math

import pytest

from lessonlib.calc.comm import LINKS, collective_seconds
from lessonlib.calc.hardware import DEVICES
from lessonlib.calc.layout import Cluster, Layout, ModelShape, layout_cost, ridge_flops_per_byte
from lessonlib.calc.layout_search import published_models, rank_of, search_layouts
from lessonlib.calc.sharding import zero_state_bytes

SMALL = ModelShape("small", 8e9, 32, 4096, 32, 4096, 512, dropout=True)
CLUSTER = Cluster(64)


def test_memory_is_the_zero_state_of_the_shard_plus_korthikantis_activations():
    lay = Layout(tensor=4, context=2, pipeline=4, data=2, zero=1)
    cost = layout_cost(SMALL, CLUSTER, lay)
    # independent: the shard of 8e9 / (4 x 4) parameters, ZeRO-1 over 2 copies: 2 + 2 + 12/2 bytes a parameter
    shard = math.ceil(8e9 / 16)
    assert cost.state_bytes == pytest.approx(shard * (2 + 2 + 12 / 2), rel=1e-9)
    assert cost.state_bytes == zero_state_bytes(shard, 2, 1).total
    # 34 bytes per (s/c) x h / t per layer with dropout masks, 8 layers a stage, min(p, m) = 4 micro-batches in flight
    micro = 512 // 2
    assert cost.activation_bytes == pytest.approx(34 * (4096 / 2) * 4096 / 4 * 8 * min(4, micro))
    no_dropout = layout_cost(ModelShape("nd", 8e9, 32, 4096, 32, 4096, 512, dropout=False), CLUSTER, lay)
    assert no_dropout.activation_bytes / cost.activation_bytes == pytest.approx(32 / 34)
    full = layout_cost(SMALL, CLUSTER, Layout(4, 2, 4, 2, zero=1, recompute="full"))
    assert full.activation_bytes / cost.activation_bytes == pytest.approx(2 / 34)


def test_step_time_adds_the_bubble_and_each_exposed_collective():
    lay = Layout(tensor=8, pipeline=4, data=2, virtual=2, zero=1)
    cost = layout_cost(SMALL, CLUSTER, lay, kernel_efficiency=0.5)
    tokens = 512 * 4096
    flops = (6 * 8e9 + 6 * 32 * 4096 * 4096) * tokens
    compute = flops / (64 * DEVICES["H100 SXM 80GB"].peak_flops_per_s * 0.5)
    assert cost.compute_s == pytest.approx(compute)
    micro = 512 // 2
    assert cost.bubble_s == pytest.approx(compute * 3 / (2 * micro))
    nv = LINKS["nvlink"]  # 8 devices: inside one node
    one = collective_seconds("all_reduce", 2 * 4096 * 4096, 8, nv.alpha_s, nv.beta_bytes_per_s)
    assert cost.tensor_comm_s == pytest.approx(4 * 8 * micro * one)
    assert cost.step_s == pytest.approx(cost.compute_s + cost.bubble_s + cost.tensor_comm_s + cost.context_comm_s
                                        + cost.pipeline_comm_s + cost.data_comm_s + cost.expert_comm_s)
    assert cost.mfu == pytest.approx(flops / (64 * DEVICES["H100 SXM 80GB"].peak_flops_per_s * cost.step_s))


def test_tensor_parallelism_across_nodes_pays_the_network():
    inside = layout_cost(SMALL, CLUSTER, Layout(tensor=8, data=8, zero=3))
    across = layout_cost(SMALL, CLUSTER, Layout(tensor=16, data=4, zero=3))
    # per collective, the network's beta is 9x slower than NVLink's: the 16-way split pays far more in all
    assert across.tensor_comm_s > 3 * inside.tensor_comm_s


def test_zero3_under_a_pipeline_gathers_the_weights_for_every_micro_batch():
    z2 = layout_cost(SMALL, CLUSTER, Layout(tensor=4, pipeline=4, data=4, zero=2), kernel_efficiency=1.0)
    z3 = layout_cost(SMALL, CLUSTER, Layout(tensor=4, pipeline=4, data=4, zero=3), kernel_efficiency=1.0)
    assert z3.state_bytes < z2.state_bytes and z3.data_comm_s > z2.data_comm_s


def test_experts_below_the_ridge_point_slow_the_step():
    moe = ModelShape("moe", 100e9, 16, 4096, 32, 1024, 256, active_params=20e9, expert_params=90e9,
                     experts=64, top_k=2)
    few = layout_cost(moe, CLUSTER, Layout(tensor=1, pipeline=2, data=32, expert=1, zero=3))
    many = layout_cost(moe, CLUSTER, Layout(tensor=1, pipeline=2, data=32, expert=32, zero=3))
    # one device's experts see 1024 x 2 / 64 = 32 tokens each: far below the ridge (295 FLOPs a byte)
    assert 1024 * 2 / 64 < ridge_flops_per_byte("H100 SXM 80GB")
    assert few.compute_s > many.compute_s
    assert ridge_flops_per_byte("H100 SXM 80GB") == pytest.approx(989.4e12 / 3.35e12)


@pytest.mark.parametrize("layout, name", [
    (Layout(tensor=3, data=21), "layout"),            # 3 x 21 = 63 devices, not 64
    (Layout(tensor=64), "layout.tensor"),               # 64 does not divide 32 heads
    (Layout(pipeline=64), "layout"),                     # more stages than layers
    (Layout(data=64, expert=3), "layout.expert"),
    (Layout(data=64, schedule="gpipe"), "layout.schedule"),
    (Layout(data=64, zero=4), "layout.zero"),
])
def test_a_layout_that_cannot_run_is_refused_by_name(layout, name):
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        layout_cost(SMALL, CLUSTER, layout)


def test_model_fields_are_checked_together():
    with pytest.raises(ValueError, match="model.active_params"):
        layout_cost(ModelShape("x", 1e9, 4, 64, 4, 64, 4, active_params=2e9), Cluster(4), Layout(data=4))
    with pytest.raises(ValueError, match="model.heads"):
        layout_cost(ModelShape("x", 1e9, 4, 64, 5, 64, 4), Cluster(4), Layout(data=4))
    with pytest.raises(ValueError, match="cluster.device"):
        layout_cost(SMALL, Cluster(64, device="TPU"), Layout(data=64))


def test_the_search_returns_only_layouts_that_fit_fastest_first():
    ranked = search_layouts(SMALL, CLUSTER, top=50)
    assert ranked and all(c.fits for c in ranked)
    assert [c.step_s for c in ranked] == sorted(c.step_s for c in ranked)


def test_metas_8k_layout_for_llama_3_405b_fits_and_is_near_the_search_s_best():
    model, cluster, published = published_models()["Llama 3 405B, 8K context"]
    assert (published.tensor, published.pipeline, published.data) == (8, 16, 128)
    ranked = search_layouts(model, cluster, top=10**6)
    mine = next(c for c in ranked if rank_of(published, [c]))
    assert ranked[0].layout.tensor == 8 and mine.layout.tensor == 8  # tensor parallelism fills a node
    # the page's stated band: the model prices bubble, sends and memory only (see the page)
    assert mine.step_s / ranked[0].step_s < 1.15
    # at Meta's m = p micro-batches a copy the first device runs every chunk-forward of its step before its first
    # backward: interleaving keeps no more than plain 1F1B; at m = 2p its warm-up, not the step, caps it:
    # 1 + (p - 1) / (p v) times as much
    def held(v, batch):
        shape = dataclasses.replace(model, global_batch=batch)
        return layout_cost(shape, cluster, Layout(8, 1, 16, 128, zero=2, virtual=v)).activation_bytes
    assert model.global_batch // 128 == 16 and held(4, model.global_batch) == held(1, model.global_batch)
    assert held(4, 2 * model.global_batch) / held(1, 2 * model.global_batch) == pytest.approx(1 + 15 / 64)
    # with nothing recomputed, Meta's degrees do not fit at ZeRO-1 (page 3.11's limit); ZeRO-2 would
    assert not layout_cost(model, cluster, Layout(8, 1, 16, 128, zero=1, virtual=8)).fits
    assert layout_cost(model, cluster, Layout(8, 1, 16, 128, zero=2, virtual=8)).fits


def test_at_128k_the_published_context_split_is_near_the_best_with_the_model_split_kept():
    model, cluster, published = published_models()["Llama 3 405B, 128K context"]
    assert published.context == 16
    fixed = {"tensor": published.tensor, "pipeline": published.pipeline}
    ranked = search_layouts(model, cluster, top=500, context="free", fixed=fixed, context_method="all_gather")
    assert all(c.layout.context > 1 for c in ranked[:5])
    mine = next(c for c in ranked if rank_of(published, [c]))
    assert mine.fits and ranked[0].layout.context >= published.context  # at least Meta's 16-way split


def test_deepseek_v3s_layout_ties_with_the_best_under_dualpipe():
    model, cluster, published = published_models()["DeepSeek-V3"]
    assert model.expert_params / model.params == pytest.approx(0.97, abs=0.01)
    ranked = search_layouts(model, cluster, top=3000, schedules=("dualpipe",))
    rank = rank_of(published, ranked)
    assert rank is not None
    searched = ranked[rank - 1]  # the search's best version of DeepSeek's degrees
    assert searched.fits and searched.step_s / ranked[0].step_s < 1.02
    # as published (ZeRO-1, nothing recomputed), DualPipe's p + 1 micro-batches of generic 16-bit activations
    # put it just over the H800, by less than that extra micro-batch (the report's own savings are not priced)
    mine = layout_cost(model, cluster, published)
    extra = mine.activation_bytes / (published.pipeline + 1)
    assert mine.capacity_bytes < mine.memory_bytes < mine.capacity_bytes + extra


def test_interleaving_needs_a_layer_a_chunk_and_prices_a_pipeline_that_cannot_fill():
    from lessonlib.calc.layout_search import candidate_layouts
    from lessonlib.calc.stage_memory import interleaved_bubble_work_fraction, interleaving_problem
    assert interleaving_problem(126, 16, 4, 16) == "" and interleaving_problem(126, 16, 8, 16) == ""
    # any micro-batch count (PyTorch's ScheduleInterleaved1F1B and Llama 3's schedule relax the multiple of p)
    assert interleaving_problem(80, 2, 8, 1) == "" and interleaving_problem(80, 4, 2, 6) == ""
    assert interleaving_problem(86, 2, 32, 64) == ""                     # 43 layers a stage in 32 uneven chunks
    assert "at most one chunk a layer" in interleaving_problem(86, 2, 64, 64)  # 64 chunks for 43 layers
    assert "at most one chunk a layer" in interleaving_problem(126, 16, 16, 16)
    # the bubble: (p - 1) / (v m) once the pipeline fills; with m < p each of the v - 1 turns waits p - m slots
    assert interleaved_bubble_work_fraction(16, 4, 16) == pytest.approx(15 / 64)
    assert interleaved_bubble_work_fraction(8, 4, 2) == pytest.approx((7 + 3 * 6) / 8)
    for p, v in ((2, 32), (16, 4)):  # one micro-batch: interleaving cannot help, p - 1 whatever v is
        assert interleaved_bubble_work_fraction(p, v, 1) == interleaved_bubble_work_fraction(p, 1, 1) == p - 1
    # 3f's old winner: 64 sequences over DP 64 is m = 1; interleaved, it costs plain 1F1B's bubble and memory
    model = ModelShape("13B", 13e9, 80, 5120, 40, 32768, 64, dropout=False)
    inter = layout_cost(model, Cluster(512), Layout(4, 1, 2, 64, virtual=8, recompute="full"))
    plain = layout_cost(model, Cluster(512), Layout(4, 1, 2, 64, recompute="full"))
    assert plain.bubble_s == pytest.approx(plain.compute_s * 1 / 1) and inter.bubble_s == pytest.approx(plain.bubble_s)
    assert inter.activation_bytes == plain.activation_bytes and inter.step_s > plain.step_s  # more sends, no gain
    # the search offers no layout the rules forbid, and every one they allow (powers of two)
    offered = {(lay.pipeline, lay.virtual) for lay in candidate_layouts(model, Cluster(512))}
    for p, v in offered:
        assert v == 1 or v <= math.ceil(80 / p)
    assert (2, 32) in offered and (16, 4) in offered and (16, 8) not in offered


def test_the_same_rule_for_every_layout_with_as_many_layer_slots():
    """Llama 3's 126 layers: 8 stages x 8 chunks of two layers and 16 stages x 8 chunks of one both have 128 layer
    slots; both are allowed, and both bubbles are paced by their busiest chunk alike. (The old rule refused the
    second, pipeline x virtual > layers, while it let the first's empty slots hide inside a chunk.)"""
    from lessonlib.calc.layout_search import candidate_layouts
    from lessonlib.calc.stage_memory import (busiest_chunk_share, interleaved_bubble_work_fraction,
                                             layer_bubble_fraction)
    llama, cluster, _ = published_models()["Llama 3 405B, 8K context"]
    share = busiest_chunk_share(126, 8, 8)
    assert share == busiest_chunk_share(126, 16, 8) == busiest_chunk_share(126, 8, 16) == pytest.approx(128 / 126)
    assert busiest_chunk_share(126, 16, 4) == pytest.approx(128 / 126) and busiest_chunk_share(128, 16, 8) == 1
    offered = {(lay.pipeline, lay.virtual) for lay in candidate_layouts(llama, cluster, zero_stages=(2,),
                                                                        recompute=("save_matmuls",))}
    assert {(8, 8), (16, 8), (8, 16)} <= offered and (16, 16) not in offered
    for p, v in ((8, 8), (16, 8)):
        cost = layout_cost(llama, cluster, Layout(8, 1, p, 16384 // (8 * p), virtual=v, zero=2, recompute="save_matmuls"))
        m = 2048 // cost.layout.data
        assert cost.bubble_s == pytest.approx(cost.compute_s * interleaved_bubble_work_fraction(p, v, m) * share)
        assert cost.bubble_s == pytest.approx(cost.compute_s * layer_bubble_fraction(126, p, v, m))
    # DualPipe's bubble is paced by its busiest stage by the same rule: DeepSeek-V3's 61 layers in 16 stages of 4
    ds, ds_cluster, ds_pub = published_models()["DeepSeek-V3"]
    cost = layout_cost(ds, ds_cluster, ds_pub)
    m = ds.global_batch // ds_pub.data
    # DeepSeek-V3's Table 2: (p/2 - 1)(F&B + B - 3W) with F = 1, B = 2, W = 1 and F&B = F + B, over m (F + B)
    assert cost.bubble_s == pytest.approx(cost.compute_s * (16 / 2 - 1) * (3 + 2 - 3) / (3 * m) * 64 / 61)


def test_dualpipe_bubble_is_deepseeks_table_2():
    from lessonlib.calc.pipeline import dualpipe_bubble_work_fraction
    assert dualpipe_bubble_work_fraction(8, 20) == pytest.approx(3 * 2 / (3 * 20))
    # with W = 0 (no split backward) the bracket is F + 2B: more than 1F1B's F + B per slot
    assert dualpipe_bubble_work_fraction(8, 20, weight=0.0) == pytest.approx(3 * 5 / (3 * 20))
    assert dualpipe_bubble_work_fraction(2, 5) == 0.0  # two stages: nothing to fill
    with pytest.raises(ValueError, match="even"):
        dualpipe_bubble_work_fraction(3, 5)


def test_the_interleaved_bubble_matches_a_depth_first_timeline():
    """An event timeline of the forwards (chunk by chunk, micro-batches in order, one slot each) gives the
    forward half of the formula: the pipeline's span minus each device's v m busy slots."""
    from lessonlib.calc.stage_memory import interleaved_bubble_work_fraction
    for p, v, m in ((4, 2, 1), (4, 2, 2), (4, 2, 4), (8, 4, 3), (8, 2, 8), (16, 4, 5)):
        if m > p:
            continue
        free, done = [0] * p, {}
        for k in range(v):                       # chunk k of every device: virtual stage k p + r
            for j in range(m):
                for r in range(p):
                    prev = done.get((k * p + r - 1, j), 0)
                    done[(k * p + r, j)] = free[r] = max(prev, free[r]) + 1
        span = max(done.values())
        assert (span - v * m) / (v * m) == pytest.approx(interleaved_bubble_work_fraction(p, v, m)), (p, v, m)


def test_interleaved_memory_counts_the_deeper_warm_up_capped_at_the_step():
    """m = 2p micro-batches a copy (twice Meta's batch): 1 + (p - 1) / (p v) times 1F1B's; m = p (Meta's): the
    warm-up of (v - 1) p + 2(p - 1) chunks exceeds the m v a device runs, so all m are held, as 1F1B holds p."""
    llama, cluster, _ = published_models()["Llama 3 405B, 8K context"]
    lay = dict(tensor=8, pipeline=16, data=128)
    for batch, factor in ((2 * llama.global_batch, 1 + 15 / (16 * 4)), (llama.global_batch, 1.0)):
        shape = dataclasses.replace(llama, global_batch=batch)
        plain = layout_cost(shape, cluster, Layout(**lay)).activation_bytes
        inter = layout_cost(shape, cluster, Layout(**lay, virtual=4)).activation_bytes
        assert inter == pytest.approx(plain * factor), batch
    page = open("chapters/03-distributed-speedup/11-choose-a-layout.md").read()  # states the cap, rebuilds it
    assert "$\\min(m\\,v,\\ p\\,v + p - 1)$ chunk activations (one chunk's activations for one micro-batch) on the first device" in page
    assert "_chunks / _v == stage_in_flight(_p, m_meta, _v)" in page


def test_one_activation_figure_for_a_published_layout():
    """Pages 3.11 and 3.14 print the same bytes for Llama 3 405B's TP 8 x PP 16: one call, 32 s h / t a layer
    (no dropout, fused attention), 8 layers a stage, 16 micro-batches in flight."""
    from lessonlib.calc.layout_search import published_activation_bytes
    s, h, t = 8192, 16384, 8
    assert published_activation_bytes() == pytest.approx(32 * s * h / t * 8 * 16)
    llama, cluster, lay = published_models()["Llama 3 405B, 8K context"]
    assert layout_cost(llama, cluster, lay).activation_bytes == published_activation_bytes()
    stored = published_activation_bytes(attention="stored")  # the scores kept: (32 + 2 a s / h) without dropout
    assert stored == pytest.approx(s * h / t * (32 + 2 * 128 * s / h) * 8 * 16)
    assert published_activation_bytes(recompute="full") == pytest.approx(2 * s * h / t * 8 * 16)
    for page in ("chapters/03-distributed-speedup/11-choose-a-layout.md",
                 "chapters/03-distributed-speedup/14-price-a-real-run.md"):
        assert "published_activation_bytes(" in open(page).read(), page


def test_kernel_efficiency_and_mfu_are_one_story():
    from lessonlib.calc import hardware, layout
    assert layout.KERNEL_EFFICIENCY is hardware.KERNEL_EFFICIENCY and hardware.KERNEL_EFFICIENCY > hardware.UTILISATION
    llama, cluster, lay = published_models()["Llama 3 405B, 8K context"]
    cost = layout_cost(llama, cluster, lay)
    # no recomputation: the predicted MFU is the kernel efficiency times the step's compute share
    assert cost.mfu == pytest.approx(hardware.KERNEL_EFFICIENCY * cost.compute_share)
    page = open("chapters/03-distributed-speedup/11-choose-a-layout.md").read()
    assert "KERNEL_EFFICIENCY" in page and "UTILISATION" in page and "compute_share" in page


def test_groups_across_nodes_use_every_port_of_a_rail_optimised_node():
    """A data-parallel group with 8 GPUs a node all-reduces over 8 ports; one with 1 GPU a node over one."""
    from lessonlib.calc.comm import multi_node_seconds
    model = ModelShape("dp", 1e9, 8, 2048, 16, 2048, 64)
    rings = layout_cost(model, Cluster(64), Layout(data=64, zero=0))
    single = layout_cost(model, Cluster(64, multi_node="single_port"), Layout(data=64, zero=0))
    nv, ib = LINKS["nvlink"], LINKS["infiniband"]
    one = 2 * math.ceil(1e9) / 9  # one collective per layer and one for the rest
    assert rings.data_comm_total_s == pytest.approx(9 * multi_node_seconds("all_reduce", one, 64, 8, nv, ib))
    assert single.data_comm_total_s / rings.data_comm_total_s > 5
    # under 8-way tensor parallelism each data-parallel group has one GPU a node: the same either way
    tp = [layout_cost(model, Cluster(64, multi_node=m), Layout(tensor=8, data=8, zero=0)).data_comm_total_s
          for m in ("rings", "single_port")]
    assert tp[0] == pytest.approx(tp[1])


def test_exercise_3f_long_sequences_layouts_are_credible_and_q2_q3_ask_for_reasoning():
    """3f's long sequences: the fastest layouts of 64 sequences of 32K tokens on 512 GPUs obey the interleaving
    rules (one used to be TP 4 x PP 2 x DP 64 at v 32 with one micro-batch a copy); Q2 and Q3 ask for reasoning."""
    from lessonlib.calc.planner import PRESETS
    shape = PRESETS["70B"]
    long = ModelShape("70B, 32K", shape["n_params"], shape["layers"], shape["hidden"], shape["heads"],
                      seq_len=32768, global_batch=64, dropout=False)
    for recompute in ("none", "full"):
        best = search_layouts(long, Cluster(512), top=1, recompute=(recompute,))[0]
        micro = long.global_batch // best.layout.data
        assert best.layout.virtual == 1 or micro % best.layout.pipeline == 0, best.layout.label()
        if best.layout.pipeline > 1 and micro == 1:
            assert best.bubble_s == pytest.approx(best.compute_s * (best.layout.pipeline - 1))
    text = open("exercises/3f-choose-a-layout.md").read()
    assert "eight times longer" in text and "four times longer" not in text
    # Q2 and Q3 ask for reasoning the search does not print: which pipelines a lifted chunk limit helps, and
    # why a long-sequence layout keeps a pipeline under ZeRO-1 (priced by hand) until ZeRO-2 is allowed
    assert 'set(got["can_gain"]) == _can_gain' in text and "max_virtual=8, zero_stages=(1, 2)" in text
    assert '_flat.memory_bytes' in text


def test_a_small_layouts_prediction_divides_the_measured_one_process_step_and_adds_the_fitted_link():
    """Page 3.11's check on the reader's processes, by hand: a 0.1-s one-process step, alpha 100 us, 1 GB/s."""
    from lessonlib.calc.comm import Link
    from lessonlib.calc.layout import measured_cluster, step_flops

    tiny = ModelShape("t", 1e6, 2, 128, 4, 64, 4, dropout=False, bytes_per_value=4)
    assert step_flops(tiny) == pytest.approx((6e6 + 6 * 2 * 128 * 64) * 4 * 64)
    link = Link("fitted", 1e-4, 1e9)
    one = layout_cost(tiny, measured_cluster(tiny, 0.1, link, world_size=1), Layout(), kernel_efficiency=1.0)
    assert one.step_s == pytest.approx(0.1)  # one device: the measured step itself
    two = measured_cluster(tiny, 0.1, link)
    cost = {name: layout_cost(tiny, two, lay, kernel_efficiency=1.0) for name, lay in
            {"data": Layout(data=2, zero=0), "tensor": Layout(tensor=2), "pipeline": Layout(pipeline=2)}.items()}
    for c in cost.values():
        assert c.compute_s == pytest.approx(0.05)  # half the measured step on each process
    # data: 4 MB of fp32 gradients all-reduced in 3 pieces (2 layers and the rest), 2 ring steps each;
    # 4.6 ms, hidden behind a backward of 2/3 x 50 ms
    assert cost["data"].data_comm_total_s == pytest.approx(3 * 2 * (1e-4 + 4e6 / 3 / (2 * 1e9)))
    assert cost["data"].step_s == pytest.approx(0.05)
    # tensor: 4 all-reduces a layer, 2 layers, 4 micro-batches of one sequence of 64 x 128 fp32 values
    assert cost["tensor"].step_s == pytest.approx(0.05 + 32 * 2 * (1e-4 + 64 * 128 * 4 / (2 * 1e9)))
    # pipeline: the 1F1B bubble (p - 1) / m of the compute, and one send each way a micro-batch
    assert cost["pipeline"].bubble_s == pytest.approx(0.05 / 4)
    assert cost["pipeline"].step_s == pytest.approx(0.05 + 0.0125 + 4 * 2 * (1e-4 + 64 * 128 * 4 / 1e9))
    with pytest.raises(ValueError, match="one_process_step_s"):
        measured_cluster(tiny, 0, link)
    with pytest.raises(TypeError, match="link"):
        measured_cluster(tiny, 0.1, "nvlink")


def test_once_a_step_data_parallel_collectives_hide_only_behind_the_last_micro_batchs_backward():
    """A stage's gradients are final only during its last micro-batch's backward: with m micro-batches a copy, a
    reduction run once a step (ZeRO-1) hides behind 2/3 of the compute over m, not the whole backward."""
    lay = Layout(tensor=8, pipeline=4, data=2, zero=1)
    cost = layout_cost(SMALL, CLUSTER, lay, kernel_efficiency=1.0)
    micro = 512 // 2
    window = cost.compute_s * 2 / 3 / micro
    assert cost.data_comm_total_s > window  # this layout's reduction outlasts the window...
    assert cost.data_comm_s == pytest.approx(cost.data_comm_total_s - window)  # ...and only the window hides
    assert cost.data_comm_total_s < cost.compute_s * 2 / 3  # the whole backward would have hidden it all
    # hand arithmetic: 2 micro-batches of 1 s of compute each hide 1/2 of 2 x 2/3 s = 2/3 s of a 1 s reduction
    assert max(0.0, 1.0 - (2.0 * 2 / 3) / 2) == pytest.approx(1 / 3)
    # with one micro-batch a copy the last backward is the whole backward: all of it hides
    one = layout_cost(ModelShape("one", 8e9, 32, 4096, 32, 4096, 2), CLUSTER, lay, kernel_efficiency=1.0)
    assert one.data_comm_s == max(0.0, one.data_comm_total_s - one.compute_s * 2 / 3)


def test_one_memory_figure_for_metas_8k_layout_at_the_stated_assumptions():
    from lessonlib.calc.layout_search import PUBLISHED_ASSUMPTIONS, published_activation_bytes, published_layout_cost
    name = "Llama 3 405B, 8K context"
    model, cluster, published = published_models()[name]
    meta = published_layout_cost(name)
    settings = PUBLISHED_ASSUMPTIONS[name]
    # the assumptions are the search's best version of Meta's degrees under ZeRO-1 (page 3.11's limit)
    ranked = search_layouts(model, cluster, top=10**6, zero_stages=(1,))
    mine = next(c for c in ranked if rank_of(published, [c]))
    assert {k: getattr(mine.layout, k) for k in settings} == settings and mine == meta
    # activations with the interleaving factor, state at the stated ZeRO stage: one figure
    assert meta.activation_bytes == published_activation_bytes(name, recompute=settings["recompute"],
                                                               virtual=settings["virtual"])
    shard = math.ceil(405e9 / (8 * 16))
    assert meta.state_bytes == zero_state_bytes(shard, 128, settings["zero"]).total
    plain = published_layout_cost(name, recompute="none")  # the same layout with nothing recomputed
    assert plain.state_bytes == meta.state_bytes and not plain.fits
    for page in ("chapters/03-distributed-speedup/11-choose-a-layout.md",
                 "chapters/03-distributed-speedup/14-price-a-real-run.md"):
        assert "published_layout_cost(" in open(page).read(), page


def test_both_pages_name_recomputation_the_same_way():
    """'save_matmuls' (the weight products kept) on both pages; the stored scores are named as such."""
    import re
    for page in ("chapters/03-distributed-speedup/11-choose-a-layout.md",
                 "chapters/03-distributed-speedup/14-price-a-real-run.md"):
        src = open(page).read()
        # no mode is relabelled: 'save_matmuls' never stands for the fused-attention figure
        assert not re.search(r'recompute="full" if mode == "full" else "none"', src), page
    src = open("chapters/03-distributed-speedup/14-price-a-real-run.md").read()
    assert "scores stored" in src and 'recompute=mode' in src


def test_a_stages_state_by_part_is_2_plus_2_plus_12_over_n_at_zero_1():
    from lessonlib.calc.stage_memory import stage_state_bytes
    parts = stage_state_bytes(1e9, 3e9, data=8, expert=4, zero=1, dualpipe=True)
    assert parts.weights == pytest.approx(2 * 4e9) and parts.gradients == pytest.approx(2 * 4e9)
    assert parts.master_weights + parts.optimizer_state == pytest.approx(12 * (1e9 / 8 + 3e9 / 2))
    assert parts.second_copy == pytest.approx(parts.weights + parts.gradients)  # DualPipe: weights and gradients again
    model, cluster, published = published_models()["DeepSeek-V3"]
    cost = layout_cost(model, cluster, published)
    dense = (model.params - model.expert_params) / published.pipeline
    experts = model.expert_params / (published.expert * published.pipeline)
    assert cost.state_bytes == pytest.approx(stage_state_bytes(dense, experts, data=published.data,
                                                               expert=published.expert, zero=1,
                                                               dualpipe=True).total)


def test_the_term_by_term_table_has_short_labels():
    """The side-by-side table's first column stays narrow (at most 18 characters a label) so that it does not wrap."""
    import re
    from lessonlib.book.layout_reports import side_by_side_table
    model, cluster, published = published_models()["Llama 3 405B, 8K context"]
    cost = layout_cost(model, cluster, published)
    html = side_by_side_table(cost, cost)
    labels = re.findall(r"<tr>\s*<t[dh][^>]*>([^<]*)</t[dh]>", html)
    assert len(labels) > 10, html[:300]
    assert all(len(x) <= 18 for x in labels if not x.startswith("*")), labels


def test_the_layer_tensors_add_up_to_the_two_activation_counts():
    """The per-tensor list the layout page prints is the same count as the formulas: 32 bytes a token and
    hidden value with nothing recomputed (34 less the two dropout masks), 20 with the weight products kept."""
    from lessonlib.calc.memory import activation_bytes_per_layer
    from lessonlib.calc.recompute import matmul_outputs_bytes_per_layer
    from lessonlib.calc.stage_memory import LAYER_ACTIVATIONS
    s, h, a = 64, 32, 4
    none = 2 * sum(n for _, n, kept, _ in LAYER_ACTIVATIONS if kept)
    selective = 2 * sum(n for _, n, _, kept in LAYER_ACTIVATIONS if kept)
    assert none * s * h == activation_bytes_per_layer(s, 1, h, a) - 2 * s * h
    assert selective * s * h == matmul_outputs_bytes_per_layer(s, 1, h)


def test_dualpipe_keeps_one_micro_batch_more_than_1f1b():
    """DeepSeek-V3's report (Table 2): DualPipe's activations are p + 1 stage micro-batches, 1F1B's p."""
    import dataclasses
    model, cluster, published = published_models()["DeepSeek-V3"]
    p = published.pipeline
    dual = layout_cost(model, cluster, published)
    plain = layout_cost(model, cluster, dataclasses.replace(published, schedule="1f1b"))
    assert dual.activation_bytes == pytest.approx(plain.activation_bytes * (p + 1) / p)
    from lessonlib.calc.stage_memory import first_stage_activation_bytes
    one = first_stage_activation_bytes(4096, 1024, 16, 8, pipeline=4, micro_batches=2)
    assert first_stage_activation_bytes(4096, 1024, 16, 8, pipeline=4, micro_batches=2, dualpipe=True) == one
    with pytest.raises(ValueError):
        first_stage_activation_bytes(4096, 1024, 16, 8, pipeline=4, virtual=2, micro_batches=8, dualpipe=True)


def test_the_term_by_term_differences_are_those_of_the_shown_values():
    """Each difference in the side-by-side table is the second shown value less the first, as a reader checks it
    (not the difference of the unrounded values, which can differ from it in the last digit)."""
    import re
    from lessonlib.book.layout_reports import side_by_side_table
    from lessonlib.calc.layout_search import search_layouts
    model, cluster, published = published_models()["Llama 3 405B, 8K context"]
    best = search_layouts(model, cluster, top=1)[0]
    html = side_by_side_table(best, layout_cost(model, cluster, published))
    rows = re.findall(r"<tr>\s*<td[^>]*>([^<]*)</td>\s*<td[^>]*>([-+\d.]+)</td>\s*<td[^>]*>([-+\d.]+)</td>\s*"
                      r"<td[^>]*>([-+\d.]+)</td>", html)
    assert len(rows) >= 9, html[:400]
    for label, a, b, diff in rows:
        digits = len(diff.split(".")[1])
        assert diff == f"{round(float(b) - float(a), digits):+.{digits}f}", (label, a, b, diff)


def test_metas_reported_step_holds_its_parts():
    """Page 3.11 prints Meta's busiest device with the FP32 gradient buffer as a sum of parts: 16-bit weights, the
    stage's whole FP32 gradients, the sharded master weights and moments, and the activations. The parts add up to
    the total, and the buffer replaces ZeRO-1's whole 16-bit gradients (published_layout_cost's figure)."""
    from lessonlib.calc.layout_search import llama3_reported_step, published_layout_cost
    run, meta = llama3_reported_step(), published_layout_cost()
    st = run.state
    assert st.total + run.once.activation_bytes == pytest.approx(run.memory_bytes, rel=1e-12)
    assert run.memory_bytes == pytest.approx(run.once.memory_bytes + run.extra_bytes, rel=1e-12)
    shard = 405e9 / (8 * 16)
    assert st.weights == pytest.approx(2 * shard) and st.gradients == pytest.approx(4 * shard)  # whole, FP32
    assert st.master_weights + st.optimizer_state == pytest.approx(12 * shard / 128, rel=1e-6)
    assert run.once.activation_bytes == meta.activation_bytes
    zero1_grads = 2 * shard  # ZeRO-1 keeps the stage's whole 16-bit gradients
    assert run.memory_bytes - meta.memory_bytes == pytest.approx(st.gradients - zero1_grads, rel=1e-6)


def test_a_llama_layer_keeps_its_own_bytes_under_save_matmuls():
    """Page 3.11 puts a number on the gap between the GPT-shaped count and Llama 3 405B's layer (SwiGLU 3.25 h
    wide, 8 key/value heads of 128): kept, in h values a token, input 1 + Q 1 + K and V 2 x 8/128 + output
    projection 1 + gate and up 2 x 3.25 + down 1."""
    from lessonlib.calc.memory import llama_layer_constant
    from lessonlib.calc.published import LLAMA3_405B, LLAMA3_405B_KV_HEADS
    from lessonlib.calc.recompute import llama_matmul_outputs_constant, matmul_outputs_bytes_per_layer
    a, g = int(LLAMA3_405B["heads"].value), int(LLAMA3_405B_KV_HEADS.value)
    r = LLAMA3_405B["ffn"].value / LLAMA3_405B["hidden"].value
    assert r == 3.25
    assert llama_matmul_outputs_constant(a, g, r) == 2 * (1 + 1 + 2 * 8 / 128 + 1 + 2 * 3.25 + 1) == 21.25
    assert llama_layer_constant(a, g, ffn_ratio=r) == 31.75  # nothing recomputed: 32 for the GPT layer
    # no GQA and a SwiGLU 2 h wide keep the GPT layer's 20 (its MLP keeps 4 h then h; this one 2 x 2 h then h)
    assert llama_matmul_outputs_constant(32, 32, 2.0) * 64 * 32 == matmul_outputs_bytes_per_layer(64, 1, 32)
    with pytest.raises(ValueError, match="kv_heads"):
        llama_matmul_outputs_constant(128, 7)
