"""Tables of the layout search (:mod:`lessonlib.calc.layout`): rendering only."""
from __future__ import annotations

from ..checks import sequence
from ..calc.layout import LayoutCost
from .tables import table


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f}"


def layout_table(costs, published=None) -> str:
    """An HTML table of :class:`~lessonlib.calc.layout.LayoutCost` rows: the layout, memory on the busiest
    device (GB, decimal), the step's seconds by part and the MFU it implies. A row whose degrees equal
    ``published`` (a :class:`~lessonlib.calc.layout.Layout`) is marked "published"."""
    costs = sequence("costs", costs)
    for i, c in enumerate(costs):
        if not isinstance(c, LayoutCost):
            raise TypeError(f"costs[{i}] must be a LayoutCost, got {type(c).__name__}")
    key = None if published is None else (published.tensor, published.context, published.pipeline,
                                          published.data, published.expert)
    rows = []
    for i, c in enumerate(costs, 1):
        lay = c.layout
        mark = " (published)" if key == (lay.tensor, lay.context, lay.pipeline, lay.data, lay.expert) else ""
        comm = c.tensor_comm_s + c.context_comm_s + c.pipeline_comm_s + c.data_comm_s + c.expert_comm_s
        rows.append([i, lay.label() + mark, _gb(c.memory_bytes), f"{c.compute_s:.2f}", f"{c.bubble_s:.2f}",
                     f"{comm:.2f}", f"{c.step_s:.2f}", f"{100 * c.mfu:.1f} %"])
    return table(["#", "layout", "memory (GB)", "compute (s)", "bubble (s)", "exposed comm. (s)",
                       "step (s)", "MFU"], rows)


def side_by_side_table(first, second, names=("first choice", "published")) -> str:
    """Two :class:`~lessonlib.calc.layout.LayoutCost` rows term by term: each part of the step (seconds), the
    step, the compute share, the MFU and the memory margin on the busiest device (GB), with the difference."""
    for name, c in (("first", first), ("second", second)):
        if not isinstance(c, LayoutCost):
            raise TypeError(f"{name} must be a LayoutCost, got {type(c).__name__}")
    names = sequence("names", names)
    if len(names) != 2:
        raise ValueError(f"names must name the two layouts, got {len(names)} names")
    # short labels (TP, CP, PP, DP, EP as the layout labels write them), so that the column does not wrap
    parts = [("compute (s)", "compute_s"), ("bubble (s)", "bubble_s"),
             ("TP comm. (s)", "tensor_comm_s"), ("CP comm. (s)", "context_comm_s"),
             ("PP sends (s)", "pipeline_comm_s"), ("DP comm.* (s)", "data_comm_s"),
             ("EP all-to-all* (s)", "expert_comm_s"), ("step (s)", "step_s")]
    rows = [["layout", first.layout.label(), second.layout.label(), ""]]
    for label, attr in parts:
        a, b = getattr(first, attr), getattr(second, attr)
        # the difference of the values as shown, so that the column adds up as a reader checks it
        rows.append([label, f"{a:.2f}", f"{b:.2f}", f"{round(b, 2) - round(a, 2):+.2f}"])
    rows.append(["compute share", f"{100 * first.compute_share:.0f} %",
                 f"{100 * second.compute_share:.0f} %", ""])
    rows.append(["predicted MFU", f"{100 * first.mfu:.1f} %", f"{100 * second.mfu:.1f} %", ""])
    for label, fn in (("memory (GB)", lambda c: c.memory_bytes),
                      ("memory free (GB)", lambda c: c.capacity_bytes - c.memory_bytes)):
        a, b = fn(first), fn(second)
        rows.append([label, _gb(a), _gb(b), f"{round(b / 1e9, 1) - round(a / 1e9, 1):+.1f}"])
    rows.append(["* exposed: what no compute hides", "", "", ""])
    return table(["term", str(names[0]), str(names[1]), "difference"], rows)
