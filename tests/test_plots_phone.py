"""Multi-panel figures get a stacked version for phones; single panels do not."""
from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lessonlib.book import plots  # noqa: E402


def _size(png: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(png)).size


def test_side_by_side_panels_stack_for_phones():
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.4))
    for i, ax in enumerate(axes):
        ax.plot([0, 1], [0, i])
        ax.set_title(f"panel {i}")
    axes[1].twinx().plot([0, 1], [1, 0])  # a twin axis moves with its panel
    shown = plots.show(fig, alt="four panels")
    (w, h), (pw, ph) = _size(shown.png), _size(shown.phone_png)
    assert w > 3 * h and ph > 3 * pw  # wide row; tall column
    assert pw <= 560  # about a phone's width at 1.5 device px per CSS px: shrinks little
    html = shown._repr_mimebundle_()["text/html"]
    assert f"max-width: {plots.PHONE_MAX_WIDTH}px" in html and html.count("data:image/png") == 2
    assert 'alt="four panels"' in html


def test_single_panel_has_one_image_when_it_is_narrow_enough():
    fig, ax = plt.subplots(figsize=(plots.PHONE_WIDTH_IN, 3))
    ax.plot([0, 1], [0, 1])
    shown = plots.show(fig, alt="one panel")
    assert shown.phone_png is None and "<picture>" not in shown._repr_mimebundle_()["text/html"]


def test_a_wide_figure_gets_a_phone_version_whose_text_reads_on_a_phone():
    # At 390 px a figure is shown about 350 CSS px wide: its smallest text must stay 8 CSS px or more there.
    fig, ax = plt.subplots(figsize=(11, 3.2))
    ax.plot([0, 1], [0, 1], label="a line")
    ax.text(0.5, 0.5, "F3", fontsize=6)
    ax.legend(fontsize=7)
    ax.set(title="A long title that a phone cannot show on one line of a narrow figure, so it wraps",
           xlabel="time (units of one micro-batch's forward pass on one stage)")
    shown = plots.show(fig, alt="one wide panel")
    (w, _), (pw, _) = _size(shown.png), _size(shown.phone_png)
    assert 350 / w * shown.font_px < 8  # the wide version is too small on a phone ...
    assert 350 / pw * shown.phone_font_px >= 8  # ... the phone version is not
    html = shown._repr_mimebundle_()["text/html"]
    assert 'data-font-px="' in html and 'data-phone-font-px="' in html


def test_the_pipeline_gantt_chart_has_a_phone_version_in_rows():
    from lessonlib.book.speedup_plots import pipeline_schedule_figure
    from lessonlib.calc import pipeline as P

    tasks = P.pipeline_schedule(4, 8, forward_time=1.0, backward_time=2.0)
    shown = pipeline_schedule_figure(tasks, 4, 8, P.schedule_idle_fraction(tasks))
    pw, ph = _size(shown.phone_png)
    assert ph > pw and 350 / pw * shown.phone_font_px >= 8


def test_a_legend_beside_the_lowest_plot_goes_under_it_on_a_phone_and_the_plot_keeps_the_width():
    """A legend anchored right of the plot (as wide bar charts place theirs) would squeeze a phone's plot
    until its tick labels overlap: the phone version puts it under the tick labels, in one column."""
    from lessonlib.book.figures import PHONE_WIDTH_IN, _phone_png, for_phone

    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(["search's first choice\nTP 8 x PP 8 x DP 256", "Meta's degrees\nTP 8 x PP 16 x DP 128"], [4.4, 4.4],
           label="compute")
    ax.bar([0, 1], [0.5, 1.0], bottom=[4.4, 4.4], label="pipeline bubble")
    ax.set_xlabel("layout")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    assert for_phone(fig)
    png = _phone_png(fig)
    fig.draw_without_rendering()
    legend, plot = ax.get_legend().get_window_extent(), ax.get_window_extent()
    labels = [t.get_window_extent() for t in ax.get_xticklabels()] + [ax.xaxis.label.get_window_extent()]
    assert legend.y1 <= min(b.y0 for b in labels)  # under the tick labels and the axis label
    assert plot.width >= 0.6 * PHONE_WIDTH_IN * fig.dpi  # the plot has the width back
    a, b = (t.get_window_extent() for t in ax.get_xticklabels())
    assert a.x1 <= b.x0  # the two tick labels do not overlap
    assert _size(png)[0] <= PHONE_WIDTH_IN * 110 * 1.02
    plt.close(fig)


def test_long_category_names_are_wrapped_or_tilted_until_none_touches():
    import matplotlib.pyplot as plt

    from lessonlib.book.figures import _overlapping, for_phone, untangle_tick_labels

    def bars(width):
        fig, ax = plt.subplots(figsize=(width, 3))
        ax.bar([f"Adam, bf16_master, {b} × {s}" for b in (1, 16) for s in (64, 256, 1024)], [1, 2, 3, 4, 5, 6])
        return fig, ax

    def touching(fig, ax):
        fig.draw_without_rendering()
        return _overlapping([t for t in ax.get_xticklabels() if t.get_text().strip()])

    fig, ax = bars(9)
    assert touching(fig, ax)  # the case this is for: six long names under a wide figure already touch
    assert untangle_tick_labels(fig) and not touching(fig, ax)
    assert for_phone(fig) and not touching(fig, ax)  # and again once narrowed for a phone
    fig2, ax2 = plt.subplots(figsize=(9, 3))
    ax2.bar(["a", "b", "c"], [1, 2, 3])
    assert not untangle_tick_labels(fig2)  # short names are left as they are
    assert [t.get_text() for t in ax2.get_xticklabels()] == ["a", "b", "c"]
    plt.close("all")
