"""The reference process: expected values from instructor code, checks on plain data.

    python -m lessonlib.grading.reference EXERCISE.ipynb

runs the instructor's notebook *without its solutions*: every code cell that
is not a solution cell and not ``instructor-only``, and, of each check cell,
only the hidden part. The hidden parts compute expected values from the
instructor's own cells and register ``@grader(...)`` functions (see
:mod:`lessonlib.grading.graders`). No student code ever runs in this process.

Then it answers requests, one JSON object a line on stdin::

    {"id": 1, "question": "1a-q1", "answers": {...plain data...}, "folder": null}

with one line on stdout::

    {"id": 1, "status": "passed" | "failed" | "flagged" | "error", "message": "..."}

The first line it writes is ``{"ready": true, "questions": [...]}``, or
``{"ready": false, "error": "..."}`` when the notebook could not be run.
Whatever the instructor's cells print goes to stderr. Each check gets
``--check-timeout`` seconds (default 30).

No student code runs here, but student *data* does reach it (answers, and
files such as a checkpoint that a check loads), so the process is capped
like a sandbox (:mod:`lessonlib.grading.limits`: a memory cgroup where the
machine allows, rlimits always) and ``torch.load`` refuses tensors that
claim more elements than their storage holds (stride-0 views: a 2 kB file
that broadcasts into gigabytes) or more than :data:`MAX_TENSOR_BYTES`. A
check that runs out of memory fails that student's question only.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import weakref
from pathlib import Path

from . import graders
from .answers import check_one_of, require_number
from .graders import Answers, Flag, check_choice, check_close, check_key_points, decode_answers, grader
from .handout import INSTRUCTOR_ONLY, cell_meta, cell_source, hidden_part, is_check_cell, is_solution_cell

MAX_REQUEST_BYTES = 1024 * 1024
#: Largest tensor a check may load from a student's file (the exercises' checkpoints are kilobytes).
MAX_TENSOR_BYTES = 256 * 1024 ** 2
#: The reference process's memory: instructor cells and one check at a time.
MEMORY_BYTES = 2 * 1024 ** 3

#: Names every hidden part may use without importing them.
PRELUDE = {"grader": grader, "check_close": check_close, "check_choice": check_choice,
           "check_key_points": check_key_points, "require_number": require_number,
           "check_one_of": check_one_of, "Flag": Flag}


def load(path: Path | str, questions=None, given: bool = True) -> dict:
    """Run the instructor notebook at ``path`` without solutions; return ``grade_id -> check``.

    The checks are registered in reference mode; the module's mode and
    registry are restored afterwards, so a test can call this in-process.
    ``questions`` (grade ids) limits the checks run; ``given=False`` skips
    the other cells (for a check that needs none of them, in a quick test).
    """
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    saved = graders.MODE, dict(graders.REGISTRY)
    graders.MODE = "reference"
    graders.REGISTRY.clear()
    try:
        namespace: dict = {"__name__": "__reference__"}
        for i, cell in enumerate(nb.get("cells", [])):
            if cell.get("cell_type") != "code":
                continue
            if INSTRUCTOR_ONLY in (cell.get("metadata", {}).get("tags") or []) or is_solution_cell(cell):
                continue
            source = cell_source(cell)
            if is_check_cell(cell) and questions is not None and cell_meta(cell).get("grade_id") not in questions:
                continue
            if not is_check_cell(cell) and not given:
                continue
            if is_check_cell(cell):
                # each check's expected values and function live in their own copy of the
                # namespace: a later cell that reuses a name cannot change an earlier check
                scope = dict(namespace, **PRELUDE)
                code = hidden_part(source)
            else:
                scope, code = namespace, source
            exec(compile(code, f"{path.name} cell {i}", "exec"), scope)  # noqa: S102 - instructor code
        registry = dict(graders.REGISTRY)
    finally:
        graders.MODE = saved[0]
        graders.REGISTRY.clear()
        graders.REGISTRY.update(saved[1])
    missing = [cell_meta(c).get("grade_id") for c in nb.get("cells", [])
               if is_check_cell(c) and cell_meta(c).get("grade_id") not in registry
               and (questions is None or cell_meta(c).get("grade_id") in questions)]
    if missing:
        raise ValueError(f"check cells without @grader(...) in their hidden part: {missing}")
    return registry


def check_tensors(obj, what: str = "the file", _depth: int = 0) -> None:
    """Refuse a loaded object holding a tensor larger than its storage, or over :data:`MAX_TENSOR_BYTES`.

    A tensor's bytes are ``numel × element size``; its storage must hold the
    elements its sizes and strides reach, without two indices on one element
    (a stride-0 view repeats one element as often as the file asks, and any
    arithmetic on it materialises every copy).
    """
    import torch

    if _depth > 50:
        raise AssertionError(f"{what} is nested too deeply")
    if isinstance(obj, torch.Tensor):
        size = obj.numel() * obj.element_size()
        if size > MAX_TENSOR_BYTES:
            raise AssertionError(f"{what} holds a tensor of {size / 2 ** 20:.0f} MiB: refused")
        if obj.numel() and size > obj.untyped_storage().nbytes():
            raise AssertionError(f"{what} holds a tensor of {obj.numel()} elements on a storage of "
                                 f"{obj.untyped_storage().nbytes()} bytes (strides {tuple(obj.stride())}): refused")
        return
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple, set)) else ()
    for item in items:
        check_tensors(item, what, _depth + 1)


def guard_torch_load() -> None:
    """Make ``torch.load`` in this process check what it loaded (:func:`check_tensors`); once."""
    torch = sys.modules.get("torch")
    if torch is None or getattr(torch.load, "_checked", False):
        return
    real = torch.load

    def load(f, *args, **kwargs):
        obj = real(f, *args, **kwargs)
        check_tensors(obj, "the saved file")
        return obj

    load._checked = True
    torch.load = load


class _Timeout(BaseException):
    """Raised by the alarm; a BaseException so that a check's ``except Exception`` cannot swallow it."""


