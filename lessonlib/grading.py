"""Graded exercises: student copies, answer checks and an autograder.

The exercise notebooks in ``exercises/`` follow nbgrader's conventions, so a
course that uses nbgrader can take them as they are, and a course that does not
can use the small tool here instead (``python exercises/instructor.py``).

Cell conventions (nbgrader schema version 3):

* A **solution cell** holds the answer between ``### BEGIN SOLUTION`` and
  ``### END SOLUTION``; its metadata is
  ``{"nbgrader": {"solution": true, "grade": false, "locked": false, "grade_id": ...}}``.
  In a student copy the region becomes ``# YOUR CODE HERE`` and
  ``raise NotImplementedError()`` (markdown: ``YOUR ANSWER HERE``).
* A **check cell** asserts the answer; its metadata is
  ``{"nbgrader": {"grade": true, "solution": false, "locked": true,
  "grade_id": "1a-q2", "points": 2, ...}}``. Anything between
  ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS`` (the expected values)
  is removed from student copies; the visible part gives early feedback
  (type, units, order of magnitude) without giving the answer away.

Cells tagged ``instructor-only`` (the summary of results that closes each
exercise in the book, and the hidden cell that computes its numbers) are left
out of student copies.

Grading takes the student's notebook, puts the instructor's check cells back in
(by ``grade_id``: a student cannot weaken a check, and a deleted check is
restored at the end), executes it cell by cell in a fresh kernel with a per-cell
timeout and a per-notebook time budget, and gives each check cell its points if
it ran without an exception. A crash, a loop, a dead kernel or a file that is
not a notebook becomes a row in the table with a note, never a crashed grader.

The answer-check helpers (:func:`require_number`, :func:`check_one_of`,
:func:`check_close`, :func:`check_choice`, :func:`check_key_points`)
are what the check cells call; they raise ``AssertionError`` with a message
that says what was expected without giving the value away.

Nothing in this module needs torch; nbclient is imported only when grading.
"""
from __future__ import annotations

import copy
import csv
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
BEGIN_HIDDEN = "### BEGIN HIDDEN TESTS"
END_HIDDEN = "### END HIDDEN TESTS"
CODE_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
MARKDOWN_STUB = "YOUR ANSWER HERE"
#: Cells with this tag (a worked summary of the results, say) are left out of student copies.
#: nbgrader users: remove them with nbconvert's TagRemovePreprocessor before generating.
INSTRUCTOR_ONLY = "instructor-only"
META_KEY = "exercise"  # notebook-level metadata: {"id", "title", "objective", "minutes"}


# --------------------------------------------------------------------------
# Answer checks, called from check cells
# --------------------------------------------------------------------------

def _is_number(value) -> bool:
    if isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError, OverflowError):
        return False


def require_number(name: str, value, *, low: float | None = None, high: float | None = None,
                   unit: str = "", hint: str = "") -> float:
    """Assert that ``value`` is a finite number (optionally in ``[low, high]``).

    The visible part of a check: it fails on an empty answer (``None``, ``""``,
    ``...``) and on answers off by orders of magnitude, and says why.
    """
    if value is None or value is Ellipsis or (isinstance(value, str) and not value.strip()):
        raise AssertionError(f"{name} is empty: replace the stub with your answer.")
    if not _is_number(value):
        raise AssertionError(f"{name} should be a number{f' in {unit}' if unit else ''}, "
                             f"got {type(value).__name__} {value!r}.")
    x = float(value)
    if (low is not None and x < low) or (high is not None and x > high):
        rng = f"between {low:g} and {high:g}{f' {unit}' if unit else ''}"
        raise AssertionError(f"{name} = {x:g} is outside the plausible range ({rng}). {hint}".strip())
    return x


def check_close(name: str, value, expected: float, *, rel: float = 1e-6, abs_tol: float = 0.0,
                hint: str = "") -> None:
    """Assert ``value`` is within ``rel`` (relative) or ``abs_tol`` of ``expected``.

    The message says how far off the answer is, not what the answer is.
    """
    x = require_number(name, value)
    if not math.isclose(x, float(expected), rel_tol=rel, abs_tol=abs_tol):
        ratio = x / float(expected) if float(expected) else float("nan")
        raise AssertionError(
            f"{name} = {x:g} is not right (it is {ratio:.3g}× the expected value; "
            f"tolerance {rel:.0%}). {hint}".strip())


