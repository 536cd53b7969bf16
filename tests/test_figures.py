"""Three redrawn figures: the shapes they must show."""
import matplotlib

matplotlib.use("Agg")

import pytest

from built_pages import figure_faults

from lessonlib.book import bill_plots, memory_plots, plots, speedup_plots
from lessonlib.calc import amdahl
from lessonlib.calc.goodput import goodput
from lessonlib.calc.memory import activation_bytes


def _sweep():
    base = dict(batch=2, seq=64, layers=2, hidden=128, heads=4)
    sweeps = {"batch": [1, 2, 4, 8], "seq": [32, 64, 128, 256], "layers": [1, 2, 4], "hidden": [64, 128, 256]}
    results = {}
    for knob, values in sweeps.items():
        for v in values:
            c = {**base, knob: v}
            f = activation_bytes(c["seq"], c["batch"], c["hidden"], c["heads"], c["layers"], attention="stored")
            results[(knob, v)] = (f, f)
    return sweeps, results


def _slope(line):
    import math

    (x0, x1), (y0, y1) = line.get_xdata()[[0, -1]], line.get_ydata()[[0, -1]]
    return math.log(y1 / y0) / math.log(x1 / x0)


def test_activation_sweep_is_log_log_with_a_slope_one_guide():
    sweeps, results = _sweep()
    fig = memory_plots.plot_activation_sweep(results, sweeps, {"batch": "batch (sequences)"})
    for ax, knob in zip(fig.axes, sweeps):
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        guide, formula, measured = ax.get_lines()
        assert guide.get_label().endswith("(slope 1)") and _slope(guide) == pytest.approx(1.0)
        s = _slope(formula)
        if knob in ("batch", "layers"):
            assert s == pytest.approx(1.0)      # exactly linear: on the guide
        elif knob == "seq":
            assert s > 1.2                       # the s**2 term: steeper than the guide
        else:
            assert 0.5 < s < 1.0                 # width: the s**2 term does not grow with h
        assert ax.get_xlabel() and "log scale" in ax.get_xlabel()
    assert fig.axes[0].get_ylabel() == "activations (MiB, log scale)"
    assert fig.axes[0].get_xlabel() == "batch (sequences, log scale)"
    assert fig._suptitle.get_text()
    plots.show(fig, alt="four log-log panels")


def test_memory_multiplier_bars_are_labelled_with_their_values():
    ratios = {"SGD, fp32": 2.77, "Adam, fp32": 4.77, "Adam, mixed": 8.84, "long sequences": 50.7}
    fig = memory_plots.plot_memory_multiplier(ratios)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["2.8×", "4.8×", "8.8×", "50.7×"]  # every value readable without the axis
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert len(ticks) >= 5 and "10×" in ticks and "50×" in ticks  # more than a single "10"
    assert ax.get_title() and "×" in ax.get_ylabel()
    plots.show(fig, alt="bars")


def test_recompute_policy_figure_labels_every_policy_and_reads_them_in_its_alt_text():
    from lessonlib.calc.memory import activation_bytes_per_layer
    from lessonlib.calc.recompute import matmul_outputs_bytes_per_layer

    kept = {"none": activation_bytes_per_layer(64, 1, 64, 4, attention="stored") / 4096,
            "attention": activation_bytes_per_layer(64, 1, 64, 4, "attention", attention="stored") / 4096,
            "save_matmuls": matmul_outputs_bytes_per_layer(1, 1, 1), "full": 2}
    extra = {"none": 0.0, "attention": 4.8, "save_matmuls": 4.8, "full": 33.3}
    shown = memory_plots.recompute_policy_figure(kept, extra)
    assert [round(v) for v in kept.values()] == [54, 34, 20, 2]
    for name in kept:
        assert f"{name}: {kept[name]:.0f} bytes, {extra[name]:.1f} percent" in shown.alt
    assert "full keeps the least; full adds the most FLOPs" in shown.alt
    with pytest.raises(ValueError, match="same policies"):
        memory_plots.recompute_policy_figure(kept, {"none": 0.0})
    # 2.3's two panels carry one title over both (readers asked for it), read first in the alt text
    titled = memory_plots.recompute_policy_figure(kept, extra, suptitle="What each policy keeps")
    assert titled.alt.startswith("What each policy keeps. ")
    with pytest.raises(TypeError, match="suptitle"):
        memory_plots.recompute_policy_figure(kept, extra, suptitle=3)


