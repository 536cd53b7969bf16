"""Number formats measured: range against precision, rounding on real tensors, FP8 matrix products.

* :func:`format_range` - the largest, the smallest normal and the smallest
  (subnormal) number of a format, and its relative spacing ``eps`` (from ``torch.finfo``).
* :func:`rounding` - what casting a real tensor to a format does to it: relative
  error of the values kept, the share that underflows to zero, the share that overflows.
  With ``scaled=True`` the tensor is first divided by a per-tensor scale
  (``amax / format max``), as FP8 training does.
* :func:`use_fp8` - turns each ``nn.Linear`` into one whose forward product runs on
  e4m3 copies of its input and weight and whose backward products run on e5m2
  gradients, each with a per-tensor scale, through ``torch._scaled_mm`` (CPU and
  GPUs of compute capability 8.9 or more). It keeps the 1-byte copies for backward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ..checks import choice, flag, instance

#: The formats, by the name the course uses.
FORMATS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
           "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@dataclass(frozen=True)
class FormatRange:
    """Range and precision of a number format (plain numbers).

    max:        the largest finite number
    normal_min: the smallest positive normal number (``finfo.tiny``)
    sub_min:    the smallest positive number, a subnormal (values below half of it round to 0)
    eps:        the gap between 1 and the next number (relative precision)
    bits:       bits per number
    """

    name: str
    max: float
    normal_min: float
    sub_min: float
    eps: float
    bits: int


def format_range(name: str) -> FormatRange:
    """The :class:`FormatRange` of ``name`` (one of :data:`FORMATS`), from ``torch.finfo``."""
    dtype = FORMATS[choice("name", name, FORMATS)]
    f = torch.finfo(dtype)
    mantissa = round(-torch.log2(torch.tensor(f.eps, dtype=torch.float64)).item())
    return FormatRange(name, float(f.max), float(f.tiny), float(f.tiny) * 2.0 ** -mantissa, float(f.eps), f.bits)


@dataclass(frozen=True)
class Rounding:
    """What casting a tensor to a format did (shares are fractions of the nonzero values).

    rel_error:  median |cast - x| / |x| over the values that stayed nonzero and finite
    underflow:  share of nonzero values that became 0
    overflow:   share of values beyond the format's largest number (they became inf, or, in
                torch's cast to e4m3, which has no inf, the largest number 448)
    scale:      the per-tensor scale the tensor was divided by (1.0 unscaled)
    """

    name: str
    rel_error: float
    underflow: float
    overflow: float
    scale: float


def per_tensor_scale(x: torch.Tensor, name: str) -> torch.Tensor:
    """``amax(|x|) / max(format)``: dividing by it puts the largest value at the format's top (fp32 scalar)."""
    instance("x", x, torch.Tensor, "a tensor")
    dtype = FORMATS[choice("name", name, FORMATS)]
    amax = x.detach().abs().max().float()
    return torch.where(amax > 0, amax / torch.finfo(dtype).max, torch.ones_like(amax))


def rounding(x: torch.Tensor, name: str, scaled: bool = False) -> Rounding:
    """Cast ``x`` to format ``name`` (after dividing by :func:`per_tensor_scale` when ``scaled``)
    and measure the rounding, the underflow and the overflow."""
    instance("x", x, torch.Tensor, "a tensor")
    if not x.is_floating_point() or x.numel() == 0:
        raise ValueError(f"x must be a nonempty floating-point tensor, got {x.dtype} with {x.numel()} values")
    dtype = FORMATS[choice("name", name, FORMATS)]
    scaled = flag("scaled", scaled)
    x = x.detach().float().flatten()
    s = per_tensor_scale(x, name) if scaled else torch.ones((), dtype=torch.float32)
    y = x / s
    back = y.to(dtype).float() * s  # a plain cast: beyond the range a value becomes inf (or NaN in e4m3)
    nz = x != 0
    f = torch.finfo(dtype)
    top_gap = f.eps * 2.0 ** int(torch.tensor(f.max).log2().floor())  # the spacing of the largest numbers
    over = torch.isfinite(x) & (y.abs() >= f.max + top_gap / 2)  # rounds beyond the largest number
    bad = ~torch.isfinite(back) | over
    zero = (back == 0) & nz
    kept = nz & ~bad & ~zero
    rel = ((back[kept] - x[kept]).abs() / x[kept].abs()).median().item() if kept.any() else float("nan")
    n = max(int(nz.sum()), 1)
    return Rounding(name, rel, zero.sum().item() / n, over.sum().item() / x.numel(),
                    float(s))


