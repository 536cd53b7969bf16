"""The roofline of the reader's device, measured: peak FLOP/s, memory bandwidth, and where the course's ops sit.

* :func:`measure_roofline` - square matrix-product FLOP/s at growing sizes (the flat roof is
  the fastest square) and the bandwidth of a large copy (bytes read + bytes written per
  second): a :class:`Roofline`.
* :func:`block_ops` - the operations of one transformer block of the course's GPT
  (its matrix products, the per-head attention products, LayerNorm, GELU, softmax)
  at a given size, with their FLOPs and the bytes they move.
* :func:`measure_ops` - time each op and place it: arithmetic intensity (FLOPs per
  byte moved), measured FLOP/s, and the roofline's prediction ``min(peak, bandwidth x
  intensity)`` (:class:`OpPoint`). A product the roofline already timed keeps that
  timing: each op is timed once.

FLOPs of products come from ``FlopCounterMode``; it counts elementwise work as 0, so
LayerNorm, GELU and softmax get the arithmetic of their formulas per value
(:data:`ELEMENTWISE_FLOPS`, a transcendental function counted as one). Bytes moved are
counted from the shapes: every input read once and every output written once - the
least any kernel must move. Times from :func:`lessonlib.measure.rounds.time_rounds`
(CUDA events on a GPU; one thread on a CPU); each case keeps its fastest round, since a
roof is what the device can do and a busy machine only slows it. Small cases run many
times per timing, so that every timing holds about the same work (tens of MFLOPs).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from ..checks import count, counts, positive, sequence
from .device import as_device
from .rounds import time_rounds

#: Arithmetic per value of the elementwise ops, from their formulas (a transcendental counted as one):
#: LayerNorm: mean (1), centre (1), square and sum (2), scale by 1/std (1), x gamma + beta (2);
#: GELU (exact): x / sqrt 2 (1), erf (1), + 1 (1), x x (1), x 0.5 (1);
#: softmax: max (1), subtract (1), exp (1), sum (1), divide (1).
ELEMENTWISE_FLOPS = {"layer_norm": 7, "gelu": 5, "softmax": 5}

#: Limits: the largest matrix side and copy a call may ask for, and rounds.
MAX_SIZE = 8192
MAX_COPY_MIB = 4096
#: The largest copy on a CPU, MiB: past it a round takes seconds and the bandwidth measured is the same.
MAX_CPU_COPY_MIB = 256
MAX_ROUNDS = 50
#: Slices the bandwidth copy is timed in.
SLICES = 16


@dataclass
class Roofline:
    """A device's two roofs, measured.

    sizes:              matrix sides timed (n x n times n x n)
    matmul_flops_per_s: FLOP/s at each size
    peak_flops_per_s:   the fastest of the squares (the flat roof), measured apart from ``products``
    bandwidth:          bytes per second of a large copy, read + write (the slanted roof)
    copy_bytes:         bytes of the copied tensor
    products:           FLOP/s of the other products timed in the same rounds, {name: FLOP/s}
                        (e.g. a block's own products, placed under the roof, not defining it)
    product_times:      the same products' {name: (FLOPs per call, seconds per call)}, fastest round:
                        :func:`measure_ops` reuses them rather than timing those products again
    """

    sizes: tuple
    matmul_flops_per_s: tuple
    peak_flops_per_s: float
    bandwidth: float
    copy_bytes: int
    products: dict = field(default_factory=dict)
    product_times: dict = field(default_factory=dict)

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the two roofs meet: below it an op is bound by memory."""
        return self.peak_flops_per_s / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """FLOP/s the roofline allows at ``intensity`` FLOPs per byte: min(peak, bandwidth x intensity)."""
        intensity = positive("intensity", intensity)
        return min(self.peak_flops_per_s, self.bandwidth * intensity)



def measure_roofline(device=None, sizes=None, copy_mib: int | None = None, rounds: int = 9,
                     dtype=torch.float32, products=()) -> Roofline:
    """Time ``n x n`` products for each side in ``sizes`` and a copy of ``copy_mib`` MiB; return a :class:`Roofline`.

    ``products``: more :class:`Op` (matrix products, e.g. those of :func:`block_ops`) timed in the
    same rounds, so that they meet the same load; the flat roof is the fastest square alone, so
    that it does not depend on the products placed under it.

    Default sizes: 16 to 512 on a CPU (one thread), 256 to 8192 on a GPU; default copy:
    64 MiB on a CPU, 1 GiB on a GPU (beyond any cache), copied in 16 slices, each timed
    on its own (short timings: a busy CPU's scheduler interrupts long ones). FLOPs of a
    product: 2 n^3 (``FlopCounterMode``'s rule); a copy moves twice its bytes (read and write).
    """
    device = as_device("device", device)
    if sizes is None:
        sizes = (16, 32, 64, 128, 256, 512) if device.type == "cpu" else (256, 512, 1024, 2048, 4096, 8192)
    sizes = tuple(counts("sizes", sizes, maximum=MAX_SIZE))
    if device.type == "cpu" and max(sizes) > 2048:
        raise ValueError(f"sizes: at most 2048 on a CPU (one product of {max(sizes)} takes seconds), got {max(sizes)}")
    copy_mib = count("copy_mib", copy_mib if copy_mib is not None else (64 if device.type == "cpu" else 1024),
                     maximum=MAX_COPY_MIB)
    if device.type == "cpu" and copy_mib > MAX_CPU_COPY_MIB:
        raise ValueError(f"copy_mib: at most {MAX_CPU_COPY_MIB} on a CPU (a larger copy takes seconds a round and "
                         f"measures the same bandwidth), got {copy_mib}")
    rounds = count("rounds", rounds, maximum=MAX_ROUNDS)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r:.60}")
    products = sequence("products", products, allow_empty=True)
    if not all(isinstance(o, Op) for o in products):
        raise TypeError("products must be a list of Op (matrix products from block_ops)")
    mats = {n: (torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype))
            for n in sizes}
    src = torch.randn(copy_mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    # small products run many times per timing, so that each timing is well above the clock's resolution
    work = 2**24 if device.type == "cpu" else 2**34  # FLOPs per timing: about a millisecond on either
    reps = {n: max(1, work // (2 * n**3)) for n in sizes}

    def one_round(clock):
        for n, (a, b) in mats.items():
            with clock(n):
                for _ in range(reps[n]):
                    torch.mm(a, b)
        for o in products:
            with clock(("product", o.name)):
                for _ in range(o.repeat):
                    o.fn(*o.inputs)
        for i, (d, s) in enumerate(zip(dst.chunk(SLICES), src.chunk(SLICES))):
            clock.time(("copy", i), d.copy_, s)

    raw = time_rounds(one_round, rounds, warmup=1, device=device)
    rates = tuple(2 * n**3 * reps[n] / min(raw.seconds[n]) for n in sizes)
    bandwidth = 2 * src.numel() * src.element_size() / sum(min(raw.seconds[("copy", i)]) for i in range(SLICES))
    extra = {o.name: o.flops * o.repeat / min(raw.seconds[("product", o.name)]) for o in products}
    times = {o.name: (o.flops, min(raw.seconds[("product", o.name)]) / o.repeat) for o in products}
    peak = max(rates)
    return Roofline(sizes, rates, peak, bandwidth, src.numel() * src.element_size(), extra, times)


@dataclass
class Op:
    """One operation to place on the roofline: ``fn(*inputs)``, its FLOPs and the bytes it must move."""

    name: str
    fn: Callable
    inputs: tuple
    flops: int
    bytes_moved: int
    repeat: int = 1


def _product(name, a, b, repeat=1) -> Op:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        out = torch.matmul(a, b)
    moved = (a.numel() + b.numel() + out.numel()) * a.element_size()
    return Op(name, torch.matmul, (a, b), int(fc.get_total_flops()), moved, repeat)


def block_ops(tokens: int = 512, hidden: int = 256, heads: int = 4, seq_len: int = 128, device=None) -> list:
    """The ops of one transformer block of the course's GPT on ``tokens`` tokens (a list of :class:`Op`).

    ``tokens`` = batch x ``seq_len``; ``heads`` divides ``hidden``. Products: QKV
    (tokens x hidden by hidden x 3 hidden), the first MLP matrix (hidden to 4 hidden), the
    attention scores of every head (seq_len x d by d x seq_len, d = hidden / heads) and two
    small products (64 x 64 and 16 x 16); elementwise: LayerNorm, GELU on the MLP's width, softmax on the scores.
    """
    tokens, hidden = count("tokens", tokens, maximum=2**16), count("hidden", hidden, maximum=4096)
    heads, seq_len = count("heads", heads), count("seq_len", seq_len, maximum=4096)
    if hidden % heads or tokens % seq_len:
        raise ValueError(f"heads ({heads}) must divide hidden ({hidden}) and seq_len ({seq_len}) tokens ({tokens})")
    if tokens * 4 * hidden > 2**26:
        raise ValueError(f"tokens x 4 hidden = {tokens * 4 * hidden:,} values: at most 2**26 (256 MiB in fp32)")
    device = as_device("device", device)
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device)
    x, d, b = rnd(tokens, hidden), hidden // heads, tokens // seq_len
    wide = rnd(tokens, 4 * hidden)
    scores = rnd(b, heads, seq_len, seq_len)
    ln_w, ln_b = rnd(hidden), rnd(hidden)
    e = x.element_size()
    return [
        _product("QKV product", x, rnd(hidden, 3 * hidden)),
        _product("MLP product", x, rnd(hidden, 4 * hidden)),
        _product("attention scores", rnd(b * heads, seq_len, d), rnd(b * heads, d, seq_len)),
        _product("64 × 64 product", rnd(64, 64), rnd(64, 64), repeat=64),
        _product("16 × 16 product", rnd(16, 16), rnd(16, 16), repeat=1024),
        Op("LayerNorm", lambda t: F.layer_norm(t, (hidden,), ln_w, ln_b), (x,),
           ELEMENTWISE_FLOPS["layer_norm"] * x.numel(), (2 * x.numel() + 2 * hidden) * e),
        Op("GELU", F.gelu, (wide,), ELEMENTWISE_FLOPS["gelu"] * wide.numel(), 2 * wide.numel() * e),
        Op("softmax", lambda t: t.softmax(-1), (scores,), ELEMENTWISE_FLOPS["softmax"] * scores.numel(),
           2 * scores.numel() * e),
    ]


@dataclass
class OpPoint:
    """An op placed on a :class:`Roofline`.

    flops, bytes_moved: per call; seconds: time of one call (fastest round)
    intensity:  FLOPs per byte moved
    measured:   FLOP/s achieved
    predicted:  the roofline's attainable FLOP/s at this intensity
    """

    name: str
    flops: int
    bytes_moved: int
    seconds: float
    intensity: float
    measured: float
    predicted: float

    @property
    def ratio(self) -> float:
        """Measured over predicted FLOP/s: the share of the roofline the op reaches."""
        return self.measured / self.predicted


def measure_ops(ops, roofline: Roofline, device=None, rounds: int = 9) -> list:
    """Time each :class:`Op` of ``ops`` (interleaved rounds) and place it on ``roofline`` (a list of :class:`OpPoint`).

    An op the roofline already timed (same name and FLOPs in ``roofline.product_times``) is not timed
    again: its point takes the roofline's time, so one op has one time wherever it is shown.
    """
    ops = sequence("ops", ops)
    if not all(isinstance(o, Op) for o in ops):
        raise TypeError("ops must be a nonempty list of Op (from block_ops)")
    if not isinstance(roofline, Roofline):
        raise TypeError(f"roofline must be a Roofline (from measure_roofline), got {type(roofline).__name__}")
    device = as_device("device", device)
    rounds = count("rounds", rounds, maximum=MAX_ROUNDS)

    known = {o.name: roofline.product_times[o.name][1] for o in ops
             if roofline.product_times.get(o.name, (None,))[0] == o.flops}
    fresh = [o for o in ops if o.name not in known]

    def one_round(clock):
        for o in fresh:
            with clock(o.name):
                for _ in range(o.repeat):
                    o.fn(*o.inputs)

    raw = time_rounds(one_round, rounds, warmup=1, device=device).seconds if fresh else {}
    points = []
    for o in ops:
        s = known[o.name] if o.name in known else min(raw[o.name]) / o.repeat
        intensity = o.flops / o.bytes_moved
        points.append(OpPoint(o.name, o.flops, o.bytes_moved, s, intensity, o.flops / s, roofline.attainable(intensity)))
    return points


def last_level_cache_bytes(device=None) -> int | None:
    """The largest cache of ``device`` in bytes: a GPU's L2 (from torch), a CPU's last level (from Linux's
    ``/sys/devices/system/cpu/cpu0/cache``); ``None`` where neither tells."""
    from pathlib import Path

    device = as_device("device", device)
    if device.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)) or None
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            t = f.read_text().strip().upper()
            sizes.append(int(t.rstrip("KMG")) * {"K": 2**10, "M": 2**20, "G": 2**30}.get(t[-1:], 1))
        except (OSError, ValueError):
            continue
    return max(sizes) if sizes else None


