"""Strong against weak scaling, rendered: the measured table and the critical-batch figure.

Renders only: the numbers come from :func:`lessonlib.measure.distributed.scaling.run_scaling`
and :func:`lessonlib.calc.batch_size.batch_tradeoff`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ..calc.batch_size import batch_tradeoff
from ..checks import counts, positive, reads as _reads
from .plots import show
from .tables import table

_QUESTION = {"one": "the reference", "strong": "strong scaling: the same job (same global batch), sooner?",
             "weak": "fixed budget, larger global batch: fewer steps"}


@_reads("run")
def scaling_display_rows(run) -> list:
    """The numbers :func:`scaling_table` shows, one dict per case: seconds rounded to 0.001 s and
    the speedup as the ratio of the rounded times (rounded to 0.01), so the shown numbers divide."""
    from ..measure.distributed.scaling import CASES, ScalingRun

    if not isinstance(run, ScalingRun):
        raise TypeError(f"run must be run_scaling's ScalingRun, got {type(run).__name__}")
    cases = [getattr(r, "case", None) for r in run.rows]
    if sorted(map(str, cases)) != sorted(CASES):
        raise ValueError(f"run must hold one row of each case {CASES}, got {cases}")
    ref = round(run.row("one").seconds, 3)
    out = []
    for r in run.rows:
        s = round(r.seconds, 3)
        out.append({"case": r.case, "processes": r.processes, "global_batch": r.global_batch,
                    "per_process_batch": r.per_process_batch, "steps": r.steps, "examples": r.examples,
                    "seconds": s, "speedup": round(ref / s, 2), "question": _QUESTION[r.case]})
    return out


def scaling_table(run) -> str:
    """An HTML table of :func:`run_scaling`'s cases: processes, global batch, steps, time to finish, speedup."""
    rows = scaling_display_rows(run)
    return table(["processes", "global batch", "per process", "steps", "time to finish (s)", "speedup",
                  "which question"],
                 [(r["processes"], f"{r['global_batch']:,}", f"{r['per_process_batch']:,}", f"{r['steps']:,}",
                   f"{r['seconds']:.3f}", f"{r['speedup']:.2f}×", r["question"]) for r in rows],
                 caption=f"Time to go through {run.examples:,} examples: the median over {run.rounds} rounds "
                 "(per round, the slowest process); speedup = one-process time / this time.")


def critical_batch_figure(noise_scale, min_steps, batches):
    """Steps and examples to one loss against the global batch (McCandlish et al. 2018), log axes.

    ``noise_scale`` (the critical batch, examples) and ``min_steps`` (> 0);
    ``batches``: the global batches to draw (examples, at least two, each at most 2**40).
    """
    noise_scale = positive("noise_scale", noise_scale)
    min_steps = positive("min_steps", min_steps)
    batches = counts("batches", batches, maximum=2 ** 40)
    if len(batches) < 2:
        raise ValueError("batches needs at least two global batches to draw a line")
    pts = [batch_tradeoff(b, noise_scale, min_steps) for b in batches]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    ax.plot(batches, [p.steps_over_min for p in pts], marker="o", ms=3, label="steps / fewest steps (K / K_min)")
    ax.plot(batches, [p.examples_over_min for p in pts], marker="s", ms=3,
            label="examples / fewest examples (E / E_min)")
    ax.axvline(noise_scale, color="grey", ls=":", lw=1)
    ax.text(noise_scale * 1.15, 0.55, "critical batch\n(B_noise)", fontsize=9, color="grey", va="center",
            transform=ax.get_xaxis_transform())  # x in data, y in axes fraction: clear of both curves
    ax.set(xscale="log", yscale="log", xlabel="global batch (examples per step, log scale)",
           ylabel="cost relative to its minimum (×, log scale)",
           title="Past the critical batch, more examples per step stop saving steps")
    ax.legend(fontsize=8)
    return show(fig, alt="A log-log chart against the global batch. The steps needed fall in proportion to the "
                "batch while the batch is small, then level off at the fewest possible steps past the critical "
                "batch; the examples needed stay near their minimum at small batches and grow in proportion to "
                "the batch past it. The two curves cross at the critical batch, where each is twice its minimum.")
