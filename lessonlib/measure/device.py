"""Which device to run on, how to time work on it, and what it is.

Every measured number in the course carries the hardware it came from, so each
notebook prints :func:`environment_report` first.
"""
from __future__ import annotations

import os
import platform
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..checks import count as _check_count, counts as _check_counts, text as _check_text

#: The most CPU threads :func:`threads` (and every ``num_threads`` of a measurement) sets: this
#: machine's logical CPUs. torch accepts more, but a measurement with more threads than CPUs
#: times their contention (and hundreds of spinning threads would take unbounded time).
MAX_THREADS = os.cpu_count() or 1


def as_device(name: str, value) -> torch.device:
    """``value`` (None, ``"cpu"``, ``"cuda"``, ``"cuda:0"`` or a ``torch.device``) as a device.

    None means :func:`get_device`'s choice. Anything else is a ``ValueError``
    or ``TypeError`` naming the argument ``name``.
    """
    _check_text("name", name)
    if value is None:
        return get_device()
    if isinstance(value, torch.device):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a device name such as 'cpu' or 'cuda', a torch.device, or None, "
                        f"got {value!r:.80}")
    try:
        return torch.device(value)
    except RuntimeError:
        raise ValueError(f"{name} must be a device name such as 'cpu' or 'cuda', got {value!r:.80}") from None


def get_device(prefer: str | None = None) -> torch.device:
    """Return CUDA when available, else CPU.

    ``prefer`` ("cpu" or "cuda") overrides the choice; the environment variable
    ``LESSONLIB_DEVICE`` does the same without editing a notebook.
    """
    if prefer is not None and not isinstance(prefer, str):
        raise TypeError(f"prefer must be 'cpu', 'cuda' or None, got {prefer!r:.80}")
    choice = prefer or os.environ.get("LESSONLIB_DEVICE")
    if choice is not None:
        choice = choice.lower()
        if choice not in ("cpu", "cuda"):
            raise ValueError(f"prefer (or LESSONLIB_DEVICE) must be 'cpu' or 'cuda', got {choice!r:.80}")
        if choice == "cuda" and not torch.cuda.is_available():
            raise ValueError("prefer='cuda' but torch.cuda.is_available() is False")
        return torch.device(choice)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait until all queued work on ``device`` has finished (no-op on CPU)."""
    device = as_device("device", device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Elapsed time of a block of work, in seconds, on the given device.

    On a GPU, work is queued asynchronously, so a wall clock read right after
    a call measures only the launch. The timer records CUDA events around the
    block and synchronises before reading them. On CPU it uses
    :func:`time.perf_counter`.

    >>> with Timer() as t:
    ...     _ = sum(range(1000))
    >>> t.seconds >= 0
    True
    """

    def __init__(self, device: torch.device | str | None = None):
        self.device = as_device("device", device)
        self.seconds: float | None = None

    def __enter__(self) -> "Timer":
        if self.device.type == "cuda":
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            self._end.record()
            self._end.synchronize()
            self.seconds = self._start.elapsed_time(self._end) / 1000.0  # ms -> s
        else:
            self.seconds = time.perf_counter() - self._t0


def threads(n: int):
    """Run the block with ``torch.set_num_threads(n)`` (1 to :data:`MAX_THREADS`), then restore.

    ``n`` is checked when this is called, not when the ``with`` block starts.
    """
    return _threads(_check_count("n", n, maximum=MAX_THREADS))


