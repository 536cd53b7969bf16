"""Number formats in training, measured: the precision recipes of :mod:`lessonlib.calc.precision`.

* :func:`train_linear` - a linear regression trained in "fp32", "bf16" (pure bf16)
  and "bf16_master" (bf16 compute, fp32 master copy): the page "What training
  keeps in memory" shows the half-precision run that stops learning without any
  error, and the master copy that rescues it.
* :func:`measure_recipe` - one Adam step of a model under any recipe of
  :data:`lessonlib.calc.precision.PRECISIONS`, done by hand, and the bytes each role
  takes (a :class:`PrecisionLedger`).

The precision names are the one vocabulary of :mod:`lessonlib.calc.precision`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..calc.precision import RECIPES, precision_name
from ..checks import choice, count, number, positive, sequence
from .models import check_tensor

#: The most gradient-descent steps :func:`train_linear` runs (the page uses 600).
MAX_STEPS = 10_000
#: The largest learning rate accepted (a larger one only overflows the update).
MAX_LR = 10.0


def _check_regression(X, y, W=None, b=None):
    check_tensor("X", X, floating=True)
    check_tensor("y", y, floating=True)
    if X.dim() != 2 or y.shape != (X.shape[0], 1) or X.numel() > 10**7:
        raise ValueError(f"X must be (n, features) and y (n, 1), at most 10 million numbers; got X "
                         f"{tuple(X.shape)} and y {tuple(y.shape)}")
    if W is not None:
        check_tensor("W", W, floating=True)
        check_tensor("b", b, floating=True)
        if W.shape != (X.shape[1], 1) or b.shape != (1,):
            raise ValueError(f"W must be ({X.shape[1]}, 1) and b (1,); got {tuple(W.shape)} and {tuple(b.shape)}")

#: The precisions :func:`train_linear` runs (names of :data:`lessonlib.calc.precision.PRECISIONS`).
LINEAR_PRECISIONS = ("fp32", "bf16", "bf16_master")


def train_linear(precision: str, X: torch.Tensor, y: torch.Tensor, lr: float = 0.01, steps: int = 600):
    """Full-batch gradient descent on ``y ≈ X W + b``; returns (loss at every step, W, b).

    ``precision``: "fp32" (everything in 32 bits), "bf16" (pure bf16: weights, computation
    and update in bf16), or "bf16_master" (forward and backward in bf16 on a bf16
    copy of fp32 master weights; the update is applied to the master copy). The loss
    is the mean squared error, computed in fp32 from the model's outputs.
    """
    mode = choice("precision", precision_name(precision), LINEAR_PRECISIONS)
    _check_regression(X, y)
    lr = positive("lr", lr, maximum=MAX_LR)
    steps = count("steps", steps, maximum=MAX_STEPS)
    low = torch.bfloat16
    features = X.shape[1]
    W, b = torch.zeros(features, 1), torch.zeros(1)  # fp32: the master copy in "bf16_master"
    if mode == "bf16":
        W, b = W.to(low), b.to(low)
    Xc, yc = (X, y) if mode == "fp32" else (X.to(low), y.to(low))
    cast = (lambda t: t.to(low)) if mode == "bf16_master" else (lambda t: t.clone())
    losses = []
    for _ in range(steps):
        Wc, bc = cast(W).requires_grad_(), cast(b).requires_grad_()
        loss = ((Xc @ Wc + bc - yc).float() ** 2).mean()
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():  # the update, in the format of W and b
            W = W - lr * Wc.grad.to(W.dtype)
            b = b - lr * bc.grad.to(b.dtype)
    return losses, W, b


def frozen_from(losses: list) -> int:
    """The first step from which the loss never changes again (the last step if it always changes)."""
    losses = [number(f"losses[{i}]", v) for i, v in enumerate(sequence("losses", losses))]
    return next(i for i in range(len(losses)) if all(l == losses[i] for l in losses[i:]))


def largest_update_over_half_gap(X: torch.Tensor, y: torch.Tensor, W: torch.Tensor, b: torch.Tensor,
                                 lr: float) -> float:
    """The largest bf16 update ``lr × |gradient|`` of (W, b), over half the gap between bf16 numbers there.

    Below 1, every update rounds away: the weights cannot change. ``W`` and ``b`` are
    the bf16 weights (``torch.bfloat16``), e.g. from :func:`train_linear` in "bf16".
    """
    for name, t in (("W", W), ("b", b)):
        check_tensor(name, t, floating=True)  # required here (optional to _check_regression)
    _check_regression(X, y, W, b)
    for name, t in (("W", W), ("b", b)):
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{name} must be bf16 weights (torch.bfloat16), got {t.dtype}")
    lr = positive("lr", lr, maximum=MAX_LR)
    low = torch.bfloat16
    Wc, bc = W.clone().requires_grad_(), b.clone().requires_grad_()
    ((X.to(low) @ Wc + bc - y.to(low)).float() ** 2).mean().backward()
    params = torch.cat([W.flatten(), b]).double()  # double: lr x grad over a gap of 2^-134 exceeds fp32
    grads = torch.cat([Wc.grad.flatten(), bc.grad]).double()
    # bf16 keeps 8 significant bits: numbers in [2^e, 2^(e+1)) are 2^(e-7) apart, and below 2^-126
    # (zero too) they are 2^-133 apart, the gap of its smallest exponent
    exponent = torch.floor(torch.log2(params.abs())).clamp(min=-126)
    half_gap = 2.0 ** (exponent - 7) / 2
    return (lr * grads.abs() / half_gap).max().item()


def mixed_precision_step(model, inputs, targets, loss_fn, lr: float = 1e-3) -> dict:
    """One mixed-precision Adam step, done by hand, and the bytes each role of a weight takes.

    A bf16 copy of ``model`` (left unchanged) runs forward and backward; its gradients
    are cast to fp32 onto an fp32 *master copy*, Adam updates the master, and the
    master is rounded down into the bf16 copy for the next forward. Returns bytes:
    ``weights`` (bf16), ``gradients`` (bf16), ``master_weights`` (fp32) and
    ``optimizer_state`` (Adam's two fp32 averages plus its step counters).
    It is :func:`measure_recipe` with ``precision="bf16_master"``.
    """
    led = measure_recipe(model, inputs, targets, loss_fn, "bf16_master", lr)
    return {"weights": led.weights, "gradients": led.gradients, "master_weights": led.master_weights,
            "optimizer_state": led.optimizer_state + led.step_counters}


@dataclass
class PrecisionLedger:
    """Bytes one Adam step held, role by role, under a precision recipe (all fields in bytes but the first two).

    precision:          the recipe's name (:data:`lessonlib.calc.precision.PRECISIONS`)
    n_params:           parameters of the model
    weights:            the copy forward and backward read
    gradients:          the gradient buffers held after backward (fp32 ones in "bf16_master_fp32_grads")
    master_weights:     the separate fp32 copy the optimizer updates (0: none)
    optimizer_state:    Adam's two running averages (its per-tensor step counters left out)
    step_counters:      Adam's step counters, one 4-byte number per tensor
    activations:        bytes saved for backward (parameters and FP8 weight copies excluded)
    matmul_input_bytes: of those, the inputs the matrix products (``nn.Linear``) keep
    matmul_input_values: how many values those inputs hold
    weights_in_flight:  1-byte FP8 copies of the weights kept for backward ("fp8"; 0 otherwise)
    loss_scale:         the factor the loss was multiplied by before backward (1.0: none)
    """

    precision: str
    n_params: int
    weights: int
    gradients: int
    master_weights: int
    optimizer_state: int
    step_counters: int
    activations: int
    matmul_input_bytes: int
    matmul_input_values: int
    weights_in_flight: int
    loss_scale: float

    def per_param(self, role: str) -> float:
        """Bytes per parameter of ``role`` ("weights", "gradients", "master_weights", "optimizer_state")."""
        choice("role", role, ("weights", "gradients", "master_weights", "optimizer_state"))
        return getattr(self, role) / self.n_params

    @property
    def state_per_param(self) -> float:
        """Training-state bytes per parameter: weights + gradients + master copy + optimizer state."""
        return (self.weights + self.gradients + self.master_weights + self.optimizer_state) / self.n_params

    @property
    def activation_bytes_per_value(self) -> float:
        """Bytes per value of the matrix-product inputs kept for backward."""
        return self.matmul_input_bytes / self.matmul_input_values


#: The compute format of each recipe; "fp8" computes its products in FP8 on bf16 weights.
_LOW = {"fp32": torch.float32, "bf16_master": torch.bfloat16, "bf16_master_fp32_grads": torch.bfloat16,
        "bf16": torch.bfloat16, "fp16_master": torch.float16, "fp8": torch.bfloat16}

#: The loss scale "fp16_master" uses (a fixed power of two; dynamic scaling lowers it when a gradient overflows).
FP16_LOSS_SCALE = 2.0 ** 12


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure_recipe(model, inputs, targets, loss_fn, precision: str = "bf16_master", lr: float = 1e-3) -> PrecisionLedger:
    """One Adam step of a copy of ``model`` under ``precision``, done by hand; the bytes of each role.

    The copy is cast to the recipe's compute format (fp32, bf16 or fp16; "fp8" runs its
    ``nn.Linear`` products in FP8 through :func:`lessonlib.measure.formats.use_fp8`).
    Recipes with a master copy keep fp32 copies of the weights, which Adam updates; the
    gradients are cast onto them ("fp16_master" first divides out its loss scale;
    "bf16_master_fp32_grads" accumulates each gradient into an fp32 buffer as soon as
    backward produces it and frees the bf16 one, as Megatron-LM does). "bf16" and
    "fp32" let Adam update the weights themselves. ``model`` is left unchanged.
    """
    import copy

    from .formats import fp8_available, use_fp8
    from .memory import SavedTensorCounter, optimizer_state_bytes
    from .step_args import check_step_args, check_targets_fit

    (inputs,) = check_step_args(model, inputs, loss_fn, targets=targets)
    if loss_fn is None:
        raise TypeError("loss_fn must be callable, got None")
    name = precision_name(precision)
    lr = positive("lr", lr, maximum=MAX_LR)
    low = _LOW[name]
    work = copy.deepcopy(model).to(low)
    if name == "fp8":
        if not fp8_available(inputs.device):
            raise ValueError(f"precision 'fp8': torch._scaled_mm has no FP8 kernel on {inputs.device}")
        use_fp8(work)
    params = list(work.parameters())
    n = sum(p.numel() for p in params)
    has_master = RECIPES[name].master_weights > 0
    master = [p.detach().float().clone() for p in params] if has_master else params
    if name == "bf16_master_fp32_grads":  # fp32 gradient buffers, filled as backward goes (Megatron's main_grad)
        for p, m in zip(params, master):
            m.grad = torch.zeros_like(m)

            def accumulate(p, m=m):
                m.grad.add_(p.grad)
                p.grad = None
            p.register_post_accumulate_grad_hook(accumulate)
    opt = torch.optim.Adam(master, lr=lr)
    if inputs.is_floating_point():
        inputs = inputs.to(low)
    counter = SavedTensorCounter(exclude=params).watch(work)
    with counter:
        out = work(inputs)
        check_targets_fit(out, targets)
        loss = loss_fn(out, targets)
    scale = FP16_LOSS_SCALE if name == "fp16_master" else 1.0
    (loss.float() * scale).backward()
    held = [m.grad for m in master] if name == "bf16_master_fp32_grads" else [p.grad for p in params]
    gradients = _nbytes(g for g in held if g is not None)
    if has_master and name != "bf16_master_fp32_grads":
        for p, m in zip(params, master):
            m.grad = p.grad.float() / scale  # (real implementations fuse this cast into the update)
    opt.step()
    if has_master:
        with torch.no_grad():
            for p, m in zip(params, master):
                p.copy_(m)  # the master copy, rounded into the compute format for the next forward
    steps = _nbytes(s["step"] for s in opt.state.values() if torch.is_tensor(s.get("step")))
    # inputs the products keep: what each nn.Linear saved with its input's width (rows x in_features);
    # under "fp8" one of those per layer is the e4m3 copy of its weight (out x in), a weight in flight
    inputs_kept, in_flight = [], 0
    for mod_name, m in work.named_modules():
        if isinstance(m, torch.nn.Linear):
            kept = [(shape, b) for where, shape, dtype, b in counter.items
                    if where == mod_name and len(shape) == 2 and shape[-1] == m.in_features]
            if name == "fp8":
                kept.remove(next(k for k in kept if k[0] == tuple(m.weight.shape)))
                in_flight += m.weight.numel()  # 1 byte each
            inputs_kept += kept
    values = sum(rows * cols for (rows, cols), _ in inputs_kept)
    return PrecisionLedger(
        precision=name, n_params=n, weights=_nbytes(params), gradients=gradients,
        master_weights=_nbytes(master) if has_master else 0,
        optimizer_state=optimizer_state_bytes(opt) - steps, step_counters=steps,
        activations=counter.bytes - in_flight, matmul_input_bytes=sum(b for _, b in inputs_kept),
        matmul_input_values=values, weights_in_flight=in_flight, loss_scale=scale)
