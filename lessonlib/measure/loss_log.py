"""A run's loss log: one line ``step float.hex(loss)`` per step, exact, appended as the run goes.

A kill or a full disk can cut the last line short. Appending after a cut
line would join the next record onto it (``30 0x1.9d7d18000031 0x1.85...``),
losing both steps, so :func:`repair_loss_log` cuts the log back to its last
complete line before a run appends again, and :func:`read_losses` counts only
complete lines and refuses a damaged one in the middle.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..checks import count, path as check_path
from .run_folder import CheckpointError, CheckpointPathError, CheckpointWriteError

LOSS_LOG = "losses.txt"


def _log_path(run_dir) -> Path:
    path = check_path("run_dir", run_dir) / LOSS_LOG
    if path.is_dir():
        raise CheckpointPathError(f"{str(path)!r} is a folder, but the run's loss log (a text file) belongs there")
    return path


def repair_loss_log(run_dir) -> str | None:
    """Cut ``run_dir/losses.txt`` back to its last complete line; return what was cut (None: nothing).

    Only an unterminated last line is removed: the record a kill or a full
    disk cut short. Its step is simply run again by the resumed job.
    """
    path = _log_path(run_dir)
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return None
            f.seek(max(0, size - 4096))
            tail = f.read()
            if tail.endswith(b"\n"):
                return None
            cut = tail.rfind(b"\n")
            if cut < 0 and size > len(tail):
                raise CheckpointError(f"{str(path)!r}: its last 4096 bytes hold no line break: not a loss log")
            keep = size - len(tail) + cut + 1
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
            return tail[cut + 1:].decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CheckpointWriteError(err.errno, f"cannot repair the loss log {str(path)!r}: {err.strerror}") from None


def append_loss(log, step: int, loss: float) -> None:
    """Write one complete record (a NaN loss too) to the open log file ``log`` and flush it; errors name the file.

    :func:`~lessonlib.measure.recovery.train` writes each step's loss with it."""
    if not (callable(getattr(log, "write", None)) and callable(getattr(log, "flush", None))):
        raise TypeError(f"log must be an open text file, got {type(log).__name__}")
    step = count("step", step, minimum=0)
    if isinstance(loss, bool) or not isinstance(loss, float):
        raise TypeError(f"loss must be a float (NaN allowed: it is recorded), got {type(loss).__name__}")
    try:
        log.write(f"{step} {loss.hex()}\n")
        log.flush()
    except OSError as err:
        raise CheckpointWriteError(err.errno, f"cannot append step {step} to the loss log "
                                              f"{getattr(log, 'name', log)!r}: "
                                              f"{err.strerror}") from None


def read_losses(run_dir) -> dict[int, float]:
    """The loss of every step in ``run_dir/losses.txt``: ``{step: loss}``.

    A step that ran twice (before a crash and again after the resume) keeps
    its last value, the one the finished job stands on. An unterminated last
    line (cut by a kill or a full disk) is not a record and is left out. A
    complete line that is not ``step float.hex`` raises :class:`CheckpointError`
    naming the file and the line: the log was damaged, and its steps cannot be trusted.
    """
    losses: dict[int, float] = {}
    path = _log_path(run_dir)
    if not path.exists():
        return losses
    text = path.read_bytes().decode("utf-8", "replace")
    lines = text.split("\n")[:-1]  # the piece after the last line break is not a complete record
    for number, line in enumerate(lines, 1):
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError
            losses[int(parts[0])] = float.fromhex(parts[1])
        except ValueError:
            raise CheckpointError(f"{str(path)!r}: line {number} is {line[:60]!r}, not 'step float.hex(loss)': "
                                  f"the log is damaged (or two runs appended to it)") from None
    return dict(sorted(losses.items()))
