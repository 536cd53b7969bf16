"""Ring attention: context parallelism written out with point-to-point sends and an online softmax.

Each of ``world_size`` processes holds the queries, keys and values of a few
chunks of the sequence (:func:`lessonlib.calc.sequence.sequence_layout`).
Attention needs every query against every earlier key, so the K/V blocks go
round a ring: at each step a process sends the block it holds to the next
process and receives one from the previous, while it attends its queries to
the block in hand. Its softmax is built up block by block, FlashAttention's
way: a running maximum and a running sum of exponentials per query, with the
partial output rescaled whenever the maximum grows. Nothing of size
``seq_len x seq_len`` is ever kept, and each process stores ``seq_len /
world_size`` tokens of everything.

We write the ring ourselves, short enough to read: torch's own
``context_parallel`` runs it on GPUs, but on this CPU build it stops at the
sharding rule of SDPA's CPU flash kernel (:func:`run_ring_attention` records
the error). Backward runs the ring again (:func:`ring_backward`): the K/V
block travels with the gradients of its keys and values, which every process
adds to, and after a full turn each block is home with its gradients summed.
"""
from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...calc.sequence import LAYOUTS, sequence_layout
from ...checks import amount as check_amount, count as check_count, counts as check_counts, \
    instance as check_instance, sequence as check_sequence
from ..memory import SavedTensorCounter
from ..models import MAX_SEQ_LEN
from .launch import launch

__all__ = ["ring_forward", "ring_backward", "RingAttention", "allgather_attention", "run_ring_attention"]


def _scores(q, k, diagonal):
    """Scaled scores of a query chunk against a key chunk; on the diagonal, a key after its query is masked.
    (The same lines as in :func:`ring_forward`, which keeps them inline to be read on the page.)"""
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if diagonal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), -math.inf)
    return s


def _checked(layout, **tensors):
    """Refuse tensors that are not this process's (batch, heads, tokens, head_dim) chunks of ``layout``."""
    chunks = [check_counts(f"layout[{r}]", c, minimum=0) for r, c in enumerate(check_sequence("layout", layout))]
    if sorted(c for cs in chunks for c in cs) != list(range(sum(map(len, chunks)))):
        raise ValueError(f"layout must hand out the chunks 0, 1, 2... once each, got {layout!r}")
    first = None
    for name, t in tensors.items():
        check_instance(name, t, torch.Tensor, "a torch.Tensor")
        if t.dim() != 4:
            raise ValueError(f"{name} must be (batch, heads, tokens, head_dim), got shape {tuple(t.shape)}")
        if first is None:
            first = name, tuple(t.shape)
        elif name != "lse" and tuple(t.shape) != first[1]:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, {first[0]} has {first[1]}")
    if not dist.is_initialized():
        raise RuntimeError("ring attention runs inside a process group: start it with run_ring_attention "
                           "(or launch), not in the notebook's own process")
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if len(chunks) != world_size:
        raise ValueError(f"layout lists {len(chunks)} processes' chunks, but the group has {world_size}")
    if first[1][-2] % len(chunks[rank]):
        raise ValueError(f"{first[0]}'s {first[1][-2]} tokens must divide into this process's "
                         f"{len(chunks[rank])} chunks")
    return chunks


def _ring_step(block, rank, world_size):
    """Send ``block`` to the next process and receive the previous one's: (requests, buffer it arrives in)."""
    incoming = torch.empty_like(block)
    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, block, (rank + 1) % world_size),
                                       dist.P2POp(dist.irecv, incoming, (rank - 1) % world_size)])
    return requests, incoming


