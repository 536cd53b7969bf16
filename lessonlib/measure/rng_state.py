"""Every RNG state a training step draws from, captured and restored exactly.

A resumed job draws the same dropout masks, noise and shuffles as one that
never stopped only if every generator is put back: torch's (and CUDA's),
numpy's legacy global generator and Python's ``random``. The states are kept
as tensors and plain types, so a checkpoint holding them still loads with
``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import math
import random

from .run_folder import CheckpointError


def capture_rng_state() -> dict:
    """Every RNG state a training step may draw from, as tensors and plain types.

    ``torch`` (CPU generator, a ``uint8`` tensor), ``cuda`` (one per GPU, when
    present), ``numpy`` (the legacy global generator's Mersenne-Twister key as
    an ``int64`` tensor plus its position) and ``python`` (``random``'s state
    as an ``int64`` tensor). numpy's own state object holds an ``ndarray``,
    which ``torch.load(weights_only=True)`` refuses, hence the tensors.
    """
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, py_state, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": version, "state": torch.tensor(py_state, dtype=torch.int64),
                   "gauss_next": gauss_next},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


#: numpy's legacy generator: a Mersenne Twister of 624 32-bit words; Python's ``random`` keeps the same 624
#: words plus the position (0 to 624) as a 625th entry, under state version 3.
MT_WORDS = 624
PYTHON_RNG_VERSION = 3


def _words(where: str, keys, n: int):
    """A 1-D integer tensor of ``n`` values, the first ``MT_WORDS`` of them 32-bit words."""
    import torch

    if not isinstance(keys, torch.Tensor) or keys.dtype.is_floating_point or keys.dtype.is_complex \
            or keys.dtype == torch.bool or tuple(keys.shape) != (n,):
        got = f"a {keys.dtype} tensor of shape {tuple(keys.shape)}" if isinstance(keys, torch.Tensor) \
            else type(keys).__name__
        raise CheckpointError(f"the RNG state's {where} must be an integer tensor of shape ({n},), got {got}")
    words = keys[:MT_WORDS].to(torch.int64)
    if words.numel() and (words.min() < 0 or words.max() >= 2**32):
        raise CheckpointError(f"the RNG state's {where} holds values outside 0 to 2**32 - 1: not "
                              f"Mersenne-Twister words")


def _finite(value) -> bool:
    """A finite real number, not a bool (an int beyond a float's range counts as infinite)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # math.isfinite(10**400) converts to a float first
        return False


def _position(where: str, pos) -> None:
    if isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos <= MT_WORDS:
        raise CheckpointError(f"the RNG state's {where} = {pos!r} is impossible: it must be a whole number "
                              f"from 0 to {MT_WORDS}")


def _byte_state(where: str, value, size: int | None) -> None:
    import torch

    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.dim() != 1 \
            or (size is not None and value.numel() != size):
        got = type(value).__name__ if not isinstance(value, torch.Tensor) else \
            f"a {value.dtype} tensor of shape {tuple(value.shape)}"
        raise CheckpointError(f"the RNG state's {where} must be a 1-D uint8 tensor"
                              f"{'' if size is None else f' of {size} bytes (this torch build)'}, got {got}")


def check_rng_state(state) -> dict:
    """Raise :class:`CheckpointError` unless ``state`` is a possible :func:`capture_rng_state` result.

    Checked before anything is restored, so a malformed state never leaves
    some generators restored and others not: ``torch`` a 1-D ``uint8`` tensor
    of the size this build's CPU generator uses (``cuda`` likewise, one per
    GPU at most); ``numpy`` the ``MT19937`` kind, 624 32-bit words, ``pos``
    from 0 to 624, ``has_gauss`` 0 or 1 and a finite ``cached_gaussian``;
    ``python`` version 3, 624 words plus a position from 0 to 624, and
    ``gauss_next`` None or finite. The message names the entry, e.g.
    ``numpy.has_gauss``.
    """
    import torch

    if not isinstance(state, dict):
        raise CheckpointError(f"the RNG state must be a dict, got {type(state).__name__}")
    for key in ("torch", "numpy", "python"):
        if key not in state:
            raise CheckpointError(f"the RNG state has no {key!r} generator: it cannot resume exactly")
    _byte_state("torch", state["torch"], torch.get_rng_state().numel())
    if "cuda" in state:
        cuda = state["cuda"]
        live = torch.cuda.is_available()
        if not isinstance(cuda, (list, tuple)) or (live and len(cuda) > torch.cuda.device_count()):
            raise CheckpointError(f"the RNG state's cuda entry must be a list of generator states, one a GPU"
                                  f"{f' (at most {torch.cuda.device_count()} here)' if live else ''}")
        for i, c in enumerate(cuda):
            _byte_state(f"cuda[{i}]", c, torch.cuda.get_rng_state(i).numel() if live else None)
    n, p = state["numpy"], state["python"]
    want = {"kind", "keys", "pos", "has_gauss", "cached_gaussian"}
    if not isinstance(n, dict) or set(n) != want:
        raise CheckpointError(f"the RNG state's 'numpy' entry must hold exactly {sorted(want)}, got "
                              f"{sorted(n) if isinstance(n, dict) else type(n).__name__}")
    if not isinstance(n["kind"], str) or n["kind"] != "MT19937":
        raise CheckpointError(f"the RNG state's numpy.kind = {n['kind']!r} is impossible: numpy's legacy "
                              f"generator is 'MT19937'")
    _words("numpy.keys", n["keys"], MT_WORDS)
    _position("numpy.pos", n["pos"])
    if isinstance(n["has_gauss"], bool) or not isinstance(n["has_gauss"], int) or n["has_gauss"] not in (0, 1):
        raise CheckpointError(f"the RNG state's numpy.has_gauss = {n['has_gauss']!r} is impossible: it must be 0 or 1")
    g = n["cached_gaussian"]
    if not _finite(g):
        raise CheckpointError(f"the RNG state's numpy.cached_gaussian = {g!r} is impossible: it must be a "
                              f"finite number")
    want = {"version", "state", "gauss_next"}
    if not isinstance(p, dict) or set(p) != want:
        raise CheckpointError(f"the RNG state's 'python' entry must hold exactly {sorted(want)}, got "
                              f"{sorted(p) if isinstance(p, dict) else type(p).__name__}")
    if isinstance(p["version"], bool) or not isinstance(p["version"], int) or p["version"] != PYTHON_RNG_VERSION:
        raise CheckpointError(f"the RNG state's python.version = {p['version']!r} is impossible: "
                              f"random.setstate reads version {PYTHON_RNG_VERSION}")
    _words("python.state", p["state"], MT_WORDS + 1)
    _position("python.state[624]", int(p["state"][MT_WORDS]))
    g = p["gauss_next"]
    if g is not None and not _finite(g):
        raise CheckpointError(f"the RNG state's python.gauss_next = {g!r} is impossible: it must be None or "
                              f"a finite number")
    return state


def restore_rng_state(state: dict) -> None:
    """Put back what :func:`capture_rng_state` captured (checked first by :func:`check_rng_state`)."""
    import numpy as np
    import torch

    check_rng_state(state)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["state"].tolist()), p["gauss_next"]))
