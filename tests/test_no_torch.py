"""The calculation helpers need no torch: a reader can price a run without installing it."""
import subprocess
import sys

import pytest

CALLS = {
    "checks": "assert M.count('devices', 4) == 4",
    "memory": "assert M.training_state_bytes(7_500_000_000).total == 120_000_000_000",
    "planner": "assert M.plan(1_000_000, 'adam', 'mixed', 1, 128, 2, 64, 4, 'none', 10**10).failure == 'none'",
    "parallel": "assert M.amdahl_speedup(20, 80, 4) == 2.5",
    "recovery": "assert M.young_daly_interval(300, 86400) == 7200",
    "goodput": "assert 0 < M.goodput(8, 7.0, 50_000, 60, 600).per_device_hour < 1",
}


@pytest.mark.parametrize("module", sorted(CALLS))
def test_calculators_import_and_run_without_torch(module):
    code = (
        "import sys; sys.modules['torch'] = None  # any 'import torch' now fails\n"
        f"from lessonlib import {module} as M\n{CALLS[module]}\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