def ring_forward(q, k, v, layout):
    """Causal attention of this process's queries over the whole sequence; returns (out, lse, blocks).

    q, k, v: this process's tokens, (batch, heads, tokens, head_dim), the chunks
    ``layout[rank]`` laid end to end. ``lse`` is the log of each query's softmax
    denominator (kept for backward); ``blocks`` counts the chunk pairs computed.
    """
    layout = _checked(layout, q=q, k=k, v=v)  # layout[r]: the chunk numbers process r holds, in order
    rank, world_size = dist.get_rank(), dist.get_world_size()
    c = q.shape[-2] // len(layout[rank])  # tokens per chunk
    qs = q.split(c, dim=-2)  # this process's query chunks
    m = [torch.full_like(qi[..., :1], -math.inf) for qi in qs]  # running max of each query's scores
    l = [torch.zeros_like(mi) for mi in m]  # running sum of exp(score - max)
    acc = [torch.zeros_like(qi) for qi in qs]  # running sum of exp(score - max) * value
    kv, blocks = torch.stack([k, v]), 0
    for step in range(world_size):
        src = (rank - step) % world_size  # the process whose K/V block we hold now
        if step < world_size - 1:  # pass it on to the next process while we compute with it
            incoming = torch.empty_like(kv)
            requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % world_size),
                                               dist.P2POp(dist.irecv, incoming, (rank - 1) % world_size)])
        ks, vs = kv[0].split(c, dim=-2), kv[1].split(c, dim=-2)
        for i, qc in enumerate(layout[rank]):
            for j, kc in enumerate(layout[src]):
                if kc > qc:
                    continue  # every key of that chunk is in this chunk's future
                scores = (qs[i] @ ks[j].transpose(-2, -1)) * q.shape[-1] ** -0.5
                if kc == qc:  # the diagonal block: mask each key that comes after its query
                    scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), -math.inf)
                m_new = torch.maximum(m[i], scores.amax(-1, keepdim=True))
                p = torch.exp(scores - m_new)
                rescale = torch.exp(m[i] - m_new)  # earlier blocks were weighed against an older max
                l[i] = l[i] * rescale + p.sum(-1, keepdim=True)
                acc[i] = acc[i] * rescale + p @ vs[j]
                m[i] = m_new
                blocks += 1
        if step < world_size - 1:
            for r in requests:
                r.wait()
            kv = incoming
    out = torch.cat([a / li for a, li in zip(acc, l)], dim=-2)
    lse = torch.cat([mi + li.log() for mi, li in zip(m, l)], dim=-2)
    return out, lse, blocks


def ring_backward(dout, q, k, v, out, lse, layout):
    """Gradients (dq, dk, dv) of :func:`ring_forward`, recomputing each block's probabilities from ``lse``."""
    layout = _checked(layout, dout=dout, q=q, k=k, v=v, out=out, lse=lse)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    c = q.shape[-2] // len(layout[rank])
    qs, dos = q.split(c, dim=-2), dout.split(c, dim=-2)
    lses = lse.split(c, dim=-2)
    deltas = (dout * out).sum(-1, keepdim=True).split(c, dim=-2)  # softmax backward's row term
    dq = [torch.zeros_like(qi) for qi in qs]
    kvg = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])  # K, V and their gradients travel together
    for step in range(world_size):
        src = (rank - step) % world_size
        ks, vs = kvg[0].split(c, dim=-2), kvg[1].split(c, dim=-2)
        dks, dvs = kvg[2].split(c, dim=-2), kvg[3].split(c, dim=-2)  # views: += writes into kvg
        for i, qc in enumerate(layout[rank]):
            for j, kc in enumerate(layout[src]):
                if kc > qc:
                    continue
                p = torch.exp(_scores(qs[i], ks[j], diagonal=kc == qc) - lses[i])  # the softmax, recomputed
                dvs[j].add_(p.transpose(-2, -1) @ dos[i])
                ds = p * (dos[i] @ vs[j].transpose(-2, -1) - deltas[i]) * q.shape[-1] ** -0.5
                dq[i] += ds @ ks[j]
                dks[j].add_(ds.transpose(-2, -1) @ qs[i])
        requests, incoming = _ring_step(kvg, rank, world_size)  # world steps: each block ends at home
        for r in requests:
            r.wait()
        kvg = incoming
    return torch.cat(dq, dim=-2), kvg[2], kvg[3]


class RingAttention(torch.autograd.Function):
    """``RingAttention.apply(q, k, v, layout)``: :func:`ring_forward`'s output, with :func:`ring_backward`
    as its gradient. Keeps q, k, v, the output and the log-sum-exp for backward, as FlashAttention does."""

    @staticmethod
    def forward(ctx, q, k, v, layout):
        out, lse, _ = ring_forward(q, k, v, layout)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout = layout
        return out

    @staticmethod
    def backward(ctx, dout):
        return (*ring_backward(dout.contiguous(), *ctx.saved_tensors, ctx.layout), None)


