"""One model of scale: lessonlib.calc.scale, mfu and bill."""
from __future__ import annotations

import doctest
import re

import pytest

from conftest import ROOT
from lessonlib.calc import bill as B, mfu as M, pricing, scale as S
from lessonlib.calc import hardware as D, published as pub
from lessonlib.calc.amdahl import speedup_from_share

L3 = {k: f.value for k, f in pub.LLAMA3_405B.items()}


@pytest.mark.parametrize("module", [S, M, B])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


# --- the reconciled account at 16,384 devices ------------------------------------------------------------

def test_the_account_starts_from_published_figures_and_the_kernel_efficiency():
    # the account once rested on Amdahl's form fitted to Table 4's drop (430 -> 400 TFLOP/s per GPU), which
    # put what one GPU sustains with nothing to wait for at 465 TFLOP/s; the layout model prices compute at the
    # kernel efficiency (60 %). One rate now: the kernel efficiency, and the fit is a contrast.
    a = S.llama3_scale()
    assert a.world_size == L3["gpus"] == 16384
    peak = D.device(pub.LLAMA3_DEVICE).peak_flops_per_s
    assert a.mfu == pytest.approx(400e12 / peak) and round(100 * a.mfu, 1) == 40.4
    assert a.kernel_efficiency == D.KERNEL_EFFICIENCY
    # published only: MFU x effective training time, against the bill's 6ND over the GPU-hours
    assert a.goodput.useful_fraction == pytest.approx(L3["effective_training"])
    assert a.stage_utilisation == pytest.approx(a.mfu * L3["effective_training"])
    assert a.bill_utilisation == pytest.approx(6 * 405e9 * 15.6e12 / (30.84e6 * 3600 * peak))
    assert a.bill_utilisation < a.stage_utilisation < a.mfu < a.kernel_efficiency
    # one-device hours: the same shares over the kernel efficiency
    assert a.step_efficiency == pytest.approx(a.mfu / D.KERNEL_EFFICIENCY)
    assert a.per_device_hour == pytest.approx(a.step_efficiency * a.goodput.useful_fraction)
    assert a.bill_per_device_hour == pytest.approx(a.bill_utilisation / D.KERNEL_EFFICIENCY)
    # the fit is kept as a contrast, and it still reproduces the published drop
    f = a.fit
    assert (f.world_size_low, f.throughput_low, f.world_size_high, f.throughput_high) == (8192, 430, 16384, 400)
    r = 400 / 430
    s = (1 - r) / (r * 16383 - 8191)
    assert a.serial_share == pytest.approx(s) and 9.8e-6 < a.serial_share < 1.0e-5
    assert f.efficiency_high / f.efficiency_low == pytest.approx(r)
    # the ladder: kernel rate, step, stage, bill; then the contrast
    rungs = S.scale_ladder(a)
    assert [x.utilisation for x in rungs[:4]] == sorted([x.utilisation for x in rungs[:4]], reverse=True)
    assert all(x.per_device_hour == pytest.approx(x.utilisation / a.kernel_efficiency) for x in rungs)
    with pytest.raises(ValueError, match="kernel_efficiency"):
        S.scale_account(f, 0.7, 1e9, 1e6, 1e15, 3e12, 1e5, 10, 60, 0.3)


def test_fit_serial_share_limits_and_refusals():
    assert S.fit_serial_share(8, 100, 16, 100).serial_share == 0 == S.fit_serial_share(8, 1, 16, 1).serial_share
    # nothing divides (s = 1): E = 1/N, so throughput per device halves from 8 to 16
    assert S.fit_serial_share(8, 100, 16, 50).serial_share == pytest.approx(1)
    with pytest.raises(ValueError, match="throughput_high"):
        S.fit_serial_share(8, 100, 16, 120)            # a rise fits no serial share
    with pytest.raises(ValueError, match="falls faster"):
        S.fit_serial_share(8, 100, 16, 40)             # below 1/N: beyond Amdahl
    with pytest.raises(ValueError, match="world_size_high"):
        S.fit_serial_share(16, 100, 8, 90)
    assert S.efficiency_from_share(0, 16384) == 1


def test_the_contrast_is_the_strong_scaling_collapse():
    a = S.llama3_scale()
    assert a.contrast_speedup == pytest.approx(1 / (0.001 + 0.999 / 16384))       # 942.5x
    assert round(a.contrast_speedup, 1) == 942.5
    assert a.contrast_per_device_hour < 0.06 < 10 * a.contrast_per_device_hour < a.per_device_hour
    # the contrast's 0.1 % is far above the update's share a data-parallel job would repeat, and the fitted share
    assert a.contrast_serial_share > 10 * a.update_share > 10 * a.serial_share
    assert "a fixed serial share of 0.1 %" in S.scale_ladder(a)[-1].what


