"""Saving training state safely: what a resumable checkpoint holds and how it is written.

* :func:`capture_rng_state` / :func:`restore_rng_state`: the torch, CUDA,
  numpy and Python RNGs, as tensors so that ``torch.load(weights_only=True)``
  accepts them;
* :func:`atomic_save`: temporary file, ``fsync``, ``os.replace``, folder ``fsync``;
* :func:`load_checkpoint`: always ``weights_only=True`` (a checkpoint is a
  pickle, and an arbitrary pickle can run code when loaded).
"""
from __future__ import annotations

import math
import os
import random
import tempfile
import time
from pathlib import Path


CHECKPOINT_NAME = "checkpoint.pt"


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


def restore_rng_state(state: dict) -> None:
    """Put back what :func:`capture_rng_state` captured."""
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["state"].tolist()), p["gauss_next"]))


def atomic_save(obj, path, slow_write_seconds: float = 0.0) -> Path:
    """Save ``obj`` with ``torch.save`` so that ``path`` is always complete.

    The bytes go to a temporary file in the same folder; it is flushed and
    ``os.fsync``-ed (the data is on disk, not only in the page cache), then
    ``os.replace`` renames it over ``path`` in one step, and the folder is
    synced so the rename itself survives a power cut. A crash at any moment
    leaves either the previous complete file or the new one, never half of
    one (at worst a stray ``*.tmp`` file, which :func:`load_checkpoint` ignores).

    ``slow_write_seconds`` spreads the writing over that many seconds (for
    demonstrations: it gives a kill time to land in the middle of a save).
    Returns the path.
    """
    import io

    import torch

    path = Path(path)
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getbuffer()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            chunks = 20 if slow_write_seconds > 0 else 1
            step = math.ceil(len(data) / chunks)
            for i in range(0, len(data), step):
                f.write(data[i:i + step])
                if slow_write_seconds > 0:
                    f.flush()
                    time.sleep(slow_write_seconds / chunks)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    if hasattr(os, "O_DIRECTORY"):  # POSIX: make the rename durable too
        dfd = os.open(path.parent, os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return path


def load_checkpoint(path, map_location="cpu") -> dict:
    """Load a checkpoint with ``torch.load(weights_only=True)``.

    ``weights_only=True`` unpickles only tensors, containers and plain types:
    a checkpoint is a pickle, and a crafted pickle runs code when loaded.
    ``path`` may be a file or a run folder (then its ``checkpoint.pt``).
    """
    import torch

    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    return torch.load(path, map_location=map_location, weights_only=True)
