"""Tables for the pages that split the state, the layers and the time (chapter 3, pages 5-9).

Each function turns results measured in :mod:`lessonlib.measure.distributed`
and formulas from :mod:`lessonlib.calc` into a Markdown table
(:func:`lessonlib.book.tables.table`; it renders the same in the book, Jupyter
and Colab) and, where a page checks something, the numbers it checks. None computes physics of its own.
"""
from __future__ import annotations

from ..checks import reads as _reads

import statistics

from ..calc.comm import Link
from ..calc.memory import format_bytes, training_state_bytes
from ..calc.sharding import zero_state_bytes, zero_step_traffic
from ..checks import (choice as check_choice, count as check_count, function as check_function,
                      instance as check_instance, mapping as check_mapping, amount as check_amount,
                      record as check_record, records as check_records, sequence as check_sequence)
from ..calc.planner import PRESETS
from .tables import table


def _b(n) -> str:
    return f"{int(n):,} B"


# --------------------------------------------------------------------------- ZeRO / FSDP

_PARTS = ("weights", "gradients", "optimizer_state", "step_counters")


def _sharding_run(name: str, value):
    """``value`` if it is a :class:`~lessonlib.measure.distributed.fsdp.ShardingRun` whose every field has
    its type (a result a page kept, or changed, is read whole); else an error naming ``name``."""
    from ..measure.distributed.fsdp import HeldBytes, ShardedRank, ShardingRun

    check_instance(name, value, ShardingRun, "a ShardingRun (what run_sharding returns)")
    for n, ranks in check_mapping(f"{name}.ranks", value.ranks).items():
        n = check_count(f"{name}.ranks (a process count)", n)
        for i, r in enumerate(check_sequence(f"{name}.ranks[{n}]", ranks)):
            at = f"{name}.ranks[{n}][{i}]"
            check_instance(at, r, ShardedRank, "a ShardedRank")
            check_count(f"{at}.rank", r.rank, minimum=0)
            if check_count(f"{at}.world_size", r.world_size) != n:
                raise ValueError(f"{at}.world_size must be {n}, the count it is filed under, got {r.world_size}")
            check_count(f"{at}.n_params", r.n_params)
            check_count(f"{at}.n_tensors", r.n_tensors)
            for part in ("zero3", "zero1"):
                held = check_instance(f"{at}.{part}", getattr(r, part), HeldBytes, "a HeldBytes")
                for f in _PARTS:
                    check_count(f"{at}.{part}.{f}", getattr(held, f), minimum=0)
            for key in ("zero3_collectives", "keep_collectives", "zero1_collectives", "zero1_step_collectives"):
                for j, c in enumerate(check_sequence(f"{at}.{key}", getattr(r, key), allow_empty=True)):
                    c = check_sequence(f"{at}.{key}[{j}]", c)
                    if len(c) != 3 or not all(isinstance(x, str) for x in c[:2]):
                        raise ValueError(f"{at}.{key}[{j}] must be (kind, phase, bytes), got {c!r:.80}")
                    check_count(f"{at}.{key}[{j}] (bytes)", c[2], minimum=0)
            losses = check_sequence(f"{at}.losses", r.losses)
            if len(check_sequence(f"{at}.reference_losses", r.reference_losses)) != len(losses):
                raise ValueError(f"{at}.losses and reference_losses must have one value per step each")
    return value


def _ranks(name: str, run, world_size) -> tuple:
    """The ranks of ``run`` (checked whole) on ``world_size`` processes."""
    run = _sharding_run(name, run)
    world_size = check_count("world_size", world_size)
    if world_size not in run.ranks:
        raise ValueError(f"world_size={world_size} is not in {name} (it measured {sorted(run.ranks)})")
    return tuple(run.ranks[world_size])


