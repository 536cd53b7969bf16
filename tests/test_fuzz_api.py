"""Property test over lessonlib's whole public API: bad input never hangs, never
passes silently, and is refused with a ValueError/TypeError naming the argument.

The functions and classes are discovered, not listed: every public function
or class defined in a module of ``lessonlib.calc``, ``lessonlib.measure`` or
``lessonlib.book`` is called, so a new one is covered without editing this
file. Each call gets, for one argument at a time (the others from their
defaults, or from ``GOOD`` by argument name), a value drawn by hypothesis
from the kinds an outside fuzz used: negative, zero, NaN, inf,
bool, str and None; numpy scalars and whole floats; huge integers; empty
sequences; wrong spellings of choices; fractions above 1.

Every call must, within ``LIMIT_S`` seconds of CPU time and ``WALL_LIMIT_S``
of wall-clock time (SIGPROF and SIGALRM timers), either

* return -- and then not a NaN from finite input, and not after accepting a
  value that is never valid for that argument (NaN, inf, a bool, a string or
  None where a number belongs; a number where a string belongs; anything but
  True/False where a flag belongs); or
* raise ``ValueError``/``TypeError`` whose message names an argument of the call.

Whole-number arguments must give the same answer for ``4``, ``numpy.int64(4)``
and ``4.0``.

``LESSONLIB_FUZZ_EXAMPLES`` sets the examples per callable (default 12; the
``slow`` test runs 150 each). The totals are printed at the end (``-s``).
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import numbers
import os
import pkgutil
import re
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings, strategies as st  # noqa: E402

#: Per call: this much CPU time (SIGPROF: immune to a busy shared machine) and this
#: much wall-clock time (SIGALRM: catches a call blocked without using the CPU).
LIMIT_S = 5.0
WALL_LIMIT_S = 60.0
PACKAGES = ("lessonlib.calc", "lessonlib.measure", "lessonlib.book")

#: Not called with fuzzed values, and why. Each still checks its arguments
#: before doing any work, which the named tests check directly.
DENY = {
    "lessonlib.measure.models.check_module": "a checker: its error names the argument its caller passes in `name`; "
                                             "test_models checks it directly",
    "lessonlib.measure.models.check_tensor": "a checker: its error names the argument its caller passes in `name`; "
                                             "test_models checks it directly",
    "lessonlib.measure.recovery.train": "trains for up to MAX_STEPS; test_recovery checks its arguments",
    "lessonlib.measure.recovery.TrainingProcess": "starts a process; test_recovery checks arguments first",
    "lessonlib.measure.recovery.run_training": "starts a process; test_recovery checks arguments first",
    "lessonlib.measure.recovery.main": "the command line (argparse exits); TrainingProcess checks before it",
    "lessonlib.measure.distributed.launch.launch": "starts processes; test_interrupt checks arguments first",
    "lessonlib.measure.distributed.worker.run_rank": "a started process's entry: it exits the process; "
                                                     "test_launch_failures checks its arguments",
    "lessonlib.measure.distributed.data_parallel.run_data_parallel": "starts processes; test_interrupt",
    "lessonlib.measure.distributed.scaling.run_scaling": "starts processes; test_scaling checks its arguments",
    "lessonlib.measure.distributed.splits.run_splits": "starts processes; test_interrupt",
    "lessonlib.measure.distributed.splits.run_expert_parallel": "starts processes; test_parallel",
    "lessonlib.measure.distributed.splits.run_stalled_job": "starts processes; test_parallel",
    "lessonlib.measure.crash_demo.crash_twice": "starts and kills training processes; checks its arguments first",
    # the real engine for every split: each starts 2 to 4 processes; test_split_measurements checks arguments first
    "lessonlib.measure.distributed.fsdp.run_sharding": "starts processes; test_split_measurements",
    "lessonlib.measure.distributed.tensor_parallel.run_tensor_parallel": "starts processes; test_split_measurements",
    "lessonlib.measure.distributed.pipelining.run_pipelines": "starts processes; test_split_measurements",
    "lessonlib.measure.distributed.comm_timing.run_comm_timing": "starts processes; test_split_measurements",
    "lessonlib.measure.distributed.sharded_checkpoint.save_sharded": "starts processes; test_split_measurements",
    "lessonlib.measure.distributed.sharded_checkpoint.load_sharded": "starts processes; test_split_measurements",
    "lessonlib.measure.distributed.sequence_parallel.run_sequence_parallel": "starts processes; test_sequence_parallel",
    "lessonlib.measure.distributed.ring_attention.run_ring_attention": "starts processes; test_ring_attention",
    "lessonlib.measure.distributed.overlap.run_overlap": "starts processes; test_overlap checks arguments first",
    "lessonlib.measure.distributed.layout_check.run_layout_check": "starts processes; test_layout_check checks "
                                                                     "arguments first",
}

NAN, INF = float("nan"), float("inf")
BAD = [0, -1, -3, 0.5, 1.5, 1.2, NAN, INF, -INF, True, False, None, "4", "ADAM", "adamw", "", [], (), {},
       10**30, 2**64, 10**400, np.int64(3), np.float64(3.0), 3.0, np.float64(NAN), np.bool_(True)]
NEVER_A_NUMBER = (lambda v: v is None or isinstance(v, (bool, np.bool_, str, list, tuple, dict))
                  or (isinstance(v, float) and not math.isfinite(v)))


def _empty_run():
    """A data-parallel result with no rows: what data_parallel_table accepts."""
    from lessonlib.measure.distributed.data_parallel import DataParallelRun

    return DataParallelRun(world_size=2, backend="gloo", device="cpu", n_params=1, grad_bytes=4,
                           replica_grads_equal=True, replica_weights_equal=True, full_batch_grad_max_diff=0.0,
                           full_batch_grad_max=1.0, rounds=1, rows=[])


def _good():
    """Valid values for required arguments, by name (built lazily: some need torch)."""
    import torch

    from lessonlib.measure import recompute
    from lessonlib.measure.checkpoint import capture_rng_state
    from lessonlib.measure.memory import MemoryLedger
    from lessonlib.measure.timing import StepTiming

    model = recompute.block_stack(layers=2, hidden=8, seed=0)
    x = recompute.make_input(model, batch=2, seq_len=4)
    ledger = MemoryLedger(weights=10, gradients=10, optimizer_state=20, activations=5)
    return {
        "serial": 20, "parallel": 80, "n_bytes": 1000, "tokens_per_expert": [10, 30],
        "device_mtbf_hours": 1000.0, "speedup": 3.0, "checkpoint_seconds": 300.0, "n_params": 1000,
        "seq_len": 8, "batch": 2, "hidden": 16, "heads": 2, "layers": 2, "stages": 4, "microbatches": 8,
        "tasks": [{"stage": 0, "microbatch": 0, "kind": "F", "start": 0.0, "end": 1.0}], "tokens": 1000,
        "total_flops": 1e12, "device_flops_per_s": 1e12, "n_layers": 4, "segments": 2,
        "interval_seconds": 3600.0, "mtbf_seconds": 86400.0, "work_seconds": 86400.0, "n": 1536,
        "state": capture_rng_state(), "obj": {"a": 1}, "step": 5, "steps": 10, "n": 1536, "width": 8,
        "model": model, "x": x, "inputs": x, "targets": torch.zeros(2, 4, 8), "loss_fn": lambda out, targets: out.float().pow(2).mean(),  # a loss that reads no targets
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "fn": lambda: model(x).sum(),
        "strategy": "none", "strategies": ["per-block"], "segment_counts": [1, 2], "checkpointed": False,
        "global_batch": 8, "logits": torch.zeros(2, 4, 5), "dropout": 0.1, "dropout_cls": torch.nn.Dropout,
        "name": "a_name", "value": 1.0, "data": {"a": {"x": 1.0}}, "title": "A title", "ylabel": "bytes",
        "png": b"\x89PNG", "alt": "a picture", "fig": None, "question": "What?", "choices": ["yes", "no"],
        "answer": "yes", "serial_share": 0.2, "interval": 3600.0, "restart_seconds": 0.0,
        "model_name": "1.3B", "optimizer_name": "adam", "precision": "bf16_master", "batch_per_device": 1,
        "recompute": "none", "device_GB": 80, "ledgers": {"plain": ledger}, "t": None,
        "result": _empty_run(), "controls": {"a": [1, 2]}, "timings": None, "recordings": None,
        "sweeps": None, "reference": {1: 1.0, 2: 0.5}, "resumed": {1: 1.0, 2: 0.5}, "run_dir": None,
        "path": None, "src": None, "dst": None, "parts": (), "n_blocks": 2, "seq": 4,
        "collective": "all_reduce", "alpha_s": 1e-5, "beta_bytes_per_s": 1e9, "experts_per_process": 1,
        "runs": [{"rank": r, "wall": [1.0, 2.0, 3.0], "cpu": [1.0, 2.0, 3.0]} for r in (0, 1)], "stall_step": 1,
        "micro_batch": 1, "peak_flops_per_s": 1e15, "utilisation": 0.4, "device_hours": 1000.0,
        "span_seconds": 86400.0, "failures": 3, "useful_fraction": 0.9, "checkpoint_bytes": 1e9,
        "bandwidth_bytes_per_s": 1e9, "shapes": [(4, 3), ()], "rank": 0, "stage": 1,
        # by function, where an argument's name means something else elsewhere ("function.argument")
        "hash_rate.blob": b"checkpoint bytes" * 256, "fit_alpha_beta.n_bytes": [1e3, 1e5, 1e7], "fit_alpha_beta.seconds": [1e-4, 2e-4, 1e-2],
        "relative_errors.n_bytes": [1e3, 1e5], "relative_errors.seconds": [1e-4, 2e-4],
        "relative_errors.link": _link(), "fsdp_shard_rows.rows": 10, "static_text.name": "widgets.css",
        "plot_resume_comparison.resumed": {"resumed": {1: 1.0, 2: 0.5}}, "plan_html.model": "1.3B", "plan_html.optimizer": "adam",
        "zero_report.model": "1.3B", "memory_multiplier.optimizer": "adam", "feature.name": "flop_counter",
        "require.name": "flop_counter", "as_device.name": "device", "as_device.value": "cpu", "threads.n": 1,
        "lm_loss.targets": torch.zeros(2, 4, dtype=torch.long), "SingleChoice.choices": _choices(),
        "MultipleSelect.choices": _choices(), "stall_s": 5.0, "save_minutes": 5.0, "mtbf_hours": 24.0,
        "grad_bytes": 10**9, "ns": [1, 2, 4, 8], "shares": [0.0, 0.1], "share": 0.1, "fixed": 0.05,
        "per_step": 0.01, "ckpt_s": 300.0, "restart_s": 60.0, "micro": 4, "idle": 0.2, "header": ["a", "b"],
        "table.rows": [[1, 2]], "xs": [1.0, 2.0, 3.0], "times": [1.0, 2.0],
        "kind": "a_kind", "round_fn": lambda clock: clock.time("a", sum, range(10)), "rounds": 2,
        "losses": [1.0, 0.5, 0.5], "op_name": "c10d.allreduce_", "where": "layers.0.mlp.fc1", "batches": [1, 2],
        "enable": True, "mode": "fp32", "X": torch.ones(4, 2), "y": torch.ones(4, 1), "markdown": "Some *text*.",
        "sizes": [1e3, 1e5], "plot_alpha_beta.seconds": [1e-4, 2e-4], "link": _link(), "Clock.device": torch.device("cpu"),
        "items": [((2, 3, 1), "float32", 24)], "format_value.figure": _published(), "W": torch.ones(2, 1, dtype=torch.bfloat16),
        "b": torch.zeros(1, dtype=torch.bfloat16), "lr": 0.01, "compare_states.a": {"w": torch.zeros(2)},
        "compare_states.b": {"w": torch.zeros(2)}, "plot_goodput_failures.world_sizes": [1, 2],
        "plot_goodput_failures.rows": {"MTBF 1000 h": _goodputs()}, "no_failure": [1.0, 0.95],
        "per_rank_spans": [[("F", 0, 0.0, 1.0), ("B", 0, 1.0, 3.0)], [("F", 0, 1.0, 2.0), ("B", 0, 2.0, 4.0)]],
        "data_parallel_figure.rows": [_dp_row(8), _dp_row(32)], "world_size": 2,
        "proposal_html.layouts": _layouts(), "traffic_summary.records": [("all_reduce", "backward", 1000)],
        "bucket_bytes": 4096, "t_compute_per_bucket": 2.0, "t_comm_per_bucket": 1.0, "buckets": 8,
        "t_serial": 10.0, "t_step": 7.0, "t_comm": 4.0, "overlap_table.run": _overlap_run(), "compute": 0.005,
        "timeline": _overlap_timeline(),
        "noise_scale": 1024, "min_steps": 1000, "examples": 4096, "scaling_table.run": _scaling_run(),
        "scaling_display_rows.run": _scaling_run(),
    }


def _overlap_row():
    from lessonlib.measure.distributed.overlap import OverlapRow

    return OverlapRow(variant="ddp", label="DDP", step=0.007, comm=0.003, exposed=0.002, hidden=0.33,
                      hidden_raw=0.33, exposed_rounds=(0.002, 0.003))


def _overlap_run():
    """A DDP overlap result as run_overlap returns it (two processes, two rounds)."""
    from lessonlib.measure.distributed.overlap import OverlapRun

    return OverlapRun(world_size=2, backend="gloo", device="cpu", hidden=64, layers=2, n_params=8320,
                      param_bytes=33280, bucket_cap_bytes=4096, ddp_bucket_bytes=[16640, 16640],
                      hook_bucket_bytes=[16640, 16640], grad_max_diff={"ddp": 0.0}, grad_max=1.0,
                      fsdp_collectives={}, compute=0.005, rounds=2, rows=[_overlap_row()],
                      timeline=_overlap_timeline(), per_round={"compute": [0.005, 0.004], "ddp": [0.007, 0.007],
                                                               "allreduce": [0.003, 0.003]})


def _overlap_timeline():
    step = {"forward": (0.0, 0.001), "backward": (0.001, 0.004), "end": 0.005,
            "comm": [{"bucket": 0, "bytes": 4096, "start": 0.002, "end": 0.003},
                     {"bucket": 1, "bytes": 4096, "start": 0.004, "end": 0.005}]}
    return [{"DDP": dict(step)}, {"DDP": dict(step)}]


def _scaling_run():
    """A strong-against-weak scaling result as run_scaling returns it (two processes)."""
    from lessonlib.measure.distributed.scaling import ScalingRow, ScalingRun

    rows = [ScalingRow("one", 1, 8, 8, 4, 32, 0.04, 1.0), ScalingRow("strong", 2, 8, 4, 4, 32, 0.03, 4 / 3),
            ScalingRow("weak", 2, 16, 8, 2, 32, 0.025, 1.6)]
    return ScalingRun(world_size=2, backend="gloo", device="cpu", examples=32, rounds=3, rows=rows)


def _dp_row(batch):
    from lessonlib.measure.distributed.data_parallel import DataParallelRow

    return DataParallelRow(global_batch=batch, per_process_batch=batch // 2, single=0.01, ddp=0.007,
                           half_compute=0.005, optimizer=0.001, allreduce=0.001, predicted=0.007,
                           ddp_backward=0.004, speedup=1.4, predicted_speedup=1.4, predicted_over_measured=1.0,
                           latency=0.0001)


def _layouts():
    from lessonlib.calc.planner import propose

    return propose(7.5e9, layers=32, hidden=4096, heads=32)


def _published():
    from lessonlib.calc.published import LLAMA3_405B

    return LLAMA3_405B["layers"]


def _goodputs():
    from lessonlib.calc.goodput import goodput

    return [goodput(1, 1.0, 1000.0, 300.0), goodput(2, 1.9, 1000.0, 300.0)]


def _choices():
    from lessonlib.book.quiz import Choice

    return [Choice("yes", correct=True), "no"]


def _link():
    from lessonlib.calc.comm import LINKS

    return LINKS["nvlink"]


def _discover():
    found = []
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        names = [pkg_name] + [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg_name + ".")]
        for mod_name in names:
            mod = importlib.import_module(mod_name)
            for name, obj in vars(mod).items():
                if name.startswith("_") or getattr(obj, "__module__", None) != mod_name:
                    continue
                if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                    continue
                if inspect.isclass(obj) and (dataclasses.is_dataclass(obj) or issubclass(obj, BaseException)):
                    continue  # result records the library fills in, and exception types: not inputs
                if inspect.isclass(obj) and issubclass(obj, str):
                    continue  # a str subclass (glue.Text) accepts what str accepts
                found.append(f"{mod_name}.{name}")
    return sorted(found)


DISCOVERED = _discover()
COVERED = [q for q in DISCOVERED if q not in DENY]
STATS = {"functions": set(), "calls": 0, "returned": 0, "refused": 0, "repeats": 0, "failures": []}

#: The inputs (by :func:`_input_key`) already called and passed in this process. The deep test draws
#: from the same derandomized stream as the bounded-time one, so its first examples are the same inputs,
#: and the stream repeats an input now and then (a spoiled argument drawn twice with the same value):
#: about one call in ten was an exact repeat, and a figure's call renders for about a second.
PASSED: set = set()


class _NotPlain(Exception):
    pass


def _plain_key(value):
    """``value`` as a key of its type and repr, for values whose repr is all they are (numbers, text,
    None, and lists, tuples and dicts of them); anything else (an object, a tensor, a path) raises
    _NotPlain, so an input holding one is always called."""
    if value is None or type(value) in (bool, int, float, complex, str, bytes) or isinstance(value, np.generic):
        return type(value).__module__, type(value).__qualname__, repr(value)
    if type(value) in (list, tuple):
        return type(value).__name__, tuple(_plain_key(v) for v in value)
    if type(value) is dict:
        return "dict", tuple((_plain_key(k), _plain_key(v)) for k, v in value.items())
    raise _NotPlain


def _input_key(qualname, kwargs):
    """The key of one call's whole input, or None where an argument is not plain (see _plain_key)."""
    try:
        return qualname, tuple((name, _plain_key(v)) for name, v in sorted(kwargs.items()))
    except _NotPlain:
        return None


