"""The autograder: run each submission in a sandbox, check its answers elsewhere.

For each submitted notebook:

1. **Read it tolerantly.** Only each cell's type and source are used; the
   student's metadata never decides anything (a grade id in it is at most a
   hint for finding a damaged check cell). A cell whose metadata or source
   is mangled costs at most that cell.
2. **Put the instructor's checks in.** The submission's cells are aligned
   with the student copy of the exercise (``difflib`` on the cells' sources).
   A cell identical to a check's visible part, or a check that the student
   edited (same place, and its grade id or most of its text), is replaced by
   the instructor's check; a deleted check is put back where it was. Every
   other cell is the student's and runs as it is.
3. **Run it isolated** (:mod:`lessonlib.grading.sandbox`): a fresh scratch
   folder, no instructor material, read-only system, no network, capped
   memory and time, one cell at a time with a timeout per cell and a budget
   per notebook; a stuck or dead kernel is restarted and the cells that had
   worked are replayed.
4. **Collect the answers** that each check cell hands in (plain data, one
   output of that cell only), and the files in its hand-in folder, after the
   sandbox and every process in it are gone.
5. **Check them** in the reference process of the exercise
   (:mod:`lessonlib.grading.reference`), where instructor code computed the
   expected values.

The results of a whole folder become one table, written once (CSV, details
CSV and a manifest with their SHA-256), atomically, after every kernel has
stopped; the printed table comes from the same rows.
"""
from __future__ import annotations

import ast
import csv
import datetime
import difflib
import hashlib
import io
import json
import os
import re
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from .answers import MAX_HANDIN_BYTES, MAX_LOG, TAKE
from .handout import (BEGIN_HIDDEN, META_KEY, _meta, _source, check_cells, exercise_notebooks,
                      student_notebook, visible_part)

MAX_NOTEBOOK_BYTES = 20 * 1024 ** 2
MAX_HANDIN_FILES_BYTES = 64 * 1024 ** 2
# Kernel messages the grader accepts: at most 4 MiB each (ZeroMQ drops the connection for a
# larger one, and reconnects), at most 64 queued: a flood of output costs time, not memory.
MAX_MESSAGE_BYTES = 4 * 1024 ** 2
MAX_QUEUED_MESSAGES = 64
MAX_HANDIN_LOG_BYTES = MAX_LOG * MAX_HANDIN_BYTES
STATUSES = ("passed", "failed", "flagged", "error", "timeout", "not run")


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------

@dataclass
class QuestionResult:
    grade_id: str
    points: float
    max_points: float
    status: str  # one of STATUSES
    message: str = ""
    answer_text: str = ""  # a flagged free-text answer, for the instructor to read


@dataclass
class NotebookResult:
    student: str  # the submission's folder, relative (or the file, for a file at the top)
    exercise: str | None
    path: str  # the submission's relative path: its identity
    questions: list[QuestionResult] = field(default_factory=list)
    problem: str = ""
    seconds: float = 0.0
    cells: list[tuple[int, str, str]] = field(default_factory=list)  # (index, status, message)
    duplicate: bool = False  # one of several files for the same exercise in one folder: not counted
    sha256: str = ""

    @property
    def score(self) -> float:
        return sum(q.points for q in self.questions)

    @property
    def max_score(self) -> float:
        return sum(q.max_points for q in self.questions)


def _clean(text: str, limit: int = 300) -> str:
    """One line of at most ``limit`` characters, without control characters."""
    text = re.sub(r"[\x00-\x1f\x7f]+", " ", str(text)).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --------------------------------------------------------------------------
# Reading a submission
# --------------------------------------------------------------------------

class NotANotebook(Exception):
    """A file that cannot be graded as a notebook; the message says why."""


@dataclass
class Cell:
    type: str  # "code", "markdown" or "raw"
    source: str
    hint: str | None = None  # a grade id from the cell's metadata, if any (a hint only)


