"""Fine-tuning and serving measured on the course's TinyGPT: LoRA adapters and the KV cache.

* :class:`LoRALinear` - a frozen ``nn.Linear`` plus a trainable low-rank update
  ``B @ A`` of rank ``rank``, scaled by ``alpha / rank`` (Hu et al., 2021,
  "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685).
* :func:`add_lora` - freezes a :class:`~lessonlib.measure.models.TinyGPT` and
  wraps the linear layers of its blocks in adapters.
* :func:`greedy_decode` - greedy generation with a KV cache, written out over
  TinyGPT's own weights; :func:`greedy_decode_uncached` recomputes the whole
  prefix at every step, the reference it must equal.

Why home-made: torch has no LoRA module, and ``peft`` (Hugging Face's) is not a
dependency of the course; the adapter is ten lines. torch has no KV cache for a
model of plain blocks either (``nn.MultiheadAttention`` keeps none).
The formulas are in :mod:`lessonlib.calc.serving`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import count as check_count, instance as check_instance, positive as check_positive, \
    sequence as check_sequence
from .models import MAX_SEQ_LEN, TinyGPT

#: The linear layers of a TinyGPT block that :func:`add_lora` adapts by default.
LORA_TARGETS = ("attn.qkv", "attn.proj", "fc1", "fc2")


class LoRALinear(nn.Module):
    """``base(x) + (alpha / rank) * x @ A.T @ B.T``: a frozen linear layer and a trainable rank-``rank`` update.

    A starts small and random, B at zero, so at the start the layer computes
    exactly what ``base`` does; training moves only A and B. The adapters may be kept in a wider format
    than the frozen base (fp32 adapters on a bf16 base, as LoRA runs usually do): the update is computed in
    the adapters' format and added in the base's.
    """

    def __init__(self, base: nn.Linear, rank: int = 8, alpha: float = 16.0):
        super().__init__()
        check_instance("base", base, nn.Linear, "a torch.nn.Linear")
        rank = check_count("rank", rank, maximum=min(base.in_features, base.out_features))
        self.base = base.requires_grad_(False)
        self.A = nn.Parameter(torch.randn(rank, base.in_features, device=base.weight.device,
                                          dtype=base.weight.dtype) / math.sqrt(base.in_features))
        self.B = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device,
                                          dtype=base.weight.dtype))
        self.scale = check_positive("alpha", alpha) / rank

    def forward(self, x):
        update = self.scale * (x.to(self.A.dtype) @ self.A.T @ self.B.T)
        return self.base(x) + update.to(x.dtype)


def add_lora(model: TinyGPT, rank: int = 8, alpha: float = 16.0, targets=LORA_TARGETS) -> TinyGPT:
    """Freeze every parameter of ``model`` and wrap the ``targets`` linear layers of each block in a
    :class:`LoRALinear` (in place; returns ``model``). Only the adapters' A and B then train."""
    check_instance("model", model, TinyGPT, "a lessonlib TinyGPT")
    rank = check_count("rank", rank)
    check_positive("alpha", alpha)
    targets = check_sequence("targets", targets)
    if not all(isinstance(t, str) and t in LORA_TARGETS for t in targets):
        raise ValueError(f"targets must be a non-empty list of names from {LORA_TARGETS}, got {targets!r:.80}")
    model.requires_grad_(False)
    for block in model.blocks:
        for name in targets:
            owner, _, attr = name.rpartition(".")
            parent = block.get_submodule(owner) if owner else block
            setattr(parent, attr, LoRALinear(getattr(parent, attr), rank, alpha))
    return model


def trainable_params(model: nn.Module) -> int:
    """Parameters (elements) of ``model`` that require a gradient."""
    check_instance("model", model, nn.Module, "a torch.nn.Module")
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@dataclass
class Decode:
    """A greedy generation: the tokens and the cache it held.

    tokens:          ``(batch, prompt + new_tokens)`` token ids
    cache_bytes:     bytes of the key and value tensors kept for every layer
    cached_tokens:   tokens per sequence the cache was allocated for (prompt + new tokens)
    """

    tokens: torch.Tensor
    cache_bytes: int
    cached_tokens: int


