"""Figures for the course: every one with a title, labelled axes with units, and alt text.

* :func:`show` - display a matplotlib figure with alt text (PNG in Jupyter,
  an ``<img alt=...>`` in the built book), then close it.
* :func:`stacked_bars` - one bar per case, stacked by component.
* :func:`plot_ledger` / :func:`plot_timing` - the memory ledger and phase timings.
"""
from __future__ import annotations

import base64
import html
import io

import matplotlib.pyplot as plt

from ..checks import choice, count, instance, mapping, number, positive, sequence, text


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


class Figure:
    """A rendered figure with alt text; displays as PNG (Jupyter) and <img alt> (book)."""

    def __init__(self, png: bytes, alt: str):
        self.png = instance("png", png, bytes, "PNG bytes")
        self.alt = text("alt", alt)

    def _repr_mimebundle_(self, include=None, exclude=None):
        b64 = base64.b64encode(self.png).decode()
        return {
            "image/png": b64,
            "text/html": f'<img src="data:image/png;base64,{b64}" alt="{html.escape(self.alt, quote=True)}" '
                         f'style="max-width:100%">',
            "text/plain": f"[figure] {self.alt}",
        }


def show(fig, alt: str):
    """Render ``fig`` to PNG with alt text ``alt`` and close it; the return value displays it."""
    text("alt", alt)
    if not callable(getattr(fig, "savefig", None)):
        raise TypeError(f"fig must be a matplotlib figure, got {fig!r:.80}")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return Figure(buf.getvalue(), alt)


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
    ax.legend(fontsize=8)
    return fig


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


def plot_timing(timings: dict, title: str = "Time of a training step by phase", unit: str = "ms"):
    """Stacked bars of phase medians, ``{case: StepTiming}``, with prediction alongside."""
    from ..measure.timing import StepTiming

    for k, v in mapping("timings", timings).items():
        instance(f"timings[{k!r}]", v, StepTiming, "a StepTiming")
    _check_title(title)
    choice("unit", unit, ("s", "ms", "us"))
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}[unit]
    data = {}
    for k, t in timings.items():
        data[f"{k}\nprediction"] = {"prediction": t.seconds["prediction"]}
        data[f"{k}\ntraining step"] = {p: t.seconds[p] for p in ("forward", "loss", "backward", "optimizer")}
    fig = stacked_bars(data, title, f"median time ({unit})", scale=scale)
    fig.axes[0].set_xlabel("what is timed")
    return fig


_COLORS = {"forward": "#4C72B0", "recomputed": "#DD8452"}


_MARKERS = {"produced": ("o", "#4C72B0"), "recomputed": ("o", "#DD8452"),
            "kept": ("s", "#55A868"), "read": ("v", "#8172B3"), "released": ("x", "#C44E52")}


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


