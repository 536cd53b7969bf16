"""Seeded synthetic data: the umbrella retailer's sales, and token batches for the tiny GPT.

Everything here is generated from a seed, so every run of a notebook sees the
same numbers.
"""
from __future__ import annotations

import math

from ..checks import count as check_count

#: The most numbers one generated data set holds (e.g. stores × days): teaching-sized (the pages
#: use under 20,000; this many take about a second on one core).
MAX_NUMBERS = 2_000_000


def _check_total(what: str, n: int) -> None:
    if n > MAX_NUMBERS:
        raise ValueError(f"{what} = {n:,} numbers, more than the {MAX_NUMBERS:,} a generated data set here may hold")


def make_sales(n_stores: int = 20, n_days: int = 730, seed: int = 0):
    """Daily umbrella sales (units) for ``n_stores`` stores over ``n_days`` days.

    Sales follow a yearly rainy season, a weekly cycle, rainy spells that
    last a few days, a store size, and Poisson noise. Returns a float32 tensor
    of shape ``(n_stores, n_days)`` in units sold per day.
    """
    import torch

    n_stores = check_count("n_stores", n_stores)
    n_days = check_count("n_days", n_days)
    seed = check_count("seed", seed, minimum=0)
    _check_total("n_stores × n_days", n_stores * n_days)
    g = torch.Generator().manual_seed(seed)
    day = torch.arange(n_days, dtype=torch.float32)
    season = 1.0 + 0.6 * torch.sin(2 * math.pi * day / 365.0)
    week = 1.0 + 0.15 * torch.cos(2 * math.pi * day / 7.0)
    # rainy spells: a smoothed random process shared by nearby stores
    rain = (torch.rand(n_stores, n_days, generator=g) < 0.12 * season).float()
    kernel = torch.tensor([0.5, 1.0, 0.7, 0.4])
    rain = torch.nn.functional.conv1d(rain[:, None], kernel.flip(0)[None, None], padding=3)[:, 0, :n_days]
    size = 5.0 + 20.0 * torch.rand(n_stores, 1, generator=g)
    rate = size * season * week * (0.4 + rain)
    return torch.poisson(rate, generator=g)


def make_forecast_dataset(window: int = 28, n_stores: int = 20, n_days: int = 730, seed: int = 0):
    """Examples for the forecast model: the last ``window`` days of a store -> the next day's sales.

    Returns ``(X, y)`` float32 tensors of shape ``(N, window)`` and ``(N, 1)``,
    scaled by each store's mean daily sales so values are around 1.
    """
    window = check_count("window", window)
    n_days = check_count("n_days", n_days)
    _check_total("n_stores × n_days × window", check_count("n_stores", n_stores) * n_days * window)
    sales = make_sales(n_stores, n_days, seed)
    if window >= sales.shape[1]:
        raise ValueError(f"window must be shorter than n_days ({n_days}), got {window}")
    sales = sales / sales.mean(dim=1, keepdim=True)
    windows = sales.unfold(1, window + 1, 1)          # (stores, N_per_store, window+1)
    windows = windows.reshape(-1, window + 1)
    return windows[:, :window].contiguous(), windows[:, window:].contiguous()


def make_tokens(batch: int, seq_len: int, vocab: int = 256, seed: int = 0):
    """Random token ids ``(batch, seq_len)`` and next-token targets of the same shape (int64)."""
    import torch

    batch = check_count("batch", batch)
    seq_len = check_count("seq_len", seq_len)
    vocab = check_count("vocab", vocab)
    seed = check_count("seed", seed, minimum=0)
    _check_total("batch × seq_len", batch * seq_len)
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, vocab, (batch, seq_len + 1), generator=g)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def make_regression(n: int = 256, features: int = 8, seed: int = 0):
    """A noisy linear regression ``y = X w + 10 + noise``; returns ``(X, y, w_true)``.

    Used to show a half-precision training run stalling: the targets are
    around 10, so the weights that fit them are much larger than the updates.
    """
    import torch

    n = check_count("n", n)
    features = check_count("features", features)
    seed = check_count("seed", seed, minimum=0)
    _check_total("n × features", n * features)
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, features, generator=g)
    w = 3.0 * torch.randn(features, 1, generator=g)
    y = X @ w + 10.0 + 0.1 * torch.randn(n, 1, generator=g)
    return X, y, w
