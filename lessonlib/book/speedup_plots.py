"""Figures of the distributed-speedup chapter: Amdahl, data parallel, the four splits, goodput.

Each function draws one figure (title, labelled axes with units) and returns
it through :func:`lessonlib.book.plots.show`, alt text included, so a page
cell is one call. Inputs are the page's own results; nothing is measured here.
"""
from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt

from ..calc.amdahl import gustafson_speedup, speedup_from_share
from ..calc.collectives import ring_allreduce_bytes
from ..calc.goodput import goodput
from ..calc.pipeline import pipeline_bubble_fraction
from ..calc.goodput import check_runs
from ..checks import amount, counts, count, mapping, positive, sequence, share as check_share, text
from ..checks import reads as _reads
from ..measure.distributed.data_parallel import DataParallelRow
from .plots import show


def growing_communication(share: float, ns, per_step: float) -> list[float]:
    """Speedups on ``ns`` devices with a communication cost of ``per_step`` x 2(n-1) of the one-device time."""
    check_share("share", share)
    ns = counts("ns", ns)
    per_step = amount("per_step", per_step)
    return [speedup_from_share(share, n, per_step * 2 * (n - 1)) for n in ns]


def amdahl_figure(ns, shares, share: float, fixed: float, per_step: float):
    """Left: Amdahl's speedup against devices for several serial ``shares``, and, at ``share`` (drawn black, and
    added to ``shares`` if absent), Gustafson's scaled speedup of the same one-device job grown with the devices
    (dashed): one serial share for both lines. Right: serial ``share``
    with no, a ``fixed`` and a growing (``per_step`` x 2(n-1)) communication cost (shares of the one-device time,
    each at most 10)."""
    ns = counts("ns", ns)
    shares = [check_share(f"shares[{i}]", s) for i, s in enumerate(sequence("shares", shares))]
    share = check_share("share", share)
    amount("fixed", fixed, maximum=10.0)  # communication of up to 10 times the one-device time: a readable legend
    amount("per_step", per_step, maximum=10.0)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for sh in sorted(set(shares) | {share}):
        ax1.plot(ns, [speedup_from_share(sh, n) for n in ns], marker="o", ms=3, label=f"Amdahl, serial share {sh:.0%}",
                 **({"color": "black"} if sh == share else {}))
    # Gustafson's job on n devices takes the one-device job's time, so its serial share of that time is `share` too
    ax1.plot(ns, [gustafson_speedup(share, n) for n in ns], ls="--", color="black", lw=1,
             label=f"Gustafson's scaled speedup, serial share {share:.0%}:\nanother quantity: the job grows")
    ax1.set(xscale="log", yscale="log", xlabel="devices (count, log scale)",
            ylabel="speedup; dashed: scaled speedup (×, log)",
            title="A fixed job (Amdahl) or a growing job (Gustafson)")
    ax1.set_xticks(ns, [str(n) for n in ns])
    ax1.legend(fontsize=8)
    curves = {
        "no communication": [speedup_from_share(share, n) for n in ns],
        f"fixed communication ({fixed:.0%} of one-device time)": [speedup_from_share(share, n, fixed) for n in ns],
        f"growing communication ({per_step:.1%} × 2(n−1))": growing_communication(share, ns, per_step),
    }
    for label, ys in curves.items():
        ax2.plot(ns, ys, marker="o", ms=3, label=label)
    if share > 0:  # the ceiling; with no serial work there is none
        ax2.axhline(1 / share, color="grey", ls=":", lw=1, label=f"ceiling 1 / serial share = {1 / share:.3g}×")
    ax2.set(xscale="log", xlabel="devices (count, log scale)", ylabel="speedup (×)",
            title=f"Serial share {share:.0%}, with communication")
    ax2.set_xticks(ns, [str(n) for n in ns])
    # headroom above the ceiling, and the legend in it, so that no curve runs under the legend
    top = max(max(ys) for ys in curves.values())
    ax2.set_ylim(0, 1.75 * max(top, 1 / share if share > 0 else top))
    ax2.legend(fontsize=8, loc="upper left", ncol=1)
    pct = ", ".join(f"{100 * s:g}" for s in sorted(set(shares) | {share}) if s > 0)
    return show(fig, alt="Two line charts of speedup against device count on a log axis. Left: Amdahl's speedup of a "
                f"fixed job; with no serial work it grows in step with the devices; with {pct} percent serial work each "
                f"curve flattens towards a ceiling of one over the serial share. A dashed line, Gustafson's scaled "
                f"speedup (another quantity: how much larger a job finishes in the same time) at the same {100 * share:g} percent serial share as the black curve, starts from the same "
                "one-device job, which grows with the devices, and rises in a straight line with no ceiling. Right: "
                f"serial share {100 * share:g} percent; a fixed communication cost lowers the ceiling; a communication "
                "cost that grows with the device count makes "
                "the speedup peak and then fall. A dotted line marks the ceiling, one over the serial share.")


