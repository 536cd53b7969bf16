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
* :func:`multi_node_seconds` - the same collective over several nodes of a
  rail-optimised cluster (one network port per GPU), as NCCL runs it: several
  rings at once, one through each port, or a hierarchical all-reduce; or, for
  contrast, one flat ring through a single port.
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
#: How :func:`multi_node_seconds` runs a collective across nodes.
MULTI_NODE_ALGORITHMS = ("rings", "hierarchical", "single_port")


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
#: The year that release came out: the constants are that old.
NCCL_TUNING_YEAR = 2020
#: A recent release, and its network latency per ring step (ring algorithm, Simple protocol), in seconds:
#: ``ncclTunerConstantsDefaults.hwLatencies`` in src/graph/tuning.cc of that tag. NVLink's stays 3.4 us.
NCCL_RECENT_VERSION = "2.28.3"
NCCL_RECENT_NETWORK_ALPHA_S = 14.0e-6
#: Where in that release the table is: file, array, and the commit of the tag.
NCCL_TUNING_TABLE = (f"NCCL {NCCL_TUNING_VERSION} (tag v{NCCL_TUNING_VERSION}, commit 01afd20a), "
                     "src/graph/tuning.cc, array hwLat, row Ring/Simple, https://github.com/NVIDIA/nccl")

#: GPUs joined all-to-all by NVLink switches (one NVLink domain): an HGX/DGX H100 node holds 8 (NVIDIA DGX H100
#: User Guide, https://docs.nvidia.com/dgx/dgxh100-user-guide/), a GB200 NVL72 rack 72 (NVIDIA GB200 NVL72
#: product page, https://www.nvidia.com/en-us/data-center/gb200-nvl72/).
NVLINK_DOMAIN_GPUS = {"HGX H100": 8, "GB200 NVL72": 72}

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


def multi_node_seconds(collective: str, n_bytes, world_size, per_node, intra: Link, inter: Link,
                       algorithm: str = "rings") -> float:
    """Seconds for ``collective`` over ``n_bytes`` bytes on ``world_size`` world_size, ``per_node`` of them in each node.

    Rail-optimised GPU nodes (a DGX H100: eight GPUs, eight 400 Gb/s ports, one per GPU) give a group that
    holds ``per_node`` GPUs of a node ``per_node`` network ports of that node. ``intra`` is the link inside
    a node (NVLink), ``inter`` one port between nodes (each :class:`Link`: alpha in seconds a step, beta in
    bytes per second one way). ``K = world_size / per_node`` nodes. ``algorithm``:

    * ``"rings"`` (NCCL's ring algorithm, the one it picks for large messages): ``per_node`` rings run at
      once, each carrying ``1/per_node`` of the bytes and leaving the node through its own port. Every step
      of :func:`ring_steps` moves ``n_bytes / world_size`` per device, limited by the slower of NVLink
      (``beta_intra``) and the node's ports together (``per_node x beta_inter``). Latency as recent NCCL
      releases' cost model splits it (src/graph/tuning.cc, its nInterSteps; the alpha values stay those of
      :data:`NCCL_TUNING_VERSION`): the steps that cross nodes (``2(K - 1)`` for an all-reduce, ``K - 1``
      otherwise) pay
      ``alpha_inter``, the others ``alpha_intra``::

          (steps - inter_steps) alpha_intra + inter_steps alpha_inter
              + steps x n_bytes / (world_size x min(beta_intra, per_node x beta_inter))

    * ``"hierarchical"``: inside each node a reduce-scatter over NVLink (``per_node`` world_size), then
      ``per_node`` all-reduces across the ``K`` nodes in parallel, one per port ("rail"), each of
      ``n_bytes / per_node``, then an all-gather inside the node; all-gather and reduce-scatter do the
      matching half. Each phase is :func:`collective_seconds`; the phases are added (none overlaps).
    * ``"single_port"``: one flat ring over all ``world_size`` whose slowest link is one port:
      :func:`collective_seconds` with ``inter`` alone. What the model gives when each ring step is
      charged a GPU's own port, whatever the node's other ports do: the contrast.

    With ``per_node = 1`` (a group of one GPU a node, as a data-parallel group under 8-way tensor
    parallelism) every algorithm is the flat ring on ``inter``. With ``world_size <= per_node`` the group is
    inside one node: the ring on ``intra``.

    >>> nv, ib = Link("nv", 0.0, 450e9), Link("ib", 0.0, 50e9)
    >>> round(multi_node_seconds("all_reduce", 64e9, 64, 8, nv, ib), 4)        # 2 x 63/64 x 64 GB / 400 GB/s
    0.315
    >>> round(multi_node_seconds("all_reduce", 64e9, 64, 8, nv, ib, "single_port"), 4)  # ... / 50 GB/s
    2.52
    """
    steps = ring_steps(collective, world_size)
    n_bytes = check_amount("n_bytes", n_bytes)
    g = check_count("per_node", per_node)
    check_instance("intra", intra, Link, "a Link (alpha_s, beta_bytes_per_s)")
    check_instance("inter", inter, Link, "a Link (alpha_s, beta_bytes_per_s)")
    check_choice("algorithm", algorithm, MULTI_NODE_ALGORITHMS)
    if world_size % g:
        raise ValueError(f"per_node ({g}) must divide world_size ({world_size}): every node holds as many of the group")
    if world_size <= g:
        return intra.seconds(collective, n_bytes, world_size)
    nodes = world_size // g
    if algorithm == "single_port" or g == 1:
        return inter.seconds(collective, n_bytes, world_size)
    if algorithm == "rings":
        inter_steps = 2 * (nodes - 1) if collective == "all_reduce" else nodes - 1
        beta = min(intra.beta_bytes_per_s, g * inter.beta_bytes_per_s)
        seconds = ((steps - inter_steps) * intra.alpha_s + inter_steps * inter.alpha_s
                   + steps * n_bytes / (world_size * beta))
    else:
        seconds = inter.seconds(collective, n_bytes / g, nodes)  # the rails, in parallel
        inside = {"all_reduce": ("reduce_scatter", "all_gather"), "all_gather": ("all_gather",),
                  "reduce_scatter": ("reduce_scatter",)}[collective]
        seconds += sum(intra.seconds(kind, n_bytes, g) for kind in inside)
    return check_result(seconds, "n_bytes, world_size, per_node and the links", "a time in seconds")


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
