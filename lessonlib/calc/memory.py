"""Training memory by formula: bytes of the training state and of activations.

Pure Python (no torch). The measured counterpart is :mod:`lessonlib.measure.memory`.

* :func:`training_state_bytes` - weights, gradients, fp32 master copy and
  optimizer state, in bytes, for ``n_params`` parameters (16 bytes/param for
  Adam in mixed precision).
* :func:`serving_bytes` - what serving holds: the weights alone.
* :func:`activation_bytes_per_layer` - Korthikanti et al. (2022), activation
  bytes that one transformer layer keeps for backward (fused attention by
  default; ``attention="stored"`` for the paper's stored scores).
* :func:`llama_layer_constant` - the same count for a Llama-style layer (RMSNorm, SwiGLU,
  grouped-query fused attention, no dropout), in bytes per s*b*h.
* :func:`logits_bytes` - the logits the loss keeps, batch x seq_len x vocab values.
"""
from __future__ import annotations

from dataclasses import dataclass, asdict

from ..checks import (amount as check_amount, choice as check_choice, count as check_count, flag as check_flag,
                      text as check_text)
from .precision import OPTIMIZER_STATES, RECIPES, precision_name


#: Bytes per activation value the formula accepts: 16-bit (2, the paper's) and fp32 (4).
BYTES_PER_VALUE_CHOICES = (2, 4)


#: Bytes per parameter that each optimizer keeps between steps, in fp32 (the state values
#: of every recipe but pure "bf16", whose state is bf16: :mod:`lessonlib.calc.precision`).
OPTIMIZER_BYTES_PER_PARAM = {name: 4 * n for name, n in OPTIMIZER_STATES.items()}


#: Bytes per parameter for (weights, gradients, master copy) by precision (the recipes of
#: :mod:`lessonlib.calc.precision`: "fp32" 4 + 4 + 0, "bf16_master" 2 + 2 + 4, ...).
PRECISION_BYTES_PER_PARAM = {r.name: (r.weights, r.gradients, r.master_weights) for r in RECIPES.values()}


RECOMPUTE_CHOICES = ("none", "attention", "full")  # of lessonlib.calc.recompute.RECOMPUTE_POLICIES


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


def training_state_bytes(n_params, optimizer: str = "adam", precision: str = "bf16_master") -> StateBytes:
    """Bytes of weights, gradients, master copy and optimizer state for training.

    Parameters
    ----------
    n_params : positive whole number of parameters.
    optimizer : "sgd" (0 bytes/param), "momentum" (4: one fp32 velocity) or
        "adam" / "adamw" (8: two fp32 running averages; 4 in pure bf16).
    precision : one of :data:`lessonlib.calc.precision.PRECISIONS`: "fp32" (4 bytes
        weights + 4 gradients, no master copy), "bf16_master" (2 bytes bf16 weights
        + 2 gradients + 4 fp32 master copy), "bf16_master_fp32_grads" (2 + 4 + 4),
        "bf16" (2 + 2, no master copy, bf16 optimizer state), "fp16_master" and
        "fp8" (2 + 2 + 4). The former name "mixed" means "bf16_master".

    Adam with bf16 compute and an fp32 master copy gives 2 + 2 + 4 + 8 = 16 bytes per parameter:

    >>> training_state_bytes(7_500_000_000).total
    120000000000
    """
    n = check_count("n_params", n_params)
    check_choice("optimizer", optimizer, OPTIMIZER_STATES)
    r = RECIPES[precision_name(precision)]
    w, g, m, o = r.weights, r.gradients, r.master_weights, r.state_bytes(optimizer)
    return StateBytes(
        weights=w * n,
        gradients=g * n,
        master_weights=m * n,
        optimizer_state=o * n,
        total=(w + g + m + o) * n,
    )


def checkpoint_bytes(n_params, optimizer: str = "adam", precision: str = "bf16_master") -> int:
    """Bytes of tensors a resumable checkpoint holds for ``n_params`` parameters: the weights, the master
    copy and the optimizer state of :func:`training_state_bytes`, without the gradients (the next step
    makes them afresh). Adam with bf16 weights and an fp32 master copy: 2 + 4 + 8 = 14 bytes a parameter.

    >>> checkpoint_bytes(7_500_000_000) // 10**9
    105
    >>> checkpoint_bytes(1, precision="fp32")
    12
    """
    state = training_state_bytes(n_params, optimizer, precision)
    return state.total - state.gradients


def bytes_per_param(optimizer: str = "adam", precision: str = "bf16_master") -> int:
    """Training-state bytes per parameter (16 for Adam with bf16 compute and an fp32 master copy)."""
    return training_state_bytes(1, optimizer, precision).total


