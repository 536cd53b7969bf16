"""Chapter notebooks read the same in the book, Jupyter and Colab (fast: reads the .ipynb files only).

- no myst-nb ``{glue}`` role anywhere: Jupyter and Colab would show it raw;
- a hidden cell is hidden in all three places at once: a book tag (``remove-input``
  or ``hide-input``), ``metadata.jupyter.source_hidden`` (JupyterLab, Notebook 7),
  and Colab's form (a first line ``# @title ...`` and ``metadata.cellView == "form"``);
- prose cells (``say``), quiz and prediction cells, and checks (``assert`` only) are hidden;
- ``scripts/pages.py`` has nothing left to do (the notebooks are in the form it writes).
"""
from __future__ import annotations

import ast
import re

import nbformat
import pytest

from conftest import ROOT, chapter_notebooks
import pages

CHAPTERS = sorted((ROOT / "chapters").rglob("*.ipynb"))
IDS = [str(p.relative_to(ROOT)) for p in CHAPTERS]
MARKDOWN_PAGES = sorted((ROOT / "chapters").rglob("*.md")) + [ROOT / "intro.md"]
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


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_no_glue_role_in_any_cell(path):
    nb = nbformat.read(path, as_version=4)
    bad = [i for i, c in enumerate(nb.cells) if "{glue" in c.source]
    assert not bad, f"{path.name}: cells {bad} hold myst-nb glue roles, which Jupyter and Colab show raw"


@pytest.mark.parametrize("path", MARKDOWN_PAGES, ids=[str(p.relative_to(ROOT)) for p in MARKDOWN_PAGES])
def test_no_glue_role_in_markdown_pages(path):
    assert "{glue" not in path.read_text()


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_every_hidden_cell_is_hidden_in_all_three_places(path):
    nb = nbformat.read(path, as_version=4)
    # Cell 0 is the shared setup cell, written by scripts/nbtools.py (tests/test_notebook_setup.py).
    for i, cell in enumerate(nb.cells[1:], start=1):
        if cell.cell_type != "code":
            continue
        m = markers(cell)
        if any(m.values()):
            assert all(m.values()), f"{path.name} cell {i} is hidden in some places only: {m}\n{cell.source[:200]}"


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


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_pages_script_has_nothing_left_to_do(path):
    nb = nbformat.read(path, as_version=4)
    before = nbformat.writes(nb)
    notes = pages.rewrite(nb)
    assert not [n for n in notes if n.startswith("ERROR")], notes
    assert nbformat.writes(nb) == before, f"run: python scripts/pages.py {path.relative_to(ROOT)}"


def test_pages_script_turns_a_glued_paragraph_into_hidden_prose():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("setup"),
        nbformat.v4.new_code_cell("from lessonlib.book import glue\nx = int.__add__(1, 2)  # a call: stays in sight\n"
                                  "glue(\"x_pct\", 100 * x)\nassert x == 3"),
        nbformat.v4.new_markdown_cell("## Heading\n\nIt is {glue:text}`x_pct:.1f` % ($\\frac{a}{b}$).\n\nPlain."),
    ])
    assert pages.rewrite(nb) == []
    sources = [c.source for c in nb.cells]
    assert sources[1] == "x = int.__add__(1, 2)  # a call: stays in sight\nfrom lessonlib.book import say"
    assert sources[2].startswith("# @title Check") and "assert x == 3" in sources[2]
    assert sources[3] == "## Heading"
    prose = sources[4]
    assert "x_pct = 100 * x" in prose and "{x_pct:.1f} %" in prose and "\\frac{{a}}{{b}}" in prose
    assert sources[5] == "Plain."
    ns = {}
    exec(sources[1].replace("from lessonlib.book import say", ""), ns)
    shown = []
    ns["say"] = shown.append
    exec(prose, ns)
    assert shown[0].strip() == "It is 300.0 % ($\\frac{a}{b}$)."


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
