"""Reading a submitted notebook tolerantly, and putting the instructor's checks into it.

Only each cell's type and source are used; the student's metadata never
decides anything (a grade id in it is at most a hint for finding a damaged
check cell). A cell whose metadata or source is mangled costs at most that
cell. Check cells are found by aligning the submission with the student copy
(``difflib`` on the cells' sources): a cell identical to a check's visible
part, or a check that the student edited (same place, and its grade id or
most of its text), is replaced by the instructor's check; a deleted check
is put back where it was. Every other cell is the student's and runs as it is.
"""
from __future__ import annotations

import difflib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .handout import BEGIN_HIDDEN, _meta, visible_part

MAX_NOTEBOOK_BYTES = 20 * 1024 ** 2

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
            notes.append(f"cell {i + 1} is not a cell: skipped")
            continue
        ctype = c.get("cell_type")
        if ctype not in ("code", "markdown", "raw"):
            notes.append(f"cell {i + 1} has no valid cell_type: not run")
            ctype = "raw"
        src = c.get("source", "")
        if isinstance(src, list) and all(isinstance(s, str) for s in src):
            src = "".join(src)
        elif not isinstance(src, str):
            notes.append(f"cell {i + 1} has a damaged source: treated as empty")
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