def _resolve(qualname):
    mod, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(mod), name)


class _Timeout(BaseException):
    """Raised by the alarm: a BaseException, so no `except Exception` in the library swallows it."""


def _call_with_limit(fn, kwargs):
    def alarm(*_):
        raise _Timeout

    old = signal.signal(signal.SIGALRM, alarm), signal.signal(signal.SIGPROF, alarm)
    signal.setitimer(signal.ITIMER_REAL, WALL_LIMIT_S)
    signal.setitimer(signal.ITIMER_PROF, LIMIT_S)
    try:
        return "returned", fn(**kwargs)
    except _Timeout:
        return "timeout", None
    except Exception as err:  # noqa: BLE001 - classified below
        return "raised", err
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGALRM, old[0])
        signal.signal(signal.SIGPROF, old[1])
        if "matplotlib.pyplot" in sys.modules:  # figures the plot functions returned
            sys.modules["matplotlib.pyplot"].close("all")


def _kind(param):
    """What the argument must be, from its default or annotation: number, text, flag, or None (unknown)."""
    d, ann = param.default, str(param.annotation)
    if isinstance(d, bool) or "bool" in ann:
        return "flag"
    if (isinstance(d, (int, float)) and not isinstance(d, bool)) or (d is inspect.Parameter.empty or d is None) \
            and ("int" in ann or "float" in ann) and "str" not in ann and "Sequence" not in ann and "Mapping" not in ann:
        return "number"
    if isinstance(d, str) or ann in ("str", "'str'"):
        return "text"
    return None


