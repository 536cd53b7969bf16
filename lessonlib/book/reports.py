"""Small HTML and text reports that pages display: calculators' answers and
measurement tables.

Each function formats results computed elsewhere (:mod:`lessonlib.calc`,
:mod:`lessonlib.measure`); none computes physics of its own.
"""
from __future__ import annotations

from ..checks import reads as _reads

import math

from ..calc.amdahl import amdahl_time, speedup_from_share
from ..calc.hardware import rate_text, sustained_flops_per_s
from ..calc.goodput import SECONDS_PER_HOUR, goodput, job_mtbf_seconds
from ..calc.memory import (OPTIMIZER_BYTES_PER_PARAM, RECOMPUTE_CHOICES, activation_bytes_per_value, format_bytes,
                           logits_bytes, training_state_bytes)
from ..calc.precision import precision_name
from ..calc.planner import GPT2_VOCAB, PRESETS, plan, propose
from ..calc.reliability import (daly_interval, expected_overhead, first_order_overhead, optimal_interval,
                                 young_interval)
from ..measure.memory import MemoryLedger
from ..measure.timing import PHASES, StepTiming
from .tables import table
from ..checks import amount as _check_amount, choice as check_choice, count as _check_count, \
    instance as _check_instance, mapping as _check_mapping, positive as _check_positive, \
    sequence as _check_sequence, share as _check_share


def _trim(x: float, digits: int = 2) -> str:
    """``2.50`` -> ``'2.5'``, ``256.0`` -> ``'256'``, ``62.5`` -> ``'62.5'``: no trailing zeros."""
    text = f"{x:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _speedup_text(speedup: float, world_size: int) -> str:
    if world_size == 1:
        return "1× (one device: nothing to divide)"
    if abs(speedup - world_size) < 0.005:
        return f"{world_size}× (all {world_size} devices fully used)"
    return f"{_trim(speedup)}× (not {world_size}×)"


def amdahl_report(world_size, serial_share, communication_share=0.0) -> str:
    """The Amdahl calculator's answer as a short HTML table (for :class:`lessonlib.book.interactive.Explorer`).

    Times are shares of the one-device step (one device = 100 %); the
    speedup is dimensionless (×) and the efficiency is speedup / devices.
    Same checks as :func:`speedup_from_share`.
    """
    serial_share = _check_share("serial_share", serial_share)
    communication_share = _check_amount("communication_share", communication_share)
    world_size = _check_count("world_size", world_size)
    parallel = 1.0 - serial_share
    comm = communication_share if world_size > 1 else 0.0
    total = amdahl_time(serial_share, parallel, world_size, communication_share)
    s = speedup_from_share(serial_share, world_size, communication_share)
    ceiling = (1.0 / (serial_share + communication_share)) if serial_share + communication_share > 0 else math.inf
    ceiling_txt = "no limit (nothing serial, no communication)" if math.isinf(ceiling) else f"{_trim(ceiling)}×"
    return table(None, [
        ("serial part", f"{100 * serial_share:.0f} % of the one-device time"),
        (f"parallel part on {world_size} device{'s' if world_size > 1 else ''}",
         f"{100 * parallel:.0f} % / {world_size} = {100 * parallel / world_size:.1f} %"),
        ("communication", f"{100 * comm:.0f} %"),
        ("new time", f"{100 * total:.1f} % of the one-device time"),
        ("speedup", _speedup_text(s, world_size)),
        ("efficiency (speedup / devices)", f"{_trim(100 * s / world_size, 1)} %"),
        ("ceiling with unlimited devices", ceiling_txt),
    ], strong={3, 4})


DATA_PARALLEL_PIECES = ("half_compute", "optimizer", "allreduce")


