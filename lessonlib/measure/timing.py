"""Work and time of a training step, phase by phase.

* :func:`count_flops` - FLOPs of the forward pass and of forward + backward,
  counted by ``torch.utils.flop_counter.FlopCounterMode``. What it counts:
  matrix products (mm, addmm, bmm, baddbmm), convolutions and the attention
  kernels it has formulas for. Elementwise work (activations, the loss, the
  optimizer update) is not counted, by design. Fused kernels it has no
  formula for - the mkldnn LSTM/GRU on CPU, scaled_dot_product_attention's
  flash kernel on CPU, ``nn.TransformerEncoder``'s fast path, ``torch.cdist`` -
  would count as zero: every operation that runs is recorded, and those with no
  formula that are not known to be FLOP-free (:data:`FLOP_FREE_OPS`) are named in
  an :class:`UncountedFlopsWarning` (or refused, with ``strict=True``).
* :func:`tally_flops` - the same count and check around any function.
* :func:`time_training_step` - medians of each phase's time (seconds) and of
  per-round ratios, from interleaved rounds after a warm-up; the step's ratio is
  the sum of its phases' ratios.
"""
from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..checks import count as check_count, flag as check_flag, function as check_function, text as check_text
from .device import MAX_THREADS
from .step_args import check_step_args, check_targets_fit
from .rounds import Rounds, time_rounds

#: The most rounds (and warm-up rounds) :func:`time_training_step` runs.
MAX_ROUNDS = 200
from .compat import require

PHASES = ("forward", "loss", "backward", "optimizer")


def _as_args(inputs):
    return inputs if isinstance(inputs, tuple) else (inputs,)


class UncountedFlopsWarning(UserWarning):
    """A step ran matrix-product-like operations that FlopCounterMode has no formula for."""


#: Operations that do no matrix-product-like work, so a FLOP count leaves them out by design:
#: tensor creation, copies and indexing (with the scatter-adds index_add and scatter_add, which add each
#: routed row into place: additions that grow with the rows moved), random numbers, normalisation, softmax, dropout,
#: losses, reductions, embedding lookups and pooling (work that grows with the tensor's size,
#: not with a product's inner dimension). Views and ops tagged ``pointwise`` are added to
#: them by their tags. Every other operation without a FlopCounterMode formula is reported as
#: uncounted: the list says what is known to be free, rather than guessing heavy ops by name.
FLOP_FREE_OPS = frozenset("""
    empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like new_zeros ones ones_like new_ones
    full full_like new_full arange linspace scalar_tensor fill_ zero_ lift_fresh lift_fresh_copy _to_copy copy_
    clone contiguous _unsafe_view cat stack split split_with_sizes chunk unbind index index_select index_put_
    index_put index_add index_add_
    _unsafe_index gather scatter scatter_ scatter_add scatter_add_ masked_fill masked_fill_ masked_scatter tril triu
    repeat flip roll constant_pad_nd slice_backward select_backward index_select_backward as_strided_scatter
    slice_scatter select_scatter diagonal_scatter embedding embedding_dense_backward embedding_backward
    bernoulli bernoulli_ normal normal_ uniform_ rand randn randint randperm random_ exponential_
    native_layer_norm native_layer_norm_backward native_batch_norm native_batch_norm_backward
    _native_batch_norm_legit _native_batch_norm_legit_functional _native_batch_norm_legit_no_training
    native_group_norm native_group_norm_backward _softmax _softmax_backward_data _log_softmax
    _log_softmax_backward_data _safe_softmax native_dropout native_dropout_backward
    nll_loss_forward nll_loss_backward nll_loss2d_forward nll_loss2d_backward mse_loss mse_loss_backward
    binary_cross_entropy binary_cross_entropy_backward binary_cross_entropy_with_logits smooth_l1_loss
    smooth_l1_loss_backward huber_loss huber_loss_backward
    sum mean amax amin max min argmax argmin var var_mean std std_mean prod cumsum any all linalg_vector_norm norm
    _local_scalar_dense equal sort topk bincount histc nonzero count_nonzero
    max_pool2d_with_indices max_pool2d_with_indices_backward avg_pool2d avg_pool2d_backward
    _adaptive_avg_pool2d _adaptive_avg_pool2d_backward max_pool1d adaptive_max_pool2d adaptive_max_pool2d_backward
    detach alias resize_ set_ _reshape_alias
""".split())

#: Tags that mark an operation as elementwise or random: no FLOPs by the course's count.
_FREE_TAGS = tuple(getattr(torch.Tag, t) for t in ("pointwise", "nondeterministic_seeded") if hasattr(torch.Tag, t))


