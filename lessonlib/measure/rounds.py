"""The one timing loop of the course: interleaved rounds, medians of ratios.

Every timed comparison in lessonlib (the phases of a training step,
checkpointing strategies, one process against several) runs the same way:
a few warm-up rounds that are thrown away, then ``rounds`` rounds in which
*every* case is timed once, so that a busy machine slows all cases of a
round alike. A ratio is taken inside each round, then the median over
rounds (:func:`statistics.median`). Times are seconds.

>>> r = time_rounds(lambda clock: [clock.time("a", sum, range(100)),
...                                clock.time("b", sum, range(1000))], rounds=3, warmup=1)
>>> sorted(r.seconds), len(r.seconds["a"])
(['a', 'b'], 3)
"""
from __future__ import annotations

import statistics
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Hashable

import torch

from ..checks import count as _check_count, flag as _check_flag, function as _check_function, measured as _check_measured
from ..checks import sequence as _check_sequence, text as _check_text
from .device import MAX_THREADS, Timer, as_device, synchronize, threads

#: The most rounds (and, separately, warm-up rounds) :func:`time_rounds` runs.
MAX_ROUNDS = 1000


class Clock:
    """Times named pieces of work inside one round (:class:`Timer`: CUDA events on a GPU)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict = {}

    @contextmanager
    def __call__(self, name: Hashable):
        """``with clock("forward"): ...`` times the block (queued GPU work finished first)."""
        synchronize(self.device)
        with Timer(self.device) as t:
            yield t
        self.seconds[name] = t.seconds

    def time(self, name: Hashable, fn: Callable, *args, **kwargs):
        """Time ``fn(*args, **kwargs)`` as ``name`` and return its result."""
        with self(name):
            return fn(*args, **kwargs)

    def add(self, name: Hashable, seconds: float) -> None:
        """Record a derived time for this round (e.g. the sum of phases)."""
        self.seconds[name] = float(seconds)


def quartiles(values) -> tuple:
    """(lower quartile, median, upper quartile) of ``values``, inclusive quartiles: the median and the middle
    half of the rounds around it, the spread this course prints beside a median. One value gives itself three
    times."""
    values = _check_sequence("values", values)  # refuses an empty one, naming it
    _check_measured("values", values, signed=True)  # an exposed time may be negative
    if len(values) == 1:
        return (values[0],) * 3
    return tuple(statistics.quantiles(values, n=4, method="inclusive"))


@dataclass
class Rounds:
    """Per-round seconds of each named case: ``seconds[name][i]`` is round ``i``."""

    seconds: dict

    def median(self, name: Hashable) -> float:
        """Median seconds of ``name`` over the rounds."""
        return statistics.median(self.seconds[name])

    def ratio(self, num: Hashable, den: Hashable) -> float:
        """Median over rounds of ``num / den``, both from the same round."""
        return statistics.median([a / b for a, b in zip(self.seconds[num], self.seconds[den])])

    def quartiles(self, num: Hashable, den: Hashable | None = None) -> tuple:
        """First and third quartiles over rounds of ``num / den`` (or of ``num``'s seconds): what a median hides.

        Their difference, the interquartile range, is the spread this course prints beside a median.
        """
        vals = self.seconds[num] if den is None else [a / b for a, b in zip(self.seconds[num], self.seconds[den])]
        q1, _, q3 = quartiles(vals)
        return (q1, q3)

    @classmethod
    def slowest(cls, runs: list) -> "Rounds":
        """Merge the rounds of several processes: per round, the slowest one's time.

        ``runs`` are :class:`Rounds` (or their ``seconds`` dicts), one per process,
        with the same names and number of rounds. A step shared by processes is
        done when the slowest is done.
        """
        dicts = [r.seconds if isinstance(r, Rounds) else r for r in runs]
        return cls({k: [max(vals) for vals in zip(*(d[k] for d in dicts))] for k in dicts[0]})


def time_rounds(round_fn: Callable[[Clock], object], rounds: int, warmup: int = 1,
                device: torch.device | str | None = None, num_threads: int | None = 1,
                progress: bool = False, desc: str = "timing rounds",
                after_round: Callable[[], object] | None = None) -> Rounds:
    """Call ``round_fn(clock)`` ``warmup + rounds`` times; keep the last ``rounds`` (each at most :data:`MAX_ROUNDS`).

    ``round_fn`` times each case of a round with ``clock("name")`` (a context
    manager) or ``clock.time("name", fn, *args)``; untimed work (zeroing
    gradients, barriers) goes between them. ``num_threads`` sets torch's CPU
    threads for the whole measurement with :func:`lessonlib.measure.device.threads`
    (1 by default: steadier; None keeps the current setting). ``progress``
    shows a bar (:mod:`lessonlib.progress`); ``after_round`` is called after
    every round (a spawned worker reports its progress this way).
    """
    if not callable(round_fn):
        raise TypeError(f"round_fn must be a function of one clock, got {type(round_fn).__name__}")
    rounds = _check_count("rounds", rounds, maximum=MAX_ROUNDS)
    warmup = _check_count("warmup", warmup, minimum=0, maximum=MAX_ROUNDS)
    device = as_device("device", device)
    if num_threads is not None:  # checked on a GPU too, where it is not used
        num_threads = _check_count("num_threads", num_threads, maximum=MAX_THREADS)
    progress = _check_flag("progress", progress)
    desc = _check_text("desc", desc)
    if after_round is not None:
        _check_function("after_round", after_round)
    ctx = threads(num_threads) if (num_threads is not None and device.type == "cpu") else nullcontext()
    it = range(warmup + rounds)
    if progress:  # a bar live; one summary line in the static book build
        from ..progress import progress as _progress

        it = _progress(it, desc=desc, total=warmup + rounds)
    raw: dict = {}
    with ctx:
        for r in it:
            clock = Clock(device)
            round_fn(clock)
            if r >= warmup:
                for name, s in clock.seconds.items():
                    raw.setdefault(name, []).append(s)
            if after_round is not None:
                after_round()
    return Rounds(raw)
