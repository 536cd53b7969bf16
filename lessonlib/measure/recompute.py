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
* ``torch.distributed._tools.mem_tracker.MemTracker`` for the peak memory of a
  step on CPU (private, but the only deterministic CPU peak PyTorch offers; it
  is documented in its source), and ``torch.cuda.max_memory_allocated`` on a GPU.

Units: bytes for memory, FLOPs (floating-point operations, a multiply-add is 2)
for compute, seconds for time. Ratios are plain numbers.

The formulas are in :mod:`lessonlib.calc.recompute`; the four-layer example
is in :mod:`lessonlib.measure.four_layer`.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from .compat import checkpoint_early_stop, feature, require
from .memory import SavedTensorCounter


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
    with SavedTensorCounter(exclude=list(params) + list(exclude)) as counter:
        loss = fn()
    return loss, SavedActivations(counter.storages, counter.bytes)


class MLPBlock(nn.Module):
    """A transformer-style residual MLP block: ``x + Dropout(W2 GELU(W1 LN(x))))``.

    Its inside (LayerNorm output, a 4×-wide hidden layer before and after GELU,
    a dropout mask) is several times bigger than its input, as in a transformer
    block, so checkpointing each block saves a lot.
    """

    def __init__(self, width: int, dropout: float = 0.1):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.drop(self.fc2(self.act(self.fc1(self.norm(x)))))


def block_stack(n_blocks: int = 8, width: int = 64, dropout: float = 0.1, seed: int = 0) -> nn.Sequential:
    """``n_blocks`` :class:`MLPBlock` in an ``nn.Sequential`` (seeded)."""
    if n_blocks < 1 or width < 1:
        raise ValueError(f"n_blocks and width must be positive, got {n_blocks!r}, {width!r}")
    torch.manual_seed(seed)
    return nn.Sequential(*[MLPBlock(width, dropout) for _ in range(n_blocks)])


def layer_chain(n_layers: int = 16, width: int = 32, activation: str = "tanh",
                seed: int = 0) -> nn.Sequential:
    """A plain chain of ``n_layers`` layers, each ``Linear`` then ``Tanh`` (or ``ReLU``).

    Each layer keeps one activation the size of its input (the Tanh/ReLU
    output, which is also the next Linear's input): the textbook chain for
    which ``sqrt(n)`` segments is the memory-optimal split, and for which
    checkpointing every layer saves nothing.
    """
    if n_layers < 1 or width < 1:
        raise ValueError(f"n_layers and width must be positive, got {n_layers!r}, {width!r}")
    acts = {"tanh": nn.Tanh, "relu": nn.ReLU}
    if activation not in acts:
        raise ValueError(f"activation must be 'tanh' or 'relu', got {activation!r}")
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), acts[activation]())
                           for _ in range(n_layers)])


def checkpointed_forward(model: nn.Sequential, x, strategy):
    """Forward through ``model`` with a checkpointing ``strategy``:
    ``"none"``, ``"per-block"`` (checkpoint every child), or an int number of
    segments for :func:`checkpoint_sequential`."""
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
    with checkpoint_early_stop(early_stop):
        loss = checkpointed_forward(model, x, strategy).pow(2).mean()
    loss.backward()
    return loss


def make_input(model: nn.Sequential, batch: int, seq: int, seed: int = 1) -> torch.Tensor:
    """A seeded input of shape (batch, seq, width) for ``model``, with ``requires_grad``."""
    width = next(model.parameters()).shape[-1]
    g = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    # requires_grad: the stack sits inside a bigger model, so its input gradient is needed.
    return torch.randn(batch, seq, width, generator=g).to(device).requires_grad_()


def step_flops(model, x, strategy="none", early_stop: bool = True) -> int:
    """FLOPs of one training step (forward + backward, recomputation included)."""
    FlopCounterMode = require("flop_counter")
    with FlopCounterMode(display=False) as counter:
        train_step(model, x, strategy, early_stop)
    model.zero_grad(set_to_none=True)
    x.grad = None
    return int(counter.get_total_flops())


