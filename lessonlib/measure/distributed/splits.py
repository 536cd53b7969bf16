"""Tensor and expert parallelism on real processes, and a stalled job.

* :func:`run_splits` - a matrix product split by columns (all-gather) and by
  rows (all-reduce), compared with the unsplit product; and tokens routed to
  experts on other processes with an all-to-all.
* :func:`run_stalled_job` - a DDP run in which one process stalls once, to
  show that every process waits (and is paid for) meanwhile.
"""
from __future__ import annotations

from ...checks import reads as _reads

import time

from ...checks import amount as _check_amount, count as _check_count, mapping as _check_mapping, \
    sequence as _check_sequence
from ..device import synchronize as _sync
from .data_parallel import forecast_model, synthetic_batch
from .launch import MAX_TIMEOUT, MAX_WORLD_SIZE, launch

#: The largest size (tokens, widths, steps) the demonstration runs accept: they are
#: teaching-sized, and an accidental extra zero should fail at once, not exhaust memory.
MAX_SIZE = 65_536
#: The largest gate skew (gate-score units): beyond it every token goes to expert 0 anyway.
MAX_SKEW = 1000.0


def _tensor_parallel_worker(rank, world_size, device, progress, batch, d_in, d_out):
    """Y = X @ W split two ways across ``world_size`` processes, against the unsplit product.

    Column split: each rank holds a block of W's columns, computes its block
    of Y's columns, and an all-gather assembles Y. Row split: each rank holds
    a block of X's columns and the matching block of W's rows; its product is
    a partial sum of the whole Y, and an all-reduce adds the partials.
    """
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(2)
    x = torch.randn(batch, d_in, generator=g).to(device)
    w = torch.randn(d_in, d_out, generator=g).to(device)  # every rank builds the same X, W
    reference = x @ w  # the unsplit product
    if d_out % world_size or d_in % world_size:
        raise ValueError("d_in and d_out must divide evenly by the number of processes")
    from .collectives import CollectiveLog

    log = CollectiveLog()  # the collectives as issued, each with its full tensor's bytes
    # column-parallel + all-gather (into one tensor: the logged size is the gathered output's)
    cols = d_out // world_size
    y_local = x @ w[:, rank * cols:(rank + 1) * cols]
    gathered = torch.empty(world_size * batch, cols, dtype=y_local.dtype, device=y_local.device)
    with log:
        gather = (  # all_gather_single is the newer torch's name for all_gather_into_tensor (which it deprecates)
            getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)
        gather(gathered, y_local.contiguous())
    counted = list(log.records)
    y_col = torch.cat(gathered.chunk(world_size, dim=0), dim=1)  # rank r's block of columns
    # row-parallel + all-reduce
    rows = d_in // world_size
    y_row = x[:, rank * rows:(rank + 1) * rows] @ w[rank * rows:(rank + 1) * rows, :]
    with log:
        dist.all_reduce(y_row)
    counted += list(log.records)
    progress.put(1)
    return {
        "rank": rank,
        "shape": tuple(reference.shape),
        "weight_bytes_per_rank": w.numel() * w.element_size() // world_size,
        "output_bytes": reference.numel() * reference.element_size(),
        "collectives": [(c.kind, c.n_bytes) for c in counted],  # as CollectiveLog counted them
        "column_max_diff": (y_col - reference).abs().max().item(),
        "column_equal": torch.equal(y_col, reference),
        "column_allclose": torch.allclose(y_col, reference, rtol=1e-5, atol=1e-5),
        "row_max_diff": (y_row - reference).abs().max().item(),
        "row_allclose": torch.allclose(y_row, reference, rtol=1e-5, atol=1e-5),
        "reference_max": reference.abs().max().item(),
    }


def _route(x, gate_w, bias):
    """Top-1 routing: the expert with the highest gate score for each token."""
    return (x @ gate_w + bias).argmax(dim=1)


