"""Reading a submitted notebook tolerantly, and putting the instructor's checks into it.

Only each cell's type and source are used; the student's metadata never
decides anything (a grade id in it is at most a hint for finding a damaged
check cell). A cell whose metadata or source is mangled costs at most that
cell. Check cells are found by aligning the submission with the student copy
(``difflib`` on the cells' sources): a cell identical to a check's visible
part, or a check that the student edited (same place, and its grade id or
most of its text), is replaced by the instructor's check; a deleted check
is put back where it was. Every other cell is the student's and runs as it is.

Every step is bounded by the input's size: a notebook is at most
:data:`MAX_NOTEBOOK_BYTES` and :data:`MAX_CELLS` cells, and two cells' texts
are compared character by character only when their lengths could give the
ratio asked for (a 2 MB cell is never diffed against a 300-character check).
An nbformat 3 notebook is converted to version 4 and graded, with a note.

:func:`copy_handin` reads what a submission left in its hand-in folder
without following any link: every folder on the way is opened relative to
the one above it with ``O_NOFOLLOW``, so a student who replaces a folder, or a
file, with a link to a host path gets a refusal, not a host file.
"""
from __future__ import annotations

import difflib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .handout import BEGIN_HIDDEN, cell_meta, visible_part

MAX_NOTEBOOK_BYTES = 20 * 1024 ** 2
#: Most cells a submission may have (the exercises have a few dozen).
MAX_CELLS = 5000
#: Most bytes of files a check cell may hand in (a checkpoint of the exercises' small models).
MAX_HANDIN_FILES_BYTES = 64 * 1024 ** 2

class NotANotebook(Exception):
    """A file that cannot be graded as a notebook; the message says why."""


@dataclass
class Cell:
    """One cell of a handed-in notebook, as read: its type, its source, and a grade-id hint from its metadata."""
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
    notes = []
    if "worksheets" in data and "cells" not in data:
        data = _from_v3(raw.decode("utf-8"))
        notes.append("an nbformat 3 notebook, converted to version 4")
    raw_cells = data.get("cells")
    if not isinstance(raw_cells, list):
        raise NotANotebook("no list of cells")
    if len(raw_cells) > MAX_CELLS:
        raise NotANotebook(f"{len(raw_cells)} cells, more than a notebook of this course should have")
    cells = []
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
        gid = cell_meta(c).get("grade_id")
        cells.append(Cell(ctype, src, gid if isinstance(gid, str) else None))
    return cells, notes


def _from_v3(text: str) -> dict:
    """An nbformat 3 notebook (``worksheets`` of cells with ``input``) as version 4 JSON, by nbformat."""
    import nbformat

    try:
        return json.loads(json.dumps(nbformat.reads(text, as_version=4)))
    except Exception as exc:  # noqa: BLE001 - a damaged old notebook is not a notebook
        raise NotANotebook(f"an nbformat 3 notebook that could not be converted ({type(exc).__name__})") from None


def norm_source(source: str) -> str:
    """A cell's source for comparison: hidden tests (an instructor's copy) and trailing blanks left out."""
    if BEGIN_HIDDEN in source:
        try:
            source = visible_part(source)
        except ValueError:
            pass
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def _similar(a: str, b: str, at_least: float) -> bool:
    """``difflib``'s ratio of ``a`` and ``b`` is at least ``at_least``, in time bounded by the shorter text.

    The ratio is at most ``2 min / (len a + len b)``: a pair whose lengths
    cannot reach ``at_least`` is never diffed (so the work is at most quadratic
    in a few times the check's length, whatever the student's cell holds).
    """
    if not a and not b:
        return True
    if 2 * min(len(a), len(b)) < at_least * (len(a) + len(b)):
        return False
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() >= at_least


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
    key = lambda c: (c.type, norm_source(c.source))  # noqa: E731
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
                by_text = [k for k in near if _similar(norm_source(submission[k].source), norm_source(visible), 0.6)]
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
            restored = norm_source(submission[j].source) != norm_source(visible_of[gid])
            steps.append(Step(visible_of[gid], gid, restored=restored))
        elif submission[j].type == "code" and submission[j].source.strip():
            steps.append(Step(submission[j].source, origin=j + 1))
    return steps



@dataclass
class Submission:
    """One handed-in notebook: its relative path (its identity), where it lies, and the student it belongs to."""
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


# --------------------------------------------------------------------------
# Reading what a submission left behind
# --------------------------------------------------------------------------

_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def copy_handin(scratch: Path | str, parts: Sequence[str], dest: Path | str,
                max_bytes: int = MAX_HANDIN_FILES_BYTES) -> tuple[Path | None, str]:
    """Copy the regular files of the folder ``scratch/parts[0]/parts[1]/...`` to ``dest``, following no link.

    Returns ``(dest, "")``, ``(None, "")`` when the folder does not exist, or
    ``(None, why)``: a link or something else where a folder should be, or
    more than ``max_bytes`` of files. Anything in the folder that is not a
    regular file (a link, a folder, a pipe) is not copied; a file
    ``.not-a-file`` in ``dest`` names it, so that a check can see it.
    """
    for part in parts:
        if not part or part in (".", "..") or "/" in part or "\0" in part:
            raise ValueError(f"parts must be plain folder names, got {part!r}")
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(scratch, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW))
        except OSError:
            return None, "the scratch folder is not a folder"
        for part in parts:
            try:
                fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fds[-1]))
            except FileNotFoundError:
                return None, ""
            except OSError:  # ELOOP (a link), ENOTDIR (a file)
                return None, "the hand-in folder is not a folder (a link, or a file)"
        dest = Path(dest)
        dest.mkdir(parents=True)
        total, odd = 0, []
        with os.scandir(fds[-1]) as entries:
            names = sorted(e.name for e in entries)
        for name in names:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW, dir_fd=fds[-1])
            except OSError:  # a link (ELOOP), or gone
                odd.append(name)
                continue
            with os.fdopen(fd, "rb") as src:
                st = os.fstat(src.fileno())
                if not stat.S_ISREG(st.st_mode):
                    odd.append(name)
                    continue
                total += st.st_size
                if total > max_bytes:
                    return None, "the hand-in files are too large"
                data = src.read(max_bytes + 1 - (total - st.st_size))
                total += len(data) - st.st_size  # a file that grew is counted as read
                if total > max_bytes:
                    return None, "the hand-in files are too large"
            (dest / name).write_bytes(data)
        if odd:
            (dest / ".not-a-file").write_text("\n".join(odd))  # the check sees that something else was there
        return dest, ""
    finally:
        for fd in fds:
            os.close(fd)