def serving_bytes(n_params, bytes_per_weight: int = 2) -> int:
    """Bytes that serving holds for the weights: ``n_params`` x 16-bit (2 bytes) by default."""
    n = check_count("n_params", n_params)
    b = check_count("bytes_per_weight", bytes_per_weight)
    return n * b


#: Bytes per activation value by training precision, for the precisions whose activations
#: :func:`activation_bytes_per_layer` models: 16-bit activations, 4-byte ones in fp32.
#: (Dropout masks take 1 byte in all.) "fp8" is left out: only its matrix-product inputs
#: are 1 byte, which the formula's one ``bytes_per_value`` cannot say.
ACTIVATION_BYTES_PER_VALUE = {r.name: r.activation for r in RECIPES.values() if r.activation in (2, 4)}


def activation_bytes_per_value(precision) -> int:
    """Bytes of one stored activation value under ``precision`` (2 for 16-bit, 4 for fp32).

    >>> activation_bytes_per_value("bf16")
    2
    """
    name = precision_name(precision)
    if name not in ACTIVATION_BYTES_PER_VALUE:
        raise ValueError(f"precision {precision!r}: the activation formula counts 2- or 4-byte values, and only "
                         f"the matrix-product inputs of {name} are 1 byte; choose one of "
                         f"{', '.join(map(repr, ACTIVATION_BYTES_PER_VALUE))}")
    return ACTIVATION_BYTES_PER_VALUE[name]


def check_heads(hidden, heads, hidden_name: str = "hidden", heads_name: str = "heads") -> None:
    """Refuse a layer shape that no attention layer has: ``heads`` must divide ``hidden``
    (each head takes hidden / heads of the width; ``TinyGPT`` refuses the same)."""
    check_text("hidden_name", hidden_name)
    check_text("heads_name", heads_name)
    h, a = check_count(hidden_name, hidden), check_count(heads_name, heads)
    if a > h or h % a:
        raise ValueError(f"{heads_name} ({a}) must divide {hidden_name} ({h}): each attention head takes "
                         f"{hidden_name} / {heads_name} of the width")


#: How attention is run: ``"fused"`` (a flash-style kernel, PyTorch's ``scaled_dot_product_attention``:
#: the s x s scores are recomputed in backward, never stored; the default, as runs are done today) or
#: ``"stored"`` (attention written out, keeping the softmax output, its dropout mask and the dropped-out
#: scores: the case Korthikanti et al. (2022) counted, the historical one).
ATTENTION_CHOICES = ("fused", "stored")


def _check_layout(hidden, heads, tensor_parallel):
    """Heads must divide hidden, and the tensor-parallel degree must divide both (whole heads per device)."""
    h, a = check_count("hidden", hidden), check_count("heads", heads)
    t = check_count("tensor_parallel", tensor_parallel)
    check_heads(hidden=h, heads=a)
    if a % t or h % t:
        raise ValueError(f"tensor_parallel ({t}) must divide heads ({a}) and hidden ({h}): "
                         "each device takes whole heads and an equal slice of the matrices")
    return h, a, t