def read_cells(path: Path | str) -> tuple[list[Cell], list[str]]:
    """The cells of a submitted notebook, and notes on damage that was skipped.

    Raises :class:`NotANotebook` for a link, a folder, a huge or unreadable
    file, or JSON that is not a notebook.
    """
    path = Path(path)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise NotANotebook("a symbolic link, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise NotANotebook("not a regular file")
    if st.st_size > MAX_NOTEBOOK_BYTES:
        raise NotANotebook(f"{st.st_size / 1e6:.0f} MB, larger than a notebook should be")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_NOTEBOOK_BYTES + 1)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise NotANotebook(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise NotANotebook("JSON, but not a notebook")
    if "worksheets" in data and "cells" not in data:
        raise NotANotebook("an old (nbformat 3) notebook: open and save it in Jupyter first")
    raw_cells = data.get("cells")
    if not isinstance(raw_cells, list):
        raise NotANotebook("no list of cells")
    cells, notes = [], []
    for i, c in enumerate(raw_cells):
        if not isinstance(c, dict):
            notes.append(f"cell {i} is not a cell: skipped")
            continue
        ctype = c.get("cell_type")
        if ctype not in ("code", "markdown", "raw"):
            notes.append(f"cell {i} has no valid cell_type: not run")
            ctype = "raw"
        src = c.get("source", "")
        if isinstance(src, list) and all(isinstance(s, str) for s in src):
            src = "".join(src)
        elif not isinstance(src, str):
            notes.append(f"cell {i} has a damaged source: treated as empty")
            src = ""
        gid = _meta(c).get("grade_id")
        cells.append(Cell(ctype, src, gid if isinstance(gid, str) else None))
    return cells, notes


def _norm(source: str) -> str:
    """A cell's source for comparison: hidden tests (an instructor's copy) and trailing blanks left out."""
    if BEGIN_HIDDEN in source:
        try:
            source = visible_part(source)
        except ValueError:
            pass
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


# --------------------------------------------------------------------------
# Putting the instructor's checks into a submission
# --------------------------------------------------------------------------

@dataclass
class Step:
    """One code cell to run: the student's own, or the instructor's check ``grade_id``."""
    source: str
    grade_id: str | None = None
    restored: bool = False
    origin: int | None = None  # the submission's cell index (counted from 1), if the cell is the student's


def plan_cells(student_copy: Sequence[Cell], checks: Mapping[int, tuple[str, str]],
               submission: Sequence[Cell]) -> list[Step]:
    """The code cells to run: the submission's, with the instructor's checks in place.

    ``student_copy`` are the cells of the exercise's student copy and
    ``checks`` maps the index of each of its check cells to ``(grade_id,
    visible source)``. Check cells are found by aligning the submission with
    the student copy, never from the submission's metadata alone, and a
    student's own cell is never replaced: only a cell that *is* a check (its
    text, or an edited check in the check's place with its grade id or most
    of its text) is.
    """
    key = lambda c: (c.type, _norm(c.source))  # noqa: E731
    a, b = [key(c) for c in student_copy], [key(c) for c in submission]
    replaced: dict[int, str] = {}  # submission index -> grade id
    inserted: dict[int, list[str]] = {}  # insert before submission index -> grade ids
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        for i in range(i1, i2):
            if i not in checks:
                continue
            gid, visible = checks[i]
            if tag == "equal":
                replaced[j1 + i - i1] = gid
                continue
            # an edited or deleted check: in its place, a cell with its grade id or most of its text
            j = None
            if tag == "replace":
                near = [k for k in range(j1, j2) if k not in replaced and submission[k].type == "code"]
                by_id = [k for k in near if submission[k].hint == gid]
                by_text = [k for k in near if difflib.SequenceMatcher(
                    None, _norm(submission[k].source), _norm(visible), autojunk=False).ratio() >= 0.6]
                j = (by_id or by_text or [None])[0]
            if j is not None:
                replaced[j] = gid
            else:
                inserted.setdefault(j2, []).append(gid)
    visible_of = {gid: vis for gid, vis in checks.values()}
    steps: list[Step] = []
    for j in range(len(submission) + 1):
        for gid in inserted.get(j, []):
            steps.append(Step(visible_of[gid], gid, restored=True))
        if j == len(submission):
            break
        if j in replaced:
            gid = replaced[j]
            restored = _norm(submission[j].source) != _norm(visible_of[gid])
            steps.append(Step(visible_of[gid], gid, restored=restored))
        elif submission[j].type == "code" and submission[j].source.strip():
            steps.append(Step(submission[j].source, origin=j + 1))
    return steps


# --------------------------------------------------------------------------
# The reference process of an exercise
# --------------------------------------------------------------------------

class ReferenceError_(RuntimeError):
    """The reference process could not start or stopped answering."""


class Reference:
    """A running :mod:`lessonlib.grading.reference` process for one exercise (thread-safe)."""

    def __init__(self, notebook: Path, workdir: Path, start_timeout: float = 900, check_timeout: float = 30):
        self.notebook, self.workdir = Path(notebook), Path(workdir)
        self.start_timeout, self.check_timeout = start_timeout, check_timeout
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.questions: list[str] = []
        self.next_id = 0
        self.log = self.workdir / f"reference-{self.notebook.stem}.log"

    def _readline(self, timeout: float) -> dict:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            tail = self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""
            self.stop()
            raise ReferenceError_(f"the reference process for {self.notebook.name} did not answer:\n{tail}")
        return json.loads(line)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cwd = Path(tempfile.mkdtemp(prefix="reference-", dir=self.workdir))
        env = dict(os.environ, MPLBACKEND="agg", PYTHONDONTWRITEBYTECODE="1")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lessonlib.grading.reference", str(self.notebook.resolve()),
                 "--check-timeout", str(self.check_timeout)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=cwd, env=env, text=True,
                bufsize=1)
        hello = self._readline(self.start_timeout)
        if not hello.get("ready"):
            self.stop()
            raise ReferenceError_(f"{self.notebook.name}: the instructor notebook did not run without its "
                                  f"solutions: {hello.get('error')}")
        self.questions = hello["questions"]

    def check(self, grade_id: str, answers: dict, folder: Path | None = None) -> tuple[str, str]:
        """``(status, message)`` for one question's handed-in ``answers``."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.start()
            self.next_id += 1
            req = {"id": self.next_id, "question": grade_id, "answers": answers,
                   "folder": str(folder) if folder else None}
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            reply = self._readline(self.check_timeout + 30)
            if reply.get("id") != self.next_id:
                self.stop()
                raise ReferenceError_("the reference process answered out of turn")
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


# --------------------------------------------------------------------------
# Running a notebook's cells in a (sandboxed) kernel
# --------------------------------------------------------------------------

def _error_line(exc) -> str:
    ename = getattr(exc, "ename", type(exc).__name__)
    evalue = getattr(exc, "evalue", str(exc))
    return _clean(f"{ename}: {evalue}".strip().rstrip(":"))


def _client_class():
    from jupyter_core.utils import ensure_async, run_sync
    from nbclient import NotebookClient

    class AnswerClient(NotebookClient):
        """Keeps nothing a cell prints (memory stays flat); errors come with the execute reply."""

        def output(self, outs, msg, display_id, cell_index):
            return None

        def clear_output(self, outs, msg, cell_index):
            return None

        def handle_comm_msg(self, outs, msg, cell_index):
            return None

        async def async_take(self, timeout: float) -> list | None:
            """The kernel's hand-in log (emptied), asked for on the shell channel; None if no answer."""
            msg_id = self.kc.execute("", silent=True, store_history=False, allow_stdin=False,
                                     user_expressions={"take": TAKE})
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                try:
                    reply = await ensure_async(self.kc.get_shell_msg(timeout=remaining))
                except Exception:  # noqa: BLE001 - no reply in time (queue.Empty) or a dead kernel
                    return None
                if reply.get("parent_header", {}).get("msg_id") == msg_id:
                    break
            value = reply.get("content", {}).get("user_expressions", {}).get("take", {})
            text = (value.get("data") or {}).get("text/plain") if value.get("status") == "ok" else None
            if not isinstance(text, str) or len(text) > 2 * MAX_HANDIN_LOG_BYTES:
                return None
            try:
                entries = json.loads(ast.literal_eval(text))
            except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
                return None
            return entries if isinstance(entries, list) else None

        take = run_sync(async_take)

        async def async_start_new_kernel_client(self):
            import zmq

            self.kc = self.km.client()
            # before the channels connect: the limits apply to new sockets
            self.kc.context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            self.kc.context.setsockopt(zmq.RCVHWM, MAX_QUEUED_MESSAGES)
            try:
                await ensure_async(self.kc.start_channels())
                await ensure_async(self.kc.wait_for_ready(timeout=self.startup_timeout))
            except Exception:
                await self._async_cleanup_kernel()
                raise
            self.kc.allow_stdin = False
            return self.kc

        start_new_kernel_client = run_sync(async_start_new_kernel_client)

    return AnswerClient