@_reads("result")
def data_parallel_display_rows(result) -> list:
    """The numbers :func:`data_parallel_table` shows, one dict per batch size.

    Times are the medians of :func:`run_data_parallel`, in milliseconds,
    rounded to 0.01 ms; ``predicted`` (the sum of measured pieces) is the sum of the three rounded
    pieces, ``ideal_device`` (the ideal-compute prediction) is the row's
    :attr:`~lessonlib.measure.distributed.data_parallel.DataParallelRow.ideal_device_step`, and every speedup is a
    ratio of the rounded steps, rounded to 0.01, so a reader who adds or divides the shown numbers gets
    the shown results.
    """
    from ..measure.distributed.data_parallel import DataParallelRun

    if not isinstance(result, DataParallelRun):
        raise TypeError(f"result must be run_data_parallel's DataParallelRun, got {type(result).__name__}")
    out = []
    for row in result.rows:
        ms = {k: round(1e3 * getattr(row, k), 2) for k in ("single", "ddp") + DATA_PARALLEL_PIECES}
        predicted = round(sum(ms[k] for k in DATA_PARALLEL_PIECES), 2)
        ideal = round(1e3 * row.ideal_device_step, 2)
        out.append({"global_batch": row.global_batch, **ms, "predicted": predicted,
                    "predicted_speedup": round(ms["single"] / predicted, 2),
                    "ideal_device": ideal, "ideal_device_speedup": round(ms["single"] / ideal, 2),
                    "speedup": round(ms["single"] / ms["ddp"], 2)})
    return out


@_reads("result")
def data_parallel_table(result) -> str:
    """An HTML table of :func:`run_data_parallel`'s rows (times in milliseconds).

    Every time is a median over rounds; the sum of measured pieces is the sum of the
    three pieces shown and each speedup is the ratio of two steps shown
    (see :func:`data_parallel_display_rows`).
    """
    rows = data_parallel_display_rows(result)  # checks result first
    world = result.world_size
    share = "half" if world == 2 else f"1/{world}"
    cols = [("global_batch", "global batch", "{:,}"), ("single", "1 process: step", "{:.2f}"),
            ("half_compute", f"{world} proc.: compute on {share}", "{:.2f}"), ("optimizer", "+ optimizer step", "{:.2f}"),
            ("allreduce", "+ all-reduce", "{:.2f}"), ("predicted", "= sum of measured pieces", "{:.2f}"),
            ("ddp", "measured step", "{:.2f}"), ("predicted_speedup", "speedup, sum of measured pieces", "{:.2f}×"),
            ("ideal_device_speedup", "speedup, ideal compute", "{:.2f}×"), ("speedup", "measured speedup", "{:.2f}×")]
    rounds = result.rounds
    over = f"over {rounds} rounds " if rounds else "over rounds "
    return table([label for _, label, _ in cols], [[fmt.format(row[key]) for key, _, fmt in cols] for row in rows],
                 caption=f"Times in ms: each one the median {over}(per round, the slowest process). "
                 f"Sum of measured pieces = compute on {share} + optimizer step + all-reduce, the sum of the three "
                 f"medians; speedup = one-process step / {world}-process step (that sum, or the measured step), the "
                 f"ratio of the medians shown; ideal compute: the sum with compute on {share} taken as {share} of one "
                 "process's forward and backward (its step less the optimizer step, which is timed in the "
                 f"{world}-process run).")


TORCHRUN_SNIPPET = """\
# On a machine with several GPUs, the same worker code runs under torchrun,
# which starts one process per GPU and sets RANK, WORLD_SIZE, LOCAL_RANK,
# MASTER_ADDR and MASTER_PORT for each of them:
#
#   torchrun --standalone --nproc-per-node=4 train.py
#
# and in train.py:
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")              # reads the variables torchrun set
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = DDP(build_model().cuda(local_rank), device_ids=[local_rank])
# ... the usual loop: each process reads its own shard of the data
# (torch.utils.data.DistributedSampler), loss.backward() all-reduces the
# gradients, optimizer.step() updates every replica the same way ...
dist.destroy_process_group()
#
# Across machines: torchrun --nnodes=2 --nproc-per-node=8 \\
#     --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 train.py
"""


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * SECONDS_PER_HOUR:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * SECONDS_PER_HOUR:
        return f"{seconds / SECONDS_PER_HOUR:.1f} h"
    return f"{seconds / 86400:.0f} days"


