"""Number formats: the bf16 regression that stalls, and the hand-made mixed-precision step."""
import pytest
import torch

from lessonlib.measure import data, models, precision


def test_pure_bf16_freezes_and_the_master_copy_keeps_learning():
    X, y, _ = data.make_regression(n=64, features=4, seed=0)
    pure, W, b = precision.train_linear("bf16", X, y, lr=0.01, steps=300)
    master, _, _ = precision.train_linear("bf16_master", X, y, lr=0.01, steps=300)
    frozen = precision.frozen_from(pure)
    assert frozen < 299 and pure[-1] > 10 * master[-1]
    # at the frozen weights every update is below half a bf16 step: it rounds away
    assert precision.largest_update_over_half_gap(X, y, W, b, lr=0.01) < 1


def test_frozen_from_and_bad_input():
    assert precision.frozen_from([3.0, 2.0, 1.0, 1.0, 1.0]) == 2
    assert precision.frozen_from([3.0, 2.0]) == 1
    with pytest.raises(ValueError, match="precision"):
        precision.train_linear("fp16", torch.zeros(2, 1), torch.zeros(2, 1))
    with pytest.raises(ValueError, match="steps"):
        precision.train_linear("fp32", torch.zeros(2, 1), torch.zeros(2, 1), steps=0)


def test_mixed_precision_step_takes_sixteen_bytes_per_parameter_plus_step_counters():
    torch.manual_seed(0)
    gpt = models.TinyGPT(seq_len=16, hidden=32, heads=2, layers=1)
    tok, tgt = data.make_tokens(2, 16)
    m = precision.mixed_precision_step(gpt, tok, tgt, models.lm_loss)
    n, tensors = models.n_params(gpt), len(list(gpt.parameters()))
    assert m["weights"] == m["gradients"] == 2 * n and m["master_weights"] == 4 * n
    assert m["optimizer_state"] == 8 * n + 4 * tensors  # two fp32 averages + one fp32 step per tensor
