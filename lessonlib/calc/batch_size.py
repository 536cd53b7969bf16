"""The critical batch size: how many steps and examples a larger batch buys.

McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch
Training" (2018, arXiv:1812.06162, equations 2.11-2.12): to reach a given
loss, training at a global batch of ``B`` examples needs

    steps     K = K_min × (1 + B_noise / B)
    examples  E = E_min × (1 + B / B_noise),    E_min = K_min × B_noise,

where ``K_min`` is the fewest steps any batch can reach that loss in (an
infinite batch), ``E_min`` the fewest examples (a tiny batch), and
``B_noise``, the *gradient noise scale*, is the critical batch size: well
below it, doubling the batch halves the steps at almost no extra examples
(data parallelism shortens training); well above it, doubling the batch
doubles the examples and barely cuts the steps (the extra devices are
wasted). At ``B = B_noise`` the run needs twice the fewest steps and twice
the fewest examples. Steps and examples are counts; pure Python (no torch).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import count as _check_count, positive as _check_positive, result as _check_result


@dataclass(frozen=True)
class BatchTradeoff:
    """Steps and examples to a target loss at one global batch (:func:`batch_tradeoff`).

    ``batch`` (examples per step), ``steps``, ``examples`` (= steps × batch),
    ``steps_over_min`` (K / K_min, >= 1) and ``examples_over_min`` (E / E_min, >= 1).
    """

    batch: float
    steps: float
    examples: float
    steps_over_min: float
    examples_over_min: float


def batch_tradeoff(batch, noise_scale, min_steps) -> BatchTradeoff:
    """Steps and examples to reach one loss at global batch ``batch`` (McCandlish et al. 2018).

    ``batch``: examples per optimizer step (> 0); ``noise_scale``: the
    critical batch size ``B_noise``, in examples (> 0); ``min_steps``: the
    steps an infinite batch would need, ``K_min`` (> 0). Returns a
    :class:`BatchTradeoff` with ``steps = K_min (1 + B_noise / B)`` and
    ``examples = K_min B_noise (1 + B / B_noise)``.

    >>> t = batch_tradeoff(1024, 1024, 1000)
    >>> t.steps, t.examples
    (2000.0, 2048000.0)
    """
    batch = _check_positive("batch", batch)
    noise_scale = _check_positive("noise_scale", noise_scale)
    min_steps = _check_positive("min_steps", min_steps)
    steps_over = 1.0 + noise_scale / batch
    examples_over = 1.0 + batch / noise_scale
    steps = _check_result(min_steps * steps_over, "batch, noise_scale and min_steps", "a number of steps")
    examples = _check_result(min_steps * noise_scale * examples_over, "batch, noise_scale and min_steps",
                             "a number of examples")
    return BatchTradeoff(batch=batch, steps=steps, examples=examples,
                         steps_over_min=steps_over, examples_over_min=examples_over)


def steps_to_finish(examples, global_batch) -> int:
    """Optimizer steps to go through ``examples`` examples at ``global_batch`` examples per step.

    Both are whole numbers and ``global_batch`` must divide ``examples``
    (a fixed budget of examples, every step full). Doubling the global batch
    at the same budget halves the steps: this is how data parallelism with a
    fixed per-process batch (weak scaling) shortens a run.

    >>> steps_to_finish(4096, 256), steps_to_finish(4096, 512)
    (16, 8)
    """
    examples = _check_count("examples", examples)
    global_batch = _check_count("global_batch", global_batch)
    if examples % global_batch:
        raise ValueError(f"global_batch={global_batch} must divide examples={examples} (every step full)")
    return examples // global_batch
