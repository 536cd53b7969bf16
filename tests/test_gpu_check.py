"""scripts/gpu_check.py: clear without CUDA, and its per-notebook summary of lessonlib's records."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import ROOT
import gpu_check
from lessonlib.measure import record


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script would run")
def test_without_cuda_it_says_so_and_fails():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout.strip() == "no CUDA device: nothing to check"


def test_cuda_hidden_gives_the_same_message(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 2
    assert "no CUDA device: nothing to check" in capsys.readouterr().out


def test_measurements_are_recorded_only_when_asked(tmp_path, monkeypatch):
    from lessonlib.measure.memory import measure_training_memory
    from lessonlib.measure.models import ForecastMLP
    from lessonlib.measure.timing import time_training_step

    model = ForecastMLP(window=8, hidden=16, layers=2)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    opt = torch.optim.Adam(model.parameters())
    monkeypatch.delenv("LESSONLIB_RECORD", raising=False)
    measure_training_memory(model, x, y, torch.nn.functional.mse_loss, opt)
    out = tmp_path / "rec.jsonl"
    assert record.read(out) == []
    monkeypatch.setenv("LESSONLIB_RECORD", str(out))
    led = measure_training_memory(model, x, y, torch.nn.functional.mse_loss, opt)
    t = time_training_step(model, x, y, torch.nn.functional.mse_loss, opt, rounds=3, warmup=1)
    recs = record.read(out)
    assert [r["kind"] for r in recs] == ["ledger", "timing"]
    assert recs[0]["total"] == led.total and recs[1]["step_over_prediction"] == t.step_over_prediction


def test_summary_uses_cuda_records_only():
    recs = [{"kind": "ledger", "device": "cuda", "total": 80, "peak": 100},
            {"kind": "ledger", "device": "cuda", "total": 90, "peak": 100},
            {"kind": "ledger", "device": "cpu", "total": 1, "peak": 100},
            {"kind": "timing", "device": "cuda", "step_over_prediction": 3.46}]
    assert gpu_check.summarize(recs) == ("0.80..0.90", "3.5")
    assert gpu_check.summarize([]) == ("-", "-")


def test_claims_column_names_each_claim_that_did_not_hold_on_the_gpu():
    recs = [{"kind": "claim", "device": "cuda", "name": "optimizer share falls with the batch", "held": False},
            {"kind": "claim", "device": "cuda", "name": "peak below the sum of the rows", "held": True},
            {"kind": "claim", "device": "cpu", "name": "ignored: not the GPU", "held": False}]
    assert gpu_check.claims(recs) == "1/2, not: optimizer share falls with the batch"
    assert gpu_check.claims(recs[1:2]) == "1/1"
    assert gpu_check.claims([{"kind": "ledger", "device": "cuda", "total": 1, "peak": 2}]) == "-"


def test_pages_record_the_claims_they_assert_only_on_a_cpu():
    """Each page claim asserted only where it was established records itself, so a GPU run reports it."""
    import nbformat

    for page in ("03-distributed-speedup/01-amdahl.ipynb", "02-two-checkpoints/02-memory-against-compute.ipynb",
                 "01-forward-vs-training/02-memory-inventory.ipynb"):
        src = "\n".join(c.source for c in nbformat.read(ROOT / "chapters" / page, 4).cells)
        assert 'if device.type == "cpu"' in src and 'record("claim", name=' in src, page