def _expert_parallel_worker(rank, world_size, device, progress, tokens, hidden, experts_per_rank, skew, repeats=7):
    """Tokens on every rank routed (top-1) to experts spread over the ranks.

    Each rank owns ``experts_per_rank`` experts (small MLPs). A token whose
    expert lives on another rank travels there in an all-to-all, is processed,
    and travels back in a second all-to-all. ``skew`` is added to expert 0's
    gate score, sending it more tokens (load imbalance). The local experts'
    compute is timed (seconds, median of ``repeats`` runs): the second
    all-to-all cannot finish before the busiest process has finished it.
    """
    import torch
    import torch.distributed as dist

    n_experts = world_size * experts_per_rank
    torch.manual_seed(3)  # every rank builds the same router and experts
    gate_w = torch.randn(hidden, n_experts).to(device)
    bias = torch.zeros(n_experts, device=device)
    bias[0] = skew
    experts = [torch.nn.Sequential(torch.nn.Linear(hidden, 2 * hidden), torch.nn.ReLU(),
                                   torch.nn.Linear(2 * hidden, hidden)).to(device)
               for _ in range(n_experts)]
    g = torch.Generator().manual_seed(10 + rank)  # each rank has its own tokens
    x = torch.randn(tokens, hidden, generator=g).to(device)
    with torch.no_grad():
        expert_of = _route(x, gate_w, bias)
        reference = torch.empty_like(x)  # what one device with every expert would compute
        for e in range(n_experts):
            reference[expert_of == e] = experts[e](x[expert_of == e])

        # 1. sort tokens by the rank that owns their expert; tell the others how many come
        owner = expert_of // experts_per_rank
        order = torch.argsort(owner, stable=True)
        send_counts = torch.bincount(owner, minlength=world_size)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        send_split, recv_split = send_counts.tolist(), recv_counts.tolist()
        # 2. all-to-all: tokens (and their expert ids) to the ranks that own the experts
        payload = torch.cat([x[order], expert_of[order].to(x.dtype).unsqueeze(1)], dim=1)
        received = torch.empty(sum(recv_split), hidden + 1, device=device)
        dist.all_to_all_single(received, payload, output_split_sizes=recv_split, input_split_sizes=send_split)
        # 3. the local experts process what arrived, one after another; timed
        #    (median of ``repeats`` runs) because the step waits for the busiest process
        rx, rexp = received[:, :-1], received[:, -1].long()
        out = torch.empty_like(rx)
        times = []
        for _ in range(repeats):
            _sync(device)
            t0 = time.perf_counter()
            for e in range(rank * experts_per_rank, (rank + 1) * experts_per_rank):
                out[rexp == e] = experts[e](rx[rexp == e])
            _sync(device)
            times.append(time.perf_counter() - t0)
        expert_seconds = sorted(times)[len(times) // 2]
        local_load = torch.bincount(rexp - rank * experts_per_rank, minlength=experts_per_rank)
        # 4. all-to-all back, then undo the sort
        back = torch.empty(tokens, hidden, device=device)
        dist.all_to_all_single(back, out, output_split_sizes=send_split, input_split_sizes=recv_split)
        y = torch.empty_like(x)
        y[order] = back
    a2a_forward, a2a_backward = _count_all_to_alls(x, order, send_split, recv_split, rexp, experts, rank,
                                                   experts_per_rank, tokens, hidden)
    loads = [torch.empty_like(local_load) for _ in range(world_size)]
    dist.all_gather(loads, local_load)
    progress.put(1)
    itemsize = x.element_size()
    return {
        "rank": rank,
        "tokens_per_expert": torch.cat(loads).tolist(),
        "tokens_processed": int(local_load.sum()),
        "expert_seconds": expert_seconds,
        "sent_tokens": send_split,
        "received_tokens": recv_split,
        "bytes_sent_out": (tokens - send_split[rank]) * (hidden + 1) * itemsize,
        "max_diff": (y - reference).abs().max().item(),
        "equal": torch.equal(y, reference),
        "allclose": torch.allclose(y, reference, rtol=1e-5, atol=1e-6),
        "all_to_all_forward": a2a_forward,
        "all_to_all_backward": a2a_backward,
    }


def _count_all_to_alls(x, order, send_split, recv_split, rexp, experts, rank, experts_per_rank, tokens, hidden):
    """The same exchange in training: tokens out, experts, results back, then backward; PyTorch's
    ``CommDebugMode`` counts the all-to-alls of the forward and of the backward (the tokens' split sizes are
    already known, as in a layer that reuses them). ``all_to_all_single_autograd`` (torch's functional
    collectives; the older ``torch.distributed.nn.functional`` one is deprecated) is the autograd-aware
    all-to-all: its backward is an all-to-all with the split sizes swapped."""
    import torch
    import torch.distributed as dist
    from torch.distributed._functional_collectives import all_to_all_single_autograd
    from torch.distributed.tensor.debug import CommDebugMode

    xt = x.detach().clone().requires_grad_(True)
    with CommDebugMode() as fwd:
        received = all_to_all_single_autograd(xt[order], recv_split, send_split, dist.group.WORLD)
        out = torch.zeros_like(received)
        for e in range(rank * experts_per_rank, (rank + 1) * experts_per_rank):
            out = out.index_put((torch.nonzero(rexp == e).squeeze(1),), experts[e](received[rexp == e]))
        back = all_to_all_single_autograd(out, send_split, recv_split, dist.group.WORLD)
        loss = back.pow(2).mean()
    with CommDebugMode() as bwd:
        loss.backward()
    return fwd.get_total_counts(), bwd.get_total_counts()


#: The most values one tensor of a split run may hold (256 MiB in fp32), and the most parameters of
#: the experts together (each rank builds all of them, as the course's models allow).
MAX_VALUES = 2 ** 26


def _check_split_sizes(name: str, world_size: int, *, tokens=None, hidden=None, experts_per_rank=None,
                       batch=None, d_in=None, d_out=None) -> None:
    """Refuse, in the parent, sizes whose tensors no worker could hold; ``name`` is the caller's argument."""
    from ..models import MAX_PARAMS

    if tokens is not None:
        n_experts = world_size * experts_per_rank
        if n_experts * 4 * hidden * hidden > MAX_PARAMS:
            raise ValueError(f"{name}: {n_experts} experts of hidden={hidden} hold "
                             f"{n_experts * 4 * hidden * hidden:,} parameters, more than {MAX_PARAMS:,}")
        if tokens * 2 * hidden > MAX_VALUES:
            raise ValueError(f"{name}: tokens × 2 × hidden is {tokens * 2 * hidden:,} values, more than {MAX_VALUES:,}")
    if batch is not None:
        for what, n in (("batch × d_in", batch * d_in), ("d_in × d_out", d_in * d_out), ("batch × d_out", batch * d_out)):
            if n > MAX_VALUES:
                raise ValueError(f"{name}: {what} is {n:,} values, more than {MAX_VALUES:,}")


def run_expert_parallel(tokens: int = 256, hidden: int = 32, experts_per_rank: int = 2,
                        skew: float = 0.0, world_size: int = 2, timeout: float = 120.0) -> list:
    """Route ``tokens`` tokens per process to experts on ``world_size`` processes.

    ``skew`` (>= 0, gate-score units) favours expert 0 to create imbalance.
    Returns one dict per rank: ``tokens_per_expert`` (all experts, in order;
    expert e lives on rank e // experts_per_rank), ``tokens_processed`` (tokens
    this rank's experts handled), ``expert_seconds`` (seconds its experts
    took, one after another: the step waits for the largest of these),
    ``sent_tokens``/``received_tokens`` per rank, ``bytes_sent_out`` (bytes
    this rank sent to other ranks in the first all-to-all), and
    ``max_diff``/``allclose``: the routed result against computing every
    expert locally.
    """
    world_size = _check_count("world_size", world_size, minimum=2, maximum=MAX_WORLD_SIZE)
    tokens = _check_count("tokens", tokens, maximum=MAX_SIZE)
    hidden = _check_count("hidden", hidden, maximum=MAX_SIZE)
    experts_per_rank = _check_count("experts_per_rank", experts_per_rank, maximum=MAX_SIZE)
    skew = _check_amount("skew", skew, maximum=MAX_SKEW)
    timeout = _check_amount("timeout", timeout, allow_zero=False, maximum=MAX_TIMEOUT)
    _check_split_sizes("tokens, hidden and experts_per_rank", world_size, tokens=tokens, hidden=hidden,
                       experts_per_rank=experts_per_rank)
    return launch(_expert_parallel_worker, world_size,
                  args=(tokens, hidden, experts_per_rank, skew), timeout=timeout)


def _ring_check(rank, world_size, device, values=4096):
    """:func:`~lessonlib.measure.distributed.buckets.ring_all_reduce` against ``dist.all_reduce``, with its bytes."""
    import torch
    import torch.distributed as dist

    from .buckets import ring_all_reduce

    g = torch.Generator().manual_seed(20 + rank)  # each process its own "gradient"
    mine = torch.randn(values, generator=g).to(device)
    ring, reference = mine.clone(), mine.clone()
    sent = ring_all_reduce(ring)
    dist.all_reduce(reference)
    return {"rank": rank, "tensor_bytes": mine.numel() * mine.element_size(), "bytes_sent": sent,
            "max_diff": (ring - reference).abs().max().item(), "equal": torch.equal(ring, reference),
            "allclose": torch.allclose(ring, reference, rtol=1e-5, atol=1e-5)}


def _splits_worker(rank, world_size, device, progress, tp_args, ep_args_list):
    """The ring all-reduce, the tensor-parallel check and the expert-parallel runs in one process group."""
    ring = _ring_check(rank, world_size, device)
    tp = _tensor_parallel_worker(rank, world_size, device, progress, *tp_args)
    eps = [_expert_parallel_worker(rank, world_size, device, progress, *a) for a in ep_args_list]
    return {"ring": ring, "tensor": tp, "expert": eps}


def run_splits(tp=dict(batch=64, d_in=256, d_out=512),
               ep=(dict(tokens=256, hidden=32, experts_per_rank=2, skew=0.0),),
               world_size: int = 2, timeout: float = 120.0) -> dict:
    """:func:`run_tensor_parallel` and several :func:`run_expert_parallel` runs in one launch.

    Starting processes costs seconds (each imports torch), so a page that
    shows both runs them together; the same launch first sums a 4,096-value
    float32 tensor with :func:`~lessonlib.measure.distributed.buckets.ring_all_reduce`
    and with ``dist.all_reduce``. Returns ``{"ring": [per-rank dicts: tensor_bytes,
    bytes_sent, max_diff, equal, allclose], "tensor": [per-rank dicts],
    "expert": [[per-rank dicts] for each ep config]}``.
    """
    world_size = _check_count("world_size", world_size, minimum=2, maximum=MAX_WORLD_SIZE)
    _check_mapping("tp", tp)
    if set(tp) != {"batch", "d_in", "d_out"}:
        raise ValueError(f"tp must have exactly the keys 'batch', 'd_in', 'd_out', got {sorted(map(str, tp))}")
    tp_args = tuple(_check_count(f"tp[{k!r}]", tp[k], maximum=MAX_SIZE) for k in ("batch", "d_in", "d_out"))
    if tp_args[1] % world_size or tp_args[2] % world_size:
        raise ValueError(f"tp: d_in and d_out must divide evenly by world_size={world_size}")
    _check_split_sizes("tp", world_size, batch=tp_args[0], d_in=tp_args[1], d_out=tp_args[2])
    ep_list = []
    for i, e in enumerate(_check_sequence("ep", ep)):
        _check_mapping(f"ep[{i}]", e)
        if set(e) != {"tokens", "hidden", "experts_per_rank", "skew"}:
            raise ValueError(f"ep[{i}] must have exactly the keys 'tokens', 'hidden', 'experts_per_rank', 'skew'")
        ep_list.append(tuple(_check_count(f"ep[{i}][{k!r}]", e[k], maximum=MAX_SIZE)
                             for k in ("tokens", "hidden", "experts_per_rank"))
                       + (_check_amount(f"ep[{i}]['skew']", e["skew"], maximum=MAX_SKEW),))
        _check_split_sizes(f"ep[{i}]", world_size, tokens=ep_list[-1][0], hidden=ep_list[-1][1],
                           experts_per_rank=ep_list[-1][2])
    timeout = _check_amount("timeout", timeout, allow_zero=False, maximum=MAX_TIMEOUT)
    per_rank = launch(_splits_worker, world_size, args=(tp_args, ep_list), timeout=timeout,
                      progress_total=world_size * (1 + len(ep_list)), desc="split runs")
    return {
        "ring": [r["ring"] for r in per_rank],
        "tensor": [r["tensor"] for r in per_rank],
        "expert": [[r["expert"][i] for r in per_rank] for i in range(len(ep_list))],
    }


def _stall_worker(rank, world_size, device, progress, steps, stall_step, stall_seconds, stall_rank, hidden, batch):
    """Train with DDP for ``steps`` steps; before step ``stall_step`` rank ``stall_rank`` stalls.

    The stall (a ``time.sleep``) stands for anything that stops one process:
    a slow data read, a hung peer, a failing machine. Every rank records, per
    step, the wall-clock time at the end of the step and the CPU time its
    process used (seconds, ``time.process_time``: all its threads).
    """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = forecast_model(hidden).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    x, y = (t.to(device) for t in synthetic_batch(batch))
    share = batch // world_size
    xs, ys = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
    loss_fn = torch.nn.MSELoss()
    import torch.distributed as dist

    dist.barrier()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    wall, cpu = [], []
    for step in range(steps):
        if step == stall_step and rank == stall_rank:
            time.sleep(stall_seconds)
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(xs), ys).backward()  # the all-reduce inside waits for every rank
        opt.step()
        _sync(device)
        wall.append(time.perf_counter() - wall0)
        cpu.append(time.process_time() - cpu0)
        if rank == 0:
            progress.put(1)
    return {"rank": rank, "wall": wall, "cpu": cpu}


