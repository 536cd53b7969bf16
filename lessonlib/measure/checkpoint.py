"""Saving training state safely: what a resumable checkpoint holds and how it is written.

``os.replace`` alone makes a save all-or-nothing. A real recovery checkpoint
needs more, and this module gives each part:

* **integrity** -- :func:`atomic_save` writes a SHA-256 checksum of every
  top-level entry (``model``, ``optimizer``, ``step``, ...) and
  :func:`load_checkpoint` verifies them, so a flipped bit or a cut-off file is
  refused with a message that names the file and the entry;
* **identity** -- a checkpoint records its step and its run
  (:class:`~lessonlib.measure.run_folder.RunIdentity`: run id, seed,
  configuration), and each entry's checksum covers both. Loading compares the
  step with the file's name and the run with the one expected (the folder's
  ``run.json`` by default), so a renamed file, a file copied in from another
  run, or one entry taken from another checkpoint is refused, saying whose
  checkpoint it is. (The checksums are not a signature: they catch mix-ups and
  damage, not someone who recomputes them on purpose.)
* **retention** -- :func:`save_checkpoint` keeps the last ``keep`` complete
  checkpoints (``checkpoint-00000025.pt``, ...), never the file it just wrote
  among those deleted, and :func:`load_latest` falls back to the newest one
  that verifies, saying which files it skipped and why;
* **validation** -- :func:`load_latest` takes a ``validate`` function that
  refuses impossible values (a negative step, a missing RNG state);
* **one writer** -- :func:`save_checkpoint` holds the folder's writer lock
  (:mod:`lessonlib.measure.run_folder`), and a fresh run does not write over
  another run's checkpoints unless told to (``replace=True``);
* **durability** -- the file is ``fsync``-ed before the rename and its folder
  after it; stray ``*.tmp`` files left by a killed save are removed by the
  next save or resume (:func:`remove_stray_temporaries`), never those of a
  save still in progress in another process.

Loading is always ``torch.load(weights_only=True)``: a checkpoint is a pickle,
and an arbitrary pickle can run code when loaded. A file error (a full disk, a
folder where a file belongs) raises one of :mod:`~lessonlib.measure.run_folder`'s
errors, naming the path and what was expected. The file format is
:mod:`lessonlib.measure.checkpoint_format`.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path

from ..checks import amount, count, flag, instance, path as check_path
from .checkpoint_format import (CHECKPOINT_PATTERN, CHECKPOINT_RE, MAGIC, decode_checkpoint, named_like_checkpoints,  # noqa: F401
                                encode_checkpoint, describe_header, check_checkpoint_paths, checkpoint_files,
                                newest_checkpoint, read_header)
from .rng_state import capture_rng_state, check_rng_state, restore_rng_state  # noqa: F401 (re-exported)
from .run_folder import (RUN_FILE, CheckpointError, CheckpointPathError, CheckpointWriteError,  # noqa: F401
                         FolderInUseError, RunIdentity, RunMismatchError, IN_PROGRESS, acquire_folder,
                         holds_folder, read_run, release_folder, run_folder, temporary_is_stray,
                         temporary_prefix, write_run)

#: How many complete checkpoints :func:`save_checkpoint` keeps by default.
KEEP = 3
#: The longest :func:`atomic_save` may be slowed down for a demonstration (seconds).
MAX_SLOW_WRITE_SECONDS = 60.0
#: What retention appends to the name of a file it does not count as this run's (it never deletes those).
SET_ASIDE = ".set-aside"


def atomic_save(obj: dict, path, slow_write_seconds: float = 0.0, on_progress=None,
                run: RunIdentity | None = None, step: int | None = None) -> Path:
    """Save the dict ``obj`` with its checksums so that ``path`` is always complete.

    The bytes go to a temporary file in the same folder (its name names this
    process: :func:`~lessonlib.measure.run_folder.temporary_prefix`); it is
    flushed and ``os.fsync``-ed (the data is on disk, not only in the page
    cache), then ``os.replace`` renames it over ``path`` in one step, and the
    folder is synced so the rename itself survives a power cut. A crash at any
    moment leaves either the previous complete file or the new one, never half
    of one (at worst a stray ``*.tmp`` file, removed by :func:`remove_stray_temporaries`).

    ``obj`` is a dict with string keys (the checksums are per entry).
    ``run`` (a :class:`RunIdentity`) and ``step`` (a whole number), when
    given, are recorded in the header and covered by every entry's checksum.
    ``slow_write_seconds`` (0 to 60) spreads the writing over that many
    seconds, in 20 chunks (for demonstrations: it gives a kill time to land in
    the middle of a save). ``on_progress(written, total)`` is called after each
    chunk reaches the temporary file, with bytes written so far. Returns the path.
    Raises :class:`CheckpointPathError` when ``path`` is a folder, and
    :class:`CheckpointWriteError` (an ``OSError`` with the system's ``errno``,
    naming the path) when writing fails, e.g. on a full disk; the file already
    at ``path``, if any, is then unchanged.
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
    if run is not None:
        instance("run", run, RunIdentity, "a RunIdentity or None")
    step = None if step is None else count("step", step, minimum=0)
    if not path.parent.is_dir():
        raise ValueError(f"path's folder {str(path.parent)!r} does not exist")
    if path.is_dir():
        raise CheckpointPathError(f"path {str(path)!r} is a folder, but atomic_save writes a file there: "
                                  f"pass a file's path (a run folder takes save_checkpoint)")
    data = encode_checkpoint(obj, run, step)
    what = "the checkpoint" if step is None else f"the checkpoint of step {step}"
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path.name), suffix=".tmp")
        IN_PROGRESS.add(tmp)
        with os.fdopen(fd, "wb") as f:
            chunks = 20 if slow_write_seconds > 0 else 1
            size = max(1, math.ceil(len(data) / chunks))
            for i in range(0, len(data), size):
                f.write(data[i:i + size])
                if slow_write_seconds > 0:
                    f.flush()
                if on_progress is not None:
                    on_progress(min(i + size, len(data)), len(data))
                if slow_write_seconds > 0:
                    time.sleep(slow_write_seconds / chunks)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
        _fsync_folder(path.parent)  # and the rename itself is on disk
    except OSError as err:
        _remove_file(tmp)
        raise CheckpointWriteError(err.errno, f"could not write {what} {str(path)!r} ({len(data):,} bytes): "
                                              f"{err.strerror or err}. The file already at that path, if any, is "
                                              f"unchanged; the partial temporary file was removed") from err
    except BaseException:
        _remove_file(tmp)
        raise
    finally:
        IN_PROGRESS.discard(tmp)
    return path


