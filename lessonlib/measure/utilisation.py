"""The reader's own model-FLOPs utilisation (MFU): achieved FLOP/s over a peak FLOP/s, both measured here.

* :func:`measure_matmul_flops` - the peak: FLOP/s of a large square matrix
  multiply, the operation a device is fastest at (FLOPs counted by
  ``FlopCounterMode``: 2 n^3 for an n x n product).
* the achieved rate is a training step's counted FLOPs
  (:func:`lessonlib.measure.timing.count_flops`) over its median time
  (:func:`lessonlib.measure.timing.time_training_step`).

Their ratio is the MFU the published runs report (Meta: 38-43 % for Llama 3 405B).
"""
from __future__ import annotations

import statistics
from contextlib import nullcontext

import torch
from torch.utils.flop_counter import FlopCounterMode

from .device import MAX_THREADS, Timer, as_device, synchronize, threads
from ..checks import count as check_count


#: The largest matrix side :func:`measure_matmul_flops` multiplies (4096² fp32: 64 MiB a matrix).
MAX_SIZE = 4096
#: On the CPU, the most FLOPs one :func:`measure_matmul_flops` call may ask for, all products
#: counted: about a second of one core (94 GFLOP/s here). A GPU does the largest sizes in milliseconds.
MAX_CPU_FLOPS = 1e11


def measure_matmul_flops(size: int = 1024, dtype=torch.float32, device=None, repeats: int = 10,
                         warmup: int = 2, num_threads: int | None = 1) -> float:
    """Median FLOP/s of ``size`` x ``size`` matrix products (``dtype``, on ``device``; CPU by default).

    On the CPU a call asks for at most ``MAX_CPU_FLOPS`` in all (a 1024 side with the default
    repeats: 2.8e10; a 2048 side: up to five products), so it answers in about a second.

    ``num_threads`` sets torch's CPU threads for the measurement (1 by default, as
    :func:`lessonlib.measure.timing.time_training_step` uses; None keeps the current setting).
    """
    n = check_count("size", size, maximum=MAX_SIZE)
    repeats = check_count("repeats", repeats, maximum=50)
    warmup = check_count("warmup", warmup, minimum=0, maximum=50)
    if num_threads is not None:
        num_threads = check_count("num_threads", num_threads, maximum=MAX_THREADS)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype such as torch.float32, got {dtype!r:.60}")
    device = as_device("device", device) if device is not None else torch.device("cpu")
    work = (1 + warmup + repeats) * 2 * n ** 3  # the counted product, the warm-up and the timed ones
    if device.type == "cpu" and work > MAX_CPU_FLOPS:
        raise ValueError(f"size {n} with warmup {warmup} and repeats {repeats} asks the CPU for {work:.2g} FLOPs, "
                         f"more than {MAX_CPU_FLOPS:.0e} (about a second of one core): use a smaller size or "
                         "fewer repeats")
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    with FlopCounterMode(display=False) as fc:
        torch.mm(a, b)
    flops = fc.get_total_flops()
    assert flops == 2 * n ** 3, flops  # the counter's rule for a product: a multiply and an add per term
    ctx = threads(num_threads) if (num_threads is not None and device.type == "cpu") else nullcontext()
    times = []
    with ctx:
        for i in range(warmup + repeats):
            synchronize(device)
            with Timer(device) as t:
                torch.mm(a, b)
            if i >= warmup:
                times.append(t.seconds)
    return flops / statistics.median(times)
