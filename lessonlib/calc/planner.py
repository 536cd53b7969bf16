"""Plan a training run on one kind of device: the two numbers and the three failures.

Before choosing how to split a run, compute two numbers and compare them with
what a device holds:

1. the training state: weights, gradients, master copy and optimizer state
   (16 bytes per parameter for Adam in mixed precision);
2. the activations at the batch you want *per device*.

Then one of three failures (or none) applies, each with its own answer:

* ``"state"`` - the state alone does not fit. Data parallelism does not help
  (every device keeps a full copy); split the state itself across devices.
* ``"activations"`` - the state fits, state + activations do not. First a
  smaller batch per device, then activation recomputation, then splitting the
  layers across devices.
* ``"time"`` - everything fits but one device would take too long. Use more
  devices doing the same work on different data (data parallelism).

Pure Python: no torch needed.
"""
from __future__ import annotations

from dataclasses import dataclass

import math

from ..checks import choice as check_choice, count as check_count, positive as check_positive
from .memory import OPTIMIZER_BYTES_PER_PARAM, PRECISION_BYTES_PER_PARAM, RECOMPUTE_CHOICES
from .memory import activation_bytes, training_state_bytes


SECONDS_PER_DAY = 86_400


#: Model shapes for the interactive planner: parameters, layers, width, heads.
#: (Shapes of well-known GPT-style sizes, rounded.)
PRESETS = {
    "124M (GPT-2 small)": dict(n_params=124_000_000, layers=12, hidden=768, heads=12),
    "1.3B": dict(n_params=1_300_000_000, layers=24, hidden=2048, heads=16),
    "7.5B": dict(n_params=7_500_000_000, layers=32, hidden=4096, heads=32),
    "70B": dict(n_params=70_000_000_000, layers=80, hidden=8192, heads=64),
}


def training_flops(n_params, tokens) -> float:
    """Total training compute in FLOPs: 6 x parameters x tokens (forward 2, backward 4 per parameter per token)."""
    n = check_count("n_params", n_params)
    t = check_count("tokens", tokens)
    flops = 6.0 * float(n) * float(t) if n < 2**1000 and t < 2**1000 else math.inf
    if not math.isfinite(flops):
        raise ValueError(f"n_params × tokens is too large to count in FLOPs (n_params={n:.3g}, tokens={t:.3g})")
    return flops


def single_device_seconds(total_flops, device_flops_per_s) -> float:
    """Seconds one device needs: total FLOPs / FLOP/s the device actually sustains."""
    return check_positive("total_flops", total_flops) / check_positive("device_flops_per_s", device_flops_per_s)


@dataclass(frozen=True)
class Plan:
    """The two numbers (bytes), the single-device time (days, or None), and the verdict.

    failure: "state", "activations", "time" or "none"; answer: what to do about it.
    """

    state_bytes: int
    activation_bytes: int
    device_bytes: int
    days: float | None
    failure: str
    answer: str
    max_batch_that_fits: int  # largest batch per device whose activations fit (0: none)


ANSWERS = {
    "state": ("The training state alone does not fit. Data parallelism will not help: every device "
              "would keep a full copy of the state. Split the state itself across devices."),
    "activations": ("The state fits but the activations at this batch per device do not. Try, in order: "
                    "a smaller batch per device; activation recomputation; splitting the layers across devices."),
    "time": ("Everything fits, but one device would take too long. Nothing is broken: use more devices "
             "doing the same work on different data (data parallelism)."),
    "none": "Everything fits on one device and the run finishes within the time limit.",
}


def plan(n_params, optimizer: str = "adam", precision: str = "mixed", batch_per_device=1, seq_len=2048,
         layers=1, hidden=1, heads=1, recompute: str = "none", device_bytes=80e9,
         train_tokens=None, device_flops_per_s=None, max_days: float = 30.0) -> Plan:
    """Compare the two numbers with ``device_bytes`` and name the failure that applies.

    Sizes are counts; ``device_bytes`` is bytes; ``device_flops_per_s`` is the
    FLOP/s one device sustains; ``max_days`` is how long one device may take.
    The time check runs only when both ``train_tokens`` and ``device_flops_per_s`` are given.
    """
    # Every argument checked here, under the name the caller used.
    n_params = check_count("n_params", n_params)
    check_choice("optimizer", optimizer, OPTIMIZER_BYTES_PER_PARAM)
    check_choice("precision", precision, PRECISION_BYTES_PER_PARAM)
    batch_per_device = check_count("batch_per_device", batch_per_device)
    seq_len, layers = check_count("seq_len", seq_len), check_count("layers", layers)
    hidden, heads = check_count("hidden", hidden), check_count("heads", heads)
    check_choice("recompute", recompute, RECOMPUTE_CHOICES)
    dev = check_count("device_bytes", device_bytes)
    if train_tokens is not None:
        train_tokens = check_count("train_tokens", train_tokens)
    if device_flops_per_s is not None:
        device_flops_per_s = check_positive("device_flops_per_s", device_flops_per_s)
    max_days = check_positive("max_days", max_days)
    state = training_state_bytes(n_params, optimizer, precision).total
    act = activation_bytes(seq_len, batch_per_device, hidden, heads, layers, recompute)
    days = None
    if train_tokens is not None and device_flops_per_s is not None:
        total = 6.0 * float(n_params) * float(train_tokens) if max(n_params, train_tokens) < 2**1000 else math.inf
        if not math.isfinite(total):
            raise ValueError("n_params × train_tokens is too large to count in FLOPs")
        days = total / device_flops_per_s / SECONDS_PER_DAY
    per_sample = activation_bytes(seq_len, 1, hidden, heads, layers, recompute)
    max_batch = max(0, (dev - state) // per_sample) if dev > state else 0
    if state > dev:
        failure = "state"
    elif state + act > dev:
        failure = "activations"
    elif days is not None and days > max_days:
        failure = "time"
    else:
        failure = "none"
    return Plan(state, act, dev, days, failure, ANSWERS[failure], int(max_batch))