def check_one_of(name: str, value, options: Sequence[str]) -> str:
    """Assert ``value`` is one of the strings ``options`` (case-insensitive): the visible check."""
    if not isinstance(value, str) or value.strip().lower() not in [o.lower() for o in options]:
        raise AssertionError(f"{name} should be one of {list(options)}, got {value!r}.")
    return value.strip().lower()


def check_choice(name: str, value, expected: str, options: Sequence[str], *, hint: str = "") -> None:
    """Assert ``value`` (a string) is ``expected``, one of ``options`` (case-insensitive)."""
    opts = [o.lower() for o in options]
    if not isinstance(value, str) or not value.strip():
        raise AssertionError(f"{name} should be one of {list(options)}, got {value!r}.")
    v = value.strip().lower()
    if v not in opts:
        raise AssertionError(f"{name} = {value!r} is not one of {list(options)}.")
    if v != expected.lower():
        raise AssertionError(f"{name} = {value!r} is not right. {hint}".strip())


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?;])\s+|\n+", text) if s.strip()]


def key_points_found(text: str, key_points: Mapping[str, Sequence[Sequence[str]]]) -> dict[str, bool]:
    """Which key points a free-text answer makes.

    ``key_points`` maps a key point's name to a list of word groups (regular
    expressions, case-insensitive); the point counts as made when one
    sentence of ``text`` matches at least one pattern of *every* group. For
    example ``{"memory goes down": [["memory", "activation"], ["reduc", "less", "save"]]}``.
    """
    sentences = _sentences(text or "")
    found = {}
    for point, groups in key_points.items():
        found[point] = any(
            all(any(re.search(p, s, re.I) for p in group) for group in groups) for s in sentences
        )
    return found


def check_key_points(name: str, text, key_points: Mapping[str, Sequence[Sequence[str]]],
                     *, min_words: int = 8) -> None:
    """Assert a free-text answer makes every key point (see :func:`key_points_found`).

    A keyword check is a screen, not a reader: it catches missing ideas, and an
    instructor should still read the answers (the table prints them short).
    """
    if not isinstance(text, str) or not text.strip():
        raise AssertionError(f"{name} is empty: write your answer as a string.")
    words = len(text.split())
    if words < min_words:
        raise AssertionError(f"{name} has {words} words; explain in at least {min_words}.")
    found = key_points_found(text, key_points)
    missing = [p for p, ok in found.items() if not ok]
    if missing:
        raise AssertionError(f"{name} does not yet say: " + "; ".join(missing) + ".")


# --------------------------------------------------------------------------
# Cells and student copies
# --------------------------------------------------------------------------

def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def is_check_cell(cell) -> bool:
    return cell.get("cell_type") == "code" and bool(_meta(cell).get("grade"))


def is_solution_cell(cell) -> bool:
    return bool(_meta(cell).get("solution")) or BEGIN_SOLUTION in _source(cell)


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def check_cells(nb) -> list[tuple[str, float, int]]:
    """``(grade_id, points, cell index)`` of every check cell, in order."""
    return [(_meta(c)["grade_id"], float(_meta(c).get("points", 0)), i)
            for i, c in enumerate(nb.cells) if is_check_cell(c)]


def _replace_regions(source: str, begin: str, end: str, stub: str | None) -> str:
    """Replace each ``begin``..``end`` region (marker lines included) by ``stub``.

    The stub takes the indentation of the ``begin`` line; ``stub=None`` drops the
    region. Unbalanced markers raise ``ValueError``.
    """
    out, inside, indent = [], False, ""
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith(begin):
            if inside:
                raise ValueError(f"nested {begin!r}")
            inside, indent = True, line[: len(line) - len(line.lstrip())]
            if stub is not None:
                out.extend(indent + s for s in stub.splitlines())
        elif stripped.startswith(end):
            if not inside:
                raise ValueError(f"{end!r} without {begin!r}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{begin!r} without {end!r}")
    return "\n".join(out)


