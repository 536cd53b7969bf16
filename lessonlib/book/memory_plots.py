"""Chapter 1's memory figures: activations against every size, the crossover of
activations and state, and why no single multiplier of the weights exists; and chapter 2's
recomputation policies, what each keeps against what it reruns.

Each function draws with matplotlib and returns :func:`lessonlib.book.plots.show`'s
figure with computed alt text. Sizes are bytes (shown in MiB).
"""
from __future__ import annotations

from ..checks import reads as _reads

import matplotlib.pyplot as plt

from ..checks import amount, count, mapping, positive, sequence, text
from .plots import MIB, show


_SWEEP_NAMES = {"batch": "batch (sequences)", "seq_len": "sequence length (tokens)", "layers": "layers", "hidden": "hidden width h"}


@_reads("results", "sweeps")
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

    def slope(knob, values):  # the measured growth against the size's, first to last value
        r = (results[(knob, values[-1])][0] / results[(knob, values[0])][0]) / (values[-1] / values[0])
        return "on the guide" if abs(r - 1) < 0.01 else ("steeper than the guide" if r > 1 else "flatter than the guide")
    return show(fig, alt="Panels with logarithmic axes, saved activation bytes against "
                + ", ".join(_SWEEP_NAMES.get(k, k) for k in sweeps) + ", each with a dotted guide of slope 1 (bytes "
                f"proportional to the size). Measured points sit on the formula's line (within {100 * worst:.1f} "
                "percent). Measured growth from the first to the last value: "
                + "; ".join(f"{_SWEEP_NAMES.get(k, k)} {slope(k, v)}" for k, v in sweeps.items()) + ".")


@_reads("c")
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
    # both axes logarithmic: a quantity in proportion to the batch is then a straight line (slope 1), where a
    # log-x, linear-y axis would draw it as an exponential curve
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch (sequences of 64 tokens, log scale)")
    ax.set_ylabel("memory (MiB, log scale)")
    ax.set_title(f"Tiny GPT ({c.n_params:,} parameters): activations against the training state")
    ax.legend(fontsize=8)
    state_line = f"the flat line of the {bytes_per_param}-bytes-per-parameter state"
    first = c.first_batch_above
    if first is None:
        where = f"stays below {state_line} at every batch measured"
    elif first == c.batches[0]:
        where = f"lies above {state_line} from the smallest batch measured, {first}"
    else:  # measured only at these batches: the line crosses between the last one below and the first above
        where = f"crosses {state_line} between batch {c.batches[c.batches.index(first) - 1]} and batch {first}"
    return show(fig, alt="On logarithmic axes, activation memory rises as a straight line of slope 1 (in proportion "
                f"to the batch) and {where}; the serving weights line is far below.")



@_reads("ratios")
def multiplier_figure(ratios: dict, slogan: float = 3.0):
    """Bars of training memory / the 16-bit weights (parameters x 2 bytes) for each case, each labelled with its value (see
    :func:`plot_memory_multiplier`), with the slogan's line."""
    for k, v in mapping("ratios", ratios).items():
        positive(f"ratios[{k!r}]", v)
    positive("slogan", slogan)
    fig = plot_memory_multiplier(ratios, slogan)
    lo_case, hi_case = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
    values = "; ".join(f"{k.replace(chr(10), ', ')}: {v:.1f}" for k, v in ratios.items())
    return show(fig, alt=f"Bars of training memory divided by the parameters × 2 bytes (the 16-bit weights, one "
                f"denominator for every bar), on a log axis, each bar "
                f"labelled with its value ({values}). They run from {ratios[lo_case]:.1f} for "
                f"{lo_case.replace(chr(10), ', ')} to {ratios[hi_case]:.1f} for {hi_case.replace(chr(10), ', ')}; "
                f"the dashed line of a fixed rule, {slogan:g} times that, "
                f"{'lies below every bar' if min(ratios.values()) > slogan else 'matches none in particular'}.")


