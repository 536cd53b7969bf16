"""Saving training state safely: what a resumable checkpoint holds and how it is written.

``os.replace`` alone makes a save all-or-nothing. A real recovery checkpoint
needs four more things, and this module gives each one:

* **integrity** -- :func:`atomic_save` writes a SHA-256 checksum of every
  top-level entry (``model``, ``optimizer``, ``step``, ...) and
  :func:`load_checkpoint` verifies them, so a flipped bit or a cut-off file is
  refused with a message that names the file and the entry;
* **retention** -- :func:`save_checkpoint` keeps the last ``keep`` complete
  checkpoints (``checkpoint-00000025.pt``, ...), and :func:`load_latest`
  falls back to the newest one that verifies, saying which files it skipped and why;
* **validation** -- :func:`load_latest` takes a ``validate`` function that
  refuses impossible values (a negative step, a missing RNG state);
* **durability** -- the file is ``fsync``-ed before the rename and its folder
  after it; stray ``*.tmp`` files left by a killed save are removed by the
  next save or resume (:func:`remove_stray_temporaries`).

Loading is always ``torch.load(weights_only=True)``: a checkpoint is a pickle,
and an arbitrary pickle can run code when loaded.

The file format: one line ``LESSONLIB-CHECKPOINT/1 <sha256 of line 2>``, one
line of JSON listing each entry's name, size in bytes and SHA-256, then each
entry as ``torch.save`` wrote it.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import random
import re
import tempfile
import time
from pathlib import Path

from ..checks import amount, count, instance, path as check_path


MAGIC = b"LESSONLIB-CHECKPOINT/1"
#: Name of a checkpoint file in a run folder, from its step.
CHECKPOINT_PATTERN = "checkpoint-{step:08d}.pt"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d{8})\.pt$")
#: How many complete checkpoints :func:`save_checkpoint` keeps by default.
KEEP = 3
#: The longest :func:`atomic_save` may be slowed down for a demonstration (seconds).
MAX_SLOW_WRITE_SECONDS = 60.0


class CheckpointError(ValueError):
    """A checkpoint that is damaged or holds impossible values. The message names the file and what is wrong."""


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


def _serialise(obj: dict) -> bytes:
    """The file's bytes: the checked header, then each entry as ``torch.save`` writes it."""
    import torch

    parts, blobs = [], []
    for name, value in obj.items():
        buf = io.BytesIO()
        torch.save(value, buf)
        blob = buf.getvalue()
        parts.append([name, len(blob), hashlib.sha256(blob).hexdigest()])
        blobs.append(blob)
    header = json.dumps({"parts": parts}).encode()
    first = MAGIC + b" " + hashlib.sha256(header).hexdigest().encode()
    return b"\n".join([first, header, b""]) + b"".join(blobs)


def _deserialise(data: bytes, name: str, map_location) -> dict:
    """Verify every checksum, then load each entry with ``weights_only=True``."""
    import torch

    first, _, rest = data.partition(b"\n")
    header, _, body = rest.partition(b"\n")
    if not first.startswith(MAGIC + b" "):
        raise CheckpointError(f"{name}: not a checksummed checkpoint (the first line is damaged, "
                              f"or the file was not written by atomic_save)")
    if hashlib.sha256(header).hexdigest().encode() != first[len(MAGIC) + 1:]:
        raise CheckpointError(f"{name}: the header fails its checksum (damaged, or the file is cut short "
                              f"at byte {len(data)})")
    parts = json.loads(header)["parts"]
    expected = sum(size for _, size, _ in parts)
    if len(body) != expected:
        raise CheckpointError(f"{name}: holds {len(body):,} bytes of content but its header lists {expected:,}: "
                              f"the file is {'truncated' if len(body) < expected else 'longer than written'}")
    state, offset = {}, 0
    for key, size, digest in parts:
        blob = body[offset:offset + size]
        offset += size
        if hashlib.sha256(blob).hexdigest() != digest:
            raise CheckpointError(f"{name}: the {key!r} entry fails its SHA-256 checksum "
                                  f"(a flipped bit or damaged storage); refusing to load it")
        # weights_only=True: only tensors, numbers, strings and containers; a pickle that
        # names any other callable is refused (pickle.UnpicklingError) instead of run.
        state[key] = torch.load(io.BytesIO(blob), map_location=map_location, weights_only=True)
    return state


