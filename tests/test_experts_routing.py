"""Experts as they are run: capacity and dropped tokens, the load-balancing loss, 6ND with active parameters,
and the all-to-alls of forward and backward; the four-splits page says so."""
from __future__ import annotations

import pathlib
import re

import pytest
import torch

from lessonlib.calc.experts import (active_parameters, dropped_tokens, expert_capacity, load_balancing_loss,
                                    process_load_imbalance)
from lessonlib.calc.planner import training_flops
from lessonlib.measure.routing import MoELayer, route_top_k, train_router
from lessonlib.measure.timing import count_flops

PAGE = pathlib.Path(__file__).resolve().parents[1] / "chapters/03-distributed-speedup/04-four-splits.md"


def test_capacity_and_drops_formula_against_the_router():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(300, 6, generator=g)
    scores[:, 2] += 1.5
    for k in (1, 2):
        for factor in (0.5, 1.0, 1.25, 3.0):
            cap = expert_capacity(300, 6, top_k=k, capacity_factor=factor)
            r = route_top_k(scores, top_k=k, capacity=cap)
            assert sum(r.assigned) == 300 * k
            assert all(kept == min(a, cap) for a, kept in zip(r.assigned, r.kept))
            assert r.dropped == dropped_tokens(r.assigned, cap)
    assert expert_capacity(512, 4, top_k=1, capacity_factor=1.0) == 128
    with pytest.raises(ValueError, match="top_k"):
        expert_capacity(10, 4, top_k=5)
    with pytest.raises(ValueError, match="capacity"):
        dropped_tokens([1, 2], capacity=-1)


def test_load_balancing_loss_range():
    assert load_balancing_loss([0.5, 0.5], [0.5, 0.5]) == 1.0
    assert load_balancing_loss([1.0, 0.0], [0.9, 0.1]) == pytest.approx(1.8)
    with pytest.raises(ValueError, match="mean_probability"):
        load_balancing_loss([0.5, 0.5], [0.5])


def test_balancing_loss_lowers_the_busiest_process():
    t = train_router(tokens=256, experts=4, skew=2.0, steps=25, aux_weight=0.5)
    assert sum(t.before) == sum(t.after_plain) == sum(t.after_balanced) == 256
    assert process_load_imbalance(t.after_balanced, 2) < process_load_imbalance(t.after_plain, 2)
    assert t.aux_balanced < t.aux_plain < t.aux_before


def test_6nd_counts_active_parameters():
    moe = MoELayer(8, experts=4, top_k=2)
    x = torch.randn(32, 8, requires_grad=True)
    per_expert = sum(p.numel() for p in moe.experts[0].parameters())
    n_active = active_parameters(shared=8 * 4, per_expert=per_expert, top_k=2, experts=4)
    assert count_flops(moe, (x,)).total == training_flops(n_active, 32)


def test_page_counts_four_all_to_alls_and_the_busiest_process():
    text = PAGE.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| **Expert parallelism**"))
    assert "twice per expert layer |" not in row and "four" in row and "backward" in row
    takeaways = text[text.index("## Key takeaways"):]
    assert "busiest expert sets the pace" not in takeaways
    assert re.search(r"busiest\s+\*?process\*?\s+sets the pace", takeaways)
    assert 'fwd_a2a == {2} and bwd_a2a == {2}' in text  # the counts come from CommDebugMode in the run


@pytest.mark.slow
def test_all_to_alls_counted_in_forward_and_backward():
    from lessonlib.measure.distributed.splits import run_splits

    runs = run_splits(ep=(dict(tokens=64, hidden=16, experts_per_rank=2, skew=0.0),), world_size=2)
    for r in runs["expert"][0]:
        assert (r["all_to_all_forward"], r["all_to_all_backward"]) == (2, 2)
    for r in runs["ring"]:  # the ring all-reduce of the same launch: dist.all_reduce's sum, 2(n - 1)/n of the bytes
        assert r["allclose"] and r["bytes_sent"] == r["tensor_bytes"]
