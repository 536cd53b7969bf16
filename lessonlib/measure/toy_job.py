"""The small training job that :mod:`lessonlib.measure.recovery` crashes and resumes.

Its model (an MLP with dropout), its data stream (a seeded permutation per
epoch, read through a cursor), what a resume must share with the run it
continues (:data:`JOB_CONFIG`, recorded with the seed in the run folder), and
what a valid saved state of it holds (:func:`check_state`).
"""
from __future__ import annotations

from ..checks import count, instance
from .rng_state import check_rng_state
from .run_folder import CheckpointError

#: The toy job's stated limit: its steps take about a millisecond each, so 10 000 steps is some seconds.
MAX_STEPS = 10_000
N_EXAMPLES = 512
BATCH_SIZE = 32
#: What a resume must share with the run it continues, besides the seed (recorded in ``run.json`` and in
#: every checkpoint). The number of steps and how often to save may change between resumes.
JOB_CONFIG = {"job": "lessonlib.measure.recovery.train", "layers": [16, 64, 64, 1], "dropout": 0.2, "lr": 3e-3,
              "examples": N_EXAMPLES, "batch_size": BATCH_SIZE}


def check_state(state: dict, steps: int) -> dict:
    """Refuse a loaded training state with impossible values (:class:`CheckpointError`).

    A checkpoint can pass its checksum and still be wrong: written by a buggy
    job, or edited by hand. Before anything is restored: every part present;
    ``1 <= step <= steps``; a data cursor with ``epoch >= 0`` and
    ``0 <= position <= N_EXAMPLES``; a complete RNG state.
    """
    instance("state", state, dict, "a dict (a loaded checkpoint)")
    steps = count("steps", steps, maximum=MAX_STEPS)
    missing = [k for k in ("model", "optimizer", "scheduler", "rng", "step", "data") if k not in state]
    if missing:
        raise CheckpointError(f"the state has no {', '.join(map(repr, missing))}: it cannot resume exactly")
    step = state["step"]
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= steps:
        raise CheckpointError(f"step {step!r} is impossible for this run: it must be a whole number from 1 to "
                              f"{steps} (the run's steps)")
    data = state["data"]
    if not isinstance(data, dict) or set(data) != {"epoch", "position"}:
        raise CheckpointError(f"the data cursor {data!r} must be a dict with 'epoch' and 'position'")
    for key, top in (("epoch", step * BATCH_SIZE // N_EXAMPLES + 1), ("position", N_EXAMPLES)):
        v = data[key]
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= top:
            raise CheckpointError(f"the data cursor's {key} {v!r} is impossible: it must be from 0 to {top}")
    check_rng_state(state["rng"])
    return state


def _build(seed: int, steps: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    features = torch.randn(N_EXAMPLES, 16, generator=g)
    true_w = torch.randn(16, 1, generator=g)
    targets = torch.tanh(features @ true_w) + 0.1 * torch.randn(512, 1, generator=g)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2),
                          nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, steps // 3), gamma=0.5)
    return model, optimizer, scheduler, features, targets


def _batch(features, targets, data: dict, seed: int, batch_size: int = BATCH_SIZE):
    """The next batch from a data cursor ``{"epoch", "position"}`` (advanced in place).

    The order inside an epoch is a permutation seeded by the epoch number, so
    the cursor alone says where the data stream is.
    """
    import torch

    n = features.shape[0]
    if data["position"] + batch_size > n:
        data["epoch"] += 1
        data["position"] = 0
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + data["epoch"]))
    idx = order[data["position"]:data["position"] + batch_size]
    data["position"] += batch_size
    return features[idx], targets[idx]
