"""Tensor parallelism with PyTorch's DTensor: ``parallelize_module``, measured.

Two measurements on ``world_size`` processes (gloo on CPU, NCCL with a GPU each):

* **An MLP block** ``Linear(h, 4h) -> GELU -> Linear(4h, h)`` split with
  ``ColwiseParallel`` (first matrix: each rank keeps a block of its output
  columns) and ``RowwiseParallel`` (second matrix: the matching block of input
  rows). Its output and input gradient are compared with the unsplit block,
  and its collectives are logged: Megatron's pattern is one all-reduce in
  forward (summing the row-split partial outputs) and one in backward
  (summing the partial input gradients of the column split).
* **A transformer layer** (:class:`TPBlock`) split the same way in attention
  and MLP: the activation bytes each rank keeps for backward, counted with
  saved-tensor hooks, against Korthikanti et al.'s
  ``s*b*h*(10 + 24/t + 5*a*s/(h*t))``
  (:func:`lessonlib.memory.activation_bytes_per_layer` with
  ``tensor_parallel=t``), and its collectives.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...checks import count as check_count, instance as check_instance, sequence as check_sequence
from ..memory import SavedTensorCounter
from ..models import MAX_PARAMS, MAX_SEQ_LEN, Dropout
from ...checks import fraction_below_one as check_fraction
from ..compat import require_all
from .launch import launch
from .collectives import CollectiveLog
from .quiet import known_warnings_silenced

__all__ = ["TPBlock", "mlp_block", "MLP_PLAN", "BLOCK_PLAN", "LocalSavedTensorCounter", "saved_and_sent",
           "run_tensor_parallel"]


def mlp_block(hidden: int) -> nn.Sequential:
    """``Linear(hidden, 4*hidden) -> GELU -> Linear(4*hidden, hidden)``."""
    hidden = check_count("hidden", hidden)
    if 8 * hidden * hidden > MAX_PARAMS:
        raise ValueError(f"hidden={hidden} gives more than the {MAX_PARAMS:,} parameters the course's models allow")
    return nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))


class TPBlock(nn.Module):
    """A transformer layer laid out so that a column split gives each rank whole heads.

    Same computation as :class:`lessonlib.models.Block` (pre-LayerNorm, math
    attention with a causal mask, 1-byte dropout masks, a 4h GELU MLP), with
    one difference: the fused QKV matrix orders its output columns head by
    head (q, k, v of head 0, then of head 1...), as Megatron-LM does, so the
    first ``3h/t`` columns a rank receives are the q, k and v of its
    ``a/t`` heads. The head count is read from the local width, so the same
    code runs unsplit and split.
    """

    def __init__(self, hidden: int, heads: int, seq_len: int, dropout: float = 0.1):
        super().__init__()
        hidden = check_count("hidden", hidden)
        heads = check_count("heads", heads, maximum=hidden)
        seq_len = check_count("seq_len", seq_len, maximum=MAX_SEQ_LEN)
        dropout = check_fraction("dropout", dropout)
        if 12 * hidden * hidden > MAX_PARAMS:
            raise ValueError(f"hidden={hidden} gives more than the {MAX_PARAMS:,} parameters the course's models allow")
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
        self.head_dim = hidden // heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.attn_drop = Dropout(dropout)
        self.drop1 = Dropout(dropout)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.drop2 = Dropout(dropout)
        self.register_buffer("causal", torch.full((seq_len, seq_len), float("-inf")).triu(1), persistent=False)

    def forward(self, x):
        b, s, _ = x.shape
        d = self.head_dim
        qkv = self.qkv(self.ln1(x)).view(b, s, -1, 3, d)  # -1: the heads this rank holds
        q, k, v = qkv.permute(3, 0, 2, 1, 4)  # each (b, local heads, s, d)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d)) + self.causal[:s, :s]
        y = self.attn_drop(scores.softmax(dim=-1)) @ v
        x = x + self.drop1(self.proj(y.transpose(1, 2).reshape(b, s, -1)))
        return x + self.drop2(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


def _plans():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    mlp = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    block = {"qkv": ColwiseParallel(), "proj": RowwiseParallel(),
             "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    return mlp, block


#: Which submodule gets which split (names as in :func:`mlp_block` and :class:`TPBlock`).
MLP_PLAN = {"0": "ColwiseParallel", "2": "RowwiseParallel"}
BLOCK_PLAN = {"qkv": "ColwiseParallel", "proj": "RowwiseParallel", "fc1": "ColwiseParallel", "fc2": "RowwiseParallel"}


def _local(t):
    return getattr(t, "_local_tensor", t)


class LocalSavedTensorCounter(SavedTensorCounter):
    """:class:`~lessonlib.memory.SavedTensorCounter` that counts a DTensor by its local shard.

    Under tensor parallelism autograd may keep a ``DTensor``; the bytes this
    rank holds are those of its local tensor.
    """

    def __init__(self, exclude=()):
        tensors = [check_instance("exclude", t, torch.Tensor, "a list of tensors")
                   for t in check_sequence("exclude", exclude, allow_empty=True)]
        super().__init__(exclude=[_local(t) for t in tensors])

    def _pack(self, t):
        super()._pack(_local(t))
        return t


def saved_and_sent(module, x) -> dict:
    """One training forward and backward of ``module`` on a fresh copy of ``x`` (a layer's input, so it needs
    a gradient): the activation bytes it saves for backward on this rank (:class:`LocalSavedTensorCounter`,
    the parameters left out) and the collectives it sends (:class:`.collectives.CollectiveLog`).

    Returns ``{"bytes", "items": [(shape, dtype, bytes)], "collectives": [(kind, phase, bytes)],
    "comm_counts": {op: count}, "output_shape"}``. The tensor- and sequence-parallel workers measure each
    layout of a layer with it.
    """
    from ..models import check_module, check_tensor

    check_module("module", module)
    check_tensor("x", x, floating=True)
    module.train()
    xi = x.clone().requires_grad_(True)
    counter = LocalSavedTensorCounter(exclude=list(module.parameters()))
    log = CollectiveLog()
    with log:
        with counter:
            y = module(xi)
        y.float().square().mean().backward()
    return {"bytes": counter.bytes, "items": [(shape, str(dtype), n) for _, shape, dtype, n in counter.items],
            "collectives": [(r.kind, r.phase, r.n_bytes) for r in log.records],
            "comm_counts": {str(k): v for k, v in log.get_comm_counts().items()}, "output_shape": tuple(y.shape)}


def _tp_worker(rank, world_size, device, progress, mlp_cfg, block_cfg):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    with known_warnings_silenced():
        _, block_plan = _plans()
        # --- MLP block: same output and input gradient as unsplit, and its collectives --------
        batch, seq, hidden = mlp_cfg
        torch.manual_seed(0)  # every rank builds the same block and input
        ref = mlp_block(hidden).to(device)  # Linear(h, 4h), GELU, Linear(4h, h): the unsplit block
        tp = mlp_block(hidden).to(device)
        tp.load_state_dict(ref.state_dict())  # the same weights, then split:
        mesh = init_device_mesh(device.type, (world_size,))  # world_size processes in one dimension
        parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x = torch.randn(batch, seq, hidden, device=device)
        x_ref, x_tp = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ref(x_ref).square().mean().backward()  # unsplit forward and backward
        log = CollectiveLog()  # CommDebugMode, which also keeps each collective's bytes
        with log:
            y_tp = tp(x_tp)
            y_tp.square().mean().backward()  # split forward and backward: the collectives are logged
        with torch.no_grad():
            y_ref = ref(x_ref)
        mlp = {
            "output_max_diff": (y_tp - y_ref).abs().max().item(),
            "output_max": y_ref.abs().max().item(),
            "input_grad_max_diff": (x_tp.grad - x_ref.grad).abs().max().item(),
            "input_grad_max": x_ref.grad.abs().max().item(),
            "weight_bytes_full": sum(p.numel() * p.element_size() for p in ref.parameters()),
            "weight_bytes_local": sum(_local(p).numel() * _local(p).element_size() for p in tp.parameters()),
            "output_bytes": y_ref.numel() * y_ref.element_size(),
            "collectives": [(r.kind, r.phase, r.n_bytes) for r in log.records],
            # each parameter as a DTensor: (name, global shape, placements, this rank's local shape)
            "layout": [(name, tuple(p.shape), str(tuple(getattr(p, "placements", ()))), tuple(_local(p).shape))
                       for name, p in tp.named_parameters()],
        }
        progress.put(1)

        # --- a transformer layer in bf16: activation bytes per rank for t = 1 and t = world ---
        batch, seq, hidden, heads = block_cfg
        torch.manual_seed(1)
        ref = TPBlock(hidden, heads, seq).to(device=device, dtype=torch.bfloat16)
        tp = TPBlock(hidden, heads, seq).to(device=device, dtype=torch.bfloat16)
        tp.load_state_dict(ref.state_dict())
        parallelize_module(tp, mesh, block_plan)
        xb = torch.randn(batch, seq, hidden, device=device, dtype=torch.bfloat16)
        acts = {t: saved_and_sent(module, xb) for t, module in ((1, ref), (world_size, tp))}
        # the split layer computes what the unsplit one does (dropout off, float32)
        ref32, tp32 = TPBlock(hidden, heads, seq, dropout=0.0).to(device), TPBlock(hidden, heads, seq, dropout=0.0).to(device)
        tp32.load_state_dict(ref32.state_dict())
        parallelize_module(tp32, mesh, block_plan)
        x32 = torch.randn(batch, seq, hidden, device=device)
        with torch.no_grad():
            block_diff = (tp32(x32) - ref32(x32)).abs().max().item()
        progress.put(1)
    return {"rank": rank, "world_size": world_size, "backend": dist.get_backend(), "mlp": mlp,
            "block": {"activations": acts, "max_diff": block_diff,
                      "config": {"batch": batch, "seq_len": seq, "hidden": hidden, "heads": heads}}}


#: The most values one activation tensor of :func:`run_tensor_parallel` may hold (256 MiB in fp32).
MAX_ACTIVATION_VALUES = 2 ** 26


def _shape(name: str, value, fields: tuple) -> tuple:
    """``value`` as a tuple of exactly ``len(fields)`` counts, named ``name``'s fields in errors."""
    value = check_sequence(name, value)
    if len(value) != len(fields):
        raise ValueError(f"{name} must be ({', '.join(fields)}): {len(fields)} numbers, got {len(value)}: {value!r}")
    return tuple(check_count(f"{name}'s {f}", v) for f, v in zip(fields, value))


