"""Data parallelism measured: DistributedDataParallel against one process.

:func:`run_data_parallel` times one process against ``world_size`` processes
at the same global batch, with the pieces of the step (compute on a share of
the batch, the optimizer step, the all-reduce of the gradient bytes) timed
separately so that the two-process step can be predicted from them.
Times are seconds of wall-clock time.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...checks import amount as _check_amount, count as _check_count, sequence as _check_sequence
from ..rounds import Rounds, time_rounds
from .buckets import average_gradients
from .launch import MAX_TIMEOUT, MAX_WORLD_SIZE, launch

#: The largest global batch, width and round count :func:`run_data_parallel` accepts.
MAX_SIZE = 65_536
#: How many all-reduces of 4 bytes each round times back to back; ``latency`` is the fastest of them.
LATENCY_REPEATS = 5
#: All-reduces of the gradient bytes per round, back to back; the fastest is kept (``allreduce``).
ALLREDUCE_REPEATS = 3


FEATURES = 64  # inputs of the stand-in forecast model (recent sales figures)


def forecast_model(hidden: int = 512, features: int = FEATURES):
    """The retailer's forecast model (:class:`lessonlib.measure.models.ForecastMLP`), seeded.

    ``features`` inputs (recent daily sales), two hidden layers of ``hidden``
    units, one output; built from seed 0 so every process builds the same
    weights.
    """
    import torch

    from ..models import ForecastMLP

    hidden = _check_count("hidden", hidden, maximum=MAX_SIZE)
    features = _check_count("features", features, maximum=MAX_SIZE)
    torch.manual_seed(0)
    return ForecastMLP(window=features, hidden=hidden, layers=2)


def check_forecast_hidden(name: str, hidden) -> int:
    """``hidden`` checked in the parent as :func:`forecast_model` will use it in every worker: the model
    is built on the meta device (its own size checks run; nothing is allocated). ``name`` is the
    caller's argument (``hidden``, ``ddp_hidden``)."""
    import torch

    from ...checks import text

    hidden = _check_count(text("name", name), hidden, maximum=MAX_SIZE)
    try:
        with torch.device("meta"):
            forecast_model(hidden)
    except ValueError as err:
        raise ValueError(f"{name}={hidden:,} gives no model the workers can build: {err}") from None
    return hidden


def synthetic_batch(global_batch: int, features: int = FEATURES, seed: int = 1):
    """A seeded synthetic batch (same on every process): inputs and targets (``features`` >= 8)."""
    import torch

    global_batch = _check_count("global_batch", global_batch, maximum=MAX_SIZE)
    features = _check_count("features", features, minimum=8, maximum=MAX_SIZE)
    seed = _check_count("seed", seed, minimum=0)

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(global_batch, features, generator=g)
    y = x[:, :8].sum(dim=1, keepdim=True) + 0.1 * torch.randn(global_batch, 1, generator=g)
    return x, y


def _flat_grads(model):
    import torch

    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()])


