"""The book layer's sources: scripts live in lessonlib/book/static, tables come from one renderer.

Read from the Python source's string literals (``ast``), so a script or a
table written inline in any module of lessonlib is found without running it.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "lessonlib"
BOOK = PKG / "book"

#: ``<script ...>`` tags that hold data, not code (JSON, base64 text): their body may be long.
DATA_SCRIPT = re.compile(r"""<script\b[^>]*\btype=["']?(application/json|text/plain)""", re.I)
SCRIPT = re.compile(r"<script\b[^>]*>", re.I)


def literals(source: str):
    """(line, text) of every string literal in ``source`` except docstrings (prose about a tag is no tag);
    an f-string's literal parts joined with ``{}``."""
    tree = ast.parse(source)
    skip = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    skip |= {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def inline_scripts(source: str) -> list[int]:
    """Lines of string literals holding a code ``<script>`` whose body, written in the literal, is more than a line."""
    found = []
    for line, text in literals(source):
        for tag in SCRIPT.finditer(text):
            if DATA_SCRIPT.match(tag.group(0)):
                continue
            body = text[tag.end():].split("</script>", 1)[0]
            if "\n" in body.strip("\n") or len(body) > 120:
                found.append(line)
    return found


def py_files(folder: Path):
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", py_files(BOOK), ids=lambda p: str(p.relative_to(PKG)))
def test_no_script_is_written_inside_python(path):
    """JavaScript lives in lessonlib/book/static/*.js and is embedded from there (quiz.js, explorer.js)."""
    lines = inline_scripts(path.read_text())
    assert not lines, (f"{path.relative_to(PKG.parent)} lines {lines}: a <script> body written in Python; "
                       "move it to lessonlib/book/static/<name>.js and embed it with interactive.script_text")


def test_the_script_check_sees_an_inline_script():
    old = 'def f(uid):\n    return f"""<script>(function(){{\nvar id="{uid}";\n}})();</script>"""\n'
    assert inline_scripts(old) == [2]
    data = 'x = f\'<script type="application/json" id="{uid}-data">{payload}</script>\'\n'
    one_line = 'x = "<script>" + script_text("quiz.js") + "</script>"\n'
    assert inline_scripts(data) == [] and inline_scripts(one_line) == []


def test_every_static_script_is_used():
    static = {p.name for p in (BOOK / "static").glob("*.js")}
    used = {name for p in py_files(BOOK) for name in re.findall(r"""["'](\w+\.js)["']""", p.read_text())}
    assert static <= used, f"scripts nothing embeds: {sorted(static - used)}"


#: The one table renderer (see its docstring); grading's text report stands apart (see results._aligned).
RENDERER = BOOK / "tables.py"
TABLE_MARKUP = re.compile(r"<table\b|<tr\b|<t[dh]\b|-{3,}\s*\|", re.I)


def table_literals(source: str) -> list[int]:
    """Lines of string literals that write table markup (HTML rows or cells, a Markdown rule line)."""
    return [line for line, text in literals(source) if TABLE_MARKUP.search(text)]


@pytest.mark.parametrize("path", [p for p in py_files(PKG) if p != RENDERER], ids=lambda p: str(p.relative_to(PKG)))
def test_tables_come_from_the_one_renderer(path):
    lines = table_literals(path.read_text())
    assert not lines, (f"{path.relative_to(PKG.parent)} lines {lines}: table markup written by hand; "
                       "build the rows and call lessonlib.book.tables.table")


def test_the_table_check_sees_a_hand_written_table():
    assert table_literals('x = f"<table><tr><td>{a}</td></tr></table>"\n') == [1]
    assert table_literals('x = "<tr><th>total</th></tr>"\n') == [1]
    assert table_literals('lines = ["| a |", "|---|"]\n') == [1]
    assert table_literals('def f():\n    """An HTML <table> of the rows."""\n') == []
    assert table_literals(RENDERER.read_text()) != []  # the renderer itself writes them
