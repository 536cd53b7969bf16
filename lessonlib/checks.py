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

import functools
import inspect
import math
import numbers
import re
import sys

#: The largest count accepted anywhere unless a function states a smaller one:
#: the range of a signed 64-bit integer, which is what torch and numpy can index.
MAX_COUNT = 2**63 - 1

#: The smallest positive number accepted as "positive": the smallest normal float (about 2.2e-308).
#: Below it (subnormal numbers such as 5e-324) a quotient overflows to infinity, and no time,
#: rate or size of this course is that small.
SMALLEST_POSITIVE = sys.float_info.min


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
    if not allow_zero and 0 < value < SMALLEST_POSITIVE:
        raise ValueError(f"{name} is too small to divide by, got {value!r}: a positive amount must be at least "
                         f"{SMALLEST_POSITIVE:.3g} (smaller numbers are subnormal floats)")
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


def record(name: str, value, keys, what: str = "a measurement's result") -> dict:
    """``value`` if it is a dict holding every one of ``keys``; else an error naming ``name``."""
    mapping(name, value)
    missing = [k for k in keys if k not in value]
    if missing:
        raise ValueError(f"{name} must be {what}, with the keys {', '.join(map(repr, keys))}; "
                         f"missing {', '.join(map(repr, missing))}")
    return value


def records(name: str, value, keys, what: str = "a list of per-rank results") -> list:
    """A non-empty list of :func:`record` dicts."""
    return [record(name, v, keys, what) for v in sequence(name, value)]


def result(value, args: str, what: str, low: float = 0.0, high: float = math.inf, hint: str = "") -> float:
    """A computed ``value`` checked against its physical range: finite and within [``low``, ``high``].

    ``args`` names the arguments that gave it ("total_flops and device_hours"),
    ``what`` says what it is ("a utilisation"); ``hint`` is added to the
    message. Refuses with a ``ValueError`` instead of returning NaN, infinity,
    negative bytes or a fraction above 1.
    """
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(f"{args} give {what} of {value!r}: too large (or too small) to compute in floating point"
                         + (f"; {hint}" if hint else ""))
    if value < low or value > high:
        side = f"below {low:g}" if value < low else f"above {high:g}"
        raise ValueError(f"{args} give {what} of {value:.4g}, {side}, which cannot be" + (f"; {hint}" if hint else ""))
    return value


def _path(name, keys) -> str:
    return name + "".join(f"[{k!r}]" if not isinstance(k, str) or not k.startswith(".") else k for k in keys)


def measured(name: str, value, signed: bool = False, _keys=(), _depth=0):
    """A measured result (dicts, lists, tuples, dataclasses of numbers) whose every number is finite
    and, unless ``signed``, zero or positive (times, bytes, counts, losses).

    Booleans, strings and None are left as they are (flags, labels, "not measured"). The message names
    where the bad number sits, e.g. ``run['runs'][0]['steps'][1]['peak_bytes'][0] must be finite, got nan``.
    Returns ``value``.
    """
    if _depth > 12:
        return value
    if _is_bool(value) or value is None or isinstance(value, (str, bytes)):
        return value
    if isinstance(value, numbers.Real):
        where = _path(name, _keys)
        try:
            x = float(value)
        except OverflowError:
            raise ValueError(f"{where} is too large to be a measurement, got a {len(str(int(value)))}-digit number") \
                from None
        if not math.isfinite(x):
            raise ValueError(f"{where} must be finite, got {x!r}")
        if x < 0 and not signed:
            raise ValueError(f"{where} must be zero or positive (a time, a size or a count), got {x!r}")
        return value
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            kind = str(getattr(f.type, "__name__", f.type)).replace(" ", "")
            if kind in _NUMBER_FIELDS and not (v is None and kind.endswith("|None")) \
                    and (_is_bool(v) or not isinstance(v, numbers.Real)):
                raise ValueError(f"{_path(name, _keys + ('.' + f.name,))} must be a number, got {_describe(v)}")
            measured(name, v, signed, _keys + (f".{f.name}",), _depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            measured(name, v, signed, _keys + (k,), _depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            measured(name, v, signed, _keys + (i,), _depth + 1)
    return value


#: Dataclass field annotations that mean "a number" (a result record's ``int`` and ``float`` fields).
_NUMBER_FIELDS = {"int", "float", "int|None", "float|None"}

_NOT_A_NUMBER_TEXT = re.compile(r"(?<![\w.])(nan|-?inf)(?![\w])", re.I)


def _result_is_finite(value, nesting=0) -> bool:
    if nesting > 6 or _is_bool(value) or value is None:
        return True
    if isinstance(value, numbers.Real):
        try:
            return math.isfinite(float(value))
        except OverflowError:
            return False
    if isinstance(value, str):
        return not _NOT_A_NUMBER_TEXT.search(value)
    if isinstance(value, dict):
        return all(_result_is_finite(v, nesting + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_result_is_finite(v, nesting + 1) for v in value)
    return True


#: What a reader of measured results says when the structure is not the one it reads.
_READ_ERRORS = {
    KeyError: "lacks the key {err}",
    IndexError: "holds a list or tuple shorter than it must be ({err})",
    ZeroDivisionError: "holds a zero where a measurement is divided by (a reference of 0)",
    OverflowError: "holds a number too large to use ({err})",
    AttributeError: "holds an object of the wrong kind ({err})",
    TypeError: "holds a value of the wrong kind ({err})",
    ValueError: "holds a value that cannot be used ({err})",
}


def _names_an_argument(message: str, params, structures) -> bool:
    """Whether ``message`` is a refusal that already names an argument: it starts with one (as every
    message of this module does), or it names, as a word, an argument other than the structures."""
    for p in params:
        if re.match(rf"(unknown )?{re.escape(p)}\b", message):
            return True
        if p not in structures and re.search(rf"\b{re.escape(p)}\b", message):
            return True
    return False


def reads(*names: str, signed=()):
    """Decorate a function that reads measured results passed as the arguments ``names``.

    Before the call, every number inside them is checked with :func:`measured`
    (names in ``signed`` may hold negative numbers). A structure of the wrong
    shape (a missing key, a short tuple, a zero reference, a value of the wrong
    kind) then ends the call with a ``ValueError`` that names the argument,
    chained to the error it caused, instead of a raw ``KeyError``,
    ``IndexError`` or ``ZeroDivisionError``; an error that already names an
    argument passes through unchanged. A result holding NaN or infinity is
    refused the same way.
    """
    def wrap(fn):
        sig = inspect.signature(fn)
        params = list(sig.parameters)
        label = " or ".join(names)

        @functools.wraps(fn)
        def checked(*args, **kwargs):
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError:
                return fn(*args, **kwargs)  # let Python say which argument is missing
            for n in names:
                if n in bound.arguments:
                    measured(n, bound.arguments[n], signed=n in signed)
            try:
                out = fn(*args, **kwargs)
            except tuple(_READ_ERRORS) as err:
                if isinstance(err, (TypeError, ValueError)) and _names_an_argument(str(err), params, names):
                    raise
                kind = next(k for k in _READ_ERRORS if isinstance(err, k))
                text = _describe(err.args[0] if isinstance(err, KeyError) and err.args else str(err))
                raise ValueError(f"{label} is not the result {fn.__name__} reads: it "
                                 + _READ_ERRORS[kind].format(err=text)) from err
            if not _result_is_finite(out):
                raise ValueError(f"{label} give {fn.__name__} a result that is not finite (NaN or infinity): "
                                 "a reference measurement of (nearly) zero?")
            return out
        return checked
    return wrap