def _alarm(signum, frame):
    raise _Timeout()


def run_check(fn, got: Answers, timeout: float) -> tuple[str, str]:
    """``(status, message)`` of one check on one student's answers."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        fn(got)
        return "passed", ""
    except AssertionError as exc:
        return "failed", str(exc) or "the answer is not right"
    except Flag as exc:
        return "flagged", str(exc)
    except _Timeout:
        return "error", f"checking this answer took longer than {timeout:g} s"
    except MemoryError:
        return "failed", "checking this answer needed more memory than the grader allows"
    except Exception as exc:  # noqa: BLE001 - an answer of the wrong form: a failed question
        return "failed", f"the answer has the wrong form ({type(exc).__name__}: {str(exc)[:200]})"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def serve(registry: dict, requests, reply, timeout: float) -> None:
    """Answer check requests (JSON lines from ``requests``) until end of input."""
    for line in requests:
        if len(line) > MAX_REQUEST_BYTES:
            reply({"id": None, "status": "error", "message": "request too large"})
            continue
        rid = None
        try:
            req = json.loads(line)
            rid, gid = req.get("id"), req.get("question")
            if gid not in registry:
                reply({"id": rid, "status": "error", "message": f"no check for {gid!r}"})
                continue
            if not isinstance(req.get("answers"), dict):
                raise ValueError("answers must be an object")
            got = decode_answers(req["answers"])
            got.folder = Path(req["folder"]) if req.get("folder") else None
        except Exception as exc:  # noqa: BLE001 - malformed data is the answer's problem
            reply({"id": rid, "status": "failed",
                   "message": f"the answers could not be read ({type(exc).__name__}: {str(exc)[:100]})"})
            continue
        status, message = run_check(registry[gid], got, timeout)
        reply({"id": rid, "status": status, "message": message})


# --------------------------------------------------------------------------
# The grader's side: a client for this process
# --------------------------------------------------------------------------

class ReferenceFailed(RuntimeError):
    """The reference process could not start or stopped answering."""


#: Reference processes running in this grader: killed all at once on an interrupt.
_live: "weakref.WeakSet[Reference]" = weakref.WeakSet()


def kill_live() -> None:
    """Kill every running reference process (from any thread); a waiting check then fails at once."""
    for ref in list(_live):
        proc = ref.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.kill()
            except OSError:
                pass


class Reference:
    """A running :mod:`lessonlib.grading.reference` process for one exercise (thread-safe).

    The process runs capped (:func:`lessonlib.grading.limits.capped`): ``memory_bytes``
    for it and everything it starts (a cgroup where possible), a CPU-time limit.
    """

    def __init__(self, notebook: Path, workdir: Path, start_timeout: float = 900, check_timeout: float = 30,
                 memory_bytes: int = MEMORY_BYTES):
        self.notebook, self.workdir = Path(notebook), Path(workdir)
        self.start_timeout, self.check_timeout = start_timeout, check_timeout
        self.memory_bytes = memory_bytes
        self.cgroups: list[Path] = []
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.questions: list[str] = []
        self.next_id = 0
        self.failed: ReferenceFailed | None = None  # a start that failed is not tried again
        self.log = self.workdir / f"reference-{self.notebook.stem}.log"

    def _readline(self, timeout: float) -> dict:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            tail = self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""
            self.stop()
            raise ReferenceFailed(f"the reference process for {self.notebook.name} did not answer:\n{tail}")
        try:
            return json.loads(line)
        except ValueError:  # a line cut short: the process died while writing it
            self.stop()
            raise ReferenceFailed(f"the reference process for {self.notebook.name} stopped mid-answer") from None

    def start(self) -> None:
        """Start the process unless it runs; safe to call from another thread while checks wait."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()

    def _start(self) -> None:
        if self.failed is not None:
            raise self.failed
        try:
            self._launch()
        except ReferenceFailed as exc:
            self.failed = exc
            raise

    def _launch(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cwd = Path(tempfile.mkdtemp(prefix="reference-", dir=self.workdir))
        from . import limits

        env = dict(os.environ, MPLBACKEND="agg", PYTHONDONTWRITEBYTECODE="1")
        self.cgroups = limits.new_cgroups(self.memory_bytes)
        argv = limits.capped([sys.executable, "-m", "lessonlib.grading.reference", str(self.notebook.resolve()),
                              "--check-timeout", str(self.check_timeout)],
                             memory_bytes=self.memory_bytes, cpu_seconds=24 * 3600, file_bytes=256 * 1024 ** 2,
                             cgroups=self.cgroups)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=cwd,
                                         env=env, text=True, bufsize=1)
        _live.add(self)
        hello = self._readline(self.start_timeout)
        if not hello.get("ready"):
            self.stop()
            raise ReferenceFailed(f"{self.notebook.name}: the instructor notebook did not run without its "
                                  f"solutions: {hello.get('error')}")
        self.questions = hello["questions"]

    def check(self, grade_id: str, answers: dict, folder: Path | None = None) -> tuple[str, str]:
        """``(status, message)`` for one question's handed-in ``answers``."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            self.next_id += 1
            req = {"id": self.next_id, "question": grade_id, "answers": answers,
                   "folder": str(folder) if folder else None}
            assert self.proc is not None and self.proc.stdin is not None
            try:
                self.proc.stdin.write(json.dumps(req) + "\n")
                self.proc.stdin.flush()
            except (OSError, ValueError):  # it died (a check over the memory cap, an interrupt)
                self.stop()
                raise ReferenceFailed(f"the reference process for {self.notebook.name} stopped") from None
            reply = self._readline(self.check_timeout + 30)
            if reply.get("id") != self.next_id:
                self.stop()
                raise ReferenceFailed("the reference process answered out of turn")
            return reply["status"], reply.get("message", "")

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    f and f.close()
                except OSError:
                    pass
        self.proc = None
        _live.discard(self)
        if self.cgroups:
            from .limits import remove_cgroups

            remove_cgroups(self.cgroups)
            self.cgroups = []


def main(argv=None) -> int:
    """Run one notebook as the reference process and answer the grader over the protocol; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m lessonlib.grading.reference", description=__doc__.split("\n")[0])
    p.add_argument("notebook", type=Path)
    p.add_argument("--check-timeout", type=float, default=30.0)
    a = p.parse_args(argv)
    # the protocol keeps the real stdout; everything the notebook prints goes to stderr
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(obj):
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    os.environ.setdefault("MPLBACKEND", "agg")
    try:
        registry = load(a.notebook)
    except BaseException as exc:  # noqa: BLE001 - say why, then stop
        traceback.print_exc()
        reply({"ready": False, "error": f"{type(exc).__name__}: {exc}"[:2000]})
        return 1
    guard_torch_load()  # the instructor's cells imported torch, if a check needs it
    reply({"ready": True, "questions": sorted(registry)})
    serve(registry, sys.stdin, reply, a.check_timeout)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
