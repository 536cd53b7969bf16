"""Bytes into time: the latency-bandwidth (alpha-beta) model of a collective.

Sending a message of ``n`` bytes over one link takes about

    alpha + n / beta  seconds,

``alpha`` the fixed cost of a message (software, synchronisation, the wire's
latency; seconds) and ``beta`` the bandwidth (bytes per second). A ring
collective over ``N`` devices is a sequence of such steps, each device sending
a chunk of ``n / N`` bytes per step to its neighbour:

* all-reduce: ``2 (N - 1)`` steps (a reduce-scatter, then an all-gather);
* all-gather and reduce-scatter: ``N - 1`` steps;

so a collective over a tensor of ``n`` bytes takes
``steps × (alpha + n / (N × beta))``. NCCL's own cost model has this shape
(a fixed latency per ring step plus bytes over a bus bandwidth; see ``LINKS``).

* :func:`collective_seconds` - the model's time for one collective.
* :func:`fit_alpha_beta` - alpha and beta from measured ``(bytes, seconds)``
  samples of one collective (weighted least squares on relative error).
* :data:`LINKS` - alpha and beta of real GPU-cluster links, with their
  sources, kept here and nowhere else.

Pure Python: no torch needed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..checks import (amount as check_amount, choice as check_choice, count as check_count, instance as check_instance,
                      positive as check_positive, result as check_result, sequence as check_sequence,
                      text as check_text)

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class Link:
    """One link's alpha (seconds per message step) and beta (bytes per second, one direction).

    ``source`` says where the figures come from.
    """

    name: str
    alpha_s: float
    beta_bytes_per_s: float
    source: str = ""

    @property
    def alpha_us(self) -> float:
        """alpha in microseconds."""
        return 1e6 * self.alpha_s

    @property
    def beta_GBps(self) -> float:
        """beta in GB/s (10^9 bytes per second)."""
        return self.beta_bytes_per_s / 1e9

    def seconds(self, collective: str, n_bytes, world_size) -> float:
        """:func:`collective_seconds` on this link."""
        return collective_seconds(collective, n_bytes, world_size, self.alpha_s, self.beta_bytes_per_s)


#: The NCCL release whose tuning table the latencies of :data:`LINKS` are read from. NCCL retunes
#: these constants between releases: the network's ring/Simple latency is 9.6 us in this one and
#: 14.0 us in 2.28.3 (its ``ncclTunerConstantsDefaults.hwLatencies``); NVLink's stays 3.4 us.
NCCL_TUNING_VERSION = "2.7.5-1"
#: Where in that release the table is: file, array, and the commit of the tag.
NCCL_TUNING_TABLE = (f"NCCL {NCCL_TUNING_VERSION} (tag v{NCCL_TUNING_VERSION}, commit 01afd20a), "
                     "src/graph/tuning.cc, array hwLat, row Ring/Simple, https://github.com/NVIDIA/nccl")

#: GPU-cluster links (per GPU, one direction). Bandwidths from NVIDIA's
#: datasheets; per-step latencies from NCCL's cost model (ring algorithm,
#: "Simple" protocol, the one used for large messages) in :data:`NCCL_TUNING_VERSION`.
LINKS = {
    "nvlink": Link(
        "NVLink 4 between H100 GPUs in one node",
        alpha_s=3.4e-6,
        beta_bytes_per_s=450e9,
        source=("bandwidth: 900 GB/s of NVLink per H100 SXM GPU, both directions together "
                "(NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/), "
                "so 450 GB/s each way; latency: 3.4 us per ring step over NVLink in NCCL's tuning model "
                f"({NCCL_TUNING_TABLE})"),
    ),
    "infiniband": Link(
        "InfiniBand NDR between nodes, one 400 Gb/s port per GPU",
        alpha_s=9.6e-6,
        beta_bytes_per_s=50e9,
        source=("bandwidth: one single-port 400 Gb/s ConnectX-7 adapter per GPU in a DGX H100 "
                "(NVIDIA DGX H100 User Guide, https://docs.nvidia.com/dgx/dgxh100-user-guide/), "
                "400 Gb/s = 50 GB/s each way; latency: 9.6 us per ring step over the network in NCCL's "
                f"tuning model ({NCCL_TUNING_TABLE}; later releases retune it, e.g. 14.0 us in 2.28.3)"),
    ),
}


def ring_steps(collective: str, world_size) -> int:
    """Message steps of a ring ``collective`` over ``world_size`` devices: 2(N-1) for all-reduce, N-1 otherwise."""
    check_choice("collective", collective, COLLECTIVES)
    n = check_count("world_size", world_size)
    return 2 * (n - 1) if collective == "all_reduce" else n - 1


def collective_seconds(collective: str, n_bytes, world_size, alpha_s, beta_bytes_per_s) -> float:
    """Seconds for a ring ``collective`` over a tensor of ``n_bytes`` bytes on ``world_size`` devices.

    ``steps × (alpha_s + n_bytes / (world_size × beta_bytes_per_s))`` with
    :func:`ring_steps`. ``n_bytes`` is the full tensor: the all-reduced
    tensor, the all-gathered output, the reduce-scattered input. One device
    needs no communication: 0 seconds.

    >>> collective_seconds("all_reduce", 1e9, 8, 0.0, 100e9)  # 2 x 7/8 x 1 GB at 100 GB/s
    0.0175
    """
    steps = ring_steps(collective, world_size)
    n_bytes = check_amount("n_bytes", n_bytes)
    alpha = check_amount("alpha_s", alpha_s)
    beta = check_positive("beta_bytes_per_s", beta_bytes_per_s)
    return check_result(steps * (alpha + n_bytes / (world_size * beta)),
                        "n_bytes, devices, alpha_s and beta_bytes_per_s", "a time in seconds")


def fit_alpha_beta(n_bytes, seconds, collective: str = "all_reduce", world_size=2, name: str = "fitted") -> Link:
    """Fit alpha (s) and beta (bytes/s) to measured times of one collective.

    ``n_bytes`` and ``seconds`` are equal-length sequences: the full tensor
    size of each sample and its measured time. The model is
    :func:`collective_seconds`, linear in ``alpha`` and ``1/beta``; the fit
    minimises the squared *relative* error, so that a 4 KiB message taking
    50 us weighs as much as a 16 MiB one taking 10 ms.

    Raises ``ValueError`` naming the argument for mismatched or too few samples
    (at least two different sizes), non-positive times, and when the samples
    give a negative alpha or beta (they do not follow a latency-bandwidth line).
    """
    xs = [check_amount("n_bytes", x) for x in check_sequence("n_bytes", n_bytes)]
    ts = [check_positive("seconds", t) for t in check_sequence("seconds", seconds)]
    name = check_text("name", name)
    if len(xs) != len(ts):
        raise ValueError(f"n_bytes and seconds must have the same length, got {len(xs)} and {len(ts)}")
    if len(set(xs)) < 2:
        raise ValueError("n_bytes needs at least two different message sizes to separate alpha from beta")
    steps = ring_steps(collective, world_size)
    d = check_count("world_size", world_size)
    # t = steps*alpha + (steps*n/d) * (1/beta): regress t on u = steps*n/d with weights 1/t^2.
    us = [steps * x / d for x in xs]
    try:
        w = [1.0 / t ** 2 for t in ts]
        sw = sum(w)
        su = sum(wi * u for wi, u in zip(w, us))
        st = sum(wi * t for wi, t in zip(w, ts))
        suu = sum(wi * u * u for wi, u in zip(w, us))
        sut = sum(wi * u * t for wi, u, t in zip(w, us, ts))
        det = sw * suu - su * su
        if det <= 0:
            raise ValueError("n_bytes needs at least two different message sizes to separate alpha from beta")
        slope = (sw * sut - su * st) / det          # seconds per byte sent = 1/beta
        intercept = (st - slope * su) / sw          # seconds = steps * alpha
    except (OverflowError, ZeroDivisionError):  # squares beyond a float's range
        slope = intercept = math.nan
    if not (math.isfinite(slope) and math.isfinite(intercept)):
        raise ValueError("n_bytes and seconds are too far apart in size to fit in floating point; "
                         "give bytes and seconds of real messages")
    if slope <= 0 or intercept < 0:
        raise ValueError(f"the samples do not follow a latency-bandwidth line (intercept {intercept:.3g} s, "
                         f"slope {slope:.3g} s/byte); measure more rounds or a wider range of n_bytes")
    return Link(name, alpha_s=intercept / steps, beta_bytes_per_s=1.0 / slope,
                source=f"fitted to {len(xs)} measured {collective} times on {d} devices")


def relative_errors(link: Link, collective: str, n_bytes, seconds, world_size) -> list:
    """(predicted - measured) / measured for each sample, dimensionless."""
    check_instance("link", link, Link, "a Link (alpha_s, beta_bytes_per_s)")
    xs = [check_amount("n_bytes", x) for x in check_sequence("n_bytes", n_bytes)]
    ts = [check_positive("seconds", t) for t in check_sequence("seconds", seconds)]
    if len(xs) != len(ts):
        raise ValueError(f"n_bytes and seconds must have the same length, got {len(xs)} and {len(ts)}")
    return [(link.seconds(collective, x, world_size) - t) / t for x, t in zip(xs, ts)]
