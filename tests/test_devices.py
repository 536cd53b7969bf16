"""lessonlib.calc.devices: one table of devices, used by every page that turns FLOPs into time."""
from __future__ import annotations

import doctest
import re

import nbformat
import pytest

from conftest import ROOT
from lessonlib.calc import devices as D
from lessonlib.calc.planner import PRESETS, SECONDS_PER_DAY, single_device_seconds, training_flops
from lessonlib.book.reports import plan_html


def test_doctests():
    assert doctest.testmod(D).failed == 0


def test_table_states_peaks_with_sources_and_a_utilisation():
    for name, dev in D.DEVICES.items():
        assert dev.name == name and dev.peak_flops_per_s > 1e14 and dev.memory_bytes == 80e9
        assert "datasheet" in dev.source
    # dense BF16 = half the "with sparsity" figure on the H100 datasheet (1,979 TFLOPS)
    assert D.device("H100 SXM 80GB").peak_flops_per_s == pytest.approx(1979e12 / 2, rel=1e-3)
    assert 0 < D.UTILISATION < 1
    assert D.sustained_flops_per_s() == D.device().peak_flops_per_s * D.UTILISATION


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="name.*TPU v9"):  # the argument is called name
        D.device("TPU v9")
    with pytest.raises(ValueError, match="utilisation"):
        D.sustained_flops_per_s(utilisation=1.5)
    with pytest.raises(ValueError, match="utilisation"):
        D.sustained_flops_per_s(utilisation=0)


def test_the_planner_report_uses_the_table():
    days = single_device_seconds(training_flops(PRESETS["1.3B"]["n_params"], 20 * PRESETS["1.3B"]["n_params"]),
                                 D.sustained_flops_per_s()) / SECONDS_PER_DAY
    html = plan_html("1.3B", "adam", "bf16_master", 2, 2048, "none", 80)
    assert f"{days:,.1f} days" in html


PAGES = ["chapters/01-forward-vs-training/07-planning.ipynb", "chapters/03-distributed-speedup/13-goodput.ipynb"]


@pytest.mark.parametrize("page", PAGES)
def test_pages_take_the_rate_from_the_table_and_type_none(page):
    # Both pages price the same 1.3B model; with one rate they give the same single-device days.
    code = "\n".join(c.source for c in nbformat.read(ROOT / page, as_version=4).cells if c.cell_type == "code")
    assert "sustained_flops_per_s()" in code
    assert not re.search(r"\b(rate|peak)\s*=\s*[\d._]+(e\d+)?\b", code), "a device rate typed into the page"
