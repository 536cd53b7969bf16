"""Figures for the pages that split the state, the layers and the time (chapter 3, pages 5-9).

Each returns a matplotlib figure with a title and labelled axes (units);
pages display it with :func:`lessonlib.book.plots.show` and alt text.
"""
from __future__ import annotations

from ..checks import reads as _reads

import statistics

import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from ..calc.comm import COLLECTIVES, Link
from ..checks import (amount as check_amount, choice as check_choice, count as check_count,
                      instance as check_instance, positive as check_positive, sequence as check_sequence,
                      mapping as check_mapping, text as check_text)
from ..calc.memory import activation_bytes_per_layer
from ..calc.sharding import ZERO_STAGES, zero_state_bytes
from .plots import COLORS, stacked_bars
from ..checks import record as check_record


def plot_zero_stages(n_params: int, world_size: int, label: str = ""):
    """Bytes per device at ZeRO stages 0-3 (Adam, mixed precision), stacked by part, in GB."""
    zero_state_bytes(n_params, world_size, 0)  # checks n_params and world_size before drawing anything
    label = check_text("label", label, allow_empty=True)
    data = {}
    for stage in ZERO_STAGES:
        name = "no sharding\n(stage 0)" if stage == 0 else f"stage {stage}"
        data[name] = {k: v for k, v in zero_state_bytes(n_params, world_size, stage).as_dict().items() if k != "total"}
    fig = stacked_bars(data, f"Training state per device, {label or f'{n_params:,} parameters'}, "
                             f"{world_size} devices (Adam, mixed precision)", "bytes per device (GB)", scale=1e9)
    fig.axes[0].set_xlabel("ZeRO stage (what is sharded)")
    return fig


def plot_tp_activations(seq_len: int, batch: int, hidden: int, heads: int, degrees=(1, 2, 4, 8, 16, 32),
                        node_size=None):
    """Activation bytes one layer keeps per device against the tensor-parallel degree t (MiB, log x), with fused
    attention (the default) and with stored attention scores (Korthikanti et al.'s case), each beside perfect 1/t.

    ``node_size`` (GPUs in a node, or None): degrees above it are shaded as crossing nodes."""
    activation_bytes_per_layer(seq_len, batch, hidden, heads)  # checks the shape first
    degrees = [check_count("degrees", t, maximum=4096) for t in check_sequence("degrees", degrees)]
    ts = [t for t in degrees if heads % t == 0 and hidden % t == 0]
    if not ts:
        raise ValueError(f"degrees must hold a tensor-parallel degree that divides heads ({heads}) and hidden ({hidden})")

    def per_device(attention):
        return [activation_bytes_per_layer(seq_len, batch, hidden, heads, tensor_parallel=t,
                                           attention=attention) / 2 ** 20 for t in ts]

    fused, per = per_device("fused"), per_device("stored")  # the default, and the 2022 paper's stored scores
    fig, ax = plt.subplots(figsize=(6.5, 5.0), layout="constrained")
    ax.plot(ts, fused, "o-", color="#4C72B0", label="fused attention: s·b·h·(10 + 24/t)")
    ax.plot(ts, per, "s-", color="#DD8452", label="stored scores (2022 paper): s·b·h·(10 + 24/t + 5as/(ht))")
    for curve, colour in ((fused, "#4C72B0"), (per, "#DD8452")):
        ax.plot(ts, [curve[0] / t for t in ts], ":", color=colour, alpha=0.7)
    ax.plot([], [], ":", color="grey", label="if every byte were split: (t = 1 value) / t")
    ax.axhline(10 * seq_len * batch * hidden / 2 ** 20, color="#C44E52", ls="--", lw=1,
               label="10·s·b·h: kept whole on every device")
    ax.set(xscale="log", xlabel="tensor-parallel degree t (devices per layer, log scale)",
           ylabel="activations per layer per device (MiB)",
           title=f"One layer's activations per device (s={seq_len}, b={batch}, h={hidden}, a={heads}, 16-bit)")
    ax.title.set_fontsize(10)
    ax.set_xticks(ts, [str(t) for t in ts])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(0, per[0] * 1.05)
    if node_size is not None:
        node_size = check_count("node_size", node_size, maximum=4096)
        if ts[-1] > node_size:
            ax.axvspan(node_size, ts[-1] * 1.1, color="grey", alpha=0.15,  # from t = node_size, which still fits
                       label=f"t > {node_size}: the layer's all-reduces cross nodes")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16))  # below: off the shaded degrees
    return fig


