"""The bill of a training run in money and energy, from its device-hours. Pure Python.

GPU-hours are what a run's report publishes; what a reader pays is dollars,
kilowatt-hours and tonnes of CO2-equivalent. Each conversion takes its rate as
an argument, because each rate is an assumption with a source, not a law:

* money: device-hours x a price per device-hour (a rental price; owning the
  devices, the building and the people are other lines of the bill);
* energy: device-hours x the device's power (its TDP from the device table is
  what it draws at most; the host, network and cooling draw more, which a
  data centre's PUE, power usage effectiveness, multiplies in);
* emissions: energy x the grid's carbon intensity (tCO2eq per MWh), the
  "location-based" figure model cards publish.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import amount, positive, result

WATT_HOURS_PER_MWH = 1e6


@dataclass(frozen=True)
class Bill:
    """A run's bill: ``device_hours``, ``dollars`` (at ``price_per_device_hour``), ``energy_mwh``
    (device power x hours x ``pue``) and ``tco2`` (energy x ``tco2_per_mwh``)."""

    device_hours: float
    price_per_device_hour: float
    dollars: float
    power_watts: float
    pue: float
    energy_mwh: float
    tco2_per_mwh: float
    tco2: float


def energy_mwh(device_hours, power_watts, pue=1.0) -> float:
    """Megawatt-hours drawn by ``device_hours`` of devices at ``power_watts`` each, times ``pue`` (>= 1).

    >>> energy_mwh(1000, 700)      # a thousand H100-hours at their 700 W TDP
    0.7
    """
    p = positive("pue", pue)
    if p < 1:
        raise ValueError(f"pue must be at least 1 (a data centre cannot draw less than its devices), got {pue!r}")
    mwh = amount("device_hours", device_hours) * positive("power_watts", power_watts) * p / WATT_HOURS_PER_MWH
    return result(mwh, "device_hours, power_watts and pue", "an energy in MWh")


def carbon_intensity(tco2, device_hours, power_watts, pue=1.0) -> float:
    """The grid's carbon intensity (tCO2eq per MWh) that a published ``tco2`` implies for ``device_hours`` at ``power_watts``.

    A model card gives the emissions and the hours; dividing one by the energy
    of the other gives the intensity it used (with whatever PUE it applied folded in, when ``pue`` is 1).
    """
    e = energy_mwh(positive("device_hours", device_hours), power_watts, pue)
    return result(amount("tco2", tco2) / e, "tco2, device_hours and power_watts", "a carbon intensity in tCO2/MWh",
                  high=2.0, hint="no grid emits more than about 1.2 tCO2 per MWh (coal): check the units "
                                 "(tonnes, hours, watts)")


def bill(device_hours, price_per_device_hour, power_watts, tco2_per_mwh=0.0, pue=1.0) -> Bill:
    """The :class:`Bill` of ``device_hours``: dollars at ``price_per_device_hour`` (US$), energy at
    ``power_watts`` per device times ``pue``, emissions at ``tco2_per_mwh``.

    >>> b = bill(2.788e6, 2.0, 700)          # DeepSeek-V3's H800-hours at its report's $2
    >>> f"${b.dollars / 1e6:.3f}M, {b.energy_mwh:,.0f} MWh"
    '$5.576M, 1,952 MWh'
    """
    hours = positive("device_hours", device_hours)
    price = amount("price_per_device_hour", price_per_device_hour)
    intensity = amount("tco2_per_mwh", tco2_per_mwh)
    e = energy_mwh(hours, power_watts, pue)
    return Bill(device_hours=hours, price_per_device_hour=price,
                dollars=result(hours * price, "device_hours and price_per_device_hour", "a price in dollars"),
                power_watts=float(power_watts), pue=float(pue), energy_mwh=e, tco2_per_mwh=intensity,
                tco2=result(e * intensity, "energy and tco2_per_mwh", "emissions in tCO2eq"))
