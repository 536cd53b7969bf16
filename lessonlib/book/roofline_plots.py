"""The roofline figure: a device's two roofs and the course's ops placed on them (log-log)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.artist import Artist
from matplotlib.transforms import Bbox

from ..checks import reads, text
from ..measure.roofline import Roofline


@reads("roofline", "points")
def plot_roofline(roofline: Roofline, points, title: str = "Roofline of this device, with the course's ops",
                  compare=None):
    """Log-log: attainable GFLOP/s against arithmetic intensity (FLOPs per byte), the measured
    ops as points (named in the legend), and the ridge where the two roofs meet. Returns the figure.

    ``compare``: a device of :mod:`lessonlib.calc.hardware` (a ``Device`` with a bandwidth). A second
    panel then draws that device's roof as a share of its peak, and the ops at the share of that peak
    that their intensity allows there (min(1, bandwidth x intensity / peak)). Its peak is for bf16, so
    there each op sits at its bf16 intensity (:func:`bf16_intensity`: twice its fp32 one); this device's
    roof, measured in fp32, is left to the first panel rather than drawn beside bf16 intensities."""
    from ..calc.hardware import Device

    if not isinstance(roofline, Roofline):
        raise TypeError(f"roofline must be a Roofline, got {type(roofline).__name__}")
    points = list(points)
    if not points:
        raise ValueError("points must name at least one measured op")
    text("title", title)
    if compare is not None and (not isinstance(compare, Device) or not compare.memory_bandwidth > 0):
        raise TypeError("compare must be a hardware Device with a memory bandwidth (lessonlib.calc.hardware.device())")
    lo = min(min(p.intensity for p in points), roofline.ridge) / 3
    hi = max(max(p.intensity for p in points), roofline.ridge) * 3
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    if compare is None:
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
    else:
        fig, (ax, other) = plt.subplots(1, 2, figsize=(13, 4.8))
        _normalised(other, roofline, points, compare)
    # the flat roof named from the measured sweep: the side of the fastest square product (with no name of its own,
    # the name of a point just under it, the 64 x 64 product's, was read as the roof's)
    side = max(zip(roofline.matmul_flops_per_s, roofline.sizes))[1]
    ax.plot(xs, [roofline.attainable(x) / 1e9 for x in xs], color="black",
            label=f"roofline: min(peak, bandwidth × intensity);\nflat: the fastest square product, {side} × {side}")
    ax.axvline(roofline.ridge, color="grey", linestyle=":", label=f"ridge: {roofline.ridge:.3g} FLOPs/byte")
    markers = "osD^vP*Xh<>"  # a colour and a shape per op: told apart without colour too
    # Points of similar intensity and speed (the QKV and MLP products; GELU and LayerNorm) overlap: each is also
    # named beside itself, and the labels are placed when the figure is drawn (_PointLabels), in the figure's
    # final size, where no label covers another label, a point or the legend.
    names = []
    for i, p in enumerate(points):
        ax.scatter([p.intensity], [p.measured / 1e9], zorder=3, marker=markers[i % len(markers)], s=40, label=p.name,
                   alpha=0.85)
        names.append(ax.annotate(p.name, (p.intensity, p.measured / 1e9), xytext=(6, 7), textcoords="offset points",
                                 fontsize=8, va="bottom",  # a line that a name must cross passes behind it
                                 bbox=dict(boxstyle="square,pad=0.05", facecolor="white", edgecolor="none", alpha=0.8)))
    ax.add_artist(_PointLabels(ax, names))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel("throughput (GFLOP/s)")
    ax.set_title(title)
    # room for the legend above the roof, and below the lowest point (the 16 x 16 product's marker was cut in half)
    low = min(min(p.measured for p in points) / 1e9, roofline.attainable(lo) / 1e9)
    ax.set_ylim(min(ax.get_ylim()[0], low / 1.15), ax.get_ylim()[1] * 6)
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    return fig


# Where a point's name may go, in points from the point, tried in turn: level with it on its right, then on its
# left (a name read at the height of its point is read as that point's); then right of it above and below, centred
# above or below it, left of it above and below, then these further away. Centred comes before left: a long name
# hung above and to the left of its point reaches far from it, and reads as naming whatever it ends beside.
# Centred just above it comes next: "64 × 64 product" (the attention scores' marker below its right side, the QKV
# and MLP products' at its tail) hung centred 7 points up, on the roof, and read as far from its marker.
_PLACES = [(6, 0), (-6, 0), (0, 6)] + [(dx, dy) for step in range(6) for dx in (6, 0, -6)
                                       for dy in (7 + 11 * step, -7 - 11 * step)]


class _PointLabels(Artist):
    """Draws nothing: just before the points' names are drawn (a lower zorder), it moves each to the first place
    of :data:`_PLACES` where its box covers no name placed before it, no point and not the legend (which it must),
    then, as far as it can, stays inside the axes, lies nearer its own point than any other (so that it is read as
    that point's name), right beside it, and off the drawn lines. It runs at every draw, so the names stay apart
    at any figure size (the phone version too). ``names[i]`` names the point of ``ax.collections[i]``."""

    def __init__(self, ax, names):
        super().__init__()
        self.set_zorder(min(t.get_zorder() for t in names) - 0.01)
        self.set_in_layout(False)
        self._ax, self._names = ax, names

    def draw(self, renderer):
        ax = self._ax
        px = renderer.points_to_pixels(1.0)
        taken, centres = [], []
        for coll in ax.collections:  # the points, as squares a little wider than their markers
            r = (coll.get_sizes()[0] ** 0.5 / 2 + 1) * px
            for x, y in coll.get_offset_transform().transform(coll.get_offsets()):
                taken.append(Bbox.from_extents(x - r, y - r, x + r, y + r))
                centres.append((x, y))
        if ax.get_legend() is not None:
            taken.append(ax.get_legend().get_window_extent(renderer))
        def sampled(line):  # a drawn line, as points a pixel or two apart
            xy = line.get_transform().transform(line.get_xydata())
            parts = [np.linspace((x0, y0), (x1, y1), max(2, int(np.hypot(x1 - x0, y1 - y0) / 2)))
                     for (x0, y0), (x1, y1) in zip(xy[:-1], xy[1:])]
            return np.concatenate(parts) if parts else np.empty((0, 2))
        # The roof (the first line) counts more than the dotted ridge: a name laid along the flat roof reads as
        # one of the points beside it (the 64 x 64 product's name ran into the QKV and MLP products), while a name
        # that touches the ridge's faint dots is read as its own point's.
        drawn = ax.get_lines()
        roof_line = sampled(drawn[0]) if drawn else np.empty((0, 2))
        ridge_lines = np.concatenate([sampled(x) for x in drawn[1:]]) if len(drawn) > 1 else np.empty((0, 2))
        ridge_x = ridge_lines[0, 0] if len(ridge_lines) else None  # the ridge is a vertical line
        inside = ax.get_window_extent(renderer)

        def place(name, dx, dy):
            name.xyann = (dx, dy)
            name.set_ha("left" if dx > 0 else "right" if dx < 0 else "center")
            name.set_va("bottom" if dy > 0 else "top" if dy < 0 else "center_baseline")
            return name.get_window_extent(renderer)

        def gap(box, x, y):  # from a point to the nearest edge of a box, in pixels
            return np.hypot(max(box.x0 - x, 0, x - box.x1), max(box.y0 - y, 0, y - box.y1))

        def anchor(box, dx, dy):  # where the name starts, seen from its point: the corner or edge it hangs from
            x = box.x0 if dx > 0 else box.x1 if dx < 0 else (box.x0 + box.x1) / 2
            return x, box.y0 if dy > 0 else box.y1 if dy < 0 else (box.y0 + box.y1) / 2

        # points that sit on (nearly) one spot, like the QKV and MLP products: no place of a name tells them apart
        # (the legend's shapes do), so each is not counted as the other's rival below
        together = 1.5 * max((c.get_sizes()[0] ** 0.5 for c in ax.collections), default=0.0) * px

        for i, name in enumerate(self._names):
            def cost(place_):
                box = place(name, *place_)
                covers = any(box.overlaps(t) for t in taken)
                outside = not (inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0
                               and box.y1 <= inside.y1)
                # A reader pairs a name with the point at the end it starts from (its anchor), not with whatever
                # lies under the rest of a long name: measuring to the nearest edge of the whole box put a long name
                # on the far side of its point, across the roof, to keep it off a point beside its tail. A name
                # whose tail touches another point is misread all the same.
                # And a name lying closer to another point than to its own (GELU's name above LayerNorm's point,
                # LayerNorm's below GELU's) is read as that point's: the whole box must be clearly nearer its own.
                ax_, ay_ = anchor(box, *place_)
                paired = len(centres) == len(self._names)
                own = np.hypot(ax_ - centres[i][0], ay_ - centres[i][1]) if paired else 0.0
                own_gap = gap(box, *centres[i]) if paired else 0.0
                rivals = [c for j, c in enumerate(centres)
                          if j != i and not (paired and np.hypot(c[0] - centres[i][0], c[1] - centres[i][1]) < together)]
                misread = any(np.hypot(ax_ - c[0], ay_ - c[1]) <= own or gap(box, *c) < max(4 * px, own_gap + 4 * px)
                              for c in rivals)
                far = abs(place_[1]) > 7  # not right beside the point: the name is harder to pair with it
                def crosses(pts):
                    return bool(np.any((pts[:, 0] > box.x0) & (pts[:, 0] < box.x1) & (pts[:, 1] > box.y0)
                                       & (pts[:, 1] < box.y1)))
                # A name that reaches across the ridge, to the other side from its point (the 64 x 64 product's
                # name, hung left of its point, ended left of the ridge), reads as far from its point: it ranks
                # before the rest; merely touching the ridge's faint dots comes last.
                across = paired and ridge_x is not None and (box.x0 < ridge_x < centres[i][0]
                                                             or centres[i][0] < ridge_x < box.x1)
                # level with its point beats above or below it, but not at the price of lying across the roof
                return (covers, outside, misread, across, far, crosses(roof_line), place_[1] != 0,
                        crosses(ridge_lines))
            best = None  # the first of the places with the fewest faults, the worst counted first
            for place_ in _PLACES:
                faults = cost(place_)
                if best is None or faults < best[0]:
                    best = (faults, place_)
                if not any(faults):
                    break
            taken.append(place(name, *best[1]))


def bf16_intensity(point) -> float:
    """An op's arithmetic intensity in bf16, in FLOPs per byte: twice the measured one of ``point`` (an ``OpPoint``).

    The course's ops (:func:`lessonlib.measure.roofline.block_ops`) run in fp32, 4 bytes a value; the same op in
    bf16 moves half the bytes for the same FLOPs.
    """
    from ..checks import positive

    return 2 * positive("point.intensity", getattr(point, "intensity", None))


def _normalised(ax, roofline: Roofline, points, dev) -> None:
    """``dev``'s (bf16) roof as a share of its peak; the ops, at their bf16 intensity, at the share of that
    peak their intensity allows. The measured (fp32) roof stays in the first panel."""
    ridge = dev.peak_flops_per_s / dev.memory_bandwidth
    lo = min(bf16_intensity(p) for p in points) / 3
    hi = max(max(bf16_intensity(p) for p in points), ridge) * 3
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    roof, = ax.plot(xs, [min(1.0, dev.memory_bandwidth * x / dev.peak_flops_per_s) for x in xs], color="#C44E52",
                    linestyle="--", label=f"{dev.name}, datasheet,\ndense bf16 (ridge {ridge:,.0f})")
    markers = "osD^vP*Xh<>"
    # Here a point's height follows from its intensity alone, so ops of about one intensity (GELU and softmax; the
    # QKV and MLP products) land on one spot: one name joins theirs ("GELU, softmax"), placed as in the first panel.
    spots = []  # [xy, names]
    for i, p in enumerate(points):
        xy = (bf16_intensity(p), min(1.0, dev.memory_bandwidth * bf16_intensity(p) / dev.peak_flops_per_s))
        ax.scatter([xy[0]], [xy[1]], zorder=3, marker=markers[i % len(markers)], s=40, alpha=0.85, label=p.name)
        near = next((s for s in spots if abs(np.log10(s[0][0] / xy[0])) < 0.05), None)
        if near is None:
            spots.append([xy, [p.name]])
        else:
            near[1].append(p.name)
    names = [ax.annotate(", ".join(n), xy, xytext=(6, 7), textcoords="offset points", fontsize=8, va="bottom")
             for xy, n in spots]
    ax.add_artist(_PointLabels(ax, names))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity in bf16 (FLOPs per byte moved)")
    ax.set_ylabel("attainable share of the device's peak")
    ax.set_title(f"The same ops in bf16 under the {dev.name}'s roof:\nattainable, not measured")  # on the roof by construction
    ax.legend(handles=[roof], loc="upper left", fontsize=8)  # the roof only: the points are named beside them
