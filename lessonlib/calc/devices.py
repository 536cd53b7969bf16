"""One table of devices: peak 16-bit FLOP/s with their source, and the course's stated utilisation.

Every page that turns FLOPs into time uses this table, so the same model takes
the same time on every page. Pure Python (no torch).

Peak rates are the *dense* BF16 tensor-core rates of the vendor's datasheet
(the datasheets print the rate "with sparsity", which is twice the dense one).
A training job never sustains its peak: the share it reaches is its
model-FLOPs utilisation (MFU), the FLOPs the model needs per second divided by
the peak.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import choice, positive, share


@dataclass(frozen=True)
class Device:
    """An accelerator: ``peak_flops_per_s`` (dense BF16, FLOP/s), ``memory_bytes``, and where the figures come from."""

    name: str
    peak_flops_per_s: float
    memory_bytes: float
    source: str


DEVICES = {
    "H100 SXM 80GB": Device(
        "H100 SXM 80GB", 989.4e12, 80e9,
        "NVIDIA H100 Tensor Core GPU datasheet (SXM): BF16 Tensor Core 1,979 TFLOPS with sparsity, "
        "so 989.4 TFLOPS dense; 80 GB HBM3"),
    "A100 SXM 80GB": Device(
        "A100 SXM 80GB", 312e12, 80e9,
        "NVIDIA A100 Tensor Core GPU datasheet: BF16 Tensor Core 312 TFLOPS dense (624 with sparsity); 80 GB HBM2e"),
    "H800 SXM 80GB": Device(
        "H800 SXM 80GB", 989.4e12, 80e9,
        "NVIDIA H800 SXM, the export variant of the H100 SXM: the same tensor cores (989.4 TFLOPS dense BF16) and "
        "80 GB HBM3, with NVLink cut to 400 GB/s (DeepSeek-V3 Technical Report, Section 3.1)"),
}

#: The device the course prices on when a page does not say otherwise.
DEFAULT_DEVICE = "H100 SXM 80GB"

#: The course's stated utilisation (MFU): 40 %, inside the 38-43 % that Meta reports for
#: Llama 3 405B on H100s (The Llama 3 Herd of Models, 2024, Table 4; see
#: :mod:`lessonlib.calc.published`). A well-tuned large run; small or badly
#: balanced jobs reach much less.
UTILISATION = 0.40


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