def _check_decode(model, prompt, new_tokens):
    check_instance("model", model, TinyGPT, "a lessonlib TinyGPT")
    check_instance("prompt", prompt, torch.Tensor, "a (batch, tokens) tensor of token ids")
    if prompt.dim() != 2 or prompt.shape[1] < 1 or prompt.is_floating_point():
        raise ValueError(f"prompt must be a (batch, tokens) tensor of integer token ids, got "
                         f"{tuple(prompt.shape)} {prompt.dtype}")
    new_tokens = check_count("new_tokens", new_tokens, maximum=MAX_SEQ_LEN)
    if any(isinstance(m, LoRALinear) for m in model.modules()):
        raise ValueError("model has LoRA adapters: merge them or decode with the base model")
    if prompt.shape[1] + new_tokens > model.seq_len:
        raise ValueError(f"prompt ({prompt.shape[1]} tokens) + new_tokens ({new_tokens}) must fit the "
                         f"model's seq_len ({model.seq_len})")
    return new_tokens


# The decode calls the layers' weights through torch.nn.functional rather than calling the modules:
# the same arithmetic, and a module called once per generated token would confuse a tracker that
# hooks modules (peak_memory's MemTracker on a CPU refuses repeated calls).
def _linear(layer: nn.Linear, x):
    return F.linear(x, layer.weight, layer.bias)


def _norm(layer: nn.LayerNorm, x):
    return F.layer_norm(x, layer.normalized_shape, layer.weight, layer.bias, layer.eps)


@torch.no_grad()
def greedy_decode(model: TinyGPT, prompt, new_tokens) -> Decode:
    """Generate ``new_tokens`` tokens greedily, keeping each layer's keys and values in a cache.

    The cache is allocated once, for every token the sequence will reach:
    ``(batch, heads, prompt + new_tokens, head_dim)`` keys and as many values per
    layer. The prompt fills it in one pass; then each step computes one new
    token's query, key and value and attends to the cache. Runs in eval mode
    (no dropout); the model's mode is restored after.
    """
    new_tokens = _check_decode(model, prompt, new_tokens)
    was_training = model.training
    model.eval()
    try:
        b, total = prompt.shape[0], prompt.shape[1] + new_tokens
        first = model.blocks[0].attn
        heads = first.heads
        head_dim = model.tok.embedding_dim // heads
        w = model.tok.weight
        cache = [(w.new_zeros(b, heads, total, head_dim), w.new_zeros(b, heads, total, head_dim))
                 for _ in model.blocks]
        tokens, done, step_in = prompt, 0, prompt
        for _ in range(new_tokens):
            s = step_in.shape[1]
            x = F.embedding(step_in, model.tok.weight) + model.pos.weight[done:done + s]
            for block, (k_cache, v_cache) in zip(model.blocks, cache):
                a = block.attn
                q, k, v = _linear(a.qkv, _norm(block.ln1, x)).view(b, s, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
                k_cache[:, :, done:done + s], v_cache[:, :, done:done + s] = k, v
                keys, values = k_cache[:, :, :done + s], v_cache[:, :, :done + s]
                # the new tokens attend to every cached token and, causally, to each other
                mask = torch.ones(s, done + s, dtype=torch.bool, device=x.device).tril(done)
                y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
                x = x + _linear(a.proj, y.transpose(1, 2).reshape(b, s, heads * head_dim))
                x = x + _linear(block.fc2, F.gelu(_linear(block.fc1, _norm(block.ln2, x))))
            logits = _linear(model.head, _norm(model.ln_f, x[:, -1]))
            done += s
            step_in = logits.argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, step_in], dim=1)
        cache_bytes = sum(k.nbytes + v.nbytes for k, v in cache)
        return Decode(tokens, cache_bytes, total)
    finally:
        model.train(was_training)


@torch.no_grad()
def greedy_decode_uncached(model: TinyGPT, prompt, new_tokens) -> torch.Tensor:
    """The reference: run the whole sequence through ``model`` at every step and take the last token's argmax."""
    new_tokens = _check_decode(model, prompt, new_tokens)
    was_training = model.training
    model.eval()
    try:
        tokens = prompt
        for _ in range(new_tokens):
            tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
        return tokens
    finally:
        model.train(was_training)
