"""Measurements that an answer rests on: were they measured in this run, or typed in?

Some answers follow from the student's own measurement (a step's phase
times, say): the check is that the answers follow from the measurement
handed in with them. A student who deletes the measuring cell and types in
plausible times would pass that check. So an exercise marks the cell that
measures (its metadata, in the instructor's notebook)::

    {"grading": {"measures": {"3a-q4": {"measured": "timing.seconds"}}}}

meaning: the answer ``measured`` of question ``3a-q4`` must be what
``timing.seconds`` held right after this cell ran. The grader then

1. finds that cell, unmodified, in the submission, before the check
   (:func:`place`); the sandbox runs it, so the grader measures again on
   its own machine, in the same run as the student's answers;
2. hands the expression's value in, with the grader's own request, right
   after that cell (:func:`snapshot_code`);
3. compares it with what the check cell handed in (:func:`doubt`).

A missing or edited measuring cell, one that did not run, or a measurement
changed between that cell and the check, turns a pass into a flag: a person
reads it. (A student who patches the measuring library inside their own
kernel is beyond this screen; the checks' consistency tests, such as medians
that must be the medians of the rounds handed in, raise the bar there.)
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

#: Suffix of the grade id under which the grader hands a measuring cell's value in.
SUFFIX = ".measured"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def declared(cells) -> dict[str, list[tuple[int, str, dict[str, str]]]]:
    """``grade_id -> [(cell index, source, {answer name: expression})]`` from the cells' metadata."""
    found: dict[str, list[tuple[int, str, dict[str, str]]]] = {}
    for i, cell in enumerate(cells):
        meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
        measures = (meta.get("grading") or {}).get("measures") if isinstance(meta, dict) else None
        if not isinstance(measures, dict):
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else src
        for gid, exprs in measures.items():
            if not (isinstance(exprs, dict) and exprs and all(_NAME.match(k) and isinstance(v, str)
                                                               for k, v in exprs.items())):
                raise ValueError(f"cell {i}: grading.measures[{gid!r}] should map answer names to expressions")
            found.setdefault(gid, []).append((i, src, dict(exprs)))
    return found


def place(steps: Sequence, decls: Mapping[str, list], norm) -> dict[int, list[tuple[str, dict[str, str]]]]:
    """Where each measuring cell is among ``steps`` (the cells to run): ``step index -> [(grade id, exprs)]``.

    A measuring cell counts only as the student's own cell whose text (after
    ``norm``) is the exercise's, before the first check of its question; the
    last such cell wins.
    """
    at: dict[int, list[tuple[str, dict[str, str]]]] = {}
    for gid, items in decls.items():
        checks = [i for i, s in enumerate(steps) if s.grade_id == gid]
        end = checks[0] if checks else len(steps)
        for _, src, exprs in items:
            same = [i for i in range(end) if steps[i].grade_id is None and norm(steps[i].source) == norm(src)]
            if same:
                at.setdefault(same[-1], []).append((gid, exprs))
    return at


def snapshot_code(gid: str, exprs: Mapping[str, str]) -> str:
    """Code appended to a measuring cell: hand in what it measured, under ``gid + SUFFIX``."""
    args = ", ".join(f"{name}=({expr})" for name, expr in exprs.items())
    return ("\ntry:\n"
            f"    __import__('lessonlib.grading.answers', fromlist=['hand_in']).hand_in({gid + SUFFIX!r}, {args})\n"
            "except Exception:\n"
            "    pass\n")


def doubt(gid: str, decls: Sequence, answers: Mapping, snapshots: Sequence[Mapping]) -> str:
    """Why the measurement behind ``gid``'s answers cannot be trusted ("" when it can).

    ``answers``: the check's hand-in (plain data); ``snapshots``: the payloads
    the grader took after the measuring cells (see :func:`snapshot_code`).
    """
    snap: dict = {}
    for p in snapshots:
        if isinstance(p, Mapping) and p.get("question") == gid + SUFFIX and isinstance(p.get("answers"), Mapping):
            snap.update(p["answers"])
    for _, src, exprs in decls:
        first = next((line for line in src.splitlines() if line.strip()), "")[:60]
        if not all(name in snap for name in exprs):
            return (f"the measuring cell ({first!r}) is missing, edited or did not run in this run, so the "
                    f"measurements handed in may be typed in: read it")
        for name in exprs:
            if name not in answers or answers[name] != snap[name]:
                return (f"{name} is not what the measuring cell ({first!r}) measured in this run (changed, or typed "
                        f"in, after it ran): read it")
    return ""
