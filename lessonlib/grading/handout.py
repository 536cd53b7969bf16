"""Exercise notebooks: cell conventions, student copies, and the authors' lint.

The exercise notebooks follow nbgrader's conventions (schema version 3):

* A **solution cell** holds the answer between ``### BEGIN SOLUTION`` and
  ``### END SOLUTION``; its metadata is
  ``{"nbgrader": {"solution": true, "grade": false, "locked": false, "grade_id": ...}}``.
  In a student copy the region becomes ``# YOUR CODE HERE`` and
  ``raise NotImplementedError()`` (markdown: ``YOUR ANSWER HERE``).
* A **check cell** starts with ``# Check 1a-q2 (2 points)``; its metadata is
  ``{"nbgrader": {"grade": true, "solution": false, "locked": true,
  "grade_id": "1a-q2", "points": 2, ...}}``. Its visible part hands the
  answers in (``hand_in("1a-q2", x=x)``) and checks their shape; its hidden
  part (between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``)
  computes the expected values and registers ``@grader("1a-q2")``. The hidden
  part is removed from student copies.

Cells tagged ``instructor-only`` (the summary of results that closes each
exercise in the book, and the hidden cell that computes its numbers) are left
out of student copies (nbgrader: ``nbgrader_config.py`` removes them too).

Only :func:`write_student_copies` and :func:`exercise_notebooks` need nbformat.
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
BEGIN_HIDDEN = "### BEGIN HIDDEN TESTS"
END_HIDDEN = "### END HIDDEN TESTS"
CODE_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
MARKDOWN_STUB = "YOUR ANSWER HERE"
#: Cells with this tag (a worked summary of the results, say) are left out of student copies.
#: nbgrader: ``nbgrader_config.py`` removes them with nbconvert's TagRemovePreprocessor.
INSTRUCTOR_ONLY = "instructor-only"
META_KEY = "exercise"  # notebook-level metadata: {"id", "title", "objective", "minutes"}


def cell_meta(cell) -> dict:
    """A cell's nbgrader metadata, or ``{}`` when it is missing or damaged."""
    meta = cell.get("metadata") if isinstance(cell, dict) else None
    nbg = meta.get("nbgrader") if isinstance(meta, dict) else None
    return nbg if isinstance(nbg, dict) else {}


def is_check_cell(cell) -> bool:
    """Whether ``cell`` (a notebook cell's dict) is a graded check cell."""
    return cell.get("cell_type") == "code" and bool(cell_meta(cell).get("grade"))


def is_solution_cell(cell) -> bool:
    """Whether ``cell`` (a notebook cell's dict) holds a solution that a student copy must not show."""
    return bool(cell_meta(cell).get("solution")) or BEGIN_SOLUTION in cell_source(cell)


def cell_source(cell) -> str:
    """A cell's source as one string, or ``""`` when it is missing or damaged."""
    src = cell.get("source", "") if isinstance(cell, dict) else ""
    if isinstance(src, list):
        return "".join(s for s in src if isinstance(s, str))
    return src if isinstance(src, str) else ""


def hidden_part(source: str) -> str:
    """The code between the hidden-test markers of a check cell (markers excluded)."""
    out, inside = [], False
    for line in source.splitlines():
        if line.strip().startswith(BEGIN_HIDDEN):
            inside = True
        elif line.strip().startswith(END_HIDDEN):
            inside = False
        elif inside:
            out.append(line)
    return "\n".join(out)


def visible_part(source: str) -> str:
    """A check cell as a student copy shows it: without its hidden tests."""
    return _replace_regions(source, BEGIN_HIDDEN, END_HIDDEN, None)


def check_cells(nb) -> list[tuple[str, float, int]]:
    """``(grade_id, points, cell index)`` of every check cell, in order."""
    return [(cell_meta(c)["grade_id"], float(cell_meta(c).get("points", 0)), i)
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
        src = cell_source(cell)
        if BEGIN_SOLUTION in src:
            stub = CODE_STUB if cell.cell_type == "code" else MARKDOWN_STUB
            src = _replace_regions(src, BEGIN_SOLUTION, END_SOLUTION, stub)
        _set_without_hidden_tests_or_outputs(cell, src)
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
        text = cell_source(cell) + json.dumps(cell.get("outputs", []))
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
        m, src = cell_meta(cell), cell_source(cell)
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
            if gid and not re.search(r"hand_in\(\s*['\"]" + re.escape(gid) + r"['\"]", visible_part_safe(src)):
                problems.append(f"{name} cell {i}: check cell {gid!r} does not hand_in({gid!r}, ...) "
                                f"in its visible part")
            if gid and not re.search(r"@grader\(\s*['\"]" + re.escape(gid) + r"['\"]\s*\)", hidden_part(src)):
                problems.append(f"{name} cell {i}: check cell {gid!r} registers no @grader({gid!r}) "
                                f"between the hidden-test markers")
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


def visible_part_safe(source: str) -> str:
    """The part of a check cell students see, or the whole ``source`` when its markers cannot be read."""
    try:
        return visible_part(source)
    except ValueError:
        return source


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
        m = CHECK_HEADER.match(cell_source(cell)) if cell.get("cell_type") == "code" else None
        if m:
            pts = float(m.group(2))
            cell.metadata["nbgrader"] = {"grade": True, "grade_id": m.group(1), "locked": True,
                                         "points": int(pts) if pts.is_integer() else pts,
                                         "schema_version": 3, "solution": False, "task": False}
            add_tag(cell, "hide-input")
            checks.append((i, m.group(1)))
    for i, cell in enumerate(nb.cells):
        if BEGIN_SOLUTION not in cell_source(cell) or cell_meta(cell).get("grade"):
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


def _set_without_hidden_tests_or_outputs(cell, src: str) -> None:
    """Give ``cell`` the source ``src`` less its hidden-test regions, and no outputs (a code cell)."""
    if BEGIN_HIDDEN in src:
        src = _replace_regions(src, BEGIN_HIDDEN, END_HIDDEN, None)
    cell.source = src
    if cell.cell_type == "code":
        cell.outputs = []
        cell.execution_count = None


def solution_notebook(nb):
    """The copy to hand out after the deadline: solutions and the closing summary (``instructor-only``) kept,
    hidden tests and outputs removed. Run from the top, it reproduces every answer and prints the summary."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        _set_without_hidden_tests_or_outputs(cell, cell_source(cell))
        cell.get("metadata", {}).pop("execution", None)
    return nb


def write_solution_copies(source_dir: Path | str, out_dir: Path | str) -> list[Path]:
    """Write :func:`solution_notebook` of every exercise in ``source_dir`` to ``out_dir`` (for after the deadline)."""
    import nbformat

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in exercise_notebooks(source_dir).values():
        nb = nbformat.read(path, as_version=4)
        problems = lint(nb, path.name)
        if problems:
            raise ValueError("\n".join(problems))
        nbformat.write(solution_notebook(nb), out / path.name)
        written.append(out / path.name)
    return written


# --------------------------------------------------------------------------
# Executing a submission, one cell at a time
# --------------------------------------------------------------------------
