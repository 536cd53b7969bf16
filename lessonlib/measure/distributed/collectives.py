"""Count the collectives a piece of code issues, and the bytes each one handles.

:class:`CollectiveLog` is PyTorch's ``CommDebugMode`` (which counts
collectives by kind, forward and backward) with one addition: for every
collective it also records the size of the full tensor it handles, in bytes
(the all-reduced tensor, the all-gathered output, the reduce-scattered input).
That is the ``n`` of the formulas in :mod:`lessonlib.calc.comm` and
:mod:`lessonlib.calc.sharding`. CommDebugMode keeps only counts, so the size
is read here from the operation's tensors: the largest one among its inputs
and outputs. :class:`CollectiveTimer` times the all-gathers and reduce-scatters
issued inside it (the overlap page splits FSDP2's step with it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten

from ...checks import text as check_text
from ..compat import base_class

# torch.distributed.tensor.debug arrived in torch 2.5: without it this module still imports, and
# CollectiveLog() raises compat.Unavailable naming it (pages check compat.requires first).
CommDebugMode = base_class("comm_debug_mode")

__all__ = ["Collective", "CollectiveLog", "CollectiveTimer", "collective_kind"]


@dataclass(frozen=True)
class Collective:
    """One collective: ``kind`` ("all_reduce", "all_gather", ...), ``phase``
    ("forward" or "backward") and ``n_bytes`` (bytes of the full tensor)."""

    kind: str
    phase: str
    n_bytes: int


def collective_kind(op_name: str) -> str:
    """A torch collective op's name (``c10d._allgather_base_``, ``_c10d_functional.all_reduce``...)
    as one of ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast`` or itself."""
    flat = check_text("op_name", op_name).lower().replace("_", "")
    for key, kind in (("allreduce", "all_reduce"), ("allgather", "all_gather"),
                      ("reducescatter", "reduce_scatter"), ("alltoall", "all_to_all"),
                      ("broadcast", "broadcast")):
        if key in flat:
            return kind
    return op_name


class CollectiveLog(CommDebugMode):
    """``CommDebugMode`` that also lists every collective with its tensor bytes.

    Use as a context manager around forward and backward; then
    ``.records`` is a list of :class:`Collective` in the order issued, and
    :meth:`summary` totals them by kind and phase. ``get_comm_counts()`` and
    the other CommDebugMode methods work as usual.
    """

    def __init__(self):
        super().__init__()
        self.records: list[Collective] = []

    def __enter__(self):
        self.records = []
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = self.get_total_counts()
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is not NotImplemented and self.get_total_counts() > before:
            leaves, _ = tree_flatten((args, kwargs or {}, out))
            sizes = [t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor)]
            phase = "backward" if self.advanced_module_tracker.is_bw else "forward"
            self.records.append(Collective(collective_kind(str(func._overloadpacket)), phase, max(sizes, default=0)))
        return out

    def summary(self) -> dict:
        """``{(kind, phase): {"count": n, "bytes": total}}`` over the records."""
        out: dict = {}
        for r in self.records:
            d = out.setdefault((r.kind, r.phase), {"count": 0, "bytes": 0})
            d["count"] += 1
            d["bytes"] += r.n_bytes
        return out

    def totals(self) -> dict:
        """``{kind: {"count": n, "bytes": total}}``, forward and backward together."""
        out: dict = {}
        for r in self.records:
            d = out.setdefault(r.kind, {"count": 0, "bytes": 0})
            d["count"] += 1
            d["bytes"] += r.n_bytes
        return out


#: The torch.distributed functions FSDP2 issues its collectives through (older torch: the *_tensor names).
_TIMED = ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single", "reduce_scatter_tensor")


class CollectiveTimer:
    """Inside ``with``, every all-gather and reduce-scatter issued through torch.distributed is timed.

    ``seconds``: the wall time the calling thread spent inside them, waits for the other processes
    included (FSDP2 issues them synchronously on gloo, so a call lasts until its collective is done; on
    a GPU a call only queues it). A call that another timed call makes inside it is counted once.
    """

    def __init__(self):
        self.seconds, self._depth, self._saved = 0.0, 0, {}

    def _wrap(self, fn):
        def timed(*args, **kwargs):
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds += time.perf_counter() - start
        return timed

    def __enter__(self):
        import torch.distributed as dist

        self.seconds = 0.0
        self._saved = {n: getattr(dist, n) for n in _TIMED if hasattr(dist, n)}
        for name, fn in self._saved.items():
            setattr(dist, name, self._wrap(fn))
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist

        for name, fn in self._saved.items():
            setattr(dist, name, fn)