def student_notebook(nb):
    """A student copy of an instructor notebook: no solutions, no hidden tests, no outputs,
    and no cells tagged ``instructor-only``."""
    nb = copy.deepcopy(nb)
    nb.cells = [c for c in nb.cells if INSTRUCTOR_ONLY not in c.get("metadata", {}).get("tags", [])]
    for cell in nb.cells:
        src = _source(cell)
        if BEGIN_SOLUTION in src:
            stub = CODE_STUB if cell.cell_type == "code" else MARKDOWN_STUB
            src = _replace_regions(src, BEGIN_SOLUTION, END_SOLUTION, stub)
        if BEGIN_HIDDEN in src:
            src = _replace_regions(src, BEGIN_HIDDEN, END_HIDDEN, None)
        cell.source = src
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        # the book hides solutions and checks behind a toggle; students see all of theirs
        tags = [t for t in cell.get("metadata", {}).get("tags", []) if t not in ("hide-cell", "hide-input")]
        if "tags" in cell.get("metadata", {}):
            if tags:
                cell.metadata["tags"] = tags
            else:
                del cell.metadata["tags"]
        cell.get("metadata", {}).pop("execution", None)
    leaks = answer_leaks(nb)
    if leaks:  # pragma: no cover - student_notebook removes them all by construction
        raise ValueError("student copy still holds answers: " + "; ".join(leaks))
    return nb


def answer_leaks(nb) -> list[str]:
    """Places where a notebook still holds solutions or hidden tests (for a student copy: none)."""
    leaks = []
    for i, cell in enumerate(nb.cells):
        text = _source(cell) + json.dumps(cell.get("outputs", []))
        for marker in (BEGIN_SOLUTION, END_SOLUTION, BEGIN_HIDDEN, END_HIDDEN):
            if marker in text:
                leaks.append(f"cell {i}: {marker}")
        if cell.get("outputs"):
            leaks.append(f"cell {i}: has outputs")
    return leaks


def lint(nb, name: str = "notebook") -> list[str]:
    """Problems with an instructor notebook's grading structure (empty list: fine)."""
    problems, seen = [], set()
    meta = nb.metadata.get(META_KEY)
    if not meta or not {"id", "objective"} <= set(meta):
        problems.append(f"{name}: notebook metadata {META_KEY!r} needs 'id' and 'objective'")
    n_checks = 0
    for i, cell in enumerate(nb.cells):
        m, src = _meta(cell), _source(cell)
        gid = m.get("grade_id")
        if m:
            if m.get("schema_version") != 3:
                problems.append(f"{name} cell {i}: nbgrader schema_version should be 3")
            if not gid:
                problems.append(f"{name} cell {i}: nbgrader metadata without grade_id")
            elif gid in seen:
                problems.append(f"{name} cell {i}: duplicate grade_id {gid!r}")
            seen.add(gid)
        if BEGIN_SOLUTION in src and not m.get("solution"):
            problems.append(f"{name} cell {i}: solution markers but no nbgrader solution metadata")
        if m.get("solution") and BEGIN_SOLUTION not in src:
            problems.append(f"{name} cell {i}: solution cell without {BEGIN_SOLUTION}")
        if is_check_cell(cell):
            n_checks += 1
            if not (isinstance(m.get("points"), (int, float)) and m["points"] > 0):
                problems.append(f"{name} cell {i}: check cell {gid!r} needs points > 0")
            if BEGIN_SOLUTION in src:
                problems.append(f"{name} cell {i}: check cell holds a solution")
            header = CHECK_HEADER.match(src)
            if header and (header.group(1) != gid or float(header.group(2)) != float(m.get("points", -1))):
                problems.append(f"{name} cell {i}: first line {header.group(0)!r} disagrees with the "
                                f"metadata (grade_id {gid!r}, points {m.get('points')})")
        for b, e in ((BEGIN_SOLUTION, END_SOLUTION), (BEGIN_HIDDEN, END_HIDDEN)):
            try:
                _replace_regions(src, b, e, "")
            except ValueError as exc:
                problems.append(f"{name} cell {i}: {exc}")
    if n_checks == 0:
        problems.append(f"{name}: no check cells")
    return problems


CHECK_HEADER = re.compile(r"#\s*Check\s+(\S+)\s+\((\d+(?:\.\d+)?)\s+points?\)")