def _kernel_manager(argv: list[str], conn: Path):
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class Specs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name, *args, **kwargs):
            return KernelSpec(argv=argv, display_name="Python 3", language="python", resource_dir="")

    km = AsyncKernelManager(kernel_spec_manager=Specs(), kernel_name="python3", transport="ipc",
                            ip=str(conn / "k"))
    km.connection_file = str(conn / "kernel.json")
    return km


class Runner:
    """Run code cells one at a time; survive errors, timeouts and a dead kernel."""

    def __init__(self, nb, check_indices: set, scratch: Path, conn: Path, sandbox, cell_timeout: float,
                 budget: float, max_restarts: int = 5):
        self.nb, self.check_indices = nb, check_indices
        self.scratch, self.conn, self.sandbox = scratch, conn, sandbox
        self.cell_timeout, self.deadline = cell_timeout, time.monotonic() + budget
        self.max_restarts, self.restarts = max_restarts, 0
        self.client = None
        self.proc = None  # the kernel's process (bwrap, when sandboxed)
        self.handed: dict[int, list] = {}
        self.ok_cells: list[int] = []  # cells that ran cleanly: replayed after a restart

    def _argv(self) -> list[str]:
        kernel = [sys.executable, "-m", "lessonlib.grading.kernel", "-f", "{connection_file}",
                  "--IPKernelApp.parent_handle=0"]
        if self.sandbox is None:
            return kernel
        return self.sandbox.command(kernel, self.scratch, shared=self.conn)

    def start(self):
        Client = _client_class()
        self.client = Client(self.nb, timeout=int(self.cell_timeout), kernel_name="python3",
                             interrupt_on_timeout=False, allow_errors=False, startup_timeout=60,
                             shutdown_kernel="immediate", iopub_timeout=4)
        self.client.km = _kernel_manager(self._argv(), self.conn)
        kwargs = {}
        if self.sandbox is None:  # no sandbox: the kernel still gets its own folder and hand-in folder
            kwargs["env"] = dict(os.environ, LESSONLIB_HANDIN=str(self.scratch / "handin"), MPLBACKEND="agg",
                                 HOME=str(self.scratch))
        self.client.start_new_kernel(cwd=str(self.scratch), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     **kwargs)
        self.proc = getattr(self.client.km.provisioner, "process", None)
        self.client.start_new_kernel_client()

    def stop(self):
        """Kill the kernel (and with it the sandbox and every process in it) and wait for it."""
        client, self.client = self.client, None
        proc, self.proc = self.proc, None
        if client is not None and client.km is not None:
            self._shutdown(client)
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            proc.wait()

    @staticmethod
    def _shutdown(client):
        try:
            client._cleanup_kernel()
        except Exception:  # noqa: BLE001 - a kernel we cannot stop cleanly is killed below
            pass
        km = client.km
        try:
            if km.has_kernel:
                from jupyter_core.utils import run_sync

                run_sync(km.shutdown_kernel)(now=True)
        except Exception:  # noqa: BLE001
            pass

    def _restart(self) -> bool:
        self.stop()
        if self.restarts >= self.max_restarts:
            return False
        self.restarts += 1
        try:
            self.start()
        except Exception:  # noqa: BLE001 - no kernel: the remaining cells are not run
            self.stop()
            return False
        for i in list(self.ok_cells):  # a replayed check cell hands in again: the log is emptied
            status, _ = self._execute(i, replay=True)  # before the next check, so it does not count
            if status != "ok":
                return False
        return True

    def _execute(self, index: int, replay: bool = False) -> tuple[str, str]:
        from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

        remaining = self.deadline - time.monotonic()
        if remaining <= 1:
            return "not run", "time budget for the notebook used up"
        self.client.timeout = int(max(1, min(self.cell_timeout, remaining)))
        cell = self.nb.cells[index]
        try:
            self.client.execute_cell(cell, index)
            if not replay:
                self.ok_cells.append(index)
            return "ok", ""
        except CellExecutionError as exc:
            return "error", _error_line(exc)
        except CellTimeoutError:
            return "timeout-dead", f"timed out after {self.client.timeout} s"
        except DeadKernelError:
            return "dead", "the kernel died while running this cell"
        except Exception as exc:  # noqa: BLE001 - whatever the kernel does, the grader goes on
            return "dead", f"execution failed: {_error_line(exc)}"

    def run(self, index: int) -> tuple[str, str]:
        """Execute cell ``index``: ``("ok"|"error"|"timeout"|"dead"|"not run", message)``.

        Around a check cell, the kernel's hand-in log is emptied before and read
        after (:attr:`handed`), through the grader's own requests.
        """
        if self.client is None:
            return "not run", "kernel could not be restarted"
        check = index in self.check_indices
        if check and self.client.take(10) is None:
            return "dead", "the kernel does not answer the grader"
        status, msg = self._execute(index)
        if check and status in ("ok", "error"):
            self.handed[index] = self.client.take(10) or []
        if status in ("timeout-dead", "dead"):
            final = "timeout" if status == "timeout-dead" else "dead"
            if not self._restart():
                self.stop()
                return final, msg + " (kernel not restarted)"
            return final, msg + " (kernel restarted)"
        return status, msg