@_reads("results", "sweeps")
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
    mapping("results", results)
    for knob, values in mapping("sweeps", sweeps).items():
        for v in sequence(f"sweeps[{knob!r}]", values):
            if (knob, v) not in results:
                raise ValueError(f"results has no entry for {knob}={v!r}")
    names = mapping("names", names, allow_empty=True) if names is not None else None
    names = names or {}
    # two panels a row at most: four in one row were too small to read on a 1280 px page
    ncols = min(2, len(sweeps))
    nrows = -(-len(sweeps) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.8 * ncols, 3.4 * nrows), squeeze=False)
    for ax in axes.flat[len(sweeps):]:
        ax.set_visible(False)
    for ax, (knob, values) in zip(axes.flat, sweeps.items()):
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
        ax.set_title(name.split(" (")[0].capitalize(), fontsize=10)  # in words: "Sequence length", not "seq_len"
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("activations (MiB, log scale)")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title, y=1.02)
    fig.tight_layout()
    return fig


def _floor_log2(x: float) -> float:
    import math

    return math.floor(math.log2(x))


def _mib_label(v: float) -> str:
    return f"{v:g}" if v >= 1 else f"1/{1 / v:g}"


@_reads("ratios")
def plot_memory_multiplier(ratios: dict, slogan: float = 3.0,
                           title: str = "Training memory in units of the 16-bit weights: it depends on the choices"):
    """Bars of training memory / the 16-bit weights (parameters x 2 bytes), one per configuration, each labelled with its value.

    ``ratios`` maps a configuration label to the ratio (×). The axis is
    logarithmic (the values span more than tenfold) with ticks at 1, 2, 5,
    10, 20, 50...; each bar carries its value, so none has to be read off
    the axis. A dashed line marks the slogan's multiplier. Returns the figure.
    """
    for k, v in mapping("ratios", ratios).items():
        positive(f"ratios[{k!r}]", v)
    positive("slogan", slogan)
    labels, vals = list(ratios), list(ratios.values())
    fig, ax = plt.subplots(figsize=(9, 4.2))
    bars = ax.bar(labels, vals, color="#8172B3")
    for bar, v in zip(bars, vals):
        ax.text(bar.get_x() + bar.get_width() / 2, v * 1.06, f"{v:.1f}×", ha="center", va="bottom", fontsize=9,
                bbox=dict(facecolor="white", edgecolor="none", pad=1.0), zorder=4)
    ax.axhline(slogan, color="black", linestyle="--", label=f'a fixed rule: {slogan:g} × (parameters × 2 bytes)')
    ax.set_yscale("log")
    top = max(vals + [slogan]) * 3  # room for the tallest bar's value under the legend
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if t <= top]
    ax.set_yticks(ticks, [f"{t}×" for t in ticks])
    ax.minorticks_off()
    ax.set_ylim(1, top)
    ax.set_ylabel("training memory ÷ (parameters × 2 bytes)\n(log scale)")
    ax.set_xlabel("optimizer, precision, batch × sequence length")
    ax.set_title(title)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return fig


def _policy_panel(name: str, kept: dict, extra: dict, gb: dict | None = None):
    """Check one panel's points: the same policies in ``kept`` and ``extra`` (and ``gb``)."""
    kept, extra = mapping(f"{name}kept_per_sbh", kept), mapping(f"{name}extra_flops_pct", extra)
    if set(kept) != set(extra) or (gb is not None and set(mapping(f"{name}gb", gb)) != set(kept)):
        raise ValueError(f"{name}kept_per_sbh and {name}extra_flops_pct must name the same policies, got "
                         f"{sorted(map(str, kept))} and {sorted(map(str, extra))}")
    for k in kept:
        positive(f"{name}kept_per_sbh[{k!r}]", kept[k])
        amount(f"{name}extra_flops_pct[{k!r}]", extra[k], maximum=1000.0)
        if gb is not None:
            positive(f"{name}gb[{k!r}]", gb[k])
    return kept, extra


