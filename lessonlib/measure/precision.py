"""Number formats in training: a linear regression trained in fp32, pure bf16, and bf16 with an fp32 master copy.

The page "What training keeps in memory" calls these to show a half-precision
run that stops learning without any error, and the master copy that rescues it.
"""
from __future__ import annotations

import torch

MODES = ("fp32", "pure bf16", "bf16 + fp32 master")


def train_linear(mode: str, X: torch.Tensor, y: torch.Tensor, lr: float = 0.01, steps: int = 600):
    """Full-batch gradient descent on ``y ≈ X W + b``; returns (loss at every step, W, b).

    ``mode``: "fp32" (everything in 32 bits), "pure bf16" (weights, computation and
    update in bf16), or "bf16 + fp32 master" (forward and backward in bf16 on a bf16
    copy of fp32 master weights; the update is applied to the master copy). The loss
    is the mean squared error, computed in fp32 from the model's outputs.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a positive whole number, got {steps!r}")
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
    if not losses:
        raise ValueError("losses must not be empty")
    return next(i for i in range(len(losses)) if all(l == losses[i] for l in losses[i:]))


def largest_update_over_half_gap(X: torch.Tensor, y: torch.Tensor, W: torch.Tensor, b: torch.Tensor,
                                 lr: float) -> float:
    """The largest bf16 update ``lr × |gradient|`` of (W, b), over half the gap between bf16 numbers there.

    Below 1, every update rounds away: the weights cannot change.
    """
    low = torch.bfloat16
    Wc, bc = W.clone().requires_grad_(), b.clone().requires_grad_()
    ((X.to(low) @ Wc + bc - y.to(low)).float() ** 2).mean().backward()
    params = torch.cat([W.flatten(), b]).float()
    grads = torch.cat([Wc.grad.flatten(), bc.grad]).float()
    half_gap = 2.0 ** (torch.floor(torch.log2(params.abs())) - 7) / 2  # bf16 keeps 8 significant bits
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

    model16 = copy.deepcopy(model).to(torch.bfloat16)
    master = [p.detach().float().clone().requires_grad_() for p in model16.parameters()]
    opt = torch.optim.Adam(master, lr=lr)
    loss_fn(model16(inputs), targets).backward()
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
