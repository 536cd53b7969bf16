"""Top-k routing of a mixture-of-experts layer: capacity, dropped tokens, the load-balancing loss.

One process, small tensors, on the device the caller gives (CPU or GPU):

* :func:`route_top_k` sends each token to its ``top_k`` highest-scoring
  experts and keeps, for each expert, only the first ``capacity`` assignments
  in token order (Switch Transformer's rule); the rest are *dropped*
  (the token skips that expert: the residual connection carries it on).
* :class:`MoELayer` is a top-k layer of small bias-free experts, for counting
  FLOPs: forward and backward cost 6 FLOPs per *active* weight per token.
* :func:`train_router` trains a skewed router for a few steps, with and
  without the load-balancing auxiliary loss ``E · Σ f_i · P_i`` (Switch /
  GShard), and reports the tokens each expert receives before and after.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..calc.experts import load_balancing_loss
from ..checks import amount as check_amount, count as check_count, instance as check_instance, share as check_share

__all__ = ["Routing", "route_top_k", "MoELayer", "RouterTraining", "train_router"]

#: The most tokens × experts one routing call handles (a small teaching size).
MAX_SCORES = 10_000_000


@dataclass(frozen=True)
class Routing:
    """Assignments of tokens to experts: ``assigned`` and ``kept`` per expert (token-slots),
    ``dropped`` (assignments over capacity), ``capacity`` (slots per expert)."""

    assigned: tuple
    kept: tuple
    dropped: int
    capacity: int


def route_top_k(scores, top_k: int, capacity: int) -> Routing:
    """Route each row of ``scores`` (tokens × experts) to its ``top_k`` best experts, ``capacity`` per expert.

    Assignments are kept in token order (token 0's first choice, then its
    second, then token 1's ...), each expert accepting its first ``capacity``.
    """
    import torch

    check_instance("scores", scores, torch.Tensor, "a (tokens, experts) tensor")
    if scores.dim() != 2 or scores.numel() == 0:
        raise ValueError(f"scores must be a non-empty (tokens, experts) tensor, got shape {tuple(scores.shape)}")
    if scores.numel() > MAX_SCORES:
        raise ValueError(f"scores holds {scores.numel():,} values, more than the {MAX_SCORES:,} allowed")
    tokens, experts = scores.shape
    top_k = check_count("top_k", top_k, maximum=experts)
    capacity = check_count("capacity", capacity, minimum=0, maximum=tokens * top_k)
    choice = scores.topk(top_k, dim=1).indices.reshape(-1)  # token-major: token 0's choices first
    one_hot = torch.nn.functional.one_hot(choice, experts)
    position = one_hot.cumsum(0) * one_hot  # 1-based place in its expert's queue
    kept = ((position > 0) & (position <= capacity)).sum(0)
    assigned = one_hot.sum(0)
    return Routing(tuple(int(a) for a in assigned), tuple(int(k) for k in kept),
                   int((assigned - kept).sum()), capacity)


def MoELayer(hidden: int, experts: int, top_k: int):
    """A top-k mixture-of-experts layer (bias-free router and experts ``hidden -> 2·hidden -> hidden``).

    Each token's output is the sum over its ``top_k`` experts of the softmax
    gate times the expert's output; no capacity limit, so no token is dropped.
    """
    import torch
    from torch import nn

    from .models import MAX_PARAMS

    hidden = check_count("hidden", hidden)
    experts = check_count("experts", experts, maximum=256)
    top_k = check_count("top_k", top_k, maximum=experts)
    if experts * 4 * hidden * hidden > MAX_PARAMS:
        raise ValueError(f"experts={experts} of hidden={hidden} hold more than the {MAX_PARAMS:,} parameters allowed")

    class _MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.top_k = top_k
            self.router = nn.Linear(hidden, experts, bias=False)
            self.experts = nn.ModuleList(nn.Sequential(nn.Linear(hidden, 2 * hidden, bias=False), nn.ReLU(),
                                                       nn.Linear(2 * hidden, hidden, bias=False))
                                         for _ in range(experts))

        def forward(self, x):
            gates = self.router(x).softmax(dim=1)
            weight, choice = gates.topk(self.top_k, dim=1)
            out = torch.zeros_like(x)
            for e, expert in enumerate(self.experts):
                rows, slot = torch.nonzero(choice == e, as_tuple=True)
                if len(rows):
                    out = out.index_add(0, rows, weight[rows, slot].unsqueeze(1) * expert(x[rows]))
            return out

    return _MoE()


@dataclass(frozen=True)
class RouterTraining:
    """Tokens per expert before and after ``steps`` steps, with and without the auxiliary loss.

    ``before``, ``after_plain``, ``after_balanced``: tokens each expert receives (top-1 of the router);
    ``aux_before``, ``aux_plain``, ``aux_balanced``: the load-balancing loss E·Σ f_i·P_i (1 at perfect balance).
    """

    before: tuple
    after_plain: tuple
    after_balanced: tuple
    aux_before: float
    aux_plain: float
    aux_balanced: float


def train_router(tokens: int = 256, hidden: int = 16, experts: int = 4, skew: float = 2.0, steps: int = 25,
                 aux_weight: float = 0.5, lr: float = 0.02, seed: int = 0) -> RouterTraining:
    """Train a top-1 MoE layer's router (experts fixed and identical) to imitate a target, twice from the same start.

    The router starts skewed towards expert 0 (``skew`` added to its gate
    score); the experts are the same linear map, so the task alone gives the
    router no reason to move tokens (as before experts specialise). Once with the task loss only, once with ``aux_weight`` × the
    load-balancing loss E·Σ f_i·P_i added, where f_i is the share of tokens
    routed to expert i and P_i the mean router probability of expert i
    (Switch Transformer). Both train with Adam for ``steps`` steps, on CPU, seeded.
    """
    import torch

    # a teaching size: at most a few seconds on one CPU core
    tokens = check_count("tokens", tokens, maximum=2048)
    hidden = check_count("hidden", hidden, maximum=32)
    experts = check_count("experts", experts, minimum=2, maximum=16)
    skew = check_amount("skew", skew, maximum=50.0)
    steps = check_count("steps", steps, maximum=60)
    aux_weight = check_amount("aux_weight", aux_weight, maximum=100.0)
    lr = check_share("lr", lr)
    seed = check_count("seed", seed, minimum=0)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    # identical experts: the task gives the router no reason to prefer one (as before experts specialise),
    # so what changes the balance is the auxiliary loss alone
    experts_w = (torch.randn(hidden, hidden, generator=g) / hidden ** 0.5).expand(experts, hidden, hidden)
    target = torch.tanh(x @ torch.randn(hidden, hidden, generator=g) / hidden ** 0.5)
    start = torch.randn(hidden, experts, generator=g) * 0.1
    bias0 = torch.zeros(experts)
    bias0[0] = skew

    def measure(w, b):
        probs = (x @ w + b).softmax(dim=1)
        counts = torch.bincount(probs.argmax(dim=1), minlength=experts)
        aux = load_balancing_loss((counts / tokens).tolist(), probs.mean(0).tolist())
        return probs, counts, aux

    def run(weight):
        w = start.clone().requires_grad_(True)
        b = bias0.clone().requires_grad_(True)
        opt = torch.optim.Adam([w, b], lr=lr)
        for _ in range(steps):
            probs = (x @ w + b).softmax(dim=1)
            top = probs.argmax(dim=1)
            out = probs.gather(1, top[:, None]) * torch.einsum("th,thk->tk", x, experts_w[top])
            loss = (out - target).pow(2).mean()
            if weight:
                f = torch.bincount(top, minlength=experts).float() / tokens  # no gradient: a count
                loss = loss + weight * experts * (f * probs.mean(0)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            _, counts, aux = measure(w, b)
        return tuple(int(c) for c in counts), aux

    with torch.no_grad():
        _, counts0, aux0 = measure(start, bias0)
    plain, aux_p = run(0.0)
    balanced, aux_b = run(aux_weight)
    return RouterTraining(tuple(int(c) for c in counts0), plain, balanced, aux0, aux_p, aux_b)