INTERVALS = {"exact optimum": None, "Young's sqrt(2CM)": "young", "Daly (2006)": "daly", "every 10 min": 600.0,
             "every 2 h": 7200.0}

#: The goodput calculator warns when the chosen interval loses this much more wall time
#: (a share of wall time, 0.01 = one percentage point) than the exact optimum would.
WORSE_THAN_OPTIMUM = 0.01


def goodput_report(world_size, serial_share, device_mtbf_hours, checkpoint_seconds, interval, restart_seconds,
                   step_efficiency=1.0) -> str:
    """The goodput calculator's answer as a short HTML table (for an Explorer).

    ``serial_share`` (0 to 1) gives the speedup by Amdahl's law; ``step_efficiency`` (above 0, at most 1)
    multiplies it: the share of each step spent computing (a real run's MFU over its kernel efficiency);
    ``interval`` is a key of :data:`INTERVALS` or a number of seconds. The
    time lost is exact for exponential failures
    (:func:`lessonlib.calc.reliability.expected_overhead`); a note appears
    when the chosen interval loses more than :data:`WORSE_THAN_OPTIMUM` of
    wall time above the optimum, naming what the optimum would lose.
    """
    step_efficiency = _check_positive("step_efficiency", step_efficiency, maximum=1.0)
    speed = speedup_from_share(serial_share, world_size) * step_efficiency
    if isinstance(interval, str):
        interval = INTERVALS[check_choice("interval", interval, INTERVALS)]
        if interval in ("young", "daly"):
            rule = young_interval if interval == "young" else daly_interval
            interval = rule(checkpoint_seconds, job_mtbf_seconds(device_mtbf_hours, world_size))
    elif interval is not None:
        interval = _check_positive("interval", interval)
    g = goodput(world_size, speed, device_mtbf_hours, checkpoint_seconds, restart_seconds, interval)
    best = goodput(world_size, speed, device_mtbf_hours, checkpoint_seconds, restart_seconds)
    warn = ""
    if best.useful_fraction - g.useful_fraction > WORSE_THAN_OPTIMUM:
        warn = (f"<p><em>This interval loses {100 * (best.useful_fraction - g.useful_fraction):.1f} "
                f"percentage points more than the optimum ({_duration(best.interval_s)}), which loses "
                f"{100 * (1 - best.useful_fraction):.1f} %.</em></p>")
    return table(None, [
        (f"speedup on {g.world_size:,} device{'s' if g.world_size > 1 else ''}", f"{g.speedup:.1f}×"),
        ("job's mean time between failures", _duration(g.job_mtbf_s)),
        ("checkpoint interval", _duration(g.interval_s)),
        ("time lost to saves, redone work, restarts (exact, exponential failures)",
         f"{100 * (1 - g.useful_fraction):.1f} % of wall time"),
        ("progress per wall-clock hour", f"{g.progress_per_hour:,.1f} one-device hours"),
        ("progress per paid device-hour", f"{g.per_device_hour:.2f} one-device hours"),
        ("paid device-hours per hour of progress", f"{g.paid_per_useful_hour:.2f}"),
    ], strong={4, 5}) + warn


