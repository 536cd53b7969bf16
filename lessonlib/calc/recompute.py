"""Activation checkpointing by formula: the extra compute and the memory kept.

Pure Python (no torch). The measured counterpart is :mod:`lessonlib.measure.recompute`.
"""
from __future__ import annotations

import math


#: The three names of one technique.
NAMES = ("activation checkpointing", "gradient checkpointing", "activation recomputation")


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
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise ValueError(f"layers must be a positive integer, got {layers!r}")
    if not isinstance(segments, int) or isinstance(segments, bool) or not 1 <= segments <= layers:
        raise ValueError(f"segments must be an integer in [1, layers], got {segments!r}")
    return (segments - 1) + math.ceil(layers / segments)