def allgather_attention(q, k, v, layout):
    """Context parallelism as Llama 3 ran it: all-gather every process's keys and values, then attend this
    process's queries to the whole sequence under the causal mask, in one SDPA call. Autograd-aware (PyTorch's
    functional ``all_gather_single_autograd``: its backward reduce-scatters, so each block's gradients, summed
    over the processes that used it, go back to its owner).
    ``q``, ``k``, ``v`` are this process's chunks of ``layout``, (batch, heads, tokens, head_dim)."""
    try:
        from torch.distributed._functional_collectives import all_gather_single_autograd as gather
    except ImportError:  # an older torch: the same collective under its earlier name
        from torch.distributed._functional_collectives import all_gather_tensor_autograd as gather

    chunks = _checked(layout, q=q, k=k, v=v)
    mine = chunks[dist.get_rank()]
    c = q.shape[-2] // len(mine)                                        # tokens per chunk
    # one collective for both (two would be free to run in another order in each process's backward)
    kv = torch.stack([k, v]).movedim(3, 0).contiguous()             # tokens first: it gathers along dim 0
    k_all, v_all = gather(kv, gather_dim=0, group=dist.group.WORLD).movedim(0, 3)  # every chunk, in rank order

    def positions(ids):                                                 # where the chunks sit in the sequence
        return torch.cat([torch.arange(i * c, (i + 1) * c, device=q.device) for i in ids])

    mask = positions([i for cs in chunks for i in cs])[None, :] <= positions(mine)[:, None]  # key not after query
    return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)


def _local(x, layout, rank):
    """This process's tokens of a full (batch, heads, seq_len, head_dim) tensor: its chunks, in order."""
    c = x.shape[-2] // sum(len(chunks) for chunks in layout)
    return torch.cat([x[..., i * c:(i + 1) * c, :] for i in layout[rank]], dim=-2)


def _torch_context_parallel(q, k, v, device, world_size):
    """Try torch's own ``context_parallel`` on SDPA; the error's text where it does not run."""
    from torch.distributed.device_mesh import init_device_mesh
    try:
        from torch.distributed.tensor.experimental import context_parallel
    except ImportError as e:  # an older torch has none
        return {"ran": False, "error": f"{type(e).__name__}: {e}"}

    mesh = init_device_mesh(device.type, (world_size,))
    qc, kc, vc = q.clone(), k.clone(), v.clone()
    try:
        with context_parallel(mesh, buffers=[qc, kc, vc], buffer_seq_dims=[2, 2, 2]):
            o = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True)
    except NotImplementedError as e:  # on this CPU build: no sharding rule for the CPU flash kernel
        return {"ran": False, "error": f"{type(e).__name__}: {e}"}
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard
    (o,) = context_parallel_unshard(mesh, [o], [2])
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return {"ran": True, "max_diff": (o - ref).abs().max().item()}


