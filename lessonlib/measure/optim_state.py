"""An optimizer's and a learning-rate schedule's saved state, checked as a whole.

``optimizer.load_state_dict`` and ``scheduler.load_state_dict`` copy what they
are given: an Adam state with ``eps=nan``, ``lr=-1``, ``weight_decay=inf``,
moment tensors of the wrong shape or a negative second moment loads without a
word and poisons every later step. A checkpoint that passes its checksums can
still hold such values (written by a buggy job, or edited by hand), so a
resume checks them *before* anything is restored, with the same rules torch's
constructors apply to fresh arguments (``lr >= 0``, ``eps >= 0``,
``0 <= beta < 1``, ``weight_decay >= 0``; here also finite, and ``eps > 0``),
plus what must agree across entries: the parameters against the model's, the
moments against their parameters, the step counts against the run's step.

Every refusal is a :class:`CheckpointError` naming the entry, e.g.
``optimizer.param_groups[0].lr``.
"""
from __future__ import annotations

import math

from .run_folder import CheckpointError

#: Per-parameter entries of Adam's (and AdamW's) state; ``max_exp_avg_sq`` only with ``amsgrad``.
ADAM_STATE = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
#: Flags a param group may carry: True/False, or None where torch lets it choose (foreach, fused).
ADAM_FLAGS = {"amsgrad": False, "maximize": False, "capturable": False, "differentiable": False,
              "decoupled_weight_decay": False, "foreach": True, "fused": True}


def _refuse(where: str, value, rule: str):
    text = repr(value)
    raise CheckpointError(f"{where} = {text if len(text) <= 60 else text[:57] + '...'} is impossible: {rule}")


def _real(where: str, value, low: float = -math.inf, *, above: bool = False, below: float = math.inf) -> float:
    """A finite real number (a Python number or a one-element tensor) ``>= low`` (``> low`` when ``above``) and
    ``< below``."""
    import torch

    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_complex \
            and value.dtype != torch.bool:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _refuse(where, value, "it must be a real number")
    try:
        value = float(value)
    except OverflowError:  # an int beyond a float's range, e.g. 10**400
        value = math.copysign(math.inf, value)
    if not math.isfinite(value):
        _refuse(where, value, "it must be finite")
    if value < low or (above and value == low) or value >= below:
        bound = f"{'above' if above else 'at least'} {low:g}" if math.isfinite(low) else ""
        bound += (" and " if bound else "") + f"below {below:g}" if math.isfinite(below) else ""
        _refuse(where, value, f"it must be {bound}")
    return float(value)


def _whole(where: str, value, steps: int) -> int:
    """A step count (an int, or a one-element tensor holding a whole number) from 1 to ``steps``."""
    v = _real(where, value, 1)
    if not v.is_integer() or v > steps:
        _refuse(where, v, f"it must be a whole number from 1 to {steps} (the run's steps)")
    return int(v)


def _moment(where: str, value, shape: tuple, nonnegative: bool):
    import torch

    if not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point:
        _refuse(where, value, "it must be a floating-point tensor")
    if tuple(value.shape) != shape:
        raise CheckpointError(f"{where} has shape {tuple(value.shape)}, but its parameter has shape {shape}")
    if not torch.isfinite(value).all():
        raise CheckpointError(f"{where} holds {int((~torch.isfinite(value)).sum())} non-finite values")
    if nonnegative and value.numel() and value.min() < 0:
        raise CheckpointError(f"{where} holds negative values (min {value.min().item():g}): an average of "
                              f"squared gradients is never negative")
    return value


