"""Grading results: per question, per notebook; the score table, its CSV files and manifest.

The table and the CSV files come from the same rows (:func:`score_table`);
:func:`write_results` writes each file atomically, with a manifest of their
SHA-256 that :func:`verify` checks later.
"""
from __future__ import annotations

import csv
import datetime
import hashlib
import io
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

STATUSES = ("passed", "failed", "flagged", "error", "timeout", "not run")


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


def clean(text: str, limit: int = 300) -> str:
    """One line of at most ``limit`` characters, without control characters."""
    text = re.sub(r"[\x00-\x1f\x7f]+", " ", str(text)).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


_clean = clean


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

