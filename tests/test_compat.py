"""Private and recent torch APIs sit behind guards: hide each one and lessonlib still imports and runs."""
from __future__ import annotations

import importlib
import os
import re
import sys
import tomllib

import pytest
import torch

from conftest import ROOT
from lessonlib.measure import compat
from lessonlib.measure.distributed.overlap import NEEDS


def _hide(monkeypatch, name):
    """Make ``compat.FEATURES[name]`` missing, as on an older torch."""
    cap = compat.FEATURES[name]
    monkeypatch.delattr(importlib.import_module(cap.module), cap.attr)


def test_every_feature_exists_on_the_pinned_torch():
    assert compat.missing() == {}
    assert all(compat.feature(n) is not None for n in compat.FEATURES)


def test_the_report_checks_features_without_importing_them():
    """The first cell of every page prints the report; importing the private mem_tracker to look
    would cost it about a second."""
    import subprocess

    code = ("import sys; from lessonlib.measure.device import environment_report; environment_report(); "
            "print(sorted(m for m in sys.modules if m.startswith('torch.distributed._tools')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_a_feature_whose_file_is_absent_is_missing(monkeypatch):
    monkeypatch.setitem(compat.FEATURES, "mem_tracker", compat.Capability("torch.distributed._tools.gone",
                                                                          "MemTracker", "2.5", "the peak"))
    monkeypatch.setitem(compat.FEATURES, "flop_counter", compat.Capability("nowhere_at_all.flops",
                                                                           "FlopCounterMode", "2.1", "FLOPs"))
    assert compat.missing() == {
        "mem_tracker": "the peak (needs torch.distributed._tools.gone.MemTracker, torch >= 2.5)",
        "flop_counter": "FLOPs (needs nowhere_at_all.flops.FlopCounterMode, torch >= 2.1)"}


def test_declared_minimum_matches_compat():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"torch>={compat.MIN_TORCH}" in deps


def test_hidden_mem_tracker_module_gives_no_cpu_peak_and_the_report_says_so(monkeypatch):
    # A torch without the private module: importing it fails.
    monkeypatch.setitem(sys.modules, "torch.distributed._tools.mem_tracker", None)
    assert compat.feature("mem_tracker") is None
    from lessonlib.measure import device, memory, recompute
    from lessonlib.measure.models import ForecastMLP

    model = ForecastMLP(window=8, hidden=16, layers=2)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    led = memory.measure_training_memory(model, x, y, torch.nn.functional.mse_loss,
                                         torch.optim.Adam(model.parameters()))
    assert led.peak is None and led.weights > 0 and led.activations > 0
    stack = recompute.block_stack(2, hidden=8)
    assert recompute.peak_step_memory(stack, recompute.make_input(stack, 2, 4), "none") is None
    report = device.environment_report("cpu")
    assert "pages skip:\n- the CPU peak memory of a step (needs torch.distributed._tools.mem_tracker.MemTracker, " \
           "torch >= 2.5)" in report


def test_hidden_flop_counter_fails_with_a_message_not_at_import():
    # In a fresh interpreter: re-importing modules here would leave two copies of their
    # classes behind for the tests that run after this one.
    code = """
import torch, torch.utils.flop_counter as fcm
del fcm.FlopCounterMode                       # a torch without it
from lessonlib.measure import compat, recompute, timing   # imports without it
from lessonlib.measure.models import ForecastMLP
try:
    timing.count_flops(ForecastMLP(window=8, hidden=16, layers=2), torch.randn(4, 8))
except compat.Unavailable as e:
    assert "FlopCounterMode" in str(e), e
else:
    raise SystemExit("count_flops did not refuse")
stack = recompute.block_stack(2, hidden=8)
try:
    recompute.forward_flops(stack, recompute.make_input(stack, 2, 4))
except compat.Unavailable as e:
    assert "cannot measure FLOP counts" in str(e), e
else:
    raise SystemExit("forward_flops did not refuse")
"""
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_hidden_early_stop_switch_still_trains(monkeypatch):
    _hide(monkeypatch, "checkpoint_early_stop")
    from lessonlib.measure import recompute

    assert "checkpoint_early_stop" in compat.missing()
    stack = recompute.block_stack(2, hidden=8)
    loss = recompute.train_step(stack, recompute.make_input(stack, 2, 4), "per-block", early_stop=False)
    assert torch.isfinite(loss)


def test_unknown_feature_name_is_a_value_error():
    with pytest.raises(ValueError, match="name must be one of"):
        compat.feature("nope")


# --- the declared minimum, and what an older torch lacks ------------------------------------------

def _release(v: str) -> tuple:
    return tuple(int(p) for p in v.split("."))


def test_min_torch_is_the_newest_capability_the_pages_need():
    """The floor is derived from the APIs, not typed: every capability arrived at or before MIN_TORCH,
    and one arrived exactly then (so the floor is not lower than the APIs allow)."""
    since = [_release(c.since) for c in compat.FEATURES.values()]
    assert max(since) == _release(compat.MIN_TORCH)


@pytest.mark.parametrize("version, lacking", [
    ("2.10.0", {"pipeline_stage"}),
    ("2.8.0", {"pipeline_stage"}),
    ("2.7.1", {"pipeline_stage"}),
    ("2.6.0", {"fully_shard", "pipeline_stage"}),
    ("2.5.1", {"fully_shard", "pipeline_stage"}),
    ("2.4.1", {"fully_shard", "pipeline_stage", "mem_tracker", "comm_debug_mode"}),
    ("2.11.0", set()),
])
def test_missing_judges_unimported_modules_by_the_torch_that_brought_them(monkeypatch, version, lacking):
    """On 2.5 torch.distributed.fsdp is there but has no fully_shard (on 2.6 not for CPU processes): the setup cell must still name it
    without importing the module (it judges by the release), as the issue's table shows."""
    for cap in compat.FEATURES.values():  # as on a fresh kernel: nothing imported yet
        for mod in [m for m in sys.modules if m == cap.module]:
            monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(torch, "__version__", version + "+cu124")
    assert set(compat.missing()) == lacking


def test_requires_prints_one_skip_line_per_missing_capability(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.distributed.tensor.debug", None)
    monkeypatch.setitem(sys.modules, "torch.distributed._tools.mem_tracker", None)
    assert compat.requires("fully_shard") is True
    assert capsys.readouterr().out == ""
    assert compat.requires("fully_shard", "comm_debug_mode", "mem_tracker", device="cpu") is False
    out = capsys.readouterr().out.splitlines()
    assert out == [f"skipped on this torch: collectives logged with their bytes (needs "
                   f"torch.distributed.tensor.debug.CommDebugMode, torch >= 2.5; this is torch {torch.__version__})",
                   f"skipped on this torch: the CPU peak memory of a step (needs "
                   f"torch.distributed._tools.mem_tracker.MemTracker, torch >= 2.5; this is torch {torch.__version__})"]


def test_the_cpu_peak_tracker_is_not_required_on_a_gpu(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.distributed._tools.mem_tracker", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as_device("cuda") only parses the name
    assert compat.requires("mem_tracker", device="cuda") is True
    assert compat.requires("mem_tracker", device="cpu") is False
    assert "CPU peak" in capsys.readouterr().out


def test_requires_refuses_bad_names():
    assert compat.requires() is True  # nothing required
    with pytest.raises(ValueError, match="names must be one of"):
        compat.requires("fully_shard", "fsdp")
    with pytest.raises(ValueError, match="device_types must name"):
        compat.Capability("torch", "nn", "2.0", "x", device_types=("tpu",))


def test_a_fully_shard_that_cannot_run_on_cpu_processes_is_missing(monkeypatch):
    """torch 2.6: fully_shard imports, then fails on gloo with 'Stream' object has no attribute 'record_event'."""
    assert compat.feature("fully_shard") is not None
    monkeypatch.delattr(torch.cpu.Stream, "record_event")
    assert compat.feature("fully_shard") is None
    assert "fully_shard" in compat.missing()


def test_a_pipeline_stage_that_needs_example_inputs_is_missing(monkeypatch):
    """torch 2.4/2.5: PipelineStage(..., input_args) -- there, but not usable as lessonlib calls it."""
    import torch.distributed.pipelining as pp

    class OldStage:
        def __init__(self, submodule, stage_index, num_stages, device, input_args, output_args=None, group=None):
            pass

    assert compat.feature("pipeline_stage") is pp.PipelineStage
    monkeypatch.setattr(pp, "PipelineStage", OldStage)
    assert compat.feature("pipeline_stage") is None
    with pytest.raises(compat.Unavailable, match=r"pipeline schedules .*torch >= 2\.11"):
        compat.require_all("pipeline_stage")


def test_pipelines_whose_1f1b_deadlocks_on_gloo_are_missing(monkeypatch):
    """torch 2.6 and 2.7.1: Schedule1F1B hangs on gloo (run here); 2.8's fix added _wait_batch_p2p."""
    import torch.distributed.pipelining.schedules as schedules

    monkeypatch.delattr(schedules, "_wait_batch_p2p")
    assert compat.feature("pipeline_stage") is None


def test_the_distributed_runs_refuse_before_starting_processes(monkeypatch):
    """A clear one-line error in the caller, not a worker's traceback (nor error_files from launch)."""
    from lessonlib.measure.distributed import fsdp, launch as launch_mod, pipelining, tensor_parallel

    def no_launch(*a, **k):
        raise AssertionError("processes were started")

    for mod in (fsdp, pipelining, tensor_parallel):
        monkeypatch.setattr(mod, "launch", no_launch)
    monkeypatch.setitem(sys.modules, "torch.distributed.tensor.debug", None)
    with pytest.raises(compat.Unavailable, match="CommDebugMode"):
        tensor_parallel.run_tensor_parallel(world_size=2)
    with pytest.raises(compat.Unavailable, match="CommDebugMode"):
        fsdp.run_sharding(world_sizes=(2,))
    import torch.distributed.pipelining as pp

    monkeypatch.setattr(pp, "PipelineStage", type("S", (), {"__init__": lambda self, a, b, c, d, input_args: None}))
    with pytest.raises(compat.Unavailable, match="PipelineStage"):
        pipelining.run_pipelines([dict(world_size=2, microbatches=(2,), hidden=8, layers=1, rows=2, reps=1)])


def test_a_class_built_on_a_missing_capability_imports_and_names_it_when_used(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.distributed.tensor.debug", None)
    Base = compat.base_class("comm_debug_mode")

    class Log(Base):
        pass

    with pytest.raises(compat.Unavailable, match="collectives logged with their bytes"):
        Log()


# --- pages run on a torch without each capability -----------------------------------------------

def _guarded_functions() -> dict:
    """{function name: capabilities it requires}, read from lessonlib.measure.distributed's source."""
    import ast

    out = {}
    for path in (ROOT / "lessonlib" / "measure" / "distributed").glob("*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "require_all":
                        # constant names only: run_overlap's needs depend on its engine (checked below)
                        out.setdefault(fn.name, set()).update(a.value for a in node.args if isinstance(a, ast.Constant))
    return out


def test_every_page_that_runs_a_guarded_measurement_guards_it():
    """A page that calls a run function needing a capability checks that capability with requires()
    (else an older torch shows a traceback). Static, so every page is covered."""
    import ast
    import nbformat

    guarded = _guarded_functions()
    assert {"run_sharding", "run_tensor_parallel", "run_pipelines", "run_comm_timing", "save_sharded"} <= set(guarded)
    seen = []
    for nb_path in sorted((ROOT / "chapters").glob("*/*.ipynb")):
        src = "\n".join(c.source for c in nbformat.read(nb_path, 4).cells if c.cell_type == "code"
                        and not c.source.lstrip().startswith(("%", "!")))
        tree = ast.parse(src)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        needed = set().union(*(caps for fn, caps in guarded.items() if fn in used))
        if "run_overlap" in used and re.search(r"engine\s*=\s*['\"]fsdp['\"]", src):
            needed |= set(NEEDS["fsdp"])
        checked = {a.value for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "requires"
                   for a in n.args if isinstance(a, ast.Constant)}
        assert needed <= checked, f"{nb_path.name} needs {sorted(needed - checked)} without requires()"
        assert not checked - needed - {"fully_shard", "comm_debug_mode", "pipeline_stage", "mem_tracker"}, nb_path.name
        if needed:
            seen.append(nb_path.name)
    # no count to update when a page is added: the pages that need a guard are found, and they exist
    assert "05-shard-the-state.ipynb" in seen and "08-pipelines-for-real.ipynb" in seen, seen


#: (capability hidden, the lightest page of each chapter that needs it). flop_counter and
#: checkpoint_early_stop arrived in 2.1, the floor of every chapter: no page skips for them.
HIDDEN_PAGES = [
    ("mem_tracker", "01-forward-vs-training/02-memory-inventory.ipynb"),
    ("mem_tracker", "02-two-checkpoints/02-memory-against-compute.ipynb"),
    ("comm_debug_mode", "03-distributed-speedup/06-tensor-parallel-for-real.ipynb"),
    ("fully_shard", "03-distributed-speedup/12-save-sharded-state.ipynb"),
    ("pipeline_stage", "03-distributed-speedup/08-pipelines-for-real.ipynb"),
]


@pytest.mark.slow
@pytest.mark.parametrize("hide, page", HIDDEN_PAGES, ids=[f"{h}-{p.split('/')[1][:12]}" for h, p in HIDDEN_PAGES])
def test_a_page_on_a_torch_without_a_capability_runs_and_says_what_it_skipped(monkeypatch, hide, page):
    """The kernel and every process it starts see a torch without ``hide`` (tests/older_torch/sitecustomize.py
    removes it as the older release lacks it), so a page that reached the API around compat would fail."""
    import nbformat
    from nbclient import NotebookClient

    path = ROOT / "chapters" / page
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests" / "older_torch"), str(ROOT)]))
    monkeypatch.setenv("LESSONLIB_TEST_HIDE", hide)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(path, 4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    text = ["".join(o.get("text", "")) for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    cap = compat.FEATURES[hide]
    assert f"pages skip:\n- {cap.what} (needs {cap.api}, torch >= {cap.since})" in text[0]  # the setup cell
    assert any(t.startswith(f"skipped on this torch: {cap.what}") for t in text[1:]), text


def test_pipelines_that_refuse_fewer_microbatches_than_stages_are_missing(monkeypatch):
    """torch 2.7.1 and 2.8.0 (run here): ScheduleGPipe(stage, n_microbatches=1) on 2 stages raises
    ValueError; the pipelines page runs exactly that (the bubble at its largest)."""
    import torch.distributed.pipelining.schedules as schedules

    def refuse(self, stage, n_microbatches, *a, **k):
        if n_microbatches < stage.num_stages:
            raise ValueError(f"Number of microbatches ({n_microbatches}) must be greater than or equal to "
                             f"the number of stages ({stage.num_stages}).")

    assert compat.feature("pipeline_stage") is not None
    monkeypatch.setattr(schedules.ScheduleGPipe, "__init__", refuse)
    assert compat.feature("pipeline_stage") is None
