"""The arguments of a training step, checked together before anything runs.

A model, its inputs, a loss, targets and an optimizer are each valid alone and
can still be impossible together: an optimizer built for another model, or
targets whose shape a loss would broadcast into a wrong number. Every
measurement of a step (:mod:`.memory`, :mod:`.timing`, :mod:`.precision`)
checks them here, once, at the function a page calls.
"""
from __future__ import annotations

import torch

from ..checks import function, instance


def check_step_args(model, inputs, loss_fn=None, optimizer=None, targets=None) -> tuple:
    """Check a model, its inputs (a tensor or a tuple of tensors) and the optional loss and optimizer.

    Returns ``inputs`` as a tuple of arguments for ``model``. Raises
    ``TypeError``/``ValueError`` naming the argument.
    """
    instance("model", model, torch.nn.Module, "a torch.nn.Module")
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    if not args:
        raise ValueError("inputs must not be an empty tuple")
    for a in args:
        instance("inputs", a, torch.Tensor, "a torch.Tensor or a tuple of tensors")
    if loss_fn is not None:
        function("loss_fn", loss_fn)
        instance("targets", targets, (torch.Tensor, tuple, type(None)),
                 "a torch.Tensor (what loss_fn compares the output with) or None")
    if optimizer is not None:
        instance("optimizer", optimizer, torch.optim.Optimizer, "a torch.optim.Optimizer")
        check_optimizer_of(optimizer, model)
    return args


def check_optimizer_of(optimizer, model) -> None:
    """Refuse an ``optimizer`` that updates tensors other than ``model``'s parameters (one built
    for another model, or for a copy): its step would leave ``model`` unchanged and its state
    would not be the model's. An optimizer over some of the parameters (fine-tuning) is fine."""
    instance("optimizer", optimizer, torch.optim.Optimizer, "a torch.optim.Optimizer")
    instance("model", model, torch.nn.Module, "a torch.nn.Module")
    own = {id(p) for p in model.parameters()}
    theirs = [p for group in optimizer.param_groups for p in group["params"]]
    if not theirs:
        raise ValueError("optimizer has no parameters to update")
    foreign = sum(id(p) not in own for p in theirs)
    if foreign:
        raise ValueError(f"optimizer updates {foreign} of its {len(theirs)} tensors that are not model's parameters: "
                         "build it from this model, e.g. torch.optim.Adam(model.parameters())")


def check_targets_fit(output, targets, name: str = "targets") -> None:
    """Refuse ``targets`` whose shape cannot be compared with the model's ``output``.

    Values to regress (a floating-point tensor) must have the output's shape
    exactly: an MSE between (8, 1) and (8,) or (8, 3) broadcasts silently into
    a wrong loss. Class indices (an integer tensor) must have the output's shape
    without its class dimension (the last, or the second as in
    ``cross_entropy``'s (N, C, ...) layout). Tuples and non-tensors are left to
    the loss function.
    """
    from ..checks import text

    text("name", name)
    if not isinstance(output, torch.Tensor) or not isinstance(targets, torch.Tensor):
        return
    out, tgt = tuple(output.shape), tuple(targets.shape)
    if targets.is_floating_point() or targets.is_complex():
        if tgt != out:
            raise ValueError(f"{name} has shape {tgt} but the model's output has shape {out}: values to regress "
                             f"must have the output's shape (a loss would broadcast them into a wrong number)")
        return
    if targets.dtype == torch.bool:
        return
    dropped = {out[:-1]} | ({out[:1] + out[2:]} if len(out) >= 2 else set())
    if tgt not in dropped:
        raise ValueError(f"{name} has shape {tgt} but the model's output has shape {out}: class indices must have "
                         f"the output's shape without its class dimension, {' or '.join(map(str, sorted(dropped)))}")