@_reads("rows")
def data_parallel_figure(rows: list, world_size: int):
    """The sum of measured pieces against the measured two-process step (left), and speedup against batch
    (right): measured, the sum of measured pieces, and the ideal-compute prediction
    (:attr:`~lessonlib.measure.distributed.data_parallel.DataParallelRow.ideal_device_step`).

    ``rows`` are the :class:`~lessonlib.measure.distributed.data_parallel.DataParallelRow` of a
    :func:`~lessonlib.measure.distributed.data_parallel.run_data_parallel` run (seconds).
    """
    for i, r in enumerate(sequence("rows", rows)):
        if not isinstance(r, DataParallelRow):
            raise TypeError(f"rows[{i}] must be one of run_data_parallel's rows (a DataParallelRow), got {r!r:.80}")
    world_size = count("world_size", world_size, minimum=2)
    labels = [f"{r.global_batch:,}" for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11.5, 4.3))
    xs = range(len(rows))
    w = 0.38
    bottom = [0.0] * len(rows)
    for key, label, color in (("half_compute", "compute on half the batch", "#4C72B0"),
                              ("optimizer", "optimizer step (repeated)", "#55A868"),
                              ("allreduce", "all-reduce of gradients", "#C44E52")):
        vals = [getattr(r, key) / r.single for r in rows]
        ax1.bar([x - w / 2 for x in xs], vals, w, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax1.bar([x + w / 2 for x in xs], [r.ddp / r.single for r in rows], w, color="#8C8C8C",
            label="measured two-process step")
    ax1.axhline(1.0, color="black", lw=1, ls="--", label="one-process step")
    ax1.set_xticks(list(xs), labels)
    ax1.set(xlabel="global batch (examples)", ylabel="time / one-process step time (ratio)",
            title="Two-process step: sum of measured pieces\n(left bar) vs measured (right bar), per batch")
    ax1.legend(fontsize=8)
    gb = [r.global_batch for r in rows]
    ax2.plot(gb, [r.speedup for r in rows], marker="o", label="measured")
    ax2.plot(gb, [r.predicted_speedup for r in rows], marker="s", ls="--", label="sum of measured pieces")
    ax2.plot(gb, [r.single / r.ideal_device_step for r in rows], marker="^", ls="-.",
             label="ideal compute, this machine's exchange")
    ax2.axhline(1, color="black", lw=1, ls=":")
    ax2.axhline(world_size, color="grey", lw=1, ls=":")
    ax2.text(gb[0], world_size * 0.97, f"{world_size}× (linear)", va="top", fontsize=8)
    ax2.text(gb[0], 1.03, "1× (no gain)", va="bottom", fontsize=8)
    ax2.set(xscale="log", xlabel="global batch (examples, log scale)", ylabel="speedup (×)",
            title=f"Speedup of {world_size} processes over 1, same global batch", ylim=(0, world_size * 1.1))
    ax2.set_xticks(gb, labels)
    ax2.legend(fontsize=8)
    first, last = rows[0], rows[-1]
    shown = lambda r, step: round(1e3 * r.single, 2) / round(1e3 * step, 2)  # as the table prints: 0.01 ms times
    return show(fig, alt="Left: for each global batch, a stacked bar of the sum of measured pieces (compute on half the "
                "batch, the repeated optimizer step, the all-reduce) beside the measured two-process step, both relative "
                "to the one-process step. The measured two-process step takes "
                f"{first.ddp / first.single:.0%} of the one-process step at a batch of {first.global_batch} "
                f"and {last.ddp / last.single:.0%} at {last.global_batch}; the optimizer and all-reduce "
                "pieces are a large part of the bar at small batch and a small part at large batch. Right: the measured "
                "speedup against global batch, with the speedups of the sum of measured pieces and of the ideal-compute "
                "prediction (forward and backward divided exactly, this machine's exchange), and reference lines at 1x and "
                f"{world_size}x; measured {shown(first, first.ddp):.2f}x at the smallest batch and {shown(last, last.ddp):.2f}x "
                f"at the largest, against {shown(last, last.ideal_device_step):.2f}x for the ideal-compute prediction there.")


def allreduce_volume_figure(grad_bytes: int, ns, name: str):
    """Bytes each device sends per ring all-reduce of ``grad_bytes`` against the device count."""
    amount("grad_bytes", grad_bytes)
    ns = counts("ns", ns)
    text("name", name)
    vol = [ring_allreduce_bytes(grad_bytes, n) / 1e9 for n in ns]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(ns, vol, marker="o", label="sent per device, ring all-reduce")
    ax.axhline(2 * grad_bytes / 1e9, color="grey", ls=":", label="2 × gradient bytes (the limit)")
    ax.axhline(grad_bytes / 1e9, color="grey", ls="--", lw=1, label="gradient bytes")
    ax.set(xscale="log", xlabel="devices (count, log scale)", ylabel="bytes sent per device per step (GB)",
           title=f"All-reduce volume for a {name}-parameter model, bf16 gradients")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.legend(fontsize=8)
    return show(fig, alt="Bytes each device sends per all-reduce against the number of devices: zero for one "
                "device, equal to the gradient size for two, rising towards twice the gradient size as the ring grows.")


#: The largest schedule :func:`pipeline_schedule_figure` draws (a chart stays readable; each task is a labelled bar).
MAX_GANTT_STAGES, MAX_GANTT_MICRO = 16, 32


def _gantt(ax, tasks, stages: int, fontsize: float) -> None:
    cmap = plt.get_cmap("tab10")
    for t in tasks:
        ax.broken_barh([(t["start"], t["end"] - t["start"])], (t["stage"] - 0.4, 0.8),
                       facecolors=cmap(t["microbatch"] % 10), edgecolor="white",
                       alpha=1.0 if t["kind"] == "F" else 0.55)
        ax.text((t["start"] + t["end"]) / 2, t["stage"], f"{t['kind']}{t['microbatch']}", ha="center",
                va="center", fontsize=fontsize, clip_on=True)
    ax.set_yticks(range(stages), [f"stage {s}" for s in range(stages)])
    ax.invert_yaxis()


@_reads("tasks")
def pipeline_schedule_figure(tasks: list, stages: int, micro: int, idle: float):
    """Gantt chart of a pipeline schedule (``lessonlib.calc.pipeline.pipeline_schedule``'s tasks).

    At most :data:`MAX_GANTT_STAGES` stages and :data:`MAX_GANTT_MICRO` micro-batches."""
    from ..calc.pipeline import schedule_idle_fraction

    stages = count("stages", stages, maximum=MAX_GANTT_STAGES)
    micro = count("micro", micro, maximum=MAX_GANTT_MICRO)
    check_share("idle", idle)
    tasks = sequence("tasks", tasks)
    if len(tasks) > 2 * stages * micro:
        raise ValueError(f"tasks has {len(tasks):,} tasks; a schedule of {stages} stages and {micro} "
                         f"micro-batches has {2 * stages * micro:,}")
    schedule_idle_fraction(tasks)  # checks every task
    for i, t in enumerate(tasks):
        if t.get("kind") not in ("F", "B") or "microbatch" not in t:
            raise TypeError(f"tasks[{i}] must be one of pipeline_schedule's tasks, got {t!r:.80}")
        if not (isinstance(t["stage"], int) and 0 <= t["stage"] < stages
                and isinstance(t["microbatch"], int) and 0 <= t["microbatch"] < micro):
            raise ValueError(f"tasks[{i}] has stage {t['stage']!r:.20} and microbatch {t['microbatch']!r:.20}; "
                             f"stages is {stages} and micro {micro}")
    title = (f"GPipe schedule: {stages} stages, {micro} micro-batches (F = forward, B = backward); "
             f"white gaps are the bubble, {idle:.0%} of the time")
    xlabel = "time (units of one micro-batch's forward pass on one stage)"
    fig, ax = plt.subplots(figsize=(11, 3.2))
    _gantt(ax, tasks, stages, fontsize=7)
    ax.set(xlabel=xlabel, ylabel="device", title=title)
    # A phone gets the same time line cut into rows, each wide enough to read its labels.
    end = max(t["end"] for t in tasks)
    rows = max(1, min(4, round(end / 12)))
    phone, axes = plt.subplots(rows, 1, figsize=(4.6, 0.5 + (0.45 * stages + 0.5) * rows), squeeze=False)
    for i, pax in enumerate(axes[:, 0]):
        _gantt(pax, tasks, stages, fontsize=8)
        pax.set_xlim(end * i / rows, end * (i + 1) / rows)
        pax.set_ylabel("device")
    axes[-1, 0].set_xlabel(textwrap.fill(xlabel, 45))
    phone.suptitle(textwrap.fill(title, 50), fontsize=10)
    phone.tight_layout()
    return show(fig, phone=phone, alt=f"Gantt chart of {stages} pipeline stages. Forward tasks of {micro} micro-batches move "
                f"diagonally from stage 0 to stage {stages - 1}, then backward tasks, twice as long, move back to "
                "stage 0. Each stage is idle at the start and the end of each phase: the triangular gaps are the "
                "pipeline bubble.")


def bubble_figure(ms=(1, 2, 4, 8, 16, 32, 64), ps=(2, 4, 8, 16)):
    """The bubble (p-1)/(m+p-1), in percent, against micro-batches ``ms`` for stage counts ``ps``."""
    ms, ps = counts("ms", ms), counts("ps", ps)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for p in ps:
        ax.plot(ms, [100 * pipeline_bubble_fraction(p, m) for m in ms], marker="o", label=f"{p} stages")
    ax.set(xscale="log", xlabel="micro-batches per step (count, log scale)", ylabel="bubble (% of step time)",
           title="Pipeline bubble (p−1)/(m+p−1)")
    ax.set_xticks(list(ms), [str(m) for m in ms])
    ax.legend(fontsize=8)
    return show(fig, alt="Bubble percentage against micro-batch count for " + ", ".join(map(str, ps)) + " stages: "
                "each curve starts high with one micro-batch and falls as micro-batches are added; more stages "
                "need more micro-batches for the same bubble.")


@_reads("runs")
def stall_figure(runs: list, stall_step: int, stall_s: float, stalled_rank: int = 1):
    """Steps completed against wall-clock time for each process of a job with one stall."""
    check_runs(runs)
    for i, r in enumerate(runs):
        if "rank" not in r:
            raise TypeError(f"runs[{i}] must say its 'rank'")
    stall_step = count("stall_step", stall_step)
    if stall_step >= len(runs[0]["wall"]):
        raise ValueError(f"stall_step must be below the number of steps ({len(runs[0]['wall'])}), got {stall_step}")
    amount("stall_s", stall_s)
    count("stalled_rank", stalled_rank, minimum=0)
    steps = len(runs[0]["wall"])
    w0 = runs[0]["wall"]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for r, style in zip(runs, ("-", "--", "-.", ":")):
        ax.step(r["wall"], range(1, steps + 1), where="post", ls=style,
                label=f"process {r['rank']}{' (stalls)' if r['rank'] == stalled_rank else ''}")
    ax.axvspan(w0[stall_step - 1], w0[stall_step], color="#C44E52", alpha=0.15, label="the stall: paid, no progress")
    ax.set(xlabel="wall-clock time (s)", ylabel="training steps completed (count)",
           title=f"{len(runs)} processes, one stall of {stall_s} s: all stop")
    ax.legend(fontsize=8, loc="lower right")
    return show(fig, alt=f"Steps completed against wall-clock time for {len(runs)} processes. All climb steeply, "
                "then all stay flat for the length of the stall although only one process stalled, then climb "
                "again. The flat stretch is shaded as paid time with no progress.")


def goodput_figure(ns, serial_share: float, ckpt_s: float, restart_s: float, mtbfs=(5_000, 50_000, 500_000),
                   contrast_share=None, marks=None, title=None, rate_label: str = "device MTBF",
                   input_note=None):
    """What failures cost as a job grows, for device MTBFs ``mtbfs`` (hours): the share of time lost, and
    one-device hours per paid device-hour beside the no-failure line (see :func:`plot_goodput_failures`).

    ``contrast_share`` (a serial share) adds a dotted contrast curve with the first MTBF's failures;
    ``marks`` maps a label to one-device hours per paid device-hour at the largest count (a real run's
    points); ``title`` replaces the default title; ``rate_label`` names the failure rate in the legend;
    ``input_note`` marks the left panel's point at the largest count as an input, not a result (a restart
    time back-solved to give it), with that text beside it and in the alt text.
    """
    ns = counts("ns", ns)
    check_share("serial_share", serial_share)
    positive("ckpt_s", ckpt_s)
    amount("restart_s", restart_s)
    mtbfs = [positive(f"mtbfs[{i}]", m) for i, m in enumerate(sequence("mtbfs", mtbfs))]
    if contrast_share is not None:
        check_share("contrast_share", contrast_share)
    marks = {} if marks is None else mapping("marks", marks)
    for label, value in marks.items():
        text("marks", label)
        positive(f"marks[{label!r}]", value)
    if title is not None:
        text("title", title)
    text("rate_label", rate_label)
    if input_note is not None:
        text("input_note", input_note)
    try:
        rows = {f"{rate_label} {mt:,.0f} h": [goodput(n, speedup_from_share(serial_share, n), mt, ckpt_s, restart_s)
                                            for n in ns] for mt in mtbfs}
        contrast = None if contrast_share is None else (
            f"a contrast: serial share {100 * contrast_share:g} %, failures at {mtbfs[0]:,.0f} h",
            [goodput(n, speedup_from_share(contrast_share, n), mtbfs[0], ckpt_s, restart_s).per_device_hour
             for n in ns])
    except ValueError as err:  # goodput names its own arguments; say which of the caller's gave them
        raise ValueError(f"ckpt_s ({ckpt_s:g} s) and mtbfs ({', '.join(f'{m:g}' for m in mtbfs)} h) give no "
                         f"answer for {ns[-1]:,} devices: {err}") from None
    no_failure = [speedup_from_share(serial_share, n) / n for n in ns]
    default = (f"Serial share {serial_share:.1%}, saves of {round(ckpt_s):,} s, restarts of "
               f"{round(restart_s / 60, 1):g} min")
    fig = plot_goodput_failures(list(ns), rows, no_failure, title=default if title is None else title,
                                contrast=contrast, marks=marks or None, input_note=input_note)
    lost = "; ".join(f"{100 * (1 - gs[-1].useful_fraction):.0f} % for {rate_label} {mt:,.0f} h"
                     for mt, gs in zip(mtbfs, rows.values()))
    extra = ""
    if contrast is not None:
        extra += (f" A dotted contrast curve, a fixed serial share of {100 * contrast_share:g} %, falls to "
                  f"{contrast[1][-1]:.3f} at {ns[-1]:,} devices.")
    if marks:
        extra += f" Points at {ns[-1]:,} devices: " + "; ".join(f"{k} {v:.3f}" for k, v in marks.items()) + "."
    two = len(fig.axes) > 1
    alt = ("" if title is None else " ".join(title.split()) + ". ")
    alt += (f"{'Left panel' if two else 'A line chart'}: the share of wall-clock time lost to saves, redone work "
            f"and restarts, against the device count ({ns[0]:,} to {ns[-1]:,}, log axis). The loss grows with the "
            f"devices, since a job on n devices fails n times as often. At {ns[-1]:,} devices it is {lost}.")
    if input_note is not None:
        alt += f" That value is a point marked on the figure: {' '.join(input_note.split())}."
    if two:
        alt += (" Right panel: one-device hours of progress per paid device-hour"
                + (" (log axis)" if fig.axes[1].get_yscale() == "log" else "")
                + f", serial share {100 * serial_share:g} %. The dotted no-failure line lies on top"
                + (" (perfect scaling, flat at 1)" if serial_share == 0 else "")
                + "; the failure curves fall further below it as devices are added.")
    return show(fig, alt=alt + extra)


#: The right panel of :func:`plot_goodput_failures` is on a log axis only when its largest value is more than this
#: many times its smallest: a contrast that falls to a twentieth needs one; curves between 0.55 and 1 read better
#: on a linear axis.
LOG_SPAN = 3.0


def progress_on_log_axis(values) -> bool:
    """Whether progress per paid device-hour ``values`` (one-device hours, all > 0) span more than :data:`LOG_SPAN`."""
    values = [positive(f"values[{i}]", v) for i, v in enumerate(sequence("values", values))]
    if not values:
        raise ValueError("values must hold at least one value")
    return max(values) > LOG_SPAN * min(values)


@_reads("rows", "no_failure")
def plot_goodput_failures(world_sizes: list, rows: dict, no_failure: list, title: str = "", contrast=None,
                          marks=None, input_note=None):
    """Two panels on what failures cost a synchronous job as it grows.

    ``world_sizes`` is the device counts (each a ``world_size``); ``rows`` maps a curve label (e.g. a
    device MTBF) to a list of :class:`lessonlib.calc.goodput.Goodput`, one
    per device count; ``no_failure`` is speedup / devices alone (Amdahl).
    Left: share of wall-clock time lost to saves, redone work and restarts (%, linear). Right, unless the serial
    share is 0 with no contrast or marks (it would restate the left): progress per paid device-hour (log axis when
    its values span more than :data:`LOG_SPAN`), the no-failure line on top, so the gap that failures open shows
    beside Amdahl's fall. ``contrast`` is an optional (label, values) curve, one value per count; ``marks`` maps
    labels to values drawn as points at the largest count; ``input_note`` (a text) rings the left panel's first
    curve at the largest count and labels it as an input. Returns the figure.
    """
    world_sizes = counts("world_sizes", world_sizes)
    for label, gs in mapping("rows", rows).items():
        if len(sequence(f"rows[{label!r}]", gs)) != len(world_sizes):
            raise ValueError(f"rows[{label!r}] must hold one result per device count ({len(world_sizes)})")
    no_failure = [positive(f"no_failure[{i}]", v) for i, v in enumerate(sequence("no_failure", no_failure))]
    if len(no_failure) != len(world_sizes):
        raise ValueError(f"no_failure must hold one value per device count ({len(world_sizes)})")
    text("title", title, allow_empty=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    styles = ["-", "--", "-."]
    for i, (label, gs) in enumerate(rows.items()):
        left.plot(world_sizes, [100 * (1 - g.useful_fraction) for g in gs], styles[i % 3], marker="o", label=label)
        right.plot(world_sizes, [g.per_device_hour for g in gs], styles[i % 3], marker="o", label=label)
    perfect = all(abs(v - 1) < 1e-12 for v in no_failure)  # serial share 0: speedup n on n devices
    right.plot(world_sizes, no_failure, ":", color="black", lw=2, zorder=5,
               label="no failures, perfect scaling" if perfect else "no failures (Amdahl alone)")
    if contrast is not None:
        label, values = sequence("contrast", contrast)
        values = [positive(f"contrast[1][{i}]", x) for i, x in enumerate(sequence("contrast[1]", values))]
        if len(values) != len(world_sizes):
            raise ValueError(f"contrast must hold one value per device count ({len(world_sizes)})")
        right.plot(world_sizes, values, ":", color="grey", marker="x", label=text("contrast[0]", label))
    for j, (label, value) in enumerate(({} if marks is None else mapping("marks", marks)).items()):
        right.plot([world_sizes[-1]], [positive(f"marks[{label!r}]", value)], ["*", "D", "s"][j % 3],
                   markersize=16 if j == 0 else 7, zorder=6 + j, label=text("marks", label))  # a small one on top
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xticks(world_sizes, [f"{n:,}" for n in world_sizes], rotation=30)
        ax.minorticks_off()
        ax.set_xlabel("devices (count, log scale)")
        ax.grid(alpha=0.3)
    lost_max = max(100 * (1 - g.useful_fraction) for gs in rows.values() for g in gs)
    left.set_ylim(0, min(100.0, max(1.0, 1.2 * lost_max)))  # fitted to the curves, never past 100 %
    if input_note is not None:  # the point a caller back-solved an input to give: marked, not plotted as a curve
        y = 100 * (1 - next(iter(rows.values()))[-1].useful_fraction)
        left.annotate(text("input_note", input_note), xy=(world_sizes[-1], y), xytext=(0.42, 0.55),
                      textcoords="axes fraction", ha="center", va="center", fontsize=8,
                      bbox=dict(boxstyle="round", fc="white", ec="0.6"),
                      arrowprops=dict(arrowstyle="->", color="0.3"))
        left.scatter([world_sizes[-1]], [y], s=220, facecolors="none", edgecolors="C3", linewidths=1.8, zorder=4)
    left.set_ylabel("time lost to saves, redone work, restarts (%)")
    left.set_title("What failures take from the wall-clock time", fontsize=10)
    shown = [g.per_device_hour for gs in rows.values() for g in gs] + no_failure
    shown += [] if contrast is None else list(values)
    shown += [] if marks is None else list(marks.values())
    if progress_on_log_axis(shown):
        right.set_yscale("log")
        right.set_ylabel("one-device hours per paid device-hour (log scale)")
    else:
        right.set_ylim(0, 1.08 * max(shown))
        right.set_ylabel("one-device hours per paid device-hour")
    right.set_title("Useful progress per paid device-hour", fontsize=10)
    left.legend(fontsize=8, loc="upper left")
    right.legend(fontsize=8, loc="lower left")
    if perfect and contrast is None and not marks:  # no serial share: the right panel would restate the left
        fig.delaxes(right), left.set_subplotspec(fig.add_gridspec(1, 1)[0]), fig.set_size_inches(8, 4.2)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
