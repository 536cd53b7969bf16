"""Overlap on a stand-in device whose compute and link run side by side, timed.

On this book's CPU, gloo's exchanges and the backward pass share the same cores, so overlapping them
mostly costs time (page 3.3 measures that). A GPU computes on its own cores while its network engine
moves the bytes. This module stands in for such a device: backward's work per bucket and the link's
work per bucket are *waits* (``time.sleep``), in two threads, so neither slows the other, and only the
ordering that DDP imposes remains: a bucket is sent when its gradients are ready and the link is free,
and the step ends when the last bucket has arrived. It times that ordering, not any arithmetic; the
formula it is held against is :func:`lessonlib.calc.overlap.exposed_comm`. Seconds throughout.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

from ..checks import amount as check_amount, count as check_count

__all__ = ["REPEATS", "SimulatedStep", "simulate_overlap"]

#: The longest a simulation may wait, in seconds (repeats x buckets x (compute + link per bucket)).
MAX_SECONDS = 5.0
#: How many times :func:`simulate_overlap` runs each ordering by default (it keeps the fastest).
REPEATS = 5


@dataclass(frozen=True)
class SimulatedStep:
    """One simulated backward with its gradient exchange (seconds).

    backward:          when backward's last bucket was ready, from the step's start
    exposed_overlap:   the step's end minus ``backward``, each bucket sent as soon as it was ready
    exposed_after:     the same with every bucket sent only after backward ended (no overlap)
    """

    backward: float
    exposed_overlap: float
    exposed_after: float


def _run(compute_s, comm_s, buckets, overlap):
    link: queue.Queue = queue.Queue()
    done = threading.Event()

    def send():  # the link: one bucket at a time, in the order they were handed over
        for _ in range(buckets):
            link.get()
            time.sleep(comm_s)
        done.set()

    sender = threading.Thread(target=send, daemon=True)
    start = time.perf_counter()
    sender.start()
    for _ in range(buckets):
        time.sleep(compute_s)      # backward computes one bucket's gradients
        if overlap:
            link.put(None)         # DDP's hook: this bucket goes as soon as it is ready
    backward = time.perf_counter() - start
    if not overlap:
        for _ in range(buckets):
            link.put(None)         # everything after backward
    done.wait()
    sender.join()
    return backward, time.perf_counter() - start - backward


def simulate_overlap(compute_s: float, comm_s: float, buckets: int, repeats: int = REPEATS) -> SimulatedStep:
    """Time a simulated step of ``buckets`` buckets, ``compute_s`` of backward and ``comm_s`` of link each,
    with and without overlap (see the module's docstring), ``repeats`` times each way, and keep the fastest.

    A sleep never ends early, only late (a busy machine wakes a thread when it has a core free, and a new
    thread may start late), so each repeat can only be slower than the ordering alone makes it: the
    fastest repeat is the least disturbed. Returns a :class:`SimulatedStep`."""
    c = check_amount("compute_s", compute_s, maximum=MAX_SECONDS)
    m = check_amount("comm_s", comm_s, maximum=MAX_SECONDS)
    b = check_count("buckets", buckets, maximum=1000)
    r = check_count("repeats", repeats, maximum=100)
    if r * b * (c + m) > MAX_SECONDS:
        raise ValueError(f"repeats × buckets × (compute_s + comm_s) is {r * b * (c + m):g} s, more than the "
                         f"{MAX_SECONDS:g} s a simulation may take")
    backward, exposed_overlap = min((_run(c, m, b, overlap=True) for _ in range(r)), key=sum)
    exposed_after = min(_run(c, m, b, overlap=False)[1] for _ in range(r))
    return SimulatedStep(backward, exposed_overlap, exposed_after)
