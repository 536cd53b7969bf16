"""lessonlib.calc.hardware: one table of devices, used by every page that turns FLOPs into time."""
from __future__ import annotations

import doctest
import re

import nbformat
import pytest

from conftest import ROOT
from lessonlib.calc import hardware as D
from lessonlib.calc.planner import PRESETS, SECONDS_PER_DAY, single_device_seconds, training_flops
from lessonlib.book.reports import plan_html


def test_doctests():
    assert doctest.testmod(D).failed == 0


def test_table_states_peaks_with_sources_and_a_utilisation():
    for name, dev in D.DEVICES.items():
        assert dev.name == name and dev.peak_flops_per_s > 1e14 and dev.memory_bytes in (40e9, 80e9)
        assert "datasheet" in dev.source and dev.memory_bandwidth > 1e12 and dev.power_watts >= 300
        # the source states the dense rate the table holds (or the sparse rate, twice it)
        assert f"{dev.peak_flops_per_s / 1e12:,.1f}".rstrip("0").rstrip(".") in dev.source.replace(",", "") \
            or f"{dev.peak_flops_per_s / 1e12:,.0f}" in dev.source
    # The devices of the course's published runs: H800, A100 40GB, H100 SXM and PCIe
    for name in ("H800 SXM 80GB", "A100 SXM 40GB", "H100 SXM 80GB", "H100 PCIe 80GB"):
        assert name in D.DEVICES
    assert D.device("H100 PCIe 80GB").peak_flops_per_s == pytest.approx(1513e12 / 2, rel=1e-3)
    assert D.device("H800 SXM 80GB").peak_flops_per_s == D.device("H100 SXM 80GB").peak_flops_per_s
    assert D.device("A100 SXM 40GB").memory_bytes == 40e9
    # dense BF16 = half the "with sparsity" figure on the H100 datasheet (1,979 TFLOPS)
    assert D.device("H100 SXM 80GB").peak_flops_per_s == pytest.approx(1979e12 / 2, rel=1e-3)
    assert 0 < D.UTILISATION < 1
    assert D.sustained_flops_per_s() == D.device().peak_flops_per_s * D.UTILISATION


def test_rate_text_prints_the_rate_used():
    # 3.958e14, not a rounder 4.0e14 (the rate printed must be the rate computed)
    assert D.rate_text(D.sustained_flops_per_s()) == "3.958 × 10¹⁴ FLOP/s"
    assert D.rate_text(4e14) == "4 × 10¹⁴ FLOP/s"
    with pytest.raises(ValueError, match="flops_per_s"):
        D.rate_text(0)


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
    assert D.rate_text(D.sustained_flops_per_s()) in html   # the rate it used, printed as used (not 4e+14)


PAGES = ["chapters/01-forward-vs-training/07-planning.ipynb",
         "chapters/03-distributed-speedup/10-bytes-into-time.ipynb",
         "chapters/03-distributed-speedup/06-tensor-parallel-for-real.ipynb",
         "chapters/03-distributed-speedup/07-sequence-and-context-parallel.ipynb",
         "exercises/3e-shard-the-state.ipynb"]


@pytest.mark.parametrize("page", PAGES)
def test_pages_take_the_rate_from_the_table_and_type_none(page):
    # Both pages price the same 1.3B model; with one rate they give the same single-device days.
    code = "\n".join(c.source for c in nbformat.read(ROOT / page, as_version=4).cells if c.cell_type == "code")
    assert "sustained_flops_per_s(" in code  # the table's rate, at the stated utilisation or a named share
    assert not re.search(r"\b(rate|peak)\s*=\s*[\d._]+(e\d+)?\b", code), "a device rate typed into the page"


def test_fp8_peaks_are_twice_the_bf16_peaks_where_the_datasheet_gives_one():
    # the H100's datasheet: FP8 3,958 TFLOPS with sparsity (1,979 dense), twice its BF16; the A100 has no FP8
    for name, dev in D.DEVICES.items():
        assert dev.fp8_peak_flops_per_s == 0.0 or dev.fp8_peak_flops_per_s == pytest.approx(2 * dev.peak_flops_per_s, rel=1e-3), name  # the sheets round
    assert D.device("H100 SXM 80GB").fp8_peak_flops_per_s == 1979e12
    assert D.device("A100 SXM 80GB").fp8_peak_flops_per_s == 0.0


def test_chinchilla_gives_twenty_tokens_per_parameter():
    from lessonlib.calc import published
    c = published.CHINCHILLA
    assert round(c["tokens"].value / c["params"].value) == 20
    assert published.LLAMA3_8B["tokens"].value / published.LLAMA3_8B["params"].value > 1000
