"""The checkpoint file format: a checked header, then each entry as ``torch.save`` wrote it.

One line ``LESSONLIB-CHECKPOINT/1 <sha256 of line 2>``; one line of JSON:
``parts`` (each entry's name, size in bytes and SHA-256), and ``step`` and
``run`` (a :class:`~lessonlib.measure.run_folder.RunIdentity`) when the file
was saved with them; then the entries. With a step or a run, each entry's
SHA-256 also covers them and the entry's name, so an entry moved from another
checkpoint fails its checksum. Reading checks, in order: the header's
checksum, the file's place (its step against its name, its run against the
one expected), the length, each entry's checksum, then loads each entry with
``torch.load(weights_only=True)`` and compares a ``step`` entry with the
header's. A run folder's checkpoint files are named by their step
(:data:`CHECKPOINT_PATTERN`; :func:`checkpoint_files`). Writing and loading
files is :mod:`lessonlib.measure.checkpoint`.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
from pathlib import Path

from ..checks import count as check_count, instance as check_instance, mapping as check_mapping, \
    path as check_path, record as check_record
from .run_folder import CheckpointError, CheckpointPathError, RunIdentity, RunMismatchError, run_folder

MAGIC = b"LESSONLIB-CHECKPOINT/1"
#: Name of a checkpoint file in a run folder, from its step.
CHECKPOINT_PATTERN = "checkpoint-{step:08d}.pt"
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d{8,})\.pt$")
#: The longest header line read (bytes): thousands of entries' names and checksums.
MAX_HEADER_BYTES = 1 << 20


def _digest(blob: bytes, name: str, run_id, step) -> str:
    """An entry's SHA-256; with a run or a step, over them and the entry's name too, so that an entry
    moved from another checkpoint (another run, another step) fails its checksum here."""
    if run_id is None and step is None:
        return hashlib.sha256(blob).hexdigest()
    h = hashlib.sha256(json.dumps([run_id, step, name]).encode() + b"\n")
    h.update(blob)
    return h.hexdigest()


def encode_checkpoint(obj: dict, run: RunIdentity | None, step: int | None) -> bytes:
    """The bytes of a checkpoint of ``obj`` (entries by name) at ``step`` of ``run``: the checked header, then
    each entry as ``torch.save`` writes it."""
    import torch

    check_mapping("obj", obj, allow_empty=True)
    if run is not None:
        check_instance("run", run, RunIdentity, "a RunIdentity or None")
    if step is not None:
        step = check_count("step", step, minimum=0)

    run_id = None if run is None else run.run_id
    parts, blobs = [], []
    for name, value in obj.items():
        buf = io.BytesIO()
        torch.save(value, buf)
        blob = buf.getvalue()
        parts.append([name, len(blob), _digest(blob, name, run_id, step)])
        blobs.append(blob)
    meta = {"parts": parts}
    if step is not None:
        meta["step"] = step
    if run is not None:
        meta["run"] = run.to_json()
    header = json.dumps(meta).encode()
    first = MAGIC + b" " + hashlib.sha256(header).hexdigest().encode()
    return b"\n".join([first, header, b""]) + b"".join(blobs)


def _parse_header(first: bytes, header: bytes, name: str, size: int) -> dict:
    """Check the first two lines; return ``{"parts", "step", "run"}`` (step and run None when absent)."""
    if not first.startswith(MAGIC + b" "):
        raise CheckpointError(f"{name}: not a checksummed checkpoint (the first line is damaged, "
                              f"or the file was not written by atomic_save)")
    if hashlib.sha256(header).hexdigest().encode() != first[len(MAGIC) + 1:]:
        raise CheckpointError(f"{name}: the header fails its checksum (damaged, or the file is cut short "
                              f"at byte {size})")
    try:
        meta = json.loads(header)
    except ValueError as err:
        raise CheckpointError(f"{name}: the header is not JSON ({err}), though its checksum matches") from None
    parts = meta.get("parts") if isinstance(meta, dict) else None
    if not isinstance(parts, list) or not all(
            isinstance(p, list) and len(p) == 3 and isinstance(p[0], str) and isinstance(p[1], int)
            and not isinstance(p[1], bool) and p[1] >= 0 and isinstance(p[2], str) for p in parts):
        raise CheckpointError(f"{name}: the header has no valid 'parts' list (one [name, size in bytes, sha256] "
                              f"per entry), got {str(meta)[:120]}")
    step = meta.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise CheckpointError(f"{name}: the header's step {step!r:.40} is not a whole number >= 0")
    run = None if meta.get("run") is None else RunIdentity.from_json(meta["run"], name)
    return {"parts": parts, "step": step, "run": run}


def describe_header(info: dict) -> str:
    """Whose state a checkpoint's parsed header ``info`` (``{"step", "run"}``) says it holds, in words."""
    check_record("info", info, ("step", "run"), "a checkpoint's parsed header")
    if info["run"] is not None:
        check_instance("info['run']", info["run"], RunIdentity, "a RunIdentity or None")
    if info["step"] is not None:
        check_count("info['step']", info["step"], minimum=0)
    step = "an unknown step" if info["step"] is None else f"step {info['step']}"
    return f"{step} of {'an unnamed run' if info['run'] is None else info['run'].describe()}"


def _check_place(info: dict, path: Path, expect: RunIdentity | None) -> None:
    """Refuse a file whose header disagrees with its name, or that is not ``expect``'s."""
    m = CHECKPOINT_RE.match(path.name)
    if m and info["step"] is not None and info["step"] != int(m.group(1)):
        raise CheckpointError(f"{path.name}: holds {describe_header(info)}, but its name says step {int(m.group(1))} "
                              f"(renamed or copied in: {str(path)!r}); refusing it")
    if expect is not None and info["run"] != expect:
        raise RunMismatchError(f"{path.name}: holds {describe_header(info)} ({str(path)!r}), not a checkpoint of this "
                               f"{expect.describe()}; refusing it")


