"""Training memory measured: the bytes a real training step holds.

* :func:`measure_training_memory` - runs one training step and returns a
  :class:`MemoryLedger` of bytes actually held: weights, gradients, optimizer
  state, saved activations and (where a tracker is available) the peak.
* :class:`SavedTensorCounter` / :func:`measure_activations` - bytes that
  autograd saves for backward, counted with ``saved_tensors_hooks``.

The formulas for the same quantities are in :mod:`lessonlib.calc.memory`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten  # (tree_leaves is newer than torch 2.1)
from torch.utils._python_dispatch import TorchDispatchMode

from ..checks import flag, function, instance, sequence
from .step_args import check_optimizer_of, check_step_args, check_targets_fit  # noqa: F401 (also imported from here)


@dataclass
class MemoryLedger:
    """Bytes measured during one training step.

    weights:          bytes of the model's parameters
    gradients:        bytes of ``.grad`` after backward
    optimizer_state:  bytes of every tensor in ``optimizer.state`` after the step
    activations:      bytes saved for backward (saved_tensors_hooks), de-duplicated
                      by storage, parameters and buffers excluded: a buffer
                      (BatchNorm's running mean and variance, a causal mask) is
                      state the model holds whether or not it trains
    peak:             peak bytes during the step (model, optimizer and inputs,
                      plus what the step allocated), or None when no tracker is
                      available. GPU: from ``torch.cuda.max_memory_allocated``, the
                      allocator's own peak. CPU: MemTracker's peak, which counts
                      tensors only - a lower bound: scratch buffers that kernels
                      allocate inside themselves (convolution's im2col buffer,
                      the mkldnn RNN workspace) are not seen; on convolution and
                      LSTM models it is 0.70-0.87 of the allocator's peak
    """

    weights: int
    gradients: int
    optimizer_state: int
    activations: int
    peak: int | None = None

    @property
    def total(self) -> int:
        """weights + gradients + optimizer state + activations, bytes."""
        return self.weights + self.gradients + self.optimizer_state + self.activations

    def as_dict(self) -> dict:
        return {"weights": self.weights, "gradients": self.gradients,
                "optimizer_state": self.optimizer_state, "activations": self.activations}


def _storage_key(t):
    st = t.untyped_storage()
    return (t.device.type, t.device.index, st.data_ptr()), st.nbytes()


class _CreatedStorages(TorchDispatchMode):
    """Notes which storages come out of an operation inside its block (created there).

    A storage first seen as an operation's *input* existed before (an input, a
    dataset, a buffer); one first seen as an *output* was allocated inside
    the block. Views share their base's storage, and their base is an input
    of the view operation, so a view of an older tensor never counts as new.
    """

    def __init__(self):
        super().__init__()
        self.created: set = set()
        self.older: set = set()

    def _see(self, tree, into):
        for t in tree_flatten(tree)[0]:
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type != "meta":
                try:
                    key = _storage_key(t)[0]
                except (RuntimeError, NotImplementedError):  # tensors without a plain storage
                    continue
                if key not in self.created and key not in self.older:
                    into.add(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._see((args, kwargs), self.older)
        out = func(*args, **kwargs)
        self._see(out, self.created)
        return out


class SavedTensorCounter:
    """Context manager that counts bytes saved for backward inside its block.

    Uses ``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd
    keeps is seen by the pack hook. Tensors are de-duplicated by storage (a view
    of a kept tensor costs nothing extra) and storages of ``exclude``
    (the parameters) are not counted - they exist whether or not we train.

    How much of a storage counts depends on where it came from:

    * a storage allocated inside the block (an intermediate result) counts
      whole, even when autograd keeps only a view of it: the whole buffer
      stays alive (``nn.MultiheadAttention`` keeps q, k and v as views of
      one packed projection, for example);
    * a storage that existed before the block (an input, a batch sliced out
      of a bigger dataset tensor) counts only for the span its saved views
      cover: the rest of it is not there because of training.

    Which storages were allocated inside the block is recorded with a
    ``TorchDispatchMode`` that sees every operation's inputs and outputs.

    After the block, ``.bytes`` is the total and ``.items`` lists
    ``(module, shape, dtype, bytes)`` for each tensor that added bytes;
    ``module`` is the name of the innermost module running when it was saved
    (set by :meth:`watch`; "" otherwise).
    """

    def __init__(self, exclude=()):
        exclude = sequence("exclude", exclude, allow_empty=True)
        for t in exclude:
            instance("exclude", t, torch.Tensor, "a list of tensors")
        self._exclude = {_storage_key(t)[0] for t in exclude}
        self._spans: dict = {}
        self._stack: list = []
        self._handles: list = []
        self._mode = _CreatedStorages()
        self.items: list = []

    def watch(self, model) -> "SavedTensorCounter":
        """Attribute saved tensors to ``model``'s submodules by name (hooks removed on exit)."""
        instance("model", model, torch.nn.Module, "a torch.nn.Module")
        for name, mod in model.named_modules():
            self._handles.append(mod.register_forward_pre_hook(self._enter_hook(name)))
            self._handles.append(mod.register_forward_hook(self._exit_hook))
        return self

    @property
    def bytes(self) -> int:
        """Bytes kept for backward (each storage counted once)."""
        return sum(hi - lo for lo, hi in self._spans.values())

    @property
    def storages(self) -> int:
        """How many distinct storages were kept."""
        return len(self._spans)

    def _enter_hook(self, name):
        def hook(module, args):
            self._stack.append(name)  # returns None: the input is left unchanged
        return hook

    def _exit_hook(self, module, args, output):
        self._stack.pop()  # returns None: the output is left unchanged

    def _pack(self, t):
        key, nbytes = _storage_key(t)
        if key in self._exclude or t.numel() == 0:
            return t
        if key in self._mode.created:
            lo, hi = 0, nbytes  # allocated during the forward: the whole buffer stays alive
        else:
            es = t.element_size()
            lo = t.storage_offset() * es
            hi = lo + es * (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())))
        old = self._spans.get(key)
        new = (lo, hi) if old is None else (min(lo, old[0]), max(hi, old[1]))
        added = (new[1] - new[0]) - (0 if old is None else old[1] - old[0])
        if added > 0:
            self._spans[key] = new
            where = self._stack[-1] if self._stack else ""
            self.items.append((where, tuple(t.shape), t.dtype, added))
        return t

    def __enter__(self):
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._ctx.__enter__()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return self._ctx.__exit__(*exc)