def test_goodput_failure_figure_separates_the_reliability_curves():
    ns = [1, 8, 64, 512, 4096, 16384, 65536]
    rows = {f"{mt:,} h": [goodput(n, amdahl.speedup_from_share(0.001, n), mt, 60, 600) for n in ns]
            for mt in (5_000, 50_000, 500_000)}
    no_fail = [amdahl.speedup_from_share(0.001, n) / n for n in ns]
    fig = speedup_plots.plot_goodput_failures(ns, rows, no_fail, title="t")
    left, right = fig.axes
    lost = [line.get_ydata() for line in left.get_lines()]
    # at the largest job the three reliabilities lose clearly different shares (points, not a hair apart)
    last = sorted(y[-1] for y in lost)
    assert last[1] - last[0] > 5 and last[2] - last[1] > 5
    top_lost = max(max(y) for y in lost)
    assert left.get_ylim()[0] == 0 and top_lost <= left.get_ylim()[1] <= 100 and "%" in left.get_ylabel()
    # the no-failure line is drawn on top of the others, and lies above every failure curve
    top = max(right.get_lines(), key=lambda line: line.get_zorder())
    assert top.get_label().startswith("no failures")
    for line in right.get_lines():
        if line is not top:
            assert all(y <= t + 1e-12 for y, t in zip(line.get_ydata(), top.get_ydata()))
    assert right.get_yscale() == "log"
    plots.show(fig, alt="two panels")


def test_goodput_figure_marks_a_back_solved_point_as_an_input():
    """Page 3.13's left panel reaches its last point because the restart time was solved to give it: the point is
    ringed and labelled as an input on the figure, and the alt text says so; without a note nothing is added."""
    ns = [1, 64, 16384]
    shown = speedup_plots.goodput_figure(ns, 0.0, 33.0, 312.0, mtbfs=(50_000,), input_note="an input, not a result")
    assert "a point marked on the figure: an input, not a result" in shown.alt
    plain = speedup_plots.goodput_figure(ns, 0.0, 33.0, 312.0, mtbfs=(50_000,))
    assert "marked on the figure" not in plain.alt
    rows = {"m": [goodput(n, float(n), 50_000, 33.0, 312.0) for n in ns]}
    fig = speedup_plots.plot_goodput_failures(ns, rows, [1.0] * 3, input_note="an input")
    notes = [c for c in fig.axes[0].get_children() if isinstance(c, matplotlib.text.Annotation)]
    assert [a.get_text() for a in notes] == ["an input"]
    assert notes[0].xy == (ns[-1], pytest.approx(100 * (1 - rows["m"][-1].useful_fraction)))
    assert len(fig.axes[0].get_lines()) == 1  # the ring is not a curve
    with pytest.raises(TypeError):
        speedup_plots.plot_goodput_failures(ns, rows, [1.0] * 3, input_note=3)


