"""Sharding the training state across devices: ZeRO stages 1, 2 and 3, and FSDP.

Data parallelism keeps a full copy of the training state on every device.
ZeRO (Rajbhandari et al., 2020) removes the copies in three stages; each
device then keeps 1/N of a part of the state, N being the number of devices:

* stage 1 shards the optimizer state (with mixed precision, also the fp32
  master copy of the weights, which only the optimizer step reads);
* stage 2 shards the gradients too;
* stage 3 shards the weights too. PyTorch's ``fully_shard`` (FSDP2) is
  stage 3: between steps each device keeps one shard of every weight, its
  gradient and its optimizer state; a layer's full weights are gathered just
  before the layer runs and freed after.

:func:`zero_state_bytes` gives the bytes per device. :func:`fsdp_shard_rows`
and :func:`fsdp_local_numel` say exactly what FSDP2 keeps on each rank, padding
included, and :func:`zero_step_traffic` the collectives of one step.

Pure Python: no torch needed.
"""
from __future__ import annotations

import math

from ..checks import choice as check_choice, count as check_count, sequence as check_sequence, text as check_text
from .memory import OPTIMIZER_BYTES_PER_PARAM, StateBytes, training_state_bytes
from .precision import precision_name

ZERO_STAGES = (0, 1, 2, 3)

#: What each stage shards (stage 0 is plain data parallelism: nothing).
SHARDED_PARTS = {
    0: (),
    1: ("master_weights", "optimizer_state"),
    2: ("master_weights", "optimizer_state", "gradients"),
    3: ("master_weights", "optimizer_state", "gradients", "weights"),
}


def check_stage(name: str, value) -> int:
    """``value`` as a ZeRO stage (0, 1, 2 or 3); ``ValueError``/``TypeError`` naming ``name`` otherwise."""
    return check_count(check_text("name", name), value, minimum=min(ZERO_STAGES), maximum=max(ZERO_STAGES))