def model_state(model) -> list:
    """The tensors ``model`` holds as state: its parameters and its buffers.

    Autograd may save a buffer for backward (batch norm in training mode saves
    its running mean and variance), but a buffer is held whether or not the
    model trains, like a weight: it is state, never an activation.
    """
    instance("model", model, torch.nn.Module, "a torch.nn.Module")
    return [*model.parameters(), *model.buffers()]


def measure_activations(model, inputs, targets=None, loss_fn=None) -> SavedTensorCounter:
    """Run the forward pass (and ``loss_fn`` if given) and count what autograd saves for backward.

    Returns the :class:`SavedTensorCounter`: ``.bytes`` (bytes saved, parameters
    and buffers excluded, de-duplicated by storage) and ``.items`` (module name, shape,
    dtype, bytes). No backward is run; the
    graph is freed when the result goes out of scope.
    """
    args = check_step_args(model, inputs, loss_fn, targets=targets)
    counter = SavedTensorCounter(exclude=model_state(model)).watch(model)
    with counter:
        out = model(*args)
        if loss_fn is not None:
            check_targets_fit(out, targets)
            loss_fn(out, targets)
    return counter


def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        key, nbytes = _storage_key(t)
        if key not in seen:
            seen.add(key)
            total += nbytes
    return total


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of every tensor in ``optimizer.state`` (Adam's averages, its ``step`` counters...)."""
    instance("optimizer", optimizer, torch.optim.Optimizer, "a torch.optim.Optimizer")
    return _tensor_bytes(v for s in optimizer.state.values() for v in s.values()
                         if isinstance(v, torch.Tensor))


@dataclass
class PeakMemory:
    """Bytes held when a piece of work started, and the most held while it ran.

    start:  bytes held at the start: the tensors of the tracked modules, optimizers
            and tensors (``track``), on either device
    peak:   start + the most the work allocated on top of it at any moment
    """

    start: int
    peak: int

    @property
    def added(self) -> int:
        """peak - start: what the work itself needed at its worst moment, bytes."""
        return self.peak - self.start


_WARM: set = set()


def warm_up(device) -> None:
    """Make the device's one-off allocations now, before any peak is read (once per device; no-op on CPU).

    A CUDA device's first matrix product creates cuBLAS's handle and its
    workspace (tens of MiB on recent GPUs, allocated through PyTorch's caching
    allocator and kept). Inside a measurement that workspace would land in the
    peak of whatever step came first, against a step of a few MiB.
    """
    from .device import as_device

    device = as_device("device", device)
    if device.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise ValueError(f"device is {str(device)!r} but torch.cuda.is_available() is False")
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key in _WARM:
        return
    for dtype in (torch.float32, torch.float16, torch.bfloat16):  # cuBLAS and cuBLASLt paths
        a = torch.ones(16, 16, device=device, dtype=dtype, requires_grad=True)
        (a @ a).sum().backward()
    torch.cuda.synchronize(device)
    _WARM.add(key)


def _tracked_bytes(track, device) -> int:
    """Bytes of the tensors of ``track`` on ``device``: modules' parameters, buffers and
    gradients, optimizers' state, plain tensors; a storage counts once."""
    tensors = []
    for obj in track:
        if isinstance(obj, torch.nn.Module):
            tensors += [*obj.parameters(), *obj.buffers()]
            tensors += [p.grad for p in obj.parameters() if p.grad is not None]
        elif isinstance(obj, torch.optim.Optimizer):
            tensors += [v for s in obj.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        elif isinstance(obj, torch.Tensor):
            tensors.append(obj)
    return _tensor_bytes(t for t in tensors if t.device == device)


def peak_memory(fn, device=None, track=()):
    """Run ``fn()`` and measure its peak memory: returns ``(fn's result, PeakMemory or None)``.

    The one peak-memory primitive of the course. Both devices count the same
    thing: the tensors of ``track`` (modules, optimizers, tensors) at the start,
    plus the most ``fn`` allocated on top at any moment. On a GPU the added part
    is ``torch.cuda.max_memory_allocated`` over what was allocated before ``fn``,
    read after :func:`warm_up` (so cuBLAS's workspace, and any other tensor on
    the device, is in neither part). On a CPU it is PyTorch's
    ``torch.distributed._tools.mem_tracker.MemTracker`` (private, but the only
    deterministic CPU peak PyTorch offers); the result is None when the torch
    build lacks it (``lessonlib.measure.compat``, capability ``mem_tracker``).
    """
    function("fn", fn)
    track = sequence("track", track, allow_empty=True)
    for i, t in enumerate(track):
        instance(f"track[{i}]", t, (torch.nn.Module, torch.optim.Optimizer, torch.Tensor),
                 "a module, an optimizer or a tensor (track is a list of them, e.g. track=[model, optimizer])")
    from .device import as_device

    device = as_device("device", device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        warm_up(device)
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = _tracked_bytes(track, device)
        result = fn()
        torch.cuda.synchronize(device)
        return result, PeakMemory(start, start + max(0, int(torch.cuda.max_memory_allocated(device)) - int(before)))
    from .compat import feature, frozen_aware

    MemTracker = feature("mem_tracker")  # private API: None on a torch without it
    if MemTracker is None:
        return fn(), None
    try:
        tracker = frozen_aware(MemTracker)()
        tracker.track_external(*track)
    except Exception:  # pragma: no cover - depends on the torch build
        return fn(), None

    def total(kind):
        return int(sum(d.get("Total", 0) for d in tracker.get_tracker_snapshot(kind).values()))

    start = total("current")
    with tracker:
        result = fn()
    return result, PeakMemory(start, max(start, total("peak")))


def measure_training_memory(model, inputs, targets, loss_fn, optimizer, track_peak: bool = True) -> MemoryLedger:
    """Run one training step (forward, loss, backward, optimizer step) and measure its bytes.

    ``inputs`` is a tensor or a tuple of tensors passed to ``model``;
    ``loss_fn(outputs, targets)`` returns a scalar. Gradients are cleared
    first (``set_to_none``); the model's weights are updated by the step.

    Returns a :class:`MemoryLedger` (bytes). ``peak`` is :func:`peak_memory`'s,
    tracking the model, the optimizer and the inputs: the same count on both
    devices; it is None on a CPU whose torch lacks MemTracker, or when
    ``track_peak`` is False. On a CPU it is
    "tensors only, a lower bound": memory that kernels allocate for their own
    scratch work is missing from it.
    """
    args = check_step_args(model, inputs, loss_fn, optimizer, targets)
    function("loss_fn", loss_fn)
    instance("optimizer", optimizer, torch.optim.Optimizer, "a torch.optim.Optimizer")
    track_peak = flag("track_peak", track_peak)
    params = [p for p in model.parameters()]
    if not params:
        raise ValueError("model has no parameters to train")
    device = params[0].device
    optimizer.zero_grad(set_to_none=True)
    weights = _tensor_bytes(params)

    def step(counter):
        with counter:
            out = model(*args)
            check_targets_fit(out, targets)
            loss = loss_fn(out, targets)
        loss.backward()
        grads = _tensor_bytes(p.grad for p in params if p.grad is not None)
        optimizer.step()
        return grads

    counter = SavedTensorCounter(exclude=model_state(model))
    if track_peak:
        grads, peak = peak_memory(lambda: step(counter), device=device, track=(model, optimizer, *args))
        peak = None if peak is None else peak.peak
    else:
        grads, peak = step(counter), None
    ledger = MemoryLedger(
        weights=weights,
        gradients=grads,
        optimizer_state=optimizer_state_bytes(optimizer),
        activations=counter.bytes,
        peak=peak,
    )
    from .record import record

    record("ledger", device=device.type, total=ledger.total, peak=peak)
    return ledger
