"""The roofline figure: a device's two roofs and the course's ops placed on them (log-log)."""
from __future__ import annotations

import matplotlib.pyplot as plt

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
    ax.plot(xs, [roofline.attainable(x) / 1e9 for x in xs], color="black", label="roofline: min(peak, bandwidth × intensity)")
    ax.axvline(roofline.ridge, color="grey", linestyle=":", label=f"ridge: {roofline.ridge:.3g} FLOPs/byte")
    markers = "osD^vP*Xh<>"  # a colour and a shape per op: told apart without colour too
    # Points of similar intensity and speed (the QKV and MLP products; GELU and softmax) overlap: each is also
    # named beside itself, the labels of neighbours placed above and below in turn, so every point can be read.
    order = sorted(range(len(points)), key=lambda i: points[i].intensity)
    for i, p in enumerate(points):
        ax.scatter([p.intensity], [p.measured / 1e9], zorder=3, marker=markers[i % len(markers)], s=40, label=p.name,
                   alpha=0.85)
        up = order.index(i) % 2 == 0
        ax.annotate(p.name, (p.intensity, p.measured / 1e9), xytext=(6, 7 if up else -11), textcoords="offset points",
                    fontsize=8, va="bottom" if up else "top")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel("throughput (GFLOP/s)")
    ax.set_title(title)
    ax.set_ylim(top=ax.get_ylim()[1] * 6)  # room for the legend above the roof
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    return fig


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
    ax.plot(xs, [min(1.0, dev.memory_bandwidth * x / dev.peak_flops_per_s) for x in xs], color="#C44E52",
            linestyle="--", label=f"{dev.name}, datasheet, dense bf16 (ridge {ridge:,.0f})")
    markers = "osD^vP*Xh<>"
    for i, p in enumerate(points):
        ax.scatter([bf16_intensity(p)], [min(1.0, dev.memory_bandwidth * bf16_intensity(p) / dev.peak_flops_per_s)], zorder=3,
                   marker=markers[i % len(markers)], s=40, alpha=0.85)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity in bf16 (FLOPs per byte moved)")
    ax.set_ylabel("attainable share of the device's peak")
    ax.set_title(f"The same ops in bf16 under the {dev.name}'s roof")
    ax.legend(loc="lower right", fontsize=8)
