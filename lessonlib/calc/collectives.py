"""Bytes each device sends in the collectives that distributed training uses.

Ring algorithms: an all-reduce is a reduce-scatter followed by an all-gather.
Inputs and results are bytes. Pure Python (no torch).
"""
from __future__ import annotations

from ..checks import amount as _check_amount, count as _check_count


def ring_allreduce_bytes(n_bytes, world_size) -> float:
    """Bytes each device sends in a ring all-reduce of an ``n_bytes`` tensor.

    A ring all-reduce is a reduce-scatter followed by an all-gather; each
    phase passes ``world_size - 1`` chunks of ``n_bytes / world_size`` around the
    ring, so each device sends ``2 (world_size - 1) / world_size × n_bytes`` bytes
    (and receives as many). One device sends nothing. The volume per device
    approaches twice the tensor as devices grow: it does not shrink.

    >>> ring_allreduce_bytes(1000, 4)
    1500.0
    """
    n_bytes = _check_amount("n_bytes", n_bytes)
    world_size = _check_count("world_size", world_size)
    return 2.0 * (world_size - 1) / world_size * n_bytes


def all_gather_bytes(n_bytes, world_size) -> float:
    """Bytes each device sends in a ring all-gather that builds an ``n_bytes`` tensor.

    Each device starts with ``n_bytes / world_size`` and must end with all of it:
    ``(world_size - 1) / world_size × n_bytes`` bytes sent per device (half of a ring
    all-reduce, which is a reduce-scatter plus this all-gather).

    >>> all_gather_bytes(1000, 4)
    750.0
    """
    n_bytes = _check_amount("n_bytes", n_bytes)
    world_size = _check_count("world_size", world_size)
    return (world_size - 1) / world_size * n_bytes
