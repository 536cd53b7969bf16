"""Sequence parallelism with PyTorch's DTensor: ``SequenceParallel`` beside the column and row splits.

Tensor parallelism (:mod:`.tensor_parallel`) splits the matrices of a layer
but leaves every process a whole copy of what lies between them: the two
LayerNorms, the dropouts after attention and after the MLP, the residual
stream. Sequence parallelism (Korthikanti et al., 2022) splits those along the
sequence: each of ``t`` processes keeps ``seq_len / t`` tokens of them. The
column-split matrix then needs the whole sequence (an **all-gather** of its
input instead of nothing) and the row-split matrix hands back a
sequence slice (a **reduce-scatter** instead of an all-reduce). A ring
all-reduce *is* a reduce-scatter followed by an all-gather, so the bytes on
the wire stay the same.

:func:`run_sequence_parallel` runs one transformer layer (:class:`SPBlock`)
with the TP-only plan and with the sequence-parallel plan
(:data:`SP_PLAN`) on ``world_size`` processes, and returns, per process, the
activation bytes kept for backward (saved-tensor hooks, counted by local
shard), the collectives logged by ``CommDebugMode`` (:class:`.CollectiveLog`)
and the difference from the unsplit layer.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...checks import amount as check_amount, count as check_count
from ..compat import require_all
from ..models import MAX_PARAMS, MAX_SEQ_LEN
from .launch import launch
from .quiet import known_warnings_silenced
from .tensor_parallel import BLOCK_PLAN, MAX_ACTIVATION_VALUES, TPBlock, saved_and_sent

__all__ = ["SPBlock", "SP_PLAN", "run_sequence_parallel"]

#: Which submodule of :class:`SPBlock` gets which split under sequence parallelism; ``Shard(1)``
#: is the sequence dimension of a ``(batch, seq_len, hidden)`` activation.
SP_PLAN = {"ln1": "SequenceParallel", "qkv": "ColwiseParallel(input_layouts=Shard(1))",
           "proj": "RowwiseParallel(output_layouts=Shard(1))", "ln2": "SequenceParallel",
           "fc1": "ColwiseParallel(input_layouts=Shard(1))", "fc2": "RowwiseParallel(output_layouts=Shard(1))"}


class SPBlock(TPBlock):
    """:class:`.TPBlock` whose forward reads the sequence length from the QKV output.

    Under sequence parallelism the layer's input on each process holds
    ``seq_len / t`` tokens, while attention (after the all-gather) sees all
    of them; the residual additions and the dropouts after attention and
    after the MLP stay on the local tokens. Unsplit, it computes exactly what
    :class:`.TPBlock` does.
    """

    def forward(self, x):
        d = self.head_dim
        qkv = self.qkv(self.ln1(x))  # under SP: all-gathered to the whole sequence here
        b, s = qkv.shape[:2]
        q, k, v = qkv.view(b, s, -1, 3, d).permute(3, 0, 2, 1, 4)  # each (b, local heads, s, d)
        scores = (q @ k.transpose(-2, -1)) * (d ** -0.5) + self.causal[:s, :s]
        y = self.attn_drop(scores.softmax(dim=-1)) @ v
        x = x + self.drop1(self.proj(y.transpose(1, 2).reshape(b, s, -1)))  # under SP: reduce-scattered
        return x + self.drop2(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


def _sp_plan():
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {"ln1": SequenceParallel(), "qkv": ColwiseParallel(input_layouts=Shard(1)),
            "proj": RowwiseParallel(output_layouts=Shard(1)), "ln2": SequenceParallel(),
            "fc1": ColwiseParallel(input_layouts=Shard(1)), "fc2": RowwiseParallel(output_layouts=Shard(1))}


def _tp_plan():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {name: ColwiseParallel() if kind == "ColwiseParallel" else RowwiseParallel()
            for name, kind in BLOCK_PLAN.items()}


def _sp_worker(rank, world_size, device, progress, cfg):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    batch, seq, hidden, heads = cfg
    local = slice(rank * seq // world_size, (rank + 1) * seq // world_size)  # this process's tokens under SP
    with known_warnings_silenced():
        mesh = init_device_mesh(device.type, (world_size,))
        out = {}
        # --- activation bytes and collectives, bf16 with 1-byte dropout masks (the paper's case) ---
        torch.manual_seed(1)  # every rank builds the same layer and input
        ref = SPBlock(hidden, heads, seq).to(device=device, dtype=torch.bfloat16)
        xb = torch.randn(batch, seq, hidden, device=device, dtype=torch.bfloat16)
        for name, plan, x_in in (("unsplit", None, xb), ("tp", _tp_plan(), xb), ("sp", _sp_plan(), xb[:, local])):
            module = ref
            if plan is not None:
                module = SPBlock(hidden, heads, seq).to(device=device, dtype=torch.bfloat16)
                module.load_state_dict(ref.state_dict())
                parallelize_module(module, mesh, plan)
            out[name] = saved_and_sent(module, x_in)
        progress.put(1)
        # --- the split layer computes what the unsplit one does (float32, dropout off) -------------
        torch.manual_seed(2)
        ref32 = SPBlock(hidden, heads, seq, dropout=0.0).to(device)
        sp32 = SPBlock(hidden, heads, seq, dropout=0.0).to(device)
        sp32.load_state_dict(ref32.state_dict())
        parallelize_module(sp32, mesh, _sp_plan())
        x32 = torch.randn(batch, seq, hidden, device=device)
        x_ref, x_sp = x32.clone().requires_grad_(True), x32[:, local].clone().requires_grad_(True)
        y_ref, y_sp = ref32(x_ref), sp32(x_sp)
        y_ref.square().sum().backward()
        y_sp.square().sum().backward()
        diff = {"output_max_diff": (y_sp - y_ref[:, local]).abs().max().item(),
                "output_max": y_ref.abs().max().item(),
                "input_grad_max_diff": (x_sp.grad - x_ref.grad[:, local]).abs().max().item(),
                "input_grad_max": x_ref.grad.abs().max().item()}
        progress.put(1)
    return {"rank": rank, "world_size": world_size, "backend": dist.get_backend(), "runs": out, "check": diff,
            "config": {"batch": batch, "seq_len": seq, "hidden": hidden, "heads": heads}}


def run_sequence_parallel(world_size: int = 2, batch: int = 2, seq_len: int = 128, hidden: int = 256,
                          heads: int = 4, timeout: float = 180.0) -> list:
    """One transformer layer unsplit, with tensor parallelism, and with sequence parallelism; one dict per rank.

    Each dict has ``runs[name]`` for ``name`` in ``"unsplit"``, ``"tp"``
    (:data:`.tensor_parallel.BLOCK_PLAN`) and ``"sp"`` (:data:`SP_PLAN`),
    measured in bfloat16 with 1-byte dropout masks: ``bytes`` (activation
    bytes this process keeps for backward), ``items`` (``(shape, dtype,
    bytes)`` of each kept tensor), ``collectives`` (``(kind, phase, bytes)``,
    bytes of the full tensor each collective handles), ``comm_counts``
    (CommDebugMode's own counts, by op name) and ``output_shape`` (the
    layer's output on this process: ``seq_len / world_size`` tokens under
    SP). ``check`` compares the sequence-parallel layer with the unsplit one
    in float32, dropout off (``output_max_diff``, ``output_max``,
    ``input_grad_max_diff``, ``input_grad_max``, on this process's tokens).
    ``world_size`` must divide ``heads``, ``hidden`` and ``seq_len``.
    """
    from .launch import MAX_WORLD_SIZE

    world_size = check_count("world_size", world_size, minimum=2, maximum=MAX_WORLD_SIZE)
    batch = check_count("batch", batch)
    seq_len = check_count("seq_len", seq_len, maximum=MAX_SEQ_LEN)
    hidden = check_count("hidden", hidden)
    heads = check_count("heads", heads, maximum=hidden)
    timeout = check_amount("timeout", timeout, allow_zero=False)
    if hidden % heads:
        raise ValueError(f"heads ({heads}) must divide hidden ({hidden}): each head takes hidden / heads")
    if heads % world_size or hidden % world_size or seq_len % world_size:
        raise ValueError(f"world_size={world_size} must divide heads ({heads}), hidden ({hidden}) and "
                         f"seq_len ({seq_len}): each process takes whole heads and an equal slice of the sequence")
    if 12 * hidden * hidden > MAX_PARAMS:
        raise ValueError(f"hidden={hidden} gives more than the {MAX_PARAMS:,} parameters the course's models allow")
    for what, n in (("batch × heads × seq_len²", batch * heads * seq_len * seq_len),
                    ("batch × seq_len × 4 × hidden", batch * seq_len * 4 * hidden)):
        if n > MAX_ACTIVATION_VALUES:
            raise ValueError(f"{what} is {n:,} values in one activation, more than the {MAX_ACTIVATION_VALUES:,} "
                             "a run of the course holds")
    require_all("comm_debug_mode")  # before starting processes: one clear error on an older torch
    return launch(_sp_worker, world_size, args=((batch, seq_len, hidden, heads),), timeout=timeout,
                  progress_total=2 * world_size, desc=f"sequence parallel on {world_size} processes")
