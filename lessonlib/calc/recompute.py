"""Activation checkpointing by formula: the extra compute and the memory kept.

Pure Python (no torch). The measured counterpart is :mod:`lessonlib.measure.recompute`.
"""
from __future__ import annotations

from ..checks import count, positive, result, share


#: The three names of one technique.
NAMES = ("activation checkpointing", "gradient checkpointing", "activation recomputation")

#: The course's one vocabulary of recomputation policies, the values of every ``recompute`` argument (each
#: function takes the ones it can price or run; ``tests/test_recompute_words.py`` holds them to this list).
#: "Selective recomputation" names the family of policies between "none" and "full", never one value.
RECOMPUTE_POLICIES = {
    "none": "nothing recomputed: every value backward reads is kept",
    "attention": "Korthikanti et al.'s selective recomputation: the attention core (scores, softmax, dropout, "
                 "the two score products) rebuilt; the weight products', LayerNorms' and GELU's outputs kept",
    "save_matmuls": "only the layer's input and the weight products' outputs (QKV, output projection, the "
                    "MLP's two) kept; everything else rebuilt, the attention core, LayerNorms and GELU included",
    "save_matmuls_and_attention": "save_matmuls, and a fused attention kernel's output kept too, so backward "
                                  "does not rerun the kernel (the same as save_matmuls with attention written out)",
    "full": "only the layer's input kept; the whole layer rerun in backward",
}


def predicted_flops_ratio(recomputed_forward_fraction: float = 1.0,
                          backward_to_forward: float = 2.0,
                          no_input_grad_share: float = 0.0) -> float:
    """FLOPs of a checkpointed training step divided by those of a plain step.

    A plain step costs one forward (F) plus a backward. A layer whose input
    needs a gradient costs ``backward_to_forward`` x its forward in backward
    (about 2: the gradient of its weights and of its input). A layer whose
    input needs no gradient - the first layer, fed straight from the data -
    computes only its weight gradient, half that. ``no_input_grad_share`` is
    the share of the forward FLOPs in such layers, so the plain step is
    F x (1 + b - b x share / 2). Recomputation adds
    ``recomputed_forward_fraction`` x F.

    4/3 holds when every layer's input needs a gradient (share 0: the layers
    sit inside a bigger model) and the whole forward is recomputed:
    (1 + 2 + 1) / 3. When the first of n equal layers reads the data, the
    share is 1/n and the ratio is (4 - 1/n) / (3 - 1/n), a little above 4/3.

    >>> predicted_flops_ratio()
    1.3333333333333333
    >>> round(predicted_flops_ratio(no_input_grad_share=1 / 8), 4)
    1.3478
    """
    recomputed_forward_fraction = share("recomputed_forward_fraction", recomputed_forward_fraction)
    backward_to_forward = positive("backward_to_forward", backward_to_forward)
    no_input_grad_share = share("no_input_grad_share", no_input_grad_share)
    plain = 1.0 + backward_to_forward * (1.0 - no_input_grad_share / 2.0)
    return (plain + recomputed_forward_fraction) / plain


