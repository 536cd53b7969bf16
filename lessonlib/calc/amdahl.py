"""Amdahl's law and Gustafson's law: how much faster a job gets on more devices.

Work is split into a serial part, which runs in sequence whatever the device
count, and a parallel part, which divides among the devices; communication is
paid only when more than one device takes part. Units of work are whatever the
caller uses (seconds, or abstract work units); speedups are dimensionless (×).
Amdahl keeps the job fixed (strong scaling); Gustafson keeps the time per
device fixed and grows the job with the devices (weak scaling,
:func:`gustafson_speedup`). Pure Python (no torch).
"""
from __future__ import annotations

from ..checks import amount as _check_amount, count as _check_count, share as _check_share


def amdahl_time(serial, parallel, world_size, communication=0.0) -> float:
    """Time of one job on ``world_size`` equal devices, in the units of the inputs.

    ``serial`` work runs in sequence whatever the device count; ``parallel``
    work divides perfectly among the devices; ``communication`` is the time
    the devices spend coordinating (synchronising, exchanging gradients) and
    is paid only when more than one device takes part::

        time = serial + parallel / devices + (communication if devices > 1 else 0)

    The course's 80/20 example: 20 serial units and 80 parallel units on 4 devices
    take 20 + 80/4 = 40 units.

    >>> amdahl_time(20, 80, 4)
    40.0

    Raises ``ValueError`` naming the argument for negative or non-finite
    amounts and for a device count that is not a whole number >= 1.
    """
    return _time(*_checked(serial, parallel, world_size, communication))


def _checked(serial, parallel, world_size, communication) -> tuple:
    """The arguments of :func:`amdahl_time`, each checked once under the name the caller used."""
    return (_check_amount("serial", serial), _check_amount("parallel", parallel),
            _check_count("world_size", world_size), _check_amount("communication", communication))


def _time(serial, parallel, world_size, communication) -> float:
    """:func:`amdahl_time` on checked arguments (internal calls trust their caller)."""
    return serial + parallel / world_size + (communication if world_size > 1 else 0.0)


def _speedup(serial, parallel, world_size, communication) -> float:
    """:func:`amdahl_speedup` on checked arguments."""
    t_many = _time(serial, parallel, world_size, communication)
    if t_many == 0:
        raise ValueError("serial, parallel and communication are all zero: there is no work to speed up")
    return _time(serial, parallel, 1, 0.0) / t_many


def amdahl_speedup(serial, parallel, world_size, communication=0.0) -> float:
    """Speedup on ``world_size`` devices: one-device time / ``world_size``-device time.

    Dimensionless (×). Same arguments as :func:`amdahl_time`; one device pays
    no communication, so its time is ``serial + parallel``.

    >>> amdahl_speedup(20, 80, 4)
    2.5
    """
    return _speedup(*_checked(serial, parallel, world_size, communication))


def speedup_from_share(serial_share, world_size, communication_share=0.0) -> float:
    """Amdahl speedup from fractions of the one-device time (dimensionless, ×).

    ``serial_share`` is the fraction of the one-device time that cannot be
    divided (0 to 1); ``communication_share`` is the coordination time paid
    with more than one device, as a fraction of the one-device time (>= 0; it
    can exceed 1 -- communication can cost more than the work it serves).

    >>> speedup_from_share(0.2, 4)
    2.5
    """
    serial_share = _check_share("serial_share", serial_share)
    communication_share = _check_amount("communication_share", communication_share)
    return _speedup(serial_share, 1.0 - serial_share, _check_count("world_size", world_size), communication_share)


def gustafson_speedup(serial_share, world_size) -> float:
    """Gustafson's scaled speedup (dimensionless, ×): the job grows with the devices.

    Weak scaling: each of ``world_size`` devices keeps a fixed amount of parallel
    work, so the job grows with the device count. ``serial_share`` is the
    fraction of the *``world_size``-device* run's time that is serial (0 to 1).
    One device would need ``serial_share + world_size × (1 - serial_share)`` of
    that time for the same, larger job, so::

        scaled speedup = devices - serial_share × (devices - 1)

    It grows without a ceiling, where Amdahl's speedup of a fixed job stops at
    ``1 / serial_share``: the two laws answer different questions (how much
    larger a job finishes in the same time, against how much sooner a fixed
    job finishes).

    >>> gustafson_speedup(0.2, 4)
    3.4
    """
    serial_share = _check_share("serial_share", serial_share)
    world_size = _check_count("world_size", world_size)
    return world_size - serial_share * (world_size - 1)
