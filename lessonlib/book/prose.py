"""Sentences that carry computed numbers, shown the same in the book, Jupyter and Colab.

A page writes such a paragraph as the Markdown *output* of a code cell whose
input is hidden (``remove-input`` tag, ``jupyter.source_hidden``, and Colab's
``# @title`` form)::

    # @title Text with this run's numbers
    say(rf"One training step took {ratio:.1f} times as long as one prediction.")

The book renders it with MyST (``nb_render_markdown_format: myst``, so math
and roles work); JupyterLab, Notebook 7 and Colab render it as Markdown. The
reader always sees the numbers of the run in front of them.
"""
from __future__ import annotations

import textwrap


class Prose:
    """Markdown text that displays as Markdown (Jupyter, Colab, the book) or as plain text."""

    def __init__(self, markdown: str):
        if not isinstance(markdown, str):
            raise TypeError(f"markdown must be a str, got {type(markdown).__name__}")
        self.markdown = markdown

    def _repr_markdown_(self) -> str:
        return self.markdown

    def __repr__(self) -> str:
        return self.markdown


def say(markdown: str) -> None:
    """Show ``markdown`` (a paragraph with its numbers already formatted) as the cell's output.

    Leading indentation common to all lines and surrounding blank lines are removed.
    Raises ``TypeError`` if ``markdown`` is not a string.
    """
    if not isinstance(markdown, str):
        raise TypeError(f"markdown must be a str, got {type(markdown).__name__}")
    from IPython.display import display

    display(Prose(textwrap.dedent(markdown).strip("\n")))
