"""The book's one table renderer: a header and rows of cells in, a table out.

Every table a page shows comes from :func:`table`:

* as HTML (the default), an :class:`HTMLTable` that Jupyter, Colab and the book
  display as a table, and that a calculator (:class:`~lessonlib.book.interactive.Explorer`)
  embeds in its output. Its structure is plain ``<table>`` / ``<thead>`` /
  ``<tbody>`` with an optional ``<caption>``, which ``static/widgets.css`` lets
  scroll beside the text on a wide screen and wrap on a phone;
* as Markdown (``markdown=True``), for a table that sits inside a paragraph
  shown with :func:`lessonlib.book.prose.say`: its cells may hold MyST math
  (``$16/N$``) and code spans, which only the Markdown renderers typeset.

HTML cells are escaped (a cell shows its text, never markup); Markdown cells are
written as they are. The grader's text report (``lessonlib.grading.results``)
does not use this module: grading imports nothing from the book (see its comment).
"""
from __future__ import annotations

import html as _html
from typing import Any, Collection, Sequence

from ..checks import flag as _check_flag, sequence as _check_sequence, text as _check_text


#: A cell whose text is longer than this many characters is a text column's cell: the HTML marks it
#: ``class="wtc-long"``, which ``static/widgets.css`` keeps at least 14em wide on a wide screen (the table then
#: scrolls inside its own box) instead of letting the short columns squeeze it to a word a line.
LONG_CELL = 32


class HTMLTable(str):
    """An HTML table that Jupyter, Colab and the book all display as a table (``_repr_html_``)."""

    def _repr_html_(self) -> str:
        return str(self)


def table(header: Sequence[Any] | None, rows: Sequence[Sequence[Any]], *, caption: str = "",
          strong: Collection[int] = (), markdown: bool = False) -> str:
    """The table of ``rows`` (sequences of cells, each shown with ``str``) under ``header``.

    ``header`` is a sequence of column titles, or ``None`` for a table of labelled
    lines (a calculator's answer); ``strong`` lists the indices of rows to show as
    header cells (the answer's main lines); ``caption`` is text said above the
    table (HTML only). With ``markdown=True`` the result is a Markdown table (a
    ``str``; it needs a header); otherwise an :class:`HTMLTable`. Every row must
    have as many cells as the header (or as the first row, without a header).
    """
    rows = [_check_sequence(f"rows[{i}]", r) for i, r in enumerate(_check_sequence("rows", rows, allow_empty=True))]
    if header is not None:
        header = _check_sequence("header", header)
    width = len(header) if header is not None else (len(rows[0]) if rows else 0)
    for i, r in enumerate(rows):
        if len(r) != width:
            raise ValueError(f"rows[{i}] has {len(r)} cells, {'header' if header is not None else 'rows[0]'} "
                             f"has {width}")
    _check_text("caption", caption, allow_empty=True)
    strong = set(_check_sequence("strong", strong, allow_empty=True))
    for i in strong:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(rows):
            raise ValueError(f"strong must hold row indices from 0 to {len(rows) - 1}, got {i!r}")
    if _check_flag("markdown", markdown):
        if header is None or caption or strong:
            raise ValueError("markdown=True needs a header and takes no caption and no strong rows")
        lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows])

    def cell(c, tag):
        s = str(c)
        mark = ' class="wtc-long"' if len(s) > LONG_CELL else ""
        return f"<{tag}{mark}>{_html.escape(s)}</{tag}>"

    def line(cells, tag):
        return "<tr>" + "".join(cell(c, tag) for c in cells) + "</tr>"

    cap = f"<caption>{_html.escape(caption)}</caption>" if caption else ""
    head = f"<thead>{line(header, 'th')}</thead>" if header is not None else ""
    body = "".join(line(r, "th" if i in strong else "td") for i, r in enumerate(rows))
    return HTMLTable(f"<table>{cap}{head}<tbody>{body}</tbody></table>")
