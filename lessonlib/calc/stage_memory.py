"""What the busiest device of a pipeline keeps: the rules of the interleaved schedule, and the activation bytes
of its first stage. One formula, used by the layout model (:func:`lessonlib.calc.layout.layout_cost`) and by
every page that prints a published layout's activations (through
:func:`lessonlib.calc.layout_search.published_activation_bytes`). Bytes; pure Python (no torch).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..checks import MAX_COUNT, choice, count, flag, positive
from .memory import activation_bytes_per_layer
from .recompute import matmul_outputs_bytes_per_layer
from .sharding import ZERO_STAGES, zero_state_bytes

RECOMPUTE = ("none", "save_matmuls", "full")  # of lessonlib.calc.recompute.RECOMPUTE_POLICIES

#: The tensors one layer keeps for backward, per token, without dropout and with a fused attention kernel
#: (Korthikanti et al.'s list, masks left out): ``(tensor, values in units of the hidden width h, kept with
#: nothing recomputed, kept by ``"save_matmuls"``)``. Nothing recomputed keeps 16 h values a token, 32 bytes
#: at 16 bits (:func:`lessonlib.calc.memory.activation_bytes_per_layer` less the two dropout masks); ``"save_matmuls"``
#: (the weight products' outputs saved) keeps 10 h, 20 bytes
#: (:func:`lessonlib.calc.recompute.matmul_outputs_bytes_per_layer`), and rebuilds the rest in backward.
LAYER_ACTIVATIONS = (
    ("the layer's input (the first LayerNorm's input)", 1, True, True),
    ("the first LayerNorm's output (the QKV product's input)", 1, True, False),
    ("queries, keys and values (the QKV product's output)", 3, True, True),
    ("attention's output (the output projection's input)", 1, True, False),
    ("the output projection's output", 1, False, True),
    ("the residual sum (the second LayerNorm's input)", 1, True, False),
    ("the second LayerNorm's output (the MLP's input)", 1, True, False),
    ("the MLP's first product (the GELU's input)", 4, True, True),
    ("the GELU's output (the MLP's second product's input)", 4, True, False),
    ("the MLP's second product's output", 1, False, True),
)
ATTENTION = ("fused", "stored")


def interleaving_problem(layers, pipeline, virtual, micro_batches) -> str:
    """Why ``virtual`` stages per device cannot interleave this pipeline, or ``""`` when they can.

    The busiest stage holds ``ceil(layers / pipeline)`` layers, and ``virtual`` may cut it into at most that many
    chunks (one layer each at the finest). Chunks need not be equal: the layers are dealt into
    ``pipeline x virtual`` chunks as evenly as they go, at most ``ceil(layers / (pipeline x virtual))`` to a chunk
    (:func:`busiest_chunk_share` prices the unevenness in the bubble), the same rule for every layout, and there
    must be a pipeline to interleave. The micro-batch count is free: the schedule as first published ran them in
    rounds of ``pipeline`` and needed a multiple of it, but PyTorch's ``ScheduleInterleaved1F1B`` relaxes
    that rule and Llama 3's modified schedule runs any number. With fewer micro-batches than stages the
    pipeline cannot fill, which :func:`interleaved_bubble_work_fraction` prices.

    >>> interleaving_problem(126, 16, 8, 16)
    ''
    >>> interleaving_problem(86, 2, 64, 64)[:29]
    'virtual 64 chunks cannot shar'
    """
    layers, p = count("layers", layers), count("pipeline", pipeline)
    v, m = count("virtual", virtual), count("micro_batches", micro_batches)
    if v == 1:
        return ""
    if p == 1:
        return f"virtual {v} needs a pipeline: with pipeline 1 there is nothing to interleave"
    stage_layers = math.ceil(layers / p)
    if v > stage_layers:
        return (f"virtual {v} chunks cannot share the busiest stage's {stage_layers} layers "
                f"(ceil(layers {layers} / pipeline {p})): at most one chunk a layer")
    return ""


def busiest_chunk_share(layers, pipeline, virtual=1) -> float:
    """The busiest chunk's layers over the average chunk's: ``ceil(L / (p v)) x p v / L``, at least 1.

    The ``layers`` are dealt into ``pipeline x virtual`` chunks (``virtual`` 1: one chunk a stage); the pipeline's
    fill and drain run at the pace of its busiest chunk, so the bubble that :func:`interleaved_bubble_work_fraction`
    gives for equal chunks is this much longer. Two layouts with as many layer slots (``p x v x ceil(L / (p v))``)
    get the same share: Llama 3's 126 layers in 8 stages of 8 two-layer chunks or 16 stages of 8 one-layer chunks
    both leave 2 slots of 128 empty (Meta's run took one layer from its first and last stages, which also hold the
    embedding and the output layer).

    >>> busiest_chunk_share(126, 8, 8) == busiest_chunk_share(126, 16, 8) == 128 / 126
    True
    >>> busiest_chunk_share(32, 4, 2)
    1.0
    """
    layers, p, v = count("layers", layers), count("pipeline", pipeline), count("virtual", virtual)
    if p > layers:
        raise ValueError(f"pipeline ({p}) must be at most layers ({layers})")
    why = interleaving_problem(layers, p, v, 1)
    if why:
        raise ValueError(f"virtual: {why}")
    return math.ceil(layers / (p * v)) * p * v / layers


def layer_bubble_fraction(layers, pipeline, virtual, micro_batches) -> float:
    """Idle time over compute of (interleaved) 1F1B for a model of ``layers`` layers: the equal-chunk bubble
    (:func:`interleaved_bubble_work_fraction`) times :func:`busiest_chunk_share`. The one bubble the layout model
    (:func:`lessonlib.calc.layout.layout_cost`) and the pages that price a published layout's bubble use.

    >>> round(layer_bubble_fraction(126, 16, 8, 16), 4)   # 15 / (8 x 16) x 128 / 126
    0.119
    """
    return interleaved_bubble_work_fraction(pipeline, virtual, micro_batches) * busiest_chunk_share(
        layers, pipeline, virtual)


def interleaved_bubble_work_fraction(pipeline, virtual, micro_batches) -> float:
    """Idle time over compute of (interleaved) 1F1B with ``pipeline`` devices, ``virtual`` equal chunks a device
    and ``micro_batches``, for any count of them.

    With at least ``pipeline`` micro-batches it is ``(p - 1) / (v m)``
    (:func:`lessonlib.calc.pipeline.interleaved_bubble_fraction`). With fewer, a device that has run its
    ``m`` micro-batches through one chunk waits for the first of them to come round the other devices
    before its next chunk: ``p - m`` idle slots at each of the ``v - 1`` turns, so
    ``((p - 1) + (v - 1)(p - m)) / (v m)``, which is ``p - 1`` at one micro-batch whatever ``v`` is.
    Uneven chunks: :func:`layer_bubble_fraction`.

    >>> interleaved_bubble_work_fraction(16, 4, 16), interleaved_bubble_work_fraction(16, 4, 1)
    (0.234375, 15.0)
    """
    p, v, m = count("pipeline", pipeline), count("virtual", virtual), count("micro_batches", micro_batches)
    return ((p - 1) + (v - 1) * max(0, p - m)) / (v * m)


def stage_in_flight(pipeline, micro_batches, virtual=1, *, rank=0, dualpipe=False) -> float:
    """Micro-batches device ``rank`` of the pipeline (0 the first) holds at its peak, each counted as a whole
    stage's layers (a number of micro-batches; a fraction when the interleaved chunks held do not make whole stages).

    1F1B: ``min(p - rank, m)``. DualPipe (``virtual`` 1, ``rank`` 0 only): ``min(p + 1, m)`` (the DeepSeek-V3
    report, Table 2: ``PP + 1``). Interleaved 1F1B, ``v`` chunks of ``L / (p v)`` layers a device: a device runs
    its warm-up of ``2(p - 1 - rank) + (v - 1) r`` chunk-forwards and one more before its first backward, but
    never more than the ``m v`` chunk-forwards of its whole step, so it holds
    ``min(m v, (v - 1) r + 2(p - 1 - rank) + 1)`` chunks, ``/ v`` stages. ``r``, the micro-batches in a round,
    is ``p`` when ``p`` divides ``m`` (Megatron-LM's rounds); PyTorch's ``ScheduleInterleaved1F1B`` runs
    ``m // (m // p)`` (``m`` below ``p``), which this follows. With ``p`` dividing ``m`` the first device holds
    ``min(m v, p v + p - 1)`` chunks: at ``m > p`` the factor over 1F1B's ``p`` is ``1 + (p - 1) / (p v)``
    (Korthikanti et al. 2022); at ``m = p`` the whole step's chunk-forwards are in flight and it is 1.
    ``tests/test_pipeline_schedules.py`` checks every device against :func:`lessonlib.calc.pipeline.peak_in_flight`.

    >>> stage_in_flight(16, 16, 8), stage_in_flight(16, 32, 8) == 16 * (1 + 15 / 128)
    (16.0, True)
    """
    p, m, v = count("pipeline", pipeline), count("micro_batches", micro_batches), count("virtual", virtual)
    r = count("rank", rank, minimum=0, maximum=p - 1)
    flag("dualpipe", dualpipe)
    if dualpipe:
        if v > 1 or r:
            raise ValueError(f"dualpipe is priced on its first device, one chunk a direction: rank must be 0 and "
                             f"virtual 1 (got rank {r}, virtual {v})")
        return float(min(p + 1, m))
    if v == 1:
        return float(min(p - r, m))
    per_round = m // max(1, m // p)
    return min(m * v, (v - 1) * per_round + 2 * (p - 1 - r) + 1) / v


def first_stage_activation_bytes(seq_len, hidden, heads, layers, *, tensor=1, context=1, pipeline=1, virtual=1,
                                 micro_batches=1, recompute="none", attention="fused", dropout=True,
                                 dualpipe=False) -> float:
    """Activation bytes the first pipeline stage keeps at its peak, one sequence of ``seq_len`` tokens a micro-batch.

    Per layer, Korthikanti et al. (2022) with sequence parallelism (every term divided by ``tensor``) on
    ``seq_len / context`` tokens (:func:`lessonlib.calc.memory.activation_bytes_per_layer`):
    ``34 s b h / t`` with a fused attention kernel (``attention="fused"``: no s x s scores kept), plus
    ``5 a s^2 b / t`` when the scores are stored (``"stored"``, only without context parallelism).
    ``dropout=False`` (Llama 3, DeepSeek-V3: no dropout in pre-training) drops the masks the paper counts,
    one byte a value: ``2 s b h / t`` (34 becomes 32) and, with stored scores, the scores' mask and
    dropout output ``3 a s^2 b / t`` (5 becomes 2). ``recompute="save_matmuls"`` keeps only the weight
    products' outputs (:func:`lessonlib.calc.recompute.matmul_outputs_bytes_per_layer`), ``"full"`` only
    the layer's input.

    The stage holds ``ceil(layers / pipeline)`` layers for :func:`stage_in_flight` micro-batches: 1F1B's
    ``min(pipeline, micro_batches)``, the interleaved schedule's deeper warm-up (``virtual`` > 1, which
    :func:`interleaving_problem` must allow), DualPipe's one more.

    >>> first_stage_activation_bytes(8192, 16384, 128, 126, tensor=8, pipeline=16, micro_batches=16,
    ...                              dropout=False) == 32 * 8192 * 16384 / 8 * 8 * 16
    True
    """
    s, h, a = count("seq_len", seq_len), count("hidden", hidden), count("heads", heads)
    layers, t, c = count("layers", layers), count("tensor", tensor), count("context", context)
    p, v, m = count("pipeline", pipeline), count("virtual", virtual), count("micro_batches", micro_batches)
    choice("recompute", recompute, RECOMPUTE)
    choice("attention", attention, ATTENTION)
    flag("dropout", dropout)
    flag("dualpipe", dualpipe)
    if dualpipe and v > 1:
        raise ValueError(f"dualpipe runs one chunk a direction: virtual must be 1 (got {v})")
    if s % c:
        raise ValueError(f"context ({c}) must divide seq_len ({s})")
    if attention == "stored" and c > 1:
        raise ValueError(f"attention 'stored' is priced without context parallelism (context {c}): "
                         "a context-parallel attention kernel keeps no scores")
    if p > layers:
        raise ValueError(f"pipeline ({p}) must be at most layers ({layers})")
    why = interleaving_problem(layers, p, v, m)
    if why:
        raise ValueError(f"virtual: {why}")
    local = s // c
    if recompute == "save_matmuls":  # save the weight products' outputs only (the policy of page 2.3)
        per_layer = matmul_outputs_bytes_per_layer(local, 1, h) / t
    else:
        per_layer = activation_bytes_per_layer(local, 1, h, a, recompute, tensor_parallel=t, attention=attention,
                                               sequence_parallel=True, dropout=dropout)
    return float(per_layer * math.ceil(layers / p) * stage_in_flight(p, m, v, dualpipe=dualpipe))


@dataclass(frozen=True)
class StageState:
    """The training state one device of a layout keeps, in bytes, by part: the 16-bit ``weights`` and
    ``gradients``, the fp32 ``master_weights`` and Adam's ``optimizer_state`` (each whole or sharded as the
    ZeRO stage says), and DualPipe's ``second_copy``: the 16-bit weights and gradients of the second
    copy of the stage (0 for other schedules)."""

    weights: float
    gradients: float
    master_weights: float
    optimizer_state: float
    second_copy: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.master_weights + self.optimizer_state + self.second_copy


def stage_state_bytes(dense_params, expert_params=0.0, *, data=1, expert=1, zero=1, dualpipe=False) -> StageState:
    """The state of one device that holds ``dense_params`` parameters of the shared layers and ``expert_params``
    of the experts (both already divided by the tensor and pipeline degrees, and the experts by the expert
    degree), its ``data``-way copies sharding it at ZeRO ``zero`` (the experts over ``data / expert`` copies),
    Adam in mixed precision: :func:`lessonlib.calc.sharding.zero_state_bytes` for each group, 2 + 2 + 12 / N
    bytes a parameter at ZeRO-1 (N the copies that shard it). ``dualpipe`` adds DualPipe's second copy of the stage
    (DeepSeek-V3's report: twice the parameters): its 16-bit weights and gradients, sharded as the first
    copy's are; the fp32 master weights and Adam's moments are assumed sharded over both copies.
    The one count :func:`lessonlib.calc.layout.layout_cost` uses.

    >>> stage_state_bytes(1e9, data=8, zero=1).total / 1e9   # 2 + 2 + 12 / 8 bytes a parameter
    5.5
    """
    dense = positive("dense_params", dense_params)
    experts = float(expert_params)
    if experts < 0 or experts != experts:
        raise ValueError(f"expert_params must be at least 0, got {expert_params!r}")
    for name, value in (("dense_params", dense), ("expert_params", experts)):  # zero_state_bytes counts them
        if value > MAX_COUNT:
            raise ValueError(f"{name} must be at most {MAX_COUNT:,}, got {value:.3g}")
    d, e = count("data", data), count("expert", expert)
    z = count("zero", zero, minimum=min(ZERO_STAGES), maximum=max(ZERO_STAGES))
    flag("dualpipe", dualpipe)
    if d % e:
        raise ValueError(f"expert ({e}) must divide data ({d})")
    parts = [zero_state_bytes(math.ceil(dense), d, z)]
    if experts:
        parts.append(zero_state_bytes(math.ceil(experts), d // e, z))
    names = ("weights", "gradients", "master_weights", "optimizer_state")
    # DualPipe's second copy of the stage: its 16-bit weights and gradients, sharded as the first copy's are; the
    # fp32 master weights and Adam's moments are sharded over both copies, so they do not double
    second = float(sum(x.weights + x.gradients for x in parts)) if dualpipe else 0.0
    return StageState(*(float(sum(getattr(x, n) for x in parts)) for n in names), second_copy=second)
