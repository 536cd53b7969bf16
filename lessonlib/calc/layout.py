"""Choose a layout: the degrees of tensor, context, pipeline, data and expert parallelism, and the ZeRO stage,
for a model on a cluster, from the course's own calculators. Pure Python (no torch).

A layout is judged twice. **Does it fit?** The busiest device's bytes: its share of the
training state (:func:`lessonlib.calc.sharding.zero_state_bytes` on the weights the tensor and
pipeline split leave it, the experts on the expert split) plus the activations its first pipeline
stage keeps (Korthikanti et al. 2022 with sequence parallelism and fused attention: no s x s
term). **How long is a step?** The model's FLOPs at a stated per-device kernel efficiency,
stretched by the pipeline's bubble, plus the communication that nothing hides, each collective
timed with the alpha-beta model of :mod:`lessonlib.calc.comm` on the link it crosses (NVLink
inside a node, the network between nodes).

What the model leaves out is stated where it matters: it is a sketch that ranks layouts, not a
simulator of one. Times in seconds, memory in bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..checks import choice, count, flag, positive, share, text
from .comm import LINKS, MULTI_NODE_ALGORITHMS, Link, multi_node_seconds
# KERNEL_EFFICIENCY, a per-kernel share of the peak and not an MFU, lives beside the course's MFU (UTILISATION)
from .hardware import DEVICES, KERNEL_EFFICIENCY, Device
from .mfu import model_hardware_flops
from .pipeline import dualpipe_bubble_work_fraction
from .stage_memory import (busiest_chunk_share, first_stage_activation_bytes, interleaving_problem,
                           layer_bubble_fraction, stage_state_bytes)
from .sharding import ZERO_STAGES, zero_step_traffic

RECOMPUTE = ("none", "save_matmuls", "full")  # of lessonlib.calc.recompute.RECOMPUTE_POLICIES
SCHEDULES = ("1f1b", "dualpipe")
CONTEXT_METHODS = ("ring", "all_gather")


def ridge_flops_per_byte(device) -> float:
    """The roofline's ridge point of ``device`` (a name in the device table, or a
    :class:`~lessonlib.calc.hardware.Device`): dense peak FLOP/s over memory bytes/s (FLOPs per byte).

    A bf16 matmul of an (m x k) by a (k x n) matrix does 2mkn FLOPs and moves 2(mk + kn + mn)
    bytes: with m tokens far fewer than k and n, about m FLOPs a byte. Below the ridge it is
    limited by memory, at m / ridge of the peak.
    """
    d = device if isinstance(device, Device) else DEVICES[choice("device", device, DEVICES)]
    if not d.memory_bandwidth:
        raise ValueError(f"device {d.name!r} has no memory bandwidth in the table: its ridge point is unknown")
    return d.peak_flops_per_s / d.memory_bandwidth


@dataclass(frozen=True)
class ModelShape:
    """A transformer to train: parameters, shape and batch.

    ``params`` total parameters (they price the memory); ``active_params`` the parameters each token
    uses (they price the FLOPs; equal to ``params`` for a dense model); ``expert_params`` the part of
    ``params`` inside the experts (0 for a dense model), spread over the expert-parallel devices;
    ``experts`` routed experts per MoE layer and ``top_k`` experts each token visits;
    ``kv_heads`` the key/value heads (grouped-query attention; ``heads`` when absent);
    ``global_batch`` sequences of ``seq_len`` tokens per step; ``dropout`` whether the layers keep
    dropout masks (1 byte a value, Korthikanti's 34 against 32 without); ``nodes_per_token`` the
    most nodes a token's experts may sit on (DeepSeek-V3's node-limited routing; ``top_k`` when absent);
    ``bytes_per_value`` of the gradients, weights and activations that travel (2 for 16-bit, 4 for fp32).
    """

    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    seq_len: int
    global_batch: int
    active_params: float | None = None
    expert_params: float = 0.0
    experts: int = 1
    top_k: int = 1
    kv_heads: int | None = None
    dropout: bool = True
    nodes_per_token: int | None = None
    bytes_per_value: int = 2


@dataclass(frozen=True)
class Cluster:
    """``world_size`` accelerators of type ``device`` (a key of :data:`lessonlib.calc.hardware.DEVICES`, or a
    :class:`~lessonlib.calc.hardware.Device`), ``node_size`` to a node joined by ``intra`` links, nodes
    joined by ``inter`` links (keys of :data:`lessonlib.calc.comm.LINKS`, or a fitted
    :class:`~lessonlib.calc.comm.Link`: the reader's own processes). Every GPU has its own network port
    (rail-optimised nodes, as a DGX H100's eight); ``multi_node`` is how a collective whose group spans
    nodes uses them (:func:`lessonlib.calc.comm.multi_node_seconds`): ``"rings"`` (NCCL's rings, one
    through each port of the group in a node), ``"hierarchical"``, or ``"single_port"`` (one flat ring
    whose slowest link is one port: the pessimistic contrast)."""

    world_size: int
    device: object = "H100 SXM 80GB"
    node_size: int = 8
    intra: object = "nvlink"
    inter: object = "infiniband"
    multi_node: str = "rings"


@dataclass(frozen=True)
class Layout:
    """Degrees of each split: ``tensor`` x ``context`` x ``pipeline`` x ``data`` = the devices;
    ``expert`` devices share a layer's experts (they come out of the data-parallel ones);
    ``virtual`` pipeline stages per device (1: plain 1F1B; more: the interleaved schedule);
    ``zero`` the ZeRO stage of the data-parallel copies; ``recompute`` "none", "save_matmuls" (keep only the weight
    products' outputs, rebuild the rest) or "full";
    ``schedule`` "1f1b" (interleaved when ``virtual`` > 1) or "dualpipe" (DeepSeek-V3's: two
    micro-batches in opposite directions, each one's communication hidden behind the other's compute,
    at the price of a second copy of the weights and gradients)."""

    tensor: int = 1
    context: int = 1
    pipeline: int = 1
    data: int = 1
    expert: int = 1
    virtual: int = 1
    zero: int = 1
    recompute: str = "none"
    schedule: str = "1f1b"

    def label(self) -> str:
        """'TP 8 × PP 16 × DP 128 (ZeRO-1)': the degrees above 1, as a paper writes them."""
        parts = [f"{n} {d}" for n, d in (("TP", self.tensor), ("CP", self.context), ("PP", self.pipeline),
                                          ("DP", self.data), ("EP", self.expert)) if d > 1 or n == "DP"]
        extra = [f"ZeRO-{self.zero}"] + (["v " + str(self.virtual)] if self.virtual > 1 else []) + (
            ["DualPipe"] if self.schedule == "dualpipe" else []) + (
            [f"{self.recompute} recompute"] if self.recompute != "none" else [])
        return " × ".join(parts) + f" ({', '.join(extra)})"


@dataclass(frozen=True)
class LayoutCost:
    """What a :class:`Layout` costs: bytes on the busiest device, and a step's seconds by part.

    ``state_bytes`` + ``activation_bytes`` = ``memory_bytes``, against the device's
    ``capacity_bytes``; ``data_traffic`` the data-parallel collectives of a step (bytes each kind handles, as
    :func:`lessonlib.calc.sharding.zero_step_traffic` counts them, times how often); ``compute_s`` the step's FLOPs on one device at the kernel efficiency,
    ``bubble_s`` the pipeline's idle time, and the exposed (unhidden) seconds of each split's
    communication (``data_comm_total_s``: the data-parallel collectives' seconds before backward hides them); ``step_s`` their sum; ``mfu`` the model-FLOPs utilisation that step implies.
    """

    layout: Layout
    state_bytes: float
    activation_bytes: float
    capacity_bytes: float
    compute_s: float
    bubble_s: float
    data_traffic: dict
    tensor_comm_s: float
    context_comm_s: float
    pipeline_comm_s: float
    data_comm_s: float
    expert_comm_s: float
    data_comm_total_s: float = 0.0
    mfu: float = field(default=0.0)

    @property
    def compute_share(self) -> float:
        """``compute_s`` over ``step_s``: the share of the step the kernels run (the MFU is the kernel
        efficiency times this, times the model's FLOPs over those executed)."""
        return self.compute_s / self.step_s

    @property
    def memory_bytes(self) -> float:
        return self.state_bytes + self.activation_bytes

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.capacity_bytes

    @property
    def step_s(self) -> float:
        return (self.compute_s + self.bubble_s + self.tensor_comm_s + self.context_comm_s
                + self.pipeline_comm_s + self.data_comm_s + self.expert_comm_s)


def check_model(model) -> ModelShape:
    """``model`` as a :class:`ModelShape` whose numbers agree with each other; errors name the field."""
    if not isinstance(model, ModelShape):
        raise TypeError(f"model must be a ModelShape, got {type(model).__name__}")
    text("model.name", model.name)
    positive("model.params", model.params)
    for name in ("layers", "hidden", "heads", "seq_len", "global_batch", "experts", "top_k"):
        count(f"model.{name}", getattr(model, name))
    flag("model.dropout", model.dropout)
    if model.bytes_per_value not in (2, 4) or isinstance(model.bytes_per_value, bool):
        raise ValueError(f"model.bytes_per_value must be 2 (16-bit) or 4 (fp32), got {model.bytes_per_value!r}")
    if model.hidden % model.heads:
        raise ValueError(f"model.heads ({model.heads}) must divide model.hidden ({model.hidden})")
    kv = model.heads if model.kv_heads is None else count("model.kv_heads", model.kv_heads)
    if model.heads % kv:
        raise ValueError(f"model.kv_heads ({kv}) must divide model.heads ({model.heads})")
    active = model.params if model.active_params is None else positive("model.active_params", model.active_params)
    if active > model.params:
        raise ValueError(f"model.active_params ({active:.3g}) cannot exceed model.params ({model.params:.3g})")
    if not 0 <= model.expert_params < model.params:
        raise ValueError(f"model.expert_params ({model.expert_params:.3g}) must be at least 0 and below "
                         f"model.params ({model.params:.3g})")
    if model.top_k > model.experts:
        raise ValueError(f"model.top_k ({model.top_k}) cannot exceed model.experts ({model.experts})")
    return model


def check_cluster(cluster) -> Cluster:
    """``cluster`` as a :class:`Cluster` with a known device and links; errors name the field."""
    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    count("cluster.world_size", cluster.world_size)
    count("cluster.node_size", cluster.node_size)
    if not isinstance(cluster.device, Device):
        choice("cluster.device", cluster.device, DEVICES)
    for name in ("intra", "inter"):
        if not isinstance(getattr(cluster, name), Link):
            choice(f"cluster.{name}", getattr(cluster, name), LINKS)
    choice("cluster.multi_node", cluster.multi_node, MULTI_NODE_ALGORITHMS)
    return cluster


def step_flops(model) -> float:
    """The FLOPs a training step of ``model`` needs (what an MFU counts): 6 per active parameter per token,
    plus causal attention's 6 x layers x hidden x seq_len per token, over ``global_batch`` x ``seq_len`` tokens.
    :func:`layout_cost` divides these among a layout's devices. The course's one count of a step's FLOPs,
    :func:`lessonlib.calc.mfu.model_hardware_flops` (its model FLOPs, causal)."""
    model = check_model(model)
    return model_hardware_flops(model.active_params or model.params, model.global_batch * model.seq_len,
                                model.layers, model.seq_len, model.hidden).model


def measured_cluster(model, one_process_step_s, link, world_size: int = 2, memory_bytes: float = 2 ** 40) -> Cluster:
    """``world_size`` processes of this machine as a :class:`Cluster` for :func:`layout_cost`: each device's rate is
    what one process measured for a whole step of ``model`` (:func:`step_flops` over ``one_process_step_s``
    seconds), its links the fitted ``link`` (a :class:`~lessonlib.calc.comm.Link`). With
    ``kernel_efficiency=1`` a one-device layout's compute is then that measured step, and every other layout
    divides it as it divides the work (``memory_bytes``: a capacity, default 1 TiB, that every small model fits)."""
    seconds = positive("one_process_step_s", one_process_step_s)
    if not isinstance(link, Link):
        raise TypeError(f"link must be a Link (a fitted one: lessonlib.calc.comm.fit_alpha_beta), got "
                        f"{type(link).__name__}")
    rate = step_flops(model) / seconds
    device = Device("this machine's processes", rate, positive("memory_bytes", memory_bytes),
                    f"one process's measured step: {seconds * 1e3:.3g} ms")
    return Cluster(count("world_size", world_size), device=device, node_size=count("world_size", world_size), intra=link, inter=link)


def _device(cluster: Cluster) -> Device:
    return cluster.device if isinstance(cluster.device, Device) else DEVICES[cluster.device]


def _link(cluster: Cluster, span: int) -> Link:
    """The link a group of ``span`` neighbouring devices talks over: inside a node or between nodes."""
    link = cluster.intra if span <= cluster.node_size else cluster.inter
    return link if isinstance(link, Link) else LINKS[link]


def _group_seconds(cluster: Cluster, collective: str, n_bytes: float, degree: int, inner: int) -> float:
    """A ``collective`` over a group of ``degree`` devices placed ``inner`` apart (the product of the degrees
    placed before it): inside a node on its links, across nodes on ``inner``-strided rails."""
    if inner * degree <= cluster.node_size:
        return _link(cluster, 1).seconds(collective, n_bytes, degree)
    per_node = max(1, cluster.node_size // inner)  # the group's devices in one node, each with its own port
    return multi_node_seconds(collective, n_bytes, degree, per_node, _link(cluster, 1),
                              _link(cluster, cluster.node_size + 1), cluster.multi_node)


def layout_cost(model, cluster, layout, kernel_efficiency: float = KERNEL_EFFICIENCY,
                context_method: str = "ring") -> LayoutCost:
    """Memory on the busiest device and a step's time for ``layout`` of ``model`` on ``cluster``.

    Devices are placed tensor first, then context, pipeline and data (Megatron's and Llama 3's
    order), so a tensor group of up to ``cluster.node_size`` stays inside a node. One
    micro-batch is one sequence. The pieces, each per step:

    * compute: (6 x active parameters + 6 x layers x hidden x seq_len for causal attention) FLOPs
      a token, x 4/3 with full recomputation (``"save_matmuls"``: the causal attention's forward once more, the
      other rebuilt operations cost no FLOPs worth counting), over all devices at ``kernel_efficiency`` of the peak;
      the experts' matmuls slow further when each expert gets fewer tokens than the roofline's
      ridge point (:func:`ridge_flops_per_byte`): a few tokens a weight read cannot keep it busy;
    * bubble: compute x (pipeline - 1) / (virtual x micro-batches) for the interleaved 1F1B schedule (more with
      fewer micro-batches than stages: :func:`~lessonlib.calc.stage_memory.interleaved_bubble_work_fraction`), DualPipe's by DeepSeek-V3's Table 2
      (:func:`~lessonlib.calc.pipeline.dualpipe_bubble_work_fraction`); either times :func:`~lessonlib.calc.stage_memory.busiest_chunk_share`;
    * tensor: with sequence parallelism, the equivalent of 4 all-reduces of a micro-batch's
      activations per layer (2 forward, 2 backward), none hidden (an upper bound: Megatron-LM overlaps part);
    * context, ``context_method="ring"``: the ring passes each device's keys and values context - 1
      times in forward and twice that in backward, hidden behind the attention it overlaps while
      that takes longer; ``"all_gather"`` (Llama 3's): every device gathers the whole sequence's keys
      and values before its attention, and reduce-scatters their gradients after, none hidden;
    * pipeline: one send of a micro-batch's activations per stage boundary, each way;
    * data: the gradients reduce-scattered and the weights all-gathered once a step (ZeRO-2 and -3
      reduce-scatter every micro-batch's gradients, and ZeRO-3 with a pipeline gathers the weights
      for every micro-batch's forward and backward). What runs once a step starts when a stage's gradients
      are final: only the last micro-batch's backward (2/3 of the compute over ``m``) hides it, all of it,
      optimistic for ZeRO-1, whose all-gather waits for the optimizer step (page 3.11 prices that exposed).
      What runs for every micro-batch hides behind every micro-batch's backward, and all of it
      together behind no more than the whole backward (2/3 of the compute);
    * expert: 4 all-to-alls per layer of each token's activations, once for each node its experts
      sit on (at most ``top_k``, or ``nodes_per_token``); none hidden under 1F1B, hidden behind
      the other micro-batch's compute under DualPipe.
    """
    model, cluster = check_model(model), check_cluster(cluster)
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a Layout, got {type(layout).__name__}")
    eff = positive("kernel_efficiency", share("kernel_efficiency", kernel_efficiency))
    t, c, p, d = (count(f"layout.{n}", getattr(layout, n)) for n in ("tensor", "context", "pipeline", "data"))
    e, v = count("layout.expert", layout.expert), count("layout.virtual", layout.virtual)
    zero = count("layout.zero", layout.zero, minimum=min(ZERO_STAGES), maximum=max(ZERO_STAGES))
    choice("layout.recompute", layout.recompute, RECOMPUTE)
    dualpipe = choice("layout.schedule", layout.schedule, SCHEDULES) == "dualpipe"
    choice("context_method", context_method, CONTEXT_METHODS)
    if t * c * p * d != cluster.world_size:
        raise ValueError(f"layout: tensor x context x pipeline x data = {t * c * p * d}, but cluster.world_size "
                         f"is {cluster.world_size}")
    kv = model.kv_heads or model.heads
    if model.heads % t or kv % t and t % kv:
        raise ValueError(f"layout.tensor ({t}) must divide model.heads ({model.heads}) and fit model.kv_heads ({kv})")
    if c > 1 and model.seq_len % (2 * c):
        raise ValueError(f"layout.context ({c}): 2 x context must divide model.seq_len ({model.seq_len})")
    if p > model.layers:
        raise ValueError(f"layout: pipeline ({p}) must be at most model.layers ({model.layers})")
    if dualpipe and (v > 1 or p % 2):
        raise ValueError(f"layout.schedule 'dualpipe' needs an even layout.pipeline (got {p}) and virtual 1 "
                         f"(got {v})")
    if d % e or model.experts % e:
        raise ValueError(f"layout.expert ({e}) must divide layout.data ({d}) and model.experts ({model.experts})")
    if model.global_batch % d:
        raise ValueError(f"layout.data ({d}) must divide model.global_batch ({model.global_batch})")
    micro = model.global_batch // d  # micro-batches of one sequence per data-parallel copy
    why = interleaving_problem(model.layers, p, v, micro) if not dualpipe else ""
    if why:
        raise ValueError(f"layout.virtual: {why}")
    s, h, layers = model.seq_len, model.hidden, model.layers
    peak = _device(cluster).peak_flops_per_s
    active = model.active_params or model.params
    dense_params = model.params - model.expert_params

    # --- memory on the busiest device: the first pipeline stage ---
    dense = dense_params / (t * p)
    experts = model.expert_params / (e * p)
    # the state by part (DualPipe: a second copy of the stage's 16-bit weights and gradients, for the reverse direction)
    state = stage_state_bytes(dense, experts, data=d, expert=e, zero=zero, dualpipe=dualpipe).total
    stage_layers = math.ceil(layers / p)
    # Korthikanti's bytes a layer (sequence parallelism, fused attention) for the micro-batches in flight, the
    # interleaved schedule's deeper warm-up and DualPipe's one extra micro-batch included: the one formula of
    # calc.stage_memory
    activations = first_stage_activation_bytes(s, h, model.heads, layers, tensor=t, context=c, pipeline=p,
                                               virtual=v, micro_batches=micro, recompute=layout.recompute,
                                               dropout=model.dropout, dualpipe=dualpipe)

    # --- a step's time ---
    tokens = model.global_batch * s
    useful = step_flops(model)  # the model's FLOPs (MFU counts these)
    expert_flops = 6 * (active - dense_params) * tokens if model.expert_params else 0.0
    slow = 1.0
    if expert_flops > 0:
        per_expert = e * (s // c) * model.top_k / model.experts  # tokens each expert's matmul gets
        slow = max(1.0, ridge_flops_per_byte(_device(cluster)) / per_expert)
    extra = 4 / 3 if layout.recompute == "full" else 1.0
    rerun = 2 * layers * h * s * tokens if layout.recompute == "save_matmuls" else 0.0  # causal attention, again
    compute = ((useful - expert_flops + expert_flops * slow) * extra + rerun) / (cluster.world_size * peak * eff)
    # the bubble over the compute: DualPipe's, or interleaved 1F1B's (p - 1) / (v m); the busiest chunk paces either
    bubble = compute * (dualpipe_bubble_work_fraction(p, micro) * busiest_chunk_share(layers, p) if dualpipe
                        else layer_bubble_fraction(layers, p, v, micro))
    act_bytes = model.bytes_per_value * (s // c) * h  # one micro-batch's activations at a layer boundary
    tensor_comm = 0.0
    if t > 1:
        tensor_comm = 4 * stage_layers * micro * _group_seconds(cluster, "all_reduce", act_bytes, t, 1)
    per_micro = compute / micro  # one micro-batch's compute on this device, all its stage's layers
    context_comm = 0.0
    if c > 1:
        link = _link(cluster, t * c)
        kv_bytes = 2 * model.bytes_per_value * (s // c) * h * kv / model.heads / t  # this device's keys and values
        if context_method == "ring":
            ring = 3 * (c - 1) * (link.alpha_s + kv_bytes / link.beta_bytes_per_s)
            attention = per_micro / stage_layers * (6 * layers * h * s) / (6 * active + 6 * layers * h * s)
            context_comm = max(0.0, ring - attention) * stage_layers * micro
        else:
            gather = sum(_group_seconds(cluster, k, kv_bytes * c, c, t) for k in ("all_gather", "reduce_scatter"))
            context_comm = gather * stage_layers * micro
    pipeline_comm = 0.0
    if p > 1:
        link = _link(cluster, t * c * p)
        one = 2 * v * (link.alpha_s + act_bytes / t / link.beta_bytes_per_s)
        pipeline_comm = micro * (max(0.0, one - per_micro) if dualpipe else one)
    # ZeRO-2 and -3 keep no whole gradient, so each micro-batch's gradients are reduce-scattered as they
    # come, and ZeRO-3 gathers the weights for each micro-batch's forward and backward (they are freed
    # between); stages 0 and 1 reduce once a step. Bytes as zero_step_traffic counts them, in one collective
    # per layer and one for the rest, as FSDP wraps a model (each pays the link's latency alpha).
    bpv = model.bytes_per_value
    traffic = {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0}
    data_step = data_micro = 0.0  # seconds of collectives run once a step, and for every micro-batch
    if d > 1:
        groups = [(math.ceil(dense), d)] + ([(math.ceil(experts), d // e)] if experts and d // e > 1 else [])
        for n_params, group in groups:
            one = zero_step_traffic(n_params, group, zero, bpv)
            for kind in traffic:
                times = micro if (kind == "reduce_scatter" and zero >= 2) or (kind == "all_gather" and zero == 3) else 1
                traffic[kind] += one[kind] * times
                if one[kind]:  # one collective per layer, and one for the rest (embeddings, output layer)
                    units = stage_layers + 1
                    secs = times * units * _group_seconds(cluster, kind, one[kind] / units, group,
                                                          t * c * p * (d // group))
                    if times == micro and micro > 1:
                        data_micro += secs
                    else:
                        data_step += secs
    data_total = data_step + data_micro
    backward = compute * 2 / 3  # this device's backward passes, all micro-batches
    # once a step: only the last micro-batch's backward hides it; and all of it together no more than every backward
    data_comm = max(0.0, data_step - backward / micro, data_step + data_micro - backward)
    expert_comm = 0.0
    if e > 1:
        link = _link(cluster, t * c * e)
        copies = min(model.top_k, model.nodes_per_token or model.top_k)
        moe_bytes = model.bytes_per_value * (s // c) * h * copies / t  # this device's tokens, once per destination
        one = 4 * stage_layers * (e - 1) * (link.alpha_s + moe_bytes / e / link.beta_bytes_per_s)
        expert_comm = micro * (max(0.0, one - per_micro) if dualpipe else one)
    cost = LayoutCost(layout, state, activations, _device(cluster).memory_bytes, compute, bubble, traffic,
                      tensor_comm, context_comm, pipeline_comm, data_comm, expert_comm, data_total)
    mfu = useful / (cluster.world_size * peak * cost.step_s)
    return LayoutCost(**{**cost.__dict__, "mfu": mfu})
