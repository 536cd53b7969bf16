"""Benchmark: training step / prediction time for the course's two models, and Adam's share.

    MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296 \\
        .venv/bin/python scripts/bench_core.py [--rounds 30]

Times are medians of per-round ratios in one run, one thread;
absolute milliseconds are printed for context only.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from lessonlib.measure import data
from lessonlib.measure import models
from lessonlib.measure import timing
from lessonlib.measure.device import environment_report, get_device


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    dev = get_device()
    print(environment_report(dev))
    torch.manual_seed(0)
    X, y = data.make_forecast_dataset()
    mlp = models.ForecastMLP().to(dev)
    xb, yb = X[:512].to(dev), y[:512].to(dev)
    gpt = models.TinyGPT(seq_len=64, hidden=128, heads=4, layers=2).to(dev)
    tok, tgt = (t.to(dev) for t in data.make_tokens(8, 64))
    gpt0 = models.TinyGPT(seq_len=64, hidden=128, heads=4, layers=2, dropout=0.0).to(dev)
    cases = {
        "forecast MLP (batch 512)": (mlp, xb, yb, F.mse_loss),
        "tiny GPT (8 x 64 tokens)": (gpt, tok, tgt, models.lm_loss),
        "tiny GPT, no dropout": (gpt0, tok, tgt, models.lm_loss),
    }
    for name, (m, x, t, loss_fn) in cases.items():
        fc = timing.count_flops(m, x, t, loss_fn)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        tm = timing.time_training_step(m, x, t, loss_fn, opt, rounds=args.rounds, warmup=5)
        print(f"\n== {name}: {models.n_params(m):,} params; FLOPs fwd {fc.forward:,}, fwd+bwd/fwd {fc.ratio:.3f}")
        for k in ("prediction",) + timing.PHASES + ("step",):  # a terminal: one line per phase, not the book's table
            print(f"  {k:12s}{1000 * tm.seconds[k]:9.3f} ms  {tm.ratios[k]:6.2f} x prediction")
        print(f"step / prediction: {tm.step_over_prediction:.2f}   Adam step share of step: "
              f"{100 * tm.shares['optimizer']:.1f} %")


if __name__ == "__main__":
    main()
