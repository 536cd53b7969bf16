"""Activation memory of the course's GPT, measured: sweeps, one layer's parts, and the memory multiplier.

The page "Activations: the memory that grows with the work" calls these. Every
byte count comes from :func:`lessonlib.measure.memory.measure_activations`
(``saved_tensors_hooks``, de-duplicated by storage, parameters left out).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..calc.memory import activation_bytes, serving_bytes, training_state_bytes
from ..calc.precision import precision_name
from . import data, models
from ..checks import choice, count, counts, function, instance, mapping, text
from .device import as_device

#: The most numbers (batch × seq_len × hidden) a measured input here may hold: the page's
#: largest case is a quarter of this; more would take minutes and gigabytes.
MAX_NUMBERS = 2**20
#: The most attention scores (batch × heads × seq_len²) one layer here may compute: the page's
#: largest case is an eighth of this (a second on one core); they grow with the square of seq_len.
MAX_SCORES = 2**22
#: The most sizes one call measures (batch sizes of :func:`crossover`, values of :func:`sweep`).
MAX_CASES = 32


def check_shape(batch, seq_len, hidden, heads=4):
    """``(batch, seq_len, hidden)`` checked, and refused when an input would hold more than :data:`MAX_NUMBERS`
    numbers or a layer compute more than :data:`MAX_SCORES` attention scores."""
    batch, seq_len, hidden = count("batch", batch), count("seq_len", seq_len), count("hidden", hidden)
    heads = count("heads", heads)
    if batch * seq_len * hidden > MAX_NUMBERS:
        raise ValueError(f"batch × seq_len × hidden = {batch * seq_len * hidden:,} numbers, more than the {MAX_NUMBERS:,} "
                         f"a measured input here may hold")
    if batch * heads * seq_len ** 2 > MAX_SCORES:
        raise ValueError(f"batch × heads × seq_len² = {batch * heads * seq_len ** 2:,} attention scores, more than "
                         f"the {MAX_SCORES:,} a measured layer here may compute")
    return batch, seq_len, hidden
from .memory import SavedTensorCounter, measure_activations, measure_training_memory

#: The GPT the multiplier is measured on (its sequence limit allows the longest case, 256 tokens).
MULTIPLIER_GPT = dict(seq_len=256, hidden=128, heads=4, layers=2)


def layers_activations(batch: int = 2, seq_len: int = 64, layers: int = 2, hidden: int = 128, heads: int = 4,
                       device=None, **kw) -> SavedTensorCounter:
    """What the GPT's transformer layers save for backward, measured in bf16 (bytes in ``.bytes``).

    ``kw`` goes to :class:`lessonlib.measure.models.TinyGPT` (``dropout``, ``dropout_impl``, ``attention``).
    """
    batch, seq_len, hidden = check_shape(batch, seq_len, hidden, heads)
    device = as_device("device", device)
    gpt = models.TinyGPT(seq_len=seq_len, hidden=hidden, heads=heads, layers=layers, **kw).to(device, torch.bfloat16)
    x = torch.randn(batch, seq_len, hidden, dtype=torch.bfloat16, device=device)
    return measure_activations(gpt.blocks, x)


#: The GPT's attention for each of :data:`lessonlib.calc.memory.ATTENTION_CHOICES`, and its dropout:
#: "fused" is ``scaled_dot_product_attention`` without dropout (on a CPU, SDPA with dropout falls back to
#: the written-out attention, scores and all); "stored" writes attention out with 1-byte dropout masks.
ATTENTION_GPT = {"fused": dict(attention="sdpa", dropout=0.0), "stored": dict(attention="math")}


def sweep(base: dict, sweeps: dict, device=None, progress=None, attention: str = "fused") -> dict:
    """Measured and formula bytes of the layers, changing one size of ``base`` at a time.

    ``base`` holds batch, seq_len, layers, hidden, heads; ``sweeps`` maps one of
    those names to the values to try. Returns ``{(name, value): (measured, formula)}``
    in bytes; the formula is :func:`lessonlib.calc.memory.activation_bytes` with the
    same ``attention`` and the same dropout ("fused": SDPA without dropout, 32*s*b*h a layer;
    "stored": the paper's case, with its two 1-byte dropout masks).
    ``progress`` optionally wraps the loop (``lessonlib.progress.progress``).
    """
    choice("attention", attention, ATTENTION_GPT)
    mapping("base", base)
    if set(base) != {"batch", "seq_len", "layers", "hidden", "heads"}:
        raise ValueError(f"base must hold exactly batch, seq_len, layers, hidden and heads, got {sorted(map(str, base))}")
    cases = 0
    for knob, values in mapping("sweeps", sweeps).items():
        for v in counts(f"sweeps[{knob!r}]", values):
            check_shape(*({**base, knob: v}[k] for k in ("batch", "seq_len", "hidden", "heads")))
            cases += 1
    if cases > MAX_CASES:
        raise ValueError(f"sweeps holds {cases} values in all, more than the {MAX_CASES} one sweep measures")
    as_device("device", device)
    if progress is not None:
        function("progress", progress)
    unknown = set(sweeps) - set(base)
    if unknown:
        raise ValueError(f"sweeps names sizes that base lacks: {sorted(unknown)}")
    items = sweeps.items() if progress is None else progress(sweeps.items(), desc="sweeps")
    results = {}
    for knob, values in items:
        for v in values:
            cfg = {**base, knob: v}
            measured = layers_activations(**cfg, device=device, **ATTENTION_GPT[attention]).bytes
            formula = activation_bytes(cfg["seq_len"], cfg["batch"], cfg["hidden"], cfg["heads"], cfg["layers"],
                                       attention=attention, dropout=(attention == "stored"))
            results[(knob, v)] = (measured, formula)
    return results


def loss_activations(batch: int = 2, seq_len: int = 64, vocab: int = 256, dtype: str = "bf16",
                     device=None) -> SavedTensorCounter:
    """What the next-token cross-entropy keeps for backward, measured (bytes in ``.bytes``).

    The logits ``(batch, seq_len, vocab)`` come in as bf16; ``dtype="bf16"`` takes
    the loss in bf16 (``F.cross_entropy`` on them), ``"fp32"`` as the course's
    :func:`lessonlib.measure.models.lm_loss` does (upcast first). Its backward needs
    the softmax of every logit, so it keeps ``batch * seq_len * vocab`` values (the
    logits and targets themselves are left out of the count: they exist anyway).
    """
    batch, seq_len = count("batch", batch), count("seq_len", seq_len)
    vocab = count("vocab", vocab)
    choice("dtype", dtype, ("bf16", "fp32"))
    if batch * seq_len * vocab > MAX_NUMBERS:
        raise ValueError(f"batch × seq_len × vocab = {batch * seq_len * vocab:,} logits, more than the {MAX_NUMBERS:,} "
                         f"numbers a measured input here may hold")
    device = as_device("device", device)
    logits = torch.randn(batch, seq_len, vocab, dtype=torch.bfloat16, device=device).requires_grad_()
    targets = torch.randint(0, vocab, (batch, seq_len), device=device)
    with SavedTensorCounter(exclude=[logits, targets]) as counter:
        if dtype == "fp32":
            models.lm_loss(logits, targets)
        else:
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    return counter


def layer_part(where: str) -> str:
    """The paper's part of a layer ("LayerNorms", "attention" or "MLP") for a saved tensor's module name."""
    text("where", where, allow_empty=True)
    name = where.split(".", 1)[1] if "." in where else ""
    if name.startswith("ln"):
        return "LayerNorms"
    if name.startswith("attn") or name == "drop1":
        return "attention"
    return "MLP"  # fc1, the GELU (run in the block itself), fc2, drop2


def bytes_by_part(counter: SavedTensorCounter) -> dict:
    """Saved bytes of one layer grouped by :func:`layer_part`."""
    instance("counter", counter, SavedTensorCounter, "a SavedTensorCounter (from measure_activations)")
    out = {"LayerNorms": 0, "attention": 0, "MLP": 0}
    for where, *_, nbytes in counter.items:
        out[layer_part(where)] += nbytes
    return out


def crossover(batches, seq_len: int = 64, device=None, progress=None, **gpt) -> "Crossover":
    """Activations of the whole GPT (bf16, loss included) for each batch, against its training state."""
    batches = counts("batches", batches)
    if len(batches) > MAX_CASES:
        raise ValueError(f"batches holds {len(batches)} batch sizes, more than the {MAX_CASES} one call measures")
    seq_len = count("seq_len", seq_len)
    for b in batches:
        check_shape(b, seq_len, gpt.get("hidden", 128), gpt.get("heads", 4))
    if progress is not None:
        function("progress", progress)
    device = as_device("device", device)
    model = models.TinyGPT(seq_len=seq_len, **gpt).to(device, torch.bfloat16)
    n = models.n_params(model)
    state = training_state_bytes(n).total
    acts = []
    for b in (batches if progress is None else progress(batches, desc="batch sizes")):
        tok, tgt = (t.to(device) for t in data.make_tokens(b, seq_len))
        acts.append(measure_activations(model, tok, tgt, models.lm_loss).bytes)
    cross = next((b for b, a in zip(batches, acts) if a > state), None)
    return Crossover(list(batches), acts, n, state, serving_bytes(n), cross)


@dataclass(frozen=True)
class Crossover:
    """Activation bytes per batch beside the training state and serving bytes of one model."""

    batches: list
    activations: list
    n_params: int
    state_bytes: int
    serving_bytes: int
    first_batch_above: int | None


def _state_fp32(optimizer: str, device) -> tuple[int, int]:
    """Measured bytes of weights + gradients + optimizer state in fp32, and of the weights alone."""
    m = models.TinyGPT(**MULTIPLIER_GPT).to(device)
    opt = torch.optim.SGD(m.parameters(), lr=0.1) if optimizer == "sgd" else torch.optim.Adam(m.parameters())
    tok, tgt = (t.to(device) for t in data.make_tokens(1, 64))
    led = measure_training_memory(m, tok, tgt, models.lm_loss, opt, track_peak=False)
    return led.weights + led.gradients + led.optimizer_state, led.weights


def _activations(dtype, batch: int, seq_len: int, device) -> int:
    m = models.TinyGPT(**MULTIPLIER_GPT).to(device, dtype)
    tok, tgt = (t.to(device) for t in data.make_tokens(batch, seq_len))
    return measure_activations(m, tok, tgt, models.lm_loss).bytes


def memory_multiplier(optimizer: str, precision: str, batch: int, seq_len: int, device=None) -> float:
    """Training-step memory (state + activations) over the 16-bit weights that serving holds, on :data:`MULTIPLIER_GPT`.

    One denominator for every case (2 bytes a parameter), so a larger ratio is always more bytes.
    fp32: weights, gradients and optimizer state measured, activations measured in
    fp32. "bf16_master" (Adam only): the 16 bytes per parameter of
    :func:`lessonlib.calc.memory.training_state_bytes` plus activations measured in bf16.
    """
    choice("optimizer", optimizer, ("sgd", "adam"))
    precision = choice("precision", precision_name(precision), ("fp32", "bf16_master"))
    batch, seq_len, _ = check_shape(batch, seq_len, MULTIPLIER_GPT["hidden"])
    count("seq_len", seq_len, maximum=MULTIPLIER_GPT["seq_len"])
    device = as_device("device", device)
    if precision == "fp32":
        state, weights = _state_fp32(optimizer, device)
        n = weights // 4  # fp32 weights: 4 bytes a parameter
        return (state + _activations(torch.float32, batch, seq_len, device)) / serving_bytes(n)
    if optimizer != "adam":
        raise ValueError("precision='bf16_master' is measured for optimizer='adam' only")
    n = models.n_params(models.TinyGPT(**MULTIPLIER_GPT))
    state = training_state_bytes(n).total
    return (state + _activations(torch.bfloat16, batch, seq_len, device)) / serving_bytes(n)