# --------------------------------------------------------------------------
# One exercise, one submission
# --------------------------------------------------------------------------

@dataclass
class Exercise:
    """An instructor notebook prepared for grading."""
    stem: str
    path: Path
    source: object  # the nbformat notebook
    copy_cells: list[Cell] = field(default_factory=list)  # the student copy's cells
    checks: dict[int, tuple[str, str]] = field(default_factory=dict)  # copy index -> (grade id, visible source)
    points: dict[str, float] = field(default_factory=dict)
    reference: Reference | None = None

    @classmethod
    def load(cls, path: Path | str) -> "Exercise":
        import nbformat

        path = Path(path)
        return cls.load_notebook(nbformat.read(path, as_version=4), path)

    @classmethod
    def load_notebook(cls, nb, path: Path | str = "exercise.ipynb") -> "Exercise":
        path = Path(path)
        ex = cls(path.stem, path, nb)
        ex.points = {gid: pts for gid, pts, _ in check_cells(nb)}
        copy = student_notebook(nb)
        ex.copy_cells = [Cell(c.cell_type, _source(c), None) for c in copy.cells]
        for i, c in enumerate(copy.cells):
            gid = _meta(c).get("grade_id")
            if gid in ex.points and _meta(c).get("grade"):
                ex.checks[i] = (gid, visible_part(_source(c)))
        return ex

    @property
    def exercise_id(self):
        return self.source.metadata.get(META_KEY, {}).get("id")


