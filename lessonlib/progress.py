"""Progress bars that suit where the notebook runs.

Live (Jupyter, Colab, a terminal) this is ``tqdm.auto``: a bar that updates in
place. While the static book is built (``LESSONLIB_STATIC_BUILD=1``, set by
``scripts/book.sh`` and the test that builds the book), a bar's every update
would become a separate block of text on the page, and a widget bar would be
an empty box; a summary line ("sweep: 18 steps in 0.4 s") would still be
plumbing on the reader's page, so there it stays silent.
"""
from __future__ import annotations

import os
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


def static_build() -> bool:
    """True while the static book is being built."""
    return os.environ.get("LESSONLIB_STATIC_BUILD", "") not in ("", "0")


def progress(iterable: Iterable[T], desc: str = "", total: int | None = None) -> Iterator[T]:
    """Iterate with a progress bar (silently in the static book build)."""
    if not static_build():
        from tqdm.auto import tqdm

        yield from tqdm(iterable, desc=desc, total=total)
        return
    yield from iterable