def test_zero_removes_the_repeated_update():
    a = S.llama3_scale()
    # every replica repeating the whole update would cost a large share at 16,384 devices ...
    assert a.update_efficiency_dp < 0.7
    # ... the tensor x pipeline layout splits it 128 ways; ZeRO splits the rest, leaving nothing repeated
    assert a.model_parallel == 128 and a.update_efficiency_dp < a.update_efficiency_layout < 1
    # by hand: update 32 B/param at 3.35 TB/s, compute 6 N B at the kernel efficiency of 989.4 TFLOP/s
    t_u = 32 * 405e9 / 3.35e12
    t_c = 6 * 405e9 * 16e6 / (989.4e12 * D.KERNEL_EFFICIENCY)
    assert a.update_share == pytest.approx(t_u / (t_u + t_c))


def test_scale_account_refuses_bad_input():
    args = dict(fit=S.fit_serial_share(8, 100, 16, 95), mfu=0.4, n_params=1e9, tokens_per_step=1e6,
                peak_flops_per_s=1e15, memory_bandwidth=3e12, device_mtbf_hours=1e5, checkpoint_seconds=10,
                restart_seconds=60, bill_utilisation=0.3, model_parallel=4)
    S.scale_account(**args)
    for name, bad in [("mfu", 1.5), ("model_parallel", 3), ("bill_utilisation", 0)]:
        with pytest.raises(ValueError, match=name):
            S.scale_account(**{**args, name: bad})
    with pytest.raises(TypeError, match="fit"):
        S.scale_account(**{**args, "fit": 0.01})
    for bad in (-1, 20, 500):       # negative; a drop beyond Amdahl's law; a rise
        with pytest.raises(ValueError, match="tflops_at_16k"):
            S.llama3_scale(bad)


PAGES = {"13": "chapters/03-distributed-speedup/13-goodput.md"}


def test_one_page_prints_the_one_account_and_the_other_links_to_it():
    # The goodput page calls the one function and prints its fields, never typed numbers; the page that prices
    # the run links to it instead of printing the same table again.
    a = S.llama3_scale()
    for key, path in PAGES.items():
        text = (ROOT / path).read_text()
        assert "llama3_scale()" in text, key
        for field in ("per_device_hour", "bill_per_device_hour", "contrast_per_device_hour", "step_efficiency",
                      "stage_utilisation", "bill_utilisation", "fit.throughput_low",
                      "fit.throughput_high", "goodput.useful_fraction"):
            assert f".{field}" in text, (key, field)
        for typed in (f"{a.per_device_hour:.2f}", f"{a.bill_per_device_hour:.2f}", f"{a.contrast_per_device_hour:.3f}",
                      f"{a.contrast_speedup:.1f}", f"{a.step_efficiency:.2f}", f"{a.serial_share:.1e}"):
            assert not re.search(rf"(?<![\d.]){re.escape(typed)}(?![\d])", text), (key, typed)
        assert "one_device_utilisation" not in text and "every device repeats the update (the contrast" not in text
        # no rate "with nothing to wait for" from Amdahl's fit: the kernel efficiency is the one such rate
        assert "r_u1_pct" not in text and "r_t0" not in text
        assert text.count("ladder_table(") == 1, key
    page14 = (ROOT / "chapters/03-distributed-speedup/14-price-a-real-run.md").read_text()
    assert "13-goodput.ipynb" in page14 and "ladder_table(" not in page14 and "scale_report(" not in page14


def test_the_goodput_figure_title_is_rounded(monkeypatch):
    from lessonlib.book import speedup_plots as P
    seen = {}

    def capture(ns, rows, no_failure, title, **kwargs):
        seen["title"] = title
        raise RuntimeError("stop")

    monkeypatch.setattr(P, "plot_goodput_failures", capture)
    with pytest.raises(RuntimeError):
        P.goodput_figure([1, 16384], 0.001, 32.768, 312.177)
    assert seen["title"] == "Serial share 0.1%, saves of 33 s, restarts of 5.2 min"


def test_page_14_validation_table_compares_no_figure_with_itself():
    text = (ROOT / "chapters/03-distributed-speedup/14-price-a-real-run.md").read_text()
    table = text[text.index("# @title Published against computed (table)"):]
    table = table[:table.index("```")]
    assert '"training FLOPs"' not in table and "MFU, lowest configuration" not in table
    assert "inputs, not checks" in text and "undershoot the bill" not in text
    assert "nominal capacity" in text and "comes near fitting" not in text


# --- MFU and HFU ------------------------------------------------------------------------------------------

def test_recomputation_raises_hfu_and_not_mfu():
    f = {r: M.model_hardware_flops(405e9, 16e6, 126, 8192, 16384, recompute=r) for r in M.RECOMPUTE}
    assert len({x.model for x in f.values()}) == 1                       # model FLOPs: one value
    assert f["none"].hardware < f["attention"].hardware < f["full"].hardware
    # at one step time, MFU is the same and HFU grows; full recomputation adds a third of the dense work
    step = f["none"].model / (16384 * 989.4e12 * 0.4)
    mfus = {r: M.flops_utilisation(x.model, step, 989.4e12, 16384) for r, x in f.items()}
    hfus = {r: M.flops_utilisation(x.hardware, step, 989.4e12, 16384) for r, x in f.items()}
    assert mfus["none"] == pytest.approx(0.4) and len({round(v, 12) for v in mfus.values()}) == 1
    assert hfus["none"] == pytest.approx(0.4)
    assert hfus["none"] < hfus["attention"] < hfus["full"]
    assert M.hfu_from_mfu(0.4, f["full"]) == pytest.approx(hfus["full"])
    assert f["full"].recomputed == pytest.approx(f["none"].dense / 3 + f["none"].attention / 3)


