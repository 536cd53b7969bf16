"""Gradient buckets: DDP's mechanism for sending gradients during backward, in a few readable lines.

:func:`average_gradients` is plain data parallelism's exchange: every
gradient all-reduced once backward has finished. :func:`all_reduce_in_buckets`
averages a model's gradients over the processes of the default group bucket by bucket, each bucket's all-reduce started as
soon as backward has produced its last gradient (what
``DistributedDataParallel`` does inside). :func:`ring_all_reduce` is the ring
algorithm under an all-reduce, written out with point-to-point sends, for the
page that counts its bytes. :func:`layer_stack` is the model the overlap page
measures: equal layers, so the buckets are easy to count. Sizes are bytes.
"""
from __future__ import annotations

from ...checks import count as _check_count, instance as _check_instance

__all__ = ["layer_stack", "average_gradients", "all_reduce_in_buckets", "ring_all_reduce", "ring_chunk", "ring_steps",
           "MAX_SIZE"]

#: The largest width and layer count :func:`layer_stack` accepts.
MAX_SIZE = 4096


def layer_stack(hidden: int = 256, layers: int = 8, seed: int = 0):
    """``layers`` blocks of ``Linear(hidden, hidden)`` + ReLU (a ``torch.nn.Sequential``), seeded.

    Every block holds the same bytes, so the gradient buckets are easy to count.
    """
    import torch

    hidden = _check_count("hidden", hidden, maximum=MAX_SIZE)
    layers = _check_count("layers", layers, maximum=MAX_SIZE)
    seed = _check_count("seed", seed, minimum=0)
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU())
                                 for _ in range(layers)])


def average_gradients(model) -> int:
    """Average ``model``'s gradients over the processes of the default group, one parameter at a time.

    Plain data parallelism written out, for reading: call it after
    ``backward()``; afterwards every process holds the mean of the processes'
    gradients, the gradient of the whole global batch. One all-reduce per
    parameter, all after backward: DDP gives the same result with fewer,
    larger all-reduces started during backward (:func:`all_reduce_in_buckets`).
    Returns the bytes of gradient averaged.
    """
    import torch
    import torch.distributed as dist

    _check_instance("model", model, torch.nn.Module, "a torch.nn.Module")
    if not dist.is_initialized():
        raise ValueError("model: no process group to average its gradients over; "
                         "call torch.distributed.init_process_group first (workers started by launch have one)")
    averaged = 0
    for p in model.parameters():
        if p.grad is None:
            raise ValueError("model: a parameter has no gradient; call average_gradients after backward()")
    for p in model.parameters():
        dist.all_reduce(p.grad)          # the sum over every process, in place
        p.grad /= dist.get_world_size()  # the sum becomes the mean
        averaged += p.grad.numel() * p.grad.element_size()
    return averaged


def all_reduce_in_buckets(model, bucket_bytes: int):
    """Average ``model``'s gradients over the processes in buckets, each sent as soon as it is ready.

    The mechanism of DDP in a few lines, for reading (the measurements use DDP
    itself). Parameters are grouped, last layer first (the order backward
    produces their gradients), into buckets of at least ``bucket_bytes``
    bytes. A hook on each parameter fires when its gradient is accumulated;
    when the last gradient of a bucket arrives, the bucket's all-reduce starts
    *without waiting* (``async_op=True``) and backward carries on with the
    next layers. Returns ``finish()``: call it after ``backward()`` to wait for
    every bucket and write the averages back into ``.grad``; it returns the
    bucket sizes in bytes, in the order they were sent.
    """
    import torch
    import torch.distributed as dist

    _check_instance("model", model, torch.nn.Module, "a torch.nn.Module")
    bucket_bytes = _check_count("bucket_bytes", bucket_bytes)
    if not dist.is_initialized():  # before any hook is registered: the model stays as it was
        raise ValueError("model: no process group to average its gradients over; "
                         "call torch.distributed.init_process_group first (workers started by launch have one)")
    buckets, current, size = [], [], 0
    for p in reversed([p for p in model.parameters() if p.requires_grad]):
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= bucket_bytes:  # close the bucket once it holds enough bytes
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    in_flight = []  # (bucket, flat gradients, the all-reduce under way)

    def hook_for(bucket):
        arrived = []

        def hook(param):  # runs when backward has accumulated param.grad
            arrived.append(param)
            if len(arrived) == len(bucket):  # the bucket is complete: send it now
                flat = torch.cat([q.grad.reshape(-1) for q in bucket])
                in_flight.append((bucket, flat, dist.all_reduce(flat, async_op=True)))
                arrived.clear()
        return hook

    for bucket in buckets:
        hook = hook_for(bucket)
        for p in bucket:
            p.register_post_accumulate_grad_hook(hook)

    def finish():
        sent = []
        for bucket, flat, work in in_flight:
            work.wait()  # the last bucket's wait is the communication backward could not hide
            flat /= dist.get_world_size()
            for q, g in zip(bucket, flat.split([q.numel() for q in bucket])):
                q.grad.copy_(g.view_as(q))
            sent.append(flat.numel() * flat.element_size())
        in_flight.clear()
        return sent
    return finish