def _ring_worker(rank, world_size, device, progress, cfg, repeats):
    batch, heads, seq, head_dim = cfg
    torch.manual_seed(0)  # every process draws the same full sequence, then keeps its own chunks
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device=device) for _ in range(3))
    dout = torch.randn(batch, heads, seq, head_dim, device=device)
    # the reference: one process, the whole sequence, PyTorch's fused causal attention
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    full = SavedTensorCounter()
    with full:
        ref = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
    ref.backward(dout)
    result = {"rank": rank, "world_size": world_size, "backend": dist.get_backend(),
              "full_saved_bytes": full.bytes, "ref_max": ref.abs().max().item(), "layouts": {},
              "config": {"batch": batch, "heads": heads, "seq_len": seq, "head_dim": head_dim, "repeats": repeats}}
    for name in LAYOUTS:
        layout = sequence_layout(world_size, name)
        ql, kl, vl = (_local(t, layout, rank).requires_grad_(True) for t in (q, k, v))
        counter = SavedTensorCounter()
        with counter:
            out = RingAttention.apply(ql, kl, vl, layout)
        out.backward(_local(dout, layout, rank))
        times = []
        with torch.no_grad():
            for _ in range(repeats):  # this process's forward time; the slowest process sets the step
                dist.barrier()
                t0 = time.perf_counter()
                _, _, blocks = ring_forward(ql, kl, vl, layout)
                times.append(time.perf_counter() - t0)
        result["layouts"][name] = {
            "layout": layout, "blocks": blocks, "saved_bytes": counter.bytes, "seconds": sorted(times)[len(times) // 2],
            "out_max_diff": (out - _local(ref, layout, rank)).abs().max().item(),
            "grad_max_diff": max((g - _local(r.grad, layout, rank)).abs().max().item()
                                 for g, r in ((ql.grad, qr), (kl.grad, kr), (vl.grad, vr))),
            "grad_max": max(r.grad.abs().max().item() for r in (qr, kr, vr))}
        progress.put(1)
    layout = sequence_layout(world_size, "zigzag")  # Llama 3 balanced its chunks this way too
    ql, kl, vl = (_local(t, layout, rank).requires_grad_(True) for t in (q, k, v))
    out = allgather_attention(ql, kl, vl, layout)
    out.backward(_local(dout, layout, rank))
    result["allgather"] = {
        "layout": layout, "out_max_diff": (out - _local(ref, layout, rank)).abs().max().item(),
        "grad_max_diff": max((g - _local(r.grad, layout, rank)).abs().max().item()
                             for g, r in ((ql.grad, qr), (kl.grad, kr), (vl.grad, vr))),
        "grad_max": max(r.grad.abs().max().item() for r in (qr, kr, vr))}
    progress.put(1)
    result["torch_context_parallel"] = _torch_context_parallel(q, k, v, device, world_size)
    progress.put(1)
    return result


#: The most values :func:`run_ring_attention`'s q (and each of k, v) may hold: 16 Mi (64 MiB in float32).
MAX_VALUES = 2 ** 24


def run_ring_attention(world_size: int = 2, batch: int = 1, heads: int = 4, seq_len: int = 1024,
                       head_dim: int = 32, repeats: int = 5, timeout: float = 180.0) -> list:
    """Ring attention on ``world_size`` processes against full causal SDPA; one dict per rank.

    float32 throughout. Each dict has ``full_saved_bytes`` (what SDPA keeps
    for backward on the whole sequence, one process), ``ref_max`` (largest
    output value), and ``layouts[name]`` for ``"contiguous"`` and
    ``"zigzag"``: ``layout`` (chunks per process), ``blocks`` (chunk pairs
    this process computed), ``saved_bytes`` (what :class:`RingAttention`
    keeps on this process), ``seconds`` (median forward time on this
    process, over ``repeats``), ``out_max_diff`` and ``grad_max_diff`` (largest
    difference from SDPA's output and q/k/v gradients on this process's
    tokens) and ``grad_max``; ``config`` (the arguments: ``batch``, ``heads``,
    ``seq_len``, ``head_dim``, ``repeats``); and ``torch_context_parallel``: ``ran`` with
    ``max_diff``, or ``error`` (the exception's text); ``allgather``: the same
    ``out_max_diff``, ``grad_max_diff`` and ``grad_max`` for
    :func:`allgather_attention` on the zig-zag ``layout``. ``seq_len`` must be a
    multiple of ``2 * world_size`` (the chunks).
    """
    from .launch import MAX_WORLD_SIZE

    world_size = check_count("world_size", world_size, minimum=2, maximum=MAX_WORLD_SIZE)
    batch = check_count("batch", batch)
    heads = check_count("heads", heads)
    seq_len = check_count("seq_len", seq_len, maximum=MAX_SEQ_LEN)
    head_dim = check_count("head_dim", head_dim)
    repeats = check_count("repeats", repeats, maximum=1000)
    timeout = check_amount("timeout", timeout, allow_zero=False)
    if seq_len % (2 * world_size):
        raise ValueError(f"seq_len ({seq_len}) must be a multiple of 2 × world_size ({2 * world_size}): "
                         "the sequence is cut into 2 chunks per process")
    if batch * heads * seq_len * head_dim > MAX_VALUES:
        raise ValueError(f"batch × heads × seq_len × head_dim is {batch * heads * seq_len * head_dim:,} values, "
                         f"more than the {MAX_VALUES:,} a run of the course holds")
    if batch * heads * seq_len * seq_len > 2 ** 26:  # the reference's backward and each score block
        raise ValueError(f"batch × heads × seq_len² is {batch * heads * seq_len * seq_len:,}, more than the "
                         f"{2 ** 26:,} a run of the course holds")
    return launch(_ring_worker, world_size, args=((batch, heads, seq_len, head_dim), repeats), timeout=timeout,
                  progress_total=4 * world_size, desc=f"ring attention on {world_size} processes")