def plan_html(model: str, optimizer: str, precision: str, batch_per_device: int, seq_len: int,
              recompute: str, device_GB: int, tokens_per_param: float = 20.0,
              device_flops_per_s: float | None = None, max_days: float = 30.0) -> str:
    """The planner for one preset model, as a small HTML report (for ``lessonlib.book.interactive.Explorer``).

    ``device_GB`` is device memory in 10^9 bytes; training tokens are
    ``tokens_per_param`` x parameters; ``device_flops_per_s`` is the sustained rate
    (default: the course's device at its stated utilisation, :func:`lessonlib.calc.hardware.sustained_flops_per_s`).
    Every argument is checked first, under its own name.
    """
    if device_flops_per_s is None:
        device_flops_per_s = sustained_flops_per_s()
    check_choice("model", model, PRESETS)
    check_choice("optimizer", optimizer, OPTIMIZER_BYTES_PER_PARAM)
    precision = precision_name(precision)
    batch_per_device = _check_count("batch_per_device", batch_per_device)
    seq_len = _check_count("seq_len", seq_len)
    check_choice("recompute", recompute, RECOMPUTE_CHOICES)
    device_GB = _check_positive("device_GB", device_GB, maximum=1e9)
    if device_GB * 1e9 < 1:
        raise ValueError(f"device_GB must be at least 1e-9 (one byte of device memory), got {device_GB!r}")
    tokens_per_param = _check_positive("tokens_per_param", tokens_per_param, maximum=1e9)
    device_flops_per_s = _check_positive("device_flops_per_s", device_flops_per_s)
    max_days = _check_positive("max_days", max_days)
    p = PRESETS[model]
    tokens = max(1, int(tokens_per_param * p["n_params"]))
    # the presets' vocabulary: the loss's logits (b x s x V values) count with the activations, as page 1.3 warns
    r = plan(p["n_params"], optimizer, precision, batch_per_device, seq_len, p["layers"], p["hidden"],
             p["heads"], recompute, int(device_GB * 1e9), tokens, device_flops_per_s, max_days, vocab=GPT2_VOCAB)
    gb = lambda b: f"{b / 1e9:,.1f} GB"  # noqa: E731
    label = {"none": "fits", "time": "fits, but too slow", "activations": "activations do not fit",
             "state": "state does not fit"}[r.failure]
    days = f"{r.days:,.1f} days" if r.days < 1000 else f"{r.days / 365:,.0f} years"
    per = training_state_bytes(1, optimizer, precision)
    parts = [f"weights {per.weights}", f"gradients {per.gradients}"]
    parts += [f"master copy {per.master_weights}"] if per.master_weights else ["no master copy"]
    parts += [f"optimizer {per.optimizer_state}"]
    e = activation_bytes_per_value(precision)
    # the rate is of executed (hardware) FLOPs: a recomputed forward adds time, not model FLOPs (page 3.14)
    extra = {"none": "", "full": ", + one forward pass recomputed: hardware FLOPs, not model FLOPs",
             "attention": "; Korthikanti's selective (attention core rebuilt): the fused attention kernel already "
                          "recomputes its scores, "
                          "so nothing changes"}[recompute]
    rows = [
        (f"state: {' + '.join(parts)} = {per.total} bytes/parameter", gb(r.state_bytes)),
        (f"activations at batch {batch_per_device} x {seq_len} tokens (fused attention, no dropout), "
         f"{e} bytes per value, "
         f"with the loss's logits", gb(r.activation_bytes)),
        (f"of which the logits ({GPT2_VOCAB:,} per token; chunked cross-entropy avoids them)",
         gb(logits_bytes(seq_len, batch_per_device, GPT2_VOCAB, e))),
        ("state + activations", gb(r.state_bytes + r.activation_bytes)),
        ("device memory", gb(r.device_bytes)),
        (f"of which usable, after the planner's reserve ({100 * r.reserve_bytes / r.device_bytes:.0f} % kept back for "
         "the CUDA context, communication buffers, fragmentation)", gb(r.usable_bytes)),
        ("largest batch per device that fits", str(r.max_batch_that_fits)),
        (f"training compute ({p['n_params'] / 1e9:,.2f}B parameters, {tokens_per_param:g} tokens/param{extra})",
         f"{r.flops:.3g} FLOPs"),
        (f"one device at {rate_text(device_flops_per_s)}", days),
    ]
    answer = r.answer
    if r.failure == "activations":
        if r.max_batch_that_fits >= 1:
            answer += (f" Here a batch per device of up to {r.max_batch_that_fits} fits: run micro-batches of at "
                       f"most that size and accumulate their gradients to keep {batch_per_device} per update "
                       f"(the proposal below takes the largest that divides {batch_per_device}).")
        else:
            fixes = [m for m in RECOMPUTE_CHOICES[RECOMPUTE_CHOICES.index(recompute) + 1:]
                     if plan(p["n_params"], optimizer, precision, 1, seq_len, p["layers"], p["hidden"], p["heads"],
                             m, int(device_GB * 1e9), vocab=GPT2_VOCAB).failure == "none"]
            answer += (f" Even batch 1 does not fit; with '{fixes[0]}' recomputation it would." if fixes else
                       " Even batch 1 with full recomputation does not fit: split the activations across devices "
                       "(tensor parallelism with sequence parallelism, or context parallelism).")
    layouts = propose(p["n_params"], optimizer, precision, batch_per_device, seq_len, p["layers"], p["hidden"],
                      p["heads"], recompute, int(device_GB * 1e9), tokens, device_flops_per_s, max_days, vocab=GPT2_VOCAB)
    return (f"{table(None, rows)}<p><b class='wtc-verdict-{r.failure}'>{label}.</b> {answer}</p>"
            + proposal_html(layouts))


