"""The four-layer example of activation checkpointing, measured by name.

:func:`four_layer_census` runs one training step of :class:`FourLayerNet` with
and without checkpointing and names which activations autograd kept and which
backward recomputed; :func:`record_activation_life` records when each
activation is produced, recomputed, used and freed (the data behind
:func:`lessonlib.book.plots.plot_activation_life`). Uses
``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` and
``saved_tensors_hooks``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..checks import count, flag

#: The widest (and largest batch) four-layer example: it is drawn and read name by name.
MAX_HIDDEN = 4096


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

    def __init__(self, hidden: int = 8):
        super().__init__()
        hidden = count("hidden", hidden, maximum=MAX_HIDDEN)
        self.linears = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(4))
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


def _four_layer_setup(checkpointed, hidden: int, batch: int, seed: int, device=None):
    """The net, an input and a target on ``device`` (default: ``get_device()``), the same on every device."""
    from .device import as_device

    flag("checkpointed", checkpointed)
    hidden = count("hidden", hidden, maximum=MAX_HIDDEN)
    batch = count("batch", batch, maximum=MAX_HIDDEN)
    seed = count("seed", seed, minimum=0)
    device = as_device("device", device)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = FourLayerNet(hidden).to(device)
    x = torch.randn(batch, hidden, generator=g).to(device)
    target = torch.randn(batch, hidden, generator=g).to(device)
    return model, x, target


@dataclass
class Census:
    """What one training step of :class:`FourLayerNet` kept and recomputed.

    kept:        names of the activations autograd saved for backward, e.g. ``["a1", "a2", "a3", "a4"]``
    recomputed:  names produced again during backward
    kept_bytes:  bytes of the kept activations
    grads:       the parameter gradients (tensors), for comparison
    """

    kept: list
    recomputed: list
    kept_bytes: int
    grads: list = field(repr=False)


def four_layer_census(checkpointed: bool, hidden: int = 8, batch: int = 4, seed: int = 0, device=None) -> Census:
    """Which activations of :class:`FourLayerNet` are kept and which recomputed.

    Runs one real training step (forward, MSE loss, backward) and returns a
    :class:`Census`. ``device`` defaults to ``get_device()``.
    """
    model, x, target = _four_layer_setup(checkpointed, hidden, batch, seed, device)
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
    return Census(
        kept=sorted(kept),
        recomputed=sorted(recomputed),
        kept_bytes=sum(kept.values()),
        grads=[p.grad.clone() for p in model.parameters()],
    )


@dataclass
class Event:
    """One thing that happened to an activation, in the order hooks saw it."""

    order: int        #: position in the recording (0, 1, 2, ...)
    phase: str        #: "forward" or "backward"
    activation: str   #: "a1" ... "a4"
    what: str         #: "produced", "kept", "released", "recomputed", "read"


def record_activation_life(checkpointed: bool, hidden: int = 8, batch: int = 4,
                           seed: int = 0, device=None) -> list[Event]:
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

    model, x, target = _four_layer_setup(checkpointed, hidden, batch, seed, device)
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