def _copy_handin(folder: Path, dest: Path) -> tuple[Path | None, str]:
    """Copy a hand-in folder's regular files to ``dest`` (no links, size-capped)."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return None, ""
    if not stat.S_ISDIR(st.st_mode):
        return None, "the hand-in folder is not a folder"
    dest.mkdir(parents=True)
    total = 0
    for entry in os.scandir(folder):
        est = entry.stat(follow_symlinks=False)
        if not stat.S_ISREG(est.st_mode):
            (dest / ".not-a-file").write_text(entry.name)  # the check sees that something else was there
            continue
        total += est.st_size
        if total > MAX_HANDIN_FILES_BYTES:
            return None, "the hand-in files are too large"
        fd = os.open(entry.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as src, open(dest / entry.name, "wb") as out:
            shutil.copyfileobj(src, out)
    return dest, ""


def grade_notebook(path: Path | str, exercise: Exercise, *, student: str = "", rel: str = "",
                   sandbox=None, cell_timeout: float = 60, budget: float = 300,
                   workdir: Path | str | None = None) -> NotebookResult:
    """Grade one submitted notebook against ``exercise`` (see the module's docstring)."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    path = Path(path)
    rel = rel or path.name
    result = NotebookResult(student=student or rel, exercise=exercise.stem, path=rel)
    t0 = time.monotonic()

    def zero(status, message):
        result.questions = [QuestionResult(g, 0.0, p, status, message) for g, p in exercise.points.items()]

    try:
        cells, notes = read_cells(path)
        result.sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    except (NotANotebook, OSError) as exc:
        result.problem = f"not a readable notebook: {exc}"
        zero("not run", result.problem)
        return result
    steps = plan_cells(exercise.copy_cells, exercise.checks, cells)
    restored = [s.grade_id for s in steps if s.restored]
    if restored:
        notes.append("check cells missing or edited, restored: " + ", ".join(restored))
    nb = new_notebook(cells=[new_code_cell(s.source) for s in steps])
    check_at = {i: s.grade_id for i, s in enumerate(steps) if s.grade_id}
    outcome: dict[str, QuestionResult] = {}
    with tempfile.TemporaryDirectory(prefix="grade-", dir=workdir) as work:
        work = Path(work)
        scratch, conn = work / "scratch", work / "conn"
        (scratch / "handin").mkdir(parents=True)
        conn.mkdir()
        runner = Runner(nb, set(check_at), scratch, conn, sandbox, cell_timeout, budget)
        cell_status: dict[int, tuple[str, str]] = {}
        try:
            try:
                runner.start()
            except Exception as exc:  # noqa: BLE001
                result.problem = f"kernel did not start: {_error_line(exc)}"
                zero("not run", result.problem)
                return result
            for i in range(len(nb.cells)):
                status, msg = runner.run(i)
                cell_status[i] = (status, msg)
                result.cells.append((i, status, msg))
                if i not in check_at and status in ("timeout", "dead"):
                    notes.append(f"cell {steps[i].origin} of the notebook: {msg}")
        finally:
            runner.stop()  # the sandbox and every process in it are gone after this
        # only now, with nothing of the submission running, read what it handed in
        for i, gid in check_at.items():
            pts = exercise.points[gid]
            if gid in outcome:
                continue  # a check that appears twice counts once, at its first place
            status, msg = cell_status.get(i, ("not run", "not reached"))
            payloads = [p for p in runner.handed.get(i, []) if isinstance(p, dict) and p.get("question") == gid
                        and isinstance(p.get("answers"), dict)]
            if len(payloads) > 1:
                outcome[gid] = QuestionResult(gid, 0.0, pts, "flagged",
                                              "handed in more than once by one check cell: read the notebook")
                continue
            if not payloads:
                st = {"ok": "failed", "error": "failed", "timeout": "timeout", "dead": "error"}.get(status, status)
                outcome[gid] = QuestionResult(gid, 0.0, pts, st, _clean(msg or "no answer handed in"))
                continue
            answers = payloads[0].get("answers")
            folder, why = _copy_handin(scratch / "handin" / gid, work / "trusted" / gid)
            if why:
                outcome[gid] = QuestionResult(gid, 0.0, pts, "failed", why)
                continue
            try:
                st, message = exercise.reference.check(gid, answers, folder)
            except ReferenceError_ as exc:
                st, message = "error", _clean(f"the grader could not check this answer: {exc}")
            q = QuestionResult(gid, pts if st == "passed" else 0.0, pts, st, _clean(message, 500))
            if st == "flagged":
                texts = [v for v in (answers or {}).values() if isinstance(v, str)]
                q.answer_text = _clean(" / ".join(texts), 2000)
            outcome[gid] = q
    for gid, pts in exercise.points.items():
        outcome.setdefault(gid, QuestionResult(gid, 0.0, pts, "not run", "check cell did not run"))
    result.questions = [outcome[g] for g in exercise.points]
    result.problem = "; ".join(_clean(n, 200) for n in notes)
    result.seconds = time.monotonic() - t0
    return result


# --------------------------------------------------------------------------
# A folder of submissions
# --------------------------------------------------------------------------

@dataclass
class Submission:
    rel: str  # relative path, with "/" separators: the identity of the submission
    path: Path
    student: str


def find_submissions(folder: Path | str) -> list[Submission]:
    """Every ``*.ipynb`` under ``folder`` (links not followed), with its student.

    The student is the folder that holds the notebook, as a relative path
    (``ada``, ``section-1/ada``), or, for a notebook directly in ``folder``,
    the file's name (``bob.ipynb``): a file ``bob.ipynb`` and a folder
    ``bob/`` are two students, and two nested folders are never merged.
    """
    folder = Path(folder)
    found = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != ".ipynb_checkpoints")
        for name in sorted(files):
            if not name.endswith(".ipynb"):
                continue
            path = Path(root) / name
            rel = path.relative_to(folder).as_posix()
            parent = Path(rel).parent.as_posix()
            found.append(Submission(rel, path, rel if parent == "." else parent))
    return found


