"""The overlap page's table and timeline (chapter 3, hiding communication behind compute).

Both read :class:`lessonlib.measure.distributed.overlap.OverlapRun` pieces:
``overlap_table`` its rows, ``plot_overlap_timeline`` one rank-by-rank timeline.
Times are shown in milliseconds.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ..checks import amount as check_amount, mapping as check_mapping, reads as _reads, sequence as check_sequence
from .plots import COLORS
from .tables import table

COMM_COLOR = "#55A868"


@_reads("rows", "compute", signed=("rows",))
def overlap_table(rows, compute: float):
    """An HTML table: one row per :class:`OverlapRow`, after a compute-only row (``compute`` seconds)."""
    rows = check_sequence("rows", rows)
    compute = check_amount("compute", compute)
    out = [["forward + backward, no exchange (compute)", f"{1e3 * compute:.2f}", "–", "–", "–"]]
    for r in rows:
        if not r.measured_against:
            hidden = "–"
        elif r.measured_against == r.variant:
            hidden = "0 % (the baseline)"
        else:
            clipped = "" if r.hidden == r.hidden_raw else f" (unclipped {100 * r.hidden_raw:+.0f} %)"
            hidden = f"{100 * r.hidden:.0f} %{clipped}"
        out.append([r.label, f"{1e3 * r.step:.2f}", f"{1e3 * r.comm:.2f}", f"{1e3 * r.exposed:+.2f}", hidden])
    return table(["variant", "step (ms)", "communication alone (ms)", "exposed = step − compute (ms)",
                  "hidden share, against the step with one all-reduce after backward"], out)


@_reads("timeline", signed=("timeline",))  # the earlier rank starts before 0
def plot_overlap_timeline(timeline):
    """One step of each DDP variant, rank by rank: forward, backward and each bucket's all-reduce (ms).

    ``timeline`` is :attr:`OverlapRun.timeline`: a list (one per rank) of
    ``{variant: {"forward": (start, end), "backward": (start, end), "end": t,
    "comm": [{"start", "end", "bytes", ...}]}}``, seconds from the later rank's start (the
    earlier rank's first times are negative).
    """
    ranks = check_sequence("timeline", timeline)
    variants = list(check_mapping("timeline[0]", ranks[0]))
    fig, axes = plt.subplots(len(variants), 1, figsize=(9, 2.0 + 1.3 * len(variants) * len(ranks)), sharex=True)
    axes = [axes] if len(variants) == 1 else list(axes)
    for ax, variant in zip(axes, variants):
        labels = []
        for rank, per_variant in enumerate(ranks):
            ev = per_variant[variant]
            y_compute, y_comm = 2 * rank + 1, 2 * rank
            ax.broken_barh([(ev["forward"][0] * 1e3, (ev["forward"][1] - ev["forward"][0]) * 1e3)], (y_compute - 0.4, 0.8),
                           color=COLORS["forward"], label="forward" if rank == 0 else None)
            ax.broken_barh([(ev["backward"][0] * 1e3, (ev["backward"][1] - ev["backward"][0]) * 1e3)],
                           (y_compute - 0.4, 0.8), color=COLORS["backward"], label="backward" if rank == 0 else None)
            lane = 0.8 / max(1, len(ev["comm"]))  # one thin lane per bucket, first bucket at the top
            for i, c in enumerate(ev["comm"]):
                ax.broken_barh([(c["start"] * 1e3, (c["end"] - c["start"]) * 1e3)],
                               (y_comm + 0.4 - (i + 1) * lane, 0.9 * lane),
                               facecolor=COMM_COLOR, edgecolor="black", linewidth=0.5,
                               label="all-reduce of one bucket" if rank == 0 and i == 0 else None)
            ax.axvline(ev["end"] * 1e3, color="0.4", linestyle=":", linewidth=1)
            labels += [(y_comm, f"rank {rank} comm"), (y_compute, f"rank {rank} compute")]
        ax.set_yticks([y for y, _ in labels], [t for _, t in labels])
        ax.set_title(variant, fontsize=10)
        ax.set_ylim(-0.7, 2 * len(ranks) - 0.3)
    axes[-1].set_xlabel("time from the later rank's start (ms); dotted line: the step ends on that rank")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", fontsize=8, ncol=3, frameon=False)
    fig.suptitle("One step on each rank: compute and gradient communication")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig
