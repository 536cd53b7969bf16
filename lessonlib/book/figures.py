"""Rendering a figure for the three places a page is read: a PNG with its alt text, and a phone version
(panels in one column, no text under 8 pt, no wider than a phone) where the figure is wider than a phone.
Every figure of the course goes through :func:`show`."""
from __future__ import annotations

import base64
import html
import io
import math
import re
import textwrap

import matplotlib.pyplot as plt
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.text import Text
from matplotlib.transforms import offset_copy

from ..checks import instance, positive, text


#: Screens at most this wide (CSS px) get a figure's phone version.
PHONE_MAX_WIDTH = 700
#: Resolution of every figure's PNG (pixels per inch).
DPI = 110
#: A phone version's width (inches): 506 px at :data:`DPI`, shown about 350 CSS px wide on a
#: 390-px phone, so a point of text is about 1.05 CSS px there.
PHONE_WIDTH_IN = 4.6
#: No text of a phone version is smaller than this (points): 8.4 CSS px on a 390-px phone.
PHONE_MIN_FONT_PT = 8


class Figure:
    """A rendered figure with alt text; displays as PNG (Jupyter) and <img alt> (book).

    ``phone_png``, when given, is the same figure drawn for a phone (panels
    stacked in one column, :data:`PHONE_WIDTH_IN` wide, no text under
    :data:`PHONE_MIN_FONT_PT`); the HTML rendering picks it on narrow screens
    (``<picture>``). ``font_px`` and ``phone_font_px`` are the smallest text of
    each PNG, in its pixels: the browser test turns them into CSS px as shown.
    """

    def __init__(self, png: bytes, alt: str, phone_png: bytes | None = None, font_px: float | None = None,
                 phone_font_px: float | None = None):
        self.png = instance("png", png, bytes, "PNG bytes")
        self.alt = text("alt", alt)
        self.phone_png = instance("phone_png", phone_png, (bytes, type(None)), "PNG bytes or None")
        self.font_px = None if font_px is None else positive("font_px", font_px)
        self.phone_font_px = None if phone_font_px is None else positive("phone_font_px", phone_font_px)

    def _repr_mimebundle_(self, include=None, exclude=None):
        b64 = base64.b64encode(self.png).decode()
        fonts = "".join(f' data-{name}="{v:.1f}"' for name, v in
                        (("font-px", self.font_px), ("phone-font-px", self.phone_font_px)) if v is not None)
        img = (f'<img src="data:image/png;base64,{b64}" alt="{html.escape(self.alt, quote=True)}"{fonts} '
               f'style="max-width:100%;height:auto">')
        if self.phone_png:
            phone = base64.b64encode(self.phone_png).decode()
            img = (f'<picture><source media="(max-width: {PHONE_MAX_WIDTH}px)" '
                   f'srcset="data:image/png;base64,{phone}">{img}</picture>')
        return {"image/png": b64, "text/html": img, "text/plain": f"[figure] {self.alt}"}


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def _png_width(png: bytes) -> int:
    """The width in pixels of a PNG (its IHDR chunk)."""
    return int.from_bytes(png[16:20], "big")


def _tight_width_px(fig) -> float:
    """The width in pixels of ``fig``'s tight-cropped PNG (:func:`_png`), found without rendering one:
    laying the figure out is about half the cost of a PNG, and narrowing a figure takes a few tries."""
    fig.draw_without_rendering()
    return (fig.get_tightbbox().width + 2 * plt.rcParams["savefig.pad_inches"]) * DPI


def _relayout(fig) -> None:
    """Lay ``fig`` out again after a change: tight_layout, unless it was drawn with constrained layout (a legend
    outside its axes), which lays itself out again when drawn; tight_layout would replace that engine, and warn."""
    if not isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine):
        fig.tight_layout()


