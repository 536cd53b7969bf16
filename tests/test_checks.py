import numpy as np
import pytest

from lessonlib import checks


def test_count_accepts_whole_numbers_and_rejects_the_rest():
    assert checks.count("layers", 4) == 4
    assert checks.count("n_params", 7.5e9) == 7_500_000_000   # a whole-valued float
    assert checks.count("devices", np.int64(8)) == 8
    assert checks.count("warmup", 0, minimum=0) == 0
    for bad, msg in [(0, "layers must be positive"), (-3, "layers must be positive"),
                     (2.5, "layers must be a whole number"), (True, "boolean"),
                     ("4", "whole number"), (float("nan"), "whole number")]:
        with pytest.raises(ValueError, match=msg):
            checks.count("layers", bad)
    with pytest.raises(ValueError, match="world_size must be at least 2, got 1"):
        checks.count("world_size", 1, minimum=2)


def test_amount_positive_share_and_choice():
    assert checks.amount("serial", 0) == 0.0
    with pytest.raises(ValueError, match="serial must be zero or positive"):
        checks.amount("serial", -1)
    with pytest.raises(ValueError, match="mtbf_seconds must be positive"):
        checks.positive("mtbf_seconds", 0)
    with pytest.raises(ValueError, match="finite"):
        checks.positive("mtbf_seconds", float("inf"))
    assert checks.share("serial_share", 1) == 1.0
    with pytest.raises(ValueError, match="serial_share is a fraction and must be at most 1"):
        checks.share("serial_share", 1.2)
    with pytest.raises(ValueError, match="unknown optimizer 'lion'; choose one of 'sgd', 'adam'"):
        checks.choice("optimizer", "lion", ("sgd", "adam"))
