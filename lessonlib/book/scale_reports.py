"""The one account of scale as a page shows it: the ladder table and its calculator (renders only)."""
from __future__ import annotations

from ..calc.scale import llama3_scale, scale_ladder
from ..checks import amount as _check_amount, positive as _check_positive
from .tables import table


def ladder_rows(account) -> list:
    """The rows of :func:`lessonlib.calc.scale.scale_ladder` as text: what, the share of the peak, and that share
    over the step's MFU (what a paid GPU-hour delivers relative to the same GPU's steps). The rungs from the step
    to the bill only: the kernel efficiency above them is an assumption, and the fixed-serial-share contrast below
    them is no part of the run's story."""
    return [(r.what, f"{100 * r.utilisation:.1f} %", f"{r.utilisation / account.mfu:.2f}")
            for r in scale_ladder(account)[1:-1]]


LADDER_HEADER = ["what a paid GPU-hour is counted over", "share of the peak delivered",
                 "relative to the step's own rate (÷ MFU)"]


def ladder_table(account):
    """The ladder of ``account`` as an HTML table."""
    return table(LADDER_HEADER, ladder_rows(account))


def scale_report(tflops_at_16k) -> str:
    """The scale calculator's answer (for an Explorer): Llama 3 405B's account on 16,384 GPUs if each GPU had
    sustained ``tflops_at_16k`` TFLOP/s there (Table 4: 400), with the same failures and kernel efficiency."""
    a = llama3_scale(_check_positive("tflops_at_16k", tflops_at_16k))
    return table(None, [
        ("MFU per step", f"{100 * a.mfu:.1f} %"),
        (f"× at least {100 * a.goodput.useful_fraction:.0f} % effective training time", f"at least "
         f"{100 * a.stage_utilisation:.1f} % of the peak per paid GPU-hour"),
        (f"one-device hours per paid GPU-hour (÷ the {100 * a.kernel_efficiency:.0f} % kernel efficiency)",
         f"{a.per_device_hour:.3f}"),
        (f"Amdahl's serial share fitted to {a.fit.throughput_low:g} → {a.fit.throughput_high:g} TFLOP/s (a contrast)",
         f"{a.serial_share:.1e}"),
    ], strong=(1,))


def bill_report(price_per_gpu_hour, pue, tco2_per_mwh) -> str:
    """The money-and-energy calculator's answer for Llama 3.1 405B's published GPU-hours (for an Explorer):
    dollars at ``price_per_gpu_hour`` (US$), energy at the H100's TDP times ``pue``, emissions at ``tco2_per_mwh``."""
    from ..calc import bill as _bill, hardware as _hardware, published as _pub

    price_per_gpu_hour = _check_amount("price_per_gpu_hour", price_per_gpu_hour)
    pue = _check_positive("pue", pue)
    tco2_per_mwh = _check_amount("tco2_per_mwh", tco2_per_mwh)
    hours = _pub.LLAMA3_405B["gpu_hours"].value
    b = _bill.bill(hours, price_per_gpu_hour, _hardware.device(_pub.LLAMA3_DEVICE).power_watts, tco2_per_mwh, pue)
    return table(["line of the bill", "value"], [
        ("GPU-hours (model card)", f"{b.device_hours / 1e6:.2f} million"),
        ("price per GPU-hour (an assumption)", f"{b.price_per_device_hour:.2f} US dollars"),
        ("dollars", f"{b.dollars / 1e6:,.1f} million US dollars"),
        (f"energy at {b.power_watts:.0f} W per GPU × PUE {b.pue:g}", f"{b.energy_mwh:,.0f} MWh"),
        (f"emissions at {b.tco2_per_mwh:.3f} tCO2eq/MWh", f"{b.tco2:,.0f} tCO2eq"),
    ])
