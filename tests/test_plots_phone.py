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


def test_single_panel_has_one_image():
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([0, 1], [0, 1])
    shown = plots.show(fig, alt="one panel")
    assert shown.phone_png is None and "<picture>" not in shown._repr_mimebundle_()["text/html"]
