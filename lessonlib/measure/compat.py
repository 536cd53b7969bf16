"""PyTorch features that are private, or newer than the oldest torch lessonlib accepts.

lessonlib declares ``torch>=2.1`` (pyproject.toml): the public APIs it needs
all exist there. Each API below is looked up when it is used, never at import,
so ``import lessonlib...`` works on any torch, and a missing one is reported
in plain words instead of an ImportError from deep inside a page:

========================  ==========================================  =======================
name                      API                                         when missing
========================  ==========================================  =======================
``mem_tracker``           ``torch.distributed._tools.mem_tracker``    CPU peak memory: None
                          ``.MemTracker`` (private, after 2.1)
``flop_counter``          ``torch.utils.flop_counter.FlopCounterMode``  FLOP counts raise
                          (2.1)                                       :class:`Unavailable`
``checkpoint_early_stop`` ``torch.utils.checkpoint                    early stop stays at
                          .set_checkpoint_early_stop`` (2.1)          torch's default
========================  ==========================================  =======================

:func:`missing` lists what this torch lacks and what that costs;
:func:`lessonlib.measure.device.environment_report` prints it on every page.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from pathlib import Path

#: The oldest torch whose public API lessonlib needs (pyproject.toml says the same).
MIN_TORCH = "2.1"

#: name -> (module, attribute, what a page cannot measure without it)
FEATURES = {
    "mem_tracker": ("torch.distributed._tools.mem_tracker", "MemTracker",
                    "the CPU peak memory of a step (PyTorch's private MemTracker)"),
    "flop_counter": ("torch.utils.flop_counter", "FlopCounterMode",
                     "FLOP counts (FlopCounterMode, torch >= 2.1)"),
    "checkpoint_early_stop": ("torch.utils.checkpoint", "set_checkpoint_early_stop",
                              "recomputation with early stop switched off (torch >= 2.1)"),
}


class Unavailable(RuntimeError):
    """This torch lacks a feature a measurement needs; the message names it."""


def feature(name: str):
    """The object behind ``name`` (a key of FEATURES), or None when this torch lacks it."""
    if not isinstance(name, str) or name not in FEATURES:
        raise ValueError(f"name must be one of {sorted(FEATURES)}, got {name!r:.60}")
    module, attr, _ = FEATURES[name]
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception:  # ImportError, AttributeError, or a broken private module
        return None


def require(name: str):
    """Like :func:`feature`, but raise :class:`Unavailable` with what cannot be measured."""
    found = feature(name)
    if found is None:
        import torch

        module, attr, what = FEATURES[name]
        raise Unavailable(f"torch {torch.__version__} has no {module}.{attr}: cannot measure {what}")
    return found


def missing() -> dict[str, str]:
    """``{name: what cannot be measured}`` for every feature this torch lacks.

    A feature whose module is not imported yet is judged by whether its source
    file is there, without importing it: every page's first cell calls this,
    and importing ``torch.distributed._tools`` only to look costs about a
    second. A module that is there but broken still shows as None from
    :func:`feature` when a measurement asks for it.
    """
    return {name: what for name, (module, _, what) in FEATURES.items()
            if not (_source_found(module) if module not in sys.modules else feature(name) is not None)}


def _source_found(module: str) -> bool:
    """Whether ``module``'s file exists, found by walking its package's folders; imports nothing
    (``find_spec`` of a top-level package only reads the already imported one, or finds its folder)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not rest:
        return spec is not None
    folders = [Path(p) for p in spec.submodule_search_locations or ()]
    for part in rest[:-1]:
        folders = [f / part for f in folders if (f / part / "__init__.py").is_file()]
    return any((f / rest[-1] / "__init__.py").is_file() or (f / f"{rest[-1]}.py").is_file() for f in folders)


def checkpoint_early_stop(enable: bool):
    """``set_checkpoint_early_stop(enable)``, or a no-op context on a torch without it."""
    from ..checks import flag

    enable = flag("enable", enable)
    found = feature("checkpoint_early_stop")
    return found(enable) if found is not None else contextlib.nullcontext()
