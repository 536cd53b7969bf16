"""Every page has a text source, and its notebook is generated from it (fast: reads files only).

A page is ``NAME.md`` (MyST Markdown, paired with ``NAME.ipynb`` by jupytext)
plus ``NAME.ipynb``, which ``scripts/sync_pages.py`` writes from the ``.md``
(no outputs; for Colab, downloads, nbval and the book build). Here:

- every notebook of ``chapters/`` and ``exercises/`` has its ``.md``, and every ``.md`` page its notebook;
- each notebook is byte for byte what ``scripts/sync_pages.py`` writes from its ``.md``
  (so it has no outputs, and an edit of the ``.md`` alone fails until it is synced);
- each ``.md`` is in jupytext's own form (reading and writing it gives it back), so
  regenerating a page never rewrites text that nobody edited;
- the hiding markers live in the text source: a hidden code cell carries, in its
  ``{code-cell}`` options, a book tag (``remove-input``/``hide-input``),
  ``jupyter.source_hidden`` (JupyterLab, Notebook 7) and Colab's form
  (``cellView: form`` and a first line ``# @title ...``), all four or none (chapter pages).
"""
from __future__ import annotations

import re

import jupytext
import pytest

from conftest import ROOT, course_notebooks
import sync_pages

PAGES = sync_pages.pages()
IDS = [str(p.relative_to(ROOT)) for p in PAGES]
BOOK_TAGS = {"remove-input", "hide-input"}
#: Chapter pages. (An exercise hides its check cells from the book only, as nbgrader
#: expects; tests/test_exercises.py checks the exercises.)
CHAPTERS = [p for p in PAGES if p.relative_to(ROOT).parts[0] == "chapters"]


def test_every_notebook_has_a_text_source_and_every_text_source_a_notebook():
    notebooks = {p.with_suffix("") for p in course_notebooks()}
    texts = {p.with_suffix("") for p in PAGES}
    assert notebooks, "no notebooks found"
    assert not notebooks - texts, f"notebooks without a text source (.md): {sorted(map(str, notebooks - texts))}"
    assert not texts - notebooks, (f"text sources without a notebook: {sorted(map(str, texts - notebooks))};"
                                   " run: python scripts/sync_pages.py")


@pytest.mark.parametrize("md", PAGES, ids=IDS)
def test_notebook_is_generated_from_its_text_source(md):
    ipynb = md.with_suffix(".ipynb")
    assert ipynb.read_text() == sync_pages.notebook_text(md), (
        f"{ipynb.relative_to(ROOT)} is not what its text source gives (edited by hand, run with outputs, "
        f"or not synced): run python scripts/sync_pages.py {md.relative_to(ROOT)}")


@pytest.mark.parametrize("md", PAGES + [ROOT / "intro.md"], ids=IDS + ["intro.md"])
def test_no_glue_role(md):
    """The one check that no page holds a myst-nb ``{glue}`` role: Jupyter and Colab would show it raw.
    (The .ipynb files are generated from these sources; the test above keeps them equal.)"""
    assert "{glue" not in md.read_text(), f"{md.relative_to(ROOT)} holds a myst-nb glue role"


@pytest.mark.parametrize("md", PAGES, ids=IDS)
def test_text_source_is_in_jupytext_form(md):
    text = md.read_text()
    again = jupytext.writes(jupytext.read(md, fmt="md:myst"), fmt="md:myst")
    assert sync_pages.without_version(again) == sync_pages.without_version(text), (
        f"{md.relative_to(ROOT)} changes when jupytext rewrites it: run jupytext --to md:myst on its notebook")


def markers(cell) -> dict:
    tags = set(cell.metadata.get("tags", []))
    return {
        "book tag": bool(tags & BOOK_TAGS),
        "jupyter.source_hidden": cell.metadata.get("jupyter", {}).get("source_hidden") is True,
        "cellView: form": cell.metadata.get("cellView") == "form",
        "# @title first line": bool(re.match(r"# @title \S", cell.source)),
    }


@pytest.mark.parametrize("md", CHAPTERS, ids=[str(p.relative_to(ROOT)) for p in CHAPTERS])
def test_hidden_cells_are_hidden_in_all_three_places_in_the_text_source(md):
    nb = jupytext.read(md, fmt="md:myst")
    hidden = 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        m = markers(cell)
        if any(m.values()):
            assert all(m.values()), f"{md.name} cell {i} is hidden in some places only: {m}\n{cell.source[:200]}"
            hidden += 1
    assert hidden, f"{md.name}: not even the setup cell is hidden"
    # The markers are written in the .md itself, as options of the cell.
    options = re.findall(r"^```\{code-cell\}[^\n]*\n---\n(.*?)\n---\n", md.read_text(), re.S | re.M)
    assert sum("cellView: form" in o and "source_hidden: true" in o for o in options) == hidden


def test_the_check_fails_on_a_cell_hidden_in_one_place_only(tmp_path):
    front = re.match(r"---\n.*?\n---\n", PAGES[0].read_text(), re.S).group(0)  # a page's front matter
    md = tmp_path / "page.md"
    md.write_text(front + "\n```{code-cell}\n:tags: [remove-input]\n\nx = 1\n```\n")
    with pytest.raises(AssertionError, match="hidden in some places only"):
        test_hidden_cells_are_hidden_in_all_three_places_in_the_text_source(md)


