"""Input checks shared by every public function of lessonlib: the one validator.

Each returns the cleaned value or raises ``ValueError`` (a wrong value) or
``TypeError`` (a wrong kind of object) with a message that names the argument
as the caller spelled it and says what was wrong, e.g.
``devices must be positive, got 0``. Pure Python: no torch needed.

The same rules everywhere: Python and numpy integers and whole-valued floats
are counts; ``True``/``False``, NaN, infinity and numbers too large for a
float are refused; strings are never read as numbers.
"""
from __future__ import annotations

import math
import numbers

#: The largest count accepted anywhere unless a function states a smaller one:
#: the range of a signed 64-bit integer, which is what torch and numpy can index.
MAX_COUNT = 2**63 - 1


def _is_bool(value) -> bool:
    """True for Python's and numpy's booleans (numpy's is not a subclass of bool)."""
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))


def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def count(name: str, value, minimum: int = 1, maximum: int | None = None) -> int:
    """A whole number (devices, layers, a batch size) from ``minimum`` to ``maximum``.

    Accepts Python and numpy integers, and floats with a whole value (so
    ``7.5e9`` parameters is fine); rejects booleans, fractions, NaN, infinity
    and values above ``maximum`` (default :data:`MAX_COUNT`).
    """
    if _is_bool(value):
        raise ValueError(f"{name} must be a whole number (a count), got a boolean {value!r}")
    if isinstance(value, numbers.Integral):
        value = int(value)
    elif isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        value = int(value)
    else:
        raise ValueError(f"{name} must be a whole number (a count), got {_describe(value)}")
    if value < minimum:
        need = "positive" if minimum == 1 else f"at least {minimum}"
        raise ValueError(f"{name} must be {need}, got {value}")
    top = MAX_COUNT if maximum is None else maximum
    if value > top:
        raise ValueError(f"{name} must be at most {top:,}, got {value:,}" if value < 10**30 else
                         f"{name} must be at most {top:,}, got a {len(str(value))}-digit number")
    return value


def amount(name: str, value, *, allow_zero: bool = True, maximum: float | None = None) -> float:
    """A finite, non-negative number (work units, bytes, seconds); positive if not ``allow_zero``."""
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {_describe(value)}")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"{name} is too large to be a number of this kind, got a "
                         f"{len(str(int(value)))}-digit number") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        need = "zero or positive" if allow_zero else "positive"
        raise ValueError(f"{name} must be {need}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum:g}, got {value:g}")
    return value


def number(name: str, value) -> float:
    """Any finite number, of either sign (an answer, an offset)."""
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {_describe(value)}")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"{name} is too large to be a number of this kind") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def positive(name: str, value, maximum: float | None = None) -> float:
    """A finite number greater than zero."""
    return amount(name, value, allow_zero=False, maximum=maximum)


def share(name: str, value) -> float:
    """A fraction of a whole, between 0 and 1 inclusive."""
    value = amount(name, value)
    if value > 1:
        raise ValueError(f"{name} is a fraction and must be at most 1, got {value!r}")
    return value


def fraction_below_one(name: str, value) -> float:
    """A probability that must stay below 1 (a dropout rate): 0 <= value < 1."""
    value = amount(name, value)
    if value >= 1:
        raise ValueError(f"{name} must be below 1 (a probability of dropping), got {value!r}")
    return value


def choice(name: str, value, choices) -> str:
    """One of ``choices`` (exact spelling); the message lists them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"unknown {name} {_describe(value)}; choose one of {', '.join(map(repr, choices))}")
    return value


def flag(name: str, value) -> bool:
    """``True`` or ``False`` (a numpy bool too); numbers and strings are refused."""
    if _is_bool(value):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {_describe(value)}")


def text(name: str, value, allow_empty: bool = False) -> str:
    """A string; empty (or only spaces) only if ``allow_empty``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {_describe(value)}")
    if not value.strip() and not allow_empty:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def instance(name: str, value, kinds, what: str):
    """``value`` itself if it is an instance of ``kinds``; else ``TypeError`` saying ``what`` was expected."""
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise TypeError(f"{name} must be {what}, got a boolean {value!r}")
    if not isinstance(value, kinds):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__} {_describe(value)}")
    return value


def path(name: str, value):
    """A file or folder path (a non-empty string or an ``os.PathLike``), as a ``pathlib.Path``."""
    import os
    from pathlib import Path

    if not isinstance(value, (str, os.PathLike)) or _is_bool(value):
        raise TypeError(f"{name} must be a file or folder path, got {_describe(value)}")
    if not str(value).strip():
        raise ValueError(f"{name} must not be an empty path")
    return Path(value)


def function(name: str, value):
    """A callable (a function, a class, a module)."""
    if not callable(value):
        raise TypeError(f"{name} must be callable (a function), got {_describe(value)}")
    return value


def sequence(name: str, value, allow_empty: bool = False) -> list:
    """A list or tuple (not a string or a dict) as a list; empty only if ``allow_empty``."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__") or not hasattr(value, "__len__"):
        raise TypeError(f"{name} must be a list or tuple, got {_describe(value)}")
    value = list(value)
    if not value and not allow_empty:
        raise ValueError(f"{name} must not be empty")
    return value


def counts(name: str, value, minimum: int = 1, maximum: int | None = None) -> list:
    """A non-empty list or tuple of whole numbers, each checked as :func:`count` (named ``name[i]``)."""
    return [count(f"{name}[{i}]", v, minimum, maximum) for i, v in enumerate(sequence(name, value))]


def mapping(name: str, value, allow_empty: bool = False) -> dict:
    """A dict; empty only if ``allow_empty``."""
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict, got {_describe(value)}")
    if not value and not allow_empty:
        raise ValueError(f"{name} must not be empty")
    return value