def _phone_png(fig) -> bytes:
    """The phone version's PNG. Text outside the axes (a legend, labels) can make the tight-cropped image
    wider than :data:`PHONE_WIDTH_IN`, and a phone then shrinks all of it, text too: narrow the figure
    until the image fits, keeping its font sizes."""
    target = PHONE_WIDTH_IN * DPI
    # Two kinds of legend go under their plot, in one column, where they hide no data: one of several columns
    # that makes the image too wide (the usual culprit), and one beside the lowest plot, which takes width the
    # plot needs on a phone (its tick labels end up overlapping).
    too_wide = _tight_width_px(fig) > target * 1.01
    moving = []
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        lowest = all(other.get_position().y0 >= ax.get_position().y0 - 1e-9 for other in fig.axes)
        beside = lowest and legend.get_window_extent().x0 >= ax.get_window_extent().x1 - 1  # right of the axes
        if (too_wide and getattr(legend, "_ncols", 1) > 1) or beside:  # matplotlib keeps the column count private
            moving.append((ax, *ax.get_legend_handles_labels(), legend.get_texts()[0].get_fontsize()))
            legend.remove()
    if moving:
        _relayout(fig)  # the axes take back the width the legends held
        fig.draw_without_rendering()
        for ax, handles, labels, size in moving:
            box, labelled = ax.get_window_extent(), ax.get_tightbbox()  # the axes, and with its tick labels
            # a fixed distance under the tick labels and the axis label (points, so it holds as the axes resize)
            under = offset_copy(ax.transAxes, fig=fig, y=-((box.y0 - labelled.y0) * 72 / fig.dpi + 4), units="points")
            ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=under,
                      ncol=1, fontsize=size)
        _relayout(fig)  # room for each legend under its plot, before the next panel
    for _ in range(4):
        width_px = _tight_width_px(fig)
        if width_px <= target * 1.01:
            break
        width, height = fig.get_size_inches()
        fig.set_size_inches(width * target / width_px, height)
    return _png(fig)


def stack_panels(fig) -> bool:
    """Move a figure's side-by-side panels into one column, in reading order.

    Panels are the axes laid out on a grid (``plt.subplots``); a twin axis
    moves with its panel. The figure keeps each panel's width and grows in
    height. Returns False (and changes nothing) when there is only one column.
    """
    if not hasattr(fig, "axes") or not callable(getattr(fig, "add_gridspec", None)):
        raise TypeError(f"fig must be a matplotlib figure, got {fig!r:.80}")
    specs = {}
    for ax in fig.axes:
        ss = ax.get_subplotspec() if hasattr(ax, "get_subplotspec") else None
        if ss is None:
            continue
        rows, cols = ss.get_geometry()[:2]
        specs.setdefault((ss.rowspan.start, ss.colspan.start, rows, cols), []).append(ax)
    if not specs:
        return False
    _, _, rows, cols = next(iter(specs))
    if cols < 2:
        return False
    order = sorted(specs, key=lambda k: (k[0], k[1]))
    width, height = fig.get_size_inches()
    fig.set_size_inches(max(width / cols * 1.1, 4.5), height / rows * len(order) * 1.05)
    grid = fig.add_gridspec(len(order), 1)
    for i, key in enumerate(order):
        for ax in specs[key]:
            ax.set_subplotspec(grid[i, 0])
    _relayout(fig)
    return True


def _texts(fig) -> list:
    if not callable(getattr(fig, "findobj", None)) or not callable(getattr(fig, "savefig", None)):
        raise TypeError(f"fig must be a matplotlib figure, got {fig!r:.80}")
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def font_px(fig) -> float:
    """The smallest visible text of ``fig``, in pixels of its PNG (at :data:`DPI`)."""
    return min((t.get_fontsize() for t in _texts(fig)), default=10.0) * DPI / 72


def for_phone(fig) -> bool:
    """Redraw ``fig`` for a phone: panels in one column (:func:`stack_panels`), at most
    :data:`PHONE_WIDTH_IN` wide, titles and axis labels wrapped to that width, and no text smaller
    than :data:`PHONE_MIN_FONT_PT`. Returns False (and changes nothing) when the figure is
    already narrow enough and has a single column of panels.
    """
    stacked = stack_panels(fig)
    width, height = fig.get_size_inches()
    if not stacked and width <= PHONE_WIDTH_IN:
        return False
    if width > PHONE_WIDTH_IN:
        fig.set_size_inches(PHONE_WIDTH_IN, height * max(1.0, 0.8 * width / PHONE_WIDTH_IN) ** 0.5)
    for t in _texts(fig):
        if t.get_fontsize() < PHONE_MIN_FONT_PT:
            t.set_fontsize(PHONE_MIN_FONT_PT)
    titles = [ax.title for ax in fig.axes] + [ax.xaxis.label for ax in fig.axes]
    titles += [fig._suptitle] if getattr(fig, "_suptitle", None) is not None else []
    for t in titles:
        # about 0.55 em a character: the characters that fit on one line of the figure's width
        chars = max(20, int(PHONE_WIDTH_IN * 72 / (0.55 * t.get_fontsize())))
        if len(t.get_text()) > chars:
            t.set_text("\n".join(textwrap.wrap(t.get_text().replace("\n", " "), chars)))
    _relayout(fig)
    untangle_tick_labels(fig)
    return True


