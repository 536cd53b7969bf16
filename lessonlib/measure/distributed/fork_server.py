"""The fork server's tie to its owner: it outlives neither the owner nor the owner's temp folder.

:mod:`.launch` starts its workers from a fork server (``multiprocessing``'s
``forkserver``), a process that its owner (the caller, a notebook's kernel)
starts once. The server leaves by itself when no process holds its "alive"
pipe any more: the owner and each worker hold it, and the workers leave when
the owner goes (see :mod:`.worker`). What nothing removes, when the owner was
killed rather than exiting, is the owner's temp folder (``pymp-*``) where the
server's socket lies: its owner removes it at a normal exit only.

The server imports this module first (it is the first of launch's preloaded
modules). The owner names itself in :data:`OWNER_VARIABLE` (``"<pid>:<folder>"``)
while it starts the server; here, in a process that the named owner started,

- the server leaves the owner's process group (``os.setsid``), and so do the
  workers it forks: a signal to the whole group (Jupyter's kernel restart, a
  test harness's kill) then ends the owner, and the server and the workers
  leave after it, by the pipes above, instead of dying with it before they can
  clean up;
- the folder is removed when the server exits. The server exits only once its
  owner is gone, so the folder is never removed under a live owner.
"""
from __future__ import annotations

import atexit
import os
import shutil

#: The environment variable in which the caller names itself to the fork server it starts.
OWNER_VARIABLE = "LESSONLIB_DIST_OWNER"


def _tie_to_owner(value: str | None) -> bool:
    """In the fork server: leave the owner's process group; remove its temp folder named in ``value`` at exit.

    Does nothing (and returns False) unless ``value`` is ``"<pid>:<folder>"`` with
    ``<pid>`` this process's parent and ``<folder>`` a ``pymp-*`` folder.
    """
    pid, sep, folder = (value or "").partition(":")
    if not sep or not pid.isdigit() or int(pid) != os.getppid() or not os.path.basename(folder).startswith("pymp-"):
        return False
    server = os.getpid()
    try:
        os.setsid()
    except OSError:  # already a group leader: it stays in its group
        pass

    def remove():
        if os.getpid() == server:  # not in a forked worker (they leave with os._exit anyway)
            shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)
    return True


_tie_to_owner(os.environ.get(OWNER_VARIABLE))
