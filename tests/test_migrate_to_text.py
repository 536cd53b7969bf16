"""scripts/migrate_to_text.py (one-time; delete this file with it): how a prose cell is split."""
from __future__ import annotations

import nbformat

import migrate_to_text as mig

HIDDEN = {"cellView": "form", "jupyter": {"source_hidden": True}, "tags": ["remove-input"]}


def _nb(*cells):
    return nbformat.v4.new_notebook(cells=list(cells))


def _say_cell(src):
    return nbformat.v4.new_code_cell(src, metadata=nbformat.from_dict(HIDDEN))


def _shown(cells) -> str:
    """What the reader sees: Markdown cells as they are, say cells as what say displays."""
    ns, out = {}, []
    ns["say"] = lambda text: out.append(__import__("textwrap").dedent(text).strip("\n"))
    for c in cells:
        if c.cell_type == "markdown":
            out.append(c.source)
        else:
            exec(c.source, ns)
    return "\n\n".join(out)


def test_paragraphs_without_placeholders_become_markdown_and_the_text_shown_is_the_same():
    src = ('# @title Text with this run\'s numbers\nx = 3\nsay(rf"""\nPlain $\\frac{{a}}{{b}}$ and `{{}}`.\n\n'
           'It took {x:.1f} s.\n\n- one\n- two {x}\n\n- three\n\n  more of three\n\nLast, plain.\n""")')
    before = [_say_cell(src)]
    shown = _shown(before)
    nb = _nb(nbformat.v4.new_markdown_cell("## Heading"), _say_cell(src), nbformat.v4.new_markdown_cell("After."))
    mig.rewrite(nb)
    kinds = [c.cell_type for c in nb.cells]
    assert kinds == ["markdown", "code", "markdown"], kinds
    assert nb.cells[0].source == "## Heading\n\nPlain $\\frac{a}{b}$ and `{}`."
    say_cell = nb.cells[1]
    assert say_cell.source.startswith("# @title Text with this run's numbers\nx = 3\nsay(rf\"\"\"\nIt took")
    assert "- three\n\n  more of three" in say_cell.source  # one list, kept whole
    assert nb.cells[2].source == "Last, plain.\n\nAfter."
    assert dict(say_cell.metadata) == HIDDEN
    assert _shown(nb.cells[1:2]) + "\n\nLast, plain." == shown.split("\n\n", 1)[1]


def test_a_cell_whose_every_paragraph_has_a_number_is_left_as_it_is():
    src = '# @title Text\nsay(rf"""\nIt took {x} s.\n\nAnd {x} more.\n""")'
    nb = _nb(_say_cell(src))
    assert mig.rewrite(nb) == [] and nb.cells[0].source == src


def test_a_prose_cell_without_numbers_keeps_its_assignments_for_later_cells():
    src = '# @title Text\nfrom lessonlib.book import say\ny = 2\nsay(r"""\nNo numbers here.\n""")'
    nb = _nb(_say_cell(src), _say_cell('# @title T\nsay(f"{y}")'))
    mig.rewrite(nb)
    assert [c.cell_type for c in nb.cells] == ["code", "markdown", "code"]
    assert nb.cells[0].source == "# @title Text\ny = 2"
    assert nb.cells[2].source.startswith("# @title T\nfrom lessonlib.book import say\n")  # still importable


def test_tables_and_instructor_only_cells_are_left_alone():
    table = _say_cell('# @title Table\nsay(R.md_table(["a"], [[1]]))')
    instructor = nbformat.v4.new_code_cell('# @title S\nsay(f"""\nPlain.\n""")', metadata=nbformat.from_dict(
        {**HIDDEN, "tags": ["instructor-only", "remove-input"]}))
    nb = _nb(table, instructor)
    assert mig.rewrite(nb) == [] and len(nb.cells) == 2


def test_migration_is_idempotent():
    src = '# @title T\nsay(rf"""\nPlain.\n\nWith {x}.\n""")'
    nb = _nb(_say_cell(src))
    mig.rewrite(nb)
    once = nbformat.writes(nb)
    assert mig.rewrite(nb) == [] and nbformat.writes(nb) == once
