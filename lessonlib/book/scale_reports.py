"""The one account of scale as a page shows it: the ladder table and its calculator (renders only)."""
from __future__ import annotations

from ..calc.scale import llama3_scale, scale_ladder
from ..checks import amount as _check_amount, positive as _check_positive
from .tables import table


def ladder_rows(account) -> list:
    """The rows of :func:`lessonlib.calc.scale.scale_ladder` as text: what, step efficiency, per paid device-hour."""
    return [(r.what, "—" if r.step_efficiency is None else f"{r.step_efficiency:.3f}", f"{r.per_device_hour:.3f}")
            for r in scale_ladder(account)]


LADDER_HEADER = ["what the job does", "step efficiency (speedup / devices, of linear scaling)",
                 "one-device hours per paid device-hour"]


def ladder_table(account):
    """The ladder of ``account`` as an HTML table."""
    return table(LADDER_HEADER, ladder_rows(account))


def scale_report(tflops_at_16k) -> str:
    """The scale calculator's answer (for an Explorer): Llama 3 405B's account on 16,384 GPUs if each GPU had
    sustained ``tflops_at_16k`` TFLOP/s there (Table 4: 400) against 430 on 8,192, Amdahl's form fitted to the two."""
    a = llama3_scale(_check_positive("tflops_at_16k", tflops_at_16k))
    return (f"<p>Serial share fitted {a.serial_share:.1e}; step efficiency {a.step_efficiency:.3f} of linear "
            f"scaling; failures leave {100 * a.goodput.useful_fraction:.0f} % of the time useful; a paid GPU-hour "
            f"buys {a.per_device_hour:.3f} one-device hours.</p>" + ladder_table(a))


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
