"""One count of attention's FLOPs across the course: causal (half the score matrix), from lessonlib.calc.mfu.

Readers found page 1.7 stating a causal share (about 4 % for the "7.5B" model) while calling it PaLM's count
(about 8 %), and page 2.3 counting the full matrix by hand. Every stated attention share now comes from
``mfu.attention_share`` (or ``mfu.model_hardware_flops``, which it wraps); PaLM's count is shown beside it.
"""
from __future__ import annotations

import re

import pytest

from conftest import ROOT
from lessonlib.calc import mfu, planner

CH1 = ROOT / "chapters" / "01-forward-vs-training"
CH2 = ROOT / "chapters" / "02-two-checkpoints"
PAGES = {"1.1": CH1 / "01-prediction-vs-step.md", "1.7": CH1 / "07-planning.md",
         "2.3": CH2 / "03-selective-recomputation.md"}


def test_attention_share_is_causal_by_default_and_palm_counts_twice_that():
    pr = planner.PRESETS["7.5B"]
    causal = mfu.attention_share(pr["n_params"], pr["layers"], 2048, pr["hidden"])
    palm = mfu.attention_share(pr["n_params"], pr["layers"], 2048, pr["hidden"], causal=False)
    assert palm == 2 * causal
    assert causal == pytest.approx(6 * pr["layers"] * 2048 * pr["hidden"] / (6 * pr["n_params"]))
    assert round(100 * causal) == 4 and round(100 * palm, 1) == 8.1  # the two shares readers compared on page 1.7


def test_page_1_7_states_both_shares_from_the_one_function():
    src = PAGES["1.7"].read_text(encoding="utf-8")
    lines = [ln for ln in src.splitlines() if re.match(r"(limit, seq|_pr|att_pct|palm_pct) = ", ln)]
    assert len(lines) == 4, lines
    ns = {"planner": planner, "attention_share": mfu.attention_share}
    exec("\n".join(lines), ns)  # the page's own lines, run against the library
    pr = planner.PRESETS["7.5B"]
    assert ns["att_pct"] == 100 * mfu.attention_share(pr["n_params"], pr["layers"], ns["seq"], pr["hidden"])
    assert ns["palm_pct"] == 2 * ns["att_pct"]
    assert "{att_pct:.0f} % more (page 1.1's causal count" in src and "{palm_pct:.0f} % by PaLM's full-matrix count" in src
    assert "as PaLM's paper counts it" not in src


def test_pages_count_attention_only_through_lessonlib():
    for page, path in PAGES.items():
        src = path.read_text(encoding="utf-8")
        assert "attention_share(" in src, page
        # no hand-typed attention term (the full-matrix 3 x 4 x s x h x L, or s / 6h typed as a share) outside
        # the page's checks, which compare the library with the algebra
        stated = "\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith("assert"))
        assert not re.search(r"3 \* 4 \* S7|/ \(6 \* (h|q_hidden)\)", stated), page
    one = " ".join(PAGES["1.1"].read_text(encoding="utf-8").split())
    assert "the course counts causal attention at half" in one and "PaLM's paper, Megatron-LM's formula and most published MFUs count" in one
    sel = PAGES["2.3"].read_text(encoding="utf-8")
    assert "training_flops(n7" not in sel  # the planner's 6ND-based count, with a full-matrix rerun, is gone here
