"""The part of grading that a student notebook imports: shape checks and hand-in.

A check cell in an exercise first *hands in* its answers::

    hand_in("1a-q1", forward_flops=forward_flops)
    require_number("forward_flops", forward_flops, low=1e5, high=1e9, unit="FLOPs")

:func:`hand_in` turns the answers into plain data (numbers, strings, lists,
dicts, sets; nothing that can run code), records them in :data:`log` and
prints a one-line confirmation. The autograder empties the log just before it
runs a check cell and reads it just after, through its own request to the
kernel (:data:`TAKE`, a ``user_expressions`` entry of an execute request:
the reply comes on the kernel's shell channel, so a flood of output cannot
drown it). It checks the data in another process, with expected values that
instructor code computes there; nothing the student's kernel defines or
patches can reach that process. The visible checks
(:func:`require_number`, :func:`check_one_of`) only give early feedback on
the *shape* of an answer (a number, in range, one of the options); they
decide no grade.

Pure Python, no torch, nothing imported from the rest of lessonlib.
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

#: Environment variable naming the folder for hand-in files (the grader sets it in its sandbox).
HANDIN_ENV = "LESSONLIB_HANDIN"
#: Largest hand-in, in bytes of JSON: answers are numbers and short texts, not data sets.
MAX_HANDIN_BYTES = 64 * 1024
_MAX_DEPTH, _MAX_ITEMS, _MAX_TEXT = 6, 2000, 20_000
_GRADE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

#: The last hand-in of each question in this process: ``grade_id -> JSON-ready payload``.
#: Read by :func:`lessonlib.grading.graders.grader` when an instructor notebook checks itself.
handed: dict[str, dict] = {}
#: Hand-ins since the grader last emptied the log (at most :data:`MAX_LOG`).
log: list[dict] = []
MAX_LOG = 20
#: The expression the autograder evaluates in the kernel: the log as JSON, then emptied.
TAKE = "__import__('lessonlib.grading.answers', fromlist=['take']).take()"
#: Hand-in folders made in this process: ``grade_id -> Path``.
folders: dict[str, Path] = {}


# --------------------------------------------------------------------------
# Shape checks: early feedback in the student's notebook
# --------------------------------------------------------------------------

def _is_number(value) -> bool:
    if isinstance(value, (bool, str, bytes)):  # "2.5" is a text, not a number
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError, OverflowError):
        return False


def require_number(name: str, value, *, low: float | None = None, high: float | None = None,
                   unit: str = "", hint: str = "") -> float:
    """Assert that ``value`` is a finite number (optionally in ``[low, high]``); return it as a float.

    The visible part of a check: it fails on an empty answer (``None``, ``""``,
    ``...``) and on answers off by orders of magnitude, and says why.
    """
    if value is None or value is Ellipsis or (isinstance(value, str) and not value.strip()):
        raise AssertionError(f"{name} is empty: replace the stub with your answer.")
    if not _is_number(value):
        raise AssertionError(f"{name} should be a number{f' in {unit}' if unit else ''}, "
                             f"got {type(value).__name__} {str(value)[:60]!r}.")
    x = float(value)
    if (low is not None and x < low) or (high is not None and x > high):
        if low is not None and high is not None:
            rng = f"between {low:g} and {high:g}"
        else:
            rng = f"at least {low:g}" if low is not None else f"at most {high:g}"
        rng += f" {unit}" if unit else ""
        raise AssertionError(f"{name} = {x:g} is outside the plausible range ({rng}). {hint}".strip())
    return x


def check_one_of(name: str, value, options: Sequence[str]) -> str:
    """Assert ``value`` is one of the strings ``options`` (case-insensitive); return it lower-cased."""
    if not isinstance(value, str) or value.strip().lower() not in [o.lower() for o in options]:
        raise AssertionError(f"{name} should be one of {list(options)}, got {str(value)[:60]!r}.")
    return value.strip().lower()


# --------------------------------------------------------------------------
# Plain data: the only thing that leaves the student's kernel
# --------------------------------------------------------------------------

def to_plain(value, name: str = "answer", _depth: int = 0):
    """``value`` as JSON-ready plain data, or ``TypeError`` naming ``name``.

    Numbers (Python and numpy), arrays and tensors (as lists), dataclass
    instances (as dicts of their fields), strings, ``None``, lists and
    tuples (as lists), sets (``{"$set": [...]}``) and dicts with number or
    string keys (``{"$dict": [[key, value], ...]}``, so that ``{64: ...}``
    keeps its integer keys). Non-finite floats become ``{"$float": "nan"}``.
    """
    if _depth > _MAX_DEPTH:
        raise TypeError(f"{name}: nested too deeply to hand in")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        if len(value) > _MAX_TEXT:
            raise TypeError(f"{name}: a text of {len(value)} characters is too long to hand in")
        return value
    if isinstance(value, numbers.Integral):
        v = int(value)
        if abs(v) > 10 ** 30:
            raise TypeError(f"{name}: {type(value).__name__} too large to hand in")
        return v
    if isinstance(value, numbers.Real):
        v = float(value)
        return v if math.isfinite(v) else {"$float": repr(v)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a result object: its fields
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        if len(value) > _MAX_ITEMS:
            raise TypeError(f"{name}: {len(value)} items are too many to hand in")
        if isinstance(value, dict):
            pairs = []
            for k, v in value.items():
                if not (k is None or isinstance(k, (str, bool, numbers.Real))):
                    raise TypeError(f"{name}: dict keys must be numbers or strings, got {type(k).__name__}")
                pairs.append([to_plain(k, name, _depth + 1), to_plain(v, f"{name}[{k!r}]", _depth + 1)])
            return {"$dict": pairs}
        items = [to_plain(v, f"{name}[{i}]", _depth + 1) for i, v in enumerate(value)]
        if isinstance(value, (set, frozenset)):
            return {"$set": sorted(items, key=lambda v: json.dumps(v, sort_keys=True))}
        return items
    tolist = getattr(value, "tolist", None)  # numpy arrays and scalars, torch tensors
    if callable(tolist):
        try:
            plain = tolist()
        except Exception:  # noqa: BLE001 - not convertible: say so below
            plain = value
        if plain is not value:
            return to_plain(plain, name, _depth + 1)
    raise TypeError(f"{name}: hand in plain data (a number, a string, a list or a dict), "
                    f"got {type(value).__name__}")


def hand_in(grade_id: str, **answers) -> None:
    """Hand in the answers to question ``grade_id`` for grading, as plain data.

    Records them in :data:`log` and prints a one-line confirmation. The
    autograder empties the log just before a check cell runs and reads it just
    after, so a hand-in from another cell changes nothing.
    """
    if not isinstance(grade_id, str) or not _GRADE_ID.match(grade_id):
        raise ValueError(f"grade_id must be a short id such as '1a-q1', got {grade_id!r}")
    if not answers:
        raise ValueError("hand_in needs at least one answer, e.g. hand_in('1a-q1', x=x)")
    payload = {"question": grade_id, "answers": {k: to_plain(v, k) for k, v in answers.items()}}
    text = json.dumps(payload, allow_nan=False, sort_keys=True)
    if len(text.encode()) > MAX_HANDIN_BYTES:
        raise TypeError(f"the answers to {grade_id} are too large to hand in "
                        f"({len(text.encode()):,} bytes; at most {MAX_HANDIN_BYTES:,})")
    handed[grade_id] = json.loads(text)
    if len(log) < MAX_LOG:
        log.append(handed[grade_id])
    print(f"{grade_id}: handed in {', '.join(answers)}")


def take() -> str:
    """The hand-ins since the last call, as a JSON list; empties the log (the grader calls this)."""
    text = json.dumps(log)
    log.clear()
    return text


def hand_in_folder(grade_id: str) -> Path:
    """An empty folder for files that question ``grade_id`` hands in (a saved checkpoint, say).

    Under the autograder it lies in the submission's scratch folder, where
    the grader reads it after the notebook has run; elsewhere it is a
    temporary folder. Any earlier content is removed.
    """
    if not isinstance(grade_id, str) or not _GRADE_ID.match(grade_id):
        raise ValueError(f"grade_id must be a short id such as '2c-q1', got {grade_id!r}")
    root = os.environ.get(HANDIN_ENV) or _own_root()
    folder = Path(root) / grade_id
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
    elif folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    folders[grade_id] = folder
    return folder


def _own_root() -> str:
    return os.path.join(tempfile.gettempdir(), f"lessonlib-handin-{os.getpid()}")


def remove_handin_folders() -> None:
    """Remove the hand-in folders this process made outside the autograder (a notebook's last cell calls it).

    Under the autograder (``LESSONLIB_HANDIN`` set) it does nothing: the
    grader reads those folders after the notebook has run, and removes them.
    A kernel that is killed runs no exit handler, so a notebook cleans up
    explicitly.
    """
    if os.environ.get(HANDIN_ENV):
        return
    shutil.rmtree(_own_root(), ignore_errors=True)
    folders.clear()