#: Bytes of the tensor :func:`measure_streaming` uses where the cache's size is unknown (beyond any cache).
STREAM_DEFAULT_BYTES = 256 * 2**20
#: Its rounds at most: each round moves the tensor eight times (about a quarter of a second on a CPU thread).
MAX_STREAM_ROUNDS = 9


@dataclass
class StreamingRun:
    """LayerNorm, GELU and softmax timed on a tensor larger than the last-level cache.

    tensor_bytes: bytes of the input (each op reads it once and writes as many); cache_bytes: the
                  last-level cache (None: unknown, :data:`STREAM_DEFAULT_BYTES` used)
    bandwidth:    bytes per second of a copy of the same tensor (read + write), timed in the same rounds
    rates:        {op: bytes per second moved, read + write}; flops_per_s: {op: FLOP/s}
    """

    tensor_bytes: int
    cache_bytes: int | None
    bandwidth: float
    rates: dict
    flops_per_s: dict

    def share(self, name: str) -> float:
        """The op's bytes per second over the copy's: how close it comes to the bandwidth roof."""
        from ..checks import choice

        return self.rates[choice("name", name, tuple(self.rates))] / self.bandwidth


def measure_streaming(device=None, hidden: int = 1024, rounds: int = 3) -> StreamingRun:
    """Time LayerNorm, GELU and softmax (rows of ``hidden`` values) and a copy on a tensor of twice the
    last-level cache (:func:`last_level_cache_bytes`; :data:`STREAM_DEFAULT_BYTES` where unknown), in
    interleaved rounds, each keeping its fastest; a :class:`StreamingRun`.

    Each op writes into an output allocated once: a fresh output every call would add its allocation (on a
    CPU, the page faults of a large new tensor), which is not the memory traffic the roofline counts.
    Takes about a second on one CPU thread (a 32 MiB cache: 64 MiB tensors)."""
    device = as_device("device", device)
    hidden = count("hidden", hidden, maximum=2**16)
    rounds = count("rounds", rounds, maximum=MAX_STREAM_ROUNDS)
    cache = last_level_cache_bytes(device)
    size = 2 * cache if cache else STREAM_DEFAULT_BYTES
    if size > MAX_COPY_MIB * 2**20:
        raise ValueError(f"the last-level cache ({cache:,} bytes) asks for more than {MAX_COPY_MIB} MiB")
    rows = max(1, size // (4 * hidden))
    x = torch.randn(rows, hidden, device=device)
    y, stats = torch.empty_like(x), (torch.empty(rows, 1, device=device), torch.empty(rows, 1, device=device))
    w, b = torch.ones(hidden, device=device), torch.zeros(hidden, device=device)
    aten = torch.ops.aten
    # LayerNorm allocates a temporary as large as its input, even in its out= form: on a CPU a large fresh
    # tensor costs a page fault every 4 KiB, which is not memory traffic. There it runs on 1 MiB slices of rows,
    # whose temporaries the allocator reuses, each written into its slice of y.
    step = rows if device.type == "cuda" else max(1, 2**20 // (4 * hidden))
    parts = list(zip(x.split(step), y.split(step), stats[0].split(step), stats[1].split(step)))

    def layer_norm():
        for xs, ys, mean, rstd in parts:
            aten.native_layer_norm.out(xs, [hidden], w, b, 1e-5, out0=ys, out1=mean, out2=rstd)

    ops = {"LayerNorm": layer_norm,
           "GELU": lambda: aten.gelu.out(x, out=y),
           "softmax": lambda: aten._softmax.out(x, -1, False, out=y)}
    flops = {"LayerNorm": "layer_norm", "GELU": "gelu", "softmax": "softmax"}

    def one_round(clock):
        clock.time("copy", y.copy_, x)
        for name, fn in ops.items():
            clock.time(name, fn)

    raw = time_rounds(one_round, rounds, warmup=1, device=device).seconds
    moved = 2 * x.numel() * x.element_size()
    rates = {name: moved / min(raw[name]) for name in ops}
    per_s = {name: ELEMENTWISE_FLOPS[flops[name]] * x.numel() / min(raw[name]) for name in ops}
    return StreamingRun(x.numel() * x.element_size(), cache, moved / min(raw["copy"]), rates, per_s)