def _data_parallel_worker(rank, world_size, device, progress, batch_sizes, rounds, warmup, hidden):
    """Time one process against ``world_size`` processes at the same global batch.

    Per round, interleaved so that machine noise hits every phase alike:
    1. the one-process step: rank 0 trains its own copy on the whole batch
       while the other ranks wait at a barrier (idle: gloo waits in a blocking
       receive);
    2. the data-parallel step: every rank on its share of the batch, DDP
       all-reducing the gradients inside ``backward``; the optimizer step is
       timed separately;
    3. the pieces: forward+backward on the share with no gradient exchange
       (``no_sync``) and the fastest of ``ALLREDUCE_REPEATS`` back-to-back all-reduces of a tensor as large
       as the gradients;
       then the fastest of ``LATENCY_REPEATS`` back-to-back all-reduces of a single float (``latency``: the per-message cost
       that the alpha-beta model of :mod:`lessonlib.calc.comm` calls alpha, paid
       once per ring step); and ``bucket_copy``: the gradients copied into one
       flat buffer, averaged and copied back, as DDP does around its all-reduce.

    Before the data-parallel step, the control ``together``: every rank runs the
    one-process step on the whole batch at once, with no communication, so that
    ``world_size × single / together`` is the throughput the machine gives
    ``world_size`` independent loops, against one loop alone.
    Rounds are timed by :func:`lessonlib.measure.rounds.time_rounds`; times
    are seconds; the per-round maximum over ranks is kept (a step is done when
    the slowest rank is done).
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    loss_fn = torch.nn.MSELoss()
    model = forecast_model(hidden).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    solo = forecast_model(hidden).to(device)  # the one-process run (used on rank 0)
    solo_opt = torch.optim.Adam(solo.parameters(), lr=1e-3)
    n_params = sum(p.numel() for p in model.parameters())
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    flat = torch.zeros(n_params, device=device)
    tiny = torch.zeros(1, device=device)  # 4 bytes: an all-reduce that is all latency
    bucket = torch.zeros(n_params, device=device)

    def bucket_copies():
        """DDP's bookkeeping around its all-reduce (``gradient_as_bucket_view=False``, the default): the
        gradients copied into the bucket, averaged, and the averages copied back into ``.grad``."""
        ps = list(model.parameters())
        torch.cat([p.grad.reshape(-1) for p in ps], out=bucket)
        bucket.div_(world_size)
        for p, g_ in zip(ps, bucket.split([p.numel() for p in ps])):
            p.grad.copy_(g_.view_as(p))

    # --- correctness first: one DDP backward on the first batch size ---------
    b0 = batch_sizes[0]
    x, y = (t.to(device) for t in synthetic_batch(b0))
    share = b0 // world_size
    xs, ys = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
    ddp.zero_grad(set_to_none=True)
    loss_fn(ddp(xs), ys).backward()
    g = _flat_grads(model)
    gathered = [torch.empty_like(g) for _ in range(world_size)]
    dist.all_gather(gathered, g)
    replicas_equal = all(torch.equal(gathered[0], other) for other in gathered[1:])
    solo.zero_grad(set_to_none=True)
    loss_fn(solo(x), y).backward()  # same weights, whole batch, one process
    full_batch_diff = (g - _flat_grads(solo)).abs().max().item()
    full_batch_scale = _flat_grads(solo).abs().max().item()
    # the exchange written out (buckets.average_gradients): the same share, a plain model, no DDP
    plain = forecast_model(hidden).to(device)
    loss_fn(plain(xs), ys).backward()
    averaged = average_gradients(plain)
    manual_diff = (g - _flat_grads(plain)).abs().max().item()
    del plain

    def step_solo(x, y):
        solo_opt.zero_grad(set_to_none=True)
        loss_fn(solo(x), y).backward()
        solo_opt.step()

    results = []
    tick = (lambda: progress.put(1)) if rank == 0 else None
    for b in batch_sizes:
        x, y = (t.to(device) for t in synthetic_batch(b))
        share = b // world_size
        xs, ys = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]

        def one_round(clock):
            dist.barrier()
            if rank == 0:  # 1. one process, whole batch
                clock.time("single", step_solo, x, y)
            else:
                clock.add("single", 0.0)
            dist.barrier()
            # 1'. the control: every rank runs its own one-process step on the whole batch at the same time,
            # with no exchange at all; against "single" it says what this machine's cores deliver together
            clock.time("together", step_solo, x, y)
            dist.barrier()
            # 2. data-parallel step: compute + all-reduce in backward, then update
            with clock("ddp_backward"):
                opt.zero_grad(set_to_none=True)
                loss_fn(ddp(xs), ys).backward()
            clock.time("optimizer", opt.step)
            clock.add("ddp", clock.seconds["ddp_backward"] + clock.seconds["optimizer"])
            dist.barrier()
            # 3a. compute on the share alone (no gradient exchange)
            with clock("half_compute"):
                opt.zero_grad(set_to_none=True)
                with ddp.no_sync():
                    loss_fn(ddp(xs), ys).backward()
            # 3a'. DDP's copies into its buckets and back, without the all-reduce between them
            clock.time("bucket_copy", bucket_copies)
            dist.barrier()
            # 3b. the all-reduce of the gradient bytes alone: the fastest of a few, back to back. The bytes are the
            # same at every batch, but on a shared machine one descheduled call took 3-17 times the usual time, and
            # a median of single calls once showed 2.9 ms at one batch against 1.0 ms at the others
            ar_seconds = []
            for _ in range(ALLREDUCE_REPEATS):
                clock.time("allreduce", dist.all_reduce, flat)
                ar_seconds.append(clock.seconds["allreduce"])
            clock.add("allreduce", min(ar_seconds))
            dist.barrier()
            # 3c. an all-reduce of 4 bytes: the fixed cost of its ring steps. The fastest of a few, back to back, as
            # for the gradient all-reduce it is fitted with: on a busy machine one descheduled call can make 4 bytes
            # look slower than the whole gradient
            tiny_seconds = []
            for _ in range(LATENCY_REPEATS):
                clock.time("latency", dist.all_reduce, tiny)
                tiny_seconds.append(clock.seconds["latency"])
            clock.add("latency", min(tiny_seconds))

        # one thread per process is set by launch; timed like every other comparison
        timed = time_rounds(one_round, rounds, warmup, device=device, num_threads=None,
                            after_round=tick)
        results.append({"global_batch": b, "rounds": timed.seconds})
    # after all the training, the replicas must still hold identical weights
    w = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ws = [torch.empty_like(w) for _ in range(world_size)]
    dist.all_gather(ws, w)
    weights_equal = all(torch.equal(ws[0], other) for other in ws[1:])
    return {
        "rank": rank,
        "world_size": world_size,
        "backend": dist.get_backend(),
        "device": str(device),
        "n_params": n_params,
        "grad_bytes": grad_bytes,
        "replica_grads_equal": replicas_equal,
        "full_batch_grad_max_diff": full_batch_diff,
        "full_batch_grad_max": full_batch_scale,
        "manual_grad_max_diff": manual_diff,
        "manual_bytes": averaged,
        "replica_weights_equal": weights_equal,
        "sweep": results,
    }


@dataclass
class DataParallelRow:
    """One global batch size of :func:`run_data_parallel`.

    Seconds, medians over rounds: ``single`` (one process, whole batch),
    ``ddp`` (the measured data-parallel step, ``ddp_backward`` + ``optimizer``),
    ``half_compute`` (forward + backward on one process's share, no exchange),
    ``optimizer``, ``allreduce`` (in each round the fastest of ``ALLREDUCE_REPEATS`` all-reduces of the
    gradient bytes, back to back) and
    ``predicted`` (= half_compute + optimizer + allreduce, the sum of their medians) and
    ``latency`` (the fastest of ``LATENCY_REPEATS`` all-reduces of a single float, 4 bytes, in each round: the fixed cost of
    an all-reduce's ring steps, whatever its size) and ``bucket_copy`` (the
    gradients copied into a flat buffer, averaged and copied back: DDP's own
    bookkeeping around its all-reduce, which ``predicted`` leaves out) and
    ``together`` (every process running the one-process step on the whole batch
    at the same time, no exchange: the control for what the machine's cores
    deliver together; see :attr:`concurrent_throughput`).
    Ratios of those medians: ``speedup`` (= single / ddp),
    ``predicted_speedup`` (= single / predicted) and ``predicted_over_measured``
    (= predicted / ddp).
    """

    global_batch: int
    per_process_batch: int
    single: float
    ddp: float
    half_compute: float
    optimizer: float
    allreduce: float
    predicted: float
    ddp_backward: float
    speedup: float
    predicted_speedup: float
    predicted_over_measured: float
    latency: float
    bucket_copy: float = 0.0
    together: float = 0.0

    @property
    def ideal_device_step(self) -> float:
        """The ideal-compute prediction of the data-parallel step, in seconds: one process's forward and
        backward (``single - optimizer``) divided exactly among the processes, plus the whole ``optimizer``
        step every replica repeats, plus the ``allreduce``, one after another. What a device per process
        would give if the update and the exchange took what they took here."""
        world_size = self.global_batch // self.per_process_batch
        return (self.single - self.optimizer) / world_size + self.optimizer + self.allreduce

    @property
    def concurrent_throughput(self) -> float:
        """``world_size`` independent one-process loops running at once, in steps per second, over one
        loop alone: ``world_size × single / together`` (from the medians). About ``world_size`` where each
        process has its own cores and memory; about 1 where they share what one loop already uses up.
        ``nan`` when ``together`` was not measured (0)."""
        if not (self.together > 0 and self.per_process_batch > 0):
            return float("nan")
        return (self.global_batch // self.per_process_batch) * self.single / self.together


@dataclass
class DataParallelRun:
    """What :func:`run_data_parallel` measured.

    ``grad_bytes``: bytes of the gradients the all-reduce carries. Correctness
    checks: ``replica_grads_equal`` and ``replica_weights_equal`` (bitwise, over
    ranks), ``full_batch_grad_max_diff`` (largest difference between the DDP
    gradient and one process's whole-batch gradient; ``full_batch_grad_max`` is
    that gradient's largest entry, for scale), ``manual_grad_max_diff`` (largest difference between
    DDP's gradient and the exchange written out, :func:`~lessonlib.measure.distributed.buckets.average_gradients`,
    on the same share; ``manual_bytes``: the bytes it averaged). ``rows``: one
    :class:`DataParallelRow` per global batch size.
    """

    world_size: int
    backend: str
    device: str
    n_params: int
    grad_bytes: int
    replica_grads_equal: bool
    replica_weights_equal: bool
    full_batch_grad_max_diff: float
    full_batch_grad_max: float
    rounds: int
    rows: list = field(default_factory=list)
    per_round: list = field(default_factory=list)
    manual_grad_max_diff: float = 0.0
    manual_bytes: int = 0


def run_data_parallel(batch_sizes=(32, 128, 512, 2048), rounds: int = 15, warmup: int = 3,
                      hidden: int = 512, world_size: int = 2, timeout: float = 240.0) -> DataParallelRun:
    """Measure DistributedDataParallel against one process, batch size by batch size.

    Starts ``world_size`` processes (gloo on CPU, NCCL with a GPU each), each
    with one thread, and runs :func:`_data_parallel_worker`. Every global
    batch in ``batch_sizes`` must divide evenly by ``world_size``.
    Returns a :class:`DataParallelRun` with one :class:`DataParallelRow` per
    batch size. Each time in a row is the median over
    ``rounds`` rounds (per round, the slowest process), in seconds; ``predicted``
    and the speedups are computed from those medians so that they reconcile
    exactly: ``predicted`` = half_compute + optimizer + allreduce, ``speedup``
    = single / ddp, ``predicted_speedup`` = single / predicted. The per-round
    times are in ``per_round`` (one dict of lists per batch size) for whoever
    wants another statistic.
    """
    world_size = _check_count("world_size", world_size, minimum=2, maximum=MAX_WORLD_SIZE)
    rounds = _check_count("rounds", rounds, maximum=1000)
    warmup = _check_count("warmup", warmup, minimum=0, maximum=1000)
    hidden = check_forecast_hidden("hidden", hidden)
    sizes = [_check_count("batch_sizes", b, maximum=MAX_SIZE) for b in _check_sequence("batch_sizes", batch_sizes)]
    timeout = _check_amount("timeout", timeout, allow_zero=False, maximum=MAX_TIMEOUT)
    for b in sizes:
        if b % world_size:
            raise ValueError(f"batch_sizes: global batch {b} does not divide evenly by world_size={world_size}")
    per_rank = launch(
        _data_parallel_worker, world_size,
        args=(sizes, rounds, warmup, hidden), timeout=timeout,
        progress_total=len(sizes) * (rounds + warmup), desc="DDP rounds",
    )
    rows, per_round = [], []
    for i, b in enumerate(sizes):
        merged = Rounds.slowest([res["sweep"][i]["rounds"] for res in per_rank])
        med = {k: merged.median(k) for k in ("single", "ddp", "half_compute", "optimizer", "allreduce", "ddp_backward",
                                             "latency", "bucket_copy", "together")}
        # Everything below is derived from the medians above, so that the
        # numbers a page shows add up: predicted = the sum of the three
        # medians, each speedup = the ratio of two medians.
        predicted = med["half_compute"] + med["optimizer"] + med["allreduce"]
        rows.append(DataParallelRow(
            global_batch=b, per_process_batch=b // world_size, predicted=predicted, **med,
            speedup=med["single"] / med["ddp"],
            predicted_speedup=med["single"] / predicted,
            predicted_over_measured=predicted / med["ddp"],
        ))
        per_round.append({k: list(v) for k, v in merged.seconds.items()})
    r0 = per_rank[0]
    return DataParallelRun(
        world_size=world_size,
        backend=r0["backend"],
        device=r0["device"],
        n_params=r0["n_params"],
        grad_bytes=r0["grad_bytes"],
        replica_grads_equal=all(r["replica_grads_equal"] for r in per_rank),
        replica_weights_equal=all(r["replica_weights_equal"] for r in per_rank),
        full_batch_grad_max_diff=max(r["full_batch_grad_max_diff"] for r in per_rank),
        full_batch_grad_max=r0["full_batch_grad_max"],
        manual_grad_max_diff=max(r["manual_grad_max_diff"] for r in per_rank),
        manual_bytes=r0["manual_bytes"],
        rounds=rounds,
        rows=rows,
        per_round=per_round,
    )