def run_stalled_job(steps: int = 60, stall_step: int = 30, stall_seconds: float = 2.0, stall_rank: int = 1,
                    hidden: int = 256, batch: int = 256, world_size: int = 2, timeout: float = 120.0) -> list:
    """A short DDP run in which one process stalls once; what every process paid for it.

    Returns one dict per rank: ``wall`` (seconds since the start, at the end of
    each step) and ``cpu`` (CPU seconds its process had used by then). Every
    rank's step ``stall_step`` lasts at least ``stall_seconds``: the gradient
    all-reduce cannot finish until the stalled process arrives.
    """
    world_size = _check_count("world_size", world_size, minimum=2, maximum=MAX_WORLD_SIZE)
    steps = _check_count("steps", steps, maximum=MAX_SIZE)
    stall_step = _check_count("stall_step", stall_step, minimum=0)
    if stall_step >= steps:
        raise ValueError(f"stall_step must be below steps={steps}, got {stall_step}")
    stall_seconds = _check_amount("stall_seconds", stall_seconds, maximum=600.0)
    stall_rank = _check_count("stall_rank", stall_rank, minimum=0)
    if stall_rank >= world_size:
        raise ValueError(f"stall_rank must be below world_size={world_size}, got {stall_rank}")
    from .data_parallel import check_forecast_hidden

    hidden = check_forecast_hidden("hidden", hidden)
    batch = _check_count("batch", batch, maximum=MAX_SIZE)
    timeout = _check_amount("timeout", timeout, allow_zero=False, maximum=MAX_TIMEOUT)
    if batch % world_size:
        raise ValueError(f"batch {batch} does not divide evenly by world_size={world_size}")
    return launch(_stall_worker, world_size,
                  args=(steps, stall_step, stall_seconds, stall_rank, hidden, batch),
                  timeout=timeout, progress_total=steps, desc="DDP steps")