class _OpsSeen(TorchDispatchMode):
    """Records every operation that runs inside its block."""

    def __init__(self):
        super().__init__()
        self.ops: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func)
        return func(*args, **(kwargs or {}))


def _flop_registry() -> dict:
    import torch.utils.flop_counter as fc

    # flop_registry arrived in torch 2.2; 2.1 calls the same table flop_mapping
    return getattr(fc, "flop_registry", None) or getattr(fc, "flop_mapping", None) or {}


def _uncounted(ops) -> list:
    """The operations in ``ops`` that have no FlopCounterMode formula and are not known to be FLOP-free."""
    registry = _flop_registry()
    if not registry:  # without the table this check cannot tell what is counted
        return []
    names = set()
    for op in ops:
        if op in registry or op.overloadpacket in registry or getattr(op, "is_view", False):
            continue
        if op.overloadpacket.__name__ in FLOP_FREE_OPS or any(t in op.tags for t in _FREE_TAGS):
            continue
        names.add(str(op))
    return sorted(names)


@dataclass
class FlopTally:
    """FLOPs FlopCounterMode counted while a function ran, and what it could not count.

    flops:     FLOPs counted (matrix products, convolutions, attention kernels with a formula)
    uncounted: names of the operations that ran without a formula and are not known to be
               FLOP-free: their work is missing from ``flops`` (empty: nothing missed)
    """

    flops: int
    uncounted: tuple = ()


def tally_flops(fn, *args, strict: bool = False, what: str = "the count") -> FlopTally:
    """Run ``fn(*args)`` under ``FlopCounterMode`` and a record of every operation; return a :class:`FlopTally`.

    When an operation without a FLOP formula ran (see :data:`FLOP_FREE_OPS` for those
    known to be free), an :class:`UncountedFlopsWarning` names it, or with ``strict=True``
    a ``ValueError``. ``what`` names the count in the message.
    """
    check_function("fn", fn)
    strict = check_flag("strict", strict)
    check_text("what", what)
    seen = _OpsSeen()
    FlopCounterMode = require("flop_counter")
    with FlopCounterMode(display=False) as fc, seen:
        fn(*args)
    tally = FlopTally(int(fc.get_total_flops()), tuple(_uncounted(seen.ops)))
    _report(tally.uncounted, f"{what} ({tally.flops:,} FLOPs counted)", strict, stacklevel=3)
    return tally


def _report(missed, counted: str, strict: bool, stacklevel: int) -> None:
    if missed:
        msg = (f"FlopCounterMode has no FLOP formula for {', '.join(missed)}: their work is missing from "
               f"{counted}")
        if strict:
            raise ValueError(msg)
        warnings.warn(msg, UncountedFlopsWarning, stacklevel=stacklevel + 1)


@dataclass
class FlopCount:
    """FLOPs (floating-point operations, multiply and add counted separately) of one step.

    forward:   the model's forward pass
    loss:      the loss function (usually ~0: the counter counts matrix products)
    backward:  the backward pass
    total:     forward + loss + backward
    ratio:     (forward + backward) / forward - 3 for a model whose every matrix
               product also needs the gradient of its input
    uncounted: names of operations that ran without a formula and are not known
               to be FLOP-free, so their FLOPs are missing from the counts (empty:
               nothing missed)
    inference: True when nothing needed a gradient (no backward ran: backward is 0)
    """

    forward: int
    loss: int
    backward: int
    uncounted: tuple = ()
    inference: bool = False

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
    convolutions, some attention kernels); elementwise work is not. Every
    operation that runs is recorded: one with no formula that is not known to
    be FLOP-free (:data:`FLOP_FREE_OPS`, views, pointwise ops) - an mkldnn LSTM
    on CPU, the CPU flash-attention kernel, ``nn.TransformerEncoder``'s fast
    path, ``torch.cdist`` - is missing from the count: the result names it in
    ``.uncounted`` and an :class:`UncountedFlopsWarning` is issued, or, with
    ``strict=True``, a ``ValueError`` is raised instead.

    Inference counts too: when nothing needs a gradient (a model in eval mode
    under ``torch.no_grad()``, or frozen parameters) there is no backward to run,
    and ``backward`` is 0 (``inference`` is True).
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
    inference = not loss.requires_grad
    bwd = 0
    if not inference:
        with FlopCounterMode(display=False) as fc, seen:
            loss.backward()
        bwd = fc.get_total_flops()
        for p in model.parameters():
            p.grad = None
    missed = tuple(_uncounted(seen.ops))
    _report(missed, "the count (forward {0:,}, backward {1:,} FLOPs counted)".format(int(fwd), int(bwd)), strict,
            stacklevel=2)
    return FlopCount(forward=int(fwd), loss=int(lss), backward=int(bwd), uncounted=missed, inference=inference)


