"""Pricing a published training run with the course's formulas. Pure Python.

Each function is one step of the bill: compute to GPU-hours at a utilisation,
the utilisation a published bill implies, the state and activations one device
holds under a tensor x pipeline layout, the job's MTBF from a count of
failures, and a save time from checkpoint bytes and storage bandwidth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..checks import count, positive, result, share
from .memory import activation_bytes, training_state_bytes

SECONDS_PER_HOUR = 3600.0


def gpu_hours(total_flops, peak_flops_per_s, utilisation) -> float:
    """Device-hours to do ``total_flops`` on devices of ``peak_flops_per_s`` running at ``utilisation`` (0 to 1]."""
    u = positive("utilisation", share("utilisation", utilisation))
    hours = positive("total_flops", total_flops) / (positive("peak_flops_per_s", peak_flops_per_s) * u) / SECONDS_PER_HOUR
    return result(hours, "total_flops, peak_flops_per_s and utilisation", "device-hours")


def implied_utilisation(total_flops, device_hours, peak_flops_per_s) -> float:
    """The utilisation a bill implies: ``total_flops`` / (``device_hours`` x 3600 x ``peak_flops_per_s``).

    Over a whole bill it counts every paid hour (failures, restarts, evaluation,
    other phases), so it is lower than the MFU of a running step. A utilisation
    above 1 is refused: the devices cannot do more than their peak, and the usual
    cause is ``total_flops`` counted from a mixture-of-experts model's *total*
    parameters instead of the *active* ones each token uses.
    """
    u = positive("total_flops", total_flops) / (
        positive("device_hours", device_hours) * SECONDS_PER_HOUR * positive("peak_flops_per_s", peak_flops_per_s))
    return result(u, "total_flops, device_hours and peak_flops_per_s", "a utilisation", high=1.0,
                  hint="a device cannot exceed its peak. For a mixture-of-experts model, count total_flops from "
                       "the active parameters per token (6 × active parameters × tokens), not the total parameters")


def bill_step_seconds(device_hours, world_size, tokens, tokens_per_step) -> float:
    """The mean seconds a step took, as a bill implies it: ``device_hours`` over ``world_size`` devices is the run's wall
    time; ``tokens`` over ``tokens_per_step`` its steps. Every paid hour counts (restarts, evaluation, a smaller
    batch early in the run), so it is an upper bound on a running step's time, not a measurement of one.

    >>> round(bill_step_seconds(2.664e6, 2048, 14.8e12, 15360 * 4096), 1)   # DeepSeek-V3's pre-training
    19.9
    """
    wall = positive("device_hours", device_hours) * SECONDS_PER_HOUR / count("world_size", world_size)
    steps = positive("tokens", tokens) / positive("tokens_per_step", tokens_per_step)
    return result(wall / steps, "device_hours, world_size, tokens and tokens_per_step", "seconds a step")


@dataclass(frozen=True)
class RunPrice:
    """A run priced from both its parameter counts: ``flops`` = 6 x active x tokens (the compute),
    ``state_bytes`` from the total parameters (the memory), ``gpu_hours`` at the utilisation given,
    ``devices_for_state``: the fewest devices whose memory holds the state alone."""

    total_params: float
    active_params: float
    flops: float
    state_bytes: float
    gpu_hours: float
    devices_for_state: int


def price_run(total_params, tokens, peak_flops_per_s, utilisation, memory_bytes, active_params=None,
              optimizer="adam", precision="bf16_master") -> RunPrice:
    """Price a run: the *active* parameters (per token) price the FLOPs, the *total* parameters the memory.

    For a dense model ``active_params`` is the total (the default). A mixture-of-experts
    model holds every expert's weights and optimizer state (the total) but each token
    passes through only the experts its router picks (the active parameters): DeepSeek-V3
    holds 671B parameters and computes with 37B per token.

    >>> p = price_run(671e9, 14.8e12, 989.4e12, 0.4, 80e9, active_params=37e9)
    >>> f"{p.flops:.3g} FLOPs, {p.state_bytes / 1e12:.1f} TB of state"
    '3.29e+24 FLOPs, 10.7 TB of state'
    """
    total = count("total_params", total_params)
    active = total if active_params is None else count("active_params", active_params)
    if active > total:
        raise ValueError(f"active_params ({active:.4g}) must be at most total_params ({total:.4g}): a token cannot "
                         "use more parameters than the model has (are the two swapped?)")
    flops = 6.0 * active * positive("tokens", tokens)
    state = training_state_bytes(total, optimizer, precision).total
    return RunPrice(total_params=total, active_params=active, flops=flops, state_bytes=state,
                    gpu_hours=gpu_hours(flops, peak_flops_per_s, utilisation),
                    devices_for_state=math.ceil(state / positive("memory_bytes", memory_bytes)))


def state_bytes_per_device(n_params, tensor=1, pipeline=1, optimizer="adam", precision="bf16_master") -> float:
    """Training-state bytes one device holds when the weights are split ``tensor`` x ``pipeline`` ways.

    ``n_params`` is the *total* parameter count (for a mixture of experts, every expert's).

    Tensor parallelism splits each layer's matrices, pipeline parallelism
    splits the layers, so each device holds 1 / (tensor x pipeline) of the
    weights, gradients, master copy and optimizer state (data-parallel copies
    are left whole here; sharding them too is ZeRO/FSDP).
    """
    t, p = count("tensor", tensor), count("pipeline", pipeline)
    return training_state_bytes(n_params, optimizer, precision).total / (t * p)


def activation_bytes_per_device(seq_len, micro_batch, hidden, heads, layers, tensor=1, pipeline=1,
                                recompute="none") -> float:
    """Activation bytes on the busiest device of a tensor x pipeline layout (Korthikanti et al., 2022).

    The first pipeline stage holds ``layers / pipeline`` layers and, in a
    1F1B schedule, up to ``pipeline`` micro-batches in flight: together about the
    activations of all ``layers`` for one micro-batch (``ceil(layers / pipeline)``
    layers x ``pipeline`` micro-batches). Tensor parallelism with
    sequence parallelism divides every term by ``tensor``. Uses
    :func:`lessonlib.calc.memory.activation_bytes` (a GPT-shaped layer).
    """
    micro_batch = count("micro_batch", micro_batch)
    t, p = count("tensor", tensor), count("pipeline", pipeline)
    layers, heads = count("layers", layers), count("heads", heads)
    if p > layers:
        raise ValueError(f"pipeline ({p}) must be at most layers ({layers}): each pipeline stage needs a layer")
    if heads % t:
        raise ValueError(f"tensor ({t}) must divide heads ({heads}): each device takes whole attention heads")
    stage_layers = math.ceil(layers / p)  # the first stage's share, rounded up
    one_stage = activation_bytes(seq_len, micro_batch, hidden, heads, stage_layers, recompute, tensor_parallel=t,
                                 attention="stored", sequence_parallel=True)  # the paper's scores; every term / t
    return float(one_stage * p)


def mtbf_seconds(span_seconds, failures) -> float:
    """The mean time between failures observed: ``span_seconds`` / ``failures``."""
    return result(positive("span_seconds", span_seconds) / count("failures", failures),
                  "span_seconds and failures", "an MTBF in seconds")


def save_seconds(checkpoint_bytes, bandwidth_bytes_per_s) -> float:
    """Seconds to write ``checkpoint_bytes`` at ``bandwidth_bytes_per_s`` (the storage's aggregate rate)."""
    seconds = positive("checkpoint_bytes", checkpoint_bytes) / positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    return result(seconds, "checkpoint_bytes and bandwidth_bytes_per_s", "a save time in seconds")


def restart_for_useful_fraction(useful_fraction, interval_seconds, checkpoint_seconds, mtbf_seconds) -> float:
    """The restart time (seconds) at which the expected useful share of wall time equals ``useful_fraction``.

    Inverts :func:`lessonlib.calc.reliability.expected_overhead`: useful =
    τ / ((M + R)(exp((τ + C)/M) - 1)), so R = τ / (useful (exp((τ + C)/M) - 1)) - M.
    Returns a negative number when saves and redone work alone already cost more.
    """
    f = positive("useful_fraction", share("useful_fraction", useful_fraction))
    t = positive("interval_seconds", interval_seconds)
    c = positive("checkpoint_seconds", checkpoint_seconds)
    m = positive("mtbf_seconds", mtbf_seconds)
    x = (t + c) / m
    if x > 700:  # exp(x) beyond a float: the first term is below 1e-290 s, so R is -M to float precision
        return -m
    e = math.expm1(x)
    if e == 0.0:  # x below the smallest float: expm1(x) = x, and R = M (τ / (useful (τ + C)) - 1)
        return m * (t / (t + c) / f - 1)
    return t / f / e - m