def activation_bytes_per_layer(seq_len, batch, hidden, heads, recompute: str = "none",
                               bytes_per_value: int = 2, *, tensor_parallel=1, attention: str = "fused",
                               sequence_parallel: bool = False, dropout: bool = True) -> int:
    """Activation bytes one transformer layer keeps for backward, per device (Korthikanti et al., 2022).

    Formula (s = seq_len, b = batch, h = hidden, a = heads, t =
    tensor_parallel, the number of devices that split each layer's matrices),
    for 16-bit activations (``bytes_per_value=2``, the paper's case):

    * ``attention="stored"``, ``"none"``: s*b*h*(10 + 24/t + 5*a*s/(h*t)); with t = 1
      the familiar s*b*h*(34 + 5*a*s/h)
    * ``"attention"``: s*b*h*(10 + 24/t)  (Korthikanti et al.'s selective recomputation: the
      attention core, its scores, softmax and dropout, is rebuilt, so the s**2 term goes; the
      course's other partial policy, ``"save_matmuls"``, is :mod:`lessonlib.calc.stage_memory`'s)
    * ``"full"``:      2*s*b*h   (only the layer's input is kept)
    * ``attention="fused"`` (the default): a fused kernel never stores the scores
      (it recomputes them in backward, and regenerates its dropout mask from the
      random-number state), so "none" keeps what "attention" keeps,
      s*b*h*(10 + 24/t), and the s**2 term is gone whatever ``recompute`` is. The
      kernel's one fp32 number per row and head (4*a*s*b bytes) is left out, as the
      paper leaves out LayerNorm's statistics.

    Where the numbers come from: per layer the paper keeps 16*s*b*h activation values
    plus 2*s*b*h one-byte dropout masks, and 2*a*s*s*b values plus a*s*s*b
    mask bytes for the attention scores. With ``e`` = ``bytes_per_value``
    bytes per value that is s*b*h*(16e + 2) + a*s*s*b*(2e + 1): 34 and 5 for
    e = 2, 66 and 9 for fp32 (e = 4); "full" keeps the layer's input, e*s*b*h.
    With ``dropout=False`` (no dropout, as large language models are pretrained today) the
    masks go, and so does the dropout output on the scores: the softmax output is the one
    s x s tensor, read by softmax's backward and by the scores-times-V product. That leaves
    16e*s*b*h + e*a*s*s*b: 32 and 2 for e = 2 (so 32*s*b*h with fused attention).

    Under tensor parallelism (Megatron's column-then-row split of attention
    and MLP) each device keeps 1/t of the tensors inside the split matrices
    (12e*s*b*h and the attention scores). Without sequence parallelism
    (``sequence_parallel=False``, the default) it keeps a whole copy of the rest,
    (4e + 2)*s*b*h: the two LayerNorm inputs, the inputs of the QKV and of the
    first MLP matrix, and the two 1-byte dropout masks (10*s*b*h for e = 2), so
    the bytes per device do not fall as 1/t. With sequence parallelism
    (``sequence_parallel=True``) those parts are split along the sequence too,
    and every term, the layer input of "full" included, is divided by t.
    With t = 1 the two conventions agree.

    The paper's other assumptions, which a measurement must match to agree:
    dropout masks in 1 byte; an MLP of width 4h; embeddings, the output layer
    and the loss left out (see :func:`logits_bytes` for the loss's logits);
    small tensors such as LayerNorm's mean and variance ignored.

    Returns bytes (an int). ``tensor_parallel`` must divide ``heads`` (each
    device takes whole heads) and ``hidden``.

    >>> activation_bytes_per_layer(2048, 1, 4096, 32, attention="stored") // 2**20
    912
    >>> activation_bytes_per_layer(2048, 1, 4096, 32) // 2**20
    272
    >>> activation_bytes_per_layer(2048, 1, 4096, 32, dropout=False) // 2**20
    256
    >>> activation_bytes_per_layer(2048, 1, 4096, 32, attention="stored", dropout=False) // 2**20
    512
    >>> activation_bytes_per_layer(2048, 1, 4096, 32, bytes_per_value=4, attention="stored") // 2**20
    1680
    >>> activation_bytes_per_layer(2048, 1, 4096, 32, tensor_parallel=8, attention="stored") // 2**20
    184
    >>> activation_bytes_per_layer(2048, 1, 4096, 32, tensor_parallel=8, attention="stored",
    ...                            sequence_parallel=True) // 2**20
    114
    """
    s = check_count("seq_len", seq_len)
    b = check_count("batch", batch)
    check_count("hidden", hidden)
    check_count("heads", heads)
    e = check_count("bytes_per_value", bytes_per_value)
    if e not in BYTES_PER_VALUE_CHOICES:
        raise ValueError(f"bytes_per_value must be one of {', '.join(map(str, BYTES_PER_VALUE_CHOICES))} "
                         f"(16-bit or fp32 activations), got {e}")
    check_count("tensor_parallel", tensor_parallel)
    check_choice("recompute", recompute, RECOMPUTE_CHOICES)
    check_choice("attention", attention, ATTENTION_CHOICES)
    sp = check_flag("sequence_parallel", sequence_parallel)
    mask = 1 if check_flag("dropout", dropout) else 0  # bytes of dropout mask per masked value
    h, a, t = _check_layout(hidden, heads, tensor_parallel)
    if recompute == "full":
        return e * s * b * h // t if sp else e * s * b * h
    # whole numbers: t divides h and a, so every term divided by t is exact
    unsplit = (4 * e + 2 * mask) * s * b * h
    per_layer = (unsplit // t if sp else unsplit) + 12 * e * s * b * h // t
    if recompute == "none" and attention == "stored":
        # the softmax output (e bytes a score); with dropout also its mask (1) and the dropped-out scores (e)
        per_layer += (e + mask * (e + 1)) * a * s * s * b // t
    return per_layer


def activation_bytes(seq_len, batch, hidden, heads, layers, recompute: str = "none",
                     bytes_per_value: int = 2, *, tensor_parallel=1, attention: str = "fused",
                     sequence_parallel: bool = False, vocab=None, dropout: bool = True) -> int:
    """Activation bytes for ``layers`` identical transformer layers, per device (bytes);
    see :func:`activation_bytes_per_layer`. With ``vocab`` (a vocabulary size) the
    logits the loss keeps are added (:func:`logits_bytes`, in ``bytes_per_value`` bytes,
    split t ways under tensor parallelism, as Megatron splits the output layer)."""
    n = check_count("layers", layers)
    per_layer = activation_bytes_per_layer(seq_len, batch, hidden, heads, recompute, bytes_per_value,
                                           tensor_parallel=tensor_parallel, attention=attention,
                                           sequence_parallel=sequence_parallel, dropout=dropout)
    if vocab is None:
        return n * per_layer
    return n * per_layer + logits_bytes(seq_len, batch, vocab, bytes_per_value) // check_count(
        "tensor_parallel", tensor_parallel)



