"""lessonlib.measure.utilisation: the reader's own MFU, from counted FLOPs over measured time."""
from __future__ import annotations

import pytest
import torch

from lessonlib.measure import models
from lessonlib.measure.utilisation import matmul_flops_per_s, training_step_flops_per_s
from lessonlib.measure.timing import count_flops


def test_step_and_peak_give_a_utilisation():
    torch.manual_seed(0)
    gpt = models.TinyGPT(seq_len=16, hidden=32, heads=2, layers=1)
    x, y = torch.randint(0, 256, (4, 16)), torch.randint(0, 256, (4, 16))
    flops, seconds = training_step_flops_per_s(gpt, x, y, models.lm_loss, torch.optim.Adam(gpt.parameters()), rounds=3)
    assert flops == count_flops(gpt, x, y, models.lm_loss).total > 0   # the same count FlopCounterMode gives
    assert seconds > 0
    peak = matmul_flops_per_s(256, repeats=3)                          # (asserts 2 n^3 FLOPs per product inside)
    assert peak > 0
    # No bound on the ratio here: both halves are timings on a shared machine.


def test_bad_input():
    with pytest.raises(ValueError, match="size"):
        matmul_flops_per_s(0)
    with pytest.raises(ValueError, match="repeats"):
        matmul_flops_per_s(8, repeats=0)