def test_the_built_page_check_finds_a_stray_repr_and_a_figure_shown_twice():
    img = '<img src="data:image/png;base64,AAAA" alt="x">'
    assert figure_faults(f"<p>{img}</p>") == []
    assert len(figure_faults(f"{img}<pre>&lt;matplotlib.legend.Legend at 0x7f3a2c&gt;</pre>")) == 1
    assert len(figure_faults("<pre>Text(0.5, 0, 'optimizer')</pre>")) == 1
    assert len(figure_faults("<pre>Text(0.5, 0, &#39;optimizer&#39;)</pre>")) == 1
    assert len(figure_faults(img + img)) == 1
    # a cell whose last line returns None (3.12's clean-up once did), or a warning in a cell's stderr (3.4's
    # FLOP count once did), is a fault; a None inside real output is not
    assert len(figure_faults("<pre><span></span>None\n</pre>")) == 1
    assert len(figure_faults("<pre>(None, None)</pre>")) == 1
    assert figure_faults("<pre><span></span>largest: None of the 4 tensors differ\n</pre>") == []
    stderr = ('<div class="output stderr highlight-myst-ansi notranslate"><div class="highlight"><pre><span></span>'
              "/x/timing.py:149: UncountedFlopsWarning: FlopCounterMode has no FLOP formula for aten.index_add")
    assert len(figure_faults(stderr)) == 1
    assert figure_faults("<p>PyTorch raises a UserWarning: here is why</p>") == []



def test_activation_sweep_puts_at_most_two_panels_a_row():
    """Four panels in one row were illegible on a 1280 px page (1.3): a 2 x 2 grid at full width instead."""
    sweeps, results = _sweep()
    fig = memory_plots.plot_activation_sweep(results, sweeps)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == len(sweeps)
    columns = {round(ax.get_position().x0, 3) for ax in visible}
    assert len(columns) == min(2, len(sweeps))
    assert fig.get_figwidth() <= 8


def test_step_terms_figure_stacks_compute_bubble_and_exposed_communication():
    from lessonlib.book.split_plots import step_terms_figure
    from lessonlib.calc.layout_search import published_layout_cost
    meta = published_layout_cost()
    plain = published_layout_cost(recompute="full")
    fig = step_terms_figure(plain, meta, ("full recomputation", "save_matmuls"))
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert len(heights) == 6 and abs(sum(heights[1::2]) - meta.step_s) < 1e-9 * meta.step_s
    assert ax.get_ylabel() == "time per step (s)" and ax.get_xlabel() == "layout"
    labels = {t.get_text() for t in ax.texts}  # each segment's seconds printed on it
    assert f"{meta.compute_s:.2f} s" in labels and f"{meta.bubble_s:.2f} s" in labels
    with pytest.raises(TypeError, match="first"):
        step_terms_figure(0.5, meta)
    with pytest.raises(ValueError, match="names"):
        step_terms_figure(plain, meta, ("same", "same"))


def test_bill_gap_parts_add_up_and_fill_in_order():
    p = bill_plots.bill_gap_parts(24.0, 30.0, 0.05, 3.0)
    assert p == pytest.approx({"computed": 24.0, "attention": 1.2, "long_context": 0.0, "failures": 3.0, "other": 1.8})
    # the long-context stage comes before the failures: they get what is left, below their bound here
    lc = bill_plots.bill_gap_parts(24.0, 30.0, 0.05, 3.0, long_context_hours=2.5)
    assert lc == pytest.approx({"computed": 24.0, "attention": 1.2, "long_context": 2.5, "failures": 2.3, "other": 0})
    small = bill_plots.bill_gap_parts(28.0, 30.0, 0.05, 3.0)   # the gap runs out inside the failures' bound
    assert small["attention"] == pytest.approx(1.4) and small["failures"] == pytest.approx(0.6) and small["other"] == 0
    assert sum(bill_plots.bill_gap_parts(31.0, 30.0, 0.05, 3.0).values()) == 31.0  # no gap: nothing added
    for kwargs, name in ((dict(computed_hours=0.0), "computed_hours"), (dict(attention_share=-1.0), "attention_share"),
                         (dict(failures_max_hours=float("nan")), "failures_max_hours"),
                         (dict(long_context_hours=-1.0), "long_context_hours")):
        args = dict(computed_hours=24.0, published_hours=30.0, attention_share=0.05, failures_max_hours=3.0)
        args.update(kwargs)
        with pytest.raises(ValueError, match=name):
            bill_plots.bill_gap_parts(**args)