@_reads("per_rank")
def expert_step_wait(per_rank: list) -> dict:
    """What an expert-parallel step waits for, from :func:`run_expert_parallel`'s per-rank dicts.

    Returns ``tokens_per_process`` (tokens each process's experts handled),
    ``process_imbalance`` (busiest process / mean, counted), ``expert_imbalance``
    (busiest expert / mean: the wait only if every expert had its own
    process), ``seconds_per_process`` (each process's expert compute,
    seconds) and ``time_imbalance`` (slowest process / mean, measured).
    """
    per_rank = _check_sequence("per_rank", per_rank)
    for i, r in enumerate(per_rank):
        _check_mapping(f"per_rank[{i}]", r)
        missing = {"rank", "tokens_per_expert", "tokens_processed", "expert_seconds"} - set(r)
        if missing:
            raise ValueError(f"per_rank[{i}] is not a run_splits expert result: it lacks {sorted(missing)}")
        _check_count(f"per_rank[{i}]['rank']", r["rank"], minimum=0)
        _check_amount(f"per_rank[{i}]['tokens_processed']", r["tokens_processed"])
        _check_amount(f"per_rank[{i}]['expert_seconds']", r["expert_seconds"])
    from ...calc.experts import expert_load_imbalance, process_load_imbalance

    ranks = sorted(r["rank"] for r in per_rank)
    if ranks != list(range(len(per_rank))):
        raise ValueError(f"per_rank must hold one result for each rank 0..{len(per_rank) - 1}, got ranks {ranks}")
    per_expert = _check_sequence("per_rank[0]['tokens_per_expert']", per_rank[0]["tokens_per_expert"])
    if len(per_expert) % len(per_rank):
        raise ValueError(f"per_rank[0]['tokens_per_expert'] has {len(per_expert)} experts, which do not divide evenly "
                         f"over the {len(per_rank)} ranks of per_rank")
    tokens = [r["tokens_processed"] for r in sorted(per_rank, key=lambda r: r["rank"])]
    seconds = [r["expert_seconds"] for r in sorted(per_rank, key=lambda r: r["rank"])]
    if sum(seconds) <= 0:
        raise ValueError("per_rank's expert_seconds are all zero: no expert time was measured to compare")
    k = len(per_expert) // len(per_rank)
    return {
        "tokens_per_process": tokens,
        "process_imbalance": process_load_imbalance(per_expert, k),
        "expert_imbalance": expert_load_imbalance(per_expert),
        "seconds_per_process": seconds,
        "time_imbalance": max(seconds) / (sum(seconds) / len(seconds)),
    }