def test_sync_writes_no_outputs_and_stable_ids(tmp_path):
    md = tmp_path / "page.md"
    front = re.match(r"---\n.*?\n---\n", PAGES[0].read_text(), re.S).group(0)
    md.write_text(front + "\n# A page\n\n```{code-cell}\nprint(1)\n```\n\n```{code-cell}\nprint(1)\n```\n")
    assert sync_pages.is_page(md)
    nb = sync_pages.notebook(md)
    ids = [c.id for c in nb.cells]
    assert len(set(ids)) == 3 and ids == [c.id for c in sync_pages.notebook(md).cells]
    assert all(c.outputs == [] and c.execution_count is None for c in nb.cells if c.cell_type == "code")
    md.write_text(md.read_text().replace("# A page", "# A page, reworded"))
    assert [c.id for c in sync_pages.notebook(md).cells][1:] == ids[1:]  # only the edited cell's id changes


def test_pages_import_lessonlib_modules_under_their_own_names():
    """A module is read under its own name (`reports.`, `pipeline.`), never an alias (`P`, `R`, `memory`) that names
    something else; a hidden check may keep a private alias (`_p`), which no reader sees."""
    import importlib
    import importlib.util
    import re

    aliased = []
    for page in sorted([*ROOT.glob("chapters/*/*.md"), *ROOT.glob("exercises/*.md")]):
        for pkg, names in re.findall(r"^from (lessonlib[\w.]*) import (.+)$", page.read_text(), re.M):
            for mod, alias in re.findall(r"(\w+) as (\w+)", names):
                if alias.startswith("_") or not hasattr(importlib.import_module(pkg), "__path__"):
                    continue  # a private alias, or a name imported from a module (a function, a constant)
                if importlib.util.find_spec(f"{pkg}.{mod}") is not None:
                    aliased.append(f"{page.name}: {mod} as {alias}")
    assert not aliased, aliased


#: In a Python string that is not raw, a backslash escape that eats the start of a LaTeX command: ``\t`` (``\tfrac``,
#: ``\times``, ``\text``), ``\f`` (``\frac``), ``\b`` (``\beta``), ``\a`` (``\alpha``), ``\v`` (``\vert``), ``\n``
#: (``\nabla``, ``\neq``, ``\nu``) and ``\r`` (``\rho``, ``\right``, ``\rceil``): the page would show a control
#: character or a line break where the formula was.
EATEN_LATEX = re.compile(r"(?<!\\)(?:\\\\)*\\(?:[tfbav]|n(?=abla|eq|u\b|ot|leq|geq|mid|parallel|ewline)"
                         r"|r(?=ho|ight|angle|ceil|floor))(?=[A-Za-z])")


def eaten_latex(code: str) -> list[str]:
    """The string literals of Python ``code`` that are not raw and hold an escape of :data:`EATEN_LATEX`."""
    import io
    import tokenize

    found = []
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.STRING:
            prefix = re.match(r"[A-Za-z]*", tok.string).group(0).lower()
            if "r" not in prefix and EATEN_LATEX.search(tok.string):
                found.append(f"line {tok.start[0]}: {tok.string[:90]}")
    return found


def test_the_latex_check_finds_an_eaten_command():
    assert eaten_latex('say(f"rerun $(s - 1)(n/s - \\\\tfrac12)$ blocks")') == []       # escaped: fine
    assert eaten_latex('say(rf"rerun $(s - 1)(n/s - \\tfrac12)$ blocks")') == []        # raw: fine
    assert len(eaten_latex('x = (f"so $(n/s - \\tfrac12)$ blocks: "\n     + "$\\frac{a}{b}$")')) == 2
    assert len(eaten_latex('say("""$\\nabla L$ and $\\rho$""")')) == 1
    assert eaten_latex('print("a\\t1\\nThe end")') == []  # a tab before a digit, a line break before a word
    assert eaten_latex('print("\\n".join(rows))') == []


@pytest.mark.parametrize("source", [*PAGES, *sorted((ROOT / "lessonlib").rglob("*.py"))],
                         ids=[*IDS, *[str(p.relative_to(ROOT)) for p in sorted((ROOT / "lessonlib").rglob("*.py"))]])
def test_no_latex_command_is_eaten_by_a_string_escape(source):
    """Review: 2.2 showed "(n/s - <tab>frac12)": ``\\tfrac`` in an f-string that was not raw became a tab. Every
    code cell of every page, and lessonlib's code, writes LaTeX in raw strings (``rf"..."``), or doubles the
    backslash. The text itself must hold no control character either."""
    text = source.read_text()
    assert not re.search("[\t\f\b\a\v]", text), f"a control character in {source.name}"
    if source.suffix == ".py":
        cells = [text]
    else:
        cells = [c.source for c in jupytext.reads(text, fmt="md:myst").cells if c.cell_type == "code"]
    found = [hit for cell in cells for hit in eaten_latex(cell)]
    assert not found, found
