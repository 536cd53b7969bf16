"""Private and recent torch APIs sit behind guards: hide each one and lessonlib still imports and runs."""
from __future__ import annotations

import importlib
import sys
import tomllib

import pytest
import torch

from conftest import ROOT
from lessonlib.measure import compat


def _hide(monkeypatch, name):
    """Make ``compat.FEATURES[name]`` missing, as on an older torch."""
    module, attr, _ = compat.FEATURES[name]
    real = importlib.import_module(module)
    monkeypatch.delattr(real, attr)


def test_every_feature_exists_on_the_pinned_torch():
    assert compat.missing() == {}
    assert all(compat.feature(n) is not None for n in compat.FEATURES)


def test_the_report_checks_features_without_importing_them():
    """The first cell of every page prints the report; importing the private mem_tracker to look
    would cost it about a second."""
    import subprocess

    code = ("import sys; from lessonlib.measure.device import environment_report; environment_report(); "
            "print(sorted(m for m in sys.modules if m.startswith('torch.distributed._tools')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_a_feature_whose_file_is_absent_is_missing(monkeypatch):
    monkeypatch.setitem(compat.FEATURES, "mem_tracker", ("torch.distributed._tools.gone", "MemTracker", "the peak"))
    monkeypatch.setitem(compat.FEATURES, "flop_counter", ("nowhere_at_all.flops", "FlopCounterMode", "FLOPs"))
    assert compat.missing() == {"mem_tracker": "the peak", "flop_counter": "FLOPs"}


def test_declared_minimum_matches_compat():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"torch>={compat.MIN_TORCH}" in deps


def test_hidden_mem_tracker_module_gives_no_cpu_peak_and_the_report_says_so(monkeypatch):
    # A torch without the private module: importing it fails.
    monkeypatch.setitem(sys.modules, "torch.distributed._tools.mem_tracker", None)
    assert compat.feature("mem_tracker") is None
    from lessonlib.measure import device, memory, recompute
    from lessonlib.measure.models import ForecastMLP

    model = ForecastMLP(window=8, hidden=16, layers=2)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    led = memory.measure_training_memory(model, x, y, torch.nn.functional.mse_loss,
                                         torch.optim.Adam(model.parameters()))
    assert led.peak is None and led.weights > 0 and led.activations > 0
    stack = recompute.block_stack(2, hidden=8)
    assert recompute.peak_step_memory(stack, recompute.make_input(stack, 2, 4), "none") is None
    report = device.environment_report("cpu")
    assert "not measured with this torch" in report and "MemTracker" in report


def test_hidden_flop_counter_fails_with_a_message_not_at_import():
    # In a fresh interpreter: re-importing modules here would leave two copies of their
    # classes behind for the tests that run after this one.
    code = """
import torch, torch.utils.flop_counter as fcm
del fcm.FlopCounterMode                       # a torch without it
from lessonlib.measure import compat, recompute, timing   # imports without it
from lessonlib.measure.models import ForecastMLP
try:
    timing.count_flops(ForecastMLP(window=8, hidden=16, layers=2), torch.randn(4, 8))
except compat.Unavailable as e:
    assert "FlopCounterMode" in str(e), e
else:
    raise SystemExit("count_flops did not refuse")
stack = recompute.block_stack(2, hidden=8)
try:
    recompute.forward_flops(stack, recompute.make_input(stack, 2, 4))
except compat.Unavailable as e:
    assert "cannot measure FLOP counts" in str(e), e
else:
    raise SystemExit("forward_flops did not refuse")
"""
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_hidden_early_stop_switch_still_trains(monkeypatch):
    _hide(monkeypatch, "checkpoint_early_stop")
    from lessonlib.measure import recompute

    assert "checkpoint_early_stop" in compat.missing()
    stack = recompute.block_stack(2, hidden=8)
    loss = recompute.train_step(stack, recompute.make_input(stack, 2, 4), "per-block", early_stop=False)
    assert torch.isfinite(loss)


def test_unknown_feature_name_is_a_value_error():
    with pytest.raises(ValueError, match="name must be one of"):
        compat.feature("nope")
