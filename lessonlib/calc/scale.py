"""One model of scale, from one device to a real run's 16,384: what a paid device-hour buys. Pure Python.

Progress is counted in **one-device hours**: the work one device does in an hour
at the per-device throughput linear scaling would keep, never failing. A paid
device-hour of a job on ``world_size`` devices buys

    step efficiency x useful fraction,

* **step efficiency** E(N) = 1 / (s N + 1 - s): Amdahl's speedup / devices for a
  serial share s. s is not assumed: :func:`fit_serial_share` fits it to two
  published points of one run at one global batch (strong scaling), Llama 3's
  Table 4, where the throughput per GPU fell from 430 TFLOP/s on 8,192 GPUs to
  400 on 16,384;
* **useful fraction** = the share of wall time not lost to failures: saves,
  redone work and restarts, priced exactly by :func:`lessonlib.calc.goodput.goodput`.

The part that would be serial in a naive data-parallel job, the optimizer
update every replica repeats, is computed from the state's bytes and the
device's memory bandwidth, with and without ZeRO (which splits the update
over the data-parallel copies, so nothing of it is repeated). A fixed serial
share of 0.1 % (942.5x on 16,384 devices, 0.058 per device) is kept as
``contrast_*``: what a run would buy if the serial share were 0.1 %.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import count, positive, result, share
from . import hardware as _hardware, published as _pub
from .amdahl import speedup_from_share
from .goodput import Goodput, goodput
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

    fit:                    the Amdahl fit the step efficiency comes from (:class:`AmdahlFit`)
    serial_share:           its fitted serial share s
    step_efficiency:        E(world_size) = 1 / (s world_size + 1 - s): the share of linear scaling kept
    speedup:                world_size x step_efficiency
    mfu:                    the MFU the job's devices sustained per step (published)
    one_device_utilisation: mfu / step_efficiency: the utilisation per device linear scaling would keep (the
                            unit of a one-device hour; derived from the fit, not assumed)
    update_share:           the optimizer update's share of one device's time for a global batch
    update_efficiency_dp:   step efficiency if every device repeated the whole update (pure data parallelism)
    update_efficiency_layout: the same when tensor x pipeline parallelism splits the update ``model_parallel`` ways
    device_mtbf_hours, checkpoint_seconds, restart_seconds: the failure inputs the goodput was priced with
    goodput:                the failures, priced exactly (:class:`lessonlib.calc.goodput.Goodput`)
    per_device_hour:        one-device hours per paid device-hour = step_efficiency x goodput.useful_fraction
    bill_utilisation:       the utilisation the published bill implies (every paid hour, every stage)
    bill_per_device_hour:   step_efficiency x bill_utilisation / mfu: the same read off the bill
    contrast_speedup, contrast_per_device_hour: if the serial share were ``CONTRAST_SERIAL_SHARE``, same failures
    """

    world_size: int
    fit: AmdahlFit
    serial_share: float
    step_efficiency: float
    speedup: float
    mfu: float
    one_device_utilisation: float
    update_share: float
    update_efficiency_dp: float
    update_efficiency_layout: float
    model_parallel: int
    device_mtbf_hours: float
    checkpoint_seconds: float
    restart_seconds: float
    goodput: Goodput
    per_device_hour: float
    bill_utilisation: float
    bill_per_device_hour: float
    contrast_serial_share: float
    contrast_speedup: float
    contrast_per_device_hour: float


def scale_account(fit, mfu, n_params, tokens_per_step, peak_flops_per_s, memory_bandwidth, device_mtbf_hours,
                  checkpoint_seconds, restart_seconds, bill_utilisation, model_parallel=1,
                  update_bytes_per_param=UPDATE_BYTES_PER_PARAM) -> ScaleAccount:
    """The :class:`ScaleAccount` of a synchronous job on ``fit.world_size_high`` devices.

    ``fit`` (:func:`fit_serial_share`) gives the step efficiency; ``mfu`` is what each device sustained per
    step there (a fraction of ``peak_flops_per_s``, FLOP/s); ``n_params`` and ``tokens_per_step`` (the global
    batch) give the step's 6 N B FLOPs and the update's ``update_bytes_per_param`` x N bytes at
    ``memory_bandwidth`` (bytes/s); ``model_parallel`` = tensor x pipeline degree (the ways the update is split
    without ZeRO); failures: ``device_mtbf_hours``, ``checkpoint_seconds``, ``restart_seconds``;
    ``bill_utilisation``: the utilisation the published bill implies.
    """
    if not isinstance(fit, AmdahlFit):
        raise TypeError(f"fit must be an AmdahlFit (from fit_serial_share), got {type(fit).__name__}")
    n, e = fit.world_size_high, fit.efficiency_high
    m = positive("mfu", share("mfu", mfu))
    u1 = result(m / e, "mfu and fit", "utilisation linear scaling would keep")
    if u1 > 1:
        raise ValueError(f"mfu ({m:.3g}) over the fit's efficiency ({e:.3g}) exceeds the peak")
    mp = count("model_parallel", model_parallel)
    if n % mp:
        raise ValueError(f"model_parallel ({mp}) must divide devices ({n}): each data-parallel copy is a whole layout")
    # one device's time for a global batch at the linear-scaling utilisation: its compute and one update
    t_compute = 6 * positive("n_params", n_params) * positive("tokens_per_step", tokens_per_step) / (
        positive("peak_flops_per_s", peak_flops_per_s) * u1)
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
        world_size=n, fit=fit, serial_share=fit.serial_share, step_efficiency=e, speedup=n * e, mfu=m,
        one_device_utilisation=u1, update_share=t_update / one, update_efficiency_dp=eff_dp,
        update_efficiency_layout=eff_layout, model_parallel=mp, device_mtbf_hours=g.job_mtbf_s * n / 3600,
        checkpoint_seconds=float(checkpoint_seconds), restart_seconds=float(restart_seconds), goodput=g,
        per_device_hour=g.per_device_hour, bill_utilisation=bill_u,
        bill_per_device_hour=result(e * bill_u / m, "bill_utilisation and mfu", "one-device hours per paid device-hour"),
        contrast_serial_share=CONTRAST_SERIAL_SHARE, contrast_speedup=c_speed,
        contrast_per_device_hour=c.per_device_hour)