def _never_valid(kind, value, param):
    if kind == "number":
        if value is None and (param.default is None or "None" in str(param.annotation)):
            return False  # None is a stated value: a None default, or `int | None` (num_threads: keep the setting)
        if isinstance(param.default, (int, float)) and not isinstance(param.default, bool) and param.default >= 0 \
                and isinstance(value, (int, float, np.number)) and not isinstance(value, bool) and value < 0:
            return True  # a default of zero or more: a size, a time, a count; never negative
        return NEVER_A_NUMBER(value)
    if kind == "text":
        return not isinstance(value, str) and not (value is None and param.default is None)
    if kind == "flag":
        return not isinstance(value, (bool, np.bool_))
    return False


def _finite_inputs(kwargs):
    for v in kwargs.values():
        if isinstance(v, (float, np.floating)) and not math.isfinite(v):
            return False
    return True


def _is_nan(result):
    vals = [result] if not dataclasses.is_dataclass(result) else list(dataclasses.asdict(result).values())
    return any(isinstance(v, float) and math.isnan(v) for v in vals)


#: The value put in the spoiled argument. Drawn by @given, not inside the test: building the
#: strategies and drawing them interactively for every example was a third of the fuzz's own time.
VALUES = st.one_of(st.sampled_from(BAD), st.integers(-10, 10**6), st.floats(allow_nan=True, allow_infinity=True))