@_reads("run")
def sharded_state_rows(run) -> list:
    """Per rank and part: measured bytes against the formula over N.

    ``run`` is :func:`~lessonlib.measure.distributed.fsdp.run_sharding`'s
    :class:`~lessonlib.measure.distributed.fsdp.ShardingRun`. The formula is
    :func:`~lessonlib.calc.sharding.zero_state_bytes` in fp32 (what the ranks train in) at
    stage 3. Returns dicts with ``world_size``, ``rank``, ``part``, ``measured``, ``formula``.
    """
    rows = []
    for n, per_rank in _sharding_run("run", run).ranks.items():
        f = zero_state_bytes(per_rank[0].n_params, n, 3, "adam", "fp32")
        for r in per_rank:
            for part in ("weights", "gradients", "optimizer_state"):
                rows.append({"world_size": n, "rank": r.rank, "part": part,
                             "measured": getattr(r.zero3, part), "formula": getattr(f, part)})
    return rows


@_reads("run")
def sharded_state_table(run) -> str:
    """Markdown: what each rank of ``run`` (a ShardingRun) holds under fully_shard, against 16 Ψ / N split by part."""
    parts = ("weights", "gradients", "optimizer_state")
    rows = []
    for n, per_rank in _sharding_run("run", run).ranks.items():
        f = zero_state_bytes(per_rank[0].n_params, n, 3, "adam", "fp32")
        for r in per_rank:
            ok = all(getattr(r.zero3, p) == getattr(f, p) for p in parts)
            rows.append([n, f"rank {r.rank}", *(_b(getattr(r.zero3, p)) for p in parts), "yes" if ok else "**no**"])
        rows.append([n, "*formula / N*", *(f"*{_b(getattr(f, p))}*" for p in parts), ""])
    return table(["N", "held by", "weights", "gradients", "Adam state", "equal to formula / N"], rows, markdown=True)


@_reads("run")
def zero1_table(run, world_size: int = 2) -> str:
    """Markdown: ZeroRedundancyOptimizer's optimizer state per rank of ``run`` (a ShardingRun) on
    ``world_size`` processes, against 8 Ψ / N."""
    per_rank = _ranks("run", run, world_size)
    n = len(per_rank)
    full = training_state_bytes(per_rank[0].n_params, "adam", "fp32")
    rows = []
    for r in per_rank:
        z = r.zero1
        rows.append([r.rank, _b(z.weights), _b(z.gradients), _b(z.optimizer_state),
                     _b(full.optimizer_state / n), f"{z.optimizer_state / (full.optimizer_state / n) - 1:+.2%}"])
    return table(["rank", "weights (whole)", "gradients (whole)", "Adam state held", "8 Ψ / N",
                  "difference"], rows, markdown=True)


@_reads("run")
def loss_table(run, world_size: int = 2) -> tuple:
    """Markdown of the loss per step of ``run`` (a ShardingRun) on ``world_size`` processes, sharded against
    unsharded, and the largest relative difference."""
    per_rank = _ranks("run", run, world_size)
    r0 = per_rank[0]
    rows, worst = [], 0.0
    for i, (a, b) in enumerate(zip(r0.losses, r0.reference_losses)):
        rel = abs(a - b) / abs(b)
        worst = max(worst, rel)
        rows.append([i + 1, f"{b:.7f}", f"{a:.7f}", f"{rel:.1e}"])
    return table(["step", "one process, whole batch", f"fully_shard on {len(per_rank)}, a share each",
                  "relative difference"], rows, markdown=True), worst


@_reads("records")
def traffic_summary(records) -> dict:
    """``{kind: {"count", "bytes"}}`` from ``(kind, phase, bytes)`` or ``(kind, bytes)`` records."""
    out: dict = {}
    for rec in check_sequence("records", records, allow_empty=True):
        rec = check_sequence("records", rec)
        kind, n = rec[0], check_amount("records (bytes)", rec[-1])
        d = out.setdefault(kind, {"count": 0, "bytes": 0})
        d["count"] += 1
        d["bytes"] += n
    return out


