"""lessonlib.measure.utilisation: the reader's own MFU, from counted FLOPs over measured time."""
from __future__ import annotations

import pytest

from lessonlib.measure.utilisation import measure_matmul_flops


def test_matmul_peak_is_measured():
    # 2 n^3 FLOPs per product is asserted inside (FlopCounterMode's count); the rate is a timing,
    # so only its sign is checked here.
    assert measure_matmul_flops(256, repeats=3) > 0


def test_bad_input():
    with pytest.raises(ValueError, match="size"):
        measure_matmul_flops(0)
    with pytest.raises(ValueError, match="repeats"):
        measure_matmul_flops(8, repeats=0)