def read_header(path) -> dict:
    """What a checkpoint file says it is, without loading it: ``{"step", "run", "parts"}``.

    ``step`` (an int) and ``run`` (a :class:`RunIdentity`) are None in a file
    saved without them; ``parts`` lists ``[name, bytes, sha256]`` per entry.
    Only the header's own checksum is verified (:func:`load_checkpoint` verifies the rest).
    """
    path = check_path("path", path)
    if path.is_dir():
        raise CheckpointPathError(f"path {str(path)!r} is a folder, but a checkpoint file was expected")
    try:
        with open(path, "rb") as f:
            first = f.readline(len(MAGIC) + 80).rstrip(b"\n")
            header = f.readline(MAX_HEADER_BYTES).rstrip(b"\n")
            size = f.seek(0, os.SEEK_END)
    except FileNotFoundError:
        raise ValueError(f"path {str(path)!r} does not exist") from None
    except OSError as err:
        raise CheckpointError(f"{path.name}: cannot be read ({err.strerror}): {str(path)!r}") from None
    return _parse_header(first, header, path.name, size)


def decode_checkpoint(data: bytes, path: Path, map_location, expect: RunIdentity | None) -> dict:
    """Verify the header, the file's place (name, run) and every checksum; then load each entry
    with ``weights_only=True`` and compare a ``step`` entry with the header's and the name's. ``data`` is the
    file's bytes, read from ``path``; ``expect`` the run it must belong to (None: any)."""
    import torch

    check_instance("data", data, bytes, "the file's bytes")
    path = check_path("path", path)
    if expect is not None:
        check_instance("expect", expect, RunIdentity, "a RunIdentity or None")

    name = path.name
    first, _, rest = data.partition(b"\n")
    header, _, body = rest.partition(b"\n")
    info = _parse_header(first, header, name, len(data))
    _check_place(info, path, expect)
    parts = info["parts"]
    expected = sum(size for _, size, _ in parts)
    if len(body) != expected:
        raise CheckpointError(f"{name}: holds {len(body):,} bytes of content but its header lists {expected:,}: "
                              f"the file is {'truncated' if len(body) < expected else 'longer than written'}")
    run_id = None if info["run"] is None else info["run"].run_id
    state, offset = {}, 0
    for key, size, digest in parts:
        blob = body[offset:offset + size]
        offset += size
        if _digest(blob, key, run_id, info["step"]) != digest:
            raise CheckpointError(f"{name}: the {key!r} entry fails its SHA-256 checksum (a flipped bit, damaged "
                                  f"storage, or an entry taken from another checkpoint); refusing to load it")
        # weights_only=True: only tensors, numbers, strings and containers; a pickle that
        # names any other callable is refused (pickle.UnpicklingError) instead of run.
        state[key] = torch.load(io.BytesIO(blob), map_location=map_location, weights_only=True)
    m = CHECKPOINT_RE.match(name)
    said = info["step"] if info["step"] is not None else (int(m.group(1)) if m else None)
    got = state.get("step")
    if said is not None and isinstance(got, int) and not isinstance(got, bool) and got != said:
        raise CheckpointError(f"{name}: holds step {got} in its 'step' entry, but its "
                              f"{'header and name say' if info['step'] is not None else 'name says'} step {said}; "
                              f"refusing it")
    return state


def named_like_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """Everything in ``folder`` named like a checkpoint (files or not), oldest step first: ``[(step, path)]``."""
    folder = check_path("folder", folder)
    if not folder.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := CHECKPOINT_RE.match(p.name)))


def checkpoint_files(run_dir) -> list[tuple[int, Path]]:
    """The checkpoint files of a run folder as ``(step in the name, path)``, oldest first (regular files only)."""
    return [(s, p) for s, p in named_like_checkpoints(run_folder(run_dir)) if p.is_file()]


def check_checkpoint_paths(run_dir) -> None:
    """Raise :class:`CheckpointPathError` if something named like a checkpoint in ``run_dir`` is not a file
    (a folder called ``checkpoint-00000010.pt`` would stop the save of step 10)."""
    wrong = [p for _, p in named_like_checkpoints(run_folder(run_dir)) if not p.is_file()]
    if wrong:
        raise CheckpointPathError(f"run_dir holds {', '.join(repr(str(p)) for p in wrong[:5])}: named like "
                                  f"checkpoint files, but not files; a checkpoint file belongs at that path. "
                                  f"Move {'it' if len(wrong) == 1 else 'them'} out of the run folder")


def newest_checkpoint(run_dir) -> Path | None:
    """The newest checkpoint file of a run folder by the step in its name (not verified), or None."""
    files = checkpoint_files(run_dir)
    return files[-1][1] if files else None


def hash_rate(blob: bytes, rounds: int = 3) -> float:
    """Bytes a second at which this machine computes the SHA-256 every checkpoint entry carries, on one
    core: the median of ``rounds`` timed passes over ``blob`` (bytes; some MB for a steady figure), timed
    with :func:`lessonlib.measure.rounds.time_rounds`. Hashing is part of a save's and a load's time."""
    from .rounds import time_rounds

    check_instance("blob", blob, bytes, "bytes")
    if not blob:
        raise ValueError("blob: no bytes to hash")
    rounds = check_count("rounds", rounds, maximum=100)
    timed = time_rounds(lambda clock: clock.time("sha256", hashlib.sha256, blob), rounds, device="cpu")
    return len(blob) / timed.median("sha256")
