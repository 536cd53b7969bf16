"""Number formats in training: a linear regression trained in fp32, pure bf16, and bf16 with an fp32 master copy.

The page "What training keeps in memory" calls these to show a half-precision
run that stops learning without any error, and the master copy that rescues it.
"""
from __future__ import annotations

import torch

from ..checks import choice, count, number, positive, sequence
from .models import _check_tensor

#: The most gradient-descent steps :func:`train_linear` runs (the page uses 600).
MAX_STEPS = 10_000
#: The largest learning rate accepted (a larger one only overflows the update).
MAX_LR = 10.0


def _check_regression(X, y, W=None, b=None):
    _check_tensor("X", X, floating=True)
    _check_tensor("y", y, floating=True)
    if X.dim() != 2 or y.shape != (X.shape[0], 1) or X.numel() > 10**7:
        raise ValueError(f"X must be (n, features) and y (n, 1), at most 10 million numbers; got X "
                         f"{tuple(X.shape)} and y {tuple(y.shape)}")
    if W is not None:
        _check_tensor("W", W, floating=True)
        _check_tensor("b", b, floating=True)
        if W.shape != (X.shape[1], 1) or b.shape != (1,):
            raise ValueError(f"W must be ({X.shape[1]}, 1) and b (1,); got {tuple(W.shape)} and {tuple(b.shape)}")

MODES = ("fp32", "pure bf16", "bf16 + fp32 master")


def train_linear(mode: str, X: torch.Tensor, y: torch.Tensor, lr: float = 0.01, steps: int = 600):
    """Full-batch gradient descent on ``y ≈ X W + b``; returns (loss at every step, W, b).

    ``mode``: "fp32" (everything in 32 bits), "pure bf16" (weights, computation and
    update in bf16), or "bf16 + fp32 master" (forward and backward in bf16 on a bf16
    copy of fp32 master weights; the update is applied to the master copy). The loss
    is the mean squared error, computed in fp32 from the model's outputs.
    """
    choice("mode", mode, MODES)
    _check_regression(X, y)
    lr = positive("lr", lr, maximum=MAX_LR)
    steps = count("steps", steps, maximum=MAX_STEPS)
    low = torch.bfloat16
    features = X.shape[1]
    W, b = torch.zeros(features, 1), torch.zeros(1)  # fp32: the master copy in "bf16 + fp32 master"
    if mode == "pure bf16":
        W, b = W.to(low), b.to(low)
    Xc, yc = (X, y) if mode == "fp32" else (X.to(low), y.to(low))
    cast = (lambda t: t.to(low)) if mode == "bf16 + fp32 master" else (lambda t: t.clone())
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
    the bf16 weights (``torch.bfloat16``), e.g. from :func:`train_linear` in "pure bf16".
    """
    for name, t in (("W", W), ("b", b)):
        _check_tensor(name, t, floating=True)  # required here (optional to _check_regression)
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
    """
    import copy

    from .memory import optimizer_state_bytes
    from .step_args import check_step_args, check_targets_fit

    (inputs,) = check_step_args(model, inputs, loss_fn, targets=targets)
    if loss_fn is None:
        raise TypeError("loss_fn must be callable, got None")
    lr = positive("lr", lr, maximum=MAX_LR)

    model16 = copy.deepcopy(model).to(torch.bfloat16)
    master = [p.detach().float().clone().requires_grad_() for p in model16.parameters()]
    opt = torch.optim.Adam(master, lr=lr)
    if inputs.is_floating_point():  # the bf16 copy takes bf16 inputs (token ids stay integers)
        inputs = inputs.to(torch.bfloat16)
    out = model16(inputs)
    check_targets_fit(out, targets)
    loss_fn(out, targets).backward()
    w16 = sum(p.numel() * p.element_size() for p in model16.parameters())
    g16 = sum(p.grad.numel() * p.grad.element_size() for p in model16.parameters())
    for m, p in zip(master, model16.parameters()):
        m.grad = p.grad.float()  # (real implementations fuse this cast into the update)
    opt.step()
    with torch.no_grad():
        for m, p in zip(master, model16.parameters()):
            p.copy_(m)  # the master copy, rounded down for the next forward
    m32 = sum(p.numel() * p.element_size() for p in master)
    return {"weights": w16, "gradients": g16, "master_weights": m32, "optimizer_state": optimizer_state_bytes(opt)}