def chain_memory_units(layers: int, segments: int) -> int:
    """Activations a chain of ``layers`` equal layers keeps after forward,
    in units of one layer's activation, when split into ``segments``
    checkpointed segments by :func:`torch.utils.checkpoint.checkpoint_sequential`.

    It keeps the input of every segment but the first (whose input is the
    model's input, which exists anyway): ``segments - 1``; and PyTorch runs the
    last segment without checkpointing, so that segment keeps all of its
    ``ceil(layers / segments)`` activations. The same number of layers is
    alive again while one segment is recomputed in backward. The sum is
    smallest near ``segments = sqrt(layers)``; one segment keeps everything.

    >>> chain_memory_units(16, 4)
    7
    >>> chain_memory_units(16, 1)
    16
    """
    layers = count("layers", layers)
    segments = count("segments", segments, maximum=layers)
    return (segments - 1) + -(-layers // segments)  # whole-number ceil: exact for any size


def memory_optimal_segment_layers(layers, boundary_bytes, block_bytes, in_flight=1) -> float:
    """Blocks per checkpointed segment that keep the least activation memory, in blocks (a float):
    sqrt(in_flight x layers x boundary_bytes / block_bytes).

    A stack of ``layers`` equal blocks is cut into segments of k blocks, each
    checkpointed. The forward keeps one boundary (a segment's input,
    ``boundary_bytes``) per segment, layers / k of them, for each of the
    ``in_flight`` micro-batches whose forward has run and whose backward has
    not; backward rebuilds one segment of one micro-batch at a time, so k
    blocks' worth of kept activations (``block_bytes`` each, what one block
    keeps when nothing is recomputed) are alive at once.
    in_flight x layers x boundary / k + k x block is smallest at
    k = sqrt(in_flight x layers x boundary / block).

    ``in_flight`` is 1 without pipeline parallelism. Under 1F1B the first of
    p pipeline stages holds p micro-batches in flight (its warm-up), so for a
    stage of ``layers`` = n / p layers the product in_flight x layers is n
    again: the first stage's k* is the whole model's.

    With boundary equal to block (a chain whose layers keep about their input)
    and one micro-batch that is sqrt(layers) segments of sqrt(layers) layers; a
    value at or below 1 means one block a segment. Segments are whole blocks:
    round the result to a neighbouring whole number and compare both.

    >>> memory_optimal_segment_layers(16, 1, 1)
    4.0
    >>> round(memory_optimal_segment_layers(126, 2, 34), 2)
    2.72
    >>> round(memory_optimal_segment_layers(8, 2, 34, in_flight=16), 2)
    2.74
    """
    n = count("layers", layers)
    boundary = positive("boundary_bytes", boundary_bytes)
    block = positive("block_bytes", block_bytes)
    m = count("in_flight", in_flight)
    return result((m * n * (boundary / block)) ** 0.5, "in_flight, layers, boundary_bytes and block_bytes",
                  "a segment length in blocks")


def matmul_outputs_bytes_per_layer(seq_len, batch, hidden, bytes_per_value: int = 2) -> int:
    """Bytes one GPT layer keeps under ``recompute="save_matmuls"``: only its weight matrix products' outputs
    saved (PyTorch's ``create_selective_checkpoint_contexts`` with a policy that saves ``mm``/``addmm``).

    The checkpoint keeps the layer's input (h values a token) and the products'
    outputs: QKV (3h), the output projection (h), the MLP's first (4h) and second
    (h) products: 10h values a token, ``bytes_per_value`` bytes each. Everything
    else (LayerNorms, the attention scores, softmax, dropouts, GELU) is recomputed.

    >>> matmul_outputs_bytes_per_layer(2048, 1, 4096) == 20 * 2048 * 4096
    True
    """
    s, b, h = count("seq_len", seq_len), count("batch", batch), count("hidden", hidden)
    e = count("bytes_per_value", bytes_per_value)
    return (1 + 3 + 1 + 4 + 1) * e * s * b * h


def llama_matmul_outputs_constant(heads, kv_heads, ffn_ratio: float = 8 / 3, bytes_per_value: int = 2) -> float:
    """Bytes per s*b*h one Llama-style layer keeps under ``recompute="save_matmuls"``: the 20 of
    :func:`matmul_outputs_bytes_per_layer` for a layer with grouped-query attention and a SwiGLU MLP
    (the layer of :func:`lessonlib.calc.memory.llama_layer_constant`).

    Kept, in units of h values a token: the layer's input (1); the query, key and value products' outputs,
    1 + 2 x ``kv_heads`` / ``heads`` (grouped-query attention shrinks K and V); the output projection's (1); the
    gate and up products' outputs, each ``ffn_ratio`` wide (2 x ``ffn_ratio``); the down product's (1). So
    e x (4 + 2 x kv_heads / heads + 2 x ffn_ratio), e = ``bytes_per_value``.

    >>> llama_matmul_outputs_constant(128, 8, ffn_ratio=53248 / 16384)   # Llama 3 405B: 3.25 h wide, 8 of 128
    21.25
    >>> llama_matmul_outputs_constant(32, 32, ffn_ratio=2.0)   # no GQA, a 2h SwiGLU: the GPT layer's 20
    20.0
    """
    a, g = count("heads", heads), count("kv_heads", kv_heads)
    if a % g:
        raise ValueError(f"kv_heads ({g}) must divide heads ({a}): each key/value head serves a whole group")
    r = positive("ffn_ratio", ffn_ratio, maximum=64.0)  # an MLP at most 64 h wide
    e = count("bytes_per_value", bytes_per_value, maximum=8)
    return float(e * (4 + 2 * g / a + 2 * r))


def attention_core_flops_per_layer(seq_len, batch, hidden) -> int:
    """Forward FLOPs of attention's two batched products, Q·Kᵀ and scores·V: 4·b·s²·h.

    What ``"attention"`` and ``"save_matmuls"`` rerun in matrix products: 4·s·h FLOPs a token,
    against the 2·s·a bytes a token of scores (and more for softmax and dropout)
    that storing them would cost. Counted over the full s x s matrix, as a
    written-out causal attention computes it.

    >>> attention_core_flops_per_layer(128, 4, 64)
    16777216
    """
    s, b, h = count("seq_len", seq_len), count("batch", batch), count("hidden", hidden)
    return 4 * b * s * s * h