@_reads("run")
def traffic_table(run, world_size: int = 2, value_bytes: int = 4) -> tuple:
    """Markdown: collectives of one fully_shard forward+backward of ``run`` (a ShardingRun) on ``world_size``
    processes, logged, against :func:`zero_step_traffic`.

    Returns ``(markdown, checks)``; ``checks`` maps ``"freed"`` / ``"kept"`` to
    ``{kind: (logged bytes, formula bytes)}``.
    """
    r0 = _ranks("run", run, world_size)[0]
    value_bytes = check_count("value_bytes", value_bytes)
    n, psi = r0.world_size, r0.n_params
    formula = zero_step_traffic(psi, n, 3, value_bytes)
    kept_formula = {"all_gather": formula["all_gather"] // 2, "reduce_scatter": formula["reduce_scatter"]}
    rows, checks = [], {}
    for label, key, f in (("freed after forward (ZeRO-3)", "zero3_collectives", formula),
                          ("kept until backward", "keep_collectives", kept_formula)):
        logged = traffic_summary(getattr(r0, key))
        checks[label.split()[0]] = {}
        for kind in ("all_gather", "reduce_scatter"):
            got = logged.get(kind, {"count": 0, "bytes": 0})
            checks[label.split()[0]][kind] = (got["bytes"], f[kind])
            rows.append([label, kind.replace("_", "-"), got["count"], _b(got["bytes"]), _b(f[kind]),
                         f"{got['bytes'] / (psi * value_bytes):.0f} × the weights"])
    shown = table(["weights", "collective", "count", "bytes logged", "formula", "that is"], rows, markdown=True)
    return shown, checks


def zero_report(model: str, world_size: int, stage: int) -> str:
    """The ZeRO calculator's answer as HTML (for :class:`lessonlib.book.interactive.Explorer`)."""
    check_choice("model", model, PRESETS)
    world_size = check_count("world_size", world_size)
    n = PRESETS[model]["n_params"]
    s = zero_state_bytes(n, world_size, stage)
    base = zero_state_bytes(n, world_size, 0)
    rows = [(k.replace("_", " "), f"{v / 1e9:,.2f} GB") for k, v in s.as_dict().items() if k != "total"]
    rows.append(("per device", f"{s.total / 1e9:,.2f} GB"))
    return (table(None, rows, strong={len(rows) - 1})
            + f"<p>{s.total / n:.2f} bytes per parameter on each device; plain data parallelism keeps "
              f"{base.total / n:.0f} ({base.total / 1e9:,.1f} GB).</p>")


# --------------------------------------------------------------------------- tensor parallelism

@_reads("records", "expected")
def tp_collective_table(records, expected) -> str:
    """Markdown: the collectives logged in forward and backward, against ``expected``
    (``{(kind, phase): (count, bytes)}``)."""
    check_mapping("expected", expected, allow_empty=True)
    for key, value in expected.items():
        value = check_sequence(f"expected[{key!r}]", value)
        if len(value) != 2:
            raise ValueError(f"expected[{key!r}] must be (count, bytes), got {value!r}")
        check_count(f"expected[{key!r}]'s count", value[0], minimum=0)
        check_count(f"expected[{key!r}]'s bytes", value[1], minimum=0)
    got: dict = {}
    for i, rec in enumerate(check_sequence("records", records, allow_empty=True)):
        rec = check_sequence(f"records[{i}]", rec)
        if len(rec) != 3:
            raise ValueError(f"records[{i}] must be (kind, phase, bytes), got {len(rec)} values: {rec!r}")
        kind, phase, n = rec
        check_count(f"records[{i}]'s bytes", n, minimum=0)
        d = got.setdefault((kind, phase), [0, 0])
        d[0] += 1
        d[1] += n
    rows = []
    for key in sorted(set(got) | set(expected), key=lambda k: (k[1] != "forward", k[0])):
        c, b = got.get(key, (0, 0))
        ec, eb = expected.get(key, (0, 0))
        rows.append([key[1], key[0].replace("_", "-"), c, ec, _b(b), _b(eb)])
    return table(["pass", "collective", "count", "expected", "bytes logged (all of them)",
                  "bytes expected (all of them)"], rows, markdown=True)


@_reads("items")
def layernorm_stat_bytes(items) -> int:
    """Bytes of the small per-row tensors LayerNorm keeps (last dimension 1) among saved ``items``."""
    total = 0
    for i, item in enumerate(check_sequence("items", items, allow_empty=True)):
        item = check_sequence(f"items[{i}]", item)
        if len(item) != 3:
            raise ValueError(f"items[{i}] must be (shape, dtype, bytes), got {len(item)} values")
        shape = check_sequence(f"items[{i}] (shape)", item[0], allow_empty=True)
        if shape and shape[-1] == 1:
            total += check_count(f"items[{i}] (bytes)", item[2], minimum=0)
    return total


# --------------------------------------------------------------------------- pipelines

@_reads("xs")
def median(xs) -> float:
    """The median of a non-empty list of numbers."""
    return statistics.median([check_amount("xs", x) for x in check_sequence("xs", xs)])


@_reads("run")
def idle_rows(run: dict) -> list:
    """``(schedule, m, median idle share, formula)`` for each pipeline result of :func:`run_pipelines`."""
    p = check_record("run", run, ("world_size", "runs"), "a result of run_pipelines")["world_size"]
    return [(r["schedule"], r["microbatches"], median([s["idle_share"] for s in r["steps"]]),
             (p - 1) / (r["microbatches"] + p - 1)) for r in run["runs"]]


@_reads("run")
def pipeline_memory_rows(run: dict) -> list:
    """Per schedule, m and stage: measured peak activation bytes, the bytes of one micro-batch
    on that stage (GPipe's peak at the smallest m, divided by m) and the count the schedule
    should hold: m for GPipe, min(m, p - stage) for 1F1B."""
    p = check_record("run", run, ("world_size", "runs"), "a result of run_pipelines")["world_size"]
    gpipe = [r for r in run["runs"] if r["schedule"] == "GPipe"]
    if not gpipe:
        raise ValueError("run holds no GPipe runs to read one micro-batch's bytes from")
    first = min(gpipe, key=lambda r: r["microbatches"])
    per_mb = [pk // first["microbatches"] for pk in first["steps"][0]["peak_bytes"]]
    rows = []
    for r in run["runs"]:
        m = r["microbatches"]
        for stage in range(p):
            held = m if r["schedule"] == "GPipe" else min(m, p - stage)
            peaks = {s["peak_bytes"][stage] for s in r["steps"]}
            rows.append({"schedule": r["schedule"], "m": m, "stage": stage, "peak": max(peaks),
                         "same_every_step": len(peaks) == 1, "per_microbatch": per_mb[stage],
                         "expected_microbatches": held, "expected": held * per_mb[stage]})
    return rows


@_reads("run")
def pipeline_memory_table(run: dict) -> str:
    """Markdown of :func:`pipeline_memory_rows`. A peak that differs from its expected bytes is marked
    in bold (the page states once, and asserts, that all are equal)."""
    rows = [[r["schedule"], r["m"], r["stage"],
             format_bytes(r["peak"]) if r["peak"] == r["expected"] else f"**{format_bytes(r['peak'])}**",
             r["expected_microbatches"], format_bytes(r["expected"])]
            for r in pipeline_memory_rows(run)]
    return table(["schedule", "m", "stage", "peak activations (measured)", "micro-batches held",
                  "that many × one micro-batch"], rows, markdown=True)


# --------------------------------------------------------------------------- bytes into time

@_reads("times")
def fastest(times) -> float:
    """The fastest of the rounds (seconds). On a shared machine other programs can only add time to a
    collective (a process paused by the operating system keeps every other process waiting), so the
    fastest round is the closest to the collective's own cost; medians there are pulled up by pauses."""
    return min(check_amount("times", t) for t in check_sequence("times", times))


def _comm_timing(name: str, value):
    """``value`` if it is a :class:`~lessonlib.measure.distributed.comm_timing.CommTiming` whose every field
    has its type and every collective a known kind; else an error naming ``name``."""
    from ..measure.distributed.comm_timing import CommTiming, DDPTiming, FSDPTiming

    kinds = ("all_reduce", "all_gather", "reduce_scatter")

    def rounds(where, ts):
        return [check_amount(f"{where}[{i}]", t) for i, t in enumerate(check_sequence(where, ts))]

    check_instance(name, value, CommTiming, "a CommTiming (what run_comm_timing returns)")
    check_count(f"{name}.world_size", value.world_size, minimum=2)
    for kind in kinds:
        for i, pair in enumerate(check_sequence(f"{name}.{kind}", getattr(value, kind), allow_empty=True)):
            pair = check_sequence(f"{name}.{kind}[{i}]", pair)
            if len(pair) != 2:
                raise ValueError(f"{name}.{kind}[{i}] must be (bytes, seconds per round), got {pair!r:.80}")
            check_count(f"{name}.{kind}[{i}] (bytes)", pair[0])
            rounds(f"{name}.{kind}[{i}] (seconds)", pair[1])
    d = check_instance(f"{name}.ddp", value.ddp, DDPTiming, "a DDPTiming")
    check_count(f"{name}.ddp.grad_bytes", d.grad_bytes)
    buckets = [check_count(f"{name}.ddp.bucket_bytes[{i}]", b)
               for i, b in enumerate(check_sequence(f"{name}.ddp.bucket_bytes", d.bucket_bytes))]
    if len(check_sequence(f"{name}.ddp.bucket_times", d.bucket_times)) != len(buckets):
        raise ValueError(f"{name}.ddp.bucket_times must hold one list of rounds per bucket ({len(buckets)})")
    for i, ts in enumerate(d.bucket_times):
        rounds(f"{name}.ddp.bucket_times[{i}]", ts)
    rounds(f"{name}.ddp.backward", d.backward)
    rounds(f"{name}.ddp.backward_no_sync", d.backward_no_sync)
    f = check_instance(f"{name}.fsdp", value.fsdp, FSDPTiming, "an FSDPTiming")
    collectives = check_sequence(f"{name}.fsdp.collectives", f.collectives)
    for i, c in enumerate(collectives):
        c = check_sequence(f"{name}.fsdp.collectives[{i}]", c)
        if len(c) != 2 or c[0] not in kinds:
            raise ValueError(f"{name}.fsdp.collectives[{i}] must be (kind, bytes) with a kind of {kinds}, got {c!r:.80}")
        check_count(f"{name}.fsdp.collectives[{i}] (bytes)", c[1])
    check_count(f"{name}.fsdp.n_params", f.n_params)
    if len(check_sequence(f"{name}.fsdp.replay_each", f.replay_each)) != len(collectives):
        raise ValueError(f"{name}.fsdp.replay_each must hold one list of rounds per collective ({len(collectives)})")
    for i, ts in enumerate(f.replay_each):
        rounds(f"{name}.fsdp.replay_each[{i}]", ts)
    rounds(f"{name}.fsdp.step", f.step)
    return value


@_reads("result")
def comm_rows(result, link: Link, stat=fastest) -> list:
    """Predicted against measured for every timed collective of ``result``, :func:`run_comm_timing`'s
    :class:`~lessonlib.measure.distributed.comm_timing.CommTiming`, taken whole.

    ``stat`` reduces the rounds of one measurement to one number (default: :func:`fastest`).
    Returns dicts ``{"what", "bytes", "measured_s", "predicted_s"}``.
    """
    n = _comm_timing("result", result).world_size
    check_instance("link", link, Link, "a Link (alpha_s, beta_bytes_per_s)")
    check_function("stat", stat)
    rows = []
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        for b, ts in getattr(result, kind):
            rows.append({"what": kind.replace("_", "-"), "bytes": b, "measured_s": stat(ts),
                         "predicted_s": link.seconds(kind, b, n)})
    d = result.ddp
    pred = sum(link.seconds("all_reduce", b, n) for b in d.bucket_bytes)
    rows.append({"what": "DDP's gradient bucket, all-reduced alone" if len(d.bucket_bytes) == 1 else
                 f"DDP's {len(d.bucket_bytes)} gradient buckets, each all-reduced alone", "bytes": d.grad_bytes,
                 "measured_s": sum(stat(t) for t in d.bucket_times), "predicted_s": pred})
    rows.append({"what": "DDP step: backward minus no_sync backward", "bytes": d.grad_bytes,
                 "measured_s": stat(d.backward) - stat(d.backward_no_sync), "predicted_s": pred})
    f = result.fsdp
    rows.append({"what": f"fully_shard step's {len(f.collectives)} collectives, each replayed",
                 "bytes": sum(b for _, b in f.collectives), "measured_s": sum(stat(t) for t in f.replay_each),
                 "predicted_s": sum(link.seconds(k, b, n) for k, b in f.collectives)})
    return rows


@_reads("rows", signed=("rows",))
def comm_table(rows: list) -> str:
    """Markdown of :func:`comm_rows` (times in microseconds)."""
    rows = check_records("rows", rows, ("what", "bytes", "measured_s", "predicted_s"), "a list of comm_rows dicts")
    out = [[r["what"], format_bytes(r["bytes"]), f"{1e6 * r['measured_s']:,.0f}", f"{1e6 * r['predicted_s']:,.0f}",
            f"{r['predicted_s'] / r['measured_s']:.2f}"] for r in rows]
    return table(["what", "tensor", "measured (µs, fastest round)", "predicted (µs)", "predicted / measured"], out,
                 markdown=True)


def cluster_rows(n_params: int, gpus_per_node: int = 8, nodes=(1, 8, 64), links=None) -> list:
    """The model's estimates for a GPU cluster: a data-parallel all-reduce of bf16 gradients
    and a ZeRO-3 step's collectives, within one node (NVLink) and across rail-optimised nodes (one
    InfiniBand port per GPU, NCCL's rings using all of a node's ports:
    :func:`lessonlib.calc.comm.multi_node_seconds`); ``all_reduce_single_port_s`` is the same all-reduce
    priced as one flat ring whose slowest link is one port, the pessimistic contrast."""
    from ..calc.comm import LINKS, multi_node_seconds

    links = LINKS if links is None else check_record("links", links, ("nvlink", "infiniband"), "a dict of Link figures")
    for name in ("nvlink", "infiniband"):
        check_instance("links", links[name], Link, "a dict of Link figures")
    grad = 2 * check_count("n_params", n_params)
    gpus_per_node = check_count("gpus_per_node", gpus_per_node, maximum=1024)
    nv, ib = links["nvlink"], links["infiniband"]
    rows = []
    for k in [check_count("nodes", k, maximum=100_000) for k in check_sequence("nodes", nodes)]:
        n = gpus_per_node * check_count("nodes", k)
        t = zero_step_traffic(n_params, n, 3, 2)

        def seconds(kind, n_bytes, algorithm="rings"):
            return multi_node_seconds(kind, n_bytes, n, gpus_per_node, nv, ib, algorithm)

        rows.append({"gpus": n, "link": nv.name if k == 1 else f"{ib.name}, {gpus_per_node} ports a node",
                     "all_reduce_s": seconds("all_reduce", grad),
                     "all_reduce_single_port_s": seconds("all_reduce", grad, "single_port"),
                     "zero3_s": 2 * seconds("all_gather", t["all_gather"] / 2)
                                + seconds("reduce_scatter", t["reduce_scatter"])})
    return rows
