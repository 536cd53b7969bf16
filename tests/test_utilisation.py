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


def test_a_cpu_call_answers_in_about_a_second():
    # a 3856 side was accepted and took over 20 s of CPU (found by the deep fuzz): now refused
    # before any work, naming what to change; the defaults and the page's 1024 stay well inside
    with pytest.raises(ValueError, match=r"size 3856 with warmup 2 and repeats 10 .* smaller size or fewer repeats"):
        measure_matmul_flops(3856)
    with pytest.raises(ValueError, match="repeats 50"):
        measure_matmul_flops(1024, repeats=50)
    assert measure_matmul_flops(2048, repeats=3, warmup=1) > 0  # 5 products of 2048: at the limit