@dataclass
class StepTiming:
    """Phase times of a training step, from ``rounds`` interleaved rounds.

    seconds:  median seconds of each case over the rounds: "prediction" (eval mode, inference_mode),
              "forward", "loss", "backward", "optimizer", and "step" (the median of each round's sum of
              the four: a median of sums, not the sum of the medians)
    ratios:   each phase: median over rounds of (phase time / prediction time in the same round);
              "step": the sum of the four phases' ratios, so that the phases add up to the step
    shares:   each phase's ratio / the step's ratio (they sum to 1)
    rounds:   the raw per-round seconds, {phase: [s, ...]}

    One account for tables, figures and text: :attr:`account` gives seconds as
    ratio x median prediction time, so that the phases add up to the step in
    seconds, in predictions and in shares alike.
    """

    seconds: dict
    ratios: dict
    shares: dict
    rounds: dict = field(repr=False)

    @property
    def step_over_prediction(self) -> float:
        """Median of per-round (training step time / prediction time)."""
        return self.ratios["step"]

    def quartiles(self, phase: str) -> tuple:
        """First and third quartiles over rounds of (``phase`` time / prediction time in the same round)."""
        return Rounds(self.rounds).quartiles(phase, "prediction")

    def round_median(self, phase: str) -> float:
        """Median over rounds of (``phase`` time / prediction time in the same round): the statistic whose
        middle half :meth:`quartiles` gives. For ``"step"`` it can differ from ``ratios["step"]``, the sum of
        the phases' medians (a median of sums is not the sum of medians)."""
        return Rounds(self.rounds).ratio(phase, "prediction")

    @property
    def account(self) -> dict:
        """Seconds of prediction, each phase and the step as ratio x median prediction time.

        The phases add up to the step (the step's ratio is the sum of theirs);
        a median of each phase's seconds would not (medians do not add up).
        """
        p = self.seconds["prediction"]
        return {k: self.ratios[k] * p for k in ("prediction",) + PHASES + ("step",)}


def time_training_step(model, inputs, targets, loss_fn, optimizer, rounds: int = 20,
                       warmup: int = 3, num_threads: int | None = 1, progress: bool = False) -> StepTiming:
    """Time prediction and each phase of a training step, interleaved in the same rounds.

    Each round times one prediction (``model.eval()`` + ``torch.inference_mode()``)
    and one training step in ``model.train()``: forward, loss, backward and
    ``optimizer.step()``, each timed on its own; the prediction comes first in
    every other round and after the update in the others, so that an order
    effect falls on both cases alike. Timed by
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

    def prediction(clock):
        model.eval()
        with clock("prediction"), torch.inference_mode():
            model(*args)

    turn = itertools.count()  # rounds so far, warm-up included

    def one_round(clock):
        first = next(turn) % 2 == 0  # the prediction first in every other round, last in the others
        if first:
            prediction(clock)
        model.train()
        optimizer.zero_grad(set_to_none=True)
        out = clock.time("forward", model, *args)
        check_targets_fit(out, targets)  # every round: a shape comparison, outside the timed phases
        loss = clock.time("loss", loss_fn, out, targets)
        clock.time("backward", loss.backward)
        clock.time("optimizer", optimizer.step)
        if not first:  # after the update: neither case always follows the same work
            prediction(clock)
        clock.add("step", sum(clock.seconds[p] for p in PHASES))

    try:
        raw = time_rounds(one_round, rounds, warmup, device=device, num_threads=num_threads,
                          progress=progress)
    finally:
        model.train(was_training)
    names = ("prediction",) + PHASES + ("step",)
    seconds = {k: raw.median(k) for k in names}
    ratios = {k: raw.ratio(k, "prediction") for k in ("prediction",) + PHASES}
    ratios["step"] = sum(ratios[k] for k in PHASES)  # the step is its phases: medians of sums do not add up
    shares = {k: ratios[k] / ratios["step"] for k in PHASES}
    from .record import record

    record("timing", device=device.type, step_over_prediction=ratios["step"])
    return StepTiming(seconds=seconds, ratios=ratios, shares=shares,
                      rounds={k: raw.seconds[k] for k in names})