@_reads("layouts")
def proposal_html(layouts) -> str:
    """The planner's proposal (:func:`lessonlib.calc.planner.propose`) as HTML: each change and its numbers."""
    from ..calc.planner import Layout
    from ..checks import sequence as _check_sequence

    layouts = [_check_instance("layouts", lay, Layout, "a list of planner Layouts (from propose)")
               for lay in _check_sequence("layouts", layouts)]
    if len(layouts) < 2:
        return ""
    gb = lambda b: f"{b / 1e9:,.1f} GB"  # noqa: E731
    rows = []
    for i, lay in enumerate(layouts):
        what = "as planned" if i == 0 else lay.change
        days = "" if lay.days is None else (f"{lay.days:,.1f} days" if lay.days < 1000 else f"{lay.days / 365:,.0f} years")
        ok = "fits" if lay.fits else ("fits in memory, too slow" if lay.fits_memory else "does not fit")
        rows.append((what, f"{lay.world_size:,}", gb(lay.state_bytes), gb(lay.activation_bytes), days, ok))
    return ("<p><b>The smallest change that fits</b> (fewest devices, then fewest settings changed, then the "
            "cheapest; time if every device computes all the time):</p>"
            + table(["change", "devices", "state per device", "activations per device", "time", ""], rows))


@_reads("ledgers", "formula", "second")
def ledger_table(ledgers, formula: dict | None = None, second: dict | None = None):
    """An HTML table of one ledger or a ``{name: ledger}`` dict (sizes in binary units).

    ``formula`` optionally maps a row name to a predicted byte count to show beside it.
    ``second`` optionally maps the same names to the ledgers of a second step: their peaks
    are shown in a row before the first step's peak (the steady state, once an optimizer has made
    its state, is the one a plan uses).
    """
    if isinstance(ledgers, MemoryLedger):
        ledgers = {"measured": ledgers}
    for k, v in _check_mapping("ledgers", ledgers).items():
        _check_instance(f"ledgers[{k!r}]", v, MemoryLedger, "a MemoryLedger")
    if second is not None:
        second = _check_mapping("second", second)
        if set(second) != set(ledgers):
            raise ValueError(f"second must name the same ledgers as ledgers ({', '.join(map(str, ledgers))}), "
                             f"got {', '.join(map(str, second))}")
        for k, v in second.items():
            _check_instance(f"second[{k!r}]", v, MemoryLedger, "a MemoryLedger")
    if formula is not None:
        for k, v in _check_mapping("formula", formula, allow_empty=True).items():
            if v is not None:
                _check_amount(f"formula[{k!r}]", v)
    rows = []
    for r in ("weights", "gradients", "optimizer_state", "activations", "total", "peak"):
        cells = ["n/a" if v is None else format_bytes(v) for v in (getattr(l, r) for l in ledgers.values())]
        if formula:
            cells.append("" if formula.get(r) is None else format_bytes(formula[r]))
        if second is not None and r == "peak":  # the typical step's peak first, then the first step's
            rows.append(["peak, second step"] + ["n/a" if second[k].peak is None else format_bytes(second[k].peak)
                                                 for k in ledgers] + ([""] if formula else []))
        rows.append([r if second is None or r != "peak" else "peak, first step"] + cells)
    note = ""
    if any(l.peak is not None for l in ledgers.values()):
        note = ("peak: on a GPU the allocator's peak; on a CPU tensors only, a lower bound "
                "(scratch buffers inside kernels are not seen)")
    return table([""] + list(ledgers) + (["formula"] if formula else []), rows, caption=note)


