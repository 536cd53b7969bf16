"""Selective activation recomputation, measured with PyTorch's own API.

Full recomputation (:mod:`lessonlib.measure.recompute`) keeps only each
layer's input and reruns the whole layer in backward. Selective recomputation
keeps the outputs of the expensive operations and reruns only the cheap ones.
PyTorch does it with :func:`torch.utils.checkpoint.create_selective_checkpoint_contexts`
passed as ``context_fn`` to a non-reentrant :func:`torch.utils.checkpoint.checkpoint`:
a *policy* function sees every operation of the checkpointed region and says,
for each, whether its output is saved or recomputed.

The policy here, :func:`save_matmuls` (``recompute="save_matmuls"``, named as in
:data:`lessonlib.calc.recompute.RECOMPUTE_POLICIES`), saves the weight matrix products
(``aten.mm``/``aten.addmm``: the QKV, output-projection and two MLP products)
and recomputes everything else: LayerNorm, the attention scores and their
softmax and dropout (batched products, ``aten.bmm``), GELU and the dropouts.
``recompute="attention"`` (Korthikanti et al.'s selective recomputation) is
:func:`core_checkpointed`: only the attention core under a plain ``checkpoint``.

Units: bytes, FLOPs (a multiply-add is 2; ``FlopCounterMode`` counts matrix
products only), and ratios of times measured in one run by
:func:`lessonlib.measure.rounds.time_rounds`. The formulas are in
:mod:`lessonlib.calc.recompute` and :mod:`lessonlib.calc.memory`.
"""
from __future__ import annotations

import statistics

import functools
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import (CheckpointPolicy, SelectiveCheckpointContext, checkpoint,
                                   create_selective_checkpoint_contexts)

from ..checks import choice, count, flag, fraction_below_one, sequence
from .activations import check_shape
from .compat import checkpoint_early_stop, feature, require
from .device import as_device
from .memory import peak_memory, warm_up
from .models import TinyGPT
from .rounds import time_rounds

#: The settings :func:`compare` and :func:`time_ratios` measure by default, named as in
#: :data:`lessonlib.calc.recompute.RECOMPUTE_POLICIES` (:func:`forward` also runs "attention" and
#: "save_matmuls_and_attention").
RECOMPUTE = ("none", "save_matmuls", "full")

#: The operations whose outputs :func:`save_matmuls` keeps: the weight matrix products.
SAVED_OPS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)

#: The most timing rounds :func:`time_ratios` runs.
MAX_ROUNDS = 100


def save_matmuls(ctx, op, *args, **kwargs):
    """The policy: save what the weight matrix products return, recompute every other operation."""
    if not isinstance(ctx, SelectiveCheckpointContext):
        raise TypeError(f"ctx must be the SelectiveCheckpointContext PyTorch passes, got {type(ctx).__name__}")
    if not isinstance(op, torch._ops.OpOverload):  # torch's own type for an operation such as aten.mm.default
        raise TypeError(f"op must be a torch operation (such as torch.ops.aten.mm.default), got {type(op).__name__}")
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def save_everything(ctx, op, *args, **kwargs):
    """A policy that saves every output, so nothing is recomputed: what is left is the policy's own cost."""
    save_matmuls(ctx, op)  # the same checks
    return CheckpointPolicy.MUST_SAVE