def mark(nb):
    """Give a notebook's cells their nbgrader metadata from what they say (in place).

    For authors: a code cell whose first line is ``# Check 2a-q2 (3 points)``
    becomes a check cell worth 3 points (tag ``hide-input`` for the book); a
    cell holding ``### BEGIN SOLUTION`` becomes a solution cell (tag
    ``hide-cell``) whose id follows the next check's (``2a-a2``). Returns ``nb``.
    """
    def add_tag(cell, tag):
        tags = cell.metadata.setdefault("tags", [])
        if tag not in tags:
            tags.append(tag)

    checks = []
    for i, cell in enumerate(nb.cells):
        m = CHECK_HEADER.match(_source(cell)) if cell.get("cell_type") == "code" else None
        if m:
            pts = float(m.group(2))
            cell.metadata["nbgrader"] = {"grade": True, "grade_id": m.group(1), "locked": True,
                                         "points": int(pts) if pts.is_integer() else pts,
                                         "schema_version": 3, "solution": False, "task": False}
            add_tag(cell, "hide-input")
            checks.append((i, m.group(1)))
    for i, cell in enumerate(nb.cells):
        if BEGIN_SOLUTION not in _source(cell) or _meta(cell).get("grade"):
            continue
        following = [gid for j, gid in checks if j > i]
        base = following[0] if following else f"answer-{i}"
        gid = re.sub(r"-q(\d+)$", r"-a\1", base) if re.search(r"-q\d+$", base) else base + "-answer"
        cell.metadata["nbgrader"] = {"grade": False, "grade_id": gid, "locked": False,
                                     "schema_version": 3, "solution": True, "task": False}
        add_tag(cell, "hide-cell")
    return nb


def exercise_notebooks(source_dir: Path | str) -> dict[str, Path]:
    """Instructor notebooks (those with check cells) in ``source_dir``, by file stem."""
    import nbformat

    found = {}
    for path in sorted(Path(source_dir).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        if check_cells(nb):
            found[path.stem] = path
    return found


def write_student_copies(source_dir: Path | str, out_dir: Path | str,
                         colab_base: str | None = None) -> list[Path]:
    """Write a student copy of every exercise in ``source_dir`` to ``out_dir``.

    ``colab_base`` (e.g. ``github/ORG/REPO/blob/BRANCH/student``: where you will
    push the copies) adds an ``index.md`` with an "Open in Colab" link per exercise.
    """
    import nbformat

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, lines = [], ["# Exercises", ""]
    for stem, path in exercise_notebooks(source_dir).items():
        nb = nbformat.read(path, as_version=4)
        problems = lint(nb, path.name)
        if problems:
            raise ValueError("\n".join(problems))
        dest = out / path.name
        nbformat.write(student_notebook(nb), dest)
        written.append(dest)
        title = nb.metadata.get(META_KEY, {}).get("title", stem)
        if colab_base:
            url = f"https://colab.research.google.com/{colab_base.strip('/')}/{path.name}"
            lines.append(f"- [{title}]({url})")
        else:
            lines.append(f"- {title}: `{path.name}`")
    (out / "index.md").write_text("\n".join(lines) + "\n")
    return written


# --------------------------------------------------------------------------
# Executing a submission, one cell at a time
# --------------------------------------------------------------------------

@dataclass
class QuestionResult:
    grade_id: str
    points: float
    max_points: float
    status: str  # "passed", "failed", "error", "timeout", "not run"
    message: str = ""


@dataclass
class NotebookResult:
    student: str
    exercise: str | None
    path: str
    questions: list[QuestionResult] = field(default_factory=list)
    problem: str = ""
    seconds: float = 0.0
    cells: list[tuple[int, str, str]] = field(default_factory=list)  # (index, status, message)

    @property
    def score(self) -> float:
        return sum(q.points for q in self.questions)

    @property
    def max_score(self) -> float:
        return sum(q.max_points for q in self.questions)


def _kernel_manager_class():
    """An async kernel manager whose kernel is this Python (``sys.executable``).

    Like nbval's ``--nbval-current-env``: the grader's environment, not whatever
    ``python3`` kernelspec happens to be installed.
    """
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class CurrentEnvSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name, *args, **kwargs):
            return KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                              display_name="Python 3", language="python", resource_dir="")

    class CurrentEnvKernelManager(AsyncKernelManager):
        def __init__(self, *args, **kwargs):
            kwargs["kernel_spec_manager"] = CurrentEnvSpecs()
            super().__init__(*args, **kwargs)

    return CurrentEnvKernelManager


def _error_line(exc) -> str:
    ename = getattr(exc, "ename", type(exc).__name__)
    evalue = getattr(exc, "evalue", str(exc))
    return f"{ename}: {evalue}".strip().rstrip(":")[:300]


