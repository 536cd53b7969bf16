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



@dataclass
class MemoryLedger:
    """Bytes measured during one training step.

    weights:          bytes of the model's parameters
    gradients:        bytes of ``.grad`` after backward
    optimizer_state:  bytes of every tensor in ``optimizer.state`` after the step
    activations:      bytes saved for backward (saved_tensors_hooks), de-duplicated
                      by storage, parameters excluded
    peak:             peak bytes during the step (GPU: max_memory_allocated;
                      CPU: MemTracker) or None when no tracker is available
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


class SavedTensorCounter:
    """Context manager that counts bytes saved for backward inside its block.

    Uses ``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd
    keeps is seen by the pack hook. Tensors are de-duplicated by storage (a view
    of a kept tensor costs nothing extra) and storages of ``exclude``
    (the parameters) are not counted - they exist whether or not we train.
    For each storage the counted bytes are the span its saved views cover
    (all of it for a tensor saved whole; only the rows of a batch sliced
    out of a bigger dataset tensor).

    After the block, ``.bytes`` is the total and ``.items`` lists
    ``(module, shape, dtype, bytes)`` for each tensor that added bytes;
    ``module`` is the name of the innermost module running when it was saved
    (set by :meth:`watch`; "" otherwise).
    """

    def __init__(self, exclude=()):
        self._exclude = {_storage_key(t)[0] for t in exclude}
        self._spans: dict = {}
        self._stack: list = []
        self._handles: list = []
        self.items: list = []

    def watch(self, model) -> "SavedTensorCounter":
        """Attribute saved tensors to ``model``'s submodules by name (hooks removed on exit)."""
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
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return self._ctx.__exit__(*exc)


def measure_activations(model, inputs, targets=None, loss_fn=None) -> SavedTensorCounter:
    """Run the forward pass (and ``loss_fn`` if given) and count what autograd saves for backward.

    Returns the :class:`SavedTensorCounter`: ``.bytes`` (bytes saved, parameters
    excluded, de-duplicated by storage) and ``.items`` (module name, shape,
    dtype, bytes). No backward is run; the
    graph is freed when the result goes out of scope.
    """
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    counter = SavedTensorCounter(exclude=list(model.parameters())).watch(model)
    with counter:
        out = model(*args)
        if loss_fn is not None:
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
    return _tensor_bytes(v for s in optimizer.state.values() for v in s.values()
                         if isinstance(v, torch.Tensor))


def measure_training_memory(model, inputs, targets, loss_fn, optimizer, track_peak: bool = True) -> MemoryLedger:
    """Run one training step (forward, loss, backward, optimizer step) and measure its bytes.

    ``inputs`` is a tensor or a tuple of tensors passed to ``model``;
    ``loss_fn(outputs, targets)`` returns a scalar. Gradients are cleared
    first (``set_to_none``); the model's weights are updated by the step.

    Returns a :class:`MemoryLedger` (bytes). ``peak`` comes from
    ``torch.cuda.max_memory_allocated`` on a GPU and from the private
    ``torch.distributed._tools.mem_tracker.MemTracker`` on a CPU; it is None
    when neither is available or ``track_peak`` is False.
    """
    params = [p for p in model.parameters()]
    if not params:
        raise ValueError("model has no parameters to train")
    device = params[0].device
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    optimizer.zero_grad(set_to_none=True)
    weights = _tensor_bytes(params)

    def step(counter):
        with counter:
            out = model(*args)
            loss = loss_fn(out, targets)
        loss.backward()
        grads = _tensor_bytes(p.grad for p in params if p.grad is not None)
        optimizer.step()
        return grads

    counter = SavedTensorCounter(exclude=params)
    peak = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        grads = step(counter)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    else:
        tracker = None
        if track_peak:
            try:  # private API: may move between torch versions
                from .compat import require

                tracker = require("mem_tracker")()
                tracker.track_external(model, optimizer, *args)
            except Exception:  # pragma: no cover - depends on the torch build
                tracker = None
        if tracker is not None:
            with tracker:
                grads = step(counter)
            snap = tracker.get_tracker_snapshot("peak")
            peak = int(sum(d.get("Total", 0) for d in snap.values()))
        else:
            grads = step(counter)
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
