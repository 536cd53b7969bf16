"""Chapter notebooks read the same in the book, Jupyter and Colab (fast: reads the .ipynb files only).

A hidden cell carries all three markers: a book tag (``remove-input`` or ``hide-input``),
``metadata.jupyter.source_hidden`` (JupyterLab, Notebook 7), and Colab's form (a first line
``# @title ...`` and ``metadata.cellView == "form"``). Checked here: prose cells (``say``), quiz and
prediction cells, and checks (``assert`` only) are hidden; measurements stay in sight.
(tests/test_text_sources.py checks, once, in the text sources the .ipynb files are generated from,
that no cell is hidden in some places only and that no page holds a myst-nb ``{glue}`` role.)
"""
from __future__ import annotations

import ast
import re

import nbformat
import pytest

from conftest import ROOT, chapter_notebooks

CHAPTERS = sorted((ROOT / "chapters").rglob("*.ipynb"))
IDS = [str(p.relative_to(ROOT)) for p in CHAPTERS]
BOOK_TAGS = {"remove-input", "hide-input"}


def markers(cell) -> dict:
    tags = set(cell.metadata.get("tags", []))
    return {
        "book tag": bool(tags & BOOK_TAGS),
        "jupyter.source_hidden": cell.metadata.get("jupyter", {}).get("source_hidden") is True,
        "cellView form": cell.metadata.get("cellView") == "form",
        "# @title first line": bool(re.match(r"# @title \S", cell.source)),
    }


def test_every_chapter_notebook_is_a_page_of_the_book():
    # The tests find the pages from _toc.yml: a notebook left out of it would be checked here but
    # missing from the book and the browser tests.
    assert CHAPTERS and CHAPTERS == sorted(chapter_notebooks()), "chapter notebooks missing from _toc.yml"


def _first_call(src: str) -> str:
    body = [s for s in ast.parse(src).body]
    if body and isinstance(body[-1], ast.Expr) and isinstance(body[-1].value, ast.Call):
        f = body[-1].value.func
        return f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
    return ""


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_prose_quiz_and_check_cells_are_hidden(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells[1:], start=1):
        if cell.cell_type != "code":
            continue
        src = re.sub(r"^# @title.*\n", "", cell.source)
        body = ast.parse(src).body
        kind = None
        if _first_call(src) in ("say", "Prediction", "SingleChoice", "MultipleSelect", "Numeric"):
            kind = _first_call(src)
        elif body and all(isinstance(s, ast.Assert) for s in body):
            kind = "assert"
        elif any(isinstance(s, ast.Assert) for s in body) and not markers(cell)["book tag"]:
            kind = "visible assert"
        if kind:
            assert all(markers(cell).values()), f"{path.name} cell {i} ({kind}) is visible:\n{cell.source[:200]}"


#: Calls that measure something. They are the lesson: they stay in sight.
MEASURES = re.compile(r"\b(measure_\w+|time_\w+|count_flops|run_\w+|crash_twice|sweep|crossover|memory_multiplier|"
                      r"record_activation_life|four_layer_census|saved_step_activations|segment_sweep|train_linear|"
                      r"mixed_precision_step|train|TrainingProcess|time_ratios|peak_step_memory|step_flops|simulate_\w+|"
                      r"saved_activations|kept_bytes|save_sharded|load_unsharded)\(")


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_every_measurement_call_stays_visible(path):
    nb = nbformat.read(path, as_version=4)
    visible = [c.source for c in nb.cells[1:] if c.cell_type == "code" and not any(markers(c).values())]
    hidden_calls = [m.group(0) for c in nb.cells[1:] if c.cell_type == "code" and any(markers(c).values())
                    for m in MEASURES.finditer(c.source)]
    assert not hidden_calls, f"{path.name}: measurements hidden from the reader: {hidden_calls}"
    assert any(MEASURES.search(s) for s in visible), f"{path.name}: no measurement in sight"


# ----- MyST-only syntax: the book renders it, Jupyter and Colab show it raw --------------------

