"""Input checks shared by every public calculator.

Each returns the cleaned value or raises ``ValueError`` with a message that
names the argument and says what was wrong, e.g.
``devices must be positive, got 0``. Pure Python: no torch needed.
"""
from __future__ import annotations

import math
import numbers


def count(name: str, value, minimum: int = 1) -> int:
    """A whole number (devices, layers, a batch size) of at least ``minimum``.

    Accepts Python and numpy integers, and floats with a whole value (so
    ``7.5e9`` parameters is fine); rejects booleans and fractions.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a whole number (a count), got a boolean {value!r}")
    if isinstance(value, numbers.Integral):
        value = int(value)
    elif isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        value = int(value)
    else:
        raise ValueError(f"{name} must be a whole number (a count), got {value!r}")
    if value < minimum:
        need = "positive" if minimum == 1 else f"at least {minimum}"
        raise ValueError(f"{name} must be {need}, got {value}")
    return value


def amount(name: str, value, *, allow_zero: bool = True) -> float:
    """A finite, non-negative number (work units, bytes, seconds); positive if not ``allow_zero``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        need = "zero or positive" if allow_zero else "positive"
        raise ValueError(f"{name} must be {need}, got {value!r}")
    return value


def positive(name: str, value) -> float:
    """A finite number greater than zero."""
    return amount(name, value, allow_zero=False)


def share(name: str, value) -> float:
    """A fraction of a whole, between 0 and 1 inclusive."""
    value = amount(name, value)
    if value > 1:
        raise ValueError(f"{name} is a fraction and must be at most 1, got {value!r}")
    return value


def choice(name: str, value, choices) -> str:
    """One of ``choices``; the message lists them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(map(repr, choices))}")
    return value
