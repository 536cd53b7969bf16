"""Resource caps for the processes a grading run starts: cgroups where the machine allows, rlimits always.

:func:`capped` wraps a command line so that it runs with

* **a cgroup** of its own (memory, and processes), when :func:`cgroup_parents`
  finds cgroup folders this process may write: ``memory_bytes`` for all the
  processes in it together, counting what ``RLIMIT_DATA`` does not (shared
  mappings, tmpfs pages such as the sandbox's ``/tmp``, page cache), without
  swap; at most :data:`MAX_PROCESSES` processes. The kernel kills a process
  in the cgroup when the group reaches its limit. cgroup v1 (a ``memory``
  hierarchy) and v2 (a unified hierarchy whose ``memory`` controller this
  process may enable for a child) both work;
* **rlimits**, inherited by every process it starts: ``RLIMIT_DATA``
  (``memory_bytes``: heap and private anonymous memory, a clear ``MemoryError``),
  ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, no core dumps;
* for ``bwrap`` (``env="args"``): **an empty environment and a short command
  line**: its options go through a file descriptor (``--args 3``), so the
  sandbox's pid 1 shows neither the grader's environment nor its folders.

The wrapper is a few lines of Python run with ``-I -S`` (no site, no path)
that joins the cgroups, sets the limits and ``exec``s the command, so the
command's process is the one that was started (``Popen.kill`` reaches it).
Cgroups are made with :func:`new_cgroups` and removed with
:func:`remove_cgroups` once the command has exited; folders left by a grader
that was killed are removed by the next one (:func:`sweep_cgroups`).
"""
from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path

#: Most processes (threads count) in one cgroup: a fork bomb stops there.
MAX_PROCESSES = 512
_PREFIX = "lessonlib-grading-"
_counter = itertools.count()

# argv: data cpu fsize n_cgroups cgroup... mode command...
# mode "keep": exec the command as it is; "args": the command is bwrap OPTIONS... -- ARGV...
_WRAPPER = r"""
import os, resource, sys
a = sys.argv[1:]
data, cpu, fsize, n = (int(v) for v in a[:4])
for d in a[4:4 + n]:
    with open(d + "/cgroup.procs", "w") as f:
        f.write(str(os.getpid()))
rest = a[4 + n:]
for what, value in ((resource.RLIMIT_DATA, data), (resource.RLIMIT_CPU, cpu),
                    (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(what, (value, value))
mode, rest = rest[0], rest[1:]
if mode == "args":  # bwrap: its options go through fd 3, so its command line stays short
    fd = os.memfd_create("bwrap-args", 0)
    sep = rest.index("--")
    os.write(fd, b"".join(x.encode() + b"\0" for x in rest[1:sep]))
    os.lseek(fd, 0, 0)
    if fd != 3:
        os.dup2(fd, 3)
        os.close(fd)
    os.set_inheritable(3, True)
    os.execve(rest[0], ["bwrap", "--args", "3", "--"] + rest[sep + 1:], {})
os.execv(rest[0], rest)
"""


def _mounts() -> dict[str, tuple[Path, str]]:
    """Controller (``memory``, ``pids``, or ``unified`` for v2) -> (mount point, mount root)."""
    found: dict[str, tuple[Path, str]] = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, mnt, fstype, opts = fields[3], Path(fields[4]), tail[0], tail[2].split(",")
        if fstype == "cgroup":
            for c in ("memory", "pids"):
                if c in opts:
                    found.setdefault(c, (mnt, root))
        elif fstype == "cgroup2":
            found.setdefault("unified", (mnt, root))
    return found


def _own_cgroups() -> dict[str, str]:
    own: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return own
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        for c in (ctrls.split(",") if ctrls else ["unified"]):
            own[c] = path
    return own


def _writable_dir(d: Path) -> bool:
    return d.is_dir() and os.access(d, os.W_OK)


def cgroup_parents() -> dict[str, Path]:
    """Where this process may make child cgroups: ``{"memory": folder, "pids": folder}`` (v1),
    ``{"unified": folder}`` (v2, memory controller available), or ``{}`` (none: rlimits only)."""
    mounts, own = _mounts(), _own_cgroups()

    def folder(ctrl):
        mnt, root = mounts[ctrl]
        path = own.get(ctrl, "/")
        if root != "/" and path.startswith(root):
            path = path[len(root):]
        return mnt / path.lstrip("/")

    out: dict[str, Path] = {}
    for ctrl in ("memory", "pids"):
        if ctrl in mounts and ctrl in own and _writable_dir(folder(ctrl)) \
                and (folder(ctrl) / "cgroup.procs").exists():
            out[ctrl] = folder(ctrl)
    if "memory" in out:
        return out
    if "unified" in mounts:
        d = folder("unified")
        try:
            available = (d / "cgroup.controllers").read_text().split()
        except OSError:
            available = []
        if "memory" in available and _writable_dir(d):
            return {"unified": d}
    return {}


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


def new_cgroups(memory_bytes: int, processes: int = MAX_PROCESSES) -> list[Path]:
    """Fresh cgroups capping memory (and processes) for one command; ``[]`` where none can be made."""
    made: list[Path] = []
    name = f"{_PREFIX}{os.getpid()}-{next(_counter)}"
    try:
        for ctrl, parent in cgroup_parents().items():
            d = parent / name
            if ctrl == "unified":
                _write(parent / "cgroup.subtree_control", "+memory +pids")
                d.mkdir()
                made.append(d)
                if not _write(d / "memory.max", str(memory_bytes)):
                    raise OSError("memory.max cannot be set")
                _write(d / "memory.swap.max", "0")
                _write(d / "pids.max", str(processes))
            elif ctrl == "memory":
                d.mkdir()
                made.append(d)
                if not _write(d / "memory.limit_in_bytes", str(memory_bytes)):
                    raise OSError("memory.limit_in_bytes cannot be set")
                _write(d / "memory.memsw.limit_in_bytes", str(memory_bytes))  # only with swap accounting
            elif ctrl == "pids":
                d.mkdir()
                made.append(d)
                _write(d / "pids.max", str(processes))
    except OSError:
        remove_cgroups(made, wait=0)
        return []
    return made


def remove_cgroups(folders: list[Path], wait: float = 5.0) -> None:
    """Remove cgroups once their processes are gone (waits up to ``wait`` s; a leftover is swept later)."""
    deadline = time.monotonic() + wait
    for d in folders:
        while True:
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)


def sweep_cgroups() -> None:
    """Remove the cgroups left by graders that no longer run (a grader killed with SIGKILL)."""
    for parent in cgroup_parents().values():
        try:
            names = [p for p in parent.iterdir() if p.name.startswith(_PREFIX)]
        except OSError:
            continue
        for d in names:
            pid = d.name[len(_PREFIX):].split("-")[0]
            if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
                remove_cgroups([d], wait=0)


def capped(argv: list[str], *, memory_bytes: int, cpu_seconds: int, file_bytes: int,
           cgroups: list[Path] = (), env: str = "keep") -> list[str]:
    """``argv`` run under the caps above; ``env``: ``"keep"`` (the environment as it is), or ``"args"``
    (``argv`` is ``[bwrap, option..., "--", command...]``: the options go through ``--args``, the
    environment is emptied)."""
    if env not in ("keep", "args"):
        raise ValueError(f"env must be 'keep' or 'args', got {env!r}")
    head = [str(int(memory_bytes)), str(int(cpu_seconds)), str(int(file_bytes)), str(len(cgroups)),
            *(str(c) for c in cgroups), env]
    return [sys.executable, "-I", "-S", "-c", _WRAPPER, *head, *argv]
