"""An optional record of what a page measured, for scripts that check a run.

When the environment variable ``LESSONLIB_RECORD`` names a file, the
measurement helpers append one JSON line per measurement to it (the ledger of
:func:`lessonlib.measure.memory.measure_training_memory`, the timing of
:func:`lessonlib.measure.timing.time_training_step`). Unset, nothing happens.
``scripts/gpu_check.py`` uses it to report, per notebook, what the notebook
itself measured, without asking the notebook for anything.
"""
from __future__ import annotations

import json
import os

from ..checks import path as check_path, text


def record(kind: str, **values) -> None:
    """Append ``{"kind": kind, **values}`` as a JSON line to $LESSONLIB_RECORD, if set."""
    text("kind", kind)
    path = os.environ.get("LESSONLIB_RECORD")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"kind": kind, **values}) + "\n")


def read(path) -> list[dict]:
    """The records in ``path`` (an empty list when there is no file)."""
    path = check_path("path", path)
    if path.is_dir():
        raise ValueError(f"path {str(path)!r:.80} is a folder, not a file of records")
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
    except ValueError as err:  # not UTF-8 text (UnicodeDecodeError), or a line that is not JSON
        raise ValueError(f"path {str(path)!r:.80} is not a file of records, one JSON object a line "
                         f"({type(err).__name__}: {str(err):.80})") from None