class _Runner:
    """Run code cells one at a time; survive errors, timeouts and a dead kernel."""

    def __init__(self, nb, cwd: str, cell_timeout: float, budget: float, max_restarts: int = 5):
        self.nb, self.cwd = nb, cwd
        self.cell_timeout, self.deadline = cell_timeout, time.monotonic() + budget
        self.max_restarts, self.restarts = max_restarts, 0
        self.client = None
        self.ok_cells: list[int] = []  # cells that ran cleanly: replayed after a restart

    def _start(self):
        from nbclient import NotebookClient

        self.client = NotebookClient(
            self.nb, timeout=int(self.cell_timeout), kernel_name="python3",
            kernel_manager_class=_kernel_manager_class(), interrupt_on_timeout=False,
            allow_errors=False, resources={"metadata": {"path": self.cwd}},
            startup_timeout=60, shutdown_kernel="immediate",
        )
        self.client.km = self.client.create_kernel_manager()
        # the kernel process's own log lines (not the student's output, which comes
        # back through the kernel protocol) would only clutter the grader's table
        self.client.start_new_kernel(cwd=self.cwd, stderr=subprocess.DEVNULL)
        self.client.start_new_kernel_client()

    def stop(self):
        if self.client is not None and self.client.km is not None:
            try:
                self.client._cleanup_kernel()
            except Exception:  # noqa: BLE001 - a kernel we cannot stop cleanly is killed below
                try:
                    self.client.km.shutdown_kernel(now=True)
                except Exception:  # noqa: BLE001
                    pass
        self.client = None

    def _restart(self) -> bool:
        """A fresh kernel with the good cells replayed; False when out of restarts or time."""
        self.stop()
        if self.restarts >= self.max_restarts:
            return False
        self.restarts += 1
        try:
            self._start()
        except Exception:  # noqa: BLE001 - no kernel: the remaining cells are not run
            self.stop()
            return False
        for i in list(self.ok_cells):
            status, _ = self._execute(i, replay=True)
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
            # nbclient leaves this cell's output poller running after a timeout, and an
            # interrupt may not stop a loop inside C code: a fresh kernel is the safe way on
            return "timeout-dead", f"timed out after {self.client.timeout} s"
        except DeadKernelError:
            return "dead", "the kernel died while running this cell"
        except Exception as exc:  # noqa: BLE001 - whatever the kernel does, the grader goes on
            return "dead", f"execution failed: {_error_line(exc)}"

    def run(self, index: int) -> tuple[str, str]:
        """Execute cell ``index``: ``("ok"|"error"|"timeout"|"dead"|"not run", message)``."""
        if self.client is None:
            if self.restarts > self.max_restarts or time.monotonic() > self.deadline:
                return "not run", "kernel could not be restarted"
            return "not run", "kernel not running"
        status, msg = self._execute(index)
        if status in ("timeout-dead", "dead"):
            why = msg
            if not self._restart():
                self.stop()
                return ("timeout" if status == "timeout-dead" else "dead"), why + " (kernel not restarted)"
            return ("timeout" if status == "timeout-dead" else "dead"), why + " (kernel restarted)"
        return status, msg


