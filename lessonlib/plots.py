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
        self.png, self.alt = png, alt

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
    if not isinstance(alt, str) or not alt.strip():
        raise ValueError("alt must be a non-empty description of the figure")
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
    scale = {"KiB": 2 ** 10, "MiB": MIB, "GiB": 2 ** 30}[unit]
    data = {k: v.as_dict() for k, v in ledgers.items()}
    fig = stacked_bars(data, title, f"memory ({unit})", scale=scale, line=formula)
    fig.axes[0].set_xlabel("case")
    return fig


def plot_timing(timings: dict, title: str = "Time of a training step by phase", unit: str = "ms"):
    """Stacked bars of phase medians, ``{case: StepTiming}``, with prediction alongside."""
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}[unit]
    data = {}
    for k, t in timings.items():
        data[f"{k}\nprediction"] = {"prediction": t.seconds["prediction"]}
        data[f"{k}\ntraining step"] = {p: t.seconds[p] for p in ("forward", "loss", "backward", "optimizer")}
    fig = stacked_bars(data, title, f"median time ({unit})", scale=scale)
    fig.axes[0].set_xlabel("what is timed")
    return fig
