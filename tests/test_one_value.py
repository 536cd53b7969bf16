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