def llama_layer_constant(heads, kv_heads, ffn_ratio: float = 8 / 3, bytes_per_value: int = 2) -> float:
    """Bytes per s*b*h that one Llama-style layer keeps for backward: the constant that
    replaces Korthikanti et al.'s 34 for a 2024-26 layer.

    The layer: RMSNorm before attention and MLP, fused attention (no s*s scores) with
    grouped-query attention (``kv_heads`` key/value heads shared by ``heads`` query heads),
    a SwiGLU MLP of width f = ``ffn_ratio`` * h (gate and up products, then down), no
    dropout. Counted as the paper counts, with e = ``bytes_per_value`` bytes a value:

    * the two RMSNorm inputs: 2e
    * attention: the QKV product's input, Q, and the kernel's output (the output
      projection's input): 3e; K and V: 2e * kv_heads / heads
    * MLP: the gate/up product's input e; the gate and up outputs, and their product
      silu(gate) * up (the down product's input), each f wide: 3e * ffn_ratio

    Total e * (6 + 2 * kv_heads / heads + 3 * ffn_ratio). Left out, as the paper leaves
    out LayerNorm's statistics: RMSNorm's one number a token and the kernel's one fp32
    number a row and head. An unfused SwiGLU that also keeps silu(gate) adds e * ffn_ratio.

    >>> llama_layer_constant(32, 8)             # 8 key/value heads of 32, f = 8h/3
    29.0
    >>> llama_layer_constant(32, 32)            # no GQA: as the GELU layer without dropout
    32.0
    >>> llama_layer_constant(32, 8, ffn_ratio=3.5)   # Llama 3 8B's MLP, 14336 = 3.5 x 4096
    34.0
    """
    a = check_count("heads", heads)
    g = check_count("kv_heads", kv_heads)
    if a % g:
        raise ValueError(f"kv_heads ({g}) must divide heads ({a}): each key/value head serves a whole group")
    r = check_amount("ffn_ratio", ffn_ratio, allow_zero=False)
    e = check_count("bytes_per_value", bytes_per_value)
    if e not in BYTES_PER_VALUE_CHOICES:
        raise ValueError(f"bytes_per_value must be one of {', '.join(map(str, BYTES_PER_VALUE_CHOICES))} "
                         f"(16-bit or fp32 activations), got {e}")
    return e * (6 + 2 * g / a + 3 * r)

def logits_bytes(seq_len, batch, vocab, bytes_per_value: int = 2) -> int:
    """Bytes of the logits a language model's loss keeps for backward: batch x seq_len x vocab values.

    The cross-entropy's backward needs the softmax of every logit (one value per
    token and per vocabulary entry), so a plain loss keeps b*s*V values,
    ``bytes_per_value`` bytes each (2: bf16; a loss computed in fp32 keeps 4).
    Chunked or fused cross-entropy kernels avoid holding them all at once.
    Llama 3 (s = 8,192, V = 128,256) keeps 2.1 GB per sequence in bf16:

    >>> logits_bytes(8192, 1, 128_256) / 1e9
    2.101346304
    """
    s, b = check_count("seq_len", seq_len), check_count("batch", batch)
    v = check_count("vocab", vocab)
    e = check_count("bytes_per_value", bytes_per_value)
    if e not in BYTES_PER_VALUE_CHOICES:
        raise ValueError(f"bytes_per_value must be one of {', '.join(map(str, BYTES_PER_VALUE_CHOICES))} "
                         f"(16-bit or fp32 values), got {e}")
    return e * s * b * v


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.50 KiB'`` (binary units). ``n`` is a number of bytes, zero or more."""
    n = check_amount("n", n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
