"""A caller killed alone, or with its process group, leaves nothing behind.

The out-of-memory killer, or SIGKILL or SIGTERM sent to a notebook's kernel
only (not its process group), ends the caller without any clean-up of its own;
so does SIGKILL to its whole group (Jupyter's restart, when the kernel does not
shut down at once).
What :func:`~lessonlib.measure.distributed.launch.launch` started must still go,
within a few seconds: the workers, the fork server, ``multiprocessing``'s
resource tracker, and the temp folders (``lessonlib-dist-*``, ``pymp-*``) and
named semaphores (``/dev/shm/sem.mp-*``) they used.

Here a child Python stands in for the kernel. Every process it starts inherits
a marker in its environment (the fork server and the resource tracker from the
caller, the workers from the fork server), which is how they are found after
they have been handed to another parent; its temp folder is a private one.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from test_interrupt import _alive

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"), pytest.mark.slow]

HERE = Path(__file__).parent

#: How long everything may take to go once the caller is killed, in seconds. The workers leave
#: at once (they read the end of the caller's pipe); the fork server then leaves and tears down
#: its torch (about a second, a few on a loaded two-core machine). Before the fix the workers
#: ran to their end (300 s here) and the temp folders stayed for ever.
BOUND = 15.0

CALLER = """
import os, sys, time
from lessonlib.measure.distributed.launch import launch
from test_interrupt import _pid_sleeper
folder, when = sys.argv[1], sys.argv[2]
if when == "idle":  # killed between two launches: only the fork server and the resource tracker run
    launch(_pid_sleeper, 2, args=(folder, 0.0), timeout=300)
    open(os.path.join(folder, "idle"), "w").close()
    time.sleep(600)
else:  # killed while the workers run
    launch(_pid_sleeper, 2, args=(folder, 300.0), timeout=600)
"""


def _marked(marker: str) -> list[int]:
    """Live processes (zombies excluded) whose environment holds ``marker``."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{pid}/environ").read_bytes() and _alive(int(pid)):
                    found.append(int(pid))
            except OSError:
                pass
    return found


def _left(tmp: Path) -> list[str]:
    """What is left in the caller's temp folder, except torch's compile cache (``torchinductor_<user>``),
    which torch keeps between runs on purpose."""
    return sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_"))


def _semaphores(pids) -> set[str]:
    """The ``/dev/shm/sem.mp-*`` files that these processes have mapped."""
    names = set()
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                if "/dev/shm/sem.mp-" in line:
                    names.add(line.split()[-1])
        except OSError:
            pass
    return names


@pytest.mark.parametrize("when, sig, group", [("running", signal.SIGKILL, False), ("running", signal.SIGTERM, False),
                                              ("idle", signal.SIGKILL, False), ("running", signal.SIGKILL, True)])
def test_a_killed_caller_leaves_nothing(tmp_path, request, when, sig, group):
    """Killed alone (``group`` false: the out-of-memory killer, ``kill PID``), or with its process group
    (Jupyter's restart, which first signals the group): nothing it started outlives it."""
    marker = f"lessonlib-test-{uuid.uuid4().hex}"
    # The caller's temp folder is short and fresh: multiprocessing binds its fork server's socket inside it,
    # and a Unix socket's path must stay under 108 bytes (pytest's tmp_path under xdist is longer).
    tmp = Path(tempfile.mkdtemp(prefix="kc-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    folder = tmp_path / "pids"
    folder.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), LESSONLIB_TEST_MARKER=marker,
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    with open(tmp_path / "caller.log", "w") as log:
        caller = subprocess.Popen([sys.executable, "-c", CALLER, str(folder), when], env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        ready = (lambda: (folder / "idle").exists()) if when == "idle" else \
            (lambda: len(list(folder.glob("*.pid"))) == 2)
        while not ready():
            assert caller.poll() is None, (tmp_path / "caller.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.1)
        time.sleep(0.3)  # let the workers settle into their sleep
        started = _marked(marker)
        workers = [int(p.read_text()) for p in folder.glob("*.pid")]
        # the caller, the fork server, the resource tracker, and the two workers while they run
        assert len(started) == (5 if when == "running" else 3), started
        assert set(workers) <= set(started) if when == "running" else True
        semaphores = _semaphores(started)  # none since the progress ticks go through a pipe; checked all the same
        assert any(p.name.startswith("pymp-") for p in tmp.iterdir())
        if group:
            os.killpg(caller.pid, sig)  # the caller's own group (start_new_session): not this test's
        else:
            caller.send_signal(sig)  # to the caller only, not its process group
        caller.wait(timeout=30)
        end = time.monotonic() + BOUND
        while time.monotonic() < end and (_marked(marker) or _left(tmp)
                                           or any(os.path.exists(s) for s in semaphores)):
            time.sleep(0.2)
        assert _marked(marker) == [], "processes outlived their caller"
        assert _left(tmp) == [], "temp folders outlived their caller"
        assert [s for s in semaphores if os.path.exists(s)] == [], "semaphores outlived their caller"
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()
        for pid in _marked(marker):  # never leave the machine busy, even when the test fails
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
