import time

import pytest
import torch

from lessonlib.measure import device


def test_get_device_picks_cuda_only_when_available():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert device.get_device().type == expected
    assert device.get_device("cpu").type == "cpu"


def test_get_device_rejects_unknown_and_unavailable():
    with pytest.raises(ValueError, match="prefer"):
        device.get_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            device.get_device("cuda")


def test_timer_measures_elapsed_seconds_on_cpu():
    with device.Timer("cpu") as t:
        time.sleep(0.02)
    # sleep() guarantees at least the time asked for; the upper side is not
    # asserted (shared machines are noisy).
    assert t.seconds >= 0.02


def test_threads_restores_setting_and_rejects_bad_counts():
    before = torch.get_num_threads()
    with device.threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="n must be (positive|a whole number)"):
            with device.threads(bad):
                pass


def test_environment_report_says_what_measures_in_short_lines():
    report = device.environment_report("cpu")
    first, second, third = report.split("\n")
    assert first.startswith("measures on: cpu, CPU")
    n = torch.get_num_threads()
    assert second == f"timing: wall clock, {n} torch thread{'s' if n != 1 else ''}"
    with device.threads(1):
        assert device.environment_report("cpu").split("\n")[1] == "timing: wall clock, 1 torch thread"
    assert third.startswith(f"torch {torch.__version__} | Python ")
    # Short lines, so the book's output box never has to cut them off (a test of the built pages checks too).
    assert all(len(line) <= 80 for line in report.split("\n")), report


def test_cpu_topology_reads_this_machine_and_places_processes():
    topo = device.cpu_topology()
    assert topo.cpus >= 1 and (topo.cores is None or 1 <= topo.cores <= topo.cpus)
    assert str(topo).startswith(f"this process's CPUs: {topo.cpus}")
    one = device.CpuTopology(cpus=2, cores=1, virtual=False)  # two SMT siblings of one core
    assert one.placement(2) == "shared_core" and "SMT siblings" in one.sharing(2)
    assert device.CpuTopology(cpus=1, cores=1, virtual=None).placement(2) == "shared_cpu"
    assert device.CpuTopology(cpus=4, cores=None, virtual=None).placement(2) == "unknown"
    two = device.CpuTopology(cpus=2, cores=2, virtual=True)
    assert two.placement(2) == "own_cores" and "virtual machine" in two.sharing(2)
    for bad in ([], ["a"], [-1], "0", 3):
        with pytest.raises((ValueError, TypeError), match="cpus"):
            device.cpu_topology(bad)
    with pytest.raises(ValueError, match="world_size"):
        one.placement(0)
