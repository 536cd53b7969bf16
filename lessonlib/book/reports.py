"""Small HTML and text reports that pages display: calculators' answers and
measurement tables.

Each function formats results computed elsewhere (:mod:`lessonlib.calc`,
:mod:`lessonlib.measure`); none computes physics of its own.
"""
from __future__ import annotations

import math

from ..calc.amdahl import amdahl_time, speedup_from_share
from ..calc.goodput import SECONDS_PER_HOUR, goodput
from ..calc.memory import RECOMPUTE_CHOICES, format_bytes
from ..calc.planner import PRESETS, plan
from ..measure.memory import MemoryLedger
from ..measure.timing import PHASES, StepTiming
from ..checks import amount as _check_amount, choice as check_choice, count as _check_count, share as _check_share


def amdahl_report(devices, serial_share, communication_share=0.0) -> str:
    """The Amdahl calculator's answer as a short HTML table (for :class:`lessonlib.book.interactive.Explorer`).

    Times are shares of the one-device step (one device = 100 %); the
    speedup is dimensionless (×) and the efficiency is speedup / devices.
    Same checks as :func:`speedup_from_share`.
    """
    serial_share = _check_share("serial_share", serial_share)
    communication_share = _check_amount("communication_share", communication_share)
    devices = _check_count("devices", devices)
    parallel = 1.0 - serial_share
    comm = communication_share if devices > 1 else 0.0
    total = amdahl_time(serial_share, parallel, devices, communication_share)
    s = speedup_from_share(serial_share, devices, communication_share)
    ceiling = (1.0 / (serial_share + communication_share)) if serial_share + communication_share > 0 else math.inf
    ceiling_txt = "no limit (nothing serial, no communication)" if math.isinf(ceiling) else f"{ceiling:.2f}×"
    return (
        "<table>"
        f"<tr><td>serial part</td><td>{100 * serial_share:.0f} % of the one-device time</td></tr>"
        f"<tr><td>parallel part on {devices} device{'s' if devices > 1 else ''}</td>"
        f"<td>{100 * parallel:.0f} % / {devices} = {100 * parallel / devices:.1f} %</td></tr>"
        f"<tr><td>communication</td><td>{100 * comm:.0f} %</td></tr>"
        f"<tr><th>new time</th><th>{100 * total:.1f} % of the one-device time</th></tr>"
        f"<tr><th>speedup</th><th>{s:.2f}× (not {devices}×)</th></tr>"
        f"<tr><td>efficiency (speedup / devices)</td><td>{100 * s / devices:.0f} %</td></tr>"
        f"<tr><td>ceiling with unlimited devices</td><td>{ceiling_txt}</td></tr>"
        "</table>"
    )


def data_parallel_table(result: dict) -> str:
    """An HTML table of :func:`run_data_parallel`'s rows (times in milliseconds)."""
    cols = [("global_batch", "global batch", "{:,}"), ("single", "1 process: step", "{:.2f}"),
            ("half_compute", "2 proc.: compute on half", "{:.2f}"), ("optimizer", "optimizer step", "{:.2f}"),
            ("allreduce", "all-reduce", "{:.2f}"), ("predicted", "predicted step", "{:.2f}"),
            ("ddp", "measured step", "{:.2f}"), ("predicted_speedup", "predicted speedup", "{:.2f}×"),
            ("speedup", "measured speedup", "{:.2f}×")]
    head = "".join(f"<th>{label}</th>" for _, label, _ in cols)
    body = []
    for row in result["rows"]:
        cells = []
        for key, _, fmt in cols:
            v = row[key]
            if key in ("single", "half_compute", "optimizer", "allreduce", "predicted", "ddp"):
                v = 1e3 * v  # seconds -> ms
            cells.append(f"<td>{fmt.format(v)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return ("<table><caption>Medians over rounds; times in ms; speedup = one-process step / "
            "two-process step</caption><tr>" + head + "</tr>" + "".join(body) + "</table>")


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


INTERVALS = {"Young/Daly optimum": None, "every 10 min": 600.0, "every 2 h": 7200.0}


def goodput_report(devices, serial_share, device_mtbf_hours, checkpoint_seconds, interval, restart_seconds) -> str:
    """The goodput calculator's answer as a short HTML table (for an Explorer).

    ``serial_share`` (0 to 1) gives the speedup by Amdahl's law;
    ``interval`` is a key of :data:`INTERVALS` or a number of seconds.
    """
    speed = speedup_from_share(serial_share, devices)
    if isinstance(interval, str):
        if interval not in INTERVALS:
            raise ValueError(f"interval must be one of {list(INTERVALS)} or seconds, got {interval!r}")
        interval = INTERVALS[interval]
    g = goodput(devices, speed, device_mtbf_hours, checkpoint_seconds, restart_seconds, interval)
    warn = ""
    if g.interval_s > g.job_mtbf_s / 2:
        warn = ("<tr><td colspan='2'><em>The interval is not small next to the job's MTBF: "
                "this first-order estimate is rough here.</em></td></tr>")
    return (
        "<table>"
        f"<tr><td>speedup on {g.devices:,} device{'s' if g.devices > 1 else ''}</td><td>{g.speedup:.1f}×</td></tr>"
        f"<tr><td>job's mean time between failures</td><td>{_duration(g.job_mtbf_s)}</td></tr>"
        f"<tr><td>checkpoint interval</td><td>{_duration(g.interval_s)}</td></tr>"
        f"<tr><td>time lost to saves, redone work, restarts</td><td>{100 * (1 - g.useful_fraction):.1f} % of wall time</td></tr>"
        f"<tr><th>progress per wall-clock hour</th><th>{g.progress_per_hour:,.1f} one-device hours</th></tr>"
        f"<tr><th>progress per paid device-hour</th><th>{g.per_device_hour:.2f} one-device hours</th></tr>"
        f"<tr><td>paid device-hours per hour of progress</td><td>{g.paid_per_useful_hour:.2f}</td></tr>"
        f"{warn}</table>"
    )