def check_adam_state(optimizer: dict, groups, steps: int) -> int:
    """The optimizer steps a ``torch.optim.Adam`` (or AdamW) state has taken, once checked.

    ``optimizer`` is an ``optimizer.state_dict()``; ``groups`` the shapes of
    the parameters it should update, one sequence a parameter group, in the
    order the optimizer was built (the model's); ``steps`` the most steps it
    can have taken (the run's step; fewer after a resume that started the
    optimizer afresh). Checked: one param group per entry of ``groups``
    holding exactly its parameters; each group's ``lr`` and ``initial_lr``
    finite and ``>= 0``, ``eps`` finite and ``> 0``, both ``betas`` in
    ``[0, 1)``, ``weight_decay`` finite and ``>= 0``, flags True/False;
    state for every parameter or none (every parameter is updated at every
    step); each parameter's ``step`` a whole number from 1 to ``steps``, the
    same for all; ``exp_avg`` and ``exp_avg_sq`` (and ``max_exp_avg_sq``)
    finite and of the parameter's shape, the squared averages ``>= 0``.
    Returns that step (0 for a state that has taken none); raises
    :class:`CheckpointError` naming the entry.
    """
    import torch

    if not isinstance(optimizer, dict) or set(optimizer) != {"state", "param_groups"}:
        raise CheckpointError(f"optimizer must be a dict with 'state' and 'param_groups' (an optimizer's "
                              f"state_dict()), got {type(optimizer).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise CheckpointError(f"steps must be a whole number >= 0 (the run's step), got {steps!r}")
    if isinstance(groups, (str, bytes)) or not isinstance(groups, (list, tuple)) or not groups or not all(
            isinstance(g, (list, tuple)) and all(isinstance(s, (list, tuple, torch.Size)) for s in g) for g in groups):
        raise CheckpointError(f"groups must be a non-empty list of lists of parameter shapes, got {groups!r}")
    pgs, state = optimizer["param_groups"], optimizer["state"]
    if not isinstance(pgs, list) or len(pgs) != len(groups):
        raise CheckpointError(f"optimizer.param_groups holds {len(pgs) if isinstance(pgs, list) else repr(pgs)} "
                              f"groups, but the model's optimizer has {len(groups)}")
    shapes, first = {}, 0
    for i, (pg, want) in enumerate(zip(pgs, groups)):
        at = f"optimizer.param_groups[{i}]"
        if not isinstance(pg, dict):
            _refuse(at, pg, "it must be a dict")
        for key in ("params", "lr", "betas", "eps", "weight_decay"):
            if key not in pg:
                raise CheckpointError(f"{at} has no {key!r}")
        ids = list(range(first, first + len(want)))
        if not isinstance(pg["params"], list) or pg["params"] != ids:
            raise CheckpointError(f"{at}.params = {pg['params']!r}, but the model's group {i} has "
                                  f"{len(want)} parameters, numbered {ids[:1]}...{ids[-1:]}")
        shapes.update({k: tuple(s) for k, s in zip(ids, want)})
        first += len(want)
        _real(f"{at}.lr", pg["lr"], 0)
        if "initial_lr" in pg:
            _real(f"{at}.initial_lr", pg["initial_lr"], 0)
        _real(f"{at}.eps", pg["eps"], 0, above=True)
        _real(f"{at}.weight_decay", pg["weight_decay"], 0)
        betas = pg["betas"]
        if not isinstance(betas, (list, tuple)) or len(betas) != 2:
            _refuse(f"{at}.betas", betas, "it must be a pair of numbers")
        for j, b in enumerate(betas):
            _real(f"{at}.betas[{j}]", b, 0, below=1)
        for flag, none_ok in ADAM_FLAGS.items():
            if flag in pg and not (isinstance(pg[flag], bool) or (none_ok and pg[flag] is None)):
                _refuse(f"{at}.{flag}", pg[flag], "it must be True or False" + (" or None" if none_ok else ""))
    if not isinstance(state, dict) or not set(state) <= set(shapes):
        got = sorted(state, key=repr) if isinstance(state, dict) else state
        raise CheckpointError(f"optimizer.state must be a dict keyed by the parameters' numbers 0 to "
                              f"{len(shapes) - 1}, got keys {got!r}")
    if state and set(state) != set(shapes):
        raise CheckpointError(f"optimizer.state has no entry for parameters {sorted(set(shapes) - set(state))}, "
                              f"though it has for others: every parameter is updated at every step")
    amsgrad = {k: pg.get("amsgrad", False) for pg in pgs for k in pg["params"]}
    taken = set()
    for k, entry in state.items():
        at = f"optimizer.state[{k}]"
        need = set(ADAM_STATE) if amsgrad[k] else set(ADAM_STATE[:3])
        if not isinstance(entry, dict) or set(entry) != need:
            raise CheckpointError(f"{at} must hold exactly {sorted(need)} (Adam's state for one parameter), got "
                                  f"{sorted(entry) if isinstance(entry, dict) else type(entry).__name__}")
        mine = _whole(f"{at}.step", entry["step"], steps)
        if taken and mine not in taken:
            raise CheckpointError(f"{at}.step = {mine}, but another parameter's is {taken.pop()}: every parameter "
                                  f"takes every step")
        taken.add(mine)
        _moment(f"{at}.exp_avg", entry["exp_avg"], shapes[k], False)
        sq = _moment(f"{at}.exp_avg_sq", entry["exp_avg_sq"], shapes[k], True)
        if amsgrad[k] and (_moment(f"{at}.max_exp_avg_sq", entry["max_exp_avg_sq"], shapes[k], True) < sq).any():
            raise CheckpointError(f"{at}.max_exp_avg_sq is below exp_avg_sq somewhere: it is their running maximum")
    return taken.pop() if taken else 0


def check_scheduler_state(scheduler: dict, optimizer: dict, step: int) -> dict:
    """Raise :class:`CheckpointError` unless ``scheduler`` is a possible learning-rate scheduler state.

    ``scheduler`` is an ``LRScheduler.state_dict()``, ``optimizer`` the
    state of the optimizer it drives (checked first, e.g. by
    :func:`check_adam_state`) and ``step`` the scheduler steps taken (in a
    job that calls ``scheduler.step()`` after every ``optimizer.step()``,
    the optimizer's step, which :func:`check_adam_state` returns). Checked: ``last_epoch == step`` and
    ``_step_count == step + 1`` (the constructor takes the first step);
    ``base_lrs`` one a param group, finite, ``> 0`` and equal to the groups'
    ``initial_lr``; ``_last_lr`` equal to the groups' ``lr``; a ``gamma``
    finite and ``> 0``, a ``step_size`` a whole number ``>= 1``.
    """
    if not isinstance(scheduler, dict):
        raise CheckpointError(f"scheduler must be a dict (a scheduler's state_dict()), got {type(scheduler).__name__}")
    if not isinstance(optimizer, dict) or not isinstance(optimizer.get("param_groups"), list):
        raise CheckpointError("optimizer must be an optimizer's state_dict() (checked first, e.g. by check_adam_state)")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"step must be a whole number >= 0 (the scheduler steps taken), got {step!r}")
    pgs = optimizer["param_groups"]
    for key in ("last_epoch", "base_lrs"):
        if key not in scheduler:
            raise CheckpointError(f"scheduler has no {key!r}")
    last = scheduler["last_epoch"]
    if isinstance(last, bool) or not isinstance(last, int) or last != step:
        _refuse("scheduler.last_epoch", last, f"it must be {step}, the scheduler steps the run has taken")
    if "_step_count" in scheduler and (isinstance(scheduler["_step_count"], bool)
                                       or scheduler["_step_count"] != step + 1):
        _refuse("scheduler._step_count", scheduler["_step_count"], f"it must be {step + 1} (step {step}, plus "
                f"the step the constructor takes)")
    for key, group_key, low_ok in (("base_lrs", "initial_lr", False), ("_last_lr", "lr", True)):
        if key not in scheduler:
            continue
        lrs = scheduler[key]
        if not isinstance(lrs, list) or len(lrs) != len(pgs):
            _refuse(f"scheduler.{key}", lrs, f"it must be a list of {len(pgs)} learning rates, one a param group")
        for i, lr in enumerate(lrs):
            _real(f"scheduler.{key}[{i}]", lr, 0, above=not low_ok)
            if group_key in pgs[i] and lr != pgs[i][group_key]:
                _refuse(f"scheduler.{key}[{i}]", lr, f"it must equal optimizer.param_groups[{i}].{group_key} "
                        f"({pgs[i][group_key]!r})")
    if "gamma" in scheduler:
        _real("scheduler.gamma", scheduler["gamma"], 0, above=True)
    if "step_size" in scheduler:
        s = scheduler["step_size"]
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            _refuse("scheduler.step_size", s, "it must be a whole number >= 1")
    return scheduler