def _mm8(a8, b8, sa, sb, out_dtype):
    # torch._scaled_mm wants the first operand row-major and the second column-major (on CUDA)
    return torch._scaled_mm(a8.contiguous(), b8.t().contiguous().t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype)


def _cast(x, name):
    s = per_tensor_scale(x, name)
    return (x.float() / s).to(FORMATS[name]), s


class _Fp8Matmul(torch.autograd.Function):
    """y = x W^T + b with e4m3 x and W (per-tensor scales); backward with e5m2 gradients."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        shape = x.shape
        x8, sx = _cast(x.reshape(-1, shape[-1]), "e4m3")
        w8, sw = _cast(weight, "e4m3")
        y = _mm8(x8, w8.t(), sx, sw, x.dtype)
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(x8, w8, sx, sw)  # what backward keeps: the 1-byte copies
        ctx.has_bias = bias is not None
        return y.view(*shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x8, w8, sx, sw = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        g8, sg = _cast(g, "e5m2")
        grad_x = _mm8(g8, w8, sg, sw, grad.dtype).view(*grad.shape[:-1], w8.shape[1])
        grad_w = _mm8(g8.t(), x8, sg, sx, torch.float32).to(grad.dtype)
        grad_b = g.sum(0) if ctx.has_bias else None
        return grad_x, grad_w, grad_b


class _Fp8Linear(nn.Linear):
    """An ``nn.Linear`` whose products run in FP8 (:class:`_Fp8Matmul`); weights stay in their dtype."""

    def forward(self, x):
        return _Fp8Matmul.apply(x, self.weight, self.bias)


def use_fp8(model: nn.Module) -> nn.Module:
    """Turn every ``nn.Linear`` of ``model`` into an FP8 linear layer (:class:`_Fp8Matmul` in its
    forward), in place (same weights); returns it."""
    instance("model", model, nn.Module, "a torch.nn.Module")
    for m in model.modules():
        if type(m) is nn.Linear:
            m.__class__ = _Fp8Linear
    return model


def fp8_available(device) -> bool:
    """Whether ``torch._scaled_mm`` runs FP8 on ``device`` (CPU: yes; CUDA: compute capability >= 8.9)."""
    from .device import as_device

    device = as_device("device", device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (8, 9)
    return device.type == "cpu"


@dataclass
class MatmulTensors:
    """What the matrix products (every ``nn.Linear``) of one fp32 training step saw, flattened:
    ``inputs`` (activations in), ``weights`` and ``grads`` (gradients of their outputs)."""

    inputs: torch.Tensor
    weights: torch.Tensor
    grads: torch.Tensor


def matmul_tensors(model, inputs, targets, loss_fn) -> MatmulTensors:
    """Run forward, loss and backward of ``model`` once and collect what its ``nn.Linear`` layers
    read (inputs and weights) and the gradients that flowed back into their outputs.

    Gradients are cleared after; the weights are not updated.
    """
    from .step_args import check_step_args, check_targets_fit

    (inputs,) = check_step_args(model, inputs, loss_fn, targets=targets)
    if loss_fn is None:
        raise TypeError("loss_fn must be callable, got None")
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("model has no nn.Linear layer to collect from")
    xs, gs = [], []
    hooks = [m.register_forward_pre_hook(lambda m, a: xs.append(a[0].detach().flatten())) for m in linears]
    hooks += [m.register_full_backward_hook(lambda m, gi, go: gs.append(go[0].detach().flatten())) for m in linears]
    try:
        out = model(inputs)
        check_targets_fit(out, targets)
        loss_fn(out, targets).backward()
    finally:
        for h in hooks:
            h.remove()
        model.zero_grad(set_to_none=True)
    return MatmulTensors(torch.cat(xs).float(), torch.cat([m.weight.detach().flatten() for m in linears]).float(),
                         torch.cat(gs).float())
