"""Every figure a page draws with ``show(...)`` is displayed.

``show`` returns a figure object that Jupyter displays only when it is the
value of the cell's last top-level expression. Inside an ``if`` block (``if
measured: show(...)``) the object is dropped and the page shows nothing, with
no error: the pipelines page lost both its charts that way. Such a call must be
wrapped in ``display(...)``.
"""
from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
CELL = re.compile(r"```\{code-cell\}[^\n]*\n(?:---\n.*?\n---\n)?(.*?)```", re.S)


def dropped_shows(source: str) -> list[int]:
    """Line numbers of ``show(...)`` calls whose value is thrown away (not the cell's last top-level expression)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    last = tree.body[-1] if tree.body else None
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            f = node.value.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name == "show" and node is not last:
                bad.append(node.lineno)
    return bad


def test_the_check_finds_a_dropped_figure():
    assert dropped_shows("if measured:\n    show(fig, alt='a')\n") == [2]
    assert dropped_shows("show(fig, alt='a')\n") == []
    assert dropped_shows("if measured:\n    display(show(fig, alt='a'))\n") == []


def test_no_page_drops_a_figure():
    found = {}
    for page in sorted([*ROOT.glob("chapters/*/*.md"), *ROOT.glob("exercises/*.md")]):
        for cell in CELL.findall(page.read_text()):
            if dropped_shows(cell):
                found.setdefault(page.relative_to(ROOT).as_posix(), []).append(cell.strip().splitlines()[0][:80])
    assert found == {}