def prepare_for_grading(submission, source):
    """The notebook to execute: the student's cells, with the instructor's check cells."""
    nb = copy.deepcopy(submission)
    originals = {gid: source.cells[i] for gid, _, i in check_cells(source)}
    used = set()
    for i, cell in enumerate(nb.cells):
        gid = _meta(cell).get("grade_id")
        if gid is None and cell.get("cell_type") == "code":
            # an editor that drops cell metadata keeps the check's first line: "# Check 2a-q2 (3 points)"
            m = re.match(r"#\s*Check\s+(\S+)\s+\(", _source(cell))
            gid = m.group(1) if m else None
        if cell.get("cell_type") == "code" and gid in originals and gid not in used:
            nb.cells[i] = copy.deepcopy(originals[gid])
            used.add(gid)
        elif is_check_cell(cell):  # a check the instructor does not have: not graded, not run
            cell.metadata["nbgrader"]["grade"] = False
            cell.source = "# (check cell not in the instructor's notebook: skipped)"
    for gid, cell in originals.items():
        if gid not in used:  # deleted by the student: restored at the end
            restored = copy.deepcopy(cell)
            restored.metadata["restored"] = True
            nb.cells.append(restored)
    for cell in nb.cells:
        if cell.get("cell_type") == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def grade_notebook(path: Path | str, source, *, student: str = "", exercise: str | None = None,
                   cell_timeout: float = 60, budget: float = 300) -> NotebookResult:
    """Grade one submitted notebook against the instructor notebook ``source``."""
    import nbformat

    path = Path(path)
    result = NotebookResult(student=student or path.stem, exercise=exercise, path=str(path))
    maxima = {gid: pts for gid, pts, _ in check_cells(source)}
    t0 = time.monotonic()

    def zero(status, message):
        result.questions = [QuestionResult(g, 0.0, p, status, message) for g, p in maxima.items()]

    try:
        # no strict nbformat.validate: notebooks saved by Colab or other editors often
        # break the schema in harmless ways, and that must not cost a student anything
        submission = nbformat.read(path, as_version=4)
        if not isinstance(submission.get("cells"), list):
            raise ValueError("no list of cells")
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a row, not a crash
        result.problem = f"not a readable notebook ({type(exc).__name__}: {str(exc)[:120]})"
        zero("not run", result.problem)
        return result
    nb = prepare_for_grading(submission, source)
    if any(c.metadata.get("restored") for c in nb.cells if c.get("cell_type") == "code"):
        result.problem = "check cells missing from the submission were restored at its end"
    outcome: dict[str, QuestionResult] = {}
    with tempfile.TemporaryDirectory(prefix="grade-") as cwd:
        runner = _Runner(nb, cwd, cell_timeout, budget)
        try:
            runner._start()
        except Exception as exc:  # noqa: BLE001
            result.problem = f"kernel did not start: {_error_line(exc)}"
            zero("not run", result.problem)
            return result
        notes = []
        try:
            for i, cell in enumerate(nb.cells):
                if cell.get("cell_type") != "code" or not _source(cell).strip():
                    continue
                status, msg = runner.run(i)
                result.cells.append((i, status, msg))
                if is_check_cell(cell):
                    gid = _meta(cell)["grade_id"]
                    if status == "ok":
                        outcome[gid] = QuestionResult(gid, maxima[gid], maxima[gid], "passed")
                    else:
                        st = "failed" if msg.startswith("AssertionError") else status
                        outcome[gid] = QuestionResult(gid, 0.0, maxima[gid], st, msg)
                elif status in ("timeout", "dead"):
                    notes.append(f"cell {i}: {msg}")
        finally:
            runner.stop()
    for gid, pts in maxima.items():
        outcome.setdefault(gid, QuestionResult(gid, 0.0, pts, "not run", "check cell did not run"))
    result.questions = [outcome[g] for g in maxima]
    if notes:
        result.problem = "; ".join(filter(None, [result.problem] + notes))
    result.seconds = time.monotonic() - t0
    return result


# --------------------------------------------------------------------------
# Grading a folder
# --------------------------------------------------------------------------

def _identify(path: Path, sources: Mapping[str, object], exercise: str | None) -> str | None:
    if path.stem in sources:
        return path.stem
    named = [stem for stem in sources if stem in path.name]  # "Copy of 1a-....ipynb", "1a-... (1).ipynb"
    if len(named) == 1:
        return named[0]
    try:
        import nbformat

        nb = nbformat.read(path, as_version=4)
        ex_id = nb.metadata.get(META_KEY, {}).get("id")
        for stem, src in sources.items():
            if src.metadata.get(META_KEY, {}).get("id") == ex_id and ex_id:
                return stem
        ids = {_meta(c).get("grade_id") for c in nb.cells} - {None}
        best = max(sources, key=lambda s: len(ids & {g for g, _, _ in check_cells(sources[s])}),
                   default=None)
        if best and ids & {g for g, _, _ in check_cells(sources[best])}:
            return best
    except Exception:  # noqa: BLE001 - not a notebook: fall back to --exercise
        pass
    return exercise


