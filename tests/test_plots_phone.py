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
