"""Activation checkpointing by formula: the extra compute and the memory kept.

Pure Python (no torch). The measured counterpart is :mod:`lessonlib.measure.recompute`.
"""
from __future__ import annotations

from ..checks import count, positive, share


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
    recomputed_forward_fraction = share("recomputed_forward_fraction", recomputed_forward_fraction)
    backward_to_forward = positive("backward_to_forward", backward_to_forward)
    plain = 1.0 + backward_to_forward
    return (plain + recomputed_forward_fraction) / plain


def chain_memory_units(n_layers: int, segments: int) -> int:
    """Activations a chain of ``n_layers`` equal layers keeps after forward,
    in units of one layer's activation, when split into ``segments``
    checkpointed segments by :func:`torch.utils.checkpoint.checkpoint_sequential`.

    It keeps the input of every segment but the first (whose input is the
    model's input, which exists anyway): ``segments - 1``; and PyTorch runs the
    last segment without checkpointing, so that segment keeps all of its
    ``ceil(n_layers / segments)`` activations. The same number of layers is
    alive again while one segment is recomputed in backward. The sum is
    smallest near ``segments = sqrt(n_layers)``; one segment keeps everything.

    >>> chain_memory_units(16, 4)
    7
    >>> chain_memory_units(16, 1)
    16
    """
    n_layers = count("n_layers", n_layers)
    segments = count("segments", segments, maximum=n_layers)
    return (segments - 1) + -(-n_layers // segments)  # whole-number ceil: exact for any size
