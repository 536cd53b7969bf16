"""The figure of the price-a-real-run page: a bill computed from 6ND against the published one, the gap between
them split by named bounds (attention, failures, everything else).

The function draws one figure (title, labelled axes with units) and returns it through
:func:`lessonlib.book.plots.show`, alt text included. Inputs are the page's own results; nothing is measured here.
"""
from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt

from ..checks import amount, mapping, positive, text
from .plots import show


def bill_gap_parts(computed_hours: float, published_hours: float, attention_share: float,
                   failures_max_hours: float) -> dict:
    """Split the gap between a computed bill and the published one (both in GPU-hours) into named parts.

    ``attention_share`` is the attention-score FLOPs over 6N (so the attention part is ``computed_hours`` times it);
    ``failures_max_hours`` is the most GPU-hours failures, saves and restarts can have taken (the report's lower
    bound on effective training time). The parts are filled in that order, each at most what is left of the gap,
    and "other stages" takes the rest. Returns GPU-hours for "computed", "attention", "failures" and "other",
    which add up to the published bill (or to ``computed_hours`` when it is the larger).
    """
    c = positive("computed_hours", computed_hours)
    p = positive("published_hours", published_hours)
    a = c * amount("attention_share", attention_share, maximum=10.0)
    f_max = amount("failures_max_hours", failures_max_hours)
    gap = max(0.0, p - c)
    attention = min(a, gap)
    failures = min(f_max, gap - attention)
    return {"computed": c, "attention": attention, "failures": failures, "other": gap - attention - failures}


def bill_gap_figure(computed: dict, published_hours: float, attention_share: float, failures_max_hours: float,
                    title: str = "Computed GPU-hours against the published bill"):
    """Stacked bars: each computed bill (``computed`` maps a label to GPU-hours) with the gap to
    ``published_hours`` split by :func:`bill_gap_parts`, beside the published bill; in millions of GPU-hours."""
    computed = mapping("computed", computed)
    if not computed:
        raise ValueError("computed must name at least one computed bill")
    text("title", title)
    parts = {text("computed", k): bill_gap_parts(v, published_hours, attention_share, failures_max_hours)
             for k, v in computed.items()}
    fig, ax = plt.subplots(figsize=(9, 5.5))
    labels = list(parts) + ["published bill"]
    colours = {"computed": "tab:blue", "attention": "tab:orange", "failures": "tab:red", "other": "tab:grey"}
    names = {"computed": "6ND at the table's MFU", "attention": "attention scores (if counted in the TFLOP/s)",
             "failures": "failures, saves, restarts\n(at most; a snapshot's share extrapolated)",
             "other": "leftover: other stages and the rest\n(fills each bar to the bill by construction)"}
    for key in colours:
        bottoms = [sum(p[k] for k in list(colours)[:list(colours).index(key)]) / 1e6 for p in parts.values()]
        ax.bar(list(parts), [p[key] / 1e6 for p in parts.values()], bottom=bottoms, color=colours[key],
               label=names[key], hatch="//" if key == "other" else None, alpha=1.0 if key == "computed" else 0.6)
    ax.bar(["published bill"], [published_hours / 1e6], color="black", label="published bill")
    for i, p in enumerate(parts.values()):
        ax.text(i, p["computed"] / 2e6, f"{p['computed'] / 1e6:.2f} M", ha="center", color="white", fontsize=9)
    ax.text(len(parts), published_hours / 2e6, f"{published_hours / 1e6:.2f} M", ha="center", color="white",
            fontsize=9)
    ax.set_ylabel("GPU-hours (millions)")
    ax.set_xticks(range(len(labels)), [textwrap.fill(s, 18) for s in labels], fontsize=8)
    ax.set_ylim(0, 1.1 * max(published_hours, max(computed.values())) / 1e6)
    # under the axes: beside them the two-line labels left too little width for tight_layout (it warned)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    ax.set_title(title)
    fig.tight_layout()
    alt = (f"Stacked bars in millions of GPU-hours. The published bill is {published_hours / 1e6:.2f} M. "
           + " ".join(f"{k}: computed {p['computed'] / 1e6:.2f} M, then attention {p['attention'] / 1e6:.2f} M, "
                      f"failures at most {p['failures'] / 1e6:.2f} M (the failure share of a snapshot of the run, "
                      f"extrapolated to the whole bill) and the leftover, other stages and the rest, "
                      f"{p['other'] / 1e6:.2f} M (hatched)."
                      for k, p in parts.items())
           + " The leftover is whatever the named parts do not fill, so every bar equals the published bill by "
             "construction.")
    return show(fig, alt=alt)
