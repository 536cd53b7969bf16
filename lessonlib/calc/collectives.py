"""Bytes each device sends in the collectives that distributed training uses.

Ring algorithms: an all-reduce is a reduce-scatter followed by an all-gather.
Inputs and results are bytes. Pure Python (no torch).
"""
from __future__ import annotations

from ..checks import amount as _check_amount, count as _check_count


def ring_allreduce_bytes(n_bytes, devices) -> float:
    """Bytes each device sends in a ring all-reduce of an ``n_bytes`` tensor.

    A ring all-reduce is a reduce-scatter followed by an all-gather; each
    phase passes ``devices - 1`` chunks of ``n_bytes / devices`` around the
    ring, so each device sends ``2 (devices - 1) / devices × n_bytes`` bytes
    (and receives as many). One device sends nothing. The volume per device
    approaches twice the tensor as devices grow: it does not shrink.

    >>> ring_allreduce_bytes(1000, 4)
    1500.0
    """
    n_bytes = _check_amount("n_bytes", n_bytes)
    devices = _check_count("devices", devices)
    return 2.0 * (devices - 1) / devices * n_bytes


def all_gather_bytes(n_bytes, devices) -> float:
    """Bytes each device sends in a ring all-gather that builds an ``n_bytes`` tensor.

    Each device starts with ``n_bytes / devices`` and must end with all of it:
    ``(devices - 1) / devices × n_bytes`` bytes sent per device (half of a ring
    all-reduce, which is a reduce-scatter plus this all-gather).

    >>> all_gather_bytes(1000, 4)
    750.0
    """
    n_bytes = _check_amount("n_bytes", n_bytes)
    devices = _check_count("devices", devices)
    return (devices - 1) / devices * n_bytes