def test_bill_gap_figure_alt_text_reads_the_parts():
    shown = bill_plots.bill_gap_figure({"high MFU": 24.0e6}, 30.0e6, 0.05, 3.0e6)
    assert "30.00 M" in shown.alt and "attention 1.20 M" in shown.alt and "other stages and the rest, 1.80 M" in shown.alt and "by construction" in shown.alt
    with pytest.raises(ValueError, match="computed"):
        bill_plots.bill_gap_figure({}, 30.0e6, 0.05, 3.0e6)
    shown = bill_plots.bill_gap_figure({"high MFU": 24.0e6}, 30.0e6, 0.05, 3.0e6, long_context={"high MFU": 2.5e6})
    assert "long-context stage 2.50 M" in shown.alt and "failures 2.30 M" in shown.alt


def test_simulated_timelines_title_each_schedule_with_its_equal_stage_idle_share():
    from lessonlib.book.split_plots import plot_simulated_timelines
    from lessonlib.calc.pipeline import EQUAL_STAGE_TIMES, schedule_idle_fraction, simulate_actions
    order = {0: ["0F0", "0F1", "0B0", "0B1"], 1: ["1F0", "1B0", "1F1", "1B1"]}
    fig = plot_simulated_timelines({"1F1B": order})
    idle = schedule_idle_fraction(simulate_actions(order, EQUAL_STAGE_TIMES))
    assert fig.axes[0].get_title() == f"1F1B: idle share {idle:.1%} (gaps = waiting)"
    assert "time" in fig.axes[0].get_xlabel() and len(fig.axes[0].texts) == 8  # every action labelled
    plots.show(fig, alt="one panel")
    with pytest.raises(ValueError, match="orders"):
        plot_simulated_timelines({})
    # a stage twice the size: the same idle share over twice the time axis
    big = plot_simulated_timelines({"1F1B": order}, stage_size={"1F1B": 2})
    assert big.axes[0].get_title() == fig.axes[0].get_title()
    assert big.axes[0].get_xlim()[1] == pytest.approx(2 * fig.axes[0].get_xlim()[1])
    with pytest.raises(ValueError, match="stage_size"):
        plot_simulated_timelines({"1F1B": order}, stage_size={"ZBV": 2})


def test_an_alt_text_with_an_unfilled_template_is_refused():
    import matplotlib.pyplot as plt

    from lessonlib.book.figures import show

    fig, _ = plt.subplots()
    with pytest.raises(ValueError, match=r"unfilled template, '\{100 \* share:g\}'"):
        show(fig, alt="Right: serial share {100 * share:g} percent")
    plt.close(fig)
    # the Amdahl figure, whose alt text once lost an f prefix, fills every field
    fig = speedup_plots.amdahl_figure([1, 2, 4], [0.0, 0.2], 0.2, 0.05, 0.005)
    assert "{" not in fig.alt and "Gustafson" in fig.alt


def test_the_bill_figure_draws_without_a_layout_warning_wide_and_for_phones():
    # 3.14's bill figure showed matplotlib's layout warnings on the built page three times (its legend beside the
    # axes left tight_layout no room; constrained layout then collapsed in the phone version): with 3.14's labels,
    # the wide and the phone version must draw with no warning
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shown = bill_plots.bill_gap_figure(
            {"6ND at 41.0% MFU (8,192 GPUs, 8K context)": 26.5e6, "6ND at 38.0% MFU (16,384 GPUs, 8K context)": 28.6e6},
            30.84e6, 0.042, 3.1e6,
            title="Llama 3 405B: 6ND at Table 4's MFU against the published GPU-hours (8K-context rows)")
    assert shown.phone_png is not None, "a figure this wide gets a phone version"


def test_a_constrained_figure_keeps_its_layout_through_show_without_a_warning():
    # the figure pipeline's re-layouts (phone version, wrapped tick labels) must not switch a constrained
    # figure to tight layout: that warns on the page
    import warnings

    import matplotlib.pyplot as plt

    from lessonlib.book.figures import show

    fig, ax = plt.subplots(figsize=(10, 4), layout="constrained")
    ax.plot([1, 2], [1, 2], label="a line with a fairly long label")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        show(fig, alt="A line.")
