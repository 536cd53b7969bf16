"""The calculation layer needs no torch: a reader can price a run without installing it.

Every module of ``lessonlib.calc`` (and the ground floor it stands on) is
imported and run in a Python where ``import torch`` fails. A new calc module
is covered without editing this file: it must then have an entry in CALLS.
"""
import pkgutil
import subprocess
import sys

import pytest

import lessonlib.calc

CALLS = {
    "calc.layout": "M.layout_cost(M.ModelShape('m', 1e9, 4, 64, 4, 64, 4), M.Cluster(4), M.Layout(data=4))",
    "calc.layout_search": "M.search_layouts(M.ModelShape('m', 1e9, 4, 64, 4, 64, 4), M.Cluster(4))",
    "calc.stage_memory": "M.first_stage_activation_bytes(8192, 16384, 128, 126, tensor=8, pipeline=16, micro_batches=16)",
    "checks": "assert M.count('devices', 4) == 4",
    "progress": "assert list(M.progress([1, 2], desc='x')) == [1, 2]",
    "calc.memory": "assert M.training_state_bytes(7_500_000_000).total == 120_000_000_000",
    "calc.presets": "assert M.transformer_params(12, 768, positions=1024) == 124439808",
    "calc.planner": "assert M.plan(1_000_000, 'adam', 'bf16_master', 1, 128, 2, 64, 4, 'none', 10**10).failure == 'none'",
    "calc.amdahl": "assert M.amdahl_speedup(20, 80, 4) == 2.5",
    "calc.sequence": "assert M.causal_block_counts(2, 'contiguous') == [3, 7]",
    "calc.batch_size": "assert M.batch_tradeoff(1024, 1024, 1000).steps == 2000 and M.steps_to_finish(8192, 2048) == 4",
    "calc.collectives": "assert M.ring_allreduce_bytes(1000, 4) == 1500",
    "calc.pipeline": "assert M.pipeline_bubble_fraction(4, 8) == 3 / 11",
    "calc.experts": "assert M.expert_load_imbalance([25, 5, 5, 5]) == 2.5",
    "calc.reliability": "assert M.young_daly_interval(300, 86400) == 7200",
    "calc.recompute": "assert M.chain_memory_units(16, 4) == 7",
    "calc.hardware": "assert M.sustained_flops_per_s('A100 SXM 80GB', 0.5) == 156e12",
    "calc.pricing": "assert M.mtbf_seconds(3600, 4) == 900",
    "calc.published": "assert M.LLAMA3_405B['params'].value == 405e9",
    "calc.goodput": "assert 0 < M.goodput(8, 7.0, 50_000, 60, 600).per_device_hour < 1",
    "calc.precision": "assert M.recipe('bf16_master_fp32_grads').bytes_per_param('adam') == 18",
    "calc.sharding": "assert M.zero_state_bytes(7_500_000_000, 8, 3).total == 15_000_000_000",
    "calc.serving": "assert M.kv_cache_bytes_per_token(32, 8, 128) == 131072",
    "calc.comm": "assert M.collective_seconds('all_reduce', 1e9, 8, 0.0, 100e9) == 0.0175",
    "calc.bill": "assert M.bill(1000, 2.0, 700).dollars == 2000",
    "calc.mfu": "assert M.model_hardware_flops(1e9, 1, 2, 8, 8, recompute='full').hardware > 6e9",
    "calc.scale": "assert 0.55 < M.llama3_scale().per_device_hour < 0.65",
    "calc.overlap": "assert M.exposed_comm(2.0, 1.0, 8) == 1.0",
}


def calc_modules():
    return sorted("calc." + m.name for m in pkgutil.iter_modules(lessonlib.calc.__path__))


def test_every_calc_module_has_a_call():
    missing = set(calc_modules()) - set(CALLS)
    assert not missing, f"add a torch-free call for {sorted(missing)} to CALLS"


@pytest.mark.parametrize("module", sorted(CALLS))
def test_calculators_import_and_run_without_torch(module):
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None  # any import now fails\n"
        f"import lessonlib.{module} as M\n{CALLS[module]}\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
