"""A run folder: whose checkpoints it holds, and who may write them.

A checkpoint that verifies can still be in the wrong place: a file copied in
from another run, a fresh run started in an old run's folder, two jobs saving
into one folder at once. This module gives a run folder two small files:

* ``run.json`` -- the run's identity (:class:`RunIdentity`: a run id drawn
  at random when the run starts, its seed, and the configuration that must
  match on resume). Every checkpoint records the same identity and its step
  (:mod:`lessonlib.measure.checkpoint`), and loading compares them;
* ``writer.lock`` -- one writer per folder. The lock is an ``flock`` on this
  file, which the operating system drops when its holder dies (even by
  ``SIGKILL``), so a crashed writer never blocks the folder; the file names
  its holder (pid, host, start time, command), so a refusal says who holds it,
  and the next writer says whose lock it took over.

Temporary files carry their writer's pid and host in their names
(:func:`temporary_prefix`), so cleaning up after a killed save never deletes
another live process's save in progress (:func:`temporary_is_stray`).

These are the standard library's tools (``os.open``, ``fcntl.flock``,
``os.replace``): PyTorch has no lock or run identity for a single-process job.
"""
from __future__ import annotations

import atexit
import datetime
import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ..checks import count, flag, instance, path as check_path, text

try:  # POSIX: flock, dropped by the kernel when the holder dies
    import fcntl
except ImportError:  # pragma: no cover - Windows: a byte-range lock, dropped the same way
    fcntl = None
    import msvcrt

RUN_FILE = "run.json"
LOCK_FILE = "writer.lock"


class CheckpointError(ValueError):
    """A checkpoint that is damaged, impossible, or not this run's. The message names the file and what is wrong."""


class RunMismatchError(CheckpointError):
    """A checkpoint or run folder that belongs to another run: the message says whose it is, and where."""


class CheckpointPathError(ValueError):
    """A path of the wrong kind: a folder where a checkpoint file belongs, a file where a run folder belongs."""


class CheckpointWriteError(OSError):
    """Writing a checkpoint (or the run's files) failed: a full disk, no permission. ``errno`` is the system's."""


class FolderInUseError(RuntimeError):
    """Another live process is writing this run folder; the message names it (pid, host, start, command)."""


@dataclass(frozen=True)
class RunIdentity:
    """Whose checkpoints these are: ``run_id`` (drawn at random by :meth:`new`), ``seed`` and ``config``.

    ``config`` is a JSON-able dict of the settings that must match when the
    run is resumed (model shape, data, learning rate); what may change on
    resume (how many steps, how often to save) stays out of it.
    """

    run_id: str
    seed: int | None = None
    config: dict = field(default_factory=dict)

    def __post_init__(self):
        instance("run_id", self.run_id, str, "a string")
        if not re.fullmatch(r"[0-9A-Za-z_-]{1,64}", self.run_id):
            raise ValueError(f"run_id must be 1 to 64 letters, digits, '-' or '_', got {self.run_id!r:.80}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be a whole number >= 0 or None, got {self.seed!r:.80}")
        instance("config", self.config, dict, "a dict of settings")
        try:  # canonical JSON: a tuple and a list compare equal, as they will after a round trip
            object.__setattr__(self, "config", json.loads(json.dumps(self.config, sort_keys=True, allow_nan=False)))
        except (TypeError, ValueError) as err:
            raise ValueError(f"config must hold JSON values only (numbers, strings, lists, dicts): {err}") from None

    @classmethod
    def new(cls, seed: int | None = None, config: dict | None = None) -> "RunIdentity":
        """A fresh run: a new random ``run_id`` with this seed and configuration."""
        return cls(uuid.uuid4().hex[:16], seed, dict(config or {}))

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "seed": self.seed, "config": self.config}

    @classmethod
    def from_json(cls, data, where: str) -> "RunIdentity":
        """Rebuild from :meth:`to_json`'s dict; ``where`` names the file in the error for anything else."""
        if not isinstance(data, dict) or set(data) != {"run_id", "seed", "config"}:
            raise CheckpointError(f"{where}: the run identity must be a dict with run_id, seed and config, "
                                  f"got {data!r:.120}")
        try:
            return cls(data["run_id"], data["seed"], data["config"])
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{where}: the run identity is invalid: {err}") from None

    def describe(self) -> str:
        """``run 3f2a... (seed 0)``: how messages name a run."""
        return f"run {self.run_id} (seed {self.seed})"


def run_folder(run_dir, create: bool = False) -> Path:
    """``run_dir`` as a run folder path: refused if it is a file; created (with parents) if ``create``."""
    create = flag("create", create)
    name = "run_dir"
    folder = check_path(name, run_dir)
    if folder.exists() and not folder.is_dir():
        raise CheckpointPathError(f"{name} {str(folder)!r} is a file, but a run folder (holding checkpoints) "
                                  f"was expected: pass a folder's path")
    if create:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):  # a parent is a file
            raise CheckpointPathError(f"{name} {str(folder)!r} cannot be created: part of that path is a file, "
                                      f"not a folder") from None
        except OSError as err:
            raise CheckpointWriteError(err.errno,
                                       f"cannot create the run folder {str(folder)!r}: {err.strerror}") from None
    return folder