def _remove_file(tmp) -> None:
    if tmp is not None and os.path.exists(tmp):
        os.remove(tmp)


def _fsync_folder(folder: Path) -> None:
    if hasattr(os, "O_DIRECTORY"):  # POSIX only; Windows has no folder fsync
        dfd = os.open(folder, os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _load_file(path: Path, map_location, run: RunIdentity | None) -> dict:
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise CheckpointPathError(f"{path.name}: is a folder, not a checkpoint file ({str(path)!r})") from None
    except OSError as err:
        raise CheckpointError(f"{path.name}: cannot be read ({err.strerror}): {str(path)!r}") from None
    return decode_checkpoint(data, path, map_location, run)


def load_checkpoint(path, map_location="cpu", run: RunIdentity | None = None) -> dict:
    """Load and verify one checkpoint file, with ``torch.load(weights_only=True)``.

    Raises :class:`CheckpointError` (a ``ValueError``) naming the file and the
    damaged entry when a checksum fails or the file is cut short, and when the
    step it holds differs from its name's. With ``run``, a checkpoint of any
    other run is refused (:class:`RunMismatchError`, saying whose it is).
    ``weights_only=True`` unpickles only tensors, containers and plain types:
    a checkpoint is a pickle, and a crafted pickle runs code when loaded
    (such a file is refused with ``pickle.UnpicklingError``).
    ``path`` may also be a run folder: then the newest checkpoint that
    verifies is loaded (:func:`load_latest`, checked against the folder's run).
    """
    path = check_path("path", path)
    _check_map_location(map_location)
    if run is not None:
        instance("run", run, RunIdentity, "a RunIdentity or None")
    if not path.exists():
        raise ValueError(f"path {str(path)!r} does not exist")
    if path.is_dir():
        found = load_latest(path, map_location=map_location, run=run)
        if found is None:
            raise ValueError(f"path {str(path)!r} is a folder with no checkpoint in it")
        return found[0]
    if not path.is_file():
        raise CheckpointPathError(f"path {str(path)!r} is not a regular file, but a checkpoint file was expected")
    return _load_file(path, map_location, run)


def _check_map_location(map_location) -> None:
    import torch

    if not isinstance(map_location, (str, torch.device)):
        raise TypeError(f"map_location must be a device name such as 'cpu' or a torch.device, got {map_location!r:.80}")
    if isinstance(map_location, str):
        try:
            torch.device(map_location)
        except RuntimeError:
            raise ValueError(f"map_location must be a device name such as 'cpu', got {map_location!r:.80}") from None


def remove_stray_temporaries(run_dir) -> list[str]:
    """Delete the ``*.tmp`` files that killed saves left in ``run_dir``; return their names.

    Only a file whose writer is gone (its name names the process:
    :func:`~lessonlib.measure.run_folder.temporary_is_stray`) is deleted, so a
    save still in progress in another process, or in this one, is never touched.
    """
    folder = run_folder(run_dir)
    own = holds_folder(folder)
    removed = []
    for p in sorted(folder.glob("*.tmp")) if folder.is_dir() else []:
        if p.is_file() and temporary_is_stray(p, own_folder=own):
            try:
                p.unlink()
                removed.append(p.name)
            except FileNotFoundError:
                pass
    return removed


def claim_folder(run_dir, run: RunIdentity | None, replace: bool = False, report=None) -> None:
    """Make ``run_dir`` ``run``'s folder (``run.json``), refusing one that holds another run's checkpoints.

    Nothing changes when the folder is already ``run``'s (or, with ``run``
    None, has no ``run.json``). An empty folder is claimed. A folder that
    holds another run's checkpoints (or unnamed ones) raises
    :class:`RunMismatchError` saying whose they are, unless ``replace=True``:
    then its checkpoints and ``run.json`` are deleted first (``report`` is told).
    """
    folder = run_folder(run_dir, create=True)
    if run is not None:
        instance("run", run, RunIdentity, "a RunIdentity or None")
    replace = flag("replace", replace)
    if report is not None and not callable(report):
        raise TypeError(f"report must be callable or None, got {report!r:.80}")
    recorded = read_run(folder)
    if recorded == run:
        return
    others = [p for _, p in named_like_checkpoints(folder) if p.is_file()] + sorted(folder.glob("*" + SET_ASIDE))
    if recorded is None and not others:
        write_run(folder, run)
        return
    steps = [int(m.group(1)) for p in others if (m := CHECKPOINT_RE.match(p.name))]
    held = (f"{recorded.describe() if recorded else 'an unnamed run'}"
            + (f", checkpoints of steps {min(steps)} to {max(steps)}" if steps else ""))
    if not replace:
        raise RunMismatchError(
            f"run_dir {str(folder)!r} holds {held}, not {run.describe() if run else 'an unnamed run'}'s. "
            f"Resume that run, use another folder, or pass replace=True to delete its checkpoints first")
    for p in others:
        p.unlink()
    (folder / RUN_FILE).unlink(missing_ok=True)
    if run is not None:
        write_run(folder, run)
    if report is not None:
        report(f"replaced {held} in {folder.name}")


def save_checkpoint(state: dict, run_dir, step, keep=KEEP, slow_write_seconds: float = 0.0,
                    on_progress=None, run: RunIdentity | None = None, replace: bool = False, report=None) -> Path:
    """Save ``state`` as ``run_dir/checkpoint-<step>.pt`` atomically, and keep the newest ``keep``.

    The first save into a folder makes this process its one writer until it
    ends or calls ``release_folder(run_dir)``: a second process is refused
    (:class:`FolderInUseError`, naming the holder). The folder must be
    ``run``'s (:func:`claim_folder`; ``replace``). Stray temporary files of dead
    writers are removed first; the file records ``run`` and ``step``. Then retention: this run's
    checkpoints older than ``step`` beyond the newest ``keep`` are deleted, so a
    damaged newest file always leaves ``keep - 1`` older ones to fall back to.
    The file just written is always kept (the newest counts from it). A
    checkpoint file retention cannot count as this run's -- misnamed, another
    run's, unreadable, or of a later step than ``step`` (the run went back to an
    earlier checkpoint) -- is renamed ``<name>.set-aside``, never deleted, and
    ``report(line)`` is told. Returns the path written.
    """
    instance("state", state, dict, "a dict of named entries")
    step = count("step", step, minimum=0)
    keep = count("keep", keep, maximum=1000)
    if run is not None:
        instance("run", run, RunIdentity, "a RunIdentity or None")
    replace = flag("replace", replace)
    if report is not None and not callable(report):
        raise TypeError(f"report must be callable or None, got {report!r:.80}")
    folder = run_folder(run_dir, create=True)
    target = folder / CHECKPOINT_PATTERN.format(step=step)
    if target.exists() and not target.is_file():
        raise CheckpointPathError(f"cannot save step {step}: {str(target)!r} is a folder (or not a regular file), "
                                  f"but this step's checkpoint file belongs at that path; move it away")
    first = not holds_folder(folder)
    if first:
        acquire_folder(folder, report)  # kept: this process is the folder's writer from now on
    try:
        claim_folder(folder, run, replace, report)
    except BaseException:
        if first:  # refused before writing anything: not this folder's writer after all
            release_folder(folder)
        raise
    remove_stray_temporaries(folder)
    path = atomic_save(state, target, slow_write_seconds, on_progress, run=run, step=step)
    _retain(folder, path, step, keep, run, report)
    return path


def _retain(folder: Path, written: Path, step: int, keep: int, run, report) -> None:
    ours, changed = [], False
    for s, p in checkpoint_files(folder):
        if p == written:
            continue
        try:
            info = read_header(p)
            why = None
            if info["run"] != run:
                why = f"it holds {describe_header(info)}, not {run.describe() if run else 'an unnamed run'}'s"
            elif info["step"] is not None and info["step"] != s:
                why = f"it holds {describe_header(info)} but its name says step {s}"
            elif s > step:
                why = f"step {s} is later than the step just saved ({step}): the run went back to an earlier checkpoint"
        except (CheckpointError, ValueError) as err:
            why = str(err).removeprefix(p.name + ": ")
        if why is None:
            ours.append(p)
            continue
        try:
            os.replace(p, p.with_name(p.name + SET_ASIDE))
        except OSError as err:
            raise CheckpointWriteError(err.errno, f"cannot set aside {str(p)!r}: {err.strerror}") from None
        changed = True
        if report is not None:
            report(f"set aside {p.name}: {why}")
    for p in ours[:max(0, len(ours) - (keep - 1))]:  # oldest first; the written file is the keep-th
        p.unlink()
        changed = True
    if changed:
        _fsync_folder(folder)


def load_latest(run_dir, validate=None, map_location="cpu", report=None, run: RunIdentity | None = None):
    """The newest checkpoint of ``run_dir`` that verifies, falling back to older ones.

    Each file, newest first by the step in its name, is loaded and checked
    like :func:`load_checkpoint` (checksums, ``weights_only=True``, its step
    against its name, its run against ``run``: by default the folder's
    ``run.json``, when it has one) and then given to ``validate(state)``,
    which should raise :class:`CheckpointError` (or ``ValueError``) for
    impossible values. A file that fails is skipped and
    ``report(f"skipped {name}: {reason}")`` is called (``report`` defaults to
    doing nothing). It only reads: a job that resumes removes stray ``*.tmp``
    files itself (:func:`remove_stray_temporaries`).

    Returns ``(state, path, skipped)`` with ``skipped`` a list of
    ``(name, reason)``; None when the folder holds no checkpoint. Raises
    :class:`RunMismatchError` when ``run`` is not the folder's run, and
    :class:`CheckpointError` listing every reason when none verifies (never
    a silent fresh start).
    """
    import pickle

    _check_map_location(map_location)
    if validate is not None and not callable(validate):
        raise TypeError(f"validate must be callable or None, got {validate!r}")
    if report is not None and not callable(report):
        raise TypeError(f"report must be callable or None, got {report!r}")
    if run is not None:
        instance("run", run, RunIdentity, "a RunIdentity or None")
    folder = run_folder(run_dir)
    recorded = read_run(folder) if folder.is_dir() else None
    if run is not None and recorded is not None and recorded != run:
        raise RunMismatchError(f"run_dir {str(folder)!r} holds {recorded.describe()} (its {RUN_FILE}), "
                               f"not {run.describe()}")
    expect = run or recorded
    skipped = []
    for _, path in reversed(named_like_checkpoints(folder)):
        try:
            if not path.is_file():
                raise CheckpointPathError(f"a folder (or not a regular file), not a checkpoint file")
            state = _load_file(path, map_location, expect)
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
        raise CheckpointError(f"no checkpoint in {str(folder)!r} verifies:\n{lines}")
    return None
