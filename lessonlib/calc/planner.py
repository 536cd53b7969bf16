"""Plan a training run on one kind of device: the two numbers and the three failures.

Compare two numbers with what a device holds: the training state (16 bytes per
parameter for Adam in mixed precision) and the activations at the batch *per
device*. Then one of three failures (or none) applies, each with its answer
(:data:`ANSWERS`): "state" (split the state itself: data parallelism copies it),
"activations" (a smaller micro-batch with gradient accumulation, then
recomputation, selective before full, then tensor parallelism with sequence
parallelism or context parallelism; a 1F1B pipeline's first stage keeps one
micro-batch of its layers per stage, as many activations as one device would),
and "time" (more devices on different data). A share of each device (:data:`RESERVE`, 10 %) is kept
back for what the two numbers leave out. :func:`propose` finds the smallest
change that fits, with its numbers; :func:`layout` gives the bytes per device
and the time of any layout. Pure Python: no torch needed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..checks import (choice as check_choice, count as check_count, flag as check_flag,
                      fraction_below_one as check_fraction_below_one, positive as check_positive,
                      result as check_result, text as check_text)
from .memory import (ATTENTION_CHOICES, OPTIMIZER_BYTES_PER_PARAM, RECOMPUTE_CHOICES, activation_bytes,
                     activation_bytes_per_value, check_heads, training_state_bytes)
from .precision import precision_name
from .presets import GPT2_VOCAB, PRESETS, transformer_params  # noqa: F401  (planner.PRESETS, as pages use it)


SECONDS_PER_DAY = 86_400

#: Share of a device's memory the planner keeps back by default (a fraction): a real job loses some to the CUDA
#: context, the communication library's buffers (NCCL), the allocator's fragmentation and temporary tensors
#: such as fp32 logits; 5-10 % is common, so the planner plans on 90 % of the device.
RESERVE = 0.10

def training_flops(n_params, tokens, recompute: str = "none", seq_len=None, hidden=None, layers=None) -> float:
    """Total training compute in FLOPs for ``tokens`` tokens.

    Without recomputation, 6 x parameters x tokens (forward 2, backward 4
    per parameter per token; attention's own matrix products left out, as in
    the usual estimate). Recomputation runs forward work a second time:

    * ``"full"`` repeats the whole forward: 8 x parameters x tokens;
    * ``"attention"`` (Korthikanti et al.'s selective recomputation: the attention core rebuilt)
      repeats only the attention scores and their product
      with the values, 4 x seq_len x hidden FLOPs per token per layer (needs
      ``seq_len``, ``hidden`` and ``layers``): the whole score matrix, as a written-out attention reruns it.
      The course's count of model FLOPs, causal attention at half, is :mod:`lessonlib.calc.mfu`'s.

    >>> training_flops(10, 100)
    6000.0
    >>> training_flops(10, 100, recompute="full")
    8000.0
    """
    n = check_count("n_params", n_params)
    t = check_count("tokens", tokens)
    check_choice("recompute", recompute, RECOMPUTE_CHOICES)
    # The shape is checked whenever it is given, whatever the recompute setting: a wrong seq_len
    # is a mistake even where this formula does not read it.
    seq_len, hidden, layers = (None if v is None else check_count(k, v)
                               for k, v in (("seq_len", seq_len), ("hidden", hidden), ("layers", layers)))
    if recompute == "attention" and (seq_len is None or hidden is None or layers is None):
        raise ValueError("recompute='attention' needs seq_len, hidden and layers")
    return _training_flops(n, t, recompute, seq_len, hidden, layers)


def _training_flops(n, t, recompute, seq_len, hidden, layers) -> float:
    """:func:`training_flops` on arguments already checked (by it, or by :func:`plan`)."""
    if n >= 2**1000 or t >= 2**1000:
        raise ValueError(f"n_params × tokens is too large to count in FLOPs (n_params={n:.3g}, tokens={t:.3g})")
    flops = 6.0 * float(n) * float(t)
    if recompute == "full":
        flops += 2.0 * n * t
    elif recompute == "attention":
        flops += 4.0 * seq_len * hidden * layers * t
    return check_result(flops, "n_params, tokens, seq_len, hidden and layers", "a FLOP count")


def single_device_seconds(total_flops, device_flops_per_s) -> float:
    """Seconds one device needs: total FLOPs / FLOP/s the device actually sustains."""
    seconds = check_positive("total_flops", total_flops) / check_positive("device_flops_per_s", device_flops_per_s)
    return check_result(seconds, "total_flops and device_flops_per_s", "a time in seconds")


@dataclass(frozen=True)
class Plan:
    """The two numbers (bytes), the single-device time (days, or None), and the verdict
    (failure: "state", "activations", "time" or "none"; answer: what to do about it)."""

    state_bytes: int
    activation_bytes: int
    device_bytes: int
    days: float | None
    failure: str
    answer: str
    max_batch_that_fits: int  # largest batch per device whose activations fit (0: none)
    flops: float | None = None  # total training FLOPs, recomputation included (None without tokens)
    reserve_bytes: int = 0  # bytes of the device kept back (``reserve`` x device_bytes): the plan uses the rest

    @property
    def usable_bytes(self) -> int:
        """Bytes the state and activations may take: the device's, less the reserve."""
        return self.device_bytes - self.reserve_bytes


ANSWERS = {
    "state": ("The training state alone does not fit. Data parallelism will not help: every device "
              "would keep a full copy of the state. Split the state itself across devices."),
    "activations": ("The state fits but the activations at this batch per device do not. Try, in order: "
                    "a smaller batch per device (accumulate gradients over several to keep the batch per update); "
                    "activation recomputation, selective before full; then splitting the activations themselves "
                    "with tensor parallelism plus sequence parallelism, or context parallelism (a pipeline does "
                    "not: its first stage keeps one micro-batch in flight per stage)."),
    "time": ("Everything fits, but one device would take too long. Nothing is broken: use more devices "
             "doing the same work on different data (data parallelism), up to the critical batch size."),
    "none": "Everything fits on one device and the run finishes within the time limit.",
}


def plan(n_params, optimizer: str = "adam", precision: str = "bf16_master", batch_per_device=1, seq_len=2048,
         layers=1, hidden=1, heads=1, recompute: str = "none", device_bytes=80e9,
         train_tokens=None, device_flops_per_s=None, max_days: float = 30.0, *, attention: str = "fused",
         sequence_parallel: bool = False, vocab=None, reserve: float = RESERVE, dropout: bool = False) -> Plan:
    """Compare the two numbers with ``device_bytes`` and name the failure that applies.

    Sizes are counts; ``device_bytes`` is bytes; ``device_flops_per_s`` is the
    FLOP/s one device sustains; ``max_days`` is how long one device may take.
    The time check runs only when both ``train_tokens`` and ``device_flops_per_s`` are given.

    ``precision`` (:data:`lessonlib.calc.precision.PRECISIONS`) changes both numbers:
    "bf16_master" keeps 16-bit weights and gradients plus an fp32 master copy and
    2-byte activations; "fp32" keeps no master copy and 4-byte activations. ``recompute`` shrinks the
    activations and adds its forward work to the time (:func:`training_flops`).
    ``attention`` ("fused", the default, or "stored": the paper's stored scores),
    ``sequence_parallel`` and ``vocab`` (adds the loss's logits; None: the layers
    only) and ``dropout`` (its masks; False, the default: today's pretraining uses none, as page 1.3 counts)
    go to :func:`lessonlib.calc.memory.activation_bytes`. With fused attention,
    ``recompute="attention"`` changes nothing: the kernel already recomputes the
    scores in backward, so it keeps no score term and adds no FLOPs.

    ``reserve`` (a fraction from 0 to below 1; :data:`RESERVE`, 10 %, by default) is the share of
    ``device_bytes`` kept back for what the two numbers leave out (the CUDA context, NCCL's buffers, the
    allocator's fragmentation, temporary fp32 logits): the state and the activations must fit in the rest,
    :attr:`Plan.usable_bytes`. ``reserve=0`` is the idealised count, every byte free.
    """
    return _plan(*_checked(n_params, optimizer, precision, batch_per_device, seq_len, layers, hidden, heads,
                           recompute, device_bytes, train_tokens, device_flops_per_s, max_days, attention,
                           sequence_parallel, vocab, reserve, dropout))


def _checked(n_params, optimizer, precision, batch_per_device, seq_len, layers, hidden, heads, recompute,
             device_bytes, train_tokens, device_flops_per_s, max_days, attention, sequence_parallel, vocab,
             reserve=RESERVE, dropout=False) -> tuple:
    """:func:`plan`'s arguments, each checked once under the name the caller used: what :func:`_plan` takes."""
    n_params = check_count("n_params", n_params)
    check_choice("optimizer", optimizer, OPTIMIZER_BYTES_PER_PARAM)
    precision = precision_name(precision)
    batch_per_device = check_count("batch_per_device", batch_per_device)
    seq_len, layers = check_count("seq_len", seq_len), check_count("layers", layers)
    hidden, heads = check_count("hidden", hidden), check_count("heads", heads)
    check_heads(hidden, heads)
    check_choice("recompute", recompute, RECOMPUTE_CHOICES)
    check_choice("attention", attention, ATTENTION_CHOICES)
    sequence_parallel = check_flag("sequence_parallel", sequence_parallel)
    if vocab is not None:
        vocab = check_count("vocab", vocab)
    dev = check_count("device_bytes", device_bytes)
    if train_tokens is not None:
        train_tokens = check_count("train_tokens", train_tokens)
    if device_flops_per_s is not None:
        device_flops_per_s = check_positive("device_flops_per_s", device_flops_per_s)
    max_days = check_positive("max_days", max_days)
    reserve = check_fraction_below_one("reserve", reserve)
    reserve_bytes = min(dev, math.ceil(dev * reserve))  # rounded up: the plan never counts a reserved byte as free
    conv = dict(attention=attention, sequence_parallel=sequence_parallel, vocab=vocab,
                dropout=check_flag("dropout", dropout))
    return (n_params, optimizer, precision, batch_per_device, seq_len, layers, hidden, heads, recompute, dev,
            train_tokens, device_flops_per_s, max_days, reserve_bytes, conv)


def _plan(n_params, optimizer, precision, batch_per_device, seq_len, layers, hidden, heads, recompute, dev,
          train_tokens, device_flops_per_s, max_days, reserve_bytes, conv) -> Plan:
    """:func:`plan` on arguments :func:`_checked` has checked (internal calls trust their caller)."""
    state = training_state_bytes(n_params, optimizer, precision).total
    e = activation_bytes_per_value(precision)
    act = activation_bytes(seq_len, batch_per_device, hidden, heads, layers, recompute, e, **conv)
    days = flops = None
    if train_tokens is not None:
        # a fused attention kernel already recomputes its scores in backward: "attention" adds no work there
        counted = "none" if recompute == "attention" and conv["attention"] == "fused" else recompute
        flops = _training_flops(n_params, train_tokens, counted, seq_len, hidden, layers)
    if flops is not None and device_flops_per_s is not None:
        days = check_result(flops / device_flops_per_s, "train_tokens and device_flops_per_s",
                            "a time in seconds") / SECONDS_PER_DAY
    per_sample = activation_bytes(seq_len, 1, hidden, heads, layers, recompute, e, **conv)
    usable = dev - reserve_bytes
    max_batch = max(0, (usable - state) // per_sample) if usable > state else 0
    if state > usable:
        failure = "state"
    elif state + act > usable:
        failure = "activations"
    elif days is not None and days > max_days:
        failure = "time"
    else:
        failure = "none"
    return Plan(state, act, dev, days, failure, ANSWERS[failure], int(max_batch), flops, reserve_bytes)


# The three answers with numbers: the smallest change that fits.
#: Tensor-parallel degrees tried, smallest first (within one node of 8 devices).
TP_DEGREES = (2, 4, 8)
#: Device counts tried when more devices are the answer.
DEVICE_COUNTS = tuple(2 ** k for k in range(1, 17))


@dataclass(frozen=True)
class Layout:
    """A way to lay the run out on devices, and what it costs per device.

    ``world_size`` in all, ``tensor_parallel`` of them splitting each layer
    (so ``world_size // tensor_parallel`` data-parallel replicas), ZeRO
    ``zero_stage`` over those replicas, and ``recompute``. Bytes are per
    device; ``days`` is the run's time if every device computes all the time
    (the one-device time / devices: a lower bound, communication left out),
    or None without a time check. ``change`` says what differs from the plan
    it was proposed for ("" for the plan itself). ``accumulation`` > 1: each
    device runs micro-batches of 1/accumulation of the plan's batch per device
    and adds up their gradients before the update (same FLOPs, same batch per update).
    """

    world_size: int
    tensor_parallel: int
    zero_stage: int
    recompute: str
    state_bytes: int
    activation_bytes: int
    device_bytes: int
    days: float | None
    max_days: float
    change: str = ""
    accumulation: int = 1  # gradient-accumulation steps: the micro-batch is the plan's batch per device / this
    reserve_bytes: int = 0  # bytes of each device kept back (the planner's ``reserve``)

    @property
    def fits_memory(self) -> bool:
        return self.state_bytes + self.activation_bytes <= self.device_bytes - self.reserve_bytes

    @property
    def fits_time(self) -> bool:
        return self.days is None or self.days <= self.max_days

    @property
    def fits(self) -> bool:
        return self.fits_memory and self.fits_time


def layout(n_params, optimizer: str = "adam", precision: str = "bf16_master", batch_per_device=1, seq_len=2048,
           layers=1, hidden=1, heads=1, recompute: str = "none", device_bytes=80e9, train_tokens=None,
           device_flops_per_s=None, max_days: float = 30.0, *, world_size=1, zero_stage=0, tensor_parallel=1,
           change: str = "", attention: str = "fused", sequence_parallel: bool = False, vocab=None,
           reserve: float = RESERVE, dropout: bool = False) -> Layout:
    """The two numbers per device for a run split over ``world_size`` devices (arguments as :func:`plan`).

    Tensor parallelism of degree t splits every weight matrix, and so
    (nearly) every parameter, t ways: the state per device is ZeRO's for
    ceil(n_params / t) parameters over ``world_size // t`` replicas
    (:func:`lessonlib.calc.sharding.zero_state_bytes`), and the activations
    follow Korthikanti's formula with ``tensor_parallel=t`` (and ``attention``,
    ``sequence_parallel``, ``vocab`` as :func:`plan`). Raises ``ValueError`` when
    ``tensor_parallel`` does not divide ``world_size``, or does not divide ``heads`` and ``hidden``.
    """
    from .sharding import check_stage

    checked = _checked(n_params, optimizer, precision, batch_per_device, seq_len, layers, hidden, heads, recompute,
                       device_bytes, train_tokens, device_flops_per_s, max_days, attention, sequence_parallel, vocab,
                       reserve, dropout)
    world_size, tensor_parallel = check_count("world_size", world_size), check_count("tensor_parallel", tensor_parallel)
    if world_size % tensor_parallel:
        raise ValueError(f"tensor_parallel ({tensor_parallel}) must divide world_size ({world_size})")
    return _layout(_plan(*checked), checked, world_size, check_stage("zero_stage", zero_stage), tensor_parallel,
                   check_text("change", change, allow_empty=True))


def _layout(one: Plan, checked: tuple, world_size, zero_stage, tensor_parallel, change="") -> Layout:
    """:func:`layout` from the one-device plan ``one`` of the arguments ``checked`` (:func:`_checked`'s tuple),
    on ``world_size`` devices that ``tensor_parallel`` divides: every argument already checked."""
    from .sharding import zero_state_bytes

    n_params, optimizer, precision, batch_per_device, seq_len, layers, hidden, heads, recompute, *_, conv = checked
    d, t = world_size, tensor_parallel
    state = zero_state_bytes(-(-n_params // t), d // t, zero_stage, optimizer, precision).total
    act = activation_bytes(seq_len, batch_per_device, hidden, heads, layers, recompute,
                           activation_bytes_per_value(precision), tensor_parallel=t, **conv)
    days = None if one.days is None else one.days / d
    return Layout(d, t, zero_stage, recompute, state, act, one.device_bytes, days, checked[12], change,
                  reserve_bytes=one.reserve_bytes)


#: What each setting costs, to choose between layouts on the same devices (see :func:`propose`).
_COST = {"zero": {0: 0, 1: 0, 2: 0, 3: 2}, "recompute": {"none": 0, "attention": 1, "full": 3}, "tp": 2}


def propose(n_params, optimizer: str = "adam", precision: str = "bf16_master", batch_per_device=1, seq_len=2048,
            layers=1, hidden=1, heads=1, recompute: str = "none", device_bytes=80e9, train_tokens=None,
            device_flops_per_s=None, max_days: float = 30.0, *, world_size=1, zero_stage=0,
            tensor_parallel=1, attention: str = "fused", sequence_parallel: bool = False, vocab=None,
            reserve: float = RESERVE, dropout: bool = False) -> list:
    """The smallest change that makes a run fit, with its numbers: a list of :class:`Layout`.

    The first entry is the plan as given. If it does not fit in memory, the
    next is the smallest change that does. The cheapest comes first: a
    smaller micro-batch (the largest divisor of ``batch_per_device`` that
    fits on the devices as given) with gradient accumulation over the rest,
    which keeps the batch per update and adds no FLOPs and no traffic. Failing
    that, the search runs over four settings: a ZeRO stage, a tensor-parallel
    degree (2, 4 or 8), a recompute setting and a device count (powers of
    two). "Smallest" means, in this order: the fewest devices; then the fewest
    settings changed; then the cheapest (ZeRO stages 1-2 send no extra bytes;
    recomputing the attention core (Korthikanti et al.'s selective) adds a little compute; ZeRO stage 3 and tensor
    parallelism add traffic; full recomputation adds a third to the compute).
    Settings only move towards more saving (recomputation is never turned
    off, for instance).

    If that layout (or the plan) fits in memory but is too slow, a last
    entry gives the smallest device count that brings the ideal time under
    ``max_days``. A last entry with ``fits_memory`` false means nothing
    tried fits. Arguments as :func:`layout`.
    """
    from .sharding import check_stage

    checked = _checked(n_params, optimizer, precision, batch_per_device, seq_len, layers, hidden, heads, recompute,
                       device_bytes, train_tokens, device_flops_per_s, max_days, attention, sequence_parallel, vocab,
                       reserve, dropout)
    world_size = check_count("world_size", world_size)
    zero_stage = check_stage("zero_stage", zero_stage)
    tensor_parallel = check_count("tensor_parallel", tensor_parallel)
    if world_size % tensor_parallel:
        raise ValueError(f"tensor_parallel ({tensor_parallel}) must divide world_size ({world_size})")
    batch, hidden, heads, recompute = checked[3], checked[6], checked[7], checked[8]
    ones = {}  # the one-device plan for each recompute setting (its time depends on it)

    def at(rc, d, z, t, micro=batch):
        args = checked[:8] + (rc,) + checked[9:]
        if rc not in ones:
            ones[rc] = _plan(*args)  # its time does not depend on the micro-batch
        return _layout(ones[rc], args[:3] + (micro,) + args[4:], d, z, t)

    current = at(recompute, world_size, zero_stage, tensor_parallel)
    out = [current]
    micro = None
    if not current.fits_memory and at(recompute, world_size, zero_stage, tensor_parallel, 1).fits_memory:
        # the largest micro-batch that divides the batch and fits (the most accumulation steps tried: 4,096)
        micro = next((batch // k for k in range(2, min(batch, 4096) + 1) if batch % k == 0
                      and at(recompute, world_size, zero_stage, tensor_parallel, batch // k).fits_memory), None)
    if micro is not None:  # the cheapest change: same devices, same FLOPs
        acc = batch // micro
        out.append(replace(at(recompute, world_size, zero_stage, tensor_parallel, micro), accumulation=acc,
                           change=f"micro-batch {micro}, gradient accumulation × {acc}"))
    elif not current.fits_memory:
        rcs = RECOMPUTE_CHOICES[RECOMPUTE_CHOICES.index(recompute):]
        tps = [tensor_parallel] + [t for t in TP_DEGREES if t > tensor_parallel and heads % t == 0 and hidden % t == 0]
        counts = [world_size] + [d for d in DEVICE_COUNTS if d > world_size]
        best = None
        for d in counts:  # fewest devices first: stop at the first count where something fits
            options = []
            for t in tps:
                if d % t:
                    continue
                for z in range(zero_stage, 4):
                    if z > 0 and d // t < 2:
                        continue  # ZeRO needs at least two replicas to shard over
                    for rc in rcs:
                        changed = [name for name, new, old in (("ZeRO stage", z, zero_stage),
                                                              ("tensor-parallel degree", t, tensor_parallel),
                                                              ("recomputation", rc, recompute)) if new != old]
                        cost = _COST["zero"][z] + _COST["recompute"][rc] + (_COST["tp"] if t > 1 else 0)
                        options.append((len(changed), cost, t, z, rc))
            for n_changed, cost, t, z, rc in sorted(options):
                cand = at(rc, d, z, t)
                if cand.fits_memory:
                    best = cand
                    break
            if best is not None:
                break
        if best is None:
            out.append(replace(at(RECOMPUTE_CHOICES[-1], DEVICE_COUNTS[-1], 3, tps[-1]), change="nothing tried fits"))
            return out
        out.append(_described(best, current))
    last = out[-1]
    if not last.fits_time:
        for d in DEVICE_COUNTS:
            if d > last.world_size and d % last.tensor_parallel == 0:
                more = replace(at(last.recompute, d, last.zero_stage, last.tensor_parallel,
                                  batch // last.accumulation), accumulation=last.accumulation)
                if more.fits:
                    out.append(_described(more, last))
                    break
    return out


def _described(new: Layout, old: Layout) -> Layout:
    """``new`` with ``change`` saying, in words, what differs from ``old``."""
    words = []
    if new.world_size != old.world_size:
        words.append(f"{new.world_size:,} devices")
    if new.zero_stage != old.zero_stage:
        words.append(f"ZeRO stage {new.zero_stage}")
    if new.tensor_parallel != old.tensor_parallel:
        words.append(f"tensor-parallel degree {new.tensor_parallel}")
    if new.recompute != old.recompute:
        words.append({"attention": "attention-core recomputation (Korthikanti's selective)",
                      "full": "full recomputation"}[new.recompute])
    return replace(new, change=", ".join(words))
