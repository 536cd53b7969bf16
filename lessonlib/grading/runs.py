"""A grading run: its scratch folder, and its notebooks graded a few at a time.

:func:`grading_folder` holds a run's scratch folder (every sandbox's scratch,
sockets and hand-in copies live under it) and removes it however the run
ends: normally, on an exception, on Ctrl-C, or on SIGTERM (turned into
``KeyboardInterrupt`` while the folder is held); a folder left by a grader
killed with SIGKILL is removed by the next run (:func:`sweep_stale`, which
knows a folder's grader by its pid and start time). :func:`run_all` grades
``jobs`` notebooks at once and, on an interrupt, kills every kernel and
reference process at once and grades nothing more.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

from . import reference, runner


def kill_everything() -> None:
    """Kill every kernel and reference process this grader still runs (any thread may call it)."""
    runner.kill_live()
    reference.kill_live()


_RUN_PREFIX = "lessonlib-grading-"
_OWNER = ".owner"


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        return None


def _remove(folder: Path) -> None:
    for root, dirs, _ in os.walk(folder):  # a sealed sockets' folder (0555) under a grader that is not root
        for d in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(root, d), 0o755, follow_symlinks=False)
    shutil.rmtree(folder, ignore_errors=True)


def sweep_stale(tmp: Path | str | None = None) -> list[Path]:
    """Remove run folders whose grader no longer runs (killed with SIGKILL); returns them."""
    tmp = Path(tmp or tempfile.gettempdir())
    gone = []
    for folder in tmp.glob(_RUN_PREFIX + "*"):
        try:
            pid, started = (folder / _OWNER).read_text().split()
        except (OSError, ValueError):
            continue  # not ours, or still being made
        if _start_time(int(pid)) != started:
            _remove(folder)
            gone.append(folder)
    return gone


@contextlib.contextmanager
def grading_folder(tmp: Path | str | None = None):
    """A run's scratch folder, removed however the run ends.

    SIGTERM becomes ``KeyboardInterrupt`` while it is held (in the main
    thread), so a terminated grader stops its kernels and removes its folder;
    folders left by a grader killed outright are removed at the next start.
    """
    base = Path(tmp or tempfile.gettempdir())
    # a kernel's sockets are RUN/grade-XXXXXXXX/conn/k-NNNNN, and a Unix socket's path holds 107 bytes
    longest = len(os.fsencode(base.resolve())) + len(f"/{_RUN_PREFIX}xxxxxxxx/grade-xxxxxxxx/conn/k-65535")
    if longest > 107:
        raise ValueError(f"the temporary folder {base} is too deep for the kernels' sockets ({longest} bytes "
                         f"of the 107 a socket's path may have): set TMPDIR to a shorter folder, such as /tmp")
    sweep_stale(base)
    folder = Path(tempfile.mkdtemp(prefix=_RUN_PREFIX, dir=base))
    (folder / _OWNER).write_text(f"{os.getpid()} {_start_time(os.getpid())}")
    old = None
    if threading.current_thread() is threading.main_thread():
        def _term(signum, frame):
            raise KeyboardInterrupt("SIGTERM")

        old = signal.signal(signal.SIGTERM, _term)
    try:
        yield folder
    finally:
        try:
            kill_everything()  # nothing, after a run that ended normally
        finally:
            if old is not None:
                signal.signal(signal.SIGTERM, old)
            _remove(folder)


def run_all(fn, items: list, jobs: int) -> list:
    """``[fn(item) for item in items]``, ``jobs`` at a time; an interrupt stops every kernel and returns
    nothing (the ``KeyboardInterrupt`` goes on) instead of grading the rest of the class."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=jobs) if jobs > 1 else None
    try:
        if pool is None:
            return [fn(item) for item in items]
        futures = [pool.submit(fn, item) for item in items]
        return [f.result() for f in futures]
    except BaseException:
        runner.STOPPING.set()  # no kernel starts or restarts any more; the running ones die now
        kill_everything()
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        runner.STOPPING.clear()
