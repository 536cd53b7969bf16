"""Strong and weak scaling measured: the time to finish a fixed number of examples.

:func:`run_scaling` trains the retailer's forecast model through a fixed
budget of ``examples`` examples three ways, in one run of ``world_size``
processes (gloo on CPU, NCCL with a GPU each), interleaved round by round:

* ``one``: one process at a global batch of ``batch`` (the others wait);
* ``strong``: every process under ``DistributedDataParallel`` at the *same
  global batch* (each takes ``batch / world_size``): the same number of
  steps, each one shorter (strong scaling, Amdahl's question);
* ``weak``: every process at the *same per-process batch* ``batch``, so the
  global batch is ``world_size × batch`` and the budget takes
  ``1 / world_size`` as many steps (data parallelism's weak scaling: the same
  examples in fewer steps, which shortens a run up to the critical batch size;
  not Gustafson's larger job in the same time).

Times are seconds of wall-clock time (per round, the slowest process).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...calc.batch_size import steps_to_finish
from ...checks import amount as _check_amount, count as _check_count
from ..device import Timer
from ..rounds import Rounds, time_rounds
from .data_parallel import MAX_SIZE, check_forecast_hidden, forecast_model, synthetic_batch
from .launch import MAX_TIMEOUT, MAX_WORLD_SIZE, launch

#: The cases of one round, in the order they run.
CASES = ("one", "strong", "weak")


def _scaling_worker(rank, world_size, device, progress, examples, batch, rounds, warmup, hidden):
    """Run the three cases of :mod:`scaling` for ``rounds`` rounds; return this rank's per-round seconds."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    loss_fn = torch.nn.MSELoss()
    ddp = DDP(forecast_model(hidden).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    solo = forecast_model(hidden).to(device)
    solo_opt = torch.optim.Adam(solo.parameters(), lr=1e-3)
    x, y = (t.to(device) for t in synthetic_batch(examples))

    def train(model, optimizer, global_batch, share, mine, updates=None):
        """Go through all ``examples`` at ``global_batch`` per step; this rank takes ``share`` of each.
        With a list ``updates``, each optimizer step is timed into it (the one-process run's serial share)."""
        steps = 0
        for start in range(0, examples, global_batch):
            lo = start + mine * share
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x[lo:lo + share]), y[lo:lo + share]).backward()
            if updates is None:
                optimizer.step()
            else:
                with Timer(device) as t:
                    optimizer.step()
                updates.append(t.seconds)
            steps += 1
        return steps

    steps = {}

    def one_round(clock):
        dist.barrier()
        if rank == 0:
            updates = []
            steps["one"] = clock.time("one", train, solo, solo_opt, batch, batch, 0, updates)
            clock.add("one_update", sum(updates))
        else:
            clock.add("one", 0.0)
            clock.add("one_update", 0.0)
        dist.barrier()
        steps["strong"] = clock.time("strong", train, ddp, opt, batch, batch // world_size, rank)
        dist.barrier()
        steps["weak"] = clock.time("weak", train, ddp, opt, batch * world_size, batch, rank)
        dist.barrier()

    tick = (lambda: progress.put(1)) if rank == 0 else None
    timed = time_rounds(one_round, rounds, warmup, device=device, num_threads=None, after_round=tick)
    return {"rank": rank, "backend": dist.get_backend(), "device": str(device), "steps": dict(steps),
            "rounds": timed.seconds}


@dataclass
class ScalingRow:
    """One case of :func:`run_scaling`.

    ``case`` (``"one"``, ``"strong"`` or ``"weak"``), ``processes``,
    ``global_batch`` and ``per_process_batch`` (examples per step),
    ``steps`` (optimizer steps to go through the budget, counted by the
    workers), ``examples`` (= steps × global batch), ``seconds`` (median time
    to finish, per round the slowest process) and ``speedup`` (the one-process
    median over this case's median; 1 for ``one``).
    """

    case: str
    processes: int
    global_batch: int
    per_process_batch: int
    steps: int
    examples: int
    seconds: float
    speedup: float


@dataclass
class ScalingRun:
    """What :func:`run_scaling` measured: one :class:`ScalingRow` per case, in :data:`CASES` order.

    ``per_round``: every round's seconds of every case, for another statistic, and ``one_update``: the
    one-process run's optimizer steps, summed over the run.
    """

    world_size: int
    backend: str
    device: str
    examples: int
    rounds: int
    rows: list = field(default_factory=list)
    per_round: dict = field(default_factory=dict)

    @property
    def update_share(self) -> float:
        """The optimizer updates' share of the one-process run's time: the median over rounds of
        ``one_update / one`` (both from the same round): the serial share of data parallelism, measured in
        the very run it bounds. ``nan`` where the updates were not timed."""
        upd, one = self.per_round.get("one_update"), self.per_round.get("one")
        if not upd or not one or len(upd) != len(one) or min(one) <= 0:
            return float("nan")
        import statistics

        return statistics.median(u / o for u, o in zip(upd, one))

    def row(self, case: str) -> ScalingRow:
        """The row of ``case`` (one of :data:`CASES`)."""
        from ...checks import choice

        choice("case", case, CASES)
        found = [r for r in self.rows if getattr(r, "case", None) == case]
        if len(found) != 1:
            raise ValueError(f"run has {len(found)} rows of case {case!r}; run_scaling gives exactly one")
        return found[0]


def run_scaling(examples: int = 8192, batch: int = 1024, world_size: int = 2, rounds: int = 5, warmup: int = 1,
                hidden: int = 256, timeout: float = 180.0) -> ScalingRun:
    """Time one process against ``world_size`` processes on a fixed budget of ``examples`` examples.

    ``batch`` is the one-process global batch; the strong-scaling run keeps
    it (each process takes ``batch / world_size``), the weak-scaling run
    keeps it per process (global batch ``world_size × batch``). Both
    ``batch`` and ``world_size × batch`` must divide ``examples``, and
    ``world_size`` must divide ``batch``. At most :data:`~.data_parallel.MAX_SIZE`
    examples; ``rounds`` and ``warmup`` at most 1,000. Returns a
    :class:`ScalingRun`.
    """
    world_size = _check_count("world_size", world_size, minimum=2, maximum=MAX_WORLD_SIZE)
    examples = _check_count("examples", examples, maximum=MAX_SIZE)
    batch = _check_count("batch", batch, maximum=MAX_SIZE)
    rounds = _check_count("rounds", rounds, maximum=1000)
    warmup = _check_count("warmup", warmup, minimum=0, maximum=1000)
    hidden = check_forecast_hidden("hidden", hidden)
    timeout = _check_amount("timeout", timeout, allow_zero=False, maximum=MAX_TIMEOUT)
    if batch % world_size:
        raise ValueError(f"batch={batch} must divide evenly by world_size={world_size}")
    expected = {"one": steps_to_finish(examples, batch), "strong": steps_to_finish(examples, batch)}
    try:
        expected["weak"] = steps_to_finish(examples, batch * world_size)
    except ValueError:
        raise ValueError(f"examples={examples} must divide by world_size × batch = {world_size * batch}") from None
    per_rank = launch(_scaling_worker, world_size, args=(examples, batch, rounds, warmup, hidden),
                      timeout=timeout, progress_total=rounds + warmup, desc="scaling rounds")
    merged = Rounds.slowest([r["rounds"] for r in per_rank])
    counted = per_rank[0]["steps"]
    shape = {"one": (1, batch, batch), "strong": (world_size, batch, batch // world_size),
             "weak": (world_size, batch * world_size, batch)}
    t_one = merged.median("one")
    rows = []
    for case in CASES:
        if counted[case] != expected[case]:  # the workers' loop, against the formula
            raise RuntimeError(f"the {case} run took {counted[case]} steps, expected {expected[case]}")
        processes, global_batch, per_process = shape[case]
        seconds = merged.median(case)
        rows.append(ScalingRow(case=case, processes=processes, global_batch=global_batch,
                               per_process_batch=per_process, steps=counted[case],
                               examples=counted[case] * global_batch, seconds=seconds, speedup=t_one / seconds))
    return ScalingRun(world_size=world_size, backend=per_rank[0]["backend"], device=per_rank[0]["device"],
                      examples=examples, rounds=rounds, rows=rows,
                      per_round={k: list(v) for k, v in merged.seconds.items()})