def llama3_scale(tflops_at_16k=None) -> ScaleAccount:
    """The account of Llama 3 405B's main pre-training stage on 16,384 H100s, from the published figures.

    The step efficiency is Amdahl's form fitted (:func:`fit_serial_share`) to Table 4's strong scaling: 430
    TFLOP/s per GPU on 8,192 GPUs, 400 on 16,384, at the same 16M-token batch; ``tflops_at_16k`` replaces the
    second figure (None: the published 400), for a calculator. The MFU is that throughput over the H100's dense
    peak; the failures are the reliability snapshot's unexpected interruptions; the save is the largest per-GPU
    checkpoint on every GPU at the storage's sustained rate; the restart is the longest that keeps the report's
    'more than 90 %' effective training time at the best interval
    (:func:`lessonlib.calc.pricing.restart_for_useful_fraction`); the bill's utilisation is 6ND over the model
    card's GPU-hours. Both chapter 3 pages that speak of 16,384 devices print this one account.
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
    save = save_seconds(v["ckpt_per_gpu_max"] * n, v["storage_sustained"])
    restart = restart_for_useful_fraction(v["effective_training"], optimal_interval(save, job_mtbf), save, job_mtbf)
    flops = 6 * v["params"] * v["tokens"]
    return scale_account(
        fit, t16 * 1e12 / h100.peak_flops_per_s, v["params"], v["tokens_per_batch"], h100.peak_flops_per_s,
        h100.memory_bandwidth, job_mtbf * n / 3600, save, restart,
        implied_utilisation(flops, v["gpu_hours"], h100.peak_flops_per_s), model_parallel=int(v["tp"] * v["pp"]))


@dataclass(frozen=True)
class Rung:
    """One line of :func:`scale_ladder`: ``what`` the job does, its ``step_efficiency`` (None for the
    bill, which is not a step) and the one-device hours a paid device-hour buys (``per_device_hour``)."""

    what: str
    step_efficiency: float | None
    per_device_hour: float


def scale_ladder(account: ScaleAccount) -> list:
    """The account as a ladder of :class:`Rung`, from the fixed-serial-share contrast to the published bill.

    Every rung but the last pays the same failures (``account.goodput.useful_fraction``).
    """
    if not isinstance(account, ScaleAccount):
        raise TypeError(f"account must be a ScaleAccount (from scale_account), got {type(account).__name__}")
    a, useful = account, account.goodput.useful_fraction
    return [
        Rung(f"if the serial share were {100 * a.contrast_serial_share:g} % (a contrast: "
             f"{a.contrast_serial_share / a.update_share:.0f}x the update's share)",
             a.contrast_speedup / a.world_size, a.contrast_per_device_hour),
        Rung("every device repeats the whole optimizer update (data parallelism alone)",
             a.update_efficiency_dp, a.update_efficiency_dp * useful),
        Rung(f"the tensor x pipeline layout splits the update {a.model_parallel} ways, no ZeRO",
             a.update_efficiency_layout, a.update_efficiency_layout * useful),
        Rung(f"the run: Amdahl fitted to Table 4's {a.fit.throughput_low:g} -> {a.fit.throughput_high:g} TFLOP/s per "
             f"GPU from {a.fit.world_size_low:,} to {a.fit.world_size_high:,} GPUs (s = {a.serial_share:.1e})",
             a.step_efficiency, a.per_device_hour),
        Rung("the published bill: every paid hour, every stage", None, a.bill_per_device_hour),
    ]
