"""Expert parallelism: what an uneven load across experts costs.

Pure Python (no torch).
"""
from __future__ import annotations

import math

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


def expert_capacity(tokens: int, experts: int, top_k: int = 1, capacity_factor: float = 1.0) -> int:
    """Token slots per expert: floor(capacity_factor × tokens × top_k / experts) (Switch, GShard).

    ``tokens`` routed in one batch, each to ``top_k`` experts; a capacity
    factor of 1 gives every expert exactly its even share of the assignments.

    >>> expert_capacity(512, 4, top_k=2, capacity_factor=1.25)
    320
    """
    t = _check_count("tokens", tokens)
    e = _check_count("experts", experts, maximum=10**6)
    k = _check_count("top_k", top_k, maximum=e)
    cf = _check_amount("capacity_factor", capacity_factor, allow_zero=False, maximum=1e6)
    return math.floor(cf * t * k / e + 1e-9)


def dropped_tokens(assigned_per_expert, capacity: int) -> int:
    """Assignments over capacity, summed over experts: each expert keeps at most ``capacity``.

    >>> dropped_tokens([300, 100, 60, 52], capacity=160)
    140
    """
    cap = _check_count("capacity", capacity, minimum=0)
    counts = [_check_count(f"assigned_per_expert[{i}]", c, minimum=0)
              for i, c in enumerate(_check_sequence("assigned_per_expert", assigned_per_expert))]
    return sum(max(0, c - cap) for c in counts)


def load_balancing_loss(token_fraction, mean_probability) -> float:
    """Switch Transformer's auxiliary loss E · Σ_i f_i · P_i (dimensionless).

    ``token_fraction`` f_i: the share of tokens routed to expert i (sums to 1);
    ``mean_probability`` P_i: the router's mean probability for expert i
    (sums to 1). It is 1 when both are uniform (1/E each) and grows towards
    E as the router sends everything to one expert with certainty; its
    gradient (through P) pushes probability away from the busiest experts.

    >>> load_balancing_loss([0.25] * 4, [0.25] * 4)
    1.0
    >>> load_balancing_loss([1, 0, 0, 0], [1, 0, 0, 0])
    4.0
    """
    f = [_check_amount(f"token_fraction[{i}]", v, maximum=1.0)
         for i, v in enumerate(_check_sequence("token_fraction", token_fraction))]
    p = [_check_amount(f"mean_probability[{i}]", v, maximum=1.0)
         for i, v in enumerate(_check_sequence("mean_probability", mean_probability))]
    if len(f) != len(p):
        raise ValueError(f"token_fraction and mean_probability must have one value per expert, got {len(f)} and {len(p)}")
    for name, vals in (("token_fraction", f), ("mean_probability", p)):
        if abs(sum(vals) - 1) > 1e-3:
            raise ValueError(f"{name} must sum to 1 over the experts, got {sum(vals):.4g}")
    return len(f) * sum(a * b for a, b in zip(f, p))


def active_parameters(shared: int, per_expert: int, top_k: int, experts: int) -> int:
    """Weights one token passes through: the shared ones plus ``top_k`` experts' (for 6·N_active·D).

    >>> active_parameters(shared=1000, per_expert=500, top_k=2, experts=8)
    2000
    """
    s = _check_count("shared", shared, minimum=0)
    pe = _check_count("per_expert", per_expert)
    e = _check_count("experts", experts, maximum=10**6)
    k = _check_count("top_k", top_k, maximum=e)
    return s + k * pe