def read_run(run_dir) -> RunIdentity | None:
    """The identity recorded in ``run_dir/run.json``, or None when the folder has none."""
    folder = run_folder(run_dir)
    path = folder / RUN_FILE
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise CheckpointPathError(f"{str(path)!r} is a folder, but the run's identity file belongs there") from None
    except ValueError as err:  # not JSON (UnicodeDecodeError is a ValueError too)
        raise CheckpointError(f"{str(path)!r}: the run's identity file is damaged ({err}); "
                              f"it should hold the JSON that write_run wrote") from None
    return RunIdentity.from_json(data, str(path))


def write_run(run_dir, run: RunIdentity) -> Path:
    """Record ``run`` in ``run_dir/run.json`` (temporary file, fsync, ``os.replace``). Returns the path."""
    instance("run", run, RunIdentity, "a RunIdentity")
    folder = run_folder(run_dir, create=True)
    path = folder / RUN_FILE
    if path.is_dir():
        raise CheckpointPathError(f"{str(path)!r} is a folder, but the run's identity file belongs there")
    tmp = folder / f"{temporary_prefix(RUN_FILE)}{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(run.to_json(), f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise CheckpointWriteError(err.errno, f"cannot write the run's identity file {str(path)!r}: "
                                              f"{err.strerror}") from None
    return path


# --- temporary files: named by their writer -----------------------------------------

_HOST_TAG = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_TEMP_RE = re.compile(r"\.w(?P<pid>\d+)-(?P<host>[0-9a-f]{8})\.[^.]*\.tmp$")
#: This process's temporary files being written right now (paths as text): :mod:`.checkpoint`'s writer
#: adds each before it writes and removes it after, so a scan of the folder leaves them alone.
IN_PROGRESS: set[str] = set()


def temporary_prefix(target: str) -> str:
    """The prefix of a temporary file for ``target``: ``<target>.w<pid>-<host tag>.`` (names its writer)."""
    text("target", target)
    return f"{target}.w{os.getpid()}-{_HOST_TAG}."


def temporary_is_stray(path, own_folder: bool = False) -> bool:
    """Whether ``path`` (a ``*.tmp`` file) was left by a writer that is gone, so deleting it is safe.

    A temporary file of a live process (this one's saves in progress
    included) is never stray. One from another host cannot be judged here
    and is left alone. One whose name names no writer (an older format) is
    stray only when ``own_folder`` says this process holds the folder's lock.
    """
    p = check_path("path", path)
    own_folder = flag("own_folder", own_folder)
    if str(p) in IN_PROGRESS:
        return False
    m = _TEMP_RE.search(p.name)
    if m is None:
        return own_folder
    if m.group("host") != _HOST_TAG:
        return False
    pid = int(m.group("pid"))
    if pid == os.getpid():
        return True  # not in progress here: left by an earlier process that had this pid
    return process_alive(pid) is False


def _start_ticks(pid: int):
    """A process's start time in clock ticks since boot (Linux ``/proc``), or None where unknown."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_alive(pid: int, start_ticks: int | None = None) -> bool | None:
    """Whether process ``pid`` of this host is running: True, False, or None where it cannot tell (Windows).

    A zombie counts as gone. With ``start_ticks`` (from a lock file), a pid
    that now belongs to a later process counts as gone too.
    """
    pid = count("pid", pid)
    start_ticks = None if start_ticks is None else count("start_ticks", start_ticks, minimum=0)
    if os.name == "nt":  # pragma: no cover - os.kill(pid, 0) would send CTRL_C_EVENT there
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: alive
    except OverflowError:
        return False
    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return False
    except (OSError, IndexError):
        pass
    now = _start_ticks(pid)
    return not (start_ticks is not None and now is not None and now != start_ticks)


# --- the writer lock ------------------------------------------------------------------

_HELD: dict[str, list] = {}  # folder -> [fd, count] for the locks this process holds
_HELD_GUARD = threading.Lock()


def _describe_holder(holder) -> str:
    if not isinstance(holder, dict):
        return "a process that did not say who it is (the lock file is empty or being written)"
    return (f"pid {holder.get('pid')} on host {holder.get('host')!r}, since {holder.get('started')} "
            f"({str(holder.get('command'))[:80]})")


def _read_lock(fd_or_path):
    try:
        if isinstance(fd_or_path, int):
            os.lseek(fd_or_path, 0, os.SEEK_SET)
            raw = os.read(fd_or_path, 65536)
        else:
            raw = Path(fd_or_path).read_bytes()[:65536]
        return json.loads(raw) if raw.strip() else None
    except (OSError, ValueError):
        return None


def _holder_of(fd: int):
    """The holder named in a lock file whose lock is held. A holder writes its name just after taking the
    lock, so an empty file is read again for up to half a second (yielding the CPU to that writer)."""
    holder, deadline = _read_lock(fd), time.monotonic() + 0.5
    while holder is None and time.monotonic() < deadline:
        if hasattr(os, "sched_yield"):
            os.sched_yield()
        holder = _read_lock(fd)
    return holder


def _try_lock(fd: int) -> bool:
    """Take the lock (True) or find it held (False). On a file system without locks (ENOLCK, EOPNOTSUPP)
    the lock file's holder is judged by its pid instead: held while that process lives."""
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:  # pragma: no cover - Windows
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        return True
    except (BlockingIOError, PermissionError):  # EWOULDBLOCK; EACCES on some systems
        return False
    except OSError:  # pragma: no cover - no locking here: fall back to the holder's pid
        h = _read_lock(fd)
        if not isinstance(h, dict) or h.get("pid") == os.getpid():
            return True
        if h.get("host") != socket.gethostname():
            return False  # another machine's process cannot be checked from here: its lock holds
        try:
            return process_alive(int(h["pid"]), h.get("start_ticks")) is False
        except (KeyError, TypeError, ValueError):
            return True


