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

import hashlib
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from . import provenance
from .graders import OTHER
from .handout import META_KEY, cell_meta, cell_source, check_cells, exercise_notebooks, student_notebook, visible_part
from .reference import Reference, ReferenceFailed
from .manifest import default_key_path, load_key, manifest_path, verify, write_results
from .results import STATUSES, NotebookResult, QuestionResult, details_rows, format_table, score_table
from .results import clean as _clean
from .runner import Runner, error_line as _error_line
from .runs import grading_folder, run_all
from .submission import (Cell, NotANotebook, Step, Submission, copy_handin, find_submissions, norm_source,
                         plan_cells, read_cells)

__all__ = ["Cell", "Exercise", "NotANotebook", "NotebookResult", "QuestionResult", "Reference", "ReferenceFailed",
           "Runner", "STATUSES", "Step", "Submission", "default_key_path", "details_rows", "find_submissions",
           "format_table", "grade_folder", "grade_notebook", "identify", "load_key", "manifest_path", "plan_cells",
           "read_cells", "score_table", "verify", "write_results"]

#: What other questions' answers may add to one check's request (the reference reads at most 1 MiB).
MAX_OTHERS_BYTES = 512 * 1024

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
    measured: dict[str, list] = field(default_factory=dict)  # grade id -> its measuring cells (provenance)

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
        ex.copy_cells = [Cell(c.cell_type, cell_source(c), None) for c in copy.cells]
        for i, c in enumerate(copy.cells):
            gid = cell_meta(c).get("grade_id")
            if gid in ex.points and cell_meta(c).get("grade"):
                ex.checks[i] = (gid, visible_part(cell_source(c)))
        ex.measured = provenance.declared(copy.cells)
        return ex

    @property
    def exercise_id(self):
        return self.source.metadata.get(META_KEY, {}).get("id")


def grade_notebook(path: Path | str, exercise: Exercise, *, student: str = "", rel: str = "",
                   sandbox=None, cell_timeout: float = 60, budget: float = 300,
                   workdir: Path | str | None = None) -> NotebookResult:
    """Grade one submitted notebook against ``exercise`` (see the module's docstring)."""
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
    # each measuring cell found unmodified hands in what it measured, with the grader's own request
    snap_at = provenance.place(steps, exercise.measured, norm_source)
    nb = new_notebook(cells=[new_code_cell(s.source + "".join(provenance.snapshot_code(g, e)
                                                              for g, e in snap_at.get(i, [])))
                             for i, s in enumerate(steps)])
    check_at = {i: s.grade_id for i, s in enumerate(steps) if s.grade_id}
    outcome: dict[str, QuestionResult] = {}
    with tempfile.TemporaryDirectory(prefix="grade-", dir=workdir) as work:
        work = Path(work)
        scratch, conn = work / "scratch", work / "conn"
        (scratch / "handin").mkdir(parents=True)
        conn.mkdir()
        runner = Runner(nb, set(check_at) | set(snap_at), scratch, conn, sandbox, cell_timeout, budget)
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
        handed = _handed_by_question(check_at, runner.handed)
        snapshots = [p for i in snap_at for p in runner.handed.get(i, [])]
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
            answers = {k: v for k, v in (payloads[0].get("answers") or {}).items() if not k.startswith(OTHER)}
            folder, why = copy_handin(scratch, ["handin", gid], work / "trusted" / gid)  # no link followed
            if why:
                outcome[gid] = QuestionResult(gid, 0.0, pts, "failed", why)
                continue
            try:  # with what the notebook handed in to its other questions: answers that must agree
                st, message = exercise.reference.check(gid, _with_others(answers, handed, gid), folder)
            except ReferenceFailed as exc:
                st, message = "error", _clean(f"the grader could not check this answer: {exc}")
            doubt = provenance.doubt(gid, exercise.measured.get(gid, []), answers, snapshots)
            if doubt and st == "passed":  # right from its numbers, but were they measured?
                st, message = "flagged", doubt
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


def _handed_by_question(check_at: Mapping[int, str], handed: Mapping[int, list]) -> dict[str, dict]:
    """What each check cell handed in to its own question (its first place, one hand-in only)."""
    found: dict[str, dict] = {}
    for i, gid in check_at.items():
        payloads = [p for p in handed.get(i, []) if isinstance(p, dict) and p.get("question") == gid
                    and isinstance(p.get("answers"), dict)]
        if gid not in found and len(payloads) == 1:
            found[gid] = {k: v for k, v in payloads[0]["answers"].items() if not k.startswith(OTHER)}
    return found


def _with_others(answers: dict, handed: Mapping[str, dict], gid: str) -> dict:
    """``answers`` with the other questions' answers as ``@grade_id`` entries (see ``graders.Answers``)."""
    out = dict(answers)
    room = MAX_OTHERS_BYTES
    for other, theirs in handed.items():
        size = len(json.dumps(theirs))
        if other != gid and size <= room:
            out[OTHER + other] = {"$dict": [[k, v] for k, v in theirs.items()]}
            room -= size
    return out


# --------------------------------------------------------------------------
# A folder of submissions
# --------------------------------------------------------------------------

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
    items = [(item, identify(item.path, exercises, exercise)) for item in find_submissions(submissions)]
    with grading_folder() as run_dir:  # removed however the run ends (SIGTERM and Ctrl-C included)
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

        def one(pair: tuple[Submission, str | None]) -> NotebookResult:
            item, stem = pair
            if stem is None:
                return NotebookResult(item.student, None, item.rel,
                                      problem="cannot tell which exercise this is (name it like the "
                                              "exercise, or pass --exercise)")
            if progress:
                with lock:
                    progress(f"grading {_clean(item.rel, 500)} as {stem} ...")
            try:
                return grade_notebook(item.path, exercises[stem], student=item.student, rel=item.rel,
                                      sandbox=box, cell_timeout=cell_timeout, budget=budget, workdir=run_dir)
            except Exception as exc:  # noqa: BLE001 - one bad submission never stops the others
                r = NotebookResult(item.student, stem, item.rel, problem=f"grader error: {_error_line(exc)}")
                r.questions = [QuestionResult(g, 0.0, p, "error", r.problem)
                               for g, p in exercises[stem].points.items()]
                return r

        # the reference processes start at once, beside the first kernels; a check waits for its own
        starter = ThreadPoolExecutor(max_workers=max(1, min(jobs, 4)))
        started = {stem: starter.submit(exercises[stem].reference.start)
                   for stem in sorted({stem for _, stem in items if stem})}
        try:
            results = run_all(one, items, jobs)  # an interrupt kills every kernel, grades no more
            # an instructor notebook that does not run without its solutions stops the run: no
            # table in which every student has an error
            for stem, future in started.items():
                future.result()
        finally:
            starter.shutdown(wait=True)
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