def forward_flops(model, x) -> int:
    """FLOPs of one forward pass (no gradient work)."""
    FlopCounterMode = require("flop_counter")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return int(counter.get_total_flops())


def saved_step_activations(model, x, strategy="none") -> SavedActivations:
    """What the forward of one step keeps for backward (bytes, count); runs backward too."""
    with checkpoint_early_stop(True):
        loss, saved = saved_activations(lambda: checkpointed_forward(model, x, strategy).pow(2).mean(),
                                        params=list(model.parameters()), exclude=[x])
    loss.backward()
    model.zero_grad(set_to_none=True)
    x.grad = None
    return saved


def peak_step_memory(model, x, strategy="none") -> int | None:
    """Peak memory of one training step above the weights, in bytes.

    On CUDA: ``torch.cuda.max_memory_allocated`` minus the memory held before
    the step. On CPU: PyTorch's ``MemTracker``, whose peak total (parameters,
    gradients, activations, temporaries) minus the parameter bytes is returned;
    None on a CPU whose torch lacks that private tracker
    (:mod:`lessonlib.measure.compat`). Gradients are set to ``None`` before and
    after, so they count once.
    """
    model.zero_grad(set_to_none=True)
    x.grad = None
    if x.device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        train_step(model, x, strategy)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        MemTracker = feature("mem_tracker")  # private: None on a torch without it
        if MemTracker is None:
            model.zero_grad(set_to_none=True)
            x.grad = None
            return None
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker:
            train_step(model, x, strategy)
        snap = tracker.get_tracker_snapshot("peak")
        total = sum(dev["Total"] for dev in snap.values())
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        peak = total - params
    model.zero_grad(set_to_none=True)
    x.grad = None
    return int(peak)


def gradients(model, x, strategy="none", seed: int = 0) -> list[torch.Tensor]:
    """Parameter gradients after one step from the same RNG state (for dropout)."""
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

    The strategies run interleaved in every round (one thread), so a busy
    machine slows them alike; only ratios measured in the same round are
    compared. Returns ``{strategy: median ratio}`` (the baseline maps to 1.0).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be positive, got {rounds!r}")
    from .device import synchronize

    order = [baseline] + [s for s in strategies if s != baseline]
    ratios = {s: [] for s in order}
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for s in order:  # warm-up
            train_step(model, x, s)
        rng = range(rounds)
        if progress:
            from ..progress import progress as bar
            rng = bar(rng, desc="timing rounds", total=rounds)
        for _ in rng:
            times = {}
            for s in order:
                model.zero_grad(set_to_none=True)
                x.grad = None
                synchronize(x.device)
                t0 = time.perf_counter()
                train_step(model, x, s)
                synchronize(x.device)
                times[s] = time.perf_counter() - t0
            for s in order:
                ratios[s].append(times[s] / times[baseline])
    finally:
        torch.set_num_threads(old)
        model.zero_grad(set_to_none=True)
        x.grad = None
    return {s: statistics.median(r) for s, r in ratios.items()}


def segment_sweep(model: nn.Sequential, x: torch.Tensor, segment_counts: Sequence[int],
                  per_block: bool = True) -> list[dict]:
    """Memory against recomputation for several checkpointing choices.

    For each segment count (and ``"per-block"`` when ``per_block``) returns a
    dict with ``strategy``, ``peak_bytes`` (:func:`peak_step_memory`),
    ``saved_bytes`` (what forward keeps), and ``recomputed_forwards`` (extra
    FLOPs with early stop off, as a fraction of one forward).
    """
    fwd = forward_flops(model, x)
    plain = step_flops(model, x, "none")
    rows = []
    strategies = list(segment_counts) + (["per-block"] if per_block else [])
    for s in strategies:
        flops = step_flops(model, x, s, early_stop=False)
        rows.append({
            "strategy": s,
            "peak_bytes": peak_step_memory(model, x, s),
            "saved_bytes": saved_step_activations(model, x, s).bytes,
            "recomputed_forwards": (flops - plain) / fwd,
        })
    return rows