def plot_segment_sweep(sweeps: dict, title: str = "Memory against recomputation"):
    """Plot :func:`lessonlib.measure.recompute.segment_sweep` results, one panel
    per model: peak step memory (MiB) against extra compute (extra forward
    passes per step). ``sweeps`` maps a model label to its list of
    :class:`~lessonlib.measure.recompute.SweepPoint`. Returns the figure."""
    import matplotlib.pyplot as plt

    for k, rows in mapping("sweeps", sweeps).items():
        for r in sequence(f"sweeps[{k!r}]", rows):
            if not isinstance(r, dict) or not {"strategy", "peak_bytes", "recomputed_forwards"} <= set(r):
                raise TypeError(f"sweeps[{k!r}] must hold segment_sweep's rows (dicts), got {r!r:.80}")
    _check_title(title)

    fig, axes = plt.subplots(1, len(sweeps), figsize=(5.2 * len(sweeps), 4.2), squeeze=False)
    for ax, (label, rows) in zip(axes[0], sweeps.items()):
        seg = [r for r in rows if r.strategy != "per-block"]
        xs = [r.recomputed_forwards for r in seg]
        ys = [r.peak_bytes / 2**20 for r in seg]
        ax.plot(xs, ys, "o-", color="#4C72B0", label="checkpoint_sequential")
        for r, xv, yv in zip(seg, xs, ys):
            text = "no checkpoint" if r.strategy == 1 else f"{r.strategy} segments"
            ax.annotate(text, (xv, yv), textcoords="offset points", xytext=(4, 6), fontsize=8)
        for r in rows:
            if r.strategy == "per-block":
                ax.plot(r.recomputed_forwards, r.peak_bytes / 2**20, "*", ms=14,
                        color="#DD8452", label="checkpoint every block")
        ax.set_xlabel("recomputation (extra forward passes per step)")
        ax.set_ylabel("peak step memory above the weights (MiB)")
        ax.set_ylim(0, max(r.peak_bytes for r in rows) / 2**20 * 1.15)
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=8, loc="lower left")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_resume_comparison(reference: dict, resumed: dict, resumed_from: int | None = None,
                           title: str = "Resuming after a crash: what each restore gives"):
    """Loss per step of resumed runs against the uninterrupted ``reference``.

    ``reference`` and each value of ``resumed`` are ``{step: loss}`` (from
    :func:`read_losses`); ``resumed`` maps a label to one run. Top panel: the
    losses; bottom panel: the absolute difference from the reference (zero
    where the resume is exact). Returns the matplotlib figure.
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
        if resumed_from is not None:
            ax.axvline(resumed_from + 0.5, color="grey", ls=":", lw=1)
        ax.grid(alpha=0.3)
    if resumed_from is not None:
        top.text(resumed_from + 1, top.get_ylim()[1], "resumed from the checkpoint", va="top", fontsize=8, color="grey")
    top.set_ylabel("training loss (MSE)")
    top.legend(fontsize=8)
    bottom.set_ylabel("|loss − uninterrupted loss|")
    bottom.set_xlabel("training step")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


_SWEEP_NAMES = {"batch": "batch (sequences)", "seq_len": "sequence length (tokens)", "layers": "layers", "hidden": "width h"}


def activation_sweep_figure(results: dict, sweeps: dict):
    """One log-log panel per swept size: measured saved bytes (dots) on the formula's line (MiB),
    with a slope-1 guide (see :func:`plot_activation_sweep`).

    ``results`` is :func:`lessonlib.measure.activations.sweep`'s ``{(name, value): (measured, formula)}``.
    """
    mapping("results", results)
    for knob, values in mapping("sweeps", sweeps).items():
        for v in sequence(f"sweeps[{knob!r}]", values):
            if (knob, v) not in results:
                raise ValueError(f"results has no entry for {knob}={v!r}: pass sweep()'s results and the same sweeps")
    fig = plot_activation_sweep(results, sweeps, _SWEEP_NAMES)
    worst = max(abs(m / f - 1) for m, f in results.values())
    return show(fig, alt="Four panels with logarithmic axes, saved activation bytes against batch, sequence length, "
                "layers and width, each with a dotted guide of slope 1 (bytes proportional to the size). Measured "
                f"points sit on the formula's line (within {100 * worst:.1f} percent). In batch and layers the line "
                "lies on the slope-1 guide: exactly proportional. In sequence length it climbs more steeply than the "
                "guide (the s-squared attention term); in width less steeply (the s-squared term does not grow "
                "with width).")


def crossover_figure(c, bytes_per_param: int):
    """Activations against batch beside the flat training-state and serving lines (MiB).

    ``c`` is :func:`lessonlib.measure.activations.crossover`'s result.
    """
    if not all(hasattr(c, k) for k in ("batches", "activations", "state_bytes", "serving_bytes")):
        raise TypeError(f"c must be crossover()'s result, got {c!r:.80}")
    count("bytes_per_param", bytes_per_param)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(c.batches, [x / MIB for x in c.activations], "o-", color="#C44E52", label="activations (measured, bf16)")
    ax.axhline(c.state_bytes / MIB, color="#55A868",
               label=f"weights + gradients + master + Adam ({bytes_per_param} B/param)")
    ax.axhline(c.serving_bytes / MIB, color="#4C72B0", linestyle="--", label="16-bit weights (serving)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch (sequences of 64 tokens)")
    ax.set_ylabel("memory (MiB)")
    ax.set_title(f"Tiny GPT ({c.n_params:,} parameters): activations against the training state")
    ax.legend(fontsize=8)
    return show(fig, alt="Activation memory rises in proportion to the batch (the batch axis is logarithmic) and "
                f"crosses the flat line of the {bytes_per_param}-bytes-per-parameter state at batch "
                f"{c.first_batch_above}; the serving weights line is far below.")



def multiplier_figure(ratios: dict, slogan: float = 3.0):
    """Bars of training memory / weight memory for each case, each labelled with its value (see
    :func:`plot_memory_multiplier`), with the slogan's line."""
    for k, v in mapping("ratios", ratios).items():
        positive(f"ratios[{k!r}]", v)
    positive("slogan", slogan)
    fig = plot_memory_multiplier(ratios, slogan)
    lo_case, hi_case = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
    values = "; ".join(f"{k.replace(chr(10), ', ')}: {v:.1f}" for k, v in ratios.items())
    return show(fig, alt=f"Bars of training memory as a multiple of the weight memory, on a log axis, each bar "
                f"labelled with its value ({values}). They run from {ratios[lo_case]:.1f} for "
                f"{lo_case.replace(chr(10), ', ')} to {ratios[hi_case]:.1f} for {hi_case.replace(chr(10), ', ')}; "
                f"the dashed line of the slogan, {slogan:g} times the weights, matches none in particular.")