def find_submissions(folder: Path | str) -> list[tuple[str, Path]]:
    """``(student, path)`` pairs: ``folder/STUDENT/**/*.ipynb`` or ``folder/STUDENT.ipynb``.

    Files that are not notebooks by content but sit where one is expected
    (``*.ipynb``) are included, so they show up in the table.
    """
    folder = Path(folder)
    pairs = []
    for path in sorted(folder.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        rel = path.relative_to(folder)
        student = rel.parts[0] if len(rel.parts) > 1 else path.stem
        pairs.append((student, path))
    return pairs


def grade_folder(submissions: Path | str, source_dir: Path | str, *, exercise: str | None = None,
                 cell_timeout: float = 60, budget: float = 300, jobs: int = 1,
                 progress=print) -> list[NotebookResult]:
    """Grade every submitted notebook under ``submissions`` (see :func:`find_submissions`).

    ``jobs`` notebooks are graded at once (each in its own kernel process).
    """
    import nbformat
    from concurrent.futures import ThreadPoolExecutor

    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a whole number >= 1, got {jobs!r}")
    sources = {stem: nbformat.read(p, as_version=4) for stem, p in exercise_notebooks(source_dir).items()}
    if exercise is not None and exercise not in sources:
        raise ValueError(f"exercise must be one of {sorted(sources)}, got {exercise!r}")

    def one(item):
        student, path = item
        stem = _identify(path, sources, exercise)
        if stem is None:
            return NotebookResult(student, None, str(path),
                                  problem="cannot tell which exercise this is (name it like the exercise, "
                                          "or pass --exercise)")
        if progress:
            progress(f"grading {student}: {path.name} as {stem} ...")
        try:
            return grade_notebook(path, sources[stem], student=student, exercise=stem,
                                  cell_timeout=cell_timeout, budget=budget)
        except Exception as exc:  # noqa: BLE001 - one bad submission never stops the others
            r = NotebookResult(student, stem, str(path), problem=f"grader error: {_error_line(exc)}")
            r.questions = [QuestionResult(g, 0.0, p, "not run", r.problem)
                           for g, p, _ in check_cells(sources[stem])]
            return r

    items = find_submissions(submissions)
    if jobs == 1:
        results = [one(item) for item in items]
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(one, items))
    # a student who handed in nothing for an exercise that others handed in: zeros and a note
    assigned = [s for s in sources if any(r.exercise == s for r in results)]
    students = sorted({r.student for r in results})
    for s in students:
        have = {r.exercise for r in results if r.student == s}
        for stem in assigned:
            if stem not in have:
                r = NotebookResult(s, stem, "", problem="not handed in")
                r.questions = [QuestionResult(g, 0.0, p, "not run", "not handed in")
                               for g, p, _ in check_cells(sources[stem])]
                results.append(r)
    return results