@contextmanager
def _threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def device_name(device: torch.device | str | None = None) -> str:
    """A human-readable name for the device: the GPU model, or the CPU."""
    device = as_device("device", device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:  # Linux gives the marketing name here
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU ({cpu}, {os.cpu_count()} cores)"


def environment_report(device: torch.device | str | None = None) -> str:
    """What measures this page's numbers, in three short lines (short enough that no page cuts them off).

    The first line names the device the page measures on (``get_device()``); the
    second how it times and counts memory there: CUDA events and ``torch.cuda``
    memory statistics on a GPU, the wall clock and torch's thread count on a CPU;
    the third gives torch's and Python's versions. A page that runs something on
    the CPU regardless (a subprocess job, a two-process gloo run) says so where it does.
    On a torch that lacks a capability of :mod:`lessonlib.measure.compat`, more
    lines follow: one naming the torch that has them all, then one per missing
    capability (what a page skips, the API, the torch that brought it).
    """
    from .compat import MIN_TORCH, missing

    device = as_device("device", device)
    if device.type == "cuda":
        how = "timing: CUDA events | memory: torch.cuda stats"
    else:
        n = torch.get_num_threads()
        how = f"timing: wall clock, {n} torch thread{'s' if n != 1 else ''}"
    report = (f"measures on: {device.type}, {device_name(device)}\n{how}\n"
              f"torch {torch.__version__} | Python {platform.python_version()}")
    lacking = missing()
    if lacking:
        report += (f"\ntorch {torch.__version__} lacks {len(lacking)} of what the pages measure"
                   f" (all there from torch {MIN_TORCH}); pages skip:")
        report += "".join(f"\n- {why}" for why in lacking.values())
    return report


@dataclass(frozen=True)
class CpuTopology:
    """The CPUs this process may run on, as the operating system reports them (:func:`cpu_topology`).

    ``cpus``: how many logical CPUs; ``cores``: how many physical cores they sit on, None where the
    system does not say; ``virtual``: True in a virtual machine, whose cores may be hardware threads of
    fewer physical cores without its knowing, None where unknown.
    """

    cpus: int
    cores: int | None
    virtual: bool | None

    def placement(self, world_size: int) -> str:
        """Where ``world_size`` one-thread processes run: ``"shared_cpu"`` (fewer CPUs than processes),
        ``"shared_core"`` (fewer physical cores: some run as hardware threads, SMT siblings, of one
        core), ``"own_cores"``, or ``"unknown"`` (the cores are not reported)."""
        world_size = _check_count("world_size", world_size)
        if self.cpus < world_size:
            return "shared_cpu"
        if self.cores is None:
            return "unknown"
        return "shared_core" if self.cores < world_size else "own_cores"

    def sharing(self, world_size: int) -> str:
        """One sentence: what ``world_size`` one-thread processes share on these CPUs."""
        where = self.placement(world_size)
        if where == "shared_cpu":
            return f"This process may use {_some(self.cpus, 'CPU')} for {world_size} processes, so they take turns."
        if where == "shared_core":
            return (f"The system puts these {self.cpus} CPUs on {_some(self.cores, 'physical core')}: the processes run "
                    "as hardware threads (SMT siblings) of one core and share its arithmetic units.")
        if where == "unknown":
            return "This system does not say which cores its CPUs sit on, so what the processes share is unknown."
        return (f"The system reports {self.cores} separate cores: they still share the memory bus and, on a "
                "shared machine, other programs' work" + ("; in a virtual machine such as this one they may also "
                "be hardware threads of one physical core, which it cannot see." if self.virtual else "."))

    def __str__(self) -> str:
        cores = "cores not reported" if self.cores is None else _some(self.cores, "physical core")
        return f"this process's CPUs: {self.cpus}, on {cores}" + (" (a virtual machine)" if self.virtual else "")


def _some(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def cpu_topology(cpus=None) -> CpuTopology:
    """How the logical CPUs ``cpus`` (their numbers; default: those this process may run on,
    ``os.sched_getaffinity``) map to physical cores, read from Linux's
    ``/sys/devices/system/cpu/cpuN/topology`` (distinct ``physical_package_id``, ``core_id`` pairs).

    Two CPUs on one core are hardware threads (SMT siblings) sharing its arithmetic units; a
    virtual machine reports the ``hypervisor`` CPU flag. Where a file is missing (not Linux, a
    sandbox), ``cores`` or ``virtual`` is None rather than a guess.
    """
    if cpus is None:
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not on every system (macOS, Windows)
            cpus = list(range(os.cpu_count() or 1))
    cpus = _check_counts("cpus", cpus, minimum=0, maximum=2**16)
    cores = set()
    try:
        for n in set(cpus):
            base = f"/sys/devices/system/cpu/cpu{n}/topology/"
            with open(base + "physical_package_id") as pkg, open(base + "core_id") as core:
                cores.add((pkg.read().strip(), core.read().strip()))
    except OSError:
        cores = None
    virtual = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    virtual = "hypervisor" in line.split()
                    break
    except OSError:
        pass
    return CpuTopology(cpus=len(set(cpus)), cores=None if cores is None else len(cores), virtual=virtual)
