"""Activation checkpointing (also called gradient checkpointing or activation
recomputation): measure what it keeps, what it recomputes, and what it costs.

Everything here uses PyTorch's own tools:

* :func:`torch.utils.checkpoint.checkpoint` and
  :func:`~torch.utils.checkpoint.checkpoint_sequential`, always with
  ``use_reentrant=False`` passed explicitly (the non-reentrant version is the
  one PyTorch recommends; it supports early stopping and ``saved_tensors_hooks``);
* :class:`torch.autograd.graph.saved_tensors_hooks` to see which tensors the
  forward pass keeps for backward (counted once per storage, parameters excluded);
* :class:`torch.utils.flop_counter.FlopCounterMode` for FLOPs;
* :func:`lessonlib.measure.memory.peak_memory` for the peak memory of a step
  (``torch.cuda.max_memory_allocated`` on a GPU, PyTorch's ``MemTracker`` on CPU;
  on CPU it counts tensors only, so it is a lower bound of what the allocator held).

Units: bytes for memory, FLOPs (floating-point operations, a multiply-add is 2)
for compute, seconds for time. Ratios are plain numbers.

The formulas are in :mod:`lessonlib.calc.recompute`; the four-layer example
is in :mod:`lessonlib.measure.four_layer`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from .compat import checkpoint_early_stop
from .timing import tally_flops
from .memory import SavedTensorCounter, peak_memory
from .rounds import quartiles, time_rounds
from ..checks import choice, count, flag, fraction_below_one, function, sequence
from .models import MAX_LAYERS, check_module, check_size, check_tensor

#: The most timing rounds :func:`time_ratios` runs.
MAX_ROUNDS = 200


def _check_model_and_input(model, x):
    check_module("model", model, nn.Sequential)
    check_tensor("x", x, floating=True)
    hidden = next(model.parameters()).shape[-1]
    if x.dim() < 1 or x.shape[-1] != hidden:
        raise ValueError(f"x must end in the model's hidden size {hidden}, got shape {tuple(x.shape)}")


def _check_strategy(name: str, strategy, model) -> None:
    if isinstance(strategy, str):
        choice(name, strategy, ("none", "per-block"))
    else:
        count(name, strategy, maximum=len(model))


@dataclass
class SavedActivations:
    """Tensors that autograd kept for backward during one forward.

    ``count`` (storages) and ``bytes`` count each storage once, leaving out
    parameters and the tensors named in ``exclude`` (inputs and targets, which
    exist anyway). ``bytes`` is in bytes.
    """

    count: int
    bytes: int


def saved_activations(fn: Callable[[], torch.Tensor], params: Sequence[torch.Tensor] = (),
                      exclude: Sequence[torch.Tensor] = ()) -> tuple[torch.Tensor, SavedActivations]:
    """Run ``fn()`` (a forward that returns a loss) and count what it saved.

    Returns ``(loss, SavedActivations)``. The counting is chapter 1's
    :class:`lessonlib.measure.memory.SavedTensorCounter`. Only tensors saved *outside*
    a checkpointed region are visible here: inside one, the checkpoint's own
    hooks replace the saving, which is the point of checkpointing.
    """
    function("fn", fn)
    params = sequence("params", params, allow_empty=True)
    exclude = sequence("exclude", exclude, allow_empty=True)
    for i, t in enumerate(params + exclude):
        check_tensor("params" if i < len(params) else "exclude", t)
    with SavedTensorCounter(exclude=list(params) + list(exclude)) as counter:
        loss = fn()
    return loss, SavedActivations(counter.storages, counter.bytes)


class MLPBlock(nn.Module):
    """A transformer-style residual MLP block: ``x + Dropout(W2 GELU(W1 LN(x))))``.

    Its inside (LayerNorm output, a 4×-wide hidden layer before and after GELU,
    a dropout mask) is several times bigger than its input, as in a transformer
    block, so checkpointing each block saves a lot.
    """

    def __init__(self, hidden: int, dropout: float = 0.1):
        super().__init__()
        hidden = count("hidden", hidden)
        dropout = fraction_below_one("dropout", dropout)
        check_size("hidden", 8 * hidden * hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.drop(self.fc2(self.act(self.fc1(self.norm(x)))))


def block_stack(layers: int = 8, hidden: int = 64, dropout: float = 0.1, seed: int = 0) -> nn.Sequential:
    """``layers`` :class:`MLPBlock` of ``hidden`` units in an ``nn.Sequential`` (seeded)."""
    layers, hidden = count("layers", layers, maximum=MAX_LAYERS), count("hidden", hidden)
    dropout = fraction_below_one("dropout", dropout)
    seed = count("seed", seed, minimum=0)
    check_size("layers and hidden", layers * 8 * hidden * hidden)
    torch.manual_seed(seed)
    return nn.Sequential(*[MLPBlock(hidden, dropout) for _ in range(layers)])


def layer_chain(layers: int = 16, hidden: int = 32, activation: str = "tanh",
                seed: int = 0) -> nn.Sequential:
    """A plain chain of ``layers`` layers of ``hidden`` units, each ``Linear`` then ``Tanh`` (or ``ReLU``).

    Each layer keeps one activation the size of its input (the Tanh/ReLU
    output, which is also the next Linear's input): the textbook chain for
    which ``sqrt(n)`` segments is the memory-optimal split, and for which
    checkpointing every layer saves nothing.
    """
    layers, hidden = count("layers", layers, maximum=MAX_LAYERS), count("hidden", hidden)
    acts = {"tanh": nn.Tanh, "relu": nn.ReLU}
    choice("activation", activation, acts)
    seed = count("seed", seed, minimum=0)
    check_size("layers and hidden", layers * (hidden * hidden + hidden))
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(hidden, hidden), acts[activation]())
                           for _ in range(layers)])


def checkpointed_forward(model: nn.Sequential, x, strategy):
    """Forward through ``model`` with a checkpointing ``strategy``:
    ``"none"``, ``"per-block"`` (checkpoint every child), or an int number of
    segments for :func:`checkpoint_sequential`."""
    _check_model_and_input(model, x)
    if strategy == "none":
        return model(x)
    if strategy == "per-block":
        for block in model:
            x = checkpoint(block, x, use_reentrant=False)
        return x
    if isinstance(strategy, int) and not isinstance(strategy, bool) and 1 <= strategy <= len(model):
        if strategy == 1:
            return model(x)  # one segment: checkpoint_sequential runs it plainly
        return checkpoint_sequential(model, strategy, x, use_reentrant=False)
    raise ValueError(f"strategy must be 'none', 'per-block' or a segment count in "
                     f"[1, {len(model)}], got {strategy!r}")


def train_step(model: nn.Sequential, x: torch.Tensor, strategy="none", early_stop: bool = True):
    """One forward + loss + backward with the given checkpointing ``strategy``.

    Returns the loss. ``early_stop=False`` makes each checkpoint recompute its
    whole region (``torch.utils.checkpoint.set_checkpoint_early_stop(False)``).
    """
    _check_model_and_input(model, x)
    _check_strategy("strategy", strategy, model)
    early_stop = flag("early_stop", early_stop)
    with checkpoint_early_stop(early_stop):
        loss = checkpointed_forward(model, x, strategy).pow(2).mean()
    loss.backward()
    return loss


def make_input(model: nn.Sequential, batch: int, seq_len: int, seed: int = 1) -> torch.Tensor:
    """A seeded input of shape (batch, seq_len, hidden) for ``model``, with ``requires_grad``."""
    check_module("model", model)
    batch, seq_len = count("batch", batch), count("seq_len", seq_len)
    seed = count("seed", seed, minimum=0)
    hidden = next(model.parameters()).shape[-1]
    if batch * seq_len * hidden > 5 * 10**7:
        raise ValueError(f"batch × seq_len × hidden = {batch * seq_len * hidden:,} numbers is more than the 50 million "
                         f"a teaching-sized input may hold")
    g = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    # requires_grad: the stack sits inside a bigger model, so its input gradient is needed.
    return torch.randn(batch, seq_len, hidden, generator=g).to(device).requires_grad_()


def step_flops(model, x, strategy="none", early_stop: bool = True, strict: bool = False) -> int:
    """FLOPs of one training step (forward + backward, recomputation included).

    Counted by :func:`lessonlib.measure.timing.tally_flops`: an operation with no FLOP
    formula (a fused kernel) is named in an ``UncountedFlopsWarning``, or refused
    with ``strict=True``, instead of counting silently as zero.
    """
    _check_model_and_input(model, x)
    _check_strategy("strategy", strategy, model)
    flag("early_stop", early_stop)
    try:
        tally = tally_flops(train_step, model, x, strategy, early_stop, strict=strict,
                            what=f"step_flops (strategy {strategy!r})")
    finally:
        model.zero_grad(set_to_none=True)
        x.grad = None
    return tally.flops


def forward_flops(model, x, strict: bool = False) -> int:
    """FLOPs of one forward pass (no gradient work).

    As :func:`step_flops`, names uncounted operations in a warning (or refuses with ``strict=True``).
    """
    _check_model_and_input(model, x)

    def forward():
        with torch.no_grad():
            model(x)
    return tally_flops(forward, strict=strict, what="forward_flops").flops


def saved_step_activations(model, x, strategy="none") -> SavedActivations:
    """What the forward of one step keeps for backward (bytes, count); runs backward too."""
    _check_model_and_input(model, x)
    _check_strategy("strategy", strategy, model)
    with checkpoint_early_stop(True):
        loss, saved = saved_activations(lambda: checkpointed_forward(model, x, strategy).pow(2).mean(),
                                        params=list(model.parameters()), exclude=[x])
    loss.backward()
    model.zero_grad(set_to_none=True)
    x.grad = None
    return saved


def peak_step_memory(model, x, strategy="none", early_stop: bool = True) -> int | None:
    """Peak memory of one training step above what was held before it, in bytes (``early_stop`` as in
    :func:`train_step`: PyTorch's default, on).

    Measured by :func:`lessonlib.measure.memory.peak_memory` (CUDA:
    ``torch.cuda.max_memory_allocated``; CPU: PyTorch's ``MemTracker``, with
    the model's weights as the memory held before: tensors only, a lower
    bound, since scratch buffers that kernels allocate inside themselves are
    not seen); None on a CPU whose torch lacks that private tracker
    (:mod:`lessonlib.measure.compat`). Gradients are set to ``None`` before and after, so they count once.
    """
    _check_model_and_input(model, x)
    _check_strategy("strategy", strategy, model)
    early_stop = flag("early_stop", early_stop)
    model.zero_grad(set_to_none=True)
    x.grad = None
    _, peak = peak_memory(lambda: train_step(model, x, strategy, early_stop), device=x.device, track=(model,))
    model.zero_grad(set_to_none=True)
    x.grad = None
    return None if peak is None else peak.added  # None: no CPU tracker in this torch (measure.compat)


def gradients(model, x, strategy="none", seed: int = 0) -> list[torch.Tensor]:
    """Parameter gradients after one step from the same RNG state (for dropout)."""
    _check_model_and_input(model, x)
    _check_strategy("strategy", strategy, model)
    seed = count("seed", seed, minimum=0)
    model.zero_grad(set_to_none=True)
    x.grad = None
    torch.manual_seed(seed)
    train_step(model, x, strategy)
    grads = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    x.grad = None
    return grads


def time_ratios(model, x, strategies: Sequence, rounds: int = 21, baseline="none",
                progress: bool = True) -> dict:
    """Median over ``rounds`` of (step time with strategy) / (step time with ``baseline``).

    The strategies run interleaved in every round (one thread), by
    :func:`lessonlib.measure.rounds.time_rounds`, so a busy machine slows them
    alike; only ratios measured in the same round are compared. Returns
    ``{strategy: median ratio}`` (the baseline maps to 1.0), whose ``quartiles``
    attribute maps each strategy to the first and third quartiles of its ratio.
    """
    _check_model_and_input(model, x)
    for s in sequence("strategies", strategies):
        _check_strategy("strategies", s, model)
    rounds = count("rounds", rounds, maximum=MAX_ROUNDS)
    _check_strategy("baseline", baseline, model)
    progress = flag("progress", progress)
    order = [baseline] + [s for s in strategies if s != baseline]
    return _time_cases(model, x, {s: (lambda s=s: train_step(model, x, s)) for s in order}, baseline, rounds,
                       progress)


def _time_cases(model, x, cases: dict, baseline: str, rounds: int, progress: bool) -> dict:
    """The timing both :func:`time_ratios` and :func:`time_split` report: each of ``cases`` (name: a call that
    runs one step) in every round, gradients cleared before each; per case, the median and the quartiles over the
    rounds of its time over ``baseline``'s in the same round."""
    def one_round(clock):
        for name, step in cases.items():
            model.zero_grad(set_to_none=True)
            x.grad = None
            clock.time(name, step)

    try:
        raw = time_rounds(one_round, rounds, warmup=1, device=x.device, num_threads=1, progress=progress)
    finally:
        model.zero_grad(set_to_none=True)
        x.grad = None
    ratios = _Ratios({name: raw.ratio(name, baseline) for name in cases})
    ratios.quartiles = {name: raw.quartiles(name, baseline) for name in cases}
    ratios.rounds = raw
    return ratios


def time_split(model, x, rounds: int = 11, progress: bool = True) -> dict:
    """Where checkpointing every block spends its extra time, in one run: like :func:`time_ratios`, the median
    over ``rounds`` of each case's step time over the plain step's (``quartiles`` too), for ``"none"``,
    ``"per-block"`` (early stop on, PyTorch's default), ``"empty checkpoints"`` (each block's input passed through a
    checkpoint that saves nothing, so nothing is rerun: the checkpoint's own cost per call) and ``"rerun by hand"``
    (a plain step that also runs each block's LayerNorm, first Linear layer and GELU once more, with no checkpoint:
    the arithmetic early stop reruns). ``model`` is a :func:`block_stack`. Its ``rest`` is (lower quartile, median,
    upper quartile) over the rounds of the checkpointed step's extra time less both controls' extras, each round's
    in plain steps: what neither control accounts for (negative where the two add up to more)."""
    _check_model_and_input(model, x)
    for i, block in enumerate(model):
        check_module(f"model[{i}]", block, MLPBlock)
    rounds = count("rounds", rounds, maximum=MAX_ROUNDS)
    progress = flag("progress", progress)

    def empty(h):
        for block in model:
            h = block(checkpoint(torch.Tensor.view_as, h, h, use_reentrant=False))
        return h

    def by_hand(h):
        for block in model:
            block.act(block.fc1(block.norm(h.detach())))  # the rerun's work, its result dropped
            h = block(h)
        return h

    def step(forward):
        forward(x).pow(2).mean().backward()

    cases = {"none": lambda: step(model),
             "per-block": lambda: step(lambda h: checkpointed_forward(model, h, "per-block")),
             "empty checkpoints": lambda: step(empty), "rerun by hand": lambda: step(by_hand)}
    ratios = _time_cases(model, x, cases, "none", rounds, progress)
    t = ratios.rounds.seconds
    ratios.rest = quartiles([(c - e - r + n) / n for n, c, e, r in
                             zip(t["none"], t["per-block"], t["empty checkpoints"], t["rerun by hand"])])
    return ratios


class _Ratios(dict):
    """A plain ``{strategy: median ratio}`` dict that also carries ``quartiles`` (the middle half of the rounds) and
    ``rounds`` (the :class:`~lessonlib.measure.rounds.Rounds` they came from)."""


@dataclass
class SweepPoint:
    """One checkpointing choice of :func:`segment_sweep`.

    strategy:             a segment count, or ``"per-block"``
    peak_bytes:           peak step memory above the weights (:func:`peak_step_memory`), bytes
    saved_bytes:          what the forward keeps for backward, bytes
    recomputed_forwards:  extra FLOPs as a fraction of one forward
    early_stop:           whether the peak and the extra FLOPs were both measured with early stop on
    """

    strategy: object
    peak_bytes: int
    saved_bytes: int
    recomputed_forwards: float
    early_stop: bool = True


def segment_sweep(model: nn.Sequential, x: torch.Tensor, segment_counts: Sequence[int],
                  per_block: bool = True, early_stop: bool = True) -> list[SweepPoint]:
    """Memory against recomputation for several checkpointing choices.

    One :class:`SweepPoint` for each segment count (and ``"per-block"`` when
    ``per_block``). The peak and the extra FLOPs of a point are measured with the same
    ``early_stop`` (PyTorch's default, on; off, each checkpoint reruns its whole segment).
    """
    _check_model_and_input(model, x)
    for s in sequence("segment_counts", segment_counts):
        _check_strategy("segment_counts", s, model)
    per_block = flag("per_block", per_block)
    early_stop = flag("early_stop", early_stop)
    fwd = forward_flops(model, x)
    plain = step_flops(model, x, "none")
    rows = []
    strategies = list(segment_counts) + (["per-block"] if per_block else [])
    for s in strategies:
        flops = step_flops(model, x, s, early_stop=early_stop)
        rows.append(SweepPoint(
            strategy=s,
            peak_bytes=peak_step_memory(model, x, s, early_stop),
            saved_bytes=saved_step_activations(model, x, s).bytes,
            recomputed_forwards=(flops - plain) / fwd,
            early_stop=early_stop,
        ))
    return rows