def _draw_policies(ax, kept: dict, extra: dict, title: str, gb: dict | None = None):
    top, right = 1.2 * max(kept.values()), 1.6 * max(extra.values()) + 1
    gap, label_y = 0.07 * top, float("-inf")
    for name in sorted(kept, key=kept.get):  # from the bottom up, each label at least `gap` above the last
        label_y = max(kept[name], label_y + gap)
        ax.plot(extra[name], kept[name], "o", ms=9, color="#4C72B0", zorder=3)
        size = f"{kept[name]:.0f} B" + ("" if gb is None else f" ({gb[name]:.1f} GB)")
        # the labels of points close together start in one column, right of the cluster's rightmost point
        near = [m for m in kept if m != name and abs(extra[m] - extra[name]) < 0.1 * right
                and abs(kept[m] - kept[name]) < 3 * gap]
        label_x = max([extra[name], *(extra[m] for m in near)]) + (0.1 if near else 0.03) * right
        moved = bool(near) or label_y - kept[name] > 0.01 * top  # a line joins the label and its point
        ax.annotate(f"{name}: {size}, +{extra[name]:.1f} %", (extra[name], kept[name]),
                    xytext=(label_x, label_y), textcoords="data", va="center", fontsize=9,
                    arrowprops=dict(arrowstyle="-", lw=0.6, color="0.4", relpos=(0, 0.5)) if moved else None)
    top = max(top, label_y + gap)
    ax.set_xlim(-0.05 * max(extra.values()) - 0.5, right)
    ax.set_ylim(0, top)
    ax.set_xlabel("extra FLOPs of a training step (% of a plain step)")
    ax.set_ylabel("kept a layer (bytes per s·b·h)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)


def _alt_points(kept: dict, extra: dict, gb: dict | None = None) -> str:
    return "; ".join(f"{k}: {kept[k]:.0f} bytes" + ("" if gb is None else f" ({gb[k]:.1f} GB a sequence)")
                     + f", {extra[k]:.1f} percent more FLOPs" for k in kept)


@_reads("kept_per_sbh", "extra_flops_pct")
def recompute_policy_figure(kept_per_sbh: dict, extra_flops_pct: dict,
                            title: str = "Recomputation policies: what a layer keeps, what the step reruns",
                            large: dict | None = None, suptitle: str | None = None):
    """One labelled point per recomputation policy: the bytes a transformer layer keeps for backward per token
    and unit of width (per s·b·h, y) against the FLOPs the policy adds to a training step (% of a plain step, x).

    ``kept_per_sbh`` and ``extra_flops_pct`` map the same policy names (``recompute`` values) to those numbers.
    ``large``, if given, draws a second panel beside it, for a large model: a dict with ``"title"``,
    ``"kept_per_sbh"``, ``"extra_flops_pct"`` and ``"gb"`` (the model's activations a sequence, GB, per policy),
    each mapping its own policy names.
    ``suptitle``, if given, is the whole figure's title, above the panels'.
    Returns :func:`lessonlib.book.plots.show`'s figure, with alt text that reads every point.
    """
    kept, extra = _policy_panel("", kept_per_sbh, extra_flops_pct)
    text("title", title)
    if suptitle is not None:
        text("suptitle", suptitle)
    if large is not None:
        large = mapping("large", large)
        missing = {"title", "kept_per_sbh", "extra_flops_pct", "gb"} - set(large)
        if missing:
            raise ValueError(f"large must hold title, kept_per_sbh, extra_flops_pct and gb; missing {sorted(missing)}")
        big_kept, big_extra = _policy_panel("large ", large["kept_per_sbh"], large["extra_flops_pct"], large["gb"])
        big_title = text("large title", large["title"])
    fig, axes = plt.subplots(1, 1 if large is None else 2, figsize=(6.6, 4.2) if large is None else (13.2, 4.4))
    first = axes if large is None else axes[0]
    _draw_policies(first, kept, extra, title)
    least, most = min(kept, key=kept.get), max(extra, key=extra.get)
    alt = (f"One point per recomputation policy, the bytes a layer keeps per token and unit of width "
           f"against the extra FLOPs of a training step ({_alt_points(kept, extra)}). {least} keeps the least; "
           f"{most} adds the most FLOPs.")
    if large is not None:
        _draw_policies(axes[1], big_kept, big_extra, big_title, large["gb"])
        alt += (f" Second panel, {big_title}: {_alt_points(big_kept, big_extra, large['gb'])}.")
    if suptitle is not None:
        fig.suptitle(suptitle, fontsize=12)
        alt = f"{suptitle}. {alt}"
    fig.tight_layout()
    return show(fig, alt=alt)
