"""One value per quantity: no page types a quantity that another page computes.

The registry is ``lessonlib.calc.published.SHARED_QUANTITIES``: for each shared quantity (a device rate, a
utilisation, a model size, an all-reduce time) the place its value comes from and a pattern that finds it typed
as a literal in a page's text source. Every page states these through the library, so two pages cannot state
the same quantity differently; a typed literal is allowed only where ALLOWED says why it is not that quantity.
"""
from __future__ import annotations

import re

import pytest

from conftest import ROOT
from lessonlib.calc.published import SHARED_QUANTITIES

# (page, typed text, why it is not the shared quantity)
ALLOWED = {
    ("chapters/01-forward-vs-training/07-planning.md", "5 × 10¹⁴ FLOP/s"):
        "a quiz's invented device: the question gives its own rate to divide by",
    ("chapters/01-forward-vs-training/03-activations.md", "1 B parameters"):
        "a quiz's invented colleague's model, not a preset or a published run",
}


def pages():
    return sorted([*ROOT.glob("chapters/*/*.md"), *ROOT.glob("exercises/*.md")])


def typed_quantities(text: str) -> list:
    """(quantity, typed text, line) for every shared quantity typed as a literal in ``text``."""
    found = []
    for name, q in SHARED_QUANTITIES.items():
        for m in re.finditer(q.typed, text):
            found.append((name, m.group(0), text.count("\n", 0, m.start()) + 1))
    return found


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_types_a_shared_quantity(page):
    rel = str(page.relative_to(ROOT))
    typed = [(name, t, line) for name, t, line in typed_quantities(page.read_text()) if (rel, t) not in ALLOWED]
    assert not typed, (f"{rel} types shared quantities instead of computing them: "
                       + "; ".join(f"line {line}: {t!r} ({name}: compute it from "
                                   f"{SHARED_QUANTITIES[name].computed_by})" for name, t, line in typed))


def test_every_allowed_literal_is_still_there():
    # an allowance whose text is gone is stale: drop it, so the list stays a list of real exceptions
    for (rel, t), _why in ALLOWED.items():
        assert t in (ROOT / rel).read_text(), (rel, t)


@pytest.mark.parametrize("planted, quantity", [
    ("each device sustains 4.0e14 FLOP/s", "device rate"),
    ("an H100 sustains 396 TFLOP/s", "device rate"),
    ("flops_per_gpu_s = 4e14  # sustained", "device rate"),
    ("at 40 % of its peak", "utilisation"),
    ("the run reached 38 % MFU", "utilisation"),
    ("a 7.5B-parameter model", "model size"),
    ("the all-reduce takes 2.03 ms", "all-reduce time"),
    ("1,953 sequences of 8,192 tokens", "Llama 3 batch"),
    ("about 15 per replica", "Llama 3 batch"),
    ("975,000 steps", "Llama 3 batch"),
])
def test_the_check_finds_a_planted_typed_value(planted, quantity):
    # plant a typed value into a real page's text: the check must name it
    text = (ROOT / "chapters/03-distributed-speedup/13-goodput.md").read_text()
    assert not typed_quantities(text)
    found = typed_quantities(text + "\n" + planted + "\n")
    assert [name for name, _t, _line in found] == [quantity], found


def test_computed_values_are_not_flagged():
    # what a page writes when it computes: an f-string field, never a literal
    for ok in ("sustains {rate_text(rate)}", "{rate:.4g} FLOP/s", "at {util:.0f} % of its peak",
               "a {n / 1e9:.1f}B-parameter model", "the all-reduce takes {t_ms:.2f} ms"):
        assert not typed_quantities(ok), ok


def test_llama3_batch_is_one_value():
    # Table 4's batch per replica times the data-parallel degree is the 16M-token batch that pages 3.2 and 3.11
    # state; the layout search's own reading of "16M tokens" (a power of two of sequences) must give the same.
    import math
    from lessonlib.calc.published import LLAMA3_405B as L
    dp = L["gpus"].value // (L["tp"].value * L["pp"].value)
    seqs = L["batch_per_dp_16k"].value * dp
    assert dp == 128 and seqs == 2048 and seqs * L["seq_len"].value == 2 ** 24
    assert seqs == 2 ** round(math.log2(L["tokens_per_batch"].value / L["seq_len"].value))


def test_llama3_table4_mfu_rows_match_their_throughput():
    # each printed MFU is within a point of its row's TFLOP/s over the H100's dense BF16 peak (40.4 % prints 41 %)
    from lessonlib.calc.hardware import device
    from lessonlib.calc.published import LLAMA3_405B as L, LLAMA3_DEVICE
    peak = device(LLAMA3_DEVICE).peak_flops_per_s
    for tflops, mfu in (("tflops_8k_gpus", "mfu_8k_gpus"), ("tflops_16k_gpus", "mfu_16k_gpus"),
                        ("tflops_16k_long", "mfu_16k_long")):
        assert abs(L[tflops].value * 1e12 / peak - L[mfu].value) <= 0.01, (tflops, mfu)
    assert L["mfu_low"].value == L["mfu_16k_long"].value and L["mfu_high"].value == L["mfu_8k_gpus"].value


def test_metas_model_mfu_is_one_value_on_pages_3_11_and_3_13():
    """Pages 3.11 and 3.13 state the layout model's MFU for Meta's 8K run from one call, llama3_reported_step, at
    the assumptions published_layout_cost uses (3.13's bubble account takes its chunks v from the same place)."""
    from lessonlib.calc.layout_search import PUBLISHED_ASSUMPTIONS, llama3_reported_step, published_layout_cost
    run, meta = llama3_reported_step(), published_layout_cost()
    settings = PUBLISHED_ASSUMPTIONS["Llama 3 405B, 8K context"]
    assert run.once.layout.virtual == meta.layout.virtual == settings["virtual"]
    assert run.once.layout.recompute == meta.layout.recompute == settings["recompute"]
    assert abs(run.mfu - meta.mfu) > 0.005  # two pricings differ: a page that took the other would disagree
    layout = (ROOT / "chapters/03-distributed-speedup/11-choose-a-layout.md").read_text()
    goodput = (ROOT / "chapters/03-distributed-speedup/13-goodput.md").read_text()
    assert "run = llama3_reported_step()" in layout and "{100 * run.mfu:.0f} % MFU**" in layout
    assert "l_run = llama3_reported_step()" in goodput and "l_mfu_pct = 100 * l_run.mfu" in goodput
    assert "l_mine = published_layout_cost()" in goodput and "search_layouts(" not in goodput