def _run_one(qualname, fn, params, spoil, value, good, data, tmp_path):
    kwargs = {}
    for p in params:
        if p.name == spoil:
            kwargs[p.name] = value
        elif p.default is not inspect.Parameter.empty:
            continue
        elif good.get(f"{qualname.rpartition('.')[2]}.{p.name}", good.get(p.name)) is not None:
            kwargs[p.name] = good.get(f"{qualname.rpartition('.')[2]}.{p.name}", good.get(p.name))
        elif p.name in ("run_dir", "path", "src", "dst"):
            kwargs[p.name] = tmp_path / f"{p.name}-dir"
        else:
            kwargs[p.name] = data.draw(st.sampled_from(BAD), label=p.name)
    if spoil in ("path", "run_dir", "dst") and isinstance(value, str) and value:
        kwargs[spoil] = str(tmp_path / value)  # never write into the working directory
    key = _input_key(qualname, kwargs)
    if key is not None and key in PASSED:  # the same input, checked and passed before in this process
        STATS["repeats"] += 1
        return
    cwd = os.getcwd()
    os.chdir(tmp_path)
    CLOCK.asked = 0.0
    try:
        how, out = _call_with_limit(fn, kwargs)
    finally:
        os.chdir(cwd)
    if CLOCK.asked > WALL_LIMIT_S:  # pauses asked for and not waited out (_AskedClock) count as waiting
        how, out = "timeout", None
    STATS["calls"] += 1
    shown = {k: (v if not hasattr(v, "shape") else f"<{type(v).__name__}>") for k, v in kwargs.items()}
    problem = None
    if how == "timeout":
        problem = f"no answer within {LIMIT_S} s of CPU time or {WALL_LIMIT_S} s of wall time"
    elif how == "raised":
        names = [p.name for p in params]
        if not isinstance(out, (ValueError, TypeError)):
            problem = f"raw {type(out).__name__}: {out}"
        elif not any(n in str(out) for n in names):
            problem = f"{type(out).__name__} not naming an argument: {out}"
        else:
            STATS["refused"] += 1
    else:
        STATS["returned"] += 1
        param = next(p for p in params if p.name == spoil)
        if _never_valid(_kind(param), value, param):
            problem = f"silently accepted {spoil}={value!r}"
        elif _finite_inputs(kwargs) and _is_nan(out):
            problem = "NaN result from finite input"
    if problem:
        STATS["failures"].append(f"{qualname}({shown}): {problem}")
    assert problem is None, f"{qualname}({shown}): {problem}"
    if key is not None:
        PASSED.add(key)


