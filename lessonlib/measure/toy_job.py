"""The small training job that :mod:`lessonlib.measure.recovery` crashes and resumes.

Its model (an MLP with dropout), its data stream (a seeded permutation per
epoch, read through a cursor), what a resume must share with the run it
continues (:data:`JOB_CONFIG`, recorded with the seed in the run folder), and
what a valid saved state of it holds (:func:`check_state`).
"""
from __future__ import annotations

import math

from ..checks import count, instance, record
from .optim_state import check_adam_state, check_scheduler_state
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
    ``0 <= position <= N_EXAMPLES``; the model's weights finite and of the
    job's shapes; an Adam state for exactly those parameters, with possible
    hyper-parameters and moments, that has taken 1 to ``step`` steps
    (:func:`~lessonlib.measure.optim_state.check_adam_state`; fewer than
    ``step`` after a ``restore="weights"`` resume); a StepLR schedule at that
    same step, whose rate is ``initial_lr * gamma ** (taken // step_size)``
    (:func:`~lessonlib.measure.optim_state.check_scheduler_state`);
    a well-formed RNG state (:func:`~lessonlib.measure.rng_state.check_rng_state`).
    The message names the entry, e.g. ``optimizer.param_groups[0].lr``.
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
    shapes = _check_model(state["model"])
    # Optimizer and schedule step together; a resume with restore="weights" starts both afresh, so they may
    # count fewer steps than the run, never more, and never none (a checkpoint is saved after a step).
    taken = check_adam_state(state["optimizer"], [list(shapes.values())], step)
    if taken == 0:
        raise CheckpointError(f"optimizer.state is empty, but a checkpoint of step {step} is saved after an "
                              f"optimizer step")
    sched = check_scheduler_state(state["scheduler"], state["optimizer"], taken)
    for key in ("gamma", "step_size", "base_lrs", "_last_lr"):
        if key not in sched:
            raise CheckpointError(f"scheduler has no {key!r}: the toy job's schedule is a StepLR")
    # StepLR multiplies the rate by gamma at each boundary: at most MAX_STEPS roundings of 2**-53 each,
    # so a relative 1e-9 separates rounding from a rate that does not belong to this step.
    try:
        lr = sched["base_lrs"][0] * sched["gamma"] ** (taken // sched["step_size"])
    except OverflowError:  # a gamma above 1 over many boundaries: no finite rate is that rate
        lr = math.inf
    if not math.isclose(sched["_last_lr"][0], lr, rel_tol=1e-9, abs_tol=1e-300):
        raise CheckpointError(f"scheduler._last_lr[0] = {sched['_last_lr'][0]!r} is impossible: a StepLR from "
                              f"{sched['base_lrs'][0]!r} with gamma {sched['gamma']!r} every {sched['step_size']} "
                              f"steps is at {lr!r} after step {taken}")
    check_rng_state(state["rng"])
    return state


def _model_shapes() -> dict:
    """The parameters of :func:`_build`'s model by state-dict name: Linear layers at 0, 3, 6 (ReLU, Dropout between)."""
    widths, shapes = JOB_CONFIG["layers"], {}
    for i, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
        shapes[f"{3 * i}.weight"], shapes[f"{3 * i}.bias"] = (fan_out, fan_in), (fan_out,)
    return shapes


def _check_model(model) -> dict:
    """The job's parameter shapes, after checking that ``model`` holds exactly them, finite."""
    import torch

    shapes = _model_shapes()
    if not isinstance(model, dict) or list(model) != list(shapes):
        raise CheckpointError(f"model must hold the entries {list(shapes)} (the toy job's layers), got "
                              f"{list(model) if isinstance(model, dict) else type(model).__name__}")
    for name, shape in shapes.items():
        w = model[name]
        if not isinstance(w, torch.Tensor) or w.dtype != torch.float32 or tuple(w.shape) != shape:
            got = f"{w.dtype} of shape {tuple(w.shape)}" if isinstance(w, torch.Tensor) else repr(w)
            raise CheckpointError(f"model.{name} must be a float32 tensor of shape {shape}, got {got}")
        if not torch.isfinite(w).all():
            raise CheckpointError(f"model.{name} holds non-finite values")
    return shapes


def build_job(seed: int, steps: int):
    """The job's model, Adam optimizer, step-decay scheduler (over ``steps`` steps), features and targets,
    all drawn from ``seed``: ``(model, optimizer, scheduler, features, targets)``."""
    import torch
    from torch import nn

    seed, steps = count("seed", seed, minimum=0), count("steps", steps, maximum=MAX_STEPS)
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


def next_batch(features, targets, data: dict, seed: int, batch_size: int = BATCH_SIZE):
    """The next ``batch_size`` rows of ``features`` and ``targets`` from a data cursor ``{"epoch", "position"}``
    (advanced in place).

    The order inside an epoch is a permutation seeded by the epoch number, so
    the cursor alone says where the data stream is.
    """
    import torch

    instance("features", features, torch.Tensor, "a torch.Tensor")
    instance("targets", targets, torch.Tensor, "a torch.Tensor")
    n = features.shape[0] if features.dim() else 0
    if targets.dim() == 0 or targets.shape[0] != n:
        raise ValueError(f"targets must have one row per row of features ({n}), got shape {tuple(targets.shape)}")
    record("data", data, ("epoch", "position"), "a data cursor")
    count("data['epoch']", data["epoch"], minimum=0)
    count("data['position']", data["position"], minimum=0)
    seed, batch_size = count("seed", seed, minimum=0), count("batch_size", batch_size, maximum=max(1, n))
    if data["position"] + batch_size > n:
        data["epoch"] += 1
        data["position"] = 0
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + data["epoch"]))
    idx = order[data["position"]:data["position"] + batch_size]
    data["position"] += batch_size
    return features[idx], targets[idx]
