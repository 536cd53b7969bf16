"""Figures for the course: every one with a title, labelled axes with units, and alt text.

* :func:`show` - display a matplotlib figure with alt text (PNG in Jupyter,
  an ``<img alt=...>`` in the built book), then close it.
* :func:`stacked_bars` - one bar per case, stacked by component.
* :func:`plot_ledger` / :func:`plot_timing` - the memory ledger and phase timings.
"""
from __future__ import annotations

from ..checks import reads as _reads

import base64
import html
import io
import textwrap

import matplotlib.pyplot as plt
from matplotlib.text import Text

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


#: Screens at most this wide (CSS px) get a figure's phone version.
PHONE_MAX_WIDTH = 700
#: Resolution of every figure's PNG (pixels per inch).
DPI = 110
#: A phone version's width (inches): 506 px at :data:`DPI`, shown about 350 CSS px wide on a
#: 390-px phone, so a point of text is about 1.05 CSS px there.
PHONE_WIDTH_IN = 4.6
#: No text of a phone version is smaller than this (points): 8.4 CSS px on a 390-px phone.
PHONE_MIN_FONT_PT = 8


class Figure:
    """A rendered figure with alt text; displays as PNG (Jupyter) and <img alt> (book).

    ``phone_png``, when given, is the same figure drawn for a phone (panels
    stacked in one column, :data:`PHONE_WIDTH_IN` wide, no text under
    :data:`PHONE_MIN_FONT_PT`); the HTML rendering picks it on narrow screens
    (``<picture>``). ``font_px`` and ``phone_font_px`` are the smallest text of
    each PNG, in its pixels: the browser test turns them into CSS px as shown.
    """

    def __init__(self, png: bytes, alt: str, phone_png: bytes | None = None, font_px: float | None = None,
                 phone_font_px: float | None = None):
        self.png = instance("png", png, bytes, "PNG bytes")
        self.alt = text("alt", alt)
        self.phone_png = instance("phone_png", phone_png, (bytes, type(None)), "PNG bytes or None")
        self.font_px = None if font_px is None else positive("font_px", font_px)
        self.phone_font_px = None if phone_font_px is None else positive("phone_font_px", phone_font_px)

    def _repr_mimebundle_(self, include=None, exclude=None):
        b64 = base64.b64encode(self.png).decode()
        fonts = "".join(f' data-{name}="{v:.1f}"' for name, v in
                        (("font-px", self.font_px), ("phone-font-px", self.phone_font_px)) if v is not None)
        img = (f'<img src="data:image/png;base64,{b64}" alt="{html.escape(self.alt, quote=True)}"{fonts} '
               f'style="max-width:100%;height:auto">')
        if self.phone_png:
            phone = base64.b64encode(self.phone_png).decode()
            img = (f'<picture><source media="(max-width: {PHONE_MAX_WIDTH}px)" '
                   f'srcset="data:image/png;base64,{phone}">{img}</picture>')
        return {"image/png": b64, "text/html": img, "text/plain": f"[figure] {self.alt}"}


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def _png_width(png: bytes) -> int:
    """The width in pixels of a PNG (its IHDR chunk)."""
    return int.from_bytes(png[16:20], "big")


def _phone_png(fig) -> bytes:
    """The phone version's PNG. Text outside the axes (a legend, labels) can make the tight-cropped image
    wider than :data:`PHONE_WIDTH_IN`, and a phone then shrinks all of it, text too: narrow the figure
    until the image fits, keeping its font sizes."""
    png = _png(fig)
    target = PHONE_WIDTH_IN * DPI
    if _png_width(png) > target * 1.01:  # a legend of several columns is the usual culprit: one column,
        for ax in fig.axes:               # under the plot, where it hides no data
            legend = ax.get_legend()
            if legend is not None and getattr(legend, "_ncols", 1) > 1:  # matplotlib keeps the count private
                handles, labels = ax.get_legend_handles_labels()
                ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1,
                          fontsize=legend.get_texts()[0].get_fontsize())
        png = _png(fig)
    for _ in range(4):
        if _png_width(png) <= target * 1.01:
            break
        width, height = fig.get_size_inches()
        fig.set_size_inches(width * target / _png_width(png), height)
        png = _png(fig)
    return png