def run_tensor_parallel(world_size: int = 2, mlp=(4, 64, 128), block=(2, 128, 256, 4),
                        timeout: float = 180.0) -> list:
    """Run both measurements on ``world_size`` processes; one dict per rank.

    ``mlp = (batch, seq, hidden)`` for the MLP block (float32);
    ``block = (batch, seq, hidden, heads)`` for the transformer layer
    (bfloat16, like the paper's 2-byte activations). ``world_size`` must
    divide ``heads`` and ``hidden``.

    Each dict has ``mlp``: ``output_max_diff`` / ``input_grad_max_diff``
    (against the unsplit block), ``weight_bytes_full`` / ``weight_bytes_local``,
    ``output_bytes``, ``collectives`` (``(kind, phase, bytes)``) and ``layout`` (per parameter: name,
    global shape, DTensor placements as text, local shape); and
    ``block``: ``activations[t]`` for t = 1 and t = world_size with ``bytes``
    (kept for backward on this rank), ``items`` and ``collectives``, and
    ``max_diff`` (split layer against unsplit, float32, dropout off) and
    ``config`` (the layer's ``batch``, ``seq_len``, ``hidden``, ``heads``).
    """
    from .launch import MAX_WORLD_SIZE

    world_size = check_count("world_size", world_size, minimum=2, maximum=MAX_WORLD_SIZE)
    batch, seq, hidden = _shape("mlp", mlp, ("batch", "seq", "hidden"))
    b2, s2, h2, a2 = _shape("block", block, ("batch", "seq_len", "hidden", "heads"))
    if hidden % world_size:
        raise ValueError(f"world_size={world_size} must divide mlp's hidden ({hidden}): each rank takes an equal "
                         "slice of the MLP's matrices")
    if 8 * hidden * hidden > MAX_PARAMS:
        raise ValueError(f"mlp's hidden={hidden} gives more than the {MAX_PARAMS:,} parameters the course's models allow")
    if a2 > h2 or h2 % a2:
        raise ValueError(f"block's heads ({a2}) must divide its hidden ({h2}): each head takes hidden / heads")
    if a2 % world_size or h2 % world_size:
        raise ValueError(f"world_size={world_size} must divide the layer's heads ({a2}) and hidden ({h2})")
    if s2 > MAX_SEQ_LEN:
        raise ValueError(f"block's seq_len must be at most {MAX_SEQ_LEN:,}, got {s2:,}")
    if 12 * h2 * h2 > MAX_PARAMS:
        raise ValueError(f"block's hidden={h2} gives more than the {MAX_PARAMS:,} parameters the course's models allow")
    for what, n in (("mlp's batch × seq × 4 × hidden", batch * seq * 4 * hidden),
                    ("block's batch × heads × seq_len²", b2 * a2 * s2 * s2),
                    ("block's batch × seq_len × 4 × hidden", b2 * s2 * 4 * h2)):
        if n > MAX_ACTIVATION_VALUES:
            raise ValueError(f"{what} is {n:,} values in one activation, more than the {MAX_ACTIVATION_VALUES:,} "
                             "a run of the course holds")
    require_all('comm_debug_mode')  # before starting processes: one clear error on an older torch
    return launch(_tp_worker, world_size, args=((batch, seq, hidden), (b2, s2, h2, a2)), timeout=timeout,
                  progress_total=2 * world_size, desc=f"tensor parallel on {world_size} processes")
