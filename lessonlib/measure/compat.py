"""PyTorch capabilities that are private, or newer than some torch a reader may have.

lessonlib declares ``torch>=2.11`` (pyproject.toml, :data:`MIN_TORCH`): the
oldest release on which every page measures everything, derived from the APIs
below (the newest of them works from 2.11) and checked in real venvs
(README, "Which torch"). A notebook's setup cell installs lessonlib without
touching the torch it finds (Colab keeps its own), so a page can still meet an
older torch. Each capability is therefore looked up when it is used, never at
import, and a page that needs a missing one prints a "skipped on this torch"
line instead of a traceback:

=====================  =============================================  =====  =========================
name                   API                                            since  where a page needs it
=====================  =============================================  =====  =========================
``mem_tracker``        ``torch.distributed._tools.mem_tracker``       2.5    the CPU peak of a step
                       ``.MemTracker`` (private)                             (a GPU reads torch.cuda)
``comm_debug_mode``    ``torch.distributed.tensor.debug``             2.5    collectives logged with
                       ``.CommDebugMode``                                    their bytes
``fully_shard``        ``torch.distributed.fsdp.fully_shard``         2.7    sharded training (FSDP2)
                       on CPU processes too (2.6: GPUs only)
``pipeline_stage``     ``torch.distributed.pipelining.PipelineStage``  2.11   pipeline schedules
                       without ``input_args`` (2.6), 1F1B on gloo
                       (2.8), GPipe with 1 micro-batch (2.11)
``flop_counter``       ``torch.utils.flop_counter.FlopCounterMode``   2.1    FLOP counts
``checkpoint_early_``  ``torch.utils.checkpoint                       2.1    (none: early stop stays at
``stop``               .set_checkpoint_early_stop``                          torch's default)
=====================  =============================================  =====  =========================

Chapters 1 and 2 need only ``flop_counter`` (and ``mem_tracker`` for their CPU
peaks); chapter 3's real-engine pages need the three distributed ones.

* :func:`requires` is what a page's measuring cell calls: True, or False after
  printing one line that names what is skipped and why;
* :func:`missing` lists what this torch lacks (the setup cell prints it, one line each);
* :func:`feature` / :func:`require` give the API itself to the library, or None /
  :class:`Unavailable` with the same words.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

#: The oldest torch on which every page measures everything (pyproject.toml says the same).
MIN_TORCH = "2.11"


def _pipelines_run_on_gloo(cls) -> bool:
    """Whether PipelineStage and its schedules work as lessonlib uses them, on CPU processes too.

    torch 2.4 and 2.5's PipelineStage needs ``input_args`` (example inputs); 2.6 infers the shapes.
    Up to 2.7, ``Schedule1F1B`` deadlocks on gloo (run here: 2.6.0 and 2.7.1 hang in
    ``_step_microbatches``): its ``_batch_p2p`` waited for one of gloo's several works. The fix
    (pytorch#152938, in 2.8) added ``schedules._wait_batch_p2p``, which is what is looked for.
    """
    try:
        p = inspect.signature(cls.__init__).parameters.get("input_args")
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return False
    schedules = sys.modules.get("torch.distributed.pipelining.schedules")
    return ((p is None or p.default is not inspect.Parameter.empty) and hasattr(schedules, "_wait_batch_p2p")
            and _gpipe_takes_fewer_microbatches_than_stages(schedules))


def _gpipe_takes_fewer_microbatches_than_stages(schedules) -> bool:
    """The pipelines page runs GPipe with 1 micro-batch on 2 stages (the bubble at its largest).

    From 2.7 to 2.10 every single-stage schedule refused fewer micro-batches than
    stages (pytorch#144702, a guard against a 1F1B hang; run here: 2.7.1 and 2.8.0
    raise ValueError; 2.10.0's source has the check, 2.11.0's has it in 1F1B alone). Asked of the schedule itself,
    with a stand-in stage: the check comes before anything else uses the stage.
    """
    class _Stage:
        num_stages, has_backward = 2, False

    try:
        schedules.ScheduleGPipe(_Stage(), n_microbatches=1)
    except ValueError:
        return False
    except Exception:  # past the check, at something the stand-in lacks
        return True
    return True


def _shards_on_a_cpu(fully_shard) -> bool:
    """torch 2.6's fully_shard runs on GPUs only: on CPU processes (gloo, where the course's runs go
    without one GPU per process) it calls ``torch.cpu.Stream.record_event``, which arrived in 2.7."""
    import torch

    return hasattr(getattr(torch, "cpu", None), "Stream") and hasattr(torch.cpu.Stream, "record_event")


@dataclass(frozen=True)
class Capability:
    """One API a measurement needs: where it lives, the torch that brought it, what it measures.

    ``device_types``: the device types on which a page needs it (the CPU peak tracker
    is not needed on a GPU, which reads ``torch.cuda``'s statistics). ``usable``:
    an extra test of the found object (None: being there is enough).
    """

    module: str
    attr: str
    since: str
    what: str
    device_types: tuple = ("cpu", "cuda")
    usable: object = None

    def __post_init__(self):
        from ..checks import function, sequence, text

        for field in ("module", "attr", "since", "what"):
            text(field, getattr(self, field))
        if not all(d in ("cpu", "cuda") for d in sequence("device_types", self.device_types)):
            raise ValueError(f"device_types must name 'cpu' and/or 'cuda', got {self.device_types!r:.80}")
        if self.usable is not None:
            function("usable", self.usable)

    @property
    def api(self) -> str:
        return f"{self.module}.{self.attr}"


#: name -> the capability. The words of ``what`` complete "skipped on this torch: ...".
FEATURES: dict[str, Capability] = {
    "mem_tracker": Capability("torch.distributed._tools.mem_tracker", "MemTracker", "2.5",
                              "the CPU peak memory of a step", device_types=("cpu",)),
    "comm_debug_mode": Capability("torch.distributed.tensor.debug", "CommDebugMode", "2.5",
                                  "collectives logged with their bytes"),
    "fully_shard": Capability("torch.distributed.fsdp", "fully_shard", "2.7",
                              "sharded training with fully_shard (FSDP2)", usable=_shards_on_a_cpu),
    "pipeline_stage": Capability("torch.distributed.pipelining", "PipelineStage", "2.11",
                                 "pipeline schedules (GPipe with 1 micro-batch, 1F1B on gloo)",
                                 usable=_pipelines_run_on_gloo),
    "flop_counter": Capability("torch.utils.flop_counter", "FlopCounterMode", "2.1", "FLOP counts"),
    "checkpoint_early_stop": Capability("torch.utils.checkpoint", "set_checkpoint_early_stop", "2.1",
                                        "recomputation with early stop switched off"),
}


class Unavailable(RuntimeError):
    """This torch lacks a feature a measurement needs; the message names it."""


def _check_name(name, arg: str = "name") -> str:
    if not isinstance(name, str) or name not in FEATURES:
        raise ValueError(f"{arg} must be one of {sorted(FEATURES)}, got {name!r:.60}")
    return name


def feature(name: str):
    """The object behind ``name`` (a key of FEATURES), or None when this torch lacks it."""
    cap = FEATURES[_check_name(name)]
    try:
        found = getattr(importlib.import_module(cap.module), cap.attr)
    except Exception:  # ImportError, AttributeError, or a broken private module
        return None
    return found if cap.usable is None or cap.usable(found) else None


def _why(name: str) -> str:
    import torch

    cap = FEATURES[name]
    return f"{cap.what} (needs {cap.api}, torch >= {cap.since}; this is torch {torch.__version__})"


def require(name: str):
    """Like :func:`feature`, but raise :class:`Unavailable` saying what cannot be measured."""
    found = feature(name)
    if found is None:
        raise Unavailable(f"cannot measure {_why(name)}")
    return found


def require_all(*names: str) -> None:
    """:func:`require` each of ``names``: what a library function calls before it starts processes."""
    for n in names:
        _check_name(n, "names")
    for n in names:
        require(n)


def requires(*names: str, device=None) -> bool:
    """Whether this torch has every capability in ``names`` that ``device`` needs.

    The guard of a page's measuring cell: when one is missing it prints
    ``skipped on this torch: <what> (needs <API>, torch >= <version>; this is
    torch <version>)`` for each, and returns False, so the page shows that line
    instead of a traceback and skips the cells that need the measurement.
    ``device`` (a name or ``torch.device``; None: ``get_device()``) matters for
    capabilities needed on one kind of device only (the CPU peak tracker).
    """
    from .device import as_device

    kind = as_device("device", device).type
    for n in names:  # none named: nothing is required, True
        _check_name(n, "names")
    lacking = [n for n in dict.fromkeys(names) if kind in FEATURES[n].device_types and feature(n) is None]
    for n in lacking:
        print(f"skipped on this torch: {_why(n)}")
    return not lacking


def base_class(name: str) -> type:
    """The class behind ``name``, or a stand-in whose construction raises :class:`Unavailable`.

    For a module that subclasses a capability at import (``class Log(CommDebugMode)``):
    it still imports on a torch without it, and fails with the capability's name when used.
    """
    found = feature(name)
    if isinstance(found, type):
        return found

    class _Missing:
        def __init__(self, *args, **kwargs):
            require(name)
            raise Unavailable(f"cannot measure {_why(name)}")  # pragma: no cover - found but not a class

    _Missing.__name__ = f"Missing_{name}"
    return _Missing


def frozen_aware(tracker_class: type) -> type:
    """``tracker_class`` (MemTracker), subclassed so that it also runs frozen modules (a fine-tune's base model).

    MemTracker registers a gradient hook on every parameter of each module it
    enters, which a parameter without ``requires_grad`` refuses (torch 2.13).
    The hooks only label a gradient as one; the bytes are counted by the
    tracker's dispatch mode either way, so the totals read here are the same.
    """
    import inspect

    if not isinstance(tracker_class, type):
        raise TypeError(f"tracker_class must be a class (MemTracker), got {type(tracker_class).__name__}")
    method = getattr(tracker_class, "_track_module_params_and_buffers", None)
    if method is None or "install_grad_hooks" not in inspect.signature(method).parameters:
        return tracker_class

    class FrozenAware(tracker_class):
        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            frozen = any(not p.requires_grad for p in module.parameters())
            return super()._track_module_params_and_buffers(module, install_grad_hooks=install_grad_hooks
                                                            and not frozen)

    return FrozenAware


def missing() -> dict[str, str]:
    """``{name: "<what> (needs <API>, torch >= <version>)"}`` for every capability this torch lacks.

    A feature whose module is not imported yet is judged by whether its source
    file is there, without importing it: every page's first cell calls this,
    and importing ``torch.distributed._tools`` or the pipelining package only to
    look costs about a second. A module that is there but lacks the attribute
    (``fully_shard`` on 2.5) still shows as None from :func:`feature` when a
    page's measuring cell asks, through :func:`requires`.
    """
    out = {}
    for name, cap in FEATURES.items():
        if cap.module in sys.modules:
            there = feature(name) is not None
        else:
            there = _source_found(cap.module) and _torch_at_least(cap.since)
        if not there:
            out[name] = f"{cap.what} (needs {cap.api}, torch >= {cap.since})"
    return out


def _torch_at_least(version: str) -> bool:
    """Whether the installed torch's release is ``version`` or later (read without judging the module)."""
    import torch

    def parts(v):
        return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in v.split("+")[0].split(".")[:2])

    return parts(torch.__version__) >= parts(version)


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