def atomic_save(obj: dict, path, slow_write_seconds: float = 0.0, on_progress=None) -> Path:
    """Save the dict ``obj`` with its checksums so that ``path`` is always complete.

    The bytes go to a temporary file in the same folder; it is flushed and
    ``os.fsync``-ed (the data is on disk, not only in the page cache), then
    ``os.replace`` renames it over ``path`` in one step, and the folder is
    synced so the rename itself survives a power cut. A crash at any moment
    leaves either the previous complete file or the new one, never half of
    one (at worst a stray ``*.tmp`` file, removed by :func:`remove_stray_temporaries`).

    ``obj`` is a dict with string keys (the checksums are per entry).
    ``slow_write_seconds`` (0 to 60) spreads the writing over that many
    seconds, in 20 chunks (for demonstrations: it gives a kill time to land in
    the middle of a save). ``on_progress(written, total)`` is called after each
    chunk reaches the temporary file, with bytes written so far. Returns the path.
    """
    instance("obj", obj, dict, "a dict of named entries")
    for key in obj:
        instance("obj's keys", key, str, "strings")
    path = check_path("path", path)
    slow_write_seconds = amount("slow_write_seconds", slow_write_seconds)
    if slow_write_seconds > MAX_SLOW_WRITE_SECONDS:
        raise ValueError(f"slow_write_seconds must be at most {MAX_SLOW_WRITE_SECONDS:g}, got {slow_write_seconds!r}")
    if on_progress is not None and not callable(on_progress):
        raise TypeError(f"on_progress must be callable or None, got {on_progress!r}")
    if not path.parent.is_dir():
        raise ValueError(f"path's folder {str(path.parent)!r} does not exist")
    data = _serialise(obj)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            chunks = 20 if slow_write_seconds > 0 else 1
            step = max(1, math.ceil(len(data) / chunks))
            for i in range(0, len(data), step):
                f.write(data[i:i + step])
                if slow_write_seconds > 0:
                    f.flush()
                if on_progress is not None:
                    on_progress(min(i + step, len(data)), len(data))
                if slow_write_seconds > 0:
                    time.sleep(slow_write_seconds / chunks)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_folder(path.parent)  # and the rename itself is on disk
    return path


def _fsync_folder(folder: Path) -> None:
    if hasattr(os, "O_DIRECTORY"):  # POSIX only; Windows has no folder fsync
        dfd = os.open(folder, os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def load_checkpoint(path, map_location="cpu") -> dict:
    """Load and verify one checkpoint file, with ``torch.load(weights_only=True)``.

    Raises :class:`CheckpointError` (a ``ValueError``) naming the file and the
    damaged entry when a checksum fails or the file is cut short.
    ``weights_only=True`` unpickles only tensors, containers and plain types:
    a checkpoint is a pickle, and a crafted pickle runs code when loaded
    (such a file is refused with ``pickle.UnpicklingError``).
    ``path`` may also be a run folder: then the newest checkpoint that
    verifies is loaded (:func:`load_latest`).
    """
    path = check_path("path", path)
    _check_map_location(map_location)
    if not path.exists():
        raise ValueError(f"path {str(path)!r} does not exist")
    if path.is_dir():
        found = load_latest(path, map_location=map_location)
        if found is None:
            raise ValueError(f"path {str(path)!r} is a folder with no checkpoint in it")
        return found[0]
    return _deserialise(path.read_bytes(), path.name, map_location)


def _check_map_location(map_location) -> None:
    import torch

    if not isinstance(map_location, (str, torch.device)):
        raise TypeError(f"map_location must be a device name such as 'cpu' or a torch.device, got {map_location!r:.80}")
    if isinstance(map_location, str):
        try:
            torch.device(map_location)
        except RuntimeError:
            raise ValueError(f"map_location must be a device name such as 'cpu', got {map_location!r:.80}") from None


def checkpoint_files(run_dir) -> list[tuple[int, Path]]:
    """The checkpoint files of a run folder as ``(step, path)``, oldest first."""
    run_dir = check_path("run_dir", run_dir)
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if (m := _CHECKPOINT_RE.match(p.name))]
    return sorted(found)


