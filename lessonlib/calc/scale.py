"""One model of scale, from one device to a real run's 16,384: what a paid device-hour buys. Pure Python.

Progress is counted in **one-device hours**: the work one device, running alone
at the utilisation one device attains (``one_device_utilisation``) and never
failing, does in an hour. A paid device-hour of a job on ``devices`` devices buys

    step efficiency x useful fraction,

* **step efficiency** = the MFU the job's devices sustain / the one-device
  utilisation: the share of its own speed each device keeps inside the job
  (Amdahl's speedup / devices). It comes from the run's *measured* MFU, not
  from an assumed serial share;
* **useful fraction** = the share of wall time not lost to failures: saves,
  redone work and restarts, priced exactly by :func:`lessonlib.calc.goodput.goodput`.

The serial share is then what the step efficiency leaves: Amdahl's law solved
for it, ``s = (1/e - 1) / (devices - 1)``. The part that would be serial in a
naive data-parallel job, the optimizer update every replica repeats, is
computed here from the state's bytes and the device's memory bandwidth, and
what it costs with and without ZeRO (which splits the update over the
data-parallel copies, so nothing of it is repeated). Communication hidden
behind the backward pass costs no step time; what is not hidden is inside the
measured MFU. The strong-scaling collapse of a *fixed* serial share (0.1 %
gives 942.5x on 16,384 devices, 0.058 per device) is kept as
``contrast_*``: what a run would buy if that much of its step could not divide.
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
class ScaleAccount:
    """What a paid device-hour buys on ``devices`` devices; every share is a fraction, every time in seconds.

    one_device_utilisation: the utilisation one device attains alone (an assumption)
    mfu:                    the MFU the job's devices sustained per step (measured)
    step_efficiency:        mfu / one_device_utilisation (Amdahl's speedup / devices)
    speedup:                devices x step_efficiency (one-device step time / job step time)
    serial_share:           Amdahl's serial share that step_efficiency leaves; at or below 0 when the
                            job's MFU reaches the one-device utilisation (nothing serial left that the figures see)
    update_share:           the optimizer update's share of one device's time for a global batch
    update_efficiency_dp:   step efficiency if every device repeated the whole update (pure data parallelism)
    update_efficiency_layout: the same when tensor x pipeline parallelism splits the update ``model_parallel`` ways
    device_mtbf_hours, checkpoint_seconds, restart_seconds: the failure inputs the goodput was priced with
    goodput:                the failures, priced exactly (:class:`lessonlib.calc.goodput.Goodput`)
    per_device_hour:        one-device hours per paid device-hour = step_efficiency x goodput.useful_fraction
    bill_per_device_hour:   the same read off the published bill: its implied utilisation / one_device_utilisation
    contrast_speedup, contrast_per_device_hour: a fixed serial share of ``CONTRAST_SERIAL_SHARE``, same failures
    """

    devices: int
    one_device_utilisation: float
    mfu: float
    step_efficiency: float
    speedup: float
    serial_share: float
    update_share: float
    update_efficiency_dp: float
    update_efficiency_layout: float
    model_parallel: int
    device_mtbf_hours: float
    checkpoint_seconds: float
    restart_seconds: float
    goodput: Goodput
    per_device_hour: float
    bill_per_device_hour: float
    contrast_serial_share: float
    contrast_speedup: float
    contrast_per_device_hour: float


def scale_account(devices, mfu, one_device_utilisation, n_params, tokens_per_step, peak_flops_per_s,
                  memory_bandwidth, device_mtbf_hours, checkpoint_seconds, restart_seconds,
                  bill_utilisation, model_parallel=1, update_bytes_per_param=UPDATE_BYTES_PER_PARAM) -> ScaleAccount:
    """The :class:`ScaleAccount` of a synchronous job on ``devices`` devices.

    ``mfu`` is what each device sustained per step (a fraction of ``peak_flops_per_s``, FLOP/s);
    ``one_device_utilisation`` what one device attains alone; ``n_params`` and
    ``tokens_per_step`` (the global batch) give the step's 6 N B FLOPs and the update's
    ``update_bytes_per_param`` x N bytes at ``memory_bandwidth`` (bytes/s);
    ``model_parallel`` = tensor x pipeline degree (the ways the update is split without ZeRO);
    failures: ``device_mtbf_hours``, ``checkpoint_seconds``, ``restart_seconds``;
    ``bill_utilisation``: the utilisation the published bill implies.
    """
    n = count("devices", devices)
    u1 = positive("one_device_utilisation", share("one_device_utilisation", one_device_utilisation))
    m = positive("mfu", share("mfu", mfu))
    mp = count("model_parallel", model_parallel)
    if n % mp:
        raise ValueError(f"model_parallel ({mp}) must divide devices ({n}): each data-parallel copy is a whole layout")
    e = m / u1
    s = (1 / e - 1) / (n - 1) if n > 1 else 0.0
    # one device's time for a global batch: its compute and one update
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
    bill_u = share("bill_utilisation", bill_utilisation)
    return ScaleAccount(
        devices=n, one_device_utilisation=u1, mfu=m, step_efficiency=e, speedup=n * e, serial_share=s,
        update_share=t_update / one, update_efficiency_dp=eff_dp, update_efficiency_layout=eff_layout,
        model_parallel=mp, device_mtbf_hours=g.job_mtbf_s * n / 3600, checkpoint_seconds=float(checkpoint_seconds),
        restart_seconds=float(restart_seconds), goodput=g, per_device_hour=g.per_device_hour,
        bill_per_device_hour=result(bill_u / u1, "bill_utilisation and one_device_utilisation",
                                    "one-device hours per paid device-hour"),
        contrast_serial_share=CONTRAST_SERIAL_SHARE, contrast_speedup=c_speed,
        contrast_per_device_hour=c.per_device_hour)


def llama3_scale(one_device_utilisation=_hardware.UTILISATION) -> ScaleAccount:
    """The account of Llama 3 405B's main pre-training stage on 16,384 H100s, from the published figures.

    The MFU is Table 4's 16,384-GPU, 8K-context throughput over the H100's dense peak; the failures are the
    reliability snapshot's unexpected interruptions; the save is the largest per-GPU checkpoint on every GPU at
    the storage's sustained rate; the restart is the longest that keeps the report's 'more than 90 %' effective
    training time at the best interval (:func:`lessonlib.calc.pricing.restart_for_useful_fraction`); the bill's
    utilisation is 6ND over the model card's GPU-hours. ``one_device_utilisation`` defaults to the course's
    stated :data:`lessonlib.calc.hardware.UTILISATION`. Both chapter 3 pages that speak of 16,384 devices print
    this one account.
    """
    v = {k: f.value for k, f in _pub.LLAMA3_405B.items()}
    h100 = _hardware.device(_pub.LLAMA3_DEVICE)
    n = int(v["gpus"])
    job_mtbf = mtbf_seconds(v["snapshot_days"] * 86400, int(v["unexpected"]))
    save = save_seconds(v["ckpt_per_gpu_max"] * n, v["storage_sustained"])
    restart = restart_for_useful_fraction(v["effective_training"], optimal_interval(save, job_mtbf), save, job_mtbf)
    flops = 6 * v["params"] * v["tokens"]
    return scale_account(
        n, v["tflops_16k_gpus"] * 1e12 / h100.peak_flops_per_s, one_device_utilisation, v["params"],
        v["tokens_per_batch"], h100.peak_flops_per_s, h100.memory_bandwidth, job_mtbf * n / 3600, save, restart,
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
        Rung(f"a fixed serial share of {100 * a.contrast_serial_share:g} % (the strong-scaling contrast)",
             a.contrast_speedup / a.devices, a.contrast_per_device_hour),
        Rung("every device repeats the whole optimizer update (data parallelism alone)",
             a.update_efficiency_dp, a.update_efficiency_dp * useful),
        Rung(f"the tensor x pipeline layout splits the update {a.model_parallel} ways, no ZeRO",
             a.update_efficiency_layout, a.update_efficiency_layout * useful),
        Rung("the run as measured (ZeRO, overlapped communication): its MFU / one device's",
             a.step_efficiency, a.per_device_hour),
        Rung("the published bill: every paid hour, every stage", None, a.bill_per_device_hour),
    ]
