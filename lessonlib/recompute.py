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

Two small calculation helpers (:func:`predicted_flops_ratio`,
:func:`chain_memory_units`) are pure Python.
"""
from __future__ import annotations

import math
import statistics
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential, set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

from .memory import SavedTensorCounter

__all__ = [
    "NAMES",
    "FourLayerNet",
    "four_layer_census",
    "record_activation_life",
    "plot_activation_life",
    "MLPBlock",
    "block_stack",
    "layer_chain",
    "train_step",
    "checkpointed_forward",
    "make_input",
    "saved_step_activations",
    "saved_activations",
    "step_flops",
    "forward_flops",
    "peak_step_memory",
    "gradients",
    "time_ratios",
    "segment_sweep",
    "plot_segment_sweep",
    "predicted_flops_ratio",
    "chain_memory_units",
]

#: The three names of one technique.
NAMES = ("activation checkpointing", "gradient checkpointing", "activation recomputation")


# ---------------------------------------------------------------------------
# Pure calculations
# ---------------------------------------------------------------------------

def predicted_flops_ratio(recomputed_forward_fraction: float = 1.0,
                          backward_to_forward: float = 2.0) -> float:
    """FLOPs of a checkpointed training step divided by those of a plain step.

    A plain step costs one forward (F) plus a backward of ``backward_to_forward``
    × F (about 2 for layers whose input gradient is needed). Recomputation adds
    ``recomputed_forward_fraction`` × F. With the defaults, (1 + 2 + 1) / 3 = 4/3.

    >>> predicted_flops_ratio()
    1.3333333333333333
    """
    if not 0 <= recomputed_forward_fraction <= 1:
        raise ValueError(
            f"recomputed_forward_fraction must be in [0, 1], got {recomputed_forward_fraction!r}")
    if backward_to_forward <= 0:
        raise ValueError(f"backward_to_forward must be positive, got {backward_to_forward!r}")
    plain = 1.0 + backward_to_forward
    return (plain + recomputed_forward_fraction) / plain


def chain_memory_units(n_layers: int, segments: int) -> int:
    """Activations a chain of ``n_layers`` equal layers keeps after forward,
    in units of one layer's activation, when split into ``segments``
    checkpointed segments by :func:`torch.utils.checkpoint.checkpoint_sequential`.

    It keeps the input of every segment but the first (whose input is the
    model's input, which exists anyway): ``segments - 1``; and PyTorch runs the
    last segment without checkpointing, so that segment keeps all of its
    ``ceil(n_layers / segments)`` activations. The same number of layers is
    alive again while one segment is recomputed in backward. The sum is
    smallest near ``segments = sqrt(n_layers)``; one segment keeps everything.

    >>> chain_memory_units(16, 4)
    7
    >>> chain_memory_units(16, 1)
    16
    """
    if not isinstance(n_layers, int) or isinstance(n_layers, bool) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive integer, got {n_layers!r}")
    if not isinstance(segments, int) or isinstance(segments, bool) or not 1 <= segments <= n_layers:
        raise ValueError(f"segments must be an integer in [1, n_layers], got {segments!r}")
    return (segments - 1) + math.ceil(n_layers / segments)


# ---------------------------------------------------------------------------
# Counting saved tensors
# ---------------------------------------------------------------------------

def _storage_key(t: torch.Tensor):
    return (t.device, t.untyped_storage().data_ptr())


def _remember(owner: dict, t: torch.Tensor, name: str) -> None:
    """Note that ``t``'s storage holds activation ``name``.

    A weak reference to the storage goes with the name: once that storage is
    freed, the allocator may hand its address to an unrelated tensor, and
    :func:`_owner_of` must not mistake the newcomer for the activation.
    """
    from torch.multiprocessing.reductions import StorageWeakRef

    owner[_storage_key(t)] = (name, StorageWeakRef(t.untyped_storage()))


def _owner_of(owner: dict, t: torch.Tensor):
    """The activation name whose (still live) storage ``t`` uses, else None."""
    entry = owner.get(_storage_key(t))
    if entry is None or entry[1].expired():
        return None
    return entry[0]


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
    :class:`lessonlib.memory.SavedTensorCounter`. Only tensors saved *outside*
    a checkpointed region are visible here: inside one, the checkpoint's own
    hooks replace the saving, which is the point of checkpointing.
    """
    with SavedTensorCounter(exclude=list(params) + list(exclude)) as counter:
        loss = fn()
    return loss, SavedActivations(counter.storages, counter.bytes)


# ---------------------------------------------------------------------------
# The four-layer example and the life of one activation
# ---------------------------------------------------------------------------

class FourLayerNet(nn.Module):
    """Four layers, each ``Linear`` then ``ReLU``; layer *i*'s activation is
    the ReLU output ``a{i}``, which is also the input of layer *i + 1*.

    ``forward(x, checkpointed=False)`` keeps all four activations for backward.
    ``forward(x, checkpointed=True)`` keeps only ``a2`` and ``a4``: it wraps
    everything between them in :func:`torch.utils.checkpoint.checkpoint`
    (input → ``a1`` → pre-activation of layer 2, and ``a2`` → ``a3`` →
    pre-activation of layer 4). The ReLUs of layers 2 and 4 run outside, so
    their outputs are what stays in memory; ``a1`` and ``a3`` are dropped and
    recomputed in backward from the nearest kept tensor.
    """

    def __init__(self, width: int = 8):
        super().__init__()
        if width < 1:
            raise ValueError(f"width must be positive, got {width!r}")
        self.linears = nn.ModuleList(nn.Linear(width, width) for _ in range(4))
        self.acts = nn.ModuleList(nn.ReLU() for _ in range(4))

    def _span(self, start: int, x):
        """Layer ``start``'s activation, then layer ``start + 1``'s Linear."""
        return self.linears[start + 1](self.acts[start](self.linears[start](x)))

    def forward(self, x, checkpointed: bool = False):
        if not checkpointed:
            for lin, act in zip(self.linears, self.acts):
                x = act(lin(x))
            return x
        z2 = checkpoint(self._span, 0, x, use_reentrant=False)
        a2 = self.acts[1](z2)
        z4 = checkpoint(self._span, 2, a2, use_reentrant=False)
        return self.acts[3](z4)


def _four_layer_setup(width: int, batch: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = FourLayerNet(width)
    x = torch.randn(batch, width, generator=g)
    target = torch.randn(batch, width, generator=g)
    return model, x, target


def four_layer_census(checkpointed: bool, width: int = 8, batch: int = 4, seed: int = 0) -> dict:
    """Which activations of :class:`FourLayerNet` are kept and which recomputed.

    Runs one real training step (forward, MSE loss, backward). Returns a dict:
    ``kept`` (names of activations that autograd saved for backward, e.g.
    ``["a1", "a2", "a3", "a4"]``), ``recomputed`` (names produced again during
    backward), ``kept_bytes`` (bytes of the kept activations) and ``grads``
    (the parameter gradients, for comparison).
    """
    model, x, target = _four_layer_setup(width, batch, seed)
    owner: dict = {}
    phase = {"now": "forward"}
    recomputed: list[str] = []

    def hook(i):
        def fn(module, inp, out):
            _remember(owner, out, f"a{i + 1}")
            if phase["now"] == "backward":
                recomputed.append(f"a{i + 1}")
        return fn

    handles = [act.register_forward_hook(hook(i)) for i, act in enumerate(model.acts)]
    kept: dict = {}

    def pack(t):
        name = _owner_of(owner, t)
        if name is not None:
            kept[name] = t.untyped_storage().nbytes()
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = nn.functional.mse_loss(model(x, checkpointed=checkpointed), target)
        phase["now"] = "backward"
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    return {
        "kept": sorted(kept),
        "recomputed": sorted(recomputed),
        "kept_bytes": sum(kept.values()),
        "grads": [p.grad.clone() for p in model.parameters()],
    }


@dataclass
class Event:
    """One thing that happened to an activation, in the order hooks saw it."""

    order: int        #: position in the recording (0, 1, 2, ...)
    phase: str        #: "forward" or "backward"
    activation: str   #: "a1" ... "a4"
    what: str         #: "produced", "kept", "released", "recomputed", "read"


def record_activation_life(checkpointed: bool, width: int = 8, batch: int = 4,
                           seed: int = 0) -> list[Event]:
    """Record the life of each activation of :class:`FourLayerNet` in one step.

    Nothing here is drawn by hand: module forward hooks report when an
    activation is *produced* (in forward) or *recomputed* (a forward hook
    that fires during backward); ``saved_tensors_hooks`` report when autograd
    *keeps* it for backward and when backward *reads* it; a weak reference to
    its storage reports when the memory is *released* (checked at every hook,
    including a gradient hook on every parameter, so a release is logged at
    the first hook after it happened).
    """
    from torch.multiprocessing.reductions import StorageWeakRef

    model, x, target = _four_layer_setup(width, batch, seed)
    events: list[Event] = []
    phase = {"now": "forward"}
    owner: dict = {}
    alive: list = []  # (name, weak reference to its storage)

    def poll():
        for item in list(alive):
            if item[1].expired():
                alive.remove(item)
                events.append(Event(len(events), phase["now"], item[0], "released"))

    def log(name, what):
        poll()
        events.append(Event(len(events), phase["now"], name, what))

    def hook(i):
        name = f"a{i + 1}"

        def fn(module, inp, out):
            _remember(owner, out, name)
            log(name, "recomputed" if phase["now"] == "backward" else "produced")
            alive.append((name, StorageWeakRef(out.untyped_storage())))
        return fn

    handles = [act.register_forward_hook(hook(i)) for i, act in enumerate(model.acts)]
    handles += [p.register_hook(lambda g: poll()) for p in model.parameters()]
    kept_once: set = set()

    def pack(t):
        name = _owner_of(owner, t)
        if name is not None and name not in kept_once:
            kept_once.add(name)
            log(name, "kept")
        return t

    def unpack(t):
        name = _owner_of(owner, t)
        if name is not None:
            log(name, "read")
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            loss = nn.functional.mse_loss(model(x, checkpointed=checkpointed), target)
        phase["now"] = "backward"
        loss.backward()
        del loss
        poll()
    finally:
        for h in handles:
            h.remove()
    # Collapse repeated reads of one activation in a row (two nodes save it).
    out: list[Event] = []
    for e in events:
        if out and e.what == "read" and out[-1].what == "read" and out[-1].activation == e.activation:
            continue
        out.append(Event(len(out), e.phase, e.activation, e.what))
    return out


_COLORS = {"forward": "#4C72B0", "recomputed": "#DD8452"}
_MARKERS = {"produced": ("o", "#4C72B0"), "recomputed": ("o", "#DD8452"),
            "kept": ("s", "#55A868"), "read": ("v", "#8172B3"), "released": ("x", "#C44E52")}


def plot_activation_life(recordings: dict, title: str = "The life of each activation in one training step"):
    """Draw recordings from :func:`record_activation_life` as timelines.

    ``recordings`` maps a panel title (e.g. "store every activation") to a list
    of :class:`Event`. A bar shows when a tensor is in memory (blue: produced in
    forward; orange: recomputed in backward). Returns the matplotlib figure.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(recordings), 1, figsize=(9, 2.3 * len(recordings) + 0.6),
                             squeeze=False)
    for ax, (name, events) in zip(axes[:, 0], recordings.items()):
        lanes = sorted({e.activation for e in events})
        start: dict = {}
        end_order = max(e.order for e in events) + 1
        for e in events:
            y = lanes.index(e.activation)
            if e.what in ("produced", "recomputed"):
                start[e.activation] = (e.order, e.what)
            elif e.what == "released" and e.activation in start:
                s, kind = start.pop(e.activation)
                ax.broken_barh([(s, e.order - s)], (y - 0.3, 0.6), alpha=0.35,
                               color=_COLORS["recomputed" if kind == "recomputed" else "forward"])
        for act, (s, kind) in start.items():  # still alive at the end
            ax.broken_barh([(s, end_order - s)], (lanes.index(act) - 0.3, 0.6), alpha=0.35,
                           color=_COLORS["recomputed" if kind == "recomputed" else "forward"])
        for what, (marker, color) in _MARKERS.items():
            pts = [(e.order, lanes.index(e.activation)) for e in events if e.what == what]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, color=color, label=what, zorder=3, s=36)
        first_bwd = next((e.order for e in events if e.phase == "backward"), None)
        if first_bwd is not None:
            ax.axvline(first_bwd - 0.5, color="grey", ls="--", lw=1)
            ax.text(first_bwd - 0.3, -0.35, "backward starts", fontsize=8, color="grey")
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_ylim(len(lanes) - 0.2, -0.6)  # a1 on top
        ax.set_ylabel("activation")
        ax.set_title(name, fontsize=10)
    for ax in axes[:, 0]:
        ax.set_xlabel("hook event, in the order recorded (forward, then backward)")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker=m, color=c, ls="", label=w) for w, (m, c) in _MARKERS.items()]
    axes[0, 0].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------
# Models for measuring the trade-off
# ---------------------------------------------------------------------------

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
    with set_checkpoint_early_stop(early_stop):
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
    with FlopCounterMode(display=False) as counter:
        train_step(model, x, strategy, early_stop)
    model.zero_grad(set_to_none=True)
    x.grad = None
    return int(counter.get_total_flops())


def forward_flops(model, x) -> int:
    """FLOPs of one forward pass (no gradient work)."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return int(counter.get_total_flops())


def saved_step_activations(model, x, strategy="none") -> SavedActivations:
    """What the forward of one step keeps for backward (bytes, count); runs backward too."""
    with set_checkpoint_early_stop(True):
        loss, saved = saved_activations(lambda: checkpointed_forward(model, x, strategy).pow(2).mean(),
                                        params=list(model.parameters()), exclude=[x])
    loss.backward()
    model.zero_grad(set_to_none=True)
    x.grad = None
    return saved


def peak_step_memory(model, x, strategy="none") -> int:
    """Peak memory of one training step above the weights, in bytes.

    On CUDA: ``torch.cuda.max_memory_allocated`` minus the memory held before
    the step. On CPU: PyTorch's ``MemTracker``, whose peak total (parameters,
    gradients, activations, temporaries) minus the parameter bytes is returned.
    Gradients are set to ``None`` before and after, so they count once.
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
        from torch.distributed._tools.mem_tracker import MemTracker

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
            from .progress import progress as bar
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


def plot_segment_sweep(sweeps: dict, title: str = "Memory against recomputation"):
    """Plot :func:`segment_sweep` results, one panel per model: peak step
    memory (MiB) against extra compute (extra forward passes per step).
    ``sweeps`` maps a model label to its rows. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sweeps), figsize=(5.2 * len(sweeps), 4.2), squeeze=False)
    for ax, (label, rows) in zip(axes[0], sweeps.items()):
        seg = [r for r in rows if r["strategy"] != "per-block"]
        xs = [r["recomputed_forwards"] for r in seg]
        ys = [r["peak_bytes"] / 2**20 for r in seg]
        ax.plot(xs, ys, "o-", color="#4C72B0", label="checkpoint_sequential")
        for r, xv, yv in zip(seg, xs, ys):
            text = "no checkpoint" if r["strategy"] == 1 else f"{r['strategy']} segments"
            ax.annotate(text, (xv, yv), textcoords="offset points", xytext=(4, 6), fontsize=8)
        for r in rows:
            if r["strategy"] == "per-block":
                ax.plot(r["recomputed_forwards"], r["peak_bytes"] / 2**20, "*", ms=14,
                        color="#DD8452", label="checkpoint every block")
        ax.set_xlabel("recomputation (extra forward passes per step)")
        ax.set_ylabel("peak step memory above the weights (MiB)")
        ax.set_ylim(0, max(r["peak_bytes"] for r in rows) / 2**20 * 1.15)
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=8, loc="lower left")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
