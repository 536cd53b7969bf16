"""Expert parallelism: what an uneven load across experts costs.

Pure Python (no torch).
"""
from __future__ import annotations

from ..checks import amount as _check_amount, count as _check_count, sequence as _check_sequence


def expert_load_imbalance(tokens_per_expert) -> float:
    """Busiest expert's tokens / mean tokens per expert (dimensionless, >= 1).

    This is the step's wait only when every expert has a device of its own:
    experts on different devices run at the same time and the layer finishes
    when the busiest one does. When a device hosts several experts it runs
    them one after another, so what the step waits for is the busiest
    *device*: see :func:`process_load_imbalance`. 1.0 is perfect balance.

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


def process_load_imbalance(tokens_per_expert, experts_per_process: int) -> float:
    """Busiest process's tokens / mean tokens per process (dimensionless, >= 1).

    Experts are placed in order, ``experts_per_process`` to a process (experts
    0..k-1 on process 0, and so on). A process runs its experts one after
    another, and the all-to-all that brings the results back completes only
    when every process has finished, so the expert layer takes as long as the
    busiest process: this ratio is how much longer that is than an even
    spread of the same tokens over the processes.

    >>> process_load_imbalance([25, 5, 5, 5], experts_per_process=2)
    1.5
    >>> process_load_imbalance([25, 5, 5, 5], experts_per_process=1)
    2.5
    """
    experts_per_process = _check_count("experts_per_process", experts_per_process, maximum=10**6)
    counts = [_check_amount(f"tokens_per_expert[{i}]", c)
              for i, c in enumerate(_check_sequence("tokens_per_expert", tokens_per_expert))]
    if len(counts) % experts_per_process:
        raise ValueError(f"tokens_per_expert has {len(counts)} experts, not a multiple of "
                         f"experts_per_process={experts_per_process}")
    per_process = [sum(counts[i:i + experts_per_process]) for i in range(0, len(counts), experts_per_process)]
    return expert_load_imbalance(per_process)