def _params(fn):
    target = fn.__init__ if inspect.isclass(fn) else fn
    sig = inspect.signature(target)
    return [p for p in sig.parameters.values() if p.name != "self"
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _examples():
    return int(os.environ.get("LESSONLIB_FUZZ_EXAMPLES", "12"))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """torch on one thread while fuzzing. The limit is CPU time, and on a busy two-core machine
    (the test run keeps both cores busy) a second intra-op thread spin-waits for the first,
    which counts as CPU time without doing work: a call that takes 1.7 s of CPU on an idle machine
    went over 5 s that way."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


class _AskedClock:
    """Stands in for the ``time`` module of the modules whose functions pause on purpose (a slow
    save's ``slow_write_seconds``, a demonstration delay of up to a minute): a pause is added up,
    not waited out. The fuzz is about what a function does with its arguments; waiting out the
    pauses it draws left a core idle for 18 s of each run. A call's pauses count against
    ``WALL_LIMIT_S`` (see ``_run_one``), so a call that would hang by sleeping still fails."""

    def __init__(self):
        self.asked = 0.0

    def __getattr__(self, name):
        return getattr(time, name)

    def sleep(self, seconds):
        if isinstance(seconds, numbers.Real) and not isinstance(seconds, bool) and seconds > 0:
            self.asked += float(seconds)  # an infinite pause too: counted, and over the limit
        else:
            time.sleep(seconds)  # zero, or what the real call refuses (negative, NaN, not a number)


CLOCK = _AskedClock()
PAUSING = ("lessonlib.measure.checkpoint", "lessonlib.measure.overlap_sim")  # modules that call time.sleep in a callable fuzzed here


@pytest.fixture(scope="module", autouse=True)
def pauses_are_counted_not_waited():
    with pytest.MonkeyPatch.context() as mp:
        for name in PAUSING:
            mp.setattr(importlib.import_module(name), "time", CLOCK)
        yield


def test_every_fuzzed_callable_that_pauses_is_counted_not_waited():
    """A fuzzed callable that sleeps would make the fuzz wait: its module must be in PAUSING."""
    sleeping = {q.rpartition(".")[0] for q in COVERED if "sleep(" in inspect.getsource(_resolve(q))}
    assert sleeping, "atomic_save pauses on purpose: the check below must see it"
    assert sleeping <= set(PAUSING), f"callables that sleep in modules not in PAUSING: {sleeping - set(PAUSING)}"


@pytest.fixture(scope="module")
def good():
    return _good()


def _fuzz(qualname, good, tmp_path, examples):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("the per-call time limit needs SIGALRM in the main thread")
    fn = _resolve(qualname)
    params = _params(fn)
    STATS["functions"].add(qualname)
    if not params:  # nothing to spoil: it must simply answer in time
        how, out = _call_with_limit(fn, {})
        STATS["calls"] += 1
        assert how == "returned", f"{qualname}(): {how} {out!r}"
        STATS["returned"] += 1
        return

    # No shrinking: a failing example is reported as drawn (each call is already small),
    # which keeps a failing run as bounded in time as a passing one.
    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(spoil=st.sampled_from([p.name for p in params]), value=VALUES, data=st.data())
    def prop(spoil, value, data):
        _run_one(qualname, fn, params, spoil, value, good, data, tmp_path)

    prop()


@pytest.mark.parametrize("qualname", COVERED)
def test_bad_input_is_refused_in_bounded_time(qualname, good, tmp_path):
    _fuzz(qualname, good, tmp_path, _examples())


def _laid_out_only(fig) -> bytes:
    """Stands in for :mod:`lessonlib.book.figures`' PNG encoders in the deep fuzz: every artist is still
    drawn (``draw_without_rendering`` runs the same draw code, so a value that breaks a plot still raises),
    but no pixels are rasterised and no PNG is encoded."""
    fig.draw_without_rendering()
    return b""


@pytest.fixture
def figures_laid_out_not_encoded(qualname):
    """The deep fuzz, and the fuzz of result structures, lay each accepted figure out once, without encoding PNGs.

    It is about what a function accepts and refuses, and for a figure function the PNGs were most
    of its time (a desktop and a phone PNG, each laid out twice by ``bbox_inches="tight"``): about
    130 of the run's 430 unit-test seconds went to encoding images no one looked at. The PNGs
    themselves are still made for every fuzzed input of ``test_bad_input_is_refused_in_bounded_time``
    (the same functions, fewer examples), for every figure in the notebooks, and checked by
    tests/test_figures.py and tests/test_plots_phone.py. ``show`` and ``Figure`` are fuzzed as they are."""
    from lessonlib.book import figures

    with pytest.MonkeyPatch.context() as mp:
        if not qualname.startswith("lessonlib.book.figures."):
            mp.setattr(figures, "_png", _laid_out_only)
            # One layout an input is enough to find a value that breaks a plot: the passes ``show`` adds
            # after the figure function returns (tick labels pulled apart, the phone version) take the same
            # figure whatever the input, and were three quarters of these tests' time. They run in full
            # under the shallow fuzz and in tests/test_figures.py and tests/test_plots_phone.py.
            mp.setattr(figures, "untangle_tick_labels", lambda fig: False)
            mp.setattr(figures, "for_phone", lambda fig: False)
        yield


@pytest.fixture
def streaming_on_a_small_tensor(qualname):
    """The deep fuzz of ``measure_streaming`` times a 2 MiB tensor, not twice the last-level cache (64 MiB here):
    what it accepts and refuses does not depend on the cache, and each accepted call took a tenth of a second.
    The page (1.5) and tests/test_roofline.py time the full size."""
    from lessonlib.measure import roofline

    with pytest.MonkeyPatch.context() as mp:
        if qualname == "lessonlib.measure.roofline.measure_streaming":
            mp.setattr(roofline, "last_level_cache_bytes", lambda device=None: 2**20)
        yield


@pytest.mark.slow
@pytest.mark.parametrize("qualname", COVERED)
def test_bad_input_deep(qualname, good, tmp_path, figures_laid_out_not_encoded, streaming_on_a_small_tensor):
    _fuzz(qualname, good, tmp_path, 150)


@pytest.mark.parametrize("qualname", [q for q in COVERED if q.startswith("lessonlib.calc.")])
def test_counts_take_numpy_integers_and_whole_floats_alike(qualname):
    """For every whole-number argument (default an int): 4, numpy.int64(4) and 4.0 give the same answer."""
    fn = _resolve(qualname)
    for p in _params(fn):
        if not isinstance(p.default, int) or isinstance(p.default, bool) or p.default < 1:
            continue
        answers = []
        for v in (p.default, np.int64(p.default), float(p.default)):
            how, out = _call_with_limit(fn, {**{q.name: _good_calc(q.name) for q in _params(fn)
                                                if q.default is inspect.Parameter.empty}, p.name: v})
            answers.append((how, out if how == "returned" else type(out).__name__))
        assert answers[0] == answers[1] == answers[2], (qualname, p.name, answers)


def _good_calc(name):
    return {"serial": 20, "parallel": 80, "world_size": 4, "n_bytes": 1000, "device_mtbf_hours": 1000.0,
            "speedup": 3.0, "checkpoint_seconds": 300.0, "n_params": 1000, "seq_len": 8, "batch": 2,
            "hidden": 16, "heads": 2, "layers": 2, "stages": 4, "microbatches": 8, "tokens": 1000,
            "total_flops": 1e12, "device_flops_per_s": 1e12, "n_layers": 4, "segments": 2,
            "interval_seconds": 3600.0, "mtbf_seconds": 86400.0, "work_seconds": 86400.0, "n": 1536,
            "tokens_per_expert": [1, 3], "serial_share": 0.2,
            "tasks": [{"stage": 0, "microbatch": 0, "kind": "F", "start": 0.0, "end": 1.0}]}.get(name)


def test_every_deny_list_entry_exists_and_another_test_calls_it():
    """No count to raise when a split gains a runner: each entry must still be public, and some other test
    module must call it (its argument checks are tested there, as the entry's reason says)."""
    here = Path(__file__)
    others = {p: p.read_text() for p in here.parent.glob("test_*.py") if p != here}
    for qualname in DENY:
        assert qualname in DISCOVERED, f"{qualname} is no longer public: drop it from DENY"
        name = qualname.rsplit(".", 1)[1]
        assert any(re.search(rf"\b{name}\(", text) for text in others.values()), \
            f"{qualname} is deny-listed, but no other test calls it: test its argument checks directly"


def teardown_module(module):
    if STATS["calls"]:
        sys.__stdout__.write(
            f"\n[fuzz] callables discovered: {len(DISCOVERED)}, covered: {len(STATS['functions'])} "
            f"(deny-listed: {len(DENY)}), inputs tried: {STATS['calls']} "
            f"(returned {STATS['returned']}, refused with a named argument {STATS['refused']}; "
            f"exact repeats of a passed input, not called again: {STATS['repeats']}), "
            f"failures: {len(STATS['failures'])}\n")
        for f in STATS["failures"][:200]:
            sys.__stdout__.write(f"  FAIL {f[:300]}\n")


# --- values valid one by one, drawn together ---------------------------------------------
#
# The fuzz above spoils one argument at a time. Here every numeric argument of a calculation (and of
# the calculators the pages show) is drawn at once from values that are each valid somewhere: small
# and large counts, fractions, the smallest and largest floats. Every outcome must be a refusal that
# names an argument, or a result in its physical range: finite, not negative (bytes, seconds, FLOPs),
# and a fraction or a utilisation within [0, 1].

COMBO_POOL = [1, 2, 3, 4, 7, 8, 32, 4096, 10**6, 10**9, 0.5, 0.999, 5e-324, 1e-300, 1e300, 2**60]
#: Results that may be negative by definition (a difference, or a time the inverse formula finds impossible).
SIGNED = {"lessonlib.calc.pricing.restart_for_useful_fraction", "lessonlib.calc.comm.relative_errors",
          "lessonlib.book.split_reports.comm_rows"}
#: Fields (of a result dataclass or dict) and whole results that are fractions of a whole.
FRACTION_FIELDS = ("useful_fraction", "cpu_share", "utilisation", "idle_share", "goodput", "share")
FRACTION_RESULTS = {"lessonlib.calc.pricing.implied_utilisation", "lessonlib.measure.distributed.pipelining.idle_share"}
COMBO_STATS = {"calls": 0, "ok": 0, "refused": 0, "raw": [], "unnamed": [], "nonsense": [], "timeout": []}
STRUCT_STATS = {"calls": 0, "ok": 0, "refused": 0, "raw": [], "unnamed": [], "nonsense": [], "accepted": [],
                "timeout": []}


def _numbers_in(value, where="result", depth=0):
    """(where, number) for every real number in a result: dataclass fields, dict values, list items."""
    if depth > 6:
        return
    if isinstance(value, (bool, np.bool_)):
        return
    if isinstance(value, numbers.Real):
        yield where, float(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _numbers_in(getattr(value, f.name), f.name, depth + 1)
        for prop in ("goodput", "total", "added", "fits"):  # computed properties pages read
            if isinstance(getattr(type(value), prop, None), property):
                try:
                    yield from _numbers_in(getattr(value, prop), prop, depth + 1)
                except (ValueError, TypeError, ZeroDivisionError) as err:  # a property that refuses is fine
                    yield prop, err
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers_in(v, str(k), depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _numbers_in(v, where, depth + 1)
    elif isinstance(value, str) and not hasattr(value, "savefig"):
        import re

        if re.search(r"(?<![\w.])(nan|-?inf)(?![\w])", value, re.I) or "nan %" in value:
            yield where, math.nan


def _out_of_range(qualname, result):
    """Why ``result`` is not a result in its physical range, or None."""
    for where, v in _numbers_in(result):
        if isinstance(v, BaseException):
            return f"{where} raised {type(v).__name__}: {v}"
        if not math.isfinite(v):
            return f"{where} = {v!r}"
        if v < 0 and qualname not in SIGNED:
            return f"{where} = {v!r} is negative"
        fraction = qualname in FRACTION_RESULTS if where == "result" else \
            any(where == f or where.endswith("_" + f) for f in FRACTION_FIELDS)
        if fraction and v > 1 + 1e-9:
            return f"{where} = {v!r} is a fraction above 1"
    return None


def _names(message, params):
    """Whether a refusal names an argument: it starts with one ("lr must be ...", "unknown model ..."), or
    names one as the subject of a clause ("runs[0]['wall'] must ...", "mlp's hidden", "world_size=2 must").
    A bare word is not enough: "not enough values to unpack (expected 3, got 2)" names no argument
    called ``expected``."""
    import re

    return any(re.match(rf"(unknown )?{re.escape(p)}\b", message)
               or re.search(rf"\b{re.escape(p)}(\[|'s\b|=| must| has| is| does| lacks| give| holds| \(|:)", message)
               for p in params)


def _classify(qualname, params, how, out, stats):
    """Count one outcome; return the problem (a string) or None."""
    stats["calls"] += 1
    if how == "timeout":
        stats["timeout"].append(qualname)
        return "timeout"
    if how == "raised":
        if not isinstance(out, (ValueError, TypeError)):
            stats["raw"].append(f"{qualname}: {type(out).__name__}: {str(out)[:120]}")
            return f"raw {type(out).__name__}: {out}"
        if not _names(str(out), params):
            stats["unnamed"].append(f"{qualname}: {str(out)[:120]}")
            return f"{type(out).__name__} naming no argument: {out}"
        stats["refused"] += 1
        return None
    bad = _out_of_range(qualname, out)
    if bad:
        stats["nonsense"].append(f"{qualname}: {bad}")
        return f"returned out of range: {bad}"
    stats["ok"] += 1
    return None


def _combo_targets():
    out = []
    for q in COVERED:
        if not (q.startswith("lessonlib.calc.") or q.startswith("lessonlib.book.reports.")
                or q.startswith("lessonlib.book.split_reports.")):
            continue
        fn = _resolve(q)
        if inspect.isclass(fn):
            continue
        nums = [p.name for p in _params(fn) if _kind(p) == "number"
                or isinstance(_GOOD_NUMBERS.get(p.name), (int, float))]
        if len(nums) >= 2:
            out.append(q)
    return out


#: Numeric arguments by name, where a function gives no default (the fuzz's GOOD, numbers only).
_GOOD_NUMBERS = {k: v for k, v in {
    "serial": 20, "parallel": 80, "world_size": 4, "n_bytes": 1000, "device_mtbf_hours": 1000.0, "speedup": 3.0,
    "checkpoint_seconds": 300.0, "n_params": 1000, "seq_len": 8, "batch": 2, "hidden": 16, "heads": 2, "layers": 2,
    "stages": 4, "microbatches": 8, "tokens": 1000, "total_flops": 1e12, "device_flops_per_s": 1e12, "n_layers": 4,
    "segments": 2, "interval_seconds": 3600.0, "mtbf_seconds": 86400.0, "work_seconds": 86400.0, "n": 1536,
    "alpha_s": 1e-5, "beta_bytes_per_s": 1e9, "micro_batch": 1, "peak_flops_per_s": 1e15, "utilisation": 0.4,
    "device_hours": 1000.0, "span_seconds": 86400.0, "failures": 3, "useful_fraction": 0.9,
    "checkpoint_bytes": 1e9, "bandwidth_bytes_per_s": 1e9, "serial_share": 0.2, "interval": 3600.0,
    "restart_seconds": 0.0, "batch_per_device": 1, "device_GB": 80, "save_minutes": 5.0, "mtbf_hours": 24.0,
    "stage": 1, "experts_per_process": 1}.items()}

COMBO_TARGETS = _combo_targets()


def _combos(qualname, good, examples):
    import random

    fn = _resolve(qualname)
    params = _params(fn)
    rng = random.Random(qualname)
    problems = []
    for _ in range(examples):
        kwargs = {}
        for p in params:
            if _kind(p) == "number" or isinstance(_GOOD_NUMBERS.get(p.name), (int, float)):
                kwargs[p.name] = rng.choice(COMBO_POOL)
            elif p.default is inspect.Parameter.empty:
                v = good.get(f"{qualname.rpartition('.')[2]}.{p.name}", good.get(p.name))
                if v is None:
                    break
                kwargs[p.name] = v
        else:
            how, out = _call_with_limit(fn, kwargs)
            problem = _classify(qualname, [p.name for p in params], how, out, COMBO_STATS)
            if problem:
                problems.append(f"{qualname}({kwargs}): {problem}")
    return problems


@pytest.mark.parametrize("qualname", COMBO_TARGETS)
def test_values_valid_alone_are_checked_together(qualname, good):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("the per-call time limit needs SIGALRM in the main thread")
    problems = _combos(qualname, good, int(os.environ.get("LESSONLIB_FUZZ_COMBOS", "20")))
    assert not problems, "\n".join(problems[:10])


# --- the structures pages pass between functions, mutated field by field ---------------------------
#
# Report rows, plans, run results: each is built valid (the shape a page passes), then one field at a
# time is spoiled: set to 0, -1, NaN, inf, the smallest float, None or a string; a key dropped; a list
# or tuple cut short or emptied. Every outcome must be a refusal naming an argument or a result in
# range, and a spoiled number that is never valid (NaN, inf, a string) must not be accepted silently.

NEVER_VALID_LEAVES = (math.nan, math.inf, "x")
LEAF_MUTATIONS = (0, -1, math.nan, math.inf, 5e-324, None, "x")


def _structure_samples():
    """Valid structures as pages pass them, by the function that reads them (kwargs of one call)."""
    from lessonlib.calc.comm import LINKS
    from lessonlib.calc.planner import propose
    from lessonlib.measure.memory import MemoryLedger
    from lessonlib.measure.recompute import SweepPoint
    from lessonlib.measure.timing import StepTiming
    from lessonlib.measure.distributed.data_parallel import DataParallelRun

    ledger = MemoryLedger(weights=4096, gradients=4096, optimizer_state=8192, activations=2048, peak=20000)
    phases = ("prediction", "forward", "loss", "backward", "optimizer", "step")
    secs = dict(zip(phases, (0.001, 0.002, 0.0005, 0.004, 0.001, 0.0075)))
    timing = StepTiming(seconds=secs, ratios={k: v / 0.001 for k, v in secs.items()},
                        shares={k: secs[k] / 0.0075 for k in phases[1:5]}, rounds={k: [v, v] for k, v in secs.items()})
    dp = DataParallelRun(world_size=2, backend="gloo", device="cpu", n_params=1000, grad_bytes=4000,
                         replica_grads_equal=True, replica_weights_equal=True, full_batch_grad_max_diff=0.0,
                         full_batch_grad_max=1.0, rounds=3, rows=[_dp_row(8), _dp_row(32)])
    spans = [[["F", 0, 0.0, 1.0], ["B", 0, 2.0, 4.0]], [["F", 0, 1.0, 2.0], ["B", 0, 2.0, 3.0]]]
    pipe = {"world_size": 2, "backend": "gloo", "runs": [
        {"schedule": "GPipe", "microbatches": 2, "steps": [{"spans": spans, "idle_share": 0.25,
                                                             "peak_bytes": [200, 120], "left_bytes": [0, 0]}]},
        {"schedule": "1F1B", "microbatches": 2, "steps": [{"spans": spans, "idle_share": 0.25,
                                                            "peak_bytes": [200, 60], "left_bytes": [0, 0]}]}]}
    spans5 = [[["F", 0, 0.0, 1.0, 0], ["B", 0, 2.0, 4.0, 0]], [["F", 0, 1.0, 2.0, 1], ["B", 0, 2.0, 3.0, 1]]]
    pipe5 = {"world_size": 2, "backend": "gloo", "runs": [
        {"schedule": "1F1B", "microbatches": 1, "steps": [{"spans": spans5, "idle_share": 0.25,
                                                            "peak_bytes": [200, 60], "left_bytes": [0, 0]}]}]}
    from lessonlib.measure.distributed.fsdp import ShardedRank, ShardingRun

    held = {"weights": 2000, "gradients": 2000, "optimizer_state": 4000, "step_counters": 8}
    shard_rank = lambda r: ShardedRank.from_worker({  # noqa: E731
        "rank": r, "world_size": 2, "backend": "gloo", "n_params": 1000, "shapes": [(1000,)], "n_tensors": 1,
        "zero3": held, "zero1": {**held, "weights": 4000, "gradients": 4000},
        "losses": [5.0, 4.5], "reference_losses": [5.0, 4.5],
        "zero3_collectives": [["all_gather", "forward", 4000], ["reduce_scatter", "backward", 4000]],
        "keep_collectives": [["all_gather", "forward", 2000], ["reduce_scatter", "backward", 4000]]})
    shard_run = ShardingRun({2: (shard_rank(0), shard_rank(1))})
    from lessonlib.measure.distributed.comm_timing import CommTiming

    comm = CommTiming.from_worker({
        "world_size": 2, "backend": "gloo", "all_reduce": [[4096, [0.003, 0.001]]], "all_gather": [[4096, [0.002]]],
        "reduce_scatter": [[4096, [0.002]]],
        "ddp": {"grad_bytes": 4096, "bucket_bytes": [4096], "bucket_times": [[0.002, 0.001]],
                "backward": [0.010, 0.012], "backward_no_sync": [0.008, 0.009]},
        "fsdp": {"collectives": [["all_gather", 4096]], "n_params": 1024, "replay_each": [[0.002, 0.001]],
                 "step": [0.05]}})
    runs = [{"rank": r, "wall": [1.0, 2.0, 5.0, 6.0], "cpu": [0.9, 1.8, 2.1, 3.0]} for r in (0, 1)]
    experts = [{"rank": r, "tokens_per_expert": [30, 10, 10, 10], "tokens_processed": t, "expert_seconds": s}
               for r, t, s in ((0, 40, 0.004), (1, 20, 0.002))]
    sweeps = {"model": [SweepPoint(1, 4000, 3000, 0.0), SweepPoint(2, 3000, 2000, 0.5),
                        SweepPoint("per-block", 2500, 1000, 1.0)]}
    return {
        "lessonlib.book.reports.data_parallel_table": dict(result=dp),
        "lessonlib.book.reports.data_parallel_display_rows": dict(result=dp),
        "lessonlib.book.speedup_plots.data_parallel_figure": dict(rows=list(dp.rows), world_size=2),
        "lessonlib.book.reports.ledger_table": dict(ledgers={"a": ledger}, formula={"total": 18000}),
        "lessonlib.book.plots.plot_ledger": dict(ledgers={"a": ledger}),
        "lessonlib.book.reports.timing_table": dict(t=timing),
        "lessonlib.book.plots.plot_timing": dict(timings={"a": timing}),
        "lessonlib.book.reports.proposal_html": dict(layouts=propose(7.5e9, layers=32, hidden=4096, heads=32)),
        "lessonlib.book.plots.plot_resume_comparison": dict(reference={1: 1.0, 2: 0.5}, resumed={"r": {2: 0.5}},
                                                            resumed_from=1),
        "lessonlib.book.plots.plot_segment_sweep": dict(sweeps=sweeps),
        "lessonlib.book.memory_plots.plot_memory_multiplier": dict(ratios={"a": 3.0, "b": 12.0}),
        "lessonlib.book.memory_plots.recompute_policy_figure": dict(kept_per_sbh={"none": 54.0, "full": 2.0},
                                                                    extra_flops_pct={"none": 0.0, "full": 33.3}),
        "lessonlib.book.roofline_plots.plot_roofline": _roofline_sample(),
        "lessonlib.book.memory_plots.plot_activation_sweep": dict(
            results={("batch", 1): (100, 100), ("batch", 2): (200, 200)}, sweeps={"batch": [1, 2]}),
        "lessonlib.book.speedup_plots.plot_goodput_failures": dict(world_sizes=[1, 2], rows={"m": _goodputs()},
                                                                   no_failure=[1.0, 0.95]),
        "lessonlib.book.speedup_plots.stall_figure": dict(runs=runs, stall_step=2, stall_s=2.0),
        "lessonlib.calc.goodput.stall_account": dict(runs=runs, stall_step=2),
        "lessonlib.measure.distributed.splits.expert_step_wait": dict(per_rank=experts),
        "lessonlib.measure.distributed.pipelining.idle_share": dict(per_rank_spans=spans),
        "lessonlib.calc.pipeline.read_schedule": dict(spans=spans5),
        "lessonlib.book.split_plots.plot_schedule_timelines": dict(run=pipe5, microbatches=1),
        "lessonlib.book.split_plots.plot_pipeline_timelines": dict(run=pipe, microbatches=2),
        "lessonlib.book.split_plots.plot_idle_shares": dict(run=pipe),
        "lessonlib.book.split_reports.idle_rows": dict(run=pipe),
        "lessonlib.book.split_reports.pipeline_memory_rows": dict(run=pipe),
        "lessonlib.book.split_reports.pipeline_memory_table": dict(run=pipe),
        "lessonlib.book.split_reports.sharded_state_table": dict(run=shard_run),
        "lessonlib.book.split_reports.zero1_table": dict(run=shard_run),
        "lessonlib.book.split_reports.loss_table": dict(run=shard_run),
        "lessonlib.book.split_reports.traffic_table": dict(run=shard_run),
        "lessonlib.book.split_reports.tp_collective_table": dict(
            records=[["all_reduce", "forward", 4096]], expected={("all_reduce", "forward"): (1, 4096)}),
        "lessonlib.book.split_reports.comm_rows": dict(result=comm, link=LINKS["nvlink"]),
        "lessonlib.book.split_reports.comm_table": dict(rows=[{"what": "a", "bytes": 4096, "measured_s": 0.001,
                                                               "predicted_s": 0.0012}]),
        "lessonlib.calc.comm.fit_alpha_beta": dict(n_bytes=[1e3, 1e5, 1e7], seconds=[1e-4, 2e-4, 1e-2]),
        "lessonlib.calc.experts.process_load_imbalance": dict(tokens_per_expert=[25, 5, 5, 5], experts_per_process=2),
        "lessonlib.book.split_plots.plot_alpha_beta": dict(sizes=[1e3, 1e5], seconds=[1e-4, 2e-4], link=LINKS["nvlink"]),
        "lessonlib.book.sequence_plots.plot_causal_work": dict(world_size=2, measured={"contiguous": [3, 7],
                                                                                     "zigzag": [5, 5]}),
        "lessonlib.book.overlap_plots.overlap_table": dict(run=_overlap_run()),
        "lessonlib.book.overlap_plots.plot_overlap_timeline": dict(timeline=_overlap_timeline()),
        "lessonlib.book.scaling_report.scaling_table": dict(run=_scaling_run()),
        "lessonlib.book.scaling_report.scaling_display_rows": dict(run=_scaling_run()),
    }


def _mutations(value, path=()):
    """(path, mutated copy of ``value``) for one spoiled field at a time, depth first."""
    import copy

    if isinstance(value, (bool, np.bool_)) or value is None or callable(value) and not dataclasses.is_dataclass(value):
        return
    if isinstance(value, (numbers.Real, str)):
        for m in LEAF_MUTATIONS:
            if m is not value and not (isinstance(value, str) and isinstance(m, str)):
                yield path + (f"={m!r}",), m
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            for p, m in _mutations(getattr(value, f.name), path + (f.name,)):
                new = copy.copy(value)
                object.__setattr__(new, f.name, m)
                yield p, new
        return
    if isinstance(value, dict):
        for k in list(value):
            yield path + (f"drop {k!r}",), {kk: vv for kk, vv in value.items() if kk != k}
            for p, m in _mutations(value[k], path + (repr(k),)):
                yield p, {**value, k: m}
        return
    if isinstance(value, (list, tuple)):
        kind = type(value)
        if value:
            yield path + ("cut short",), kind(value[:-1])
        for i, v in enumerate(value):
            for p, m in _mutations(v, path + (i,)):
                yield p, kind(list(value[:i]) + [m] + list(value[i + 1:]))


def _fingerprint(out):
    """What a reader sees of a result: a value itself; of a figure its titles, texts, lines and bars."""
    if hasattr(out, "alt") and hasattr(out, "png"):
        return out.alt
    if callable(getattr(out, "savefig", None)):
        seen = [out._suptitle.get_text() if getattr(out, "_suptitle", None) else ""]
        for ax in out.axes:
            seen.append((ax.get_title(), ax.get_xlabel(), ax.get_ylabel(),
                         [t.get_text() for t in ax.texts],
                         [np.asarray(line.get_xydata(), dtype=object).tolist() for line in ax.lines],
                         [(round(float(p.get_x()), 12), round(float(p.get_height()), 12)) for p in ax.patches
                          if hasattr(p, "get_height")],
                         [tuple(map(str, c.get_offsets().tolist())) if hasattr(c, "get_offsets") else ()
                          for c in ax.collections]))
        return repr(seen)
    return repr(out)


def _never_valid_leaf(path):
    last = path[-1] if path else ""
    return isinstance(last, str) and last.startswith("=") and last[1:] in ("nan", "inf", "'x'")


STRUCTURES = None


def _roofline_sample():
    from lessonlib.measure.roofline import OpPoint, Roofline

    roof = Roofline((16, 64), (5e9, 9e10), 9e10, 2e10, 2**22)
    return dict(roofline=roof, points=[OpPoint("product", 100, 10, 1e-9, 10.0, 1e11, 9e10),
                                       OpPoint("LayerNorm", 7, 8, 1e-9, 0.875, 7e9, 1.75e10)])


def _structures():
    global STRUCTURES
    if STRUCTURES is None:
        STRUCTURES = _structure_samples()
    return STRUCTURES


STRUCTURE_TARGETS = [
    "lessonlib.book.reports.data_parallel_table", "lessonlib.book.reports.data_parallel_display_rows",
    "lessonlib.book.speedup_plots.data_parallel_figure", "lessonlib.book.reports.ledger_table",
    "lessonlib.book.plots.plot_ledger", "lessonlib.book.reports.timing_table", "lessonlib.book.plots.plot_timing",
    "lessonlib.book.reports.proposal_html", "lessonlib.book.plots.plot_resume_comparison",
    "lessonlib.book.plots.plot_segment_sweep", "lessonlib.book.memory_plots.plot_memory_multiplier",
    "lessonlib.book.memory_plots.recompute_policy_figure",
    "lessonlib.book.memory_plots.plot_activation_sweep", "lessonlib.book.speedup_plots.plot_goodput_failures",
    "lessonlib.book.speedup_plots.stall_figure", "lessonlib.calc.goodput.stall_account",
    "lessonlib.measure.distributed.splits.expert_step_wait", "lessonlib.measure.distributed.pipelining.idle_share",
    "lessonlib.book.split_plots.plot_pipeline_timelines", "lessonlib.book.split_plots.plot_idle_shares",
    "lessonlib.book.split_reports.idle_rows", "lessonlib.book.split_reports.pipeline_memory_rows",
    "lessonlib.book.split_reports.pipeline_memory_table", "lessonlib.book.split_reports.sharded_state_table",
    "lessonlib.book.split_reports.zero1_table", "lessonlib.book.split_reports.loss_table",
    "lessonlib.book.split_reports.traffic_table", "lessonlib.book.split_reports.tp_collective_table",
    "lessonlib.book.split_reports.comm_rows", "lessonlib.book.split_reports.comm_table",
    "lessonlib.calc.comm.fit_alpha_beta", "lessonlib.calc.experts.process_load_imbalance",
    "lessonlib.book.split_plots.plot_alpha_beta", "lessonlib.book.sequence_plots.plot_causal_work",
    "lessonlib.calc.pipeline.read_schedule", "lessonlib.book.split_plots.plot_schedule_timelines",
    "lessonlib.book.roofline_plots.plot_roofline",
    "lessonlib.book.overlap_plots.overlap_table", "lessonlib.book.overlap_plots.plot_overlap_timeline",
    "lessonlib.book.scaling_report.scaling_table", "lessonlib.book.scaling_report.scaling_display_rows",
]


@pytest.mark.parametrize("qualname", STRUCTURE_TARGETS)
def test_structures_mutated_field_by_field(qualname, figures_laid_out_not_encoded):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("the per-call time limit needs SIGALRM in the main thread")
    import random

    fn = _resolve(qualname)
    names = [p.name for p in _params(fn)]
    base = _structures()[qualname]
    how, out = _call_with_limit(fn, dict(base))
    assert how == "returned" and _out_of_range(qualname, out) is None, f"{qualname}: the valid sample fails: {out!r}"
    expected = _fingerprint(out)  # a spoiled field the function never reads leaves its answer as it was
    cases = [(arg, p, m) for arg in base for p, m in _mutations(base[arg], (arg,))]
    limit = int(os.environ.get("LESSONLIB_FUZZ_MUTATIONS", "40"))
    if len(cases) > limit:
        cases = random.Random(qualname).sample(cases, limit)
    problems = []
    for arg, path, mutated in cases:
        how, out = _call_with_limit(fn, {**base, arg: mutated})
        problem = _classify(qualname, names, how, out, STRUCT_STATS)
        if problem is None and how == "returned" and _never_valid_leaf(path) and _fingerprint(out) != expected:
            STRUCT_STATS["ok"] -= 1
            STRUCT_STATS["accepted"].append(f"{qualname}: {path}")
            problem = "accepted a value that is never valid there"
        if problem:
            problems.append(f"{qualname} with {' '.join(map(str, path))}: {problem}")
    assert not problems, f"{len(problems)} of {len(cases)}:\n" + "\n".join(problems[:15])


def _report(title, stats):
    classes = ("raw", "unnamed", "nonsense", "accepted", "timeout")
    counts = ", ".join(f"{k} {len(stats[k])}" for k in classes if k in stats)
    sys.__stdout__.write(f"\n[fuzz {title}] calls {stats['calls']}: in range {stats['ok']}, "
                         f"refused naming an argument {stats['refused']}; {counts}\n")
    for k in classes:
        for line in stats.get(k, [])[:int(os.environ.get("LESSONLIB_FUZZ_SHOW", "0"))]:
            sys.__stdout__.write(f"  {k}: {line[:240]}\n")


def teardown_module(module, _first=teardown_module):  # noqa: F811 - extends the report above
    _first(module)
    if COMBO_STATS["calls"]:
        _report("combinations", COMBO_STATS)
    if STRUCT_STATS["calls"]:
        _report("structures", STRUCT_STATS)


def test_an_input_is_a_repeat_only_when_every_argument_is_the_same_plain_value():
    """The fuzz skips an input it has checked and passed before (PASSED): the key must tell apart what a
    callable may tell apart (4, 4.0, numpy's 4, True; 0.0 and -0.0; a list and a tuple), and an input with
    an object in it (whose repr need not be all it is) is never a repeat."""
    keys = [_input_key("f", {"n": v}) for v in (4, 4.0, np.int64(4), np.float64(4), True, 0.0, -0.0, "4", b"4",
                                                 [4], (4,), {"n": 4}, None, float("nan"))]
    assert None not in keys and len(set(keys)) == len(keys)
    assert _input_key("f", {"n": [1, 2], "s": "x"}) == _input_key("f", {"s": "x", "n": [1, 2]})
    assert _input_key("f", {"n": 4}) != _input_key("g", {"n": 4})
    for obj in (np.array([4]), Path("4"), object(), [1, object()], {"a": np.array(1)}):
        assert _input_key("f", {"n": obj}) is None