def score_table(results: Sequence[NotebookResult]) -> tuple[list[str], list[list]]:
    """One row per student, one column per question: ``(header, rows)``."""
    qids: list[str] = []
    for r in results:
        for q in r.questions:
            if q.grade_id not in qids:
                qids.append(q.grade_id)
    qids.sort(key=lambda g: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", g)])
    header = ["student"] + qids + ["total", "max", "notes"]
    rows = []
    for student in sorted({r.student for r in results}):
        mine = [r for r in results if r.student == student]
        pts = {q.grade_id: q.points for r in mine for q in r.questions}
        # problems with a whole notebook; each question's message is in the details CSV
        notes = [f"{Path(r.path).name or r.exercise}: {r.problem}" for r in mine if r.problem]
        rows.append([student] + [pts.get(g, "") for g in qids]
                    + [sum(r.score for r in mine), sum(r.max_score for r in mine), " | ".join(notes)])
    return header, rows


def write_csv(results: Sequence[NotebookResult], path: Path | str) -> Path:
    """The score table as CSV, and the per-question details beside it (``*-details.csv``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header, rows = score_table(results)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    details = path.with_name(path.stem + "-details.csv")
    with details.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "exercise", "file", "question", "points", "max_points", "status", "message"])
        for r in results:
            if not r.questions:
                w.writerow([r.student, r.exercise or "", r.path, "", 0, 0, "not graded", r.problem])
            for q in r.questions:
                w.writerow([r.student, r.exercise or "", r.path, q.grade_id, q.points, q.max_points,
                            q.status, q.message])
    return path


def _aligned(cols: list[str], body: list[list[str]]) -> list[str]:
    widths = [max([len(c)] + [len(r[j]) for r in body]) for j, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    return lines + ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in body]


def format_table(results: Sequence[NotebookResult], max_columns: int = 12) -> str:
    """The score table as aligned text, notes below.

    One table, student × question, when it has at most ``max_columns``
    question columns; otherwise one table per exercise and a table of totals
    (the CSV always has every question in one table).
    """
    header, rows = score_table(results)
    fmt = lambda v: str(int(v) if isinstance(v, float) and v.is_integer() else v)  # noqa: E731
    qids = header[1:-3]
    if len(qids) <= max_columns:
        lines = _aligned(header[:-1], [[fmt(v) for v in row[:-1]] for row in rows])
    else:
        exercise_of = {q.grade_id: r.exercise or "?" for r in results for q in r.questions}
        exercises = list(dict.fromkeys(exercise_of[q] for q in qids))
        lines = []
        for ex in exercises:
            cols = [q for q in qids if exercise_of[q] == ex]
            idx = [header.index(q) for q in cols]
            body = [[row[0]] + [fmt(row[j]) for j in idx]
                    + [fmt(sum(row[j] for j in idx if row[j] != ""))] for row in rows]
            lines += [ex] + _aligned(["student"] + cols + ["total"], body) + [""]
        totals = []
        for row in rows:
            per = [sum(row[header.index(q)] for q in qids if exercise_of[q] == ex and row[header.index(q)] != "")
                   for ex in exercises]
            totals.append([row[0]] + [fmt(float(v)) for v in per] + [fmt(row[-3]), fmt(row[-2])])
        lines += ["totals"] + _aligned(["student"] + exercises + ["total", "max"], totals)
    notes = [(row[0], row[-1]) for row in rows if row[-1]]
    if notes:
        lines.append("")
        lines += [f"{s}: {n}" for s, n in notes]
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def main(argv: Iterable[str] | None = None, default_source: Path | str | None = None) -> int:
    import argparse

    default_source = Path(default_source or Path(__file__).resolve().parents[1] / "exercises")
    p = argparse.ArgumentParser(
        prog="python exercises/instructor.py",
        description="Student copies of the exercises, and grading of what students hand in.")
    p.add_argument("--source", type=Path, default=default_source,
                   help="folder of instructor notebooks (default: %(default)s)")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("student", help="write student copies (no solutions, no hidden tests)")
    s.add_argument("out", type=Path, help="folder to write the copies to")
    s.add_argument("--colab", metavar="PATH",
                   help="where you will publish the copies, as Colab sees it, e.g. "
                        "github/ORG/REPO/blob/main/student: writes Colab links into OUT/index.md")
    g = sub.add_parser("grade", help="grade a folder of submissions")
    g.add_argument("submissions", type=Path,
                   help="folder: SUBMISSIONS/STUDENT/EXERCISE.ipynb or SUBMISSIONS/STUDENT.ipynb")
    g.add_argument("--csv", type=Path, default=Path("grades.csv"), help="score table (default: %(default)s)")
    g.add_argument("--exercise", help="exercise stem for files that do not say which they are")
    g.add_argument("--cell-timeout", type=float, default=60, help="seconds per cell (default: %(default)s)")
    g.add_argument("--budget", type=float, default=300,
                   help="seconds per notebook in all (default: %(default)s)")
    g.add_argument("--jobs", type=int, default=1,
                   help="notebooks graded at once, one kernel each (default: %(default)s)")
    sub.add_parser("check", help="lint the instructor notebooks' grading metadata")
    mk = sub.add_parser("mark", help="set nbgrader metadata from '# Check ID (N points)' lines "
                                     "and solution markers (for authors)")
    mk.add_argument("notebooks", type=Path, nargs="+")
    a = p.parse_args(list(argv) if argv is not None else None)

    if a.command == "student":
        try:
            paths = write_student_copies(a.source, a.out, a.colab)
        except ValueError as exc:  # an instructor notebook fails the lint: say which, write nothing more
            print(f"not written:\n{exc}", file=sys.stderr)
            return 1
        for path in paths:
            print(f"wrote {path}")
        print(f"{len(paths)} student copies in {a.out} (index: {a.out / 'index.md'})")
        return 0
    if a.command == "mark":
        import nbformat

        for path in a.notebooks:
            nb = mark(nbformat.read(path, as_version=4))
            nbformat.write(nb, path)
            print(f"{path}: {len(check_cells(nb))} checks, "
                  f"{sum(1 for c in nb.cells if _meta(c).get('solution'))} solution cells")
        return 0
    if a.command == "check":
        import nbformat

        problems = []
        for stem, path in exercise_notebooks(a.source).items():
            nb = nbformat.read(path, as_version=4)
            problems += lint(nb, path.name)
            problems += [f"{path.name} (student copy): {x}" for x in answer_leaks(student_notebook(nb))]
            total = sum(p for _, p, _ in check_cells(nb))
            print(f"{path.name}: {len(check_cells(nb))} checks, {total:g} points")
        print("\n".join(problems) or "no problems")
        return 1 if problems else 0
    if not a.submissions.is_dir():
        p.error(f"{a.submissions} is not a folder")
    results = grade_folder(a.submissions, a.source, exercise=a.exercise,
                           cell_timeout=a.cell_timeout, budget=a.budget, jobs=a.jobs)
    if not results:
        print(f"no *.ipynb files under {a.submissions}", file=sys.stderr)
        return 1
    print(format_table(results))
    write_csv(results, a.csv)
    print(f"\nwrote {a.csv} and {a.csv.with_name(a.csv.stem + '-details.csv')}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
