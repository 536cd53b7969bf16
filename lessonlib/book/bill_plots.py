"""The figure of the price-a-real-run page: a bill computed from 6ND against the published one, the gap between
them split by named bounds (attention, the long-context stage, failures, everything else).

The function draws one figure (title, labelled axes with units) and returns it through
:func:`lessonlib.book.plots.show`, alt text included. Inputs are the page's own results; nothing is measured here.
"""
from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt

from ..checks import amount, mapping, positive, text
from .plots import show


def bill_gap_parts(computed_hours: float, published_hours: float, attention_share: float,
                   failures_max_hours: float, long_context_hours: float = 0.0) -> dict:
    """Split the gap between a computed bill and the published one (both in GPU-hours) into named parts.

    ``attention_share`` is the attention-score FLOPs over 6N (so the attention part is ``computed_hours`` times it);
    ``failures_max_hours`` is the most GPU-hours failures, saves and restarts can have taken (the report's lower
    bound on effective training time); ``long_context_hours`` what a long-context stage costs beyond its tokens'
    share of the computed bill and its attention. The parts are filled in the order attention, long context,
    failures, each at most what is left of the gap, and "other" takes the rest. Returns GPU-hours for "computed",
    "attention", "long_context", "failures" and "other", which add up to the published bill (or to
    ``computed_hours`` when it is the larger).
    """
    c = positive("computed_hours", computed_hours)
    p = positive("published_hours", published_hours)
    a = c * amount("attention_share", attention_share, maximum=10.0)
    f_max = amount("failures_max_hours", failures_max_hours)
    gap = max(0.0, p - c)
    attention = min(a, gap)
    long_context = min(amount("long_context_hours", long_context_hours), gap - attention)
    failures = min(f_max, gap - attention - long_context)
    return {"computed": c, "attention": attention, "long_context": long_context, "failures": failures,
            "other": gap - attention - long_context - failures}


def bill_gap_figure(computed: dict, published_hours: float, attention_share: float, failures_max_hours: float,
                    title: str = "Computed GPU-hours against the published bill", long_context: dict | None = None):
    """Stacked bars: each computed bill (``computed`` maps a label to GPU-hours) with the gap to
    ``published_hours`` split by :func:`bill_gap_parts`, beside the published bill; in millions of GPU-hours.
    ``long_context`` maps the same labels to each bar's long-context GPU-hours (none when left out)."""
    computed = mapping("computed", computed)
    if not computed:
        raise ValueError("computed must name at least one computed bill")
    text("title", title)
    long_context = mapping("long_context", long_context) if long_context is not None else {}
    parts = {text("computed", k): bill_gap_parts(v, published_hours, attention_share, failures_max_hours,
                                                 long_context.get(k, 0.0))
             for k, v in computed.items()}
    fig, ax = plt.subplots(figsize=(9, 5.5))
    labels = list(parts) + ["published bill"]
    colours = {"computed": "tab:blue", "attention": "tab:orange", "long_context": "tab:purple", "failures": "tab:red",
               "other": "tab:grey"}
    names = {"computed": "6ND at the table's MFU", "attention": "attention scores at 8K",
             "long_context": "long-context stage: its 128K attention\nand lower rate (at most)",
             "failures": "failures, saves, restarts\n(what is left, up to their bound)",
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
                      f"the long-context stage {p['long_context'] / 1e6:.2f} M, "
                      f"failures {p['failures'] / 1e6:.2f} M (what is left, up to the failure share of a snapshot "
                      f"of the run extrapolated to the whole bill) and the leftover, other stages and the rest, "
                      f"{p['other'] / 1e6:.2f} M (hatched)."
                      for k, p in parts.items())
           + " The leftover is whatever the named parts do not fill, so every bar equals the published bill by "
             "construction.")
    return show(fig, alt=alt)
