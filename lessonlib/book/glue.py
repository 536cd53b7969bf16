"""Helpers for putting computed numbers into the book's prose.

:func:`glue` is myst-nb's ``glue`` when myst-nb is installed (the book build),
and a harmless stand-in elsewhere (Colab), so the same notebook runs in both.
"""
from __future__ import annotations

from ..checks import text as _check_text


def _myst_glue():
    """myst-nb's glue where myst-nb is installed (the book build), else None (Colab)."""
    try:
        from myst_nb import glue
    except ImportError:  # pragma: no cover - Colab has no myst-nb
        return None
    return glue


class Text(str):
    """A string that displays without quotes when glued (``{glue:}`name```)."""

    def __repr__(self) -> str:
        return str(self)


def glue(name: str, value) -> None:
    """Store ``value`` under ``name`` for ``{glue:}`` / ``{glue:text}`` roles.

    Strings are wrapped in :class:`Text` so the page shows ``2.5×`` and not
    ``'2.5×'``. Numbers are kept as numbers, so ``{glue:text}`name:.1f``` can
    format them in the prose. Returns None, so a glue call on a cell's last
    line adds no stray output to the page.
    """
    _check_text("name", name)
    if isinstance(value, str) and not isinstance(value, Text):
        value = Text(value)
    myst_glue = _myst_glue()
    if myst_glue is not None:
        myst_glue(name, value, display=False)
