"""Figures for the course: every one with a title, labelled axes with units, and alt text.

* :func:`show` (from :mod:`lessonlib.book.figures`) - display a matplotlib figure with alt text (PNG in
  Jupyter, an ``<img alt=...>`` in the built book, a phone version where needed), then close it.
* :func:`stacked_bars` - one bar per case, stacked by component.
* :func:`plot_ledger` / :func:`plot_timing` - the memory ledger and phase timings.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ..checks import choice, count, instance, mapping, number, positive, sequence, share, text
from ..checks import reads as _reads
from .figures import (DPI, PHONE_MAX_WIDTH, PHONE_MIN_FONT_PT, PHONE_WIDTH_IN, Figure, font_px,  # noqa: F401
                      for_phone, show, stack_panels)  # (pages and tests call plots.show; it lives in figures)


def _check_title(title, ylabel=None):
    text("title", title)
    if ylabel is not None:
        text("ylabel", ylabel)

MIB = 2 ** 20
COLORS = {
    "weights": "#4C72B0", "gradients": "#DD8452", "master_weights": "#8172B3",
    "optimizer_state": "#55A868", "activations": "#C44E52",
    "forward": "#4C72B0", "loss": "#8172B3", "backward": "#DD8452", "optimizer": "#55A868",
    "prediction": "#937860",
}


def stacked_bars(data: dict, title: str, ylabel: str, scale: float = 1.0, ax=None, colors: dict | None = None,
                 line: dict | None = None):
    """Stacked bars: ``data = {case: {component: value}}``, each value divided by ``scale``.

    ``line`` optionally marks a value per case (``{case: value}``, same units)
    with a black tick, e.g. a formula beside a measurement. Returns the figure.
    """
    mapping("data", data)
    for case, parts in data.items():
        for comp, v in mapping(f"data[{case!r}]", parts).items():
            number(f"data[{case!r}][{comp!r}]", v)
    text("title", title)
    text("ylabel", ylabel)
    scale = positive("scale", scale)
    if ax is not None and not hasattr(ax, "bar"):
        raise TypeError(f"ax must be a matplotlib Axes or None, got {ax!r:.80}")
    if colors is not None:
        mapping("colors", colors, allow_empty=True)
    if line is not None:
        for case, v in mapping("line", line, allow_empty=True).items():
            number(f"line[{case!r}]", v)
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4))
    else:
        fig = ax.figure
    colors = {**COLORS, **(colors or {})}
    cases = list(data)
    comps = []
    for c in cases:
        comps += [k for k in data[c] if k not in comps]
    bottom = [0.0] * len(cases)
    for comp in comps:
        vals = [data[c].get(comp, 0) / scale for c in cases]
        ax.bar(cases, vals, bottom=bottom, label=comp.replace("_", " "), color=colors.get(comp))
        bottom = [b + v for b, v in zip(bottom, vals)]
    if line:
        xs = [i for i, c in enumerate(cases) if c in line]
        ax.scatter(xs, [line[cases[i]] / scale for i in xs], marker="_", s=900, color="black",
                   zorder=3, label="formula")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    # the formula's mark is a bar-wide dash (s=900); at that size its legend handle ran out of the legend's frame
    ax.legend(fontsize=8, markerscale=0.4)
    return fig


@_reads("ledgers", "formula")
def plot_ledger(ledgers: dict, title: str = "Memory held in one training step", unit: str = "MiB",
                formula: dict | None = None):
    """Stacked bars of ``{case: MemoryLedger}`` in ``unit`` ("KiB", "MiB" or "GiB")."""
    from ..measure.memory import MemoryLedger

    for k, v in mapping("ledgers", ledgers).items():
        instance(f"ledgers[{k!r}]", v, MemoryLedger, "a MemoryLedger")
    _check_title(title)
    choice("unit", unit, ("KiB", "MiB", "GiB"))
    if formula is not None:
        for k, v in mapping("formula", formula, allow_empty=True).items():
            number(f"formula[{k!r}]", v)
    scale = {"KiB": 2 ** 10, "MiB": MIB, "GiB": 2 ** 30}[unit]
    data = {k: v.as_dict() for k, v in ledgers.items()}
    fig = stacked_bars(data, title, f"memory ({unit})", scale=scale, line=formula)
    fig.axes[0].set_xlabel("case")
    return fig


@_reads("timings")
def plot_timing(timings: dict, title: str = "Time of a training step by phase", unit: str = "ms"):
    """Stacked bars of :attr:`StepTiming.account` (ratio x median prediction), ``{case: StepTiming}``,
    with prediction alongside: a bar's height is the step's ratio the table and text give; a black
    whisker on each step bar spans the middle half of the rounds' step / prediction ratios.

    ``unit``: "s", "ms" or "us" for times, or "x prediction" for the ratios themselves (each case's
    prediction is 1), which puts models of very different speeds on one scale."""
    from ..measure.timing import StepTiming

    for k, v in mapping("timings", timings).items():
        instance(f"timings[{k!r}]", v, StepTiming, "a StepTiming")
    _check_title(title)
    choice("unit", unit, ("s", "ms", "us", "x prediction"))
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "x prediction": 1.0}[unit]
    data = {}
    for k, t in timings.items():
        a = t.ratios if unit == "x prediction" else t.account
        data[f"{k}\nprediction"] = {"prediction": a["prediction"]}
        data[f"{k}\ntraining step"] = {p: a[p] for p in ("forward", "loss", "backward", "optimizer")}
    label = ("time (× prediction): median over rounds of phase / prediction" if unit == "x prediction"
             else f"time ({unit}): median ratio × median prediction")
    fig = stacked_bars(data, title, label, scale=scale)
    ax = fig.axes[0]
    for i, t in enumerate(timings.values()):  # each step bar's spread: the middle half of its per-round ratios
        lo, hi = (q * (1.0 if unit == "x prediction" else t.account["prediction"] / scale) for q in t.quartiles("step"))
        ax.plot([2 * i + 1] * 2, [lo, hi], color="black", marker="_", markersize=14,
                label="step: middle half of the rounds" if i == 0 else None)
    ax.legend(fontsize=8, markerscale=0.4)
    ax.set_xlabel("what is timed")
    return fig


_COLORS = {"forward": "#4C72B0", "recomputed": "#DD8452"}


_MARKERS = {"produced": ("o", "#4C72B0"), "recomputed": ("o", "#DD8452"),
            "kept": ("s", "#55A868"), "read": ("v", "#8172B3"), "released": ("x", "#C44E52")}


@_reads("recordings")
def plot_activation_life(recordings: dict, title: str = "The life of each activation in one training step"):
    """Draw recordings from :func:`record_activation_life` as timelines.

    ``recordings`` maps a panel title (e.g. "store every activation") to a list
    of :class:`Event`. A bar shows when a tensor is in memory (blue: produced in
    forward; orange: recomputed in backward). Returns the matplotlib figure.
    """
    import matplotlib.pyplot as plt

    from ..measure.four_layer import Event

    for k, events in mapping("recordings", recordings).items():
        for e in sequence(f"recordings[{k!r}]", events):
            instance(f"recordings[{k!r}]", e, Event, "a list of Event (from record_activation_life)")
    _check_title(title)

    fig, axes = plt.subplots(len(recordings), 1, figsize=(9, 2.3 * len(recordings) + 0.6),
                             squeeze=False)
    for ax, (name, events) in zip(axes[:, 0], recordings.items()):
        lanes = sorted({e.activation for e in events})
        start: dict = {}
        end_order = max(e.order for e in events) + 1
        for e in events:
            y = lanes.index(e.activation)
            if e.what in ("produced", "recomputed"):
                start[e.activation] = (e.order, e.what)
            elif e.what == "released" and e.activation in start:
                s, kind = start.pop(e.activation)
                ax.broken_barh([(s, e.order - s)], (y - 0.3, 0.6), alpha=0.35,
                               color=_COLORS["recomputed" if kind == "recomputed" else "forward"])
        for act, (s, kind) in start.items():  # still alive at the end
            ax.broken_barh([(s, end_order - s)], (lanes.index(act) - 0.3, 0.6), alpha=0.35,
                           color=_COLORS["recomputed" if kind == "recomputed" else "forward"])
        for what, (marker, color) in _MARKERS.items():
            pts = [(e.order, lanes.index(e.activation)) for e in events if e.what == what]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, color=color, label=what, zorder=3, s=36)
        first_bwd = next((e.order for e in events if e.phase == "backward"), None)
        if first_bwd is not None:
            ax.axvline(first_bwd - 0.5, color="grey", ls="--", lw=1)
            ax.text(first_bwd - 0.3, -0.35, "backward starts", fontsize=8, color="grey")
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_ylim(len(lanes) - 0.2, -0.6)  # a1 on top
        ax.set_ylabel("activation")
        ax.set_title(name, fontsize=10)
    for ax in axes[:, 0]:
        ax.set_xlabel("hook event, in the order recorded (forward, then backward)")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker=m, color=c, ls="", label=w) for w, (m, c) in _MARKERS.items()]
    axes[0, 0].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


@_reads("sweeps")
def plot_segment_sweep(sweeps: dict, title: str = "Memory against recomputation"):
    """Plot :func:`lessonlib.measure.recompute.segment_sweep` results, one panel
    per model: peak step memory (MiB) against extra compute (extra forward
    passes per step), both measured with the points' one ``early_stop``. ``sweeps`` maps a model label to its
    list of :class:`~lessonlib.measure.recompute.SweepPoint`. The star names a checkpoint at every block where the label
    says "block", at every layer otherwise (a chain of layers). Returns the figure."""
    import matplotlib.pyplot as plt

    for k, rows in mapping("sweeps", sweeps).items():
        for r in sequence(f"sweeps[{k!r}]", rows):
            if not all(hasattr(r, a) for a in ("strategy", "peak_bytes", "recomputed_forwards")):
                raise TypeError(f"sweeps[{k!r}] must hold segment_sweep's rows (SweepPoint), got {r!r:.80}")
            if r.strategy != "per-block":
                count(f"sweeps[{k!r}]'s strategy (a segment count or 'per-block')", r.strategy)
        stops = {getattr(r, "early_stop", None) for r in rows}
        if len(stops) > 1 or not all(isinstance(s, bool) for s in stops):
            raise ValueError(f"sweeps[{k!r}] must be measured with one early_stop (a bool) at every point, as "
                             "segment_sweep measures them")
    _check_title(title)

    fig, axes = plt.subplots(1, len(sweeps), figsize=(5.2 * len(sweeps), 4.2), squeeze=False)
    for ax, (label, rows) in zip(axes[0], sweeps.items()):
        seg = [r for r in rows if r.strategy != "per-block"]
        xs = [r.recomputed_forwards for r in seg]
        ys = [r.peak_bytes / 2**20 for r in seg]
        # a line only where the points run left to right in segment order; otherwise labelled points alone, so the
        # line never doubles back (8 MLP blocks rerun more at 4 segments than at 2 or 8)
        ax.plot(xs, ys, "o-" if xs == sorted(xs) else "o", color="#4C72B0", label="checkpoint_sequential")
        for r, xv, yv in zip(seg, xs, ys):
            text = "no checkpoint" if r.strategy == 1 else f"{r.strategy} segments"
            ax.annotate(text, (xv, yv), textcoords="offset points", xytext=(4, 6), fontsize=8)
        for r in rows:
            if r.strategy == "per-block":
                ax.plot(r.recomputed_forwards, r.peak_bytes / 2**20, "*", ms=14,
                        color="#DD8452", label="checkpoint every " + ("block" if "block" in label else "layer"))
        ax.set_xlabel("recomputation (extra forward passes per step, early stop "
                      + ("on" if rows[0].early_stop else "off") + ")")
        ax.set_ylabel("peak step memory above the weights (MiB)")
        ax.set_ylim(0, max(r.peak_bytes for r in rows) / 2**20 * 1.15)
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=8, loc="lower left")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


@_reads("reference", "resumed", signed=("reference", "resumed"))
def plot_resume_comparison(reference: dict, resumed: dict, resumed_from: int | None = None,
                           title: str = "Resuming after a crash: what each restore gives", *,
                           second_resume: int | None = None):
    """Loss per step of resumed runs against the uninterrupted ``reference``.

    ``reference`` and each value of ``resumed`` are ``{step: loss}`` (from
    :func:`read_losses`); ``resumed`` maps a label to one run. Top panel: the
    losses; bottom panel: the absolute difference from the reference (zero
    where the resume is exact). ``resumed_from`` marks the checkpoint the first
    resume started from, ``second_resume`` the one a second crash resumed from.
    Returns the matplotlib figure.
    """
    import matplotlib.pyplot as plt

    def losses(name, run):
        for s, v in mapping(name, run).items():
            count(f"{name}'s steps", s)
            number(f"{name}[{s}]", v)

    losses("reference", reference)
    for label, run in mapping("resumed", resumed).items():
        losses(f"resumed[{label!r}]", run)
        if not set(run) <= set(reference):
            raise ValueError(f"resumed[{label!r}] has steps that reference lacks")
    if resumed_from is not None:
        resumed_from = count("resumed_from", resumed_from, minimum=0)
    if second_resume is not None:
        second_resume = count("second_resume", second_resume, minimum=0)
    _check_title(title)

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    steps = list(reference)
    top.plot(steps, [reference[s] for s in steps], color="black", lw=2.5, alpha=0.35,
             label="uninterrupted run")
    styles = ["-", "--", "-.", ":"]
    for i, (label, run) in enumerate(resumed.items()):
        xs = [s for s in steps if s in run]
        top.plot(xs, [run[s] for s in xs], styles[i % len(styles)], lw=1.3, label=label)
        bottom.plot(xs, [abs(run[s] - reference[s]) for s in xs], styles[i % len(styles)], lw=1.3, label=label)
    for ax in (top, bottom):
        # the markers are named in the legend, not by text on the plot, which the legend could cover
        if resumed_from is not None:
            ax.axvline(resumed_from + 0.5, color="grey", ls=":", lw=1,
                       label="checkpoint the first resume started from" if ax is top else None)
        if second_resume is not None:
            ax.axvline(second_resume + 0.5, color="grey", ls="--", lw=1,
                       label="second kill: checkpoint resumed from again" if ax is top else None)
        ax.grid(alpha=0.3)
    top.set_ylabel("training loss (MSE)")
    top.legend(fontsize=8)
    bottom.set_ylabel("|loss − uninterrupted loss|")
    bottom.set_xlabel("training step")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_magnitudes(values, formats: dict, zeros: dict,
                    title: str = "Gradient magnitudes against each format's smallest numbers"):
    """Histogram of ``|values|`` (the nonzero ones, a torch tensor) on a log x axis, with each format's smallest
    normal number (solid line) and smallest subnormal (dashed) marked. ``formats``: ``{name: FormatRange}``
    (:func:`lessonlib.measure.formats.format_range`); ``zeros``: ``{name: share of values the cast turns into 0}``
    (a fraction, for the legend). A format whose lines lie far left of every value is named as off the axis."""
    import math

    import numpy as np
    import torch

    instance("values", values, torch.Tensor, "a torch tensor")
    mags = values.detach().abs().flatten().double().cpu().numpy()
    mags = mags[(mags > 0) & np.isfinite(mags)]
    if mags.size == 0:
        raise ValueError("values must hold nonzero finite numbers")
    for name, f in mapping("formats", formats).items():
        positive(f"formats[{name!r}].sub_min", getattr(f, "sub_min", None))
        positive(f"formats[{name!r}].normal_min", getattr(f, "normal_min", None))
        share(f"zeros[{name!r}]", mapping("zeros", zeros).get(name))
    _check_title(title)
    floor = float(np.quantile(mags, 1e-4))  # the axis starts at the data: a few stray tiny values do not stretch it
    shown = {n: f for n, f in formats.items() if f.sub_min > floor / 1e3}  # lines far left of the values: off the axis
    lo = min([floor / 3, *(f.sub_min / 3 for f in shown.values())])
    hi = max([mags.max() * 1.5, *(f.normal_min * 3 for f in shown.values())])
    fig, ax = plt.subplots(figsize=(8, 4.6))
    ax.hist(mags, bins=np.geomspace(lo, hi, 90), color="#999999", label="gradient values")
    colors = dict(zip(formats, ["#4C72B0", "#DD8452", "#55A868", "#8172B3", "#C44E52"] * 5))  # 4th: purple, far from orange
    for i, (name, f) in enumerate(formats.items()):
        label = f"{name}: {100 * zeros[name]:.2f} % become 0"
        if name in shown:
            # a normal line that falls on an earlier format's (e5m2's and fp16's: the same exponent range) is drawn
            # thin over the thick one, so both colours show, and the two are named beside the top of the line
            same = [n for n in list(shown)[:list(shown).index(name)] if shown[n].normal_min == f.normal_min]
            lw = 1.0 if same else 2.6
            if same:  # the legend says why one solid line seems missing: the same exponent bits, the same normal
                bits = f.bits - 1 - round(-math.log2(f.eps))  # sign, exponent, mantissa
                label += f";\nsmallest normal: {same[0]}'s line ({bits} exponent bits each)"
            ax.axvline(f.normal_min, color=colors[name], lw=lw, label=label)
            ax.axvline(f.sub_min, color=colors[name], lw=lw, ls="--")
            if same:
                ax.annotate(f"{same[0]} = {name} (normal)", (f.normal_min, 1),
                            xycoords=("data", "axes fraction"), xytext=(4, -4), textcoords="offset points",
                            ha="left", va="top", fontsize=8,
                            bbox=dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none", alpha=0.8))
        else:
            ax.plot([], [], color=colors[name], lw=1.6, label=f"{label} (lines off the axis, at {f.normal_min:.0e})")
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("|gradient| (log scale; solid line: smallest normal, dashed: smallest subnormal)")
    ax.set_ylabel("values per bin (count)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)  # below: clear of the lines
    fig.tight_layout()
    return fig
