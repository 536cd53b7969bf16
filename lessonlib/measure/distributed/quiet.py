"""Warnings that torch.distributed prints on every run and that belong out of the pages.

Each is filtered by its message, in the worker processes only, so that any
other warning still shows.
"""
from __future__ import annotations

import contextlib
import warnings

#: Messages (regular expressions, matched at the start) of warnings that say nothing to a reader here.
KNOWN = (
    # CommDebugMode's module tracker hooks backward; token ids need no gradient, so torch notes that
    # the hook fires on outputs. Harmless for counting.
    r"Full backward hook is firing when gradients are computed with respect to module outputs",
    # FSDP2 warns that a module returned a view; no in-place op follows in these models.
    r"FSDP2-wrapped module .* returned a view tensor",
    # torch.distributed.checkpoint loading into one process without a process group (what the page wants).
    r"torch\.distributed is disabled, unavailable or uninitialized",
)


@contextlib.contextmanager
def known_warnings_silenced():
    """Ignore the warnings listed in :data:`KNOWN` inside the block; others still show."""
    with warnings.catch_warnings():
        for pattern in KNOWN:
            warnings.filterwarnings("ignore", message=pattern)
        yield