def _pipeline_steps(run, microbatches, step, schedules=None) -> tuple:
    """``(p, [(run of the schedule, its step ``step``)])`` for the runs of ``run`` (run_pipelines' result)
    with ``microbatches`` micro-batches (and a schedule in ``schedules``, if given); errors name the argument."""
    check_record("run", run, ("world_size", "runs"), "a result of run_pipelines")
    microbatches = check_count("microbatches", microbatches)
    step = check_count("step", step, minimum=0)
    runs = [r for r in run["runs"] if r["microbatches"] == microbatches
            and (schedules is None or r["schedule"] in check_sequence("schedules", schedules))]
    if not runs:
        raise ValueError(f"no run with microbatches={microbatches}" + ("" if schedules is None else
                                                                       f" and a schedule in {list(schedules)}"))
    for r in runs:
        if step >= len(r["steps"]):
            raise ValueError(f"step must be below the {len(r['steps'])} steps measured, got {step}")
    return run["world_size"], [(r, r["steps"][step]) for r in runs]


def _draw_step(ax, st, p, row: str, *, fade: float, share: float, fontsize: int, stages: bool) -> tuple:
    """One step's busy spans on ``ax``, a row per process (``row`` 0..p-1), in ms from its first computation:
    bars coloured by micro-batch, forward opaque and backward ``fade``, labelled where a bar is over ``share``
    of the step; with ``stages``, a process's later stage hatched and each label naming its stage.
    Returns the step's first and last times (s)."""
    cmap = plt.get_cmap("tab10")
    every = [s for spans in st["spans"] for s in spans]
    t0, t1 = min(s[2] for s in every), max(s[3] for s in every)
    for proc, spans in enumerate(st["spans"]):
        for kind, mb, a, b, *rest in spans:
            later = stages and bool(rest) and rest[0] >= p  # this process's second stage (loop or V)
            ax.broken_barh([(1e3 * (a - t0), 1e3 * (b - a))], (proc - 0.4, 0.8), facecolors=cmap(mb % 10),
                           edgecolor="white", hatch="///" if later else None, alpha=1.0 if kind == "F" else fade)
            if b - a > share * (t1 - t0):
                label = f"{kind}{mb}" + (f"\n s{rest[0]}" if stages and rest else "")
                ax.text(1e3 * (a + b) / 2 - 1e3 * t0, proc, label, ha="center", va="center", fontsize=fontsize)
    ax.set_yticks(range(p), [f"{row} {s}" for s in range(p)])
    ax.set_ylim(p - 0.4, -0.6)
    ax.set_ylabel("process")
    return t0, t1


def _drop_unfit_labels(fig, labels) -> None:
    """Fit each label ``(ax, text, start, end)`` (``"W3"`` on a bar spanning start..end in data units) to its bar
    once the figure is laid out: stacked (``"W"`` above ``"3"``) where one line is wider than the bar, removed
    where that is too: a label that spills over its neighbours' is worse than none."""
    renderer = fig.canvas.get_renderer()
    for ax, text, a, b in labels:
        (x0, _), (x1, _) = ax.transData.transform([(a, 0), (b, 0)])
        room = abs(x1 - x0) - 1
        if text.get_window_extent(renderer).width > room:
            label = text.get_text()
            text.set_text(label[0] + "\n" + label[1:])
            if text.get_window_extent(renderer).width > room:
                text.remove()


