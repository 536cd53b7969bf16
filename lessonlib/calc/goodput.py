"""Paid capacity against useful progress: goodput per paid device-hour.

A device reserved for a job is paid for every hour it is held, whether the job
is computing, waiting for a peer, saving a checkpoint, redoing work lost to a
failure or restarting. *Goodput* counts only what moves the model forward:
completed training steps whose result survives as evaluable model state.

The unit of progress here is the **one-device hour**: the training work one
device, running alone and never failing, completes in an hour. A single device
with no failures therefore makes 1.0 one-device hour of progress per paid
device-hour; everything else makes less.

The combination (pure Python, no torch needed):

* speedup on ``world_size`` devices (measured, or from
  :func:`lessonlib.calc.amdahl.speedup_from_share`);
* failures: a synchronous job stops when any one device fails, so the job's
  mean time between failures is the device's divided by the device count;
* recovery checkpoints: time lost to saves, to work redone after a failure and
  to restarts, from :func:`lessonlib.calc.reliability.expected_overhead` (exact
  for exponential failures) at the interval chosen, by default the exact
  optimum :func:`lessonlib.calc.reliability.optimal_interval`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import (amount as _check_amount, count as _check_count, reads as _reads, result as _check_result,
                      sequence as _check_sequence)
from .reliability import expected_overhead, optimal_interval


SECONDS_PER_HOUR = 3600.0


def job_mtbf_seconds(device_mtbf_hours, world_size) -> float:
    """Mean time between failures of a job on ``world_size`` devices, in seconds.

    Failures of independent devices add up: if each fails on average once in
    ``device_mtbf_hours`` hours and any one failure stops the job, the job
    fails ``world_size`` times as often.
    """
    mtbf_h = _check_amount("device_mtbf_hours", device_mtbf_hours, allow_zero=False)
    return _job_mtbf(mtbf_h, _check_count("world_size", world_size))


def _job_mtbf(mtbf_h: float, world_size: int) -> float:
    """:func:`job_mtbf_seconds` on checked arguments (internal calls trust their caller)."""
    return mtbf_h * SECONDS_PER_HOUR / world_size


@dataclass(frozen=True)
class Goodput:
    """The result of :func:`goodput`.

    world_size:          devices paid for
    speedup:             one-device time / many-device time of a step (×)
    job_mtbf_s:          the job's mean time between failures (seconds)
    interval_s:          seconds of work between recovery checkpoints
    overhead:            time lost to saves, redone work and restarts, per unit of useful time
    useful_fraction:     useful time / wall time = 1 / (1 + overhead)
    progress_per_hour:   one-device hours of work completed per wall-clock hour
    per_device_hour:     one-device hours of work per paid device-hour (1.0 = one perfect device)
    """

    world_size: int
    speedup: float
    job_mtbf_s: float
    interval_s: float
    overhead: float
    useful_fraction: float
    progress_per_hour: float
    per_device_hour: float

    @property
    def paid_per_useful_hour(self) -> float:
        """Paid device-hours per one-device hour of progress (1 / per_device_hour)."""
        return 1.0 / self.per_device_hour


def goodput(world_size, speedup, device_mtbf_hours, checkpoint_seconds, restart_seconds=0.0,
            interval_seconds=None) -> Goodput:
    """Useful progress per paid device-hour of a synchronous training job.

    ``speedup`` (×, > 0) is the step speedup on ``world_size`` devices;
    ``device_mtbf_hours`` the mean hours between failures of one device;
    ``checkpoint_seconds`` how long one recovery save stalls training;
    ``restart_seconds`` how long a restart after a failure takes (re-queue,
    reload, warm up); ``interval_seconds`` the work between saves (default:
    the exact optimum for this job, :func:`lessonlib.calc.reliability.optimal_interval`).

    Raises ``ValueError`` naming the argument for non-positive speedup, MTBF
    or save time, negative restart time, or a device count below 1.
    """
    world_size = _check_count("world_size", world_size)
    speedup = _check_amount("speedup", speedup, allow_zero=False)
    checkpoint_seconds = _check_amount("checkpoint_seconds", checkpoint_seconds, allow_zero=False)
    restart_seconds = _check_amount("restart_seconds", restart_seconds)
    mtbf = _job_mtbf(_check_amount("device_mtbf_hours", device_mtbf_hours, allow_zero=False), world_size)
    if interval_seconds is None:
        interval = optimal_interval(checkpoint_seconds, mtbf)
    else:
        interval = _check_amount("interval_seconds", interval_seconds, allow_zero=False)
    overhead = expected_overhead(interval, checkpoint_seconds, mtbf, restart_seconds)
    useful = 1.0 / (1.0 + overhead)
    per_hour = _check_result(speedup * useful, "speedup, device_mtbf_hours and checkpoint_seconds",
                             "progress per hour")
    return Goodput(world_size=world_size, speedup=speedup, job_mtbf_s=mtbf, interval_s=interval,
                   overhead=overhead, useful_fraction=useful, progress_per_hour=per_hour,
                   per_device_hour=per_hour / world_size)


@dataclass(frozen=True)
class StallAccount:
    """What one stall cost a synchronous job, read off its per-step clock times (seconds).

    ``normal_s``: median step time outside the stall; ``stalled_s``: the stalled
    step on the first process; ``paid_s``: device-seconds held (processes x the
    longest run); ``useful_s``: device-seconds the steps needed without the stall;
    ``cpu_share``: the share of the stalled step the first process spent on the CPU.
    """

    normal_s: float
    stalled_s: float
    paid_s: float
    useful_s: float
    cpu_share: float

    @property
    def goodput(self) -> float:
        """Useful over paid device-seconds (a fraction)."""
        return self.useful_s / self.paid_s


def check_runs(runs) -> list:
    """Check ``runs``: a non-empty list of dicts whose ``wall`` and ``cpu`` lists (seconds) have one entry per step.

    Both are cumulative clocks read after every step, so each list must rise
    step by step: ``wall`` strictly (a step takes time), ``cpu`` never falling.
    A process cannot use more CPU time in a step than the step lasted times its
    threads, so a step whose CPU time is more than :data:`MAX_THREADS_PER_PROCESS`
    times its wall time is refused as clocks swapped or mixed up.
    """
    runs = _check_sequence("runs", runs)
    n = None
    for i, r in enumerate(runs):
        if not isinstance(r, dict) or "wall" not in r or "cpu" not in r:
            raise TypeError(f"runs[{i}] must be a dict with 'wall' and 'cpu' lists, got {r!r:.80}")
        clocks = {}
        for key in ("wall", "cpu"):
            values = [_check_amount(f"runs[{i}][{key!r}]", v) for v in _check_sequence(f"runs[{i}][{key!r}]", r[key])]
            if n is None:
                n = len(values)
            elif len(values) != n:
                raise ValueError(f"runs[{i}][{key!r}] has {len(values)} steps, runs[0] has {n}")
            clocks[key] = values
        wall, cpu = clocks["wall"], clocks["cpu"]
        for s in range(n):
            dw = wall[s] - (wall[s - 1] if s else 0.0)
            dc = cpu[s] - (cpu[s - 1] if s else 0.0)
            if dw <= 0:
                raise ValueError(f"runs[{i}]['wall'] must rise at every step (a cumulative clock; a step takes time), "
                                 f"but step {s} goes from {wall[s - 1] if s else 0.0!r} to {wall[s]!r}")
            if dc < 0:
                raise ValueError(f"runs[{i}]['cpu'] must never fall (a cumulative clock), but step {s} goes from "
                                 f"{cpu[s - 1]!r} to {cpu[s]!r}")
            if dc > MAX_THREADS_PER_PROCESS * dw:
                raise ValueError(f"runs[{i}]: step {s} used {dc:.3g} s of CPU in {dw:.3g} s of wall time, more than "
                                 f"{MAX_THREADS_PER_PROCESS} threads can: are 'wall' and 'cpu' swapped?")
    return runs


#: The most CPU-seconds a process of the course's runs can use per wall-clock second (its threads).
MAX_THREADS_PER_PROCESS = 256


@_reads("runs")
def stall_account(runs: list, stall_step: int) -> StallAccount:
    """Account a stall from each process's cumulative ``wall`` and ``cpu`` seconds after every step.

    ``runs`` is a list (one per process) of dicts with lists ``wall`` and ``cpu``
    (checked by :func:`check_runs`: clocks that rise); ``stall_step`` the index
    of the stalled step (>= 1). ``cpu_share`` is the first process's CPU time
    in the stalled step over its wall time, at most 1 per thread.
    """
    check_runs(runs)
    stall_step = _check_count("stall_step", stall_step)
    w0, c0 = runs[0]["wall"], runs[0]["cpu"]
    if stall_step >= len(w0):
        raise ValueError(f"stall_step must be below the number of steps ({len(w0)}), got {stall_step}")
    step_times = [b - a for a, b in zip([0.0] + list(w0[:-1]), w0)]
    others = sorted(step_times[:stall_step] + step_times[stall_step + 1:])
    normal = others[len(step_times) // 2]  # the median step, as the page has always read it
    stalled = step_times[stall_step]
    paid = len(runs) * max(r["wall"][-1] for r in runs)
    useful = len(runs) * normal * len(w0)
    cpu = c0[stall_step] - c0[stall_step - 1]
    cpu_share = _check_result(cpu / stalled, "runs[0]['cpu'] and runs[0]['wall']", "a CPU share of the stalled step",
                              high=1.0, hint="the process used more CPU time than the step lasted: are 'wall' and "
                                             "'cpu' swapped, or from different processes?")
    return StallAccount(normal_s=normal, stalled_s=stalled, paid_s=paid, useful_s=useful, cpu_share=cpu_share)
