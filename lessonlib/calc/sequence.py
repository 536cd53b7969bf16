"""Splitting along the sequence: sequence parallelism and context parallelism, by formula.

Pure Python (no torch). Three things:

* the activation bytes one transformer layer keeps per device under sequence
  parallelism (Korthikanti et al., 2022), beside tensor parallelism alone
  (:func:`lessonlib.calc.memory.activation_bytes_per_layer` with
  ``tensor_parallel``);
* the bytes a ring attention keeps per device under context parallelism;
* the causal-attention work of each device when the sequence is cut into
  contiguous pieces, or in the zig-zag order that balances it;
* the fewest tokens per device at which a ring step's attention hides its
  K/V send (the alpha-beta model of :mod:`lessonlib.calc.comm`).
"""
from __future__ import annotations

import math

from ..checks import (amount as _check_amount, choice as _check_choice, count as _check_count,
                      positive as _check_positive, result as _check_result)
from .memory import BYTES_PER_VALUE_CHOICES, activation_bytes_per_layer

#: The two ways :func:`sequence_layout` hands out a sequence's chunks.
LAYOUTS = ("contiguous", "zigzag")
#: The most devices the layout functions describe (a list per device is built).
MAX_DEVICES = 65_536


def _sizes(seq_len, batch, hidden, heads, bytes_per_value):
    s = _check_count("seq_len", seq_len)
    b = _check_count("batch", batch)
    h = _check_count("hidden", hidden)
    a = _check_count("heads", heads, maximum=h)
    e = _check_count("bytes_per_value", bytes_per_value)
    if e not in BYTES_PER_VALUE_CHOICES:
        raise ValueError(f"bytes_per_value must be one of {', '.join(map(str, BYTES_PER_VALUE_CHOICES))} "
                         f"(16-bit or fp32 activations), got {e}")
    if h % a:
        raise ValueError(f"heads ({a}) must divide hidden ({h}): each head takes hidden / heads")
    return s, b, h, a, e


def sequence_parallel_activation_bytes(seq_len, batch, hidden, heads, tensor_parallel,
                                       bytes_per_value: int = 2) -> int:
    """Activation bytes one layer keeps per device with tensor and sequence parallelism of degree t.

    Korthikanti et al. (2022), 16-bit activations and 1-byte dropout masks:
    ``s*b*h/t * (34 + 5*a*s/h)``. Everything tensor parallelism alone keeps
    whole on every device (``10*s*b*h``: the two LayerNorm inputs, the
    inputs of the QKV and of the MLP's first matrix, the two dropout masks
    between blocks) is split along the sequence, so the whole layer divides
    by t. With ``e = bytes_per_value``: ``(s*b*h*(16e + 2) + a*s*s*b*(2e + 1)) / t``.

    The paper keeps the *sequence slice* of the inputs of the two column-split
    matrices and all-gathers them again in backward. A framework that keeps the
    all-gathered input instead (DTensor's ``ColwiseParallel`` does) keeps
    :func:`gathered_input_bytes` more.

    Returns bytes (an int). t must divide heads, hidden and seq_len.

    >>> sequence_parallel_activation_bytes(2048, 1, 4096, 32, 8) // 2**20
    114
    >>> sequence_parallel_activation_bytes(2048, 1, 4096, 32, 1) // 2**20
    912
    """
    s, b, h, a, e = _sizes(seq_len, batch, hidden, heads, bytes_per_value)
    t = _check_count("tensor_parallel", tensor_parallel)
    if a % t or h % t or s % t:
        raise ValueError(f"tensor_parallel ({t}) must divide heads ({a}), hidden ({h}) and seq_len ({s}): "
                         "each device takes whole heads and an equal slice of the sequence")
    # the one formula (calc.memory), with the scores stored as the paper counts them
    return activation_bytes_per_layer(s, b, h, a, "none", e, tensor_parallel=t, attention="stored",
                                      sequence_parallel=True)


