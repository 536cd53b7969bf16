"""Training memory: the formula and the measurement of the same thing.

Calculations (pure Python, no torch needed to import or call them):

* :func:`training_state_bytes` - weights, gradients, fp32 master copy and
  optimizer state, in bytes, for ``n_params`` parameters (16 bytes/param for
  Adam in mixed precision).
* :func:`serving_bytes` - what serving holds: the weights alone.
* :func:`activation_bytes_per_layer` - Korthikanti et al. (2022), activation
  bytes that one transformer layer keeps for backward.

Measurement (PyTorch, imported lazily):

* :func:`measure_training_memory` - runs one training step and returns a
  :class:`MemoryLedger` of bytes actually held: weights, gradients, optimizer
  state, saved activations and (where a tracker is available) the peak.
"""
from __future__ import annotations

from dataclasses import dataclass, asdict

from .checks import choice as check_choice, count as check_count, positive as check_positive

#: Bytes per parameter that each optimizer keeps between steps (fp32 values).
OPTIMIZER_BYTES_PER_PARAM = {
    "sgd": 0,        # plain SGD remembers nothing
    "momentum": 4,   # one fp32 velocity per parameter
    "adam": 8,       # two fp32 running averages: of the gradient and of its square
}

#: Bytes per parameter for (weights, gradients, master copy) by precision.
PRECISION_BYTES_PER_PARAM = {
    "fp32": (4, 4, 0),   # fp32 weights and gradients, no separate master copy
    "mixed": (2, 2, 4),  # 16-bit weights and gradients + fp32 master weights
}

RECOMPUTE_CHOICES = ("none", "selective", "full")


# --------------------------------------------------------------------------
# calculations

@dataclass(frozen=True)
class StateBytes:
    """Bytes of training state that live for the whole run (not activations).

    All fields are in bytes. ``total`` is the sum of the other four.
    """

    weights: int
    gradients: int
    master_weights: int
    optimizer_state: int
    total: int

    def as_dict(self) -> dict:
        return asdict(self)


def training_state_bytes(n_params, optimizer: str = "adam", precision: str = "mixed") -> StateBytes:
    """Bytes of weights, gradients, master copy and optimizer state for training.

    Parameters
    ----------
    n_params : positive whole number of parameters.
    optimizer : "sgd" (0 bytes/param), "momentum" (4: one fp32 velocity) or
        "adam" (8: two fp32 running averages).
    precision : "fp32" (4 bytes weights + 4 gradients, no master copy) or
        "mixed" (2 bytes 16-bit weights + 2 gradients + 4 fp32 master copy).

    Adam in mixed precision gives 2 + 2 + 4 + 8 = 16 bytes per parameter:

    >>> training_state_bytes(7_500_000_000).total
    120000000000
    """
    n = check_count("n_params", n_params)
    check_choice("optimizer", optimizer, OPTIMIZER_BYTES_PER_PARAM)
    check_choice("precision", precision, PRECISION_BYTES_PER_PARAM)
    w, g, m = PRECISION_BYTES_PER_PARAM[precision]
    o = OPTIMIZER_BYTES_PER_PARAM[optimizer]
    return StateBytes(
        weights=w * n,
        gradients=g * n,
        master_weights=m * n,
        optimizer_state=o * n,
        total=(w + g + m + o) * n,
    )


def bytes_per_param(optimizer: str = "adam", precision: str = "mixed") -> int:
    """Training-state bytes per parameter (16 for Adam in mixed precision)."""
    return training_state_bytes(1, optimizer, precision).total


def serving_bytes(n_params, bytes_per_weight: int = 2) -> int:
    """Bytes that serving holds for the weights: ``n_params`` x 16-bit (2 bytes) by default."""
    n = check_count("n_params", n_params)
    b = check_count("bytes_per_weight", bytes_per_weight)
    return n * b


def activation_bytes_per_layer(seq_len, batch, hidden, heads, recompute: str = "none") -> int:
    """Activation bytes one transformer layer keeps for backward (Korthikanti et al., 2022).

    Formula (16-bit activations; s = seq_len, b = batch, h = hidden, a = heads):

    * ``"none"``:      s*b*h*(34 + 5*a*s/h)  = 34*s*b*h + 5*a*s**2*b
    * ``"selective"``: 34*s*b*h  (the attention scores, softmax and its dropout
      are recomputed, so the s**2 term goes)
    * ``"full"``:      2*s*b*h   (only the layer's input is kept)

    The paper's assumptions, which a measurement must match to agree:
    activations in 2 bytes; dropout masks in 1 byte; an MLP of width 4h;
    standard ("math") attention that materialises the a x s x s scores; no
    tensor or sequence parallelism; embeddings, the output layer and the loss
    left out; small tensors such as LayerNorm's mean and variance ignored.

    Returns bytes (an int).

    >>> activation_bytes_per_layer(2048, 1, 4096, 32) // 2**20
    592
    """
    s = check_count("seq_len", seq_len)
    b = check_count("batch", batch)
    h = check_count("hidden", hidden)
    a = check_count("heads", heads)
    check_choice("recompute", recompute, RECOMPUTE_CHOICES)
    if recompute == "none":
        return 34 * s * b * h + 5 * a * s * s * b
    if recompute == "selective":
        return 34 * s * b * h
    return 2 * s * b * h


def activation_bytes(seq_len, batch, hidden, heads, layers, recompute: str = "none") -> int:
    """Activation bytes for ``layers`` identical transformer layers (bytes)."""
    n = check_count("layers", layers)
    return n * activation_bytes_per_layer(seq_len, batch, hidden, heads, recompute)


# --------------------------------------------------------------------------
# measurement

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
        import torch

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
    import torch

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
    import torch

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
                from torch.distributed._tools.mem_tracker import MemTracker

                tracker = MemTracker()
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
    return MemoryLedger(
        weights=weights,
        gradients=grads,
        optimizer_state=optimizer_state_bytes(optimizer),
        activations=counter.bytes,
        peak=peak,
    )


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.50 KiB'`` (binary units)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def ledger_table(ledgers, formula: dict | None = None) -> str:
    """A plain-text table of one ledger or a ``{name: ledger}`` dict (sizes in binary units).

    ``formula`` optionally maps a row name to a predicted byte count to print beside it.
    """
    if isinstance(ledgers, MemoryLedger):
        ledgers = {"measured": ledgers}
    rows = ["weights", "gradients", "optimizer_state", "activations", "total", "peak"]
    names = list(ledgers)
    head = f"{'':16s}" + "".join(f"{n:>14s}" for n in names)
    if formula:
        head += f"{'formula':>14s}"
    lines = [head]
    for r in rows:
        vals = [getattr(l, r) for l in ledgers.values()]
        cells = "".join(f"{('n/a' if v is None else format_bytes(v)):>14s}" for v in vals)
        if formula:
            f = formula.get(r)
            cells += f"{('' if f is None else format_bytes(f)):>14s}"
        lines.append(f"{r:16s}" + cells)
    return "\n".join(lines)