@_reads("run")
def plot_pipeline_timelines(run: dict, microbatches: int, step: int = 0):
    """Busy spans of each stage as recorded in one real step, GPipe above 1F1B (ms from the step's start),
    on one shared time axis, so that the panels' lengths compare."""
    p, steps = _pipeline_steps(run, microbatches, step)
    fig, axes = plt.subplots(len(steps), 1, figsize=(7.5, 1.3 + 1.0 * p * len(steps)), squeeze=False, sharex=True)
    longest = 0.0
    for ax, (r, st) in zip(axes[:, 0], steps):
        t0, t1 = _draw_step(ax, st, p, "stage", fade=0.55, share=0.02, fontsize=7, stages=False)
        longest = max(longest, t1 - t0)
        ax.set_title(f"{r['schedule']}: {microbatches} micro-batches, step {step + 1} of {len(r['steps'])}, "
                     f"{1e3 * (t1 - t0):.0f} ms: idle {st['idle_share']:.0%} "
                     f"(formula {(p - 1) / (microbatches + p - 1):.0%})", fontsize=10)
    axes[-1, 0].set_xlim(0, 1.02e3 * longest)  # shared by every panel; a margin, so that the last bar is not cut
    axes[-1, 0].set_xlabel("time since the step's first computation (ms)\nF = forward, B = backward, gaps = waiting")
    fig.suptitle("Pipeline steps recorded on real processes")
    fig.tight_layout()
    return fig


@_reads("run")
def plot_idle_shares(run: dict):
    """Median measured idle share against m for each schedule, with (p-1)/(m+p-1)."""
    p = check_record("run", run, ("world_size", "runs"), "a result of run_pipelines")["world_size"]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ms_all = sorted({r["microbatches"] for r in run["runs"]})
    ax.plot(ms_all, [100 * (p - 1) / (m + p - 1) for m in ms_all], "k--", label="(p − 1)/(m + p − 1)")
    for name, marker in (("GPipe", "o"), ("1F1B", "s")):
        rs = [r for r in run["runs"] if r["schedule"] == name]
        if rs:
            ax.plot([r["microbatches"] for r in rs],
                    [100 * statistics.median(s["idle_share"] for s in r["steps"]) for r in rs],
                    marker=marker, label=f"{name}, measured (median of steps)")
    ax.set(xscale="log", xlabel="micro-batches per step m (log scale)", ylabel="idle share (% of stage time)",
           title=f"Idle share of {p} pipeline stages, measured and predicted", ylim=(0, 100))
    ax.set_xticks(ms_all, [str(m) for m in ms_all])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.legend(fontsize=8)
    return fig


@_reads("sizes", "seconds")
def plot_alpha_beta(sizes, seconds, link: Link, world_size: int = 2, collective: str = "all_reduce"):
    """Measured collective times (one per size, seconds) against message size, and the fitted alpha-beta line (log-log)."""
    sizes = [check_positive("sizes", x) for x in check_sequence("sizes", sizes)]
    seconds = [check_positive("seconds", t) for t in check_sequence("seconds", seconds)]
    if len(sizes) != len(seconds):
        raise ValueError(f"sizes and seconds must have the same length, got {len(sizes)} and {len(seconds)}")
    check_instance("link", link, Link, "a Link (alpha_s, beta_bytes_per_s)")
    world_size = check_count("world_size", world_size, minimum=2)
    check_choice("collective", collective, COLLECTIVES)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(sizes, [1e6 * t for t in seconds], "o", label="measured (fastest of the rounds)", color=COLORS["weights"])
    lo, hi = min(sizes), max(sizes)
    xs = [lo * (hi / lo) ** (i / 60) for i in range(61)]
    ax.plot(xs, [1e6 * link.seconds(collective, x, world_size) for x in xs], "-", color=COLORS["gradients"],
            label=f"fit: α = {link.alpha_us:.0f} µs per step, β = {link.beta_GBps:.2f} GB/s")
    ax.set(xscale="log", yscale="log", xlabel="tensor size (bytes, log scale)",
           ylabel="time (µs, log scale)",
           title=f"{collective.replace('_', '-')} on {world_size} processes: measured and the α–β model")
    ax.legend(fontsize=8)
    return fig