def zero_state_bytes(n_params, world_size, stage, optimizer: str = "adam", precision: str = "bf16_master") -> StateBytes:
    """Bytes of training state that each of ``world_size`` devices keeps under ZeRO ``stage``.

    ``n_params`` parameters; ``world_size`` data-parallel devices (N); ``stage``
    0 (plain data parallelism, a full copy everywhere), 1 (optimizer state and
    master copy sharded), 2 (gradients too) or 3 (weights too); ``optimizer``
    and ``precision`` as in :func:`lessonlib.memory.training_state_bytes`.

    A sharded part keeps ``ceil(n_params / world_size)`` parameters' worth of
    bytes per device: when N does not divide the parameter count, the
    flattened state is padded to a multiple of N, as ZeRO and FSDP1 do (FSDP2
    shards each tensor on its own; see :func:`fsdp_local_numel`). Unsharded
    parts keep all ``n_params``. Returns a
    :class:`~lessonlib.memory.StateBytes` (bytes per device).

    Adam in mixed precision (16 bytes per parameter) on 8 devices, 7.5e9 parameters:

    >>> [zero_state_bytes(7_500_000_000, 8, s).total // 10**9 for s in (0, 1, 2, 3)]
    [120, 41, 28, 15]
    """
    n = check_count("n_params", n_params)
    d = check_count("world_size", world_size)
    stage = check_stage("stage", stage)
    check_choice("optimizer", optimizer, OPTIMIZER_BYTES_PER_PARAM)
    per = training_state_bytes(1, optimizer, precision_name(precision))  # bytes per parameter of each part
    w, g, m, o = per.weights, per.gradients, per.master_weights, per.optimizer_state
    shard = -(-n // d)  # ceil(n / d) parameters per device once padded
    sharded = SHARDED_PARTS[stage]
    part = {name: per * (shard if name in sharded else n)
            for name, per in (("weights", w), ("gradients", g), ("master_weights", m), ("optimizer_state", o))}
    return StateBytes(**part, total=sum(part.values()))


def fsdp_shard_rows(rows, world_size, rank) -> int:
    """Rows of a tensor's first dimension that FSDP2 gives ``rank`` out of ``world_size``.

    FSDP2 splits every parameter along dim 0 like ``torch.chunk``: chunks of
    ``ceil(rows / world_size)`` rows, the last ones shorter or empty. For its
    collectives it pads each chunk to the full chunk size, so the all-gather
    and reduce-scatter buffers hold ``world_size * ceil(rows / world_size)`` rows.

    >>> [fsdp_shard_rows(10, 4, r) for r in range(4)]
    [3, 3, 3, 1]
    >>> [fsdp_shard_rows(1, 2, r) for r in range(2)]
    [1, 0]
    """
    rows = check_count("rows", rows, minimum=0)
    d = check_count("world_size", world_size)
    r = check_count("rank", rank, minimum=0)
    if r >= d:
        raise ValueError(f"rank must be below world_size={d}, got {r}")
    chunk = -(-rows // d)
    return max(0, min(chunk, rows - r * chunk))


def _shape(name, shape) -> tuple:
    if isinstance(shape, (str, bytes, dict)):
        raise ValueError(f"{name} must be a list of tensor shapes, got {shape!r}")
    try:
        dims = tuple(shape)
    except TypeError:
        raise ValueError(f"{name} must be a list of tensor shapes, got {shape!r}") from None
    return tuple(check_count(name, x, minimum=0) for x in dims)


def fsdp_local_numel(shapes, world_size, rank) -> int:
    """Elements of the parameters in ``shapes`` that FSDP2 keeps on ``rank`` (its local shards).

    ``shapes`` is a list of parameter shapes (tuples of ints; ``()`` for a
    scalar, which stays whole on rank 0). Multiply by the bytes per element
    of weights, gradients or optimizer state to get bytes. With every first
    dimension divisible by ``world_size`` this is exactly ``total / world_size``.

    >>> fsdp_local_numel([(256, 64), (256,)], 2, 0), fsdp_local_numel([(1, 256)], 2, 1)
    (8320, 0)
    """
    d = check_count("world_size", world_size)
    r = check_count("rank", rank, minimum=0)
    if r >= d:
        raise ValueError(f"rank must be below world_size={d}, got {r}")
    total = 0
    for shape in check_sequence("shapes", shapes, allow_empty=True):
        dims = _shape("shapes", shape)
        if not dims:  # a scalar parameter is not split
            total += 1 if r == 0 else 0
            continue
        rest = math.prod(dims[1:])
        total += fsdp_shard_rows(dims[0], d, r) * rest
    return total


def fsdp_padded_numel(shapes, world_size) -> int:
    """Elements FSDP2 all-gathers for the parameters in ``shapes``: each dim 0 padded to a multiple of ``world_size``."""
    d = check_count("world_size", world_size)
    total = 0
    for shape in check_sequence("shapes", shapes, allow_empty=True):
        dims = _shape("shapes", shape)
        rows = dims[0] if dims else 1
        total += d * -(-rows // d) * math.prod(dims[1:])
    return total


def zero_step_traffic(n_params, world_size, stage, bytes_per_value=2) -> dict:
    """The collectives of one data-parallel training step under ZeRO ``stage``, in bytes.

    Returns ``{"all_reduce": B, "reduce_scatter": B, "all_gather": B}``: the
    full size of the tensors each collective handles in one step (a
    collective over a tensor of B bytes is listed as B, whatever its shards),
    with ``bytes_per_value`` bytes per gradient or weight value (2 for
    16-bit, 4 for fp32), ``n_params`` padded to a multiple of ``world_size``
    as in :func:`zero_state_bytes`. Also ``"sent_per_device"``: the bytes each device sends with
    ring algorithms, all-reduce ``2(N-1)/N × B``, reduce-scatter and
    all-gather ``(N-1)/N × B`` each.

    * stage 0: one all-reduce of the gradients;
    * stages 1 and 2: a reduce-scatter of the gradients (each device needs
      only its shard's sum) and an all-gather of the updated weights: the
      same bytes sent as the all-reduce;
    * stage 3: the weights are all-gathered twice (forward, and again in
      backward, since they were freed in between) and the gradients
      reduce-scattered: 1.5 × the traffic of stage 0.

    >>> t = zero_step_traffic(1000, 4, 3, bytes_per_value=4)
    >>> t["all_gather"], t["reduce_scatter"], t["sent_per_device"]
    (8000, 4000, 9000.0)
    """
    n = check_count("n_params", n_params)
    d = check_count("world_size", world_size)
    stage = check_stage("stage", stage)
    v = check_count("bytes_per_value", bytes_per_value)
    full = d * -(-n // d) * v
    if stage == 0:
        out = {"all_reduce": full, "reduce_scatter": 0, "all_gather": 0}
    elif stage in (1, 2):
        out = {"all_reduce": 0, "reduce_scatter": full, "all_gather": full}
    else:
        out = {"all_reduce": 0, "reduce_scatter": full, "all_gather": 2 * full}
    f = (d - 1) / d
    out["sent_per_device"] = 2 * f * out["all_reduce"] + f * (out["reduce_scatter"] + out["all_gather"])
    return out
