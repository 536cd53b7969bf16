"""Work and time of a training step, phase by phase.

* :func:`count_flops` - FLOPs of the forward pass and of forward + backward,
  counted by ``torch.utils.flop_counter.FlopCounterMode``. What it counts:
  matrix products (mm, addmm, bmm, baddbmm), convolutions and the attention
  kernels it has formulas for. Elementwise work (activations, the loss, the
  optimizer update) is not counted, by design. Fused kernels it has no
  formula for - the mkldnn LSTM/GRU on CPU, scaled_dot_product_attention's
  flash kernel on CPU, ``nn.TransformerEncoder``'s fast path - would count
  as zero: :func:`count_flops` names them in an :class:`UncountedFlopsWarning`
  (or refuses, with ``strict=True``).
* :func:`time_training_step` - medians of each phase's time (seconds) and of
  per-round ratios, from interleaved rounds after a warm-up.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..checks import count as check_count, flag as check_flag
from .device import MAX_THREADS
from .step_args import check_step_args, check_targets_fit
from .rounds import time_rounds

#: The most rounds (and warm-up rounds) :func:`time_training_step` runs.
MAX_ROUNDS = 200
from .compat import require

PHASES = ("forward", "loss", "backward", "optimizer")


def _as_args(inputs):
    return inputs if isinstance(inputs, tuple) else (inputs,)


class UncountedFlopsWarning(UserWarning):
    """A step ran matrix-product-like operations that FlopCounterMode has no formula for."""


#: Words in an operation's name that mark arithmetic-heavy work (products,
#: convolutions, recurrent and attention kernels). Such an op without a
#: FlopCounterMode formula is reported as uncounted; elementwise ops are not.
HEAVY_OP_WORDS = ("mm", "matmul", "dot", "mv", "linear", "einsum", "conv", "rnn", "lstm", "gru",
                  "attention", "transformer")


class _OpsSeen(TorchDispatchMode):
    """Records the name of every operation that runs inside its block."""

    def __init__(self):
        super().__init__()
        self.ops: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func)
        return func(*args, **(kwargs or {}))


def _uncounted(ops) -> list:
    import torch.utils.flop_counter as fc

    # flop_registry arrived in torch 2.2; 2.1 calls the same table flop_mapping. Without either
    # this check cannot tell what is counted, and warns about nothing.
    flop_registry = getattr(fc, "flop_registry", None) or getattr(fc, "flop_mapping", None) or {}
    if not flop_registry:
        return []
    names = set()
    for op in ops:
        if op in flop_registry or op.overloadpacket in flop_registry:
            continue
        name = str(op.overloadpacket).split(".")[-1]
        if any(w in name.lower() for w in HEAVY_OP_WORDS):
            names.add(str(op))
    return sorted(names)


@dataclass
class FlopCount:
    """FLOPs (floating-point operations, multiply and add counted separately) of one step.

    forward:   the model's forward pass
    loss:      the loss function (usually ~0: the counter counts matrix products)
    backward:  the backward pass
    total:     forward + loss + backward
    ratio:     (forward + backward) / forward - 3 for a model whose every matrix
               product also needs the gradient of its input
    uncounted: names of heavy operations that ran but have no formula, so
               their FLOPs are missing from the counts (empty: nothing missed)
    """

    forward: int
    loss: int
    backward: int
    uncounted: tuple = ()

    @property
    def total(self) -> int:
        return self.forward + self.loss + self.backward

    @property
    def ratio(self) -> float:
        if self.forward == 0:
            raise ValueError("no forward FLOPs were counted"
                             + (f" (uncounted operations: {', '.join(self.uncounted)})" if self.uncounted else "")
                             + ": the ratio (forward + backward) / forward is undefined")
        return (self.forward + self.backward) / self.forward


def count_flops(model, inputs, targets=None, loss_fn=None, strict: bool = False) -> FlopCount:
    """Count FLOPs of forward, loss and backward for one batch (gradients are cleared after).

    Without ``loss_fn`` the backward starts from ``output.sum()``. Counted are
    the operations ``FlopCounterMode`` has formulas for (matrix products,
    convolutions, some attention kernels); elementwise work is not. When a
    heavy operation without a formula runs (an mkldnn LSTM on CPU, the CPU
    flash-attention kernel, ``nn.TransformerEncoder``'s fast path), its FLOPs
    are missing: the result names it in ``.uncounted`` and an
    :class:`UncountedFlopsWarning` is issued, or, with ``strict=True``, a
    ``ValueError`` is raised instead.
    """
    strict = check_flag("strict", strict)
    args = check_step_args(model, inputs, loss_fn, targets=targets)
    seen = _OpsSeen()
    FlopCounterMode = require("flop_counter")
    with FlopCounterMode(display=False) as fc, seen:
        out = model(*args)
    fwd = fc.get_total_flops()
    if targets is not None:
        check_targets_fit(out, targets)
    with FlopCounterMode(display=False) as fc, seen:
        loss = loss_fn(out, targets) if loss_fn is not None else out.float().sum()
    lss = fc.get_total_flops()
    missed = tuple(_uncounted(seen.ops))
    if not loss.requires_grad:
        if missed:
            warnings.warn(f"FlopCounterMode has no FLOP formula for {', '.join(missed)}", UncountedFlopsWarning,
                          stacklevel=2)
        raise ValueError("the loss does not require a gradient, so there is no backward to count "
                         "(is the model in eval mode under torch.no_grad(), or are its parameters frozen?)")
    with FlopCounterMode(display=False) as fc, seen:
        loss.backward()
    bwd = fc.get_total_flops()
    for p in model.parameters():
        p.grad = None
    missed = tuple(_uncounted(seen.ops))
    if missed:
        msg = (f"FlopCounterMode has no FLOP formula for {', '.join(missed)}: their work is missing from the "
               "count (forward {0:,}, backward {1:,} FLOPs counted)".format(int(fwd), int(bwd)))
        if strict:
            raise ValueError(msg)
        warnings.warn(msg, UncountedFlopsWarning, stacklevel=2)
    return FlopCount(forward=int(fwd), loss=int(lss), backward=int(bwd), uncounted=missed)


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
    ``optimizer.step()``, each timed on its own, by
    :func:`lessonlib.measure.rounds.time_rounds` (CUDA events on a GPU). The
    first ``warmup`` rounds are discarded. Ratios are taken within a round,
    then the median over rounds: on a shared machine both halves of a ratio
    see the same load.

    ``num_threads`` sets torch's CPU threads for the measurement (1 by default:
    steadier; None keeps the current setting). The model's weights are updated.
    """
    args = check_step_args(model, inputs, loss_fn, optimizer, targets)
    if loss_fn is None or optimizer is None:
        raise TypeError("loss_fn and optimizer are needed to time a training step, got None")
    rounds = check_count("rounds", rounds, maximum=MAX_ROUNDS)
    warmup = check_count("warmup", warmup, minimum=0, maximum=MAX_ROUNDS)
    if num_threads is not None:
        num_threads = check_count("num_threads", num_threads, maximum=MAX_THREADS)
    progress = check_flag("progress", progress)
    device = next(model.parameters()).device
    was_training = model.training

    def one_round(clock):
        model.eval()
        with clock("prediction"), torch.inference_mode():
            model(*args)
        model.train()
        optimizer.zero_grad(set_to_none=True)
        out = clock.time("forward", model, *args)
        check_targets_fit(out, targets)  # every round: a shape comparison, outside the timed phases
        loss = clock.time("loss", loss_fn, out, targets)
        clock.time("backward", loss.backward)
        clock.time("optimizer", optimizer.step)
        clock.add("step", sum(clock.seconds[p] for p in PHASES))

    try:
        raw = time_rounds(one_round, rounds, warmup, device=device, num_threads=num_threads,
                          progress=progress)
    finally:
        model.train(was_training)
    names = ("prediction",) + PHASES + ("step",)
    seconds = {k: raw.median(k) for k in names}
    ratios = {k: raw.ratio(k, "prediction") for k in names}
    shares = {k: raw.ratio(k, "step") for k in PHASES}
    from .record import record

    record("timing", device=device.type, step_over_prediction=ratios["step"])
    return StepTiming(seconds=seconds, ratios=ratios, shares=shares,
                      rounds={k: raw.seconds[k] for k in names})