def _overlapping(texts) -> bool:
    """Whether any two of these tick labels touch. Tilted ones run in parallel: they touch when the
    distance between two neighbours, across the slant, is less than a label's line height."""
    angle = math.radians(texts[0].get_rotation() % 180) if texts else 0.0
    if angle:
        anchors = sorted(t.get_window_extent().x1 for t in texts)  # right-aligned: the box ends at the tick
        lines = max(t.get_text().count("\n") + 1 for t in texts)
        height_px = lines * 1.2 * texts[0].get_fontsize() * texts[0].figure.dpi / 72
        return any((b - a) * math.sin(angle) < height_px for a, b in zip(anchors, anchors[1:]))
    boxes = sorted((t.get_window_extent() for t in texts), key=lambda b: b.x0)
    return any(a.x1 > b.x0 + 1 for a, b in zip(boxes, boxes[1:]))


def untangle_tick_labels(fig) -> bool:
    """Where a panel's x tick labels run into each other (long category names on a narrow figure), wrap
    each to the room between two ticks, and tilt them if that is not enough. Returns whether any changed."""
    if not callable(getattr(fig, "draw_without_rendering", None)) or not hasattr(fig, "axes"):
        raise TypeError(f"fig must be a matplotlib figure, got {fig!r:.80}")
    fig.draw_without_rendering()
    changed = False
    for ax in fig.axes:
        labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text().strip()]
        if len(labels) < 2 or not _overlapping(labels):
            continue
        centres = sorted((b.x0 + b.x1) / 2 for b in (t.get_window_extent() for t in labels))
        room_px = min(b - a for a, b in zip(centres, centres[1:]))
        size_px = labels[0].get_fontsize() * fig.dpi / 72
        chars = max(6, int(room_px / (0.6 * size_px)))  # about 0.6 em a character
        ticks, texts = ax.get_xticks(), [t.get_text().replace("\n", " ") for t in ax.get_xticklabels()]
        wrapped = ["\n".join(textwrap.wrap(t, chars, break_long_words=False)) or t for t in texts]
        ax.set_xticks(ticks, wrapped)
        fig.draw_without_rendering()
        if _overlapping([t for t in ax.get_xticklabels() if t.get_visible() and t.get_text().strip()]):
            ax.set_xticks(ticks, texts, rotation=30, horizontalalignment="right")  # one line each, tilted
        changed = True
    if changed:
        _relayout(fig)
    return changed


def show(fig, alt: str, phone=None):
    """Render ``fig`` to PNG with alt text ``alt`` and close it; the return value displays it.

    A figure wider than a phone also gets a phone version (:func:`for_phone`),
    or ``phone``, a figure the page drew for phones itself (closed too).
    """
    text("alt", alt)
    # an f-string that lost its f leaves "{100 * share:g}" in the text a screen reader speaks
    if (left := re.search(r"\{[^{}\s][^{}]*\}", alt)):
        raise ValueError(f"alt holds an unfilled template, {left.group(0)!r}: a string without its f prefix?")
    for name, f in (("fig", fig), ("phone", phone)):
        if f is not None and not callable(getattr(f, "savefig", None)):
            raise TypeError(f"{name} must be a matplotlib figure, got {f!r:.80}")
    if fig is None:
        raise TypeError("fig must be a matplotlib figure, got None")
    untangle_tick_labels(fig)
    wide, wide_font = _png(fig), font_px(fig)
    if phone is not None:
        small, small_font = _png(phone), font_px(phone)
        plt.close(phone)
    elif for_phone(fig):
        small, small_font = _phone_png(fig), font_px(fig)
    else:
        small = small_font = None
    plt.close(fig)
    return Figure(wide, alt, small, wide_font, small_font)
