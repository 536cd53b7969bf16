"""Every RNG state a training step draws from, captured and restored exactly.

A resumed job draws the same dropout masks, noise and shuffles as one that
never stopped only if every generator is put back: torch's (and CUDA's),
numpy's legacy global generator and Python's ``random``. The states are kept
as tensors and plain types, so a checkpoint holding them still loads with
``torch.load(weights_only=True)``.
"""
from __future__ import annotations

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


def check_rng_state(state) -> dict:
    """Raise :class:`CheckpointError` unless ``state`` looks like :func:`capture_rng_state`'s result."""
    import torch

    if not isinstance(state, dict):
        raise CheckpointError(f"the RNG state must be a dict, got {type(state).__name__}")
    for key in ("torch", "numpy", "python"):
        if key not in state:
            raise CheckpointError(f"the RNG state has no {key!r} generator: it cannot resume exactly")
    if not isinstance(state["torch"], torch.Tensor) or state["torch"].dtype != torch.uint8:
        raise CheckpointError("the RNG state's 'torch' entry is not a uint8 tensor")
    n, p = state["numpy"], state["python"]
    if not isinstance(n, dict) or not {"kind", "keys", "pos", "has_gauss", "cached_gaussian"} <= set(n) \
            or not isinstance(n["keys"], torch.Tensor) or n["keys"].numel() != 624 or not 0 <= n["pos"] <= 624:
        raise CheckpointError("the RNG state's 'numpy' entry is incomplete or out of range")
    if not isinstance(p, dict) or not {"version", "state", "gauss_next"} <= set(p) \
            or not isinstance(p["state"], torch.Tensor) or p["state"].numel() != 625:
        raise CheckpointError("the RNG state's 'python' entry is incomplete")
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
