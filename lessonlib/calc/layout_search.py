"""The layout search: every layout of a model on a cluster priced with :func:`lessonlib.calc.layout.layout_cost`,
the ones that fit ranked by step time, and the published runs to check it against. Pure Python (no torch).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from ..checks import choice, count, instance, mapping, sequence
from .layout import (KERNEL_EFFICIENCY, RECOMPUTE, SCHEDULES, Cluster, Layout, LayoutCost, ModelShape, check_cluster,
                     check_model, layout_cost)
from .stage_memory import ATTENTION, StageState, first_stage_activation_bytes, interleaving_problem, stage_state_bytes

#: The largest search: layouts x ZeRO stages x recomputation choices tried by :func:`search_layouts`.
MAX_CANDIDATES = 200_000

CONTEXT_POLICIES = ("smallest", "free")


def _powers_of_two(limit: int) -> list:
    return [2 ** i for i in range(int(math.log2(limit)) + 1)] if limit >= 1 else [1]


def candidate_layouts(model, cluster, zero_stages=(1, 2, 3), recompute=RECOMPUTE, schedules=("1f1b",),
                      max_tensor=None, max_virtual=None):
    """Every layout with power-of-two degrees that :func:`layout_cost` accepts for ``model`` on ``cluster``.

    ``max_tensor`` caps the tensor degree (default: the node size); ``virtual`` runs over the powers
    of two up to the layers the busiest pipeline stage holds (``ceil(layers / pipeline)``: at most one chunk a
    layer, uneven chunks allowed, :func:`~lessonlib.calc.stage_memory.interleaving_problem`; any number of
    micro-batches); ``max_virtual`` caps it too (real frameworks hold a few chunks a device: every chunk adds a
    send at its boundary and smaller kernels, which :func:`layout_cost` does not price).
    """
    model, cluster = check_model(model), check_cluster(cluster)
    for i, sched in enumerate(sequence("schedules", schedules)):
        choice(f"schedules[{i}]", sched, SCHEDULES)
    for i, z in enumerate(sequence("zero_stages", zero_stages)):
        count(f"zero_stages[{i}]", z, minimum=0, maximum=3)
    for i, r in enumerate(sequence("recompute", recompute)):
        choice(f"recompute[{i}]", r, RECOMPUTE)
    n = cluster.world_size
    max_t = count("max_tensor", max_tensor) if max_tensor is not None else cluster.node_size
    max_v = count("max_virtual", max_virtual) if max_virtual is not None else model.layers
    kv = model.kv_heads or model.heads
    out = []
    for t, c, p in itertools.product(_powers_of_two(max_t), _powers_of_two(n), _powers_of_two(n)):
        if n % (t * c * p) or model.heads % t or (kv % t and t % kv) or p > model.layers:
            continue
        if c > 1 and model.seq_len % (2 * c):
            continue
        d = n // (t * c * p)
        if model.global_batch % d:
            continue
        for e in _powers_of_two(min(d, model.experts)):
            if d % e or model.experts % e:
                continue
            micro = model.global_batch // d
            chunks = _powers_of_two(min(max_v, math.ceil(model.layers / p))) if p > 1 else [1]
            plans = [(v, "1f1b") for v in chunks
                     if not interleaving_problem(model.layers, p, v, micro)]
            plans += [(1, "dualpipe")] if "dualpipe" in schedules and p > 1 and p % 2 == 0 else []
            for (v, sched), z, r in itertools.product(plans, zero_stages, recompute):
                if sched in schedules:
                    out.append(Layout(t, c, p, d, e, v, z, r, sched))
                    if len(out) > MAX_CANDIDATES:
                        raise ValueError(f"more than {MAX_CANDIDATES:,} layouts: narrow zero_stages or recompute")
    return out


def search_layouts(model, cluster, top: int = 5, kernel_efficiency: float = KERNEL_EFFICIENCY,
                   context: str = "smallest", fixed=None, context_method: str = "ring", **kwargs) -> list:
    """The ``top`` fastest layouts that fit, as :class:`LayoutCost` sorted by step time (fastest first).

    ``context="smallest"`` (the practitioners' rule, and Llama 3's) keeps only the smallest context
    degree at which some layout fits: context parallelism is for sequences whose activations do not
    fit otherwise. ``"free"`` lets the step time alone decide. ``fixed`` maps degrees to values every
    layout must keep (``{"tensor": 8, "pipeline": 16}``: a later stage of a run that keeps its model
    split, as Llama 3's long-context stage did). ``kwargs`` go to
    :func:`candidate_layouts`. Returns an empty list when no layout fits.
    """
    model, cluster = check_model(model), check_cluster(cluster)
    top = count("top", top)
    choice("context", context, CONTEXT_POLICIES)
    fixed = {} if fixed is None else mapping("fixed", fixed, allow_empty=True)
    for key, value in fixed.items():
        choice("fixed", key, ("tensor", "context", "pipeline", "data", "expert"))
        count(f"fixed[{key!r}]", value)
    layouts = [x for x in candidate_layouts(model, cluster, **kwargs)
               if all(getattr(x, k) == v for k, v in fixed.items())]
    costs = [layout_cost(model, cluster, lay, kernel_efficiency, context_method) for lay in layouts]
    fitting = [x for x in costs if x.fits]
    if context == "smallest" and fitting:
        least = min(x.layout.context for x in fitting)
        fitting = [x for x in fitting if x.layout.context == least]
    fitting.sort(key=lambda x: (x.step_s, x.layout.tensor * x.layout.context * x.layout.pipeline))
    return fitting[:top]


def rank_of(layout, ranked) -> int | None:
    """1-based place of the layout with ``layout``'s degrees in ``ranked`` (LayoutCosts), ignoring
    ZeRO, interleaving and recomputation; ``None`` when it is not there."""
    instance("layout", layout, Layout, "a Layout")
    ranked = sequence("ranked", ranked, allow_empty=True)
    for i, x in enumerate(ranked):
        instance(f"ranked[{i}]", x, LayoutCost, "a LayoutCost")
    key = (layout.tensor, layout.context, layout.pipeline, layout.data, layout.expert)
    for i, x in enumerate(ranked, 1):
        if (x.layout.tensor, x.layout.context, x.layout.pipeline, x.layout.data, x.layout.expert) == key:
            return i
    return None


def published_models() -> dict:
    """The published runs the layout page compares with, as ``{name: (ModelShape, Cluster, Layout)}``
    built from :mod:`lessonlib.calc.published`: Llama 3 405B at 8K and at 128K context, and DeepSeek-V3.

    The published layouts carry what their reports say; what they leave out (ZeRO stage of
    Llama 3's FSDP, its interleaving) is left at the search's own choice: :func:`rank_of` compares
    the degrees only.
    """
    from . import published as pub  # imported here: the figures are data this module need not load

    ll = pub.LLAMA3_405B
    tokens_per_batch = ll["tokens_per_batch"].value
    gpus = int(ll["gpus"].value)
    out = {}
    for name, seq_len, cp in (("Llama 3 405B, 8K context", int(ll["seq_len"].value), 1),
                              ("Llama 3 405B, 128K context", 131072, int(ll["cp_long"].value))):
        # "16M tokens" a batch is 2**24 as engineers count: 2,048 sequences of 8K, 128 of 128K
        batch = 2 ** round(math.log2(tokens_per_batch / seq_len))
        model = ModelShape(name, ll["params"].value, int(ll["layers"].value), int(ll["hidden"].value),
                           int(ll["heads"].value), seq_len, batch,
                           kv_heads=int(pub.LLAMA3_405B_KV_HEADS.value), dropout=False)
        tp, pp = int(ll["tp"].value), int(ll["pp"].value)
        out[name] = (model, Cluster(gpus, pub.LLAMA3_DEVICE), Layout(tp, cp, pp, gpus // (tp * cp * pp)))
    ds = pub.DEEPSEEK_V3
    moe_layers = ds["layers"].value - ds["dense_layers"].value
    expert_params = moe_layers * ds["experts"].value * 3 * ds["hidden"].value * ds["expert_hidden"].value
    model = ModelShape("DeepSeek-V3", ds["total_params"].value, int(ds["layers"].value), int(ds["hidden"].value),
                       int(ds["heads"].value), int(ds["seq_len"].value), int(ds["batch"].value),
                       active_params=ds["active_params"].value, expert_params=expert_params,
                       experts=int(ds["experts"].value), top_k=int(ds["top_k"].value), dropout=False,
                       nodes_per_token=int(ds["nodes_per_token"].value))
    gpus = int(ds["gpus"].value)
    pp, ep = int(ds["pp"].value), int(ds["ep"].value)
    out["DeepSeek-V3"] = (model, Cluster(gpus, pub.DEEPSEEK_V3_DEVICE),
                          Layout(1, 1, pp, gpus // pp, ep, zero=int(ds["zero"].value), schedule="dualpipe"))
    return out


def published_activation_bytes(name: str = "Llama 3 405B, 8K context", recompute: str = "none",
                               attention: str = "fused", virtual: int = 1) -> float:
    """Activation bytes on the busiest device of the published layout ``name`` (a key of
    :func:`published_models`): :func:`lessonlib.calc.stage_memory.first_stage_activation_bytes` with that
    run's model and degrees, one sequence a micro-batch, no dropout (neither run used it), ``virtual``
    stages a device (1: plain 1F1B; the reports do not give it). The one figure every page prints for
    a published layout's activations.

    >>> round(published_activation_bytes() / 1e9, 1)   # Llama 3 405B, TP 8 x PP 16, 32 s h / 8 a layer
    68.7
    """
    runs = published_models()
    model, _, layout = runs[choice("name", name, tuple(runs))]
    choice("recompute", recompute, RECOMPUTE)
    choice("attention", attention, ATTENTION)
    return first_stage_activation_bytes(model.seq_len, model.hidden, model.heads, model.layers,
                                        tensor=layout.tensor, context=layout.context, pipeline=layout.pipeline,
                                        virtual=count("virtual", virtual),
                                        micro_batches=model.global_batch // layout.data, recompute=recompute,
                                        attention=attention, dropout=model.dropout,
                                        dualpipe=layout.schedule == "dualpipe")


#: What the reports leave out of the published Llama 3 layouts, set as the model's assumptions (not published
#: figures): ``virtual`` stages a device, the ZeRO stage and the recomputation. ZeRO-1, as page 3.11 counts Meta's
#: run: the report accumulates the gradients in FP32 and reduce-scatters them once a step
#: (:func:`llama3_reported_step` prices that); the report's FSDP keeps each stage's whole weights at the peak. The
#: report's modified interleaved schedule does not give the chunks a device holds, nor does it say that Meta
#: recomputed: both are the search's best version of Meta's degrees under ZeRO-1 (tests/test_layout.py).
PUBLISHED_ASSUMPTIONS = {
    "Llama 3 405B, 8K context": {"virtual": 8, "zero": 1, "recompute": "save_matmuls"},
    "Llama 3 405B, 128K context": {"virtual": 8, "zero": 1, "recompute": "save_matmuls"},
}

def published_layout_cost(name: str = "Llama 3 405B, 8K context", **settings) -> LayoutCost:
    """:func:`~lessonlib.calc.layout.layout_cost` of the published layout ``name`` (a key of
    :func:`published_models`) with :data:`PUBLISHED_ASSUMPTIONS`'s settings, any of which ``settings``
    (``virtual``, ``zero``, ``recompute``) replaces: the one figure of that layout's memory (state at the
    stated ZeRO stage plus activations with the interleaving) and step that every page prints.

    >>> cost = published_layout_cost()
    >>> round(cost.state_bytes / 1e9, 1), round(cost.activation_bytes / 1e9, 1)
    (13.0, 42.9)
    """
    runs = published_models()
    model, cluster, layout = runs[choice("name", name, tuple(runs))]
    chosen = {**PUBLISHED_ASSUMPTIONS.get(name, {}), **mapping("settings", settings, allow_empty=True)}
    for key in chosen:
        choice("settings", key, ("virtual", "zero", "recompute"))
    lay = Layout(layout.tensor, layout.context, layout.pipeline, layout.data, layout.expert,
                 chosen.get("virtual", layout.virtual), chosen.get("zero", layout.zero),
                 chosen.get("recompute", layout.recompute), layout.schedule)
    method = "all_gather" if layout.context > 1 else "ring"  # Llama 3's context parallelism gathers keys and values
    return layout_cost(model, cluster, lay, context_method=method)


@dataclass(frozen=True)
class ReportedStep:
    """Meta's 8K step as the Llama 3 report describes its gradients: ``once`` is the layout model's pricing of
    Meta's degrees with the reduction run once a step (ZeRO-1, as in :data:`PUBLISHED_ASSUMPTIONS`);
    ``data_comm_total_s`` the data-parallel collectives with the reduce-scatter in FP32 (twice its 16-bit bytes),
    ``data_comm_s`` what the last micro-batch's backward leaves exposed, ``step_s`` the step with that,
    ``mfu`` the model-FLOPs utilisation it implies, ``extra_bytes`` the whole FP32 gradient buffer's bytes beyond
    ZeRO-1's 16-bit gradients, ``state`` the busiest device's training state by part with that buffer (its
    ``gradients`` the stage's whole FP32 gradients), ``memory_bytes`` the busiest device's bytes:
    ``state.total`` plus ``once.activation_bytes``."""

    once: LayoutCost
    data_comm_total_s: float
    data_comm_s: float
    step_s: float
    mfu: float
    extra_bytes: float
    state: StageState
    memory_bytes: float


def llama3_reported_step(kernel_efficiency: float = KERNEL_EFFICIENCY) -> ReportedStep:
    """The layout model's answer for Meta's Llama 3 405B run at 8K context, the one MFU every page states for it.

    Llama 3 accumulates a step's gradients in FP32 over its micro-batches and reduce-scatters them in FP32 once a
    step: the once-a-step (ZeRO-1) reduction of :func:`published_layout_cost` with its reduce-scatter's bytes
    doubled (bandwidth dominates these messages, so the reduce-scatter's share of the time is about its share of
    the bytes), hidden as :func:`~lessonlib.calc.layout.layout_cost` hides a once-a-step collective: behind the
    last micro-batch's backward only. ``kernel_efficiency`` as in ``layout_cost``.

    >>> step = llama3_reported_step()
    >>> step.step_s > step.once.step_s and step.mfu < step.once.mfu
    True
    >>> round(step.state.gradients / 1e9, 1), round(step.memory_bytes / 1e9, 1)   # FP32 gradients; all of it
    (12.7, 62.2)
    """
    name = "Llama 3 405B, 8K context"
    model, cluster, _ = published_models()[name]
    lay = published_layout_cost(name, zero=1).layout
    once = layout_cost(model, cluster, lay, kernel_efficiency=kernel_efficiency)
    rs, ag = once.data_traffic["reduce_scatter"], once.data_traffic["all_gather"]
    total = once.data_comm_total_s * (1 + rs / (rs + ag))
    micro = model.global_batch // lay.data
    exposed = max(0.0, total - once.compute_s * 2 / 3 / micro)
    step = once.step_s - once.data_comm_s + exposed
    extra = 2 * model.params / (lay.tensor * lay.pipeline)  # 4 bytes a parameter in place of ZeRO-1's 2
    sixteen = stage_state_bytes(model.params / (lay.tensor * lay.pipeline), data=lay.data, zero=1)
    state = replace(sixteen, gradients=2 * sixteen.gradients)  # the stage's whole gradients, in FP32
    return ReportedStep(once, total, exposed, step, once.mfu * once.step_s / step, extra, state,
                        state.total + once.activation_bytes)