def newest_checkpoint(run_dir) -> Path | None:
    """The newest checkpoint file of a run folder by step (not verified), or None."""
    files = checkpoint_files(run_dir)
    return files[-1][1] if files else None


def remove_stray_temporaries(run_dir) -> list[str]:
    """Delete the ``*.tmp`` files that killed saves left in ``run_dir``; return their names.

    Call it only when no save is running in that folder (a training job
    calls it at start-up and before each save, and it is the only writer).
    """
    run_dir = check_path("run_dir", run_dir)
    removed = []
    for p in sorted(run_dir.glob("*.tmp")) if run_dir.is_dir() else []:
        try:
            p.unlink()
            removed.append(p.name)
        except FileNotFoundError:
            pass
    return removed


def save_checkpoint(state: dict, run_dir, step, keep=KEEP, slow_write_seconds: float = 0.0,
                    on_progress=None) -> Path:
    """Save ``state`` as ``run_dir/checkpoint-<step>.pt`` atomically, and keep the newest ``keep``.

    Stray temporary files are removed first; after the new file is complete,
    checkpoints beyond the newest ``keep`` (by step) are deleted, so a damaged
    newest file always leaves ``keep - 1`` older ones to fall back to.
    """
    instance("state", state, dict, "a dict of named entries")
    step = count("step", step, minimum=0)
    keep = count("keep", keep, maximum=1000)
    run_dir = check_path("run_dir", run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    remove_stray_temporaries(run_dir)
    path = atomic_save(state, run_dir / CHECKPOINT_PATTERN.format(step=step), slow_write_seconds, on_progress)
    old = checkpoint_files(run_dir)[:-keep]
    for _, p in old:
        p.unlink()
    if old:
        _fsync_folder(run_dir)
    return path


def load_latest(run_dir, validate=None, map_location="cpu", report=None):
    """The newest checkpoint of ``run_dir`` that verifies, falling back to older ones.

    Each file, newest first, is loaded with :func:`load_checkpoint`
    (checksums, ``weights_only=True``) and then given to ``validate(state)``,
    which should raise :class:`CheckpointError` (or ``ValueError``) for
    impossible values. A file that fails is skipped and
    ``report(f"skipped {name}: {reason}")`` is called (``report`` defaults to
    doing nothing). It only reads: a job that resumes removes stray ``*.tmp``
    files itself (:func:`remove_stray_temporaries`).

    Returns ``(state, path, skipped)`` with ``skipped`` a list of
    ``(name, reason)``; None when the folder holds no checkpoint. Raises
    :class:`CheckpointError` listing every reason when none verifies (never
    a silent fresh start).
    """
    import pickle

    _check_map_location(map_location)
    if validate is not None and not callable(validate):
        raise TypeError(f"validate must be callable or None, got {validate!r}")
    if report is not None and not callable(report):
        raise TypeError(f"report must be callable or None, got {report!r}")
    files = checkpoint_files(run_dir)
    skipped = []
    for _, path in reversed(files):
        try:
            state = load_checkpoint(path, map_location=map_location)
            if validate is not None:
                validate(state)
        except (ValueError, pickle.UnpicklingError, RuntimeError, EOFError, KeyError, TypeError) as err:
            reason = str(err).removeprefix(path.name + ": ")
            skipped.append((path.name, reason))
            if report is not None:
                report(f"skipped {path.name}: {reason}")
            continue
        return state, path, skipped
    if skipped:
        lines = "\n".join(f"  {n}: {r}" for n, r in skipped)
        raise CheckpointError(f"no checkpoint in {str(run_dir)!r} verifies:\n{lines}")
    return None