#: Markdown that only MyST understands, each with what Jupyter and Colab would show instead.
MYST_ONLY = {
    "a directive (```{name} or :::{name})": re.compile(r"^\s*(`{3,}|~{3,}|:{3,})\s*\{[^}\n]*\}", re.M),
    "a role ({name}`text`)": re.compile(r"(?<![\w`\\])\{[A-Za-z][\w:+.-]*\}`"),
    "a target ((label)=)": re.compile(r"^\s*\([^()\s]+\)=\s*$", re.M),
    "a substitution ({{ name }})": re.compile(r"\{\{\s*[A-Za-z_][\w.]*\s*\}\}"),
    "a MyST comment (% at the start of a line)": re.compile(r"^%(\s|$)", re.M),
    "a block break (+++)": re.compile(r"^\+\+\+", re.M),
    "a colon fence (:::)": re.compile(r"^\s*:{3,}", re.M),
}


def myst_only(markdown: str) -> list[str]:
    """The MyST-only constructs in ``markdown``, as ``"what: the line"``."""
    found = []
    for what, pattern in MYST_ONLY.items():
        for m in pattern.finditer(markdown):
            line = markdown[markdown.rfind("\n", 0, m.start()) + 1:].split("\n", 1)[0]
            found.append(f"{what}: {line.strip()[:100]}")
    return found


def test_myst_only_finds_each_construct_and_passes_plain_markdown():
    assert myst_only("```{note}\nA note.\n```") and myst_only(":::{tip}\nx\n:::")
    assert myst_only("See {ref}`the table <tab>`.") and myst_only("It is {math}`x`.")
    assert myst_only("(sec-memory)=\n## Memory") and myst_only("Hi {{ name }}.") and myst_only("% hidden\ntext")
    plain = ("> **Note.** A blockquote reads the same everywhere.\n\nThe activation `a{i}` of layer *i*; "
             "$\\frac{a}{b}$ and `{x}` in code; 40 % of the time.\n\n```python\nd = {1: 2}\n```")
    assert myst_only(plain) == []


def _prose_sources(nb):
    """Markdown cells, and the Markdown that ``say`` cells write (an f-string: ``{{`` is one brace)."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            yield i, cell.source
        elif cell.cell_type == "code" and re.search(r"^say\(", cell.source, re.M):
            yield i, cell.source.replace("{{", "{").replace("}}", "}")


NOTEBOOKS = CHAPTERS + sorted((ROOT / "exercises").rglob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in NOTEBOOKS])
def test_no_myst_only_syntax_in_markdown(path):
    # Admonitions are blockquotes ("> **Note.** ..."): MyST, JupyterLab and Colab all render those.
    nb = nbformat.read(path, as_version=4)
    bad = [f"cell {i}: {f}" for i, src in _prose_sources(nb) for f in myst_only(src)]
    assert not bad, f"{path.name}: MyST-only syntax, shown raw in Jupyter and Colab:\n" + "\n".join(bad)


def _silenced_by_semicolon(source: str) -> bool:
    """Whether a code cell ends with an expression that only a trailing ``;`` keeps from printing."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    if not body or not isinstance(body[-1], ast.Expr):
        return False
    last = source.splitlines()[body[-1].end_lineno - 1].split("#")[0].rstrip()
    return last.endswith(";")


def test_silenced_by_semicolon_finds_the_idiom():
    assert _silenced_by_semicolon("import torch\ntorch.manual_seed(0);")
    assert _silenced_by_semicolon("x = 1\nplt.plot([1]);  # a comment")
    assert not _silenced_by_semicolon("_ = torch.manual_seed(0)")
    assert not _silenced_by_semicolon("x = 1;")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in NOTEBOOKS])
def test_no_cell_relies_on_a_semicolon_to_print_nothing(path):
    # nbval runs each cell without storing it in the history, and IPython then prints the last
    # expression's value whatever follows it (a "<torch._C.Generator at 0x...>" line on the page the
    # tests build). Assign it instead: ``_ = torch.manual_seed(0)``.
    nb = nbformat.read(path, as_version=4)
    bad = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code" and _silenced_by_semicolon(cell.source)]
    assert not bad, f"{path.name}: cells {bad} end with an expression silenced only by ';'"