#: What :func:`save_matmuls_and_attention` keeps besides: the outputs of a fused attention kernel, each of the
#: kernels ``scaled_dot_product_attention`` may pick (torchtitan's per-operation save list keeps them too).
SDPA_OPS = tuple(getattr(torch.ops.aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    if hasattr(torch.ops.aten, name))


def save_matmuls_and_attention(ctx, op, *args, **kwargs):
    """The policy for fused attention: also save what the attention kernel returns, so backward does not rerun it."""
    if save_matmuls(ctx, op) == CheckpointPolicy.MUST_SAVE or op in SDPA_OPS:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


#: The per-operation policies :func:`forward` runs, by their ``recompute`` names (the policy function's own name).
POLICIES = {"save_matmuls": save_matmuls, "save_matmuls_and_attention": save_matmuls_and_attention}

#: Every ``recompute`` :func:`forward` takes.
SETTINGS = ("none", "attention", *POLICIES, "full")


def forward(blocks: torch.nn.Sequential, x: torch.Tensor, recompute: str = "none") -> torch.Tensor:
    """Run ``blocks`` on ``x``, each block checkpointed as ``recompute`` says (one of :data:`SETTINGS`:
    "none", "full", "attention" (:func:`core_checkpointed`), or a per-operation policy of :data:`POLICIES`)."""
    _check(blocks, x, recompute)
    if recompute == "attention":
        return core_checkpointed(blocks, x)
    return _run(blocks, x, recompute if recompute in ("none", "full") else POLICIES[recompute])


def _run(blocks, x, policy):
    """``policy``: "none", "full" or a policy function (the timing control passes :func:`save_everything`)."""
    for block in blocks:
        if policy == "none":
            x = block(x)
        elif policy == "full":
            x = checkpoint(block, x, use_reentrant=False)
        else:
            x = checkpoint(block, x, use_reentrant=False,
                           context_fn=functools.partial(create_selective_checkpoint_contexts, policy))
    return x


def core_checkpointed(blocks: torch.nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """Each block by hand, only its attention core under a plain ``checkpoint`` (no policy, so no
    per-operation dispatch): ``recompute="attention"``, Korthikanti et al.'s selective recomputation,
    the same two score products rerun as :func:`save_matmuls` (early stop off, so the second one is rerun too)."""
    _check(blocks, x, "none")
    if any(getattr(getattr(block, "attn", None), "impl", None) != "math" for block in blocks):
        raise ValueError("blocks must be the course GPT's blocks with their attention written out (impl='math'), "
                         "as gpt_blocks makes them")
    with checkpoint_early_stop(False):
        for block in blocks:
            core = checkpoint(block.attn.core, block.attn.qkv(block.ln1(x)), use_reentrant=False)
            x = x + block.drop1(block.attn.proj(core))
            x = x + block.mlp(x)
    return x


def _check(blocks, x, recompute):
    if not isinstance(blocks, torch.nn.Sequential):
        raise TypeError(f"blocks must be an nn.Sequential of transformer blocks, got {type(blocks).__name__}")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 3:
        raise ValueError("x must be a floating-point tensor of shape (batch, seq_len, hidden)")
    params = list(blocks.parameters())
    if not params or params[0].shape[-1] != x.shape[-1] or params[0].device != x.device:
        raise ValueError(f"x must end in the blocks' width and sit on their device, got shape {tuple(x.shape)}")
    choice("recompute", recompute, SETTINGS)


def gpt_blocks(batch: int = 4, seq_len: int = 128, hidden: int = 64, heads: int = 4, layers: int = 4,
               device=None, seed: int = 0, dropout: float = 0.1):
    """The course GPT's ``layers`` blocks in bf16 (attention written out, as Korthikanti et al. count it;
    1-byte dropout masks) and a seeded input ``(batch, seq_len, hidden)`` that needs its gradient.
    ``dropout`` is the blocks' dropout rate: 0.1 (the paper's model, whose masks its formula counts) or
    0.0, as large language models are pretrained today (no masks, no random numbers)."""
    batch, seq_len, hidden = check_shape(batch, seq_len, hidden, heads)  # the activation sweeps' limits
    heads, layers, seed = count("heads", heads), count("layers", layers), count("seed", seed, minimum=0)
    dropout = fraction_below_one("dropout", dropout)
    device = as_device("device", device)
    torch.manual_seed(seed)
    gpt = TinyGPT(seq_len=seq_len, hidden=hidden, heads=heads, layers=layers, dropout=dropout).to(device, torch.bfloat16)
    x = torch.randn(batch, seq_len, hidden, dtype=torch.bfloat16, device=device).requires_grad_()
    return gpt.blocks, x


def _step(blocks, x, recompute):
    forward(blocks, x, recompute).float().pow(2).mean().backward()


def _clear(blocks, x):
    blocks.zero_grad(set_to_none=True)
    x.grad = None


def kept_after_forward(blocks, x, recompute: str = "none") -> int | None:
    """Bytes the forward leaves allocated for backward (what the layers keep), then runs backward.

    :func:`lessonlib.measure.memory.peak_memory` measures peaks; what a forward
    leaves behind is a level, read here from the same counters: on a GPU
    ``torch.cuda.memory_allocated`` before and after, on a CPU PyTorch's
    ``MemTracker`` (its "current" snapshot). Inside a checkpoint the tensors kept are the
    checkpoint's own, which ``saved_tensors_hooks`` cannot see, so a counter of
    allocations is the way to read them. None on a CPU torch without ``MemTracker``.
    """
    _check(blocks, x, recompute)
    _clear(blocks, x)
    if x.device.type == "cuda":
        warm_up(x.device)  # cuBLAS's one-off workspace must not count as kept
        torch.cuda.synchronize(x.device)
        before = torch.cuda.memory_allocated(x.device)
        y = forward(blocks, x, recompute)
        torch.cuda.synchronize(x.device)
        kept = torch.cuda.memory_allocated(x.device) - before  # the input was there before; the output counts
        y.float().pow(2).mean().backward()
        _clear(blocks, x)
        return int(kept)
    MemTracker = feature("mem_tracker")
    if MemTracker is None:
        _step(blocks, x, recompute)
        _clear(blocks, x)
        return None
    tracker = MemTracker()
    tracker.track_external(blocks, x)

    def total():
        return int(sum(d.get("Total", 0) for d in tracker.get_tracker_snapshot("current").values()))

    start = total()
    with tracker:
        y = forward(blocks, x, recompute)
        kept = total() - start
        y.float().pow(2).mean().backward()
    _clear(blocks, x)
    return kept


def step_flops(blocks, x, recompute: str = "none") -> int:
    """FLOPs of one training step (forward, recomputation and backward), by ``FlopCounterMode``."""
    _check(blocks, x, recompute)
    FlopCounterMode = require("flop_counter")
    _clear(blocks, x)
    with FlopCounterMode(display=False) as counter:
        _step(blocks, x, recompute)
    _clear(blocks, x)
    return int(counter.get_total_flops())


def peak_step_bytes(blocks, x, recompute: str = "none") -> int | None:
    """Peak memory of one training step above the weights and the input, in bytes
    (:func:`lessonlib.measure.memory.peak_memory`; None on a CPU torch without its tracker)."""
    _check(blocks, x, recompute)
    _clear(blocks, x)
    _, peak = peak_memory(lambda: _step(blocks, x, recompute), device=x.device, track=(blocks, x))
    _clear(blocks, x)
    return None if peak is None else peak.added


#: The case of :func:`time_ratios` that runs the policy machinery and recomputes nothing.
POLICY_ONLY = "policy only"

#: The case of :func:`time_ratios` that reruns the score products with no policy: :func:`core_checkpointed`,
#: ``recompute="attention"``.
CORE_ONLY = "attention"


def time_ratios(blocks, x, rounds: int = 15, progress: bool = False) -> dict:
    """Median over ``rounds`` of each setting's step time over the plain step's, every case timed in every
    round (:func:`lessonlib.measure.rounds.time_rounds`, one thread). Returns ``{case: ratio}`` for the
    settings of :data:`RECOMPUTE` and :data:`POLICY_ONLY`: per-operation checkpointing with :func:`save_everything`, which
    recomputes nothing, so its ratio is the cost of running a policy for every operation; and
    :data:`CORE_ONLY`, :func:`core_checkpointed`: the same rerun products with no policy."""
    per_round = time_ratio_rounds(blocks, x, rounds, progress)
    return {name: statistics.median(r) for name, r in per_round.items()}


def time_ratio_rounds(blocks, x, rounds: int = 15, progress: bool = False) -> dict:
    """The per-round ratios :func:`time_ratios` takes the median of: ``{case: [ratio of round 0, ...]}``
    (each setting's step time over the plain step's in the same round), to judge a difference of two
    medians against the rounds' spread."""
    _check(blocks, x, "none")
    rounds = count("rounds", rounds, maximum=MAX_ROUNDS)
    progress = flag("progress", progress)
    cases = {"none": functools.partial(forward, recompute="none"), CORE_ONLY: core_checkpointed,
             **{rc: functools.partial(forward, recompute=rc) for rc in RECOMPUTE if rc != "none"},
             POLICY_ONLY: functools.partial(_run, policy=save_everything)}

    def step(fn):
        fn(blocks, x).float().pow(2).mean().backward()

    def one_round(clock):
        for name, fn in cases.items():
            _clear(blocks, x)
            clock.time(name, step, fn)

    try:
        raw = time_rounds(one_round, rounds, warmup=1, device=x.device, num_threads=1, progress=progress)
    finally:
        _clear(blocks, x)
    return {name: [a / b for a, b in zip(raw.seconds[name], raw.seconds["none"])] for name in cases}


@dataclass(frozen=True)
class SelectiveRow:
    """One recompute setting, measured: ``kept_bytes`` after forward and ``peak_bytes`` of the
    step (bytes, None without a CPU tracker), ``flops`` of the step."""

    recompute: str
    kept_bytes: int | None
    peak_bytes: int | None
    flops: int


def compare(blocks, x, settings=RECOMPUTE) -> list:
    """A :class:`SelectiveRow` for each of ``settings`` (by default :data:`RECOMPUTE`; any of :data:`SETTINGS`)."""
    settings = [choice("settings", s, SETTINGS) for s in sequence("settings", settings)]
    _check(blocks, x, "none")
    return [SelectiveRow(rc, kept_after_forward(blocks, x, rc), peak_step_bytes(blocks, x, rc),
                         step_flops(blocks, x, rc)) for rc in settings]