def plan_html(model: str, optimizer: str, precision: str, batch_per_device: int, seq_len: int,
              recompute: str, device_GB: int, tokens_per_param: float = 20.0,
              device_flops_per_s: float = 4e14, max_days: float = 30.0) -> str:
    """The planner for one preset model, as a small HTML report (for ``lessonlib.book.interactive.Explorer``).

    ``device_GB`` is device memory in 10^9 bytes; training tokens are
    ``tokens_per_param`` x parameters; ``device_flops_per_s`` is the sustained rate.
    """
    check_choice("model", model, PRESETS)
    check_choice("recompute", recompute, RECOMPUTE_CHOICES)
    p = PRESETS[model]
    tokens = int(tokens_per_param * p["n_params"])
    r = plan(p["n_params"], optimizer, precision, batch_per_device, seq_len, p["layers"], p["hidden"],
             p["heads"], recompute, int(device_GB * 1e9), tokens, device_flops_per_s, max_days)
    gb = lambda b: f"{b / 1e9:,.1f} GB"  # noqa: E731
    label = {"none": "fits", "time": "fits, but too slow", "activations": "activations do not fit",
             "state": "state does not fit"}[r.failure]
    days = f"{r.days:,.1f} days" if r.days < 1000 else f"{r.days / 365:,.0f} years"
    rows = [
        ("state (weights, gradients, master, optimizer)", gb(r.state_bytes)),
        (f"activations at batch {batch_per_device} x {seq_len} tokens", gb(r.activation_bytes)),
        ("state + activations", gb(r.state_bytes + r.activation_bytes)),
        ("device memory", gb(r.device_bytes)),
        ("largest batch per device that fits", str(r.max_batch_that_fits)),
        (f"one device, {tokens_per_param:g} tokens/param at {device_flops_per_s:.0e} FLOP/s", days),
    ]
    answer = r.answer
    if r.failure == "activations":
        if r.max_batch_that_fits >= 1:
            answer += f" Here a batch per device of {r.max_batch_that_fits} already fits."
        else:
            fixes = [m for m in RECOMPUTE_CHOICES[RECOMPUTE_CHOICES.index(recompute) + 1:]
                     if plan(p["n_params"], optimizer, precision, 1, seq_len, p["layers"], p["hidden"], p["heads"],
                             m, int(device_GB * 1e9)).failure == "none"]
            answer += (f" Even batch 1 does not fit; with '{fixes[0]}' recomputation it would." if fixes else
                       " Even batch 1 with full recomputation does not fit: split the layers across devices.")
    body = "".join(f"<tr><td>{k}</td><td align=right>{v}</td></tr>" for k, v in rows)
    return (f"<table>{body}</table><p><b class='wtc-verdict-{r.failure}'>{label}.</b> {answer}</p>")


def ledger_table(ledgers, formula: dict | None = None) -> str:
    """A plain-text table of one ledger or a ``{name: ledger}`` dict (sizes in binary units).

    ``formula`` optionally maps a row name to a predicted byte count to print beside it.
    """
    if isinstance(ledgers, MemoryLedger):
        ledgers = {"measured": ledgers}
    rows = ["weights", "gradients", "optimizer_state", "activations", "total", "peak"]
    names = list(ledgers)
    head = f"{'':16s}" + "".join(f"{n:>14s}" for n in names)
    if formula:
        head += f"{'formula':>14s}"
    lines = [head]
    for r in rows:
        vals = [getattr(l, r) for l in ledgers.values()]
        cells = "".join(f"{('n/a' if v is None else format_bytes(v)):>14s}" for v in vals)
        if formula:
            f = formula.get(r)
            cells += f"{('' if f is None else format_bytes(f)):>14s}"
        lines.append(f"{r:16s}" + cells)
    return "\n".join(lines)


def timing_table(t: StepTiming) -> str:
    """Plain-text table: median ms per phase, x prediction, share of step."""
    lines = [f"{'phase':12s}{'median ms':>11s}{'x prediction':>14s}{'share of step':>15s}"]
    for k in ("prediction",) + PHASES + ("step",):
        share = f"{100 * t.shares[k]:.1f} %" if k in t.shares else ""
        lines.append(f"{k:12s}{1000 * t.seconds[k]:11.3f}{t.ratios[k]:14.2f}{share:>15s}")
    return "\n".join(lines)
