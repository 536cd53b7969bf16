"""Progress bars that suit where the notebook runs.

Live (Jupyter, Colab, a terminal) this is a text ``tqdm`` bar on stdout that
updates in place (a carriage return). Not ``tqdm.auto``'s widget bar: a saved
widget output, reopened without its kernel, shows "Error displaying widget:
model not found" in JupyterLab; a text bar stays readable text.

While the static book is built (``LESSONLIB_STATIC_BUILD=1``, set by
``scripts/book.sh`` and the test that builds the book), a bar's every update
would become a separate block of text on the page, and a widget bar would be
an empty box; a summary line ("sweep: 18 steps in 0.4 s") would still be
plumbing on the reader's page, so there it stays silent.
"""
from __future__ import annotations

import os
import sys
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


def static_build() -> bool:
    """True while the static book is being built."""
    return os.environ.get("LESSONLIB_STATIC_BUILD", "") not in ("", "0")


def bar(total: int | None = None, desc: str = ""):
    """A text progress bar on stdout (``tqdm``); disabled in the static book build."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stdout, ncols=80, disable=static_build())


def progress(iterable: Iterable[T], desc: str = "", total: int | None = None) -> Iterator[T]:
    """Iterate with a progress bar (silently in the static book build)."""
    if not static_build():
        from tqdm import tqdm

        yield from tqdm(iterable, desc=desc, total=total, file=sys.stdout, ncols=80)
        return
    yield from iterable