def plot_activation_sweep(results: dict, sweeps: dict, names: dict | None = None,
                          title: str = "Saved activations of the GPT's layers: measured against Korthikanti et al."):
    """Measured and formula activation bytes against each size, on log-log axes.

    ``sweeps`` maps a size ("batch", "seq", ...) to the values tried;
    ``results[(size, value)]`` is ``(measured_bytes, formula_bytes)``. Both
    axes are logarithmic, so a quantity proportional to the size is a straight
    line of slope 1: a dotted slope-1 guide through each panel's first point
    shows it. The s**2 attention term makes the sequence panel steeper than the
    guide; a part that does not grow (width's s**2 term) makes a panel flatter.
    Returns the figure.
    """
    names = names or {}
    fig, axes = plt.subplots(1, len(sweeps), figsize=(3.4 * len(sweeps), 3.6), squeeze=False)
    for ax, (knob, values) in zip(axes[0], sweeps.items()):
        measured = [results[(knob, v)][0] / MIB for v in values]
        formula = [results[(knob, v)][1] / MIB for v in values]
        guide = [measured[0] * v / values[0] for v in values]
        ax.plot(values, guide, ":", color="black", lw=1, label="∝ size (slope 1)")
        ax.plot(values, formula, "-", color="grey", label="formula")
        ax.plot(values, measured, "o", color="#C44E52", label="measured")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(values, [str(v) for v in values])
        lo, hi = min(guide + measured), max(guide + measured)
        ticks = [2.0 ** k for k in range(int(_floor_log2(lo)), int(_floor_log2(hi)) + 2)]
        ax.set_yticks(ticks, [_mib_label(t) for t in ticks])
        ax.minorticks_off()
        name = names.get(knob, knob)
        ax.set_xlabel(f"{name[:-1]}, log scale)" if name.endswith(")") else f"{name} (log scale)")
        ax.set_title(f"varying {knob}", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("activations (MiB, log scale)")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title, y=1.02)
    fig.tight_layout()
    return fig


def _floor_log2(x: float) -> float:
    import math

    return math.floor(math.log2(x))


def _mib_label(v: float) -> str:
    return f"{v:g}" if v >= 1 else f"1/{1 / v:g}"


def plot_memory_multiplier(ratios: dict, slogan: float = 3.0,
                           title: str = "Training memory as a multiple of the weights: it depends on the choices"):
    """Bars of training memory / weight memory, one per configuration, each labelled with its value.

    ``ratios`` maps a configuration label to the ratio (×). The axis is
    logarithmic (the values span more than tenfold) with ticks at 1, 2, 5,
    10, 20, 50...; each bar carries its value, so none has to be read off
    the axis. A dashed line marks the slogan's multiplier. Returns the figure.
    """
    labels, vals = list(ratios), list(ratios.values())
    fig, ax = plt.subplots(figsize=(9, 4.2))
    bars = ax.bar(labels, vals, color="#8172B3")
    for bar, v in zip(bars, vals):
        ax.text(bar.get_x() + bar.get_width() / 2, v * 1.06, f"{v:.1f}×", ha="center", va="bottom", fontsize=9,
                bbox=dict(facecolor="white", edgecolor="none", pad=1.0), zorder=4)
    ax.axhline(slogan, color="black", linestyle="--", label=f'the slogan: "{slogan:g} × the weights"')
    ax.set_yscale("log")
    top = max(vals + [slogan]) * 1.6
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if t <= top]
    ax.set_yticks(ticks, [f"{t}×" for t in ticks])
    ax.minorticks_off()
    ax.set_ylim(1, top)
    ax.set_ylabel("training memory / weight memory (×, log scale)")
    ax.set_xlabel("optimizer, precision, batch × sequence length")
    ax.set_title(title)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return fig


def plot_goodput_failures(devices: list, rows: dict, no_failure: list, title: str = ""):
    """Two panels on what failures cost a synchronous job as it grows.

    ``devices`` is the device counts; ``rows`` maps a curve label (e.g. a
    device MTBF) to a list of :class:`lessonlib.calc.goodput.Goodput`, one
    per device count; ``no_failure`` is speedup / devices alone (Amdahl).
    Left: share of wall-clock time lost to saves, redone work and restarts
    (%, linear). Right: useful progress per paid device-hour on a log axis,
    with the no-failure line drawn on top, so the gap that failures open is
    visible beside Amdahl's fall. Returns the figure.
    """
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    styles = ["-", "--", "-."]
    for i, (label, gs) in enumerate(rows.items()):
        left.plot(devices, [100 * (1 - g.useful_fraction) for g in gs], styles[i % 3], marker="o", label=label)
        right.plot(devices, [g.per_device_hour for g in gs], styles[i % 3], marker="o", label=label)
    right.plot(devices, no_failure, ":", color="black", lw=2, zorder=5, label="no failures (Amdahl alone)")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xticks(devices, [f"{n:,}" for n in devices], rotation=30)
        ax.minorticks_off()
        ax.set_xlabel("devices (count, log scale)")
        ax.grid(alpha=0.3)
    left.set_ylim(0, 100)
    left.set_ylabel("time lost to saves, redone work, restarts (%)")
    left.set_title("What failures take from the wall-clock time", fontsize=10)
    right.set_yscale("log")
    right.set_ylabel("one-device hours per paid device-hour (log scale)")
    right.set_title("Useful progress per paid device-hour", fontsize=10)
    left.legend(fontsize=8, loc="upper left")
    right.legend(fontsize=8, loc="lower left")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
