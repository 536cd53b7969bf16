"""Work and time of a training step, phase by phase.

* :func:`count_flops` - FLOPs of the forward pass and of forward + backward,
  counted by ``torch.utils.flop_counter.FlopCounterMode`` (matrix products;
  elementwise work such as activations or the optimizer update is not counted).
* :func:`time_training_step` - medians of each phase's time (seconds) and of
  per-round ratios, from interleaved rounds after a warm-up.
"""
from __future__ import annotations

import statistics
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from .compat import require
from .device import Timer, synchronize, threads
from ..checks import count as check_count

PHASES = ("forward", "loss", "backward", "optimizer")


def _as_args(inputs):
    return inputs if isinstance(inputs, tuple) else (inputs,)


@dataclass
class FlopCount:
    """FLOPs (floating-point operations, multiply and add counted separately) of one step.

    forward:  the model's forward pass
    loss:     the loss function (usually ~0: the counter counts matrix products)
    backward: the backward pass
    total:    forward + loss + backward
    ratio:    (forward + backward) / forward - 3 for a model whose every matrix
              product also needs the gradient of its input
    """

    forward: int
    loss: int
    backward: int

    @property
    def total(self) -> int:
        return self.forward + self.loss + self.backward

    @property
    def ratio(self) -> float:
        return (self.forward + self.backward) / self.forward


def count_flops(model, inputs, targets=None, loss_fn=None) -> FlopCount:
    """Count FLOPs of forward, loss and backward for one batch (gradients are cleared after).

    Without ``loss_fn`` the backward starts from ``output.sum()``.
    """
    FlopCounterMode = require("flop_counter")
    args = _as_args(inputs)
    with FlopCounterMode(display=False) as fc:
        out = model(*args)
    fwd = fc.get_total_flops()
    with FlopCounterMode(display=False) as fc:
        loss = loss_fn(out, targets) if loss_fn is not None else out.float().sum()
    lss = fc.get_total_flops()
    with FlopCounterMode(display=False) as fc:
        loss.backward()
    bwd = fc.get_total_flops()
    for p in model.parameters():
        p.grad = None
    return FlopCount(forward=int(fwd), loss=int(lss), backward=int(bwd))


@dataclass
class StepTiming:
    """Phase times of a training step, from ``rounds`` interleaved rounds.

    seconds:  median seconds of each phase: "prediction" (eval mode, inference_mode),
              "forward", "loss", "backward", "optimizer" and "step" (the sum of the four)
    ratios:   median over rounds of (phase time / prediction time in the same round)
    shares:   median over rounds of (phase time / step time in the same round)
    rounds:   the raw per-round seconds, {phase: [s, ...]}
    """

    seconds: dict
    ratios: dict
    shares: dict
    rounds: dict = field(repr=False)

    @property
    def step_over_prediction(self) -> float:
        """Median of per-round (training step time / prediction time)."""
        return self.ratios["step"]


def time_training_step(model, inputs, targets, loss_fn, optimizer, rounds: int = 20,
                       warmup: int = 3, num_threads: int | None = 1, progress: bool = False) -> StepTiming:
    """Time prediction and each phase of a training step, interleaved in the same rounds.

    Each round times one prediction (``model.eval()`` + ``torch.inference_mode()``)
    and one training step in ``model.train()``: forward, loss, backward and
    ``optimizer.step()``, each timed on its own with :class:`lessonlib.measure.device.Timer`
    (CUDA events on a GPU). The first ``warmup`` rounds are discarded. Ratios
    are taken within a round, then the median over rounds: on a shared machine
    both halves of a ratio see the same load.

    ``num_threads`` sets torch's CPU threads for the measurement (1 by default:
    steadier; None keeps the current setting). The model's weights are updated.
    """
    rounds = check_count("rounds", rounds)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a whole number >= 0, got {warmup!r}")
    args = _as_args(inputs)
    device = next(model.parameters()).device
    names = ("prediction",) + PHASES
    raw = {k: [] for k in names + ("step",)}
    ctx = threads(num_threads) if (num_threads is not None and device.type == "cpu") else nullcontext()
    it = range(warmup + rounds)
    if progress:  # a bar live; one summary line in the static book build
        from ..progress import progress as _progress

        it = _progress(it, desc="timing rounds", total=warmup + rounds)
    was_training = model.training
    with ctx:
        for r in it:
            model.eval()
            synchronize(device)
            with Timer(device) as t_pred, torch.inference_mode():
                model(*args)
            model.train()
            optimizer.zero_grad(set_to_none=True)
            synchronize(device)
            with Timer(device) as t_f:
                out = model(*args)
            with Timer(device) as t_l:
                loss = loss_fn(out, targets)
            with Timer(device) as t_b:
                loss.backward()
            with Timer(device) as t_o:
                optimizer.step()
            del out, loss
            if r < warmup:
                continue
            vals = dict(prediction=t_pred.seconds, forward=t_f.seconds, loss=t_l.seconds,
                        backward=t_b.seconds, optimizer=t_o.seconds)
            vals["step"] = sum(vals[p] for p in PHASES)
            for k, v in vals.items():
                raw[k].append(v)
    model.train(was_training)
    med = statistics.median
    seconds = {k: med(v) for k, v in raw.items()}
    ratios = {k: med([x / p for x, p in zip(v, raw["prediction"])]) for k, v in raw.items()}
    shares = {k: med([x / s for x, s in zip(raw[k], raw["step"])]) for k in PHASES}
    from .record import record

    record("timing", device=device.type, step_over_prediction=ratios["step"])
    return StepTiming(seconds=seconds, ratios=ratios, shares=shares, rounds=raw)
