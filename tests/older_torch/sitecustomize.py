"""Make this torch look like an older one: hide the capabilities named in LESSONLIB_TEST_HIDE.

Put this folder first on PYTHONPATH (tests/test_compat.py does, for a notebook's
kernel and every process it starts) and set LESSONLIB_TEST_HIDE to a
comma-separated list of ``lessonlib.measure.compat.FEATURES`` names. Each is
hidden the way the torch release before it lacks it, so a page that reaches the
API without going through ``compat`` fails here as it would there:

* a module that did not exist (``mem_tracker``, before 2.5; ``comm_debug_mode``,
  ``torch.distributed.tensor.debug``, before 2.5): importing it fails;
* a name its module did not have (``fully_shard`` in ``torch.distributed.fsdp``
  before 2.6, ``FlopCounterMode`` before 2.1, ``set_checkpoint_early_stop``):
  deleted from the module, so ``from module import name`` fails;
* ``pipeline_stage``: ``PipelineStage`` as in 2.4 and 2.5, whose ``__init__``
  requires the example inputs ``input_args``.
"""
import os
import sys

_hide = [n for n in os.environ.get("LESSONLIB_TEST_HIDE", "").split(",") if n]
_MODULES = {"mem_tracker": "torch.distributed._tools.mem_tracker",
            "comm_debug_mode": "torch.distributed.tensor.debug"}
_NAMES = {"fully_shard": ("torch.distributed.fsdp", ["fully_shard"]),
          "flop_counter": ("torch.utils.flop_counter", ["FlopCounterMode", "flop_registry"]),
          "checkpoint_early_stop": ("torch.utils.checkpoint", ["set_checkpoint_early_stop"])}
_unknown = set(_hide) - set(_MODULES) - set(_NAMES) - {"pipeline_stage"}
if _unknown:
    raise SystemExit(f"LESSONLIB_TEST_HIDE names unknown capabilities: {sorted(_unknown)}")

for _name in _hide:
    if _name in _MODULES:
        sys.modules[_MODULES[_name]] = None  # `import` of it raises ImportError
    elif _name in _NAMES:
        import importlib

        _mod = importlib.import_module(_NAMES[_name][0])
        for _attr in _NAMES[_name][1]:
            if hasattr(_mod, _attr):
                delattr(_mod, _attr)
    else:  # pipeline_stage
        import torch.distributed.pipelining as _pp
        import torch.distributed.pipelining.stage as _stage

        class PipelineStage(_stage.PipelineStage):
            """2.4/2.5's signature: input_args is required."""

            def __init__(self, submodule, stage_index, num_stages, device, input_args, output_args=None,
                         group=None, dw_builder=None):
                raise TypeError("PipelineStage as in torch 2.5: this test refuses to build one")

        _pp.PipelineStage = _stage.PipelineStage = PipelineStage