def ring_chunk(rank: int, step: int, phase: str, n: int) -> int:
    """The chunk process ``rank`` of ``n`` sends right at ``step`` (from 0) of ``phase`` in :func:`ring_all_reduce`.

    Reduce-scatter starts each process on its own chunk and steps one chunk back
    each time, so the chunk it sends is the one it has just added to; the
    all-gather starts one chunk later, on the chunk the reduce-scatter left
    fully summed there.
    """
    if phase not in ("reduce-scatter", "all-gather"):
        raise ValueError(f"phase: 'reduce-scatter' or 'all-gather', not {phase!r}")
    n = _check_count("n", n)
    rank, step = _check_count("rank", rank, minimum=0), _check_count("step", step, minimum=0)
    return (rank - step + (phase == "all-gather")) % n


def ring_steps(n: int) -> list[tuple[str, int, list[tuple[int, int]]]]:
    """Simulate :func:`ring_all_reduce` on ``n`` processes, with shares instead of numbers.

    Returns one row per step, ``(phase, step, sends)``, where ``sends[rank]`` is
    ``(chunk, shares)``: the chunk that process sends right, by :func:`ring_chunk`,
    and how many processes' values it holds summed. Checks that the chunk that
    arrives is the one the code expects, and that at the end every process holds
    every chunk summed over all ``n`` (at most 64: the table is n rows of n sets of up to n).
    """
    n = _check_count("n", n, maximum=64)
    held = [[{rank} for _ in range(n)] for rank in range(n)]  # held[rank][chunk]: whose values are summed in it
    rows = []
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(n - 1):
            outs = [ring_chunk(rank, step, phase, n) for rank in range(n)]
            rows.append((phase, step, [(out, len(held[rank][out])) for rank, out in enumerate(outs)]))
            parcels = [set(held[rank][out]) for rank, out in enumerate(outs)]
            for rank in range(n):
                left = (rank - 1) % n
                inc = (outs[rank] - 1) % n
                assert outs[left] == inc, "what arrives from the left is the chunk the code adds to"
                held[rank][inc] = held[rank][inc] | parcels[left] if phase == "reduce-scatter" else parcels[left]
    assert all(chunk == set(range(n)) for row in held for chunk in row)
    return rows


def ring_all_reduce(tensor) -> int:
    """Sum ``tensor`` over the default group's processes in place, by the ring algorithm; returns bytes sent.

    The algorithm NCCL and gloo use for large all-reduces, written with
    point-to-point sends for reading. The processes form a ring; the tensor
    is cut into as many chunks as there are processes. Reduce-scatter: in
    each of N - 1 steps every process sends one chunk to its right-hand
    neighbour and adds the chunk arriving from its left; afterwards each
    holds one chunk fully summed. All-gather: N - 1 more steps pass the summed
    chunks on until every process has all of them. ``tensor``: a contiguous
    tensor of the same shape on every process. Returns the bytes this process
    sent: 2(N - 1)/N of the tensor's bytes when N divides its size.
    """
    import torch
    import torch.distributed as dist

    _check_instance("tensor", tensor, torch.Tensor, "a torch.Tensor")
    if not tensor.is_contiguous():
        raise ValueError("tensor: must be contiguous (its chunks are views that the sums are written into)")
    if not dist.is_initialized():
        raise ValueError("tensor: no process group to sum it over; call torch.distributed.init_process_group first")
    rank, N = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), N)  # N views into tensor
    right, left = (rank + 1) % N, (rank - 1) % N
    sent = 0
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(N - 1):
            out = ring_chunk(rank, step, phase, N)  # the chunk this process passes on
            inc = (out - 1) % N  # the chunk arriving from the left
            arrived = torch.empty_like(chunks[inc])
            request = dist.isend(chunks[out], right)
            dist.recv(arrived, left)
            request.wait()
            sent += chunks[out].numel() * chunks[out].element_size()
            if phase == "reduce-scatter":
                chunks[inc].add_(arrived)  # one more process's share of the sum
            else:
                chunks[inc].copy_(arrived)  # a finished sum: keep it
    return sent
