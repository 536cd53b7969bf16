"""Fine-tuning and serving by formula: LoRA's share of the training state, and the KV cache.

Pure Python (no torch). The measured counterparts are in :mod:`lessonlib.measure.finetune`.

* :func:`lora_params` - parameters a rank-``rank`` adapter adds to one linear layer.
* :func:`finetune_state_bytes` - the training state when only some parameters train
  (frozen weights hold no gradient and no optimizer state).
* :func:`kv_cache_bytes_per_token` / :func:`kv_cache_bytes` - what serving keeps per
  token generated or read: 2 (keys and values) x layers x kv_heads x head_dim x bytes.
* :data:`LLAMA3_8B`, :data:`LLAMA3_70B` - published shapes to scale the cache to.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..checks import choice as check_choice, count as check_count
from .memory import OPTIMIZER_BYTES_PER_PARAM, PRECISION_BYTES_PER_PARAM
from .precision import precision_name
from .published import LLAMA3_PAPER, Figure

_TABLE3 = "read in the report's Table 3 (8B and 70B columns)"


def lora_params(in_features, out_features, rank) -> int:
    """Parameters of a LoRA adapter on one ``in_features -> out_features`` linear layer.

    A is ``rank x in_features`` and B is ``out_features x rank``:

    >>> lora_params(4096, 4096, 8)
    65536
    """
    i, o = check_count("in_features", in_features), check_count("out_features", out_features)
    r = check_count("rank", rank)
    if r > min(i, o):
        raise ValueError(f"rank ({r}) must be at most min(in_features, out_features) = {min(i, o)}")
    return r * (i + o)


@dataclass(frozen=True)
class FinetuneBytes:
    """Training state of a fine-tune where ``trainable`` of ``n_params`` parameters train, bytes.

    weights:          every parameter, frozen or not, at the precision's weight bytes
    gradients:        the trainable parameters only
    master_weights:   the trainable parameters only (mixed precision; 0 in fp32)
    optimizer_state:  the trainable parameters only
    total:            the sum of the four
    """

    weights: int
    gradients: int
    master_weights: int
    optimizer_state: int
    total: int

    @property
    def trained_share(self) -> float:
        """(gradients + master copy + optimizer state) / total: what training adds to the weights."""
        return (self.total - self.weights) / self.total

    def as_dict(self) -> dict:
        return asdict(self)


def finetune_state_bytes(n_params, trainable, optimizer: str = "adam", precision: str = "fp32") -> FinetuneBytes:
    """Bytes of training state when ``trainable`` of ``n_params`` parameters are trained.

    Frozen parameters are weights only: no gradient, no master copy, no
    optimizer state. Full fine-tuning is ``trainable == n_params`` and gives
    :func:`lessonlib.calc.memory.training_state_bytes`. With Adam in fp32 a
    frozen parameter costs 4 bytes and a trained one 16:

    >>> finetune_state_bytes(1000, 10).total
    4120
    """
    n = check_count("n_params", n_params)
    t = check_count("trainable", trainable)
    if t > n:
        raise ValueError(f"trainable ({t}) must be at most n_params ({n})")
    check_choice("optimizer", optimizer, OPTIMIZER_BYTES_PER_PARAM)
    w, g, m = PRECISION_BYTES_PER_PARAM[precision_name(precision)]
    o = OPTIMIZER_BYTES_PER_PARAM[optimizer]
    parts = (w * n, g * t, m * t, o * t)
    return FinetuneBytes(*parts, total=sum(parts))


def kv_cache_bytes_per_token(layers, kv_heads, head_dim, bytes_per_value: int = 2) -> int:
    """Bytes of KV cache per token (one sequence): 2 x layers x kv_heads x head_dim x bytes_per_value.

    The 2 is one key and one value vector per layer and key/value head.
    ``kv_heads`` is the number of key/value heads: the attention heads in
    multi-head attention, fewer with grouped-query attention (GQA).

    >>> kv_cache_bytes_per_token(32, 8, 128)
    131072
    """
    n_layers = check_count("layers", layers)
    h = check_count("kv_heads", kv_heads)
    d = check_count("head_dim", head_dim)
    b = check_count("bytes_per_value", bytes_per_value, maximum=8)
    return 2 * n_layers * h * d * b


def kv_cache_bytes(layers, kv_heads, head_dim, seq_len, batch=1, bytes_per_value: int = 2) -> int:
    """Bytes of KV cache for ``batch`` sequences of ``seq_len`` tokens (prompt and generated together)."""
    per_token = kv_cache_bytes_per_token(layers, kv_heads, head_dim, bytes_per_value)
    return per_token * check_count("seq_len", seq_len) * check_count("batch", batch)


#: Llama 3 8B: shapes from the report's Table 3. Grouped-query attention: 8 key/value heads for 32 heads.
LLAMA3_8B = {
    "params": Figure(8e9, "parameters (nominal)", LLAMA3_PAPER, "Table 3", _TABLE3),
    "layers": Figure(32, "layers", LLAMA3_PAPER, "Table 3", _TABLE3),
    "hidden": Figure(4096, "model dimension", LLAMA3_PAPER, "Table 3", _TABLE3),
    "heads": Figure(32, "attention heads", LLAMA3_PAPER, "Table 3", _TABLE3),
    "kv_heads": Figure(8, "key/value heads", LLAMA3_PAPER, "Table 3", _TABLE3),
    "ffn": Figure(14336, "FFN (SwiGLU) width", LLAMA3_PAPER, "Table 3", _TABLE3),
    "context": Figure(8192, "tokens of context (pre-training)", LLAMA3_PAPER, "Section 3.4.1", _TABLE3),
}

#: Llama 3 70B: shapes from the report's Table 3.
LLAMA3_70B = {
    "params": Figure(70e9, "parameters (nominal)", LLAMA3_PAPER, "Table 3", _TABLE3),
    "layers": Figure(80, "layers", LLAMA3_PAPER, "Table 3", _TABLE3),
    "hidden": Figure(8192, "model dimension", LLAMA3_PAPER, "Table 3", _TABLE3),
    "heads": Figure(64, "attention heads", LLAMA3_PAPER, "Table 3", _TABLE3),
    "kv_heads": Figure(8, "key/value heads", LLAMA3_PAPER, "Table 3", _TABLE3),
    "ffn": Figure(28672, "FFN (SwiGLU) width", LLAMA3_PAPER, "Table 3", _TABLE3),
    "context": Figure(8192, "tokens of context (pre-training)", LLAMA3_PAPER, "Section 3.4.1", _TABLE3),
}


@dataclass(frozen=True)
class ServingBytes:
    """What serving one published model holds, bytes.

    weights:          parameters x bytes_per_value
    kv_per_token:     KV cache per token of one sequence
    kv_per_sequence:  KV cache of one sequence of ``seq_len`` tokens
    kv_without_gqa:   the same sequence if every attention head kept its own keys and values
    sequences_to_match_weights: how many such sequences hold as much cache as the weights
    """

    weights: int
    kv_per_token: int
    kv_per_sequence: int
    kv_without_gqa: int
    sequences_to_match_weights: float


def serving_memory(model: dict, seq_len=None, bytes_per_value: int = 2) -> ServingBytes:
    """Weights against KV cache for a published model (:data:`LLAMA3_8B`, :data:`LLAMA3_70B`).

    ``seq_len`` defaults to the model's published context; values in 16-bit (2 bytes) by default.
    """
    if not isinstance(model, dict) or not all(isinstance(model.get(k), Figure) for k in
                                                ("params", "layers", "hidden", "heads", "kv_heads", "context")):
        raise TypeError("model must be a published shape such as LLAMA3_8B (params, layers, hidden, heads, "
                        "kv_heads, context)")
    s = int(model["context"].value) if seq_len is None else check_count("seq_len", seq_len)
    layers, hidden = int(model["layers"].value), int(model["hidden"].value)
    heads, kv_heads = int(model["heads"].value), int(model["kv_heads"].value)
    head_dim = hidden // heads
    per_token = kv_cache_bytes_per_token(layers, kv_heads, head_dim, bytes_per_value)
    weights = int(model["params"].value) * bytes_per_value
    per_seq = per_token * s
    return ServingBytes(weights, per_token, per_seq,
                        kv_cache_bytes(layers, heads, head_dim, s, 1, bytes_per_value), weights / per_seq)