def stack_panels(fig) -> bool:
    """Move a figure's side-by-side panels into one column, in reading order.

    Panels are the axes laid out on a grid (``plt.subplots``); a twin axis
    moves with its panel. The figure keeps each panel's width and grows in
    height. Returns False (and changes nothing) when there is only one column.
    """
    if not hasattr(fig, "axes") or not callable(getattr(fig, "add_gridspec", None)):
        raise TypeError(f"fig must be a matplotlib figure, got {fig!r:.80}")
    specs = {}
    for ax in fig.axes:
        ss = ax.get_subplotspec() if hasattr(ax, "get_subplotspec") else None
        if ss is None:
            continue
        rows, cols = ss.get_geometry()[:2]
        specs.setdefault((ss.rowspan.start, ss.colspan.start, rows, cols), []).append(ax)
    if not specs:
        return False
    _, _, rows, cols = next(iter(specs))
    if cols < 2:
        return False
    order = sorted(specs, key=lambda k: (k[0], k[1]))
    width, height = fig.get_size_inches()
    fig.set_size_inches(max(width / cols * 1.1, 4.5), height / rows * len(order) * 1.05)
    grid = fig.add_gridspec(len(order), 1)
    for i, key in enumerate(order):
        for ax in specs[key]:
            ax.set_subplotspec(grid[i, 0])
    fig.tight_layout()
    return True


def _texts(fig) -> list:
    if not callable(getattr(fig, "findobj", None)) or not callable(getattr(fig, "savefig", None)):
        raise TypeError(f"fig must be a matplotlib figure, got {fig!r:.80}")
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def font_px(fig) -> float:
    """The smallest visible text of ``fig``, in pixels of its PNG (at :data:`DPI`)."""
    return min((t.get_fontsize() for t in _texts(fig)), default=10.0) * DPI / 72


def for_phone(fig) -> bool:
    """Redraw ``fig`` for a phone: panels in one column (:func:`stack_panels`), at most
    :data:`PHONE_WIDTH_IN` wide, titles and axis labels wrapped to that width, and no text smaller
    than :data:`PHONE_MIN_FONT_PT`. Returns False (and changes nothing) when the figure is
    already narrow enough and has a single column of panels.
    """
    stacked = stack_panels(fig)
    width, height = fig.get_size_inches()
    if not stacked and width <= PHONE_WIDTH_IN:
        return False
    if width > PHONE_WIDTH_IN:
        fig.set_size_inches(PHONE_WIDTH_IN, height * max(1.0, 0.8 * width / PHONE_WIDTH_IN) ** 0.5)
    for t in _texts(fig):
        if t.get_fontsize() < PHONE_MIN_FONT_PT:
            t.set_fontsize(PHONE_MIN_FONT_PT)
    titles = [ax.title for ax in fig.axes] + [ax.xaxis.label for ax in fig.axes]
    titles += [fig._suptitle] if getattr(fig, "_suptitle", None) is not None else []
    for t in titles:
        # about 0.55 em a character: the characters that fit on one line of the figure's width
        chars = max(20, int(PHONE_WIDTH_IN * 72 / (0.55 * t.get_fontsize())))
        if len(t.get_text()) > chars:
            t.set_text("\n".join(textwrap.wrap(t.get_text().replace("\n", " "), chars)))
    fig.tight_layout()
    return True


def show(fig, alt: str, phone=None):
    """Render ``fig`` to PNG with alt text ``alt`` and close it; the return value displays it.

    A figure wider than a phone also gets a phone version (:func:`for_phone`),
    or ``phone``, a figure the page drew for phones itself (closed too).
    """
    text("alt", alt)
    for name, f in (("fig", fig), ("phone", phone)):
        if f is not None and not callable(getattr(f, "savefig", None)):
            raise TypeError(f"{name} must be a matplotlib figure, got {f!r:.80}")
    if fig is None:
        raise TypeError("fig must be a matplotlib figure, got None")
    wide, wide_font = _png(fig), font_px(fig)
    if phone is not None:
        small, small_font = _png(phone), font_px(phone)
        plt.close(phone)
    elif for_phone(fig):
        small, small_font = _phone_png(fig), font_px(fig)
    else:
        small = small_font = None
    plt.close(fig)
    return Figure(wide, alt, small, wide_font, small_font)


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
    passes per step). ``sweeps`` maps a model label to its list of
    :class:`~lessonlib.measure.recompute.SweepPoint`. Returns the figure."""
    import matplotlib.pyplot as plt

    for k, rows in mapping("sweeps", sweeps).items():
        for r in sequence(f"sweeps[{k!r}]", rows):
            if not all(hasattr(r, a) for a in ("strategy", "peak_bytes", "recomputed_forwards")):
                raise TypeError(f"sweeps[{k!r}] must hold segment_sweep's rows (SweepPoint), got {r!r:.80}")
            if r.strategy != "per-block":
                count(f"sweeps[{k!r}]'s strategy (a segment count or 'per-block')", r.strategy)
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


@_reads("reference", "resumed", signed=("reference", "resumed"))
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