def identify(path: Path, exercises: Mapping[str, Exercise], exercise: str | None) -> str | None:
    """Which exercise a file is: by its name, then by the ids inside it, then ``exercise``."""
    if path.stem in exercises:
        return path.stem
    named = [stem for stem in exercises if stem in path.name]  # "Copy of 1a-....ipynb", "1a-... (1).ipynb"
    if len(named) == 1:
        return named[0]
    if exercise is not None:
        return exercise
    try:
        cells, _ = read_cells(path)
        raw = json.loads(path.read_bytes().decode("utf-8"))
        ex_id = (raw.get("metadata") or {}).get(META_KEY, {}).get("id") if isinstance(raw, dict) else None
    except Exception:  # noqa: BLE001 - not a notebook: no exercise
        return None
    for stem, ex in exercises.items():
        if ex_id and ex.exercise_id == ex_id:
            return stem
    hints = {c.hint for c in cells} - {None}
    best = max(exercises, key=lambda s: len(hints & set(exercises[s].points)), default=None)
    return best if best and hints & set(exercises[best].points) else None


def grade_folder(submissions: Path | str, source_dir: Path | str, *, exercise: str | None = None,
                 cell_timeout: float = 60, budget: float = 300, jobs: int = 1, sandbox="auto",
                 memory_bytes: int = 2 * 1024 ** 3, progress=print) -> list[NotebookResult]:
    """Grade every notebook under ``submissions`` (see :func:`find_submissions`).

    ``sandbox``: ``"auto"`` (bubblewrap, required), ``None`` (no isolation:
    only inside a container you throw away), or a ready
    :class:`~lessonlib.grading.sandbox.Sandbox`. ``jobs`` notebooks are graded
    at once, each in its own kernel. Returns after every kernel has stopped.
    """
    from concurrent.futures import ThreadPoolExecutor

    from . import sandbox as sb

    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a whole number >= 1, got {jobs!r}")
    for name, value in (("cell_timeout", cell_timeout), ("budget", budget)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    exercises = {stem: Exercise.load(p) for stem, p in exercise_notebooks(source_dir).items()}
    if not exercises:
        raise ValueError(f"no exercise notebooks (with check cells) in {source_dir}")
    if exercise is not None and exercise not in exercises:
        raise ValueError(f"exercise must be one of {sorted(exercises)}, got {exercise!r}")
    items = find_submissions(submissions)
    with tempfile.TemporaryDirectory(prefix="lessonlib-grading-") as run_dir:
        run_dir = Path(run_dir)
        box = sandbox
        if sandbox == "auto":
            (run_dir / "runtime").mkdir()
            sb.plain_lessonlib(run_dir / "runtime")
            threads = max(1, (os.cpu_count() or 1) // jobs)
            box = sb.Sandbox(runtime=run_dir / "runtime", memory_bytes=memory_bytes, threads=threads,
                             cpu_seconds=int(budget * 2 + 120),
                             protected=[Path(source_dir), Path(submissions)])
        for ex in exercises.values():
            ex.reference = Reference(ex.path, run_dir / "reference")
        lock = threading.Lock()

        def one(item: Submission) -> NotebookResult:
            stem = identify(item.path, exercises, exercise)
            if stem is None:
                return NotebookResult(item.student, None, item.rel,
                                      problem="cannot tell which exercise this is (name it like the "
                                              "exercise, or pass --exercise)")
            if progress:
                with lock:
                    progress(f"grading {item.rel} as {stem} ...")
            try:
                return grade_notebook(item.path, exercises[stem], student=item.student, rel=item.rel,
                                      sandbox=box, cell_timeout=cell_timeout, budget=budget, workdir=run_dir)
            except Exception as exc:  # noqa: BLE001 - one bad submission never stops the others
                r = NotebookResult(item.student, stem, item.rel, problem=f"grader error: {_error_line(exc)}")
                r.questions = [QuestionResult(g, 0.0, p, "error", r.problem)
                               for g, p in exercises[stem].points.items()]
                return r

        try:
            if jobs == 1:
                results = [one(item) for item in items]
            else:
                with ThreadPoolExecutor(max_workers=jobs) as pool:
                    results = list(pool.map(one, items))
        finally:
            for ex in exercises.values():
                ex.reference.stop()
    _mark_duplicates(results)
    # a student who handed in nothing for an exercise that others handed in: zeros and a note
    assigned = [s for s in exercises if any(r.exercise == s for r in results)]
    for student in sorted({r.student for r in results}):
        have = {r.exercise for r in results if r.student == student}
        for stem in assigned:
            if stem not in have:
                r = NotebookResult(student, stem, "", problem=f"{stem} not handed in")
                r.questions = [QuestionResult(g, 0.0, p, "not run", "not handed in")
                               for g, p in exercises[stem].points.items()]
                results.append(r)
    return results


def _mark_duplicates(results: list[NotebookResult]) -> None:
    groups: dict[tuple, list[NotebookResult]] = {}
    for r in results:
        if r.exercise:
            groups.setdefault((r.student, r.exercise), []).append(r)
    for (student, stem), rs in groups.items():
        if len(rs) > 1:
            names = ", ".join(r.path for r in rs)
            for r in rs:
                r.duplicate = True
                r.problem = "; ".join(filter(None, [r.problem, f"{len(rs)} files for {stem} ({names}): "
                                                               f"none counted, keep one and grade again"]))


# --------------------------------------------------------------------------
# The table, the CSV files and the manifest
# --------------------------------------------------------------------------

def _natural(g: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", g)]


def score_table(results: Sequence[NotebookResult]) -> tuple[list[str], list[list]]:
    """One row per student, one column per question: ``(header, rows)``.

    A duplicate submission's questions stay blank (and count zero); the
    total is the sum of the row's columns, and ``max`` what the student could
    have scored on the exercises in the table.
    """
    qids = sorted({q.grade_id for r in results for q in r.questions}, key=_natural)
    header = ["student"] + qids + ["total", "max", "notes"]
    rows = []
    for student in sorted({r.student for r in results}):
        mine = [r for r in results if r.student == student]
        pts = {q.grade_id: q.points for r in mine if not r.duplicate for q in r.questions}
        maxima = {q.grade_id: q.max_points for r in mine for q in r.questions}
        notes = [f"{r.path or r.exercise}: {r.problem}" for r in mine if r.problem]
        notes += [f"{q.grade_id} {q.status}: read it" for r in mine if not r.duplicate
                  for q in r.questions if q.status == "flagged"]
        cols = [pts.get(g, "") for g in qids]
        total = sum(v for v in cols if v != "")
        rows.append([student] + cols + [total, sum(maxima.values()), _clean(" | ".join(notes), 2000)])
    return header, rows


def _fmt(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _csv_bytes(header, rows) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows([[_fmt(v) for v in row] for row in rows])
    return buf.getvalue().encode("utf-8")


def details_rows(results: Sequence[NotebookResult]) -> tuple[list[str], list[list]]:
    header = ["student", "exercise", "file", "question", "points", "max_points", "status", "message",
              "counted", "answer_to_read"]
    rows = []
    for r in sorted(results, key=lambda r: (r.student, r.exercise or "", r.path)):
        if not r.questions:
            rows.append([r.student, r.exercise or "", r.path, "", 0, 0, "not graded", r.problem, "no", ""])
        for q in r.questions:
            rows.append([r.student, r.exercise or "", r.path, q.grade_id, q.points, q.max_points, q.status,
                         q.message, "no" if r.duplicate else "yes", q.answer_text])
    return header, rows


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def manifest_path(csv_path: Path | str) -> Path:
    csv_path = Path(csv_path)
    return csv_path.with_name(csv_path.stem + "-manifest.json")


def write_results(results: Sequence[NotebookResult], csv_path: Path | str) -> dict:
    """Write the score table, its details and a manifest, each atomically; return the manifest.

    ``grades.csv`` (one row per student), ``grades-details.csv`` (one row per
    file and question) and ``grades-manifest.json`` (the SHA-256 of both CSV
    files and of every graded submission). :func:`verify` checks them later.
    """
    import lessonlib

    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    details = csv_path.with_name(csv_path.stem + "-details.csv")
    table = _csv_bytes(*score_table(results))
    detail = _csv_bytes(*details_rows(results))
    manifest = {
        "files": {csv_path.name: hashlib.sha256(table).hexdigest(),
                  details.name: hashlib.sha256(detail).hexdigest()},
        "submissions": {r.path: r.sha256 for r in results if r.path},
        "students": len({r.student for r in results}),
        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "lessonlib": lessonlib.__version__,
    }
    _atomic_write(csv_path, table)
    _atomic_write(details, detail)
    _atomic_write(manifest_path(csv_path), (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    return manifest


def verify(csv_path: Path | str) -> list[str]:
    """Differences between the CSV files and their manifest (empty list: they match)."""
    csv_path = Path(csv_path)
    try:
        manifest = json.loads(manifest_path(csv_path).read_text())
    except (OSError, ValueError) as exc:
        return [f"no readable manifest beside {csv_path.name}: {exc}"]
    problems = []
    for name, digest in manifest.get("files", {}).items():
        p = csv_path.with_name(name)
        if not p.exists():
            problems.append(f"{name} is missing")
        elif hashlib.sha256(p.read_bytes()).hexdigest() != digest:
            problems.append(f"{name} was changed after grading (SHA-256 differs from the manifest)")
    return problems


def _aligned(cols: list[str], body: list[list[str]]) -> list[str]:
    widths = [max([len(c)] + [len(r[j]) for r in body]) for j, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    return lines + ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in body]


def format_table(results: Sequence[NotebookResult], max_columns: int = 12) -> str:
    """The score table as aligned text (the same rows as the CSV), notes below.

    One table, student × question, when it has at most ``max_columns``
    question columns; otherwise one table per exercise and a table of totals.
    """
    header, rows = score_table(results)
    qids = header[1:-3]
    show = lambda v: _clean(_fmt(v), 60)  # noqa: E731 - odd file names stay on one line
    if len(qids) <= max_columns:
        lines = _aligned(header[:-1], [[show(v) for v in row[:-1]] for row in rows])
    else:
        exercise_of = {q.grade_id: r.exercise or "?" for r in results for q in r.questions}
        exercises = list(dict.fromkeys(exercise_of[q] for q in qids))
        lines = []
        for ex in exercises:
            cols = [q for q in qids if exercise_of[q] == ex]
            idx = [header.index(q) for q in cols]
            body = [[show(row[0])] + [show(row[j]) for j in idx]
                    + [show(float(sum(row[j] for j in idx if row[j] != "")))] for row in rows]
            lines += [ex] + _aligned(["student"] + cols + ["total"], body) + [""]
        totals = []
        for row in rows:
            per = [sum(row[header.index(q)] for q in qids if exercise_of[q] == ex and row[header.index(q)] != "")
                   for ex in exercises]
            totals.append([show(row[0])] + [show(float(v)) for v in per] + [show(row[-3]), show(row[-2])])
        lines += ["totals"] + _aligned(["student"] + exercises + ["total", "max"], totals)
    notes = [(row[0], row[-1]) for row in rows if row[-1]]
    if notes:
        lines.append("")
        lines += [f"{_clean(s, 80)}: {n}" for s, n in notes]
    return "\n".join(lines)
