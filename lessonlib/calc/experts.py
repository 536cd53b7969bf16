"""Expert parallelism: what an uneven load across experts costs.

Pure Python (no torch).
"""
from __future__ import annotations

from ..checks import amount as _check_amount, sequence as _check_sequence


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
    counts = [_check_amount(f"tokens_per_expert[{i}]", c)
              for i, c in enumerate(_check_sequence("tokens_per_expert", tokens_per_expert))]
    mean = sum(counts) / len(counts)
    if mean == 0:
        raise ValueError("tokens_per_expert sums to zero: no tokens were routed")
    return max(counts) / mean