@_reads("run")
def plot_schedule_timelines(run: dict, microbatches: int, schedules=None, step: int = 0):
    """Busy spans of each process in one real step, one panel per schedule (ms from the step's start).

    For results of ``run_pipelines`` whose spans carry a stage index: bars are
    coloured by micro-batch, hatched on a process's later stage (its second
    stage of an interleaved or V placement), and labelled where the label fits the
    bar; under each timeline the same actions in their order, one equal
    cell each, every one labelled ``F``, ``B``, ``I`` (input-gradient backward) or
    ``W`` (weight-gradient backward) with the micro-batch.
    """
    p, steps = _pipeline_steps(run, microbatches, step, schedules)
    runs = [r for r, _ in steps]
    # each schedule gets two panels: the timeline (bars as long as they took), and the same actions in their
    # order, one equal cell each, labelled: the strip names the actions, the timeline shows how long they took
    fig, axes = plt.subplots(2 * len(runs), 1, figsize=(8, 1.6 + 1.9 * p * len(runs)), squeeze=False,
                             gridspec_kw={"height_ratios": [1.05, 0.8] * len(runs)})
    cmap = plt.get_cmap("tab10")
    labels = []
    for i, r in enumerate(runs):
        ax, order_ax = axes[2 * i, 0], axes[2 * i + 1, 0]
        st = r["steps"][step]
        every = [s for spans in st["spans"] for s in spans]
        t0, t1 = min(s[2] for s in every), max(s[3] for s in every)
        longest = 0
        for proc, spans in enumerate(st["spans"]):
            for j, (kind, mb, a, b, *rest) in enumerate(sorted(spans, key=lambda sp: sp[2])):
                later = bool(rest) and rest[0] >= p  # this process's second stage (loop or V)
                style = dict(facecolors=cmap(mb % 10), edgecolor="white", hatch="///" if later else None,
                             alpha=1.0 if kind == "F" else 0.6)
                ax.broken_barh([(1e3 * (a - t0), 1e3 * (b - a))], (proc - 0.4, 0.8), **style)
                labels.append((ax, ax.text(1e3 * ((a + b) / 2 - t0), proc, f"{kind}{mb}", ha="center", va="center",
                                           fontsize=7), 1e3 * (a - t0), 1e3 * (b - t0)))
                order_ax.broken_barh([(j, 1)], (proc - 0.4, 0.8), **style)
                order_ax.text(j + 0.5, proc, f"{kind}{mb}", ha="center", va="center", fontsize=8)
            longest = max(longest, len(spans))
        ax.set_yticks(range(p), [f"process {s}" for s in range(p)])
        ax.set_ylim(p - 0.4, -0.6)
        ax.set_xlim(0, 1.02e3 * (t1 - t0))  # a margin, so that the last bar is not cut at the edge
        ax.set_title(f"{r['schedule']}, measured: {microbatches} micro-batches, step {step + 1} of {len(r['steps'])}, "
                     f"idle share {st['idle_share']:.0%} (gaps = waiting)", fontsize=10)
        ax.set_xlabel("time since the step's first computation (ms)", fontsize=8)
        ax.set_ylabel("process")
        order_ax.set_yticks(range(p), [f"process {s}" for s in range(p)])
        order_ax.set_ylim(p - 0.4, -0.6)
        order_ax.set_xlim(0, longest)
        order_ax.set_xticks([])
        order_ax.set_title(f"{r['schedule']}: the same actions in their order on each process", fontsize=9)
        order_ax.set_xlabel("action number on the process (one cell each, whatever it took)", fontsize=8)
    axes[-1, 0].set_xlabel("action number on the process (one cell each, whatever it took)\nF forward, B backward, "
                           "I input-gradient backward, W weight-gradient backward, with the micro-batch; "
                           "hatched = a process's later stage; gaps = waiting", fontsize=8)
    fig.suptitle("Pipeline schedules recorded on real processes")
    fig.tight_layout()
    _drop_unfit_labels(fig, labels)
    return fig


def step_terms_figure(first, second, names=("first choice", "published"), title: str = "One training step, term by term"):
    """Two :class:`~lessonlib.calc.layout.LayoutCost` steps as stacked bars (seconds): compute, the pipeline's
    bubble and the communication nothing hides (every exposed collective together), each segment labelled with its
    seconds. Returns the figure."""
    from ..calc.layout import LayoutCost

    for name, c in (("first", first), ("second", second)):
        if not isinstance(c, LayoutCost):
            raise TypeError(f"{name} must be a LayoutCost, got {type(c).__name__}")
    names = check_sequence("names", names)
    if len(names) != 2 or len({str(n) for n in names}) != 2:
        raise ValueError(f"names must give the two layouts two different names, got {names!r:.80}")
    data = {f"{n}\n{c.layout.label().split(' (')[0]}": {
        "compute": c.compute_s, "pipeline bubble": c.bubble_s,
        "exposed communication": max(0.0, c.step_s - c.compute_s - c.bubble_s)} for n, c in zip(names, (first, second))}
    fig = stacked_bars(data, check_text("title", title), "time per step (s)",
                       colors={"compute": "#4C72B0", "pipeline bubble": "#DD8452", "exposed communication": "#C44E52"})
    ax = fig.axes[0]
    ax.set_xlabel("layout")
    # each segment's seconds on it, where the segment is tall enough for a line of text (a 25th of the tallest bar)
    tallest = max(sum(parts.values()) for parts in data.values())
    for bars, ink in zip(ax.containers, ("white", "black", "white")):
        ax.bar_label(bars, labels=[f"{b.get_height():.2f} s" if b.get_height() > tallest / 25 else ""
                                   for b in bars], label_type="center", fontsize=8, color=ink)
    # beside the bars, not on them: inside the axes it covered the first bar's exposed-communication segment
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.set_size_inches(9, 4)
    fig.tight_layout()
    return fig


