"""Grading results: per question, per notebook; the score table, its CSV files and manifest.

The table and the CSV files come from the same rows (:func:`score_table`);
:func:`~lessonlib.grading.manifest.write_results` writes each file atomically, with a manifest of their
SHA-256 and of every graded submission, signed with a key kept outside the
results folder (:mod:`lessonlib.grading.manifest`, whose ``verify`` checks
them later and says what it guarantees).

One student cannot spoil the class's files: every text that reaches a file
or the printed table goes through :func:`safe_text` (a name that is not
UTF-8, a lone surrogate, shown as visible escapes) and every CSV cell through
:func:`csv_cell` (a text that a spreadsheet would run as a formula gets a
leading ``'``). Names that print alike (a control character, NFC against NFD,
the 60-character cut of the table) are flagged in the notes of both rows.
"""
from __future__ import annotations

import csv
import io
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Sequence

STATUSES = ("passed", "failed", "flagged", "error", "timeout", "not run")


@dataclass
class QuestionResult:
    """One question's grade: points out of ``max_points``, its status (one of ``STATUSES``) and why."""
    grade_id: str
    points: float
    max_points: float
    status: str  # one of STATUSES
    message: str = ""
    answer_text: str = ""  # a flagged free-text answer, for the instructor to read


@dataclass
class NotebookResult:
    """One handed-in notebook's grades, question by question, with any problem that stopped grading and its seconds."""
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


def safe_text(text) -> str:
    """``text`` as a string that any UTF-8 file or terminal takes, the original still identifiable.

    A file name that is not UTF-8 (``b"zo\\xeb"``, which Python reads as
    ``"zo\\udceb"``) becomes ``zo\\xeb``; any other lone surrogate becomes
    ``\\ud800``. Other text is unchanged.
    """
    text = str(text)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:  # surrogate escapes of a file name: the raw bytes, shown as \xNN
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # other lone surrogates: \udNNN
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def clean(text: str, limit: int = 300) -> str:
    """One line of at most ``limit`` characters, without control characters, always valid UTF-8."""
    text = re.sub(r"[\x00-\x1f\x7f]+", " ", safe_text(text)).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: First characters that make a spreadsheet read a cell as a formula (OWASP, "CSV injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value) -> str:
    """One CSV cell: numbers as numbers, text made safe and never read as a formula.

    A text that starts with ``= + - @``, a tab or a carriage return (after any
    leading spaces) gets a leading ``'``, which spreadsheets show as text.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    text = safe_text(value)
    if text.startswith(FORMULA_START) or text.lstrip(" ").startswith(FORMULA_START):
        return "'" + text
    return text


def display_name(name: str, limit: int = 60) -> str:
    """A student's name as the printed table shows it: one line, control characters as escapes."""
    text = re.sub(r"[\x00-\x1f\x7f]", lambda m: m.group(0).encode("unicode_escape").decode(), safe_text(name))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def look(name: str, limit: int = 60) -> str:
    """What a name looks like to a reader: NFKC, control characters and runs of space as one space,
    case folded, cut at ``limit`` (two names with the same look are easy to mistake)."""
    text = unicodedata.normalize("NFKC", safe_text(name))
    text = re.sub(r"[\s\x00-\x1f\x7f-\x9f\u200b-\u200f\u2060\ufeff]+", " ", text).strip().casefold()
    return text[: limit - 1]


def lookalikes(names) -> dict[str, list[str]]:
    """For each name that looks like another (see :func:`look`), the other names."""
    groups: dict[str, list[str]] = {}
    for name in dict.fromkeys(names):
        groups.setdefault(look(name), []).append(name)
    return {n: [m for m in g if m != n] for g in groups.values() if len(g) > 1 for n in g}


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
    alike = lookalikes(sorted({r.student for r in results}))
    for student in sorted({r.student for r in results}):
        mine = [r for r in results if r.student == student]
        pts = {q.grade_id: q.points for r in mine if not r.duplicate for q in r.questions}
        maxima = {q.grade_id: q.max_points for r in mine for q in r.questions}
        notes = [f"{r.path or r.exercise}: {r.problem}" for r in mine if r.problem]
        notes += [f"{q.grade_id} {q.status}: read it" for r in mine if not r.duplicate
                  for q in r.questions if q.status == "flagged"]
        if student in alike:  # the rows stay apart; a reader could take one for the other
            notes.insert(0, "name looks like another row's (" + ", ".join(repr(safe_text(o)) for o in alike[student])
                         + "): check the folder names; the CSV keeps each exact name")
        cols = [pts.get(g, "") for g in qids]
        total = sum(v for v in cols if v != "")
        rows.append([student] + cols + [total, sum(maxima.values()), _clean(" | ".join(notes), 2000)])
    return header, rows


def _fmt(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return safe_text(v)


def csv_bytes(header, rows) -> bytes:
    """The CSV file's bytes: ``header`` then ``rows``, every cell made safe with :func:`csv_cell`."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([csv_cell(h) for h in header])
    w.writerows([[csv_cell(v) for v in row] for row in rows])
    return buf.getvalue().encode("utf-8")


def details_rows(results: Sequence[NotebookResult]) -> tuple[list[str], list[list]]:
    """The header and rows of the detailed CSV: one row a question of each notebook (one for a notebook not graded)."""
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


def _aligned(cols: list[str], body: list[list[str]]) -> list[str]:
    # Not lessonlib.book.tables.table: the grader's report is plain text for a terminal and a .txt file
    # (an HTML or Markdown table would show its markup there), and grading imports nothing from the
    # course's layers, so that a grader can install and run it without the book's dependencies.
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
        lines = _aligned(header[:-1], [[display_name(row[0])] + [show(v) for v in row[1:-1]] for row in rows])
    else:
        exercise_of = {q.grade_id: r.exercise or "?" for r in results for q in r.questions}
        exercises = list(dict.fromkeys(exercise_of[q] for q in qids))
        lines = []
        for ex in exercises:
            cols = [q for q in qids if exercise_of[q] == ex]
            idx = [header.index(q) for q in cols]
            body = [[display_name(row[0])] + [show(row[j]) for j in idx]
                    + [show(float(sum(row[j] for j in idx if row[j] != "")))] for row in rows]
            lines += [ex] + _aligned(["student"] + cols + ["total"], body) + [""]
        totals = []
        for row in rows:
            per = [sum(row[header.index(q)] for q in qids if exercise_of[q] == ex and row[header.index(q)] != "")
                   for ex in exercises]
            totals.append([display_name(row[0])] + [show(float(v)) for v in per] + [show(row[-3]), show(row[-2])])
        lines += ["totals"] + _aligned(["student"] + exercises + ["total", "max"], totals)
    notes = [(row[0], row[-1]) for row in rows if row[-1]]
    if notes:
        lines.append("")
        lines += [f"{display_name(s, 80)}: {n}" for s, n in notes]
    return "\n".join(lines)

