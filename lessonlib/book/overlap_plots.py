"""The overlap page's table and timeline (chapter 3, hiding communication behind compute).

Both read :class:`lessonlib.measure.distributed.overlap.OverlapRun` pieces:
``overlap_table`` its rows, ``plot_overlap_timeline`` one rank-by-rank timeline.
Times are shown in milliseconds.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ..checks import mapping as check_mapping, reads as _reads, sequence as check_sequence
from .plots import COLORS
from .tables import table

COMM_COLOR = "#55A868"
#: The part of an all-reduce bar before the other rank has started the same all-reduce: waiting, not moving bytes.
WAIT_COLOR = "#C9E6D1"


#: The rows of the communication alone, by name in ``OverlapRun.per_round``.
COMM_ALONE = {"allreduce": "one all-reduce of the gradients, no compute",
              "fsdp_comm": "FSDP2's all-gathers and reduce-scatters replayed, no compute"}


@_reads("run", signed=("run",))  # exposed times and the timeline may be negative
def overlap_table(run):
    """An HTML table of an :class:`~lessonlib.measure.distributed.overlap.OverlapRun`, medians over its rounds (ms).

    Compute alone, then the communication alone that the run timed, then one row per variant: its step and its
    exposed time (step − compute, each round against its own compute) with the middle half of the rounds."""
    out = [["forward + backward, no exchange (compute)", f"{1e3 * run.median('compute'):.2f}", "–"]]
    out += [[label, f"{1e3 * run.median(name):.2f}", "–"] for name, label in COMM_ALONE.items() if name in run.per_round]
    for r in run.rows:
        lo, mid, hi = (1e3 * q for q in r.exposed_quartiles)
        out.append([r.label, f"{1e3 * run.median(r.variant):.2f}", f"{mid:+.2f} ({lo:+.2f} to {hi:+.2f})"])
    return table(["variant", "step, median (ms)", "exposed = step − compute, median (middle half) (ms)"], out)


@_reads("timeline", signed=("timeline",))  # the earlier rank starts before 0
def plot_overlap_timeline(timeline):
    """One step of each DDP variant, rank by rank: forward, backward and each bucket's all-reduce (ms).

    An all-reduce bar runs from the moment its rank started it to the moment it ended there; the part
    before the last rank started the same bucket's all-reduce is drawn pale (hatched): waiting for that
    rank. A dotted line, labelled, marks where each rank's step ends. ``timeline`` is :attr:`OverlapRun.timeline`: a list (one per rank) of
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
        last_start = {}  # bucket -> the latest start of its all-reduce over the ranks: before it, a rank waits
        for per_variant in ranks:
            for c in per_variant[variant]["comm"]:
                last_start[c["bucket"]] = max(last_start.get(c["bucket"], c["start"]), c["start"])
        for rank, per_variant in enumerate(ranks):
            ev = per_variant[variant]
            y_compute, y_comm = 2 * rank + 1, 2 * rank
            ax.broken_barh([(ev["forward"][0] * 1e3, (ev["forward"][1] - ev["forward"][0]) * 1e3)], (y_compute - 0.4, 0.8),
                           color=COLORS["forward"], label="forward" if rank == 0 else None)
            ax.broken_barh([(ev["backward"][0] * 1e3, (ev["backward"][1] - ev["backward"][0]) * 1e3)],
                           (y_compute - 0.4, 0.8), color=COLORS["backward"], label="backward" if rank == 0 else None)
            lane = 0.8 / max(1, len(ev["comm"]))  # one thin lane per bucket, first bucket at the top
            for i, c in enumerate(ev["comm"]):
                both = min(max(last_start[c["bucket"]], c["start"]), c["end"])  # both ranks have started it
                y = (y_comm + 0.4 - (i + 1) * lane, 0.9 * lane)
                if both > c["start"]:
                    ax.broken_barh([(c["start"] * 1e3, (both - c["start"]) * 1e3)], y, facecolor=WAIT_COLOR,
                                   edgecolor="black", linewidth=0.5, hatch="///", label="waiting for the other rank")
                ax.broken_barh([(both * 1e3, (c["end"] - both) * 1e3)], y,
                               facecolor=COMM_COLOR, edgecolor="black", linewidth=0.5,
                               label="all-reduce of one bucket" if rank == 0 and i == 0 else None)
            ax.axvline(ev["end"] * 1e3, color="0.4", linestyle=":", linewidth=1)
            # in the free band above the bars: the last rank to end labelled right of its line, the others left
            # of theirs, so that two close lines get labels pointing away from each other
            last = ev["end"] >= max(r[variant]["end"] for r in ranks)
            ax.text(ev["end"] * 1e3, 2 * len(ranks) - 0.45, f" rank {rank} ends ", fontsize=8, va="center",
                    ha="left" if last else "right", color="0.25")
            labels += [(y_comm, f"rank {rank} comm"), (y_compute, f"rank {rank} compute")]
        ax.set_yticks([y for y, _ in labels], [t for _, t in labels])
        ax.set_title(variant, fontsize=10)
        ax.set_ylim(-0.7, 2 * len(ranks) + 0.3)
    axes[-1].set_xlabel("time from the later rank's start (ms)")
    legend = {}
    for ax in axes:  # one entry per label, whichever panel drew it
        for handle, name in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(name, handle)
    axes[-1].legend(list(legend.values()), list(legend), loc="upper center", bbox_to_anchor=(0.5, -0.22),
                    fontsize=8, ncol=2, frameon=False)  # under the time axis, where it hides no bar
    fig.suptitle("One step on each rank: compute and gradient communication")
    fig.tight_layout()
    return fig