def gathered_input_bytes(seq_len, batch, hidden, tensor_parallel, bytes_per_value: int = 2) -> int:
    """Bytes a device keeps above :func:`sequence_parallel_activation_bytes` when it saves gathered inputs.

    Under sequence parallelism the inputs of the QKV matrix and of the MLP's
    first matrix arrive through an all-gather. Korthikanti et al. keep only
    the device's ``s/t`` tokens of each and all-gather again in backward;
    keeping the gathered ``s`` tokens instead costs
    ``2 * e*s*b*h * (1 - 1/t)`` more bytes per layer (two inputs, each whole
    minus its slice).

    >>> gathered_input_bytes(128, 2, 256, 2)
    131072
    """
    s = _check_count("seq_len", seq_len)
    b = _check_count("batch", batch)
    h = _check_count("hidden", hidden)
    t = _check_count("tensor_parallel", tensor_parallel)
    e = _check_count("bytes_per_value", bytes_per_value)
    if e not in BYTES_PER_VALUE_CHOICES:
        raise ValueError(f"bytes_per_value must be one of {', '.join(map(str, BYTES_PER_VALUE_CHOICES))}, got {e}")
    if s % t:
        raise ValueError(f"tensor_parallel ({t}) must divide seq_len ({s}): each device takes an equal slice")
    return 2 * e * b * h * (s - s // t)


def ring_attention_saved_bytes(seq_len, batch, hidden, heads, world_size, bytes_per_value: int = 4) -> int:
    """Bytes a ring attention (or FlashAttention) keeps for backward, per device, over ``world_size``.

    Attention that never materialises the ``s x s`` scores keeps its inputs
    Q, K, V, its output O (``e`` bytes per value each, ``s*b*h`` values) and
    one float32 log-sum-exp per query and head (``4*b*a*s`` bytes), and
    recomputes the scores in backward. Under context parallelism each device
    holds ``s/world_size`` tokens of every one of them:
    ``(4*e*s*b*h + 4*b*a*s) / world_size``.

    >>> ring_attention_saved_bytes(1024, 1, 128, 4, 1)
    2113536
    >>> ring_attention_saved_bytes(1024, 1, 128, 4, 2)
    1056768
    """
    s, b, h, a, e = _sizes(seq_len, batch, hidden, heads, bytes_per_value)
    d = _check_count("world_size", world_size)
    if s % d:
        raise ValueError(f"world_size ({d}) must divide seq_len ({s}): each device takes an equal slice")
    return (4 * e * s * b * h + 4 * b * a * s) // d


#: The two ways :func:`context_parallel_bytes_sent` counts: a ring attention, and DeepSpeed-Ulysses.
CONTEXT_METHODS = ("ring", "ulysses")


def context_parallel_bytes_sent(method, seq_len, batch, hidden, world_size, bytes_per_value: int = 2) -> int:
    """Bytes each device sends (as many as it receives) for one attention layer's forward under context
    parallelism over ``world_size``.

    ``"ring"``: the device receives the other ``world_size - 1`` devices' K and V blocks, each ``s/world_size``
    tokens: ``2*e*(s/world_size)*b*h*(world_size - 1)``, almost the same however many share the sequence.
    ``"ulysses"``: two all-to-alls per layer (q, k, v before attention, the output after) each keep
    ``1/world_size`` of a device's ``s/world_size``-token slices and send the rest:
    ``4*e*(s/world_size)*b*h*(world_size - 1)/world_size``. The ratio is ``2/world_size`` (no grouped-query
    attention, which shrinks K and V for both).

    >>> context_parallel_bytes_sent("ring", 16384, 1, 4096, 8) // 2**20
    224
    >>> context_parallel_bytes_sent("ulysses", 16384, 1, 4096, 8) // 2**20
    56
    """
    method = _check_choice("method", method, CONTEXT_METHODS)
    s, b, h, _, e = _sizes(seq_len, batch, hidden, 1, bytes_per_value)
    d = _check_count("world_size", world_size)
    if s % d:
        raise ValueError(f"world_size ({d}) must divide seq_len ({s}): each device takes an equal slice")
    slice_bytes = e * (s // d) * b * h
    if method == "ring":
        return 2 * slice_bytes * (d - 1)
    return 4 * slice_bytes * (d - 1) // d


def sequence_layout(world_size, layout: str = "zigzag") -> list:
    """Which chunks of the sequence each device holds, the sequence being cut into ``2 * world_size`` chunks.

    ``"contiguous"``: device r holds chunks 2r and 2r + 1 (its tokens are one
    run). ``"zigzag"``: device r holds chunk r and chunk ``2*world_size - 1 - r``,
    one from the start and its mirror from the end, so that under a causal mask
    every device has the same work (:func:`causal_block_counts`).

    >>> sequence_layout(2, "contiguous")
    [[0, 1], [2, 3]]
    >>> sequence_layout(2, "zigzag")
    [[0, 3], [1, 2]]
    """
    d = _check_count("world_size", world_size, maximum=MAX_DEVICES)
    _check_choice("layout", layout, LAYOUTS)
    if layout == "contiguous":
        return [[2 * r, 2 * r + 1] for r in range(d)]
    return [[r, 2 * d - 1 - r] for r in range(d)]


def causal_block_counts(world_size, layout: str = "zigzag") -> list:
    """Blocks of causal attention each device computes: one entry per device.

    A block is one (query chunk, key chunk) pair of :func:`sequence_layout`'s
    ``2 * world_size`` chunks. Under a causal mask a query sees only keys at or
    before it, so a key chunk after the query chunk is skipped whole; the
    others are computed (the diagonal ones half masked). A contiguous split
    gives device r ``4r + 3`` blocks, from 3 on the first device to
    ``4*world_size - 1`` on the last; the zig-zag split gives every device
    ``2*world_size + 1``. Same total, ``world_size * (2*world_size + 1)``.

    >>> causal_block_counts(4, "contiguous")
    [3, 7, 11, 15]
    >>> causal_block_counts(4, "zigzag")
    [9, 9, 9, 9]
    """
    # every chunk 0 .. 2*devices - 1 is held by some device, so query chunk q sees q + 1 key chunks
    return [sum(q + 1 for q in mine) for mine in sequence_layout(world_size, layout)]


def causal_work(world_size, layout: str = "zigzag") -> list:
    """Causal-attention work of each device, in whole blocks: one entry per device.

    :func:`causal_block_counts` with each diagonal block counted as the half
    the mask leaves (its upper triangle is masked): query chunk q does
    ``q + 1/2`` blocks of work. A contiguous split gives device r ``4r + 2``;
    the zig-zag split gives every device ``2*world_size``. Same total,
    ``2 * world_size**2``, half the ``(2*world_size)**2`` grid.

    >>> causal_work(2, "contiguous")
    [2.0, 6.0]
    >>> causal_work(2, "zigzag")
    [4.0, 4.0]
    """
    return [sum(q + 0.5 for q in mine) for mine in sequence_layout(world_size, layout)]


#: What :func:`causal_imbalance` counts: computed blocks, or the work they hold (diagonal blocks half).
IMBALANCE_COUNTS = ("blocks", "work")


def causal_imbalance(world_size, layout: str = "zigzag", count: str = "blocks") -> float:
    """Busiest device's causal-attention load / mean load per device (dimensionless, >= 1).

    ``count="blocks"`` counts computed blocks (:func:`causal_block_counts`),
    ``"work"`` the work inside them (:func:`causal_work`: a diagonal block is
    half masked). The attention step ends when the busiest device does, so
    the work ratio is how much longer it takes than an even spread.

    >>> round(causal_imbalance(4, "contiguous"), 3)
    1.667
    >>> causal_imbalance(2, "contiguous", count="work")
    1.5
    >>> causal_imbalance(4, "zigzag")
    1.0
    """
    _check_choice("count", count, IMBALANCE_COUNTS)
    loads = (causal_block_counts if count == "blocks" else causal_work)(world_size, layout)
    return max(loads) * len(loads) / sum(loads)


def ring_overlap_tokens(hidden, kv_hidden, flops_per_s, alpha_s, beta_bytes_per_s,
                        bytes_per_value: int = 2) -> float:
    """Fewest tokens per device, ``s/cp``, at which a ring step's attention lasts as long as its K/V send.

    One sequence (batch 1), zig-zag split, forward. At each ring step a device
    attends its ``x = s/cp`` queries to the ``x`` keys of the block in hand;
    under the causal mask half of those pairs count (every step of the zig-zag
    split but the first), each 4 FLOPs per query width (``Q K^T`` and
    ``P V``): ``2 x**2 hidden`` FLOPs, at ``flops_per_s``. Meanwhile it sends
    the next block's K and V, ``2 e x kv_hidden`` bytes (``kv_hidden`` =
    key/value heads x head width: smaller than ``hidden`` with grouped-query
    attention), one message of the alpha-beta model: ``alpha_s + bytes /
    beta_bytes_per_s``. Compute grows as ``x**2``, the send as ``x``: the
    send hides once ``x`` reaches the positive root of
    ``2 hidden x**2 / F - 2 e kv_hidden x / beta - alpha = 0``. Returns tokens (a float).

    >>> round(ring_overlap_tokens(4096, 4096, 500e12, 0.0, 50e9))
    20000
    """
    h = _check_count("hidden", hidden)
    kv = _check_count("kv_hidden", kv_hidden, maximum=h)
    f = _check_positive("flops_per_s", flops_per_s)
    alpha = _check_amount("alpha_s", alpha_s)
    beta = _check_positive("beta_bytes_per_s", beta_bytes_per_s)
    e = _check_count("bytes_per_value", bytes_per_value)
    a, b = 2 * h / f, 2 * e * kv / beta  # seconds per token squared, per token
    x = (b + math.sqrt(b * b + 4 * a * alpha)) / (2 * a)
    return _check_result(x, "hidden, kv_hidden, flops_per_s and the link", "a number of tokens")
