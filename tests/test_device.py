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
        with pytest.raises(ValueError, match="n must be a positive integer"):
            with device.threads(bad):
                pass


def test_environment_report_is_one_line_with_torch_device_and_threads():
    line = device.environment_report()
    assert "\n" not in line
    assert torch.__version__ in line
    assert f"torch threads: {torch.get_num_threads()}" in line
    assert ("cpu" in line) or ("cuda" in line)