def plot_simulated_timelines(orders: dict, title: str = "Equal stages, simulated: where the bubble goes",
                             stage_size: dict | None = None):
    """Gantt charts of each schedule's own action order run with equal stages (forward 1, backward 2 time units).

    ``stage_size`` maps a schedule name to the size of its stages, in those units (default 1): a schedule
    with one stage a process, beside others whose processes hold two half-size stages, takes 2, so that
    every panel runs the same model's work on the shared time axis. The idle shares do not depend on it.

    ``orders`` maps a schedule name to its per-process action lists as torch writes them (``"0F1"``; what
    :func:`lessonlib.calc.pipeline.read_schedule` returns as ``order``); each is run by
    :func:`lessonlib.calc.pipeline.simulate_actions` with :data:`lessonlib.calc.pipeline.EQUAL_STAGE_TIMES`,
    transfers free. One panel per schedule, on one shared time axis (time units), titled with the idle share.
    Returns the figure.
    """
    from ..calc.pipeline import EQUAL_STAGE_TIMES, schedule_idle_fraction, simulate_actions

    orders = check_mapping("orders", orders)
    if not orders:
        raise ValueError("orders must hold at least one schedule")
    check_text("title", title)
    size = check_mapping("stage_size", {} if stage_size is None else stage_size, allow_empty=True)
    for name, k in size.items():
        check_choice("stage_size", name, tuple(orders))
        check_positive(f"stage_size[{name!r}]", k)
    sims = {check_text("orders", name): simulate_actions(
        order, {kind: size.get(name, 1) * t for kind, t in EQUAL_STAGE_TIMES.items()})
        for name, order in orders.items()}
    end = max(t["end"] for tasks in sims.values() for t in tasks)
    procs = max(len(order) for order in orders.values())
    fig, axes = plt.subplots(len(sims), 1, figsize=(9, 0.9 + 1.1 * procs * len(sims)), squeeze=False, sharex=True)
    cmap = plt.get_cmap("tab10")
    labels = []
    for ax, (name, tasks) in zip(axes[:, 0], sims.items()):
        for t in tasks:
            later = t["stage_index"] >= procs  # a process's later stage (loop or V placement)
            ax.broken_barh([(t["start"], t["end"] - t["start"])], (t["process"] - 0.4, 0.8),
                           facecolors=cmap(t["microbatch"] % 10), edgecolor="white",
                           hatch="///" if later else None, alpha=1.0 if t["kind"] == "F" else 0.6)
            labels.append((ax, ax.text((t["start"] + t["end"]) / 2, t["process"], f"{t['kind']}{t['microbatch']}",
                                       ha="center", va="center", fontsize=7), t["start"], t["end"]))
        ax.set_yticks(range(procs), [f"process {q}" for q in range(procs)])
        ax.set_ylim(procs - 0.4, -0.6)
        ax.set_xlim(0, 1.01 * end)
        ax.set_title(f"{name}: idle share {schedule_idle_fraction(tasks):.1%} (gaps = waiting)", fontsize=10)
    axes[-1, 0].set_xlabel("time (units: a stage's forward = 1, its backward = 2, I = W = 1"
                           + (", times each panel's stage size" if size else "") + ")\nF forward, "
                           "B backward, I input-gradient backward, W weight-gradient backward, with the "
                           "micro-batch; hatched = a process's later stage", fontsize=8)
    fig.suptitle(check_text("title", title))
    fig.tight_layout()
    _drop_unfit_labels(fig, labels)
    return fig