@_reads("t")
def timing_table(t: StepTiming):
    """An HTML table from :attr:`StepTiming.account`: ms, x prediction and share of step, adding up to the step."""
    _check_instance("t", t, StepTiming, "a StepTiming (from time_training_step)")
    ms = {k: 1000 * v for k, v in t.account.items()}
    spread = {k: t.quartiles(k) for k in PHASES + ("step",)}
    rows = [(k if k != "step" else "step (sum of the four phases)", f"{ms[k]:.3f}", f"{t.ratios[k]:.2f}",
             f"{spread[k][0]:.2f} to {spread[k][1]:.2f}" if k in spread else "",
             f"{100 * t.shares[k]:.1f} %" if k in t.shares else ("100 %" if k == "step" else ""))
            for k in ("prediction",) + PHASES + ("step",)]
    note = ("ms: the x prediction ratio × the median prediction time. Not timed: zero_grad before the forward "
            "and a shape check of the output.")
    return table(["phase", "ms", "x prediction", "middle half of rounds", "share of step"], rows, caption=note)


def interval_report(save_minutes, mtbf_hours) -> str:
    """Chapter 2's checkpoint-interval calculator as HTML: Young's, Daly's and the exact optimal interval,
    each with its exact expected extra time (exponential failures, no restart time), and what the
    first-order formula would say at Young's interval."""
    c = _check_amount("save_minutes", save_minutes, allow_zero=False) * 60
    m = _check_amount("mtbf_hours", mtbf_hours, allow_zero=False) * SECONDS_PER_HOUR
    if c > 100 * m:
        raise ValueError(f"save_minutes ({c / 60:g}) is more than 100 times mtbf_hours ({m / 3600:g} h): "
                         "a job that fails far more often than it saves never finishes (are the two swapped?)")
    try:
        rows = [("Young: √(2CM)", young_interval(c, m)), ("Daly (2006)", daly_interval(c, m)),
                ("exact optimum", optimal_interval(c, m))]
        body = [(name, f"{t / 60:,.1f} min", f"{expected_overhead(t, c, m):.1%}") for name, t in rows]
        first = first_order_overhead(rows[0][1], c, m)
    except ValueError as err:  # the formulas name their own arguments: say which of the caller's gave them
        raise ValueError(f"save_minutes ({c / 60:g}) and mtbf_hours ({m / 3600:g}) give no answer: {err}") from None
    return (table(["interval", "save every", "extra time (exact)"], body)
            + f"<p>At Young's interval the first-order formula C/τ + τ/(2M) would say {first:.1%}. Extra time is a "
              f"share of the useful work time, for exponential failures with no restart time.</p>")