def folder_holder(run_dir) -> dict | None:
    """Who holds ``run_dir``'s writer lock now (its ``pid``, ``host``, ``started``, ``command``), or None."""
    folder = run_folder(run_dir)
    path = folder / LOCK_FILE
    if str(folder.resolve()) in _HELD:
        return _read_lock(path)
    try:
        fd = os.open(path, os.O_RDWR)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    try:
        return None if _try_lock(fd) else _holder_of(fd)  # a lock we could take is held by nobody
    finally:
        os.close(fd)  # closing drops a lock taken just now


def acquire_folder(run_dir, report=None) -> dict:
    """Become ``run_dir``'s one writer; return this process's entry in the lock file.

    Re-entrant within a process (counted: call :func:`release_folder` as many
    times). Raises :class:`FolderInUseError` naming the holder when another
    live process holds it. A lock file left by a writer that died (a kill, a
    power cut) is taken over; ``report(line)`` (optional) is told whose.
    """
    folder = run_folder(run_dir)
    if report is not None and not callable(report):
        raise TypeError(f"report must be callable or None, got {report!r:.80}")
    if not folder.is_dir():
        raise ValueError(f"run_dir {str(folder)!r} does not exist: create the run folder first")
    key, path = str(folder.resolve()), folder / LOCK_FILE
    with _HELD_GUARD:
        if key in _HELD:
            _HELD[key][1] += 1
            return _read_lock(path)
        for _ in range(10):  # retried only while a releasing holder unlinks the file under us
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except IsADirectoryError:
                raise CheckpointPathError(f"{str(path)!r} is a folder, but the run's lock file belongs there") from None
            except OSError as err:
                raise CheckpointWriteError(err.errno,
                                           f"cannot open the lock file {str(path)!r}: {err.strerror}") from None
            if not _try_lock(fd):
                holder = _holder_of(fd)
                os.close(fd)
                raise FolderInUseError(
                    f"run_dir {str(folder)!r} is being written by another process: {_describe_holder(holder)} "
                    f"(lock file {str(path)!r}). A run folder has one writer at a time: wait for that job to end, "
                    f"stop it, or use another folder.")
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:  # pragma: no cover - ten holders in a row released under us
            raise FolderInUseError(f"run_dir {str(folder)!r}: could not take the lock file {str(path)!r}")
        previous = _read_lock(fd)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "start_ticks": _start_ticks(os.getpid()),
              "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(sys.argv[:3])[:200]}
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps(me).encode())
            os.fsync(fd)
        except OSError as err:
            os.close(fd)
            raise CheckpointWriteError(err.errno, f"cannot write the lock file {str(path)!r}: {err.strerror}") from None
        _HELD[key] = [fd, 1]
    if previous is not None and report is not None:
        report(f"took over {LOCK_FILE} from {_describe_holder(previous)}: that writer is gone")
    return me


def release_folder(run_dir) -> None:
    """Give back one hold of ``run_dir``'s writer lock; the last one removes the lock file. No-op if not held."""
    folder = run_folder(run_dir)
    key = str(folder.resolve()) if folder.exists() else None
    with _HELD_GUARD:
        held = _HELD.get(key)
        if held is None:
            return
        held[1] -= 1
        if held[1] > 0:
            return
        del _HELD[key]
        try:  # unlink while still locked: a waiting writer then finds its file gone and retries
            (folder / LOCK_FILE).unlink()
        except OSError:
            pass
        os.close(held[0])


def holds_folder(run_dir) -> bool:
    """Whether this process holds ``run_dir``'s writer lock."""
    folder = run_folder(run_dir)
    return folder.exists() and str(folder.resolve()) in _HELD


@atexit.register
def _release_all() -> None:
    for key in list(_HELD):
        _HELD[key][1] = 1
        release_folder(key)
