"""One table of devices: peak 16-bit FLOP/s, memory, bandwidth and power, each with its source.

Every page that turns FLOPs into time uses this table, so the same model takes
the same time on every page, and every page prints the rate it used
(:func:`rate_text`). Pure Python (no torch).

Peak rates are the *dense* BF16 tensor-core rates of the vendor's datasheet
(the datasheets print the rate "with sparsity", which is twice the dense one).
A training job never sustains its peak: the share it reaches is its
model-FLOPs utilisation (MFU), the FLOPs the model needs per second divided by
the peak. ``power_watts`` is the board's maximum power (TDP) from the same
datasheet: what a device draws at most, the figure model cards multiply by hours.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import choice, count, positive, share


@dataclass(frozen=True)
class Device:
    """An accelerator: ``peak_flops_per_s`` (dense BF16, FLOP/s), ``memory_bytes``,
    ``memory_bandwidth`` (bytes/s), ``power_watts`` (TDP, W), and where the figures come from."""

    name: str
    peak_flops_per_s: float
    memory_bytes: float
    source: str
    memory_bandwidth: float = 0.0
    power_watts: float = 0.0
    fp8_peak_flops_per_s: float = 0.0  # dense FP8 tensor-core peak (0: the device has no FP8 tensor cores)


_H100_SHEET = "NVIDIA H100 Tensor Core GPU datasheet"
_A100_SHEET = "NVIDIA A100 Tensor Core GPU datasheet"

DEVICES = {
    "H100 SXM 80GB": Device(
        "H100 SXM 80GB", 989.4e12, 80e9,
        f"{_H100_SHEET} (SXM): BF16 Tensor Core 1,979 TFLOPS with sparsity, so 989.4 TFLOPS dense; "
        "FP8 Tensor Core 3,958 TFLOPS with sparsity, so 1,979 dense; 80 GB HBM3 at 3.35 TB/s; max TDP 700 W",
        3.35e12, 700.0, 1979e12),
    "H100 PCIe 80GB": Device(
        "H100 PCIe 80GB", 756.5e12, 80e9,
        f"{_H100_SHEET} (PCIe): BF16 Tensor Core 1,513 TFLOPS with sparsity, so 756.5 TFLOPS dense; "
        "FP8 3,026 with sparsity, 1,513 dense; 80 GB HBM2e at 2.0 TB/s; max TDP 350 W", 2.0e12, 350.0, 1513e12),
    "H800 SXM 80GB": Device(
        "H800 SXM 80GB", 989.4e12, 80e9,
        "NVIDIA H800 Tensor Core GPU datasheet (SXM): the H100 SXM's compute (BF16 Tensor Core 1,979 TFLOPS with "
        "sparsity, 989.4 dense) and memory (80 GB HBM3, 3.35 TB/s) with a narrower NVLink (400 GB/s); TDP 700 W. "
        "The device of DeepSeek-V3's run (FP8 as the H100 SXM's: 1,979 TFLOPS dense)", 3.35e12, 700.0, 1979e12),
    "A100 SXM 80GB": Device(
        "A100 SXM 80GB", 312e12, 80e9,
        f"{_A100_SHEET}: BF16 Tensor Core 312 TFLOPS dense (624 with sparsity); 80 GB HBM2e at 2,039 GB/s; "
        "max TDP 400 W", 2.039e12, 400.0),
    "A100 SXM 40GB": Device(
        "A100 SXM 40GB", 312e12, 40e9,
        f"{_A100_SHEET}: BF16 Tensor Core 312 TFLOPS dense (624 with sparsity); 40 GB HBM2 at 1,555 GB/s; "
        "max TDP 400 W", 1.555e12, 400.0),
}

#: The H100 SXM's link to its host, one direction: the datasheet's "PCIe Gen5: 128 GB/s" counts both directions.
#: A device-to-host copy (an asynchronous checkpoint's staging) moves at most this many bytes a second.
HOST_LINK_BYTES_PER_S = 64e9
HOST_LINK_SOURCE = f"{_H100_SHEET}: PCIe Gen5, 128 GB/s in both directions together"

#: The device the course prices on when a page does not say otherwise.
DEFAULT_DEVICE = "H100 SXM 80GB"

#: The course's stated utilisation: a large run's per-step MFU (model FLOPs per second of a training step over
#: the peak, with the pipeline's bubble, the communication nothing hides and every other wait inside the step),
#: 40 %, inside the 38-43 % that Meta reports for Llama 3 405B on H100s (The Llama 3 Herd of Models, 2024,
#: Table 4; see :mod:`lessonlib.calc.published`). Failures, restarts and saves lie outside the step: the
#: goodput of :mod:`lessonlib.calc.goodput` prices them on top, so a run's whole bill implies less (34.5 % for
#: Llama 3 405B). Pages that turn a run's FLOPs into time or GPU-hours use it. A well-tuned large run; small or
#: badly balanced jobs reach much less. It is NOT :data:`KERNEL_EFFICIENCY`.
UTILISATION = 0.40

#: The per-kernel efficiency the layout model assumes (:mod:`lessonlib.calc.layout`): the share of its dense
#: peak one device's kernels reach while they run, with no bubble and no waiting. It is the course's
#: assumption, not a published or measured figure (no source is kept for it): a round share for large bf16
#: matrix products, above what whole steps reach (attention and normalisation reach less). The layout page
#: shows how its predicted MFU moves with it, and the goodput page uses it as the rate of a GPU with nothing
#: to wait for (the unit of a one-device hour in :mod:`lessonlib.calc.scale`). It is NOT a run's MFU: the
#: layout model adds the bubble and the exposed communication to it, and its predicted MFU is this
#: efficiency x the step's compute share (compute seconds over step seconds) x the model's FLOPs over the
#: FLOPs executed (recomputation runs more). That prediction, not this share, is what compares with
#: :data:`UTILISATION` and with Llama 3's reported 38-43 %.
KERNEL_EFFICIENCY = 0.60


def device(name: str = DEFAULT_DEVICE) -> Device:
    """The :class:`Device` called ``name`` (a key of :data:`DEVICES`)."""
    return DEVICES[choice("name", name, DEVICES)]


def sustained_flops_per_s(name: str = DEFAULT_DEVICE, utilisation: float = UTILISATION) -> float:
    """FLOP/s one device delivers on a training step: peak x ``utilisation`` (a fraction, 0 to 1].

    >>> f"{sustained_flops_per_s():.3e}"   # an H100 at 40 %
    '3.958e+14'
    """
    u = share("utilisation", utilisation)
    positive("utilisation", u)
    return device(name).peak_flops_per_s * u


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def rate_text(flops_per_s: float, digits: int = 4) -> str:
    """A rate as a page prints it, to ``digits`` significant digits: the number that was used, not a rounder one.

    >>> rate_text(sustained_flops_per_s())
    '3.958 × 10¹⁴ FLOP/s'
    >>> rate_text(2e11)
    '2 × 10¹¹ FLOP/s'
    """
    x = positive("flops_per_s", flops_per_s)
    digits = count("digits", digits, maximum=17)  # a float holds 17 significant digits at most
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    return f"{mantissa} × 10{str(int(exponent)).translate(_SUPERSCRIPT)} FLOP/s"