def test_causal_attention_counts_half():
    full = M.model_hardware_flops(405e9, 1, 126, 8192, 16384, causal=False)
    causal = M.model_hardware_flops(405e9, 1, 126, 8192, 16384)
    assert full.attention == 12 * 126 * 8192 * 16384 and causal.attention == full.attention / 2
    assert causal.dense == full.dense == 6 * 405e9


def test_utilisation_above_one_is_refused_with_the_likely_cause():
    with pytest.raises(ValueError, match="active parameters"):
        M.flops_utilisation(6 * 671e9 * 14.8e12, 2.788e6 * 3600, 989e12)


def test_palm_reports_both():
    assert pub.PALM_540B["mfu"].value < pub.PALM_540B["hfu"].value


# --- mixture of experts in the pricing functions -----------------------------------------------------------

def test_active_parameters_price_the_flops_total_the_memory():
    ds = {k: f.value for k, f in pub.DEEPSEEK_V3.items()}
    h800 = D.device(pub.DEEPSEEK_V3_DEVICE)
    p = pricing.price_run(ds["total_params"], ds["tokens"], h800.peak_flops_per_s, 0.4, h800.memory_bytes,
                          active_params=ds["active_params"])
    assert p.flops == 6 * 37e9 * 14.8e12 and p.state_bytes == 16 * 671e9
    assert p.devices_for_state == -(-16 * 671e9 // 80e9)
    # the active count gives a bill that implies a utilisation a device can reach ...
    u = pricing.implied_utilisation(p.flops, ds["gpu_hours"], h800.peak_flops_per_s)
    assert 0.1 < u < 0.6
    # ... the total count is refused, and the message names the likely cause
    with pytest.raises(ValueError, match="total parameters"):
        pricing.implied_utilisation(6 * 671e9 * 14.8e12, 2.788e6, 989e12)
    with pytest.raises(ValueError, match="active_params"):
        pricing.price_run(37e9, 1e12, 1e15, 0.4, 80e9, active_params=671e9)
    dense = pricing.price_run(7e9, 1e12, 1e15, 0.4, 80e9)
    assert dense.active_params == dense.total_params == 7e9


# --- the bill in money and energy --------------------------------------------------------------------------

def test_deepseek_v3_dollars_are_the_reports():
    ds = pub.DEEPSEEK_V3
    b = B.bill(ds["gpu_hours"].value, ds["price_per_gpu_hour"].value, D.device(pub.DEEPSEEK_V3_DEVICE).power_watts)
    assert b.dollars == pytest.approx(ds["dollars"].value)


def test_llama31_energy_and_the_cards_emissions():
    e = pub.LLAMA31_405B_ENERGY
    hours = L3["gpu_hours"]
    assert e["tdp_watts"].value == D.device(pub.LLAMA3_DEVICE).power_watts == 700
    mwh = B.energy_mwh(hours, e["tdp_watts"].value)
    assert mwh == pytest.approx(30.84e6 * 0.7 / 1e3)                  # 21,588 MWh
    intensity = B.carbon_intensity(e["location_tco2"].value, hours, e["tdp_watts"].value)
    assert 0.3 < intensity < 0.5                                       # a grid's average, tCO2 per MWh
    assert B.bill(hours, 2.0, 700, intensity).tco2 == pytest.approx(e["location_tco2"].value)


def test_bill_refuses_bad_input():
    with pytest.raises(ValueError, match="pue"):
        B.energy_mwh(10, 700, pue=0.5)
    with pytest.raises(ValueError, match="price_per_device_hour"):
        B.bill(10, -1, 700)
    with pytest.raises(ValueError, match="carbon intensity"):
        B.carbon_intensity(1e9, 10, 700)


def test_the_throughput_drop_is_page_3_11s_step_model_at_both_sizes():
    # 3.13 explains Table 4's drop from 8,192 to 16,384 GPUs with the step 3.11 prices: at 16,384 the two agree,
    # and the drop splits exactly into the bubble and the exposed data-parallel time (the rest grows with compute)
    from lessonlib.calc.layout_search import llama3_reported_step
    d, run = S.llama3_throughput_drop(), llama3_reported_step()
    assert d.world_sizes == (8192, 16384)
    assert d.mfu[1] == pytest.approx(run.mfu, rel=1e-12) and d.step_s[1] == pytest.approx(run.step_s, rel=1e-12)
    assert d.data_comm_s[1] == pytest.approx(run.data_comm_s, rel=1e-12) and d.bubble_s[1] == run.once.bubble_s
    assert d.compute_s[0] == pytest.approx(2 * d.compute_s[1]) and d.bubble_s[0] == pytest.approx(d.bubble_s[1])
    assert d.bubble_part + d.data_part == pytest.approx(d.drop, rel=1e-9)
    assert d.bubble_part > d.data_part > 0
