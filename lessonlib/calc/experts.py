"""Expert parallelism: what an uneven load across experts costs.

Pure Python (no torch).
"""
from __future__ import annotations

from ..checks import amount as _check_amount


def expert_load_imbalance(tokens_per_expert) -> float:
    """Busiest expert's tokens / mean tokens per expert (dimensionless, >= 1).

    Experts run in parallel and the layer finishes when the busiest one does,
    so this ratio is how much longer the expert layer takes than it would
    with the same tokens spread evenly. 1.0 is perfect balance.

    >>> expert_load_imbalance([10, 10, 10, 10])
    1.0
    >>> expert_load_imbalance([25, 5, 5, 5])
    2.5
    """
    try:
        counts = [float(c) for c in tokens_per_expert]
    except TypeError:
        raise ValueError(f"tokens_per_expert must be a sequence of counts, got {tokens_per_expert!r}") from None
    if not counts:
        raise ValueError("tokens_per_expert must not be empty")
    for c in counts:
        _check_amount("tokens_per_expert", c)
    mean = sum(counts) / len(counts)
    if mean == 0:
        raise ValueError("tokens_per_expert sums to zero: no tokens were routed")
    return max(counts) / mean
