"""One model of scale, from one device to a real run's 16,384: what a paid device-hour buys. Pure Python.

The account starts from published figures only. Llama 3's Table 4 gives what each GPU sustained per step on
16,384 GPUs (400 TFLOP/s: a model-FLOPs utilisation, MFU, of 40.4 % of the H100's dense peak); the report
gives its effective training time (more than 90 %); the model card gives the bill (30.84 M GPU-hours, which
6ND turns into a utilisation of 34.5 %). Their product,

    MFU x useful fraction  (about 36 % of the peak, per paid GPU-hour of the main stage),

is what a paid GPU-hour delivered, against the bill's 34.5 % over every stage and every paid hour.

Progress is also counted in **one-device hours**: the work one GPU does in an hour computing at the course's
per-kernel efficiency (:data:`lessonlib.calc.hardware.KERNEL_EFFICIENCY`, 60 %: the rate with nothing to wait
for, the same rate the layout model prices compute at). A paid device-hour buys

    step efficiency x useful fraction,

* **step efficiency** = MFU / kernel efficiency: the share of a step the GPUs spend computing at that rate
  (the layout model's compute share, for Meta's layout, is the same quantity predicted);
* **useful fraction** = the share of wall time not lost to failures: saves, redone work and restarts, priced
  exactly by :func:`lessonlib.calc.goodput.goodput`.

Two contrasts are kept beside the account. Amdahl's form fitted to Table 4's strong scaling (430 TFLOP/s per
GPU on 8,192 GPUs, 400 on 16,384, one batch) gives a serial share (:func:`fit_serial_share`), although the drop
is the pipeline's bubble and the exposed data-parallel time (:func:`llama3_throughput_drop`), which a constant
serial share cannot describe; and a fixed serial share of
0.1 % (942.5x on 16,384 devices) shows the collapse a serial share that size would cause (``contrast_*``). The
optimizer update every replica would repeat without ZeRO is computed from the state's bytes and the device's
memory bandwidth.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import count, positive, result, share
from . import hardware as _hardware, published as _pub
from .amdahl import speedup_from_share
from .goodput import Goodput, goodput
from .memory import checkpoint_bytes
from .pricing import implied_utilisation, mtbf_seconds, restart_for_useful_fraction, save_seconds
from .reliability import optimal_interval

#: Bytes the Adam update moves per parameter in mixed precision: it reads and writes the
#: 16-byte state once (an upper bound: the 16-bit gradients are read, not written).
UPDATE_BYTES_PER_PARAM = 32

#: The fixed serial share of the strong-scaling contrast (what a run would buy if 0.1 % of its step did not divide).
CONTRAST_SERIAL_SHARE = 0.001


@dataclass(frozen=True)
class AmdahlFit:
    """Amdahl's serial share fitted to two throughputs per device of one job at one global batch.

    world_size_low, world_size_high: the two device counts
    throughput_low, throughput_high: what each device sustained there (any one unit, e.g. TFLOP/s)
    serial_share:                    s, the fraction of the one-device step that does not divide
    efficiency_low, efficiency_high: E(N) = 1 / (s N + 1 - s), the share of linear scaling kept (a fraction)
    """

    world_size_low: int
    world_size_high: int
    throughput_low: float
    throughput_high: float
    serial_share: float
    efficiency_low: float
    efficiency_high: float


def efficiency_from_share(serial_share, world_size) -> float:
    """Amdahl's per-device efficiency, speedup / devices = 1 / (s N + 1 - s), a fraction of linear scaling.

    >>> round(efficiency_from_share(0.001, 16384), 4)
    0.0575
    """
    s = share("serial_share", serial_share)
    n = count("world_size", world_size)
    return 1.0 / (s * n + 1.0 - s)


def fit_serial_share(world_size_low, throughput_low, world_size_high, throughput_high) -> AmdahlFit:
    """The serial share s for which Amdahl's form E(N) = 1 / (s N + 1 - s) drops by the measured ratio.

    Assumption: the per-device throughput is proportional to E(N), the global batch (the work of a step) is
    the same at both counts (strong scaling), and everything that does not scale is one serial share s; the
    form is fitted to two published points, so it describes them and says nothing of why the throughput fell.
    Solving E(N_high) / E(N_low) = r = throughput_high / throughput_low for s gives

        s = (1 - r) / (r (N_high - 1) - (N_low - 1)).

    Llama 3's Table 4 (430 TFLOP/s per GPU on 8,192 GPUs, 400 on 16,384, both at 16M tokens per batch):

    >>> f = fit_serial_share(8192, 430, 16384, 400)
    >>> f"{f.serial_share:.2e}", round(f.efficiency_high, 3)
    ('9.90e-06', 0.86)
    """
    n1, n2 = count("world_size_low", world_size_low), count("world_size_high", world_size_high)
    if n2 <= n1:
        raise ValueError(f"world_size_high ({n2}) must exceed world_size_low ({n1})")
    t1, t2 = positive("throughput_low", throughput_low), positive("throughput_high", throughput_high)
    if t2 > t1:
        raise ValueError(f"throughput_high ({t2:g}) is above throughput_low ({t1:g}): the throughput per device "
                         "rose, and no serial share fits (Amdahl's efficiency only falls as devices grow)")
    r = t2 / t1
    denominator = r * (n2 - 1) - (n1 - 1)
    if denominator <= 0:
        raise ValueError(f"throughput_high / throughput_low ({r:.3g}) falls faster than Amdahl's law allows "
                         f"between {n1} and {n2} devices (at most to {n1 / n2:.3g}, when nothing divides)")
    s = min(1.0, (1 - r) / denominator)
    return AmdahlFit(n1, n2, t1, t2, s, efficiency_from_share(s, n1), efficiency_from_share(s, n2))


@dataclass(frozen=True)
class ScaleAccount:
    """What a paid device-hour buys on ``world_size`` devices; every share is a fraction, every time in seconds.

    mfu:                    the MFU the job's devices sustained per step (published)
    stage_utilisation:      mfu x goodput.useful_fraction: the peak's share a paid device-hour of the stage delivered
    bill_utilisation:       the utilisation the published bill implies (every paid hour, every stage)
    kernel_efficiency:      the rate with nothing to wait for, as a share of the peak (the unit of a one-device hour)
    step_efficiency:        mfu / kernel_efficiency: the share of a step spent computing at that rate
    speedup:                world_size x step_efficiency (one-device steps per step)
    per_device_hour:        one-device hours per paid device-hour = step_efficiency x goodput.useful_fraction
    bill_per_device_hour:   bill_utilisation / kernel_efficiency: the same read off the bill
    fit:                    Amdahl's form fitted to the two published throughputs (:class:`AmdahlFit`; a contrast)
    serial_share:           its fitted serial share s
    update_share:           the optimizer update's share of one device's time for a global batch
    update_efficiency_dp:   step efficiency if every device repeated the whole update (pure data parallelism)
    update_efficiency_layout: the same when tensor x pipeline parallelism splits the update ``model_parallel`` ways
    device_mtbf_hours, checkpoint_seconds, restart_seconds: the failure inputs the goodput was priced with
                            (device_mtbf_hours: the job's interruptions spread over its devices)
    goodput:                the failures, priced exactly (:class:`lessonlib.calc.goodput.Goodput`)
    contrast_speedup, contrast_per_device_hour: if the serial share were ``CONTRAST_SERIAL_SHARE``, same failures
    """

    world_size: int
    mfu: float
    stage_utilisation: float
    bill_utilisation: float
    kernel_efficiency: float
    step_efficiency: float
    speedup: float
    per_device_hour: float
    bill_per_device_hour: float
    fit: AmdahlFit
    serial_share: float
    update_share: float
    update_efficiency_dp: float
    update_efficiency_layout: float
    model_parallel: int
    device_mtbf_hours: float
    checkpoint_seconds: float
    restart_seconds: float
    goodput: Goodput
    contrast_serial_share: float
    contrast_speedup: float
    contrast_per_device_hour: float


def scale_account(fit, mfu, n_params, tokens_per_step, peak_flops_per_s, memory_bandwidth, device_mtbf_hours,
                  checkpoint_seconds, restart_seconds, bill_utilisation, model_parallel=1,
                  update_bytes_per_param=UPDATE_BYTES_PER_PARAM,
                  kernel_efficiency=_hardware.KERNEL_EFFICIENCY) -> ScaleAccount:
    """The :class:`ScaleAccount` of a synchronous job on ``fit.world_size_high`` devices.

    ``mfu`` is what each device sustained per step there (a fraction of ``peak_flops_per_s``, FLOP/s), at most
    ``kernel_efficiency`` (the share of the peak a device's kernels reach with nothing to wait for); ``fit``
    (:func:`fit_serial_share`) is kept as a contrast; ``n_params`` and ``tokens_per_step`` (the global batch)
    give the step's 6 N B FLOPs and the update's ``update_bytes_per_param`` x N bytes at ``memory_bandwidth``
    (bytes/s); ``model_parallel`` = tensor x pipeline degree (the ways the update is split without ZeRO);
    failures: ``device_mtbf_hours``, ``checkpoint_seconds``, ``restart_seconds``; ``bill_utilisation``: the
    utilisation the published bill implies.
    """
    if not isinstance(fit, AmdahlFit):
        raise TypeError(f"fit must be an AmdahlFit (from fit_serial_share), got {type(fit).__name__}")
    n = fit.world_size_high
    m = positive("mfu", share("mfu", mfu))
    k = positive("kernel_efficiency", share("kernel_efficiency", kernel_efficiency))
    if m > k:
        raise ValueError(f"mfu ({m:.3g}) exceeds kernel_efficiency ({k:.3g}): a step cannot sustain more than its "
                         "kernels reach with nothing to wait for")
    e = m / k
    mp = count("model_parallel", model_parallel)
    if n % mp:
        raise ValueError(f"model_parallel ({mp}) must divide devices ({n}): each data-parallel copy is a whole layout")
    # one device's time for a global batch at the kernel rate: its compute and one update
    t_compute = 6 * positive("n_params", n_params) * positive("tokens_per_step", tokens_per_step) / (
        positive("peak_flops_per_s", peak_flops_per_s) * k)
    t_update = positive("update_bytes_per_param", update_bytes_per_param) * n_params / positive(
        "memory_bandwidth", memory_bandwidth)
    one = t_compute + t_update
    eff_dp = one / n / (t_compute / n + t_update)              # every device repeats the whole update
    eff_layout = one / n / (t_compute / n + t_update / mp)     # each copy's layout splits it mp ways
    g = goodput(n, n * e, device_mtbf_hours, checkpoint_seconds, restart_seconds)
    c_speed = speedup_from_share(CONTRAST_SERIAL_SHARE, n)
    c = goodput(n, c_speed, device_mtbf_hours, checkpoint_seconds, restart_seconds)
    bill_u = positive("bill_utilisation", share("bill_utilisation", bill_utilisation))
    return ScaleAccount(
        world_size=n, mfu=m, stage_utilisation=m * g.useful_fraction, bill_utilisation=bill_u, kernel_efficiency=k,
        step_efficiency=e, speedup=n * e, per_device_hour=g.per_device_hour,
        bill_per_device_hour=result(bill_u / k, "bill_utilisation and kernel_efficiency",
                                    "one-device hours per paid device-hour"),
        fit=fit, serial_share=fit.serial_share, update_share=t_update / one, update_efficiency_dp=eff_dp,
        update_efficiency_layout=eff_layout, model_parallel=mp, device_mtbf_hours=g.job_mtbf_s * n / 3600,
        checkpoint_seconds=float(checkpoint_seconds), restart_seconds=float(restart_seconds), goodput=g,
        contrast_serial_share=CONTRAST_SERIAL_SHARE, contrast_speedup=c_speed,
        contrast_per_device_hour=c.per_device_hour)


def llama3_scale(tflops_at_16k=None) -> ScaleAccount:
    """The account of Llama 3 405B's main pre-training stage on 16,384 H100s, from the published figures.

    The MFU is Table 4's 400 TFLOP/s per GPU over the H100's dense peak (``tflops_at_16k`` replaces the 400,
    for a calculator; None: the published figure); the failures are the reliability snapshot's unexpected
    interruptions of the job (hardware, software, hosts and network alike), spread over its GPUs; the save is
    the checkpoint itself (:func:`lessonlib.calc.memory.checkpoint_bytes`: no gradients) at the storage's
    sustained rate, as page 3.12 prices it; the restart is the longest that
    keeps the report's 'more than 90 %' effective training time at the best interval
    (:func:`lessonlib.calc.pricing.restart_for_useful_fraction`); the bill's utilisation is 6ND over the model
    card's GPU-hours. Amdahl's form fitted to Table 4's 430 TFLOP/s on 8,192 GPUs and this figure on 16,384
    (:func:`fit_serial_share`) is kept as a contrast. The goodput page prints this one account.
    """
    v = {k: f.value for k, f in _pub.LLAMA3_405B.items()}
    t16 = v["tflops_16k_gpus"] if tflops_at_16k is None else positive("tflops_at_16k", tflops_at_16k)
    try:
        fit = fit_serial_share(int(v["gpus_first_stage"]), v["tflops_8k_gpus"], int(v["gpus"]), t16)
    except ValueError as err:  # the fit names its own arguments; say which of the caller's gave them
        raise ValueError(f"tflops_at_16k ({t16:g}) against {v['tflops_8k_gpus']:g} on "
                         f"{int(v['gpus_first_stage']):,} GPUs: {err}") from None
    h100 = _hardware.device(_pub.LLAMA3_DEVICE)
    n = int(v["gpus"])
    job_mtbf = mtbf_seconds(v["snapshot_days"] * 86400, int(v["unexpected"]))
    save = save_seconds(checkpoint_bytes(int(v["params"])), v["storage_sustained"])
    restart = restart_for_useful_fraction(v["effective_training"], optimal_interval(save, job_mtbf), save, job_mtbf)
    flops = 6 * v["params"] * v["tokens"]
    return scale_account(
        fit, t16 * 1e12 / h100.peak_flops_per_s, v["params"], v["tokens_per_batch"], h100.peak_flops_per_s,
        h100.memory_bandwidth, job_mtbf * n / 3600, save, restart,
        implied_utilisation(flops, v["gpu_hours"], h100.peak_flops_per_s), model_parallel=int(v["tp"] * v["pp"]))


@dataclass(frozen=True)
class Rung:
    """One line of :func:`scale_ladder`: ``what`` a paid device-hour is counted over, the share of the peak it
    delivered (``utilisation``, a fraction) and the one-device hours it bought (``per_device_hour``)."""

    what: str
    utilisation: float
    per_device_hour: float


def scale_ladder(account: ScaleAccount) -> list:
    """The account as a ladder of :class:`Rung`, from a GPU with nothing to wait for to the published bill,
    with the fixed-serial-share contrast last."""
    if not isinstance(account, ScaleAccount):
        raise TypeError(f"account must be a ScaleAccount (from scale_account), got {type(account).__name__}")
    a, useful = account, account.goodput.useful_fraction
    k = a.kernel_efficiency
    return [
        Rung("one GPU's kernels with nothing to wait for (the course's kernel efficiency, an assumption)", k, 1.0),
        Rung(f"a step on {a.world_size:,} GPUs: Table 4's {a.fit.throughput_high:g} TFLOP/s per GPU (MFU)",
             a.mfu, a.step_efficiency),
        Rung(f"the main stage's paid hours: that MFU × at least {100 * useful:.0f} % effective training time",
             a.stage_utilisation, a.per_device_hour),
        Rung("the published bill: 6ND over every paid GPU-hour, every stage", a.bill_utilisation,
             a.bill_per_device_hour),
        Rung(f"a contrast: a fixed serial share of {100 * a.contrast_serial_share:g} % instead, same failures",
             k * a.contrast_per_device_hour, a.contrast_per_device_hour),
    ]


@dataclass(frozen=True)
class ThroughputDrop:
    """Meta's 8K step on Table 4's two GPU counts (``world_sizes``: fewer, more), the same degrees and global
    batch, priced as :func:`lessonlib.calc.layout_search.llama3_reported_step` prices it (page 3.11's model).
    Per copy, in seconds, one value per world size: ``compute_s``, ``bubble_s`` (the pipeline's idle time),
    ``data_comm_s`` (the data-parallel time the last micro-batch's backward leaves exposed), ``step_s`` (the whole
    step, the other exposed communication included); ``mfu`` the utilisation each implies. ``drop`` is the
    per-GPU throughput lost from the fewer GPUs to the more (1 - mfu[1] / mfu[0]); ``bubble_part`` and
    ``data_part`` are the shares of it the bubble and the exposed data-parallel time cause (fractions of the
    throughput on the fewer GPUs); the rest of the step grows with the compute and adds nothing."""

    world_sizes: tuple
    compute_s: tuple
    bubble_s: tuple
    data_comm_s: tuple
    step_s: tuple
    mfu: tuple
    drop: float
    bubble_part: float
    data_part: float


def llama3_throughput_drop() -> ThroughputDrop:
    """Why each GPU of Llama 3 405B's 8K run sustains less on 16,384 GPUs than on 8,192 (Table 4), in page 3.11's
    step model: a copy's compute halves with its micro-batches, while the pipeline's bubble and the exposed
    data-parallel time do not. Each world size is priced exactly as ``llama3_reported_step`` prices 16,384 (tests
    check that the two agree there): the once-a-step reduction with its reduce-scatter in FP32, hidden behind the
    last micro-batch's backward only. A copy's step at the fewer GPUs is r times the compute of the more (r = 2);
    the drop splits exactly into the terms of the step: (r k_more - k_fewer) / (r step_more) for each term k.
    """
    from dataclasses import replace
    from .layout import layout_cost
    from .layout_search import published_layout_cost, published_models

    name = "Llama 3 405B, 8K context"
    model, cluster, _ = published_models()[name]
    lay = published_layout_cost(name, zero=1).layout
    fewer = int(_pub.LLAMA3_405B["gpus_first_stage"].value)
    rows = []
    for n in (fewer, cluster.world_size):
        data = lay.data * n // cluster.world_size
        once = layout_cost(model, replace(cluster, world_size=n), replace(lay, data=data))
        rs, ag = once.data_traffic["reduce_scatter"], once.data_traffic["all_gather"]
        total = once.data_comm_total_s * (1 + rs / (rs + ag))  # the reduce-scatter in FP32: its bytes doubled
        exposed = max(0.0, total - once.compute_s * 2 / 3 / (model.global_batch // data))
        step = once.step_s - once.data_comm_s + exposed
        rows.append((once.compute_s, once.bubble_s, exposed, step, once.mfu * once.step_s / step))
    (c0, b0, e0, s0, m0), (c1, b1, e1, s1, m1) = rows
    r = c0 / c1
    return ThroughputDrop(
        (fewer, cluster.world_size), (c0, c1), (b0, b1), (e0, e1), (s0, s1), (m0, m1),
        drop=result(1 - m1 / m0, "the two steps", "a share of the throughput", high=1.0),
        bubble_part=result((r * b1 - b0) / (r * s1), "the bubbles", "a share of the throughput", high=1.0),
        data_part=result((r * e1 - e0) / (r * s1), "the exposed data-parallel times", "a share of the throughput",
                         high=1.0))
