"""Helpers for putting computed numbers into the book's prose.

:func:`glue` is myst-nb's ``glue`` when myst-nb is installed (the book build),
and a harmless stand-in elsewhere (Colab), so the same notebook runs in both.
"""
from __future__ import annotations

try:  # the book build and local runs
    from myst_nb import glue as _myst_glue
except ImportError:  # pragma: no cover - Colab has no myst-nb
    _myst_glue = None


class Text(str):
    """A string that displays without quotes when glued (``{glue:}`name```)."""

    def __repr__(self) -> str:
        return str(self)


def glue(name: str, value, display: bool = False) -> None:
    """Store ``value`` under ``name`` for ``{glue:}`` / ``{glue:text}`` roles.

    Strings are wrapped in :class:`Text` so the page shows ``2.5×`` and not
    ``'2.5×'``. Numbers are kept as numbers, so ``{glue:text}`name:.1f``` can
    format them in the prose. Returns None, so a glue call on a cell's last
    line adds no stray output to the page.
    """
    if isinstance(value, str) and not isinstance(value, Text):
        value = Text(value)
    if _myst_glue is not None:
        _myst_glue(name, value, display=display)
    elif display:
        from IPython.display import display as _display

        _display(value)
