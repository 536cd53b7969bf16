"""The course's two models, in plain PyTorch.

* :class:`ForecastMLP` - the umbrella retailer's forecast model: recent daily
  sales in, next day's demand out.
* :class:`TinyGPT` - a small GPT built from plain blocks (LayerNorm, attention
  written out as matrix products, a 4h MLP with GELU, dropout), so every tensor
  it keeps for backward can be counted and compared with Korthikanti et al.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import choice as check_choice, count as check_count, flag as check_flag, fraction_below_one, \
    function as check_function, instance as check_instance, text as check_text

#: The course's models are teaching-sized: at most this many parameters (80 MB in
#: fp32), so a slip of a few zeros is refused at once instead of exhausting memory.
MAX_PARAMS = 20_000_000
#: The most layers (blocks) a model here may have.
MAX_LAYERS = 1000
#: The longest sequence a model here accepts (its causal mask is seq_len² numbers).
MAX_SEQ_LEN = 4096


def check_size(what: str, n_params: int) -> int:
    """Refuse a model of more than :data:`MAX_PARAMS` parameters; ``what`` names the arguments that give ``n_params``."""
    check_text("what", what)
    # the size first: a count too large for any check is still the caller's arguments' fault, named by ``what``
    if isinstance(n_params, (int, float)) and not isinstance(n_params, bool) and n_params > MAX_PARAMS:
        size = f"{n_params:,}" if isinstance(n_params, int) and n_params < 10**30 else (
            f"a {len(str(n_params))}-digit number of" if isinstance(n_params, int) else f"{n_params:.3g}")
        raise ValueError(f"{what} give about {size} parameters (n_params), more than the {MAX_PARAMS:,} "
                         f"that the course's teaching-sized models allow")
    return check_count("n_params", n_params, minimum=0)


def check_module(name: str, value, kind=None):
    """``value`` if it is a ``torch.nn.Module`` (of ``kind``, e.g. ``nn.Sequential``) with parameters;
    else an error naming ``name``."""
    check_text("name", name)
    kind = kind or nn.Module
    if not (isinstance(kind, type) and issubclass(kind, nn.Module)):
        raise TypeError(f"kind must be a torch.nn.Module class, got {kind!r:.80}")
    check_instance(name, value, kind, f"a torch.nn.{kind.__name__}")
    if next(value.parameters(), None) is None:
        raise ValueError(f"{name} has no parameters")
    return value


def check_tensor(name: str, value, floating: bool = False):
    """``value`` if it is a ``torch.Tensor`` (a floating-point one if ``floating``); else an error naming ``name``."""
    check_text("name", name)
    check_flag("floating", floating)
    check_instance(name, value, torch.Tensor, "a torch.Tensor")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    return value


def n_params(model: nn.Module) -> int:
    """Number of parameters (elements) of ``model``."""
    check_instance("model", model, nn.Module, "a torch.nn.Module")
    return sum(p.numel() for p in model.parameters())


class ForecastMLP(nn.Module):
    """Recent sales -> next-period demand.

    ``window`` inputs (scaled daily sales), ``layers`` hidden layers of
    ``hidden`` units with ReLU, one output (scaled demand).
    """

    def __init__(self, window: int = 28, hidden: int = 256, layers: int = 2):
        super().__init__()
        window, hidden = check_count("window", window), check_count("hidden", hidden)
        layers = check_count("layers", layers, maximum=MAX_LAYERS)
        check_size("window, hidden and layers", window * hidden + (layers - 1) * hidden * hidden + hidden)
        mods, inputs = [], window
        for _ in range(layers):
            mods += [nn.Linear(inputs, hidden), nn.ReLU()]
            inputs = hidden
        mods.append(nn.Linear(inputs, 1))
        self.net = nn.Sequential(*mods)

    def forward(self, x):
        return self.net(x)


class Dropout(nn.Module):
    """Dropout that keeps a 1-byte boolean mask for backward.

    ``torch.native_dropout`` returns the output and a bool mask, and its backward
    needs only the mask: 1 byte per element, as Korthikanti et al. assume.
    ``nn.Dropout`` on CPU instead keeps a scaled noise tensor in the input's
    dtype (2 bytes per element in bf16).
    """

    def __init__(self, p: float = 0.1):
        super().__init__()
        self.p = fraction_below_one("p", p)

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        out, _mask = torch.native_dropout(x, self.p, True)
        return out


class Attention(nn.Module):
    """Causal multi-head self-attention.

    ``impl="math"`` writes it out (scores, mask, softmax, dropout, weighted sum),
    which keeps the a x s x s scores for backward as the paper assumes;
    ``impl="sdpa"`` calls ``F.scaled_dot_product_attention``, whose fused
    kernels keep only small per-row statistics instead.
    """

    def __init__(self, hidden, heads, seq_len, dropout, dropout_cls, impl="math"):
        super().__init__()
        hidden, heads = check_count("hidden", hidden), check_count("heads", heads)
        seq_len = check_count("seq_len", seq_len, maximum=MAX_SEQ_LEN)
        dropout = fraction_below_one("dropout", dropout)
        check_function("dropout_cls", dropout_cls)
        check_choice("impl", impl, ("math", "sdpa"))
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
        check_size("hidden", 4 * hidden * hidden)
        self.heads, self.impl, self.p = heads, impl, dropout
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.attn_drop = dropout_cls(dropout)
        # an additive mask (0 on and below the diagonal, -inf above): adding it keeps
        # nothing for backward, whereas masked_fill would keep an s x s bool mask
        self.register_buffer("causal", torch.full((seq_len, seq_len), float("-inf")).triu(1), persistent=False)

    def core(self, qkv):
        """From the QKV product's output ``(batch, seq, 3 x hidden)`` to the output projection's input: the
        part between the weight products (Korthikanti et al.'s selective recomputation reruns it)."""
        b, s, h = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
        a = self.heads
        q, k, v = qkv.view(b, s, 3, a, h // a).permute(2, 0, 3, 1, 4)
        if self.impl == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.p if self.training else 0.0)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(h // a))
            scores = scores + self.causal[:s, :s]
            y = self.attn_drop(scores.softmax(dim=-1)) @ v
        return y.transpose(1, 2).reshape(b, s, h)

    def forward(self, x):
        return self.proj(self.core(self.qkv(x)))


class Block(nn.Module):
    """One transformer layer: x + drop(attn(ln(x))), then x + drop(mlp(ln(x))), MLP width 4h."""

    def __init__(self, hidden, heads, seq_len, dropout=0.1, dropout_cls=Dropout, attention="math"):
        super().__init__()
        hidden, heads = check_count("hidden", hidden), check_count("heads", heads)
        dropout = fraction_below_one("dropout", dropout)
        check_choice("attention", attention, ("math", "sdpa"))
        check_function("dropout_cls", dropout_cls)
        check_size("hidden", 12 * hidden * hidden)
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, seq_len, dropout, dropout_cls, attention)
        self.drop1 = dropout_cls(dropout)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.drop2 = dropout_cls(dropout)

    def mlp(self, x):
        """The MLP branch that the second residual adds: drop(fc2(gelu(fc1(ln(x)))))."""
        return self.drop2(self.fc2(F.gelu(self.fc1(self.ln2(x)))))

    def forward(self, x):
        x = x + self.drop1(self.attn(self.ln1(x)))
        return x + self.mlp(x)


class TinyGPT(nn.Module):
    """A small GPT: token + position embeddings, ``layers`` blocks, final LayerNorm, output layer.

    ``dropout_impl="native"`` (default) uses :class:`Dropout` (1-byte masks);
    ``"module"`` uses ``nn.Dropout``. ``attention`` is ``"math"`` or ``"sdpa"``.
    Input: token ids ``(batch, seq)``; output: logits ``(batch, seq, vocab)``.
    ``self.blocks`` is an ``nn.Sequential`` that maps ``(batch, seq, hidden)`` to
    the same shape, for measuring the layers alone.
    """

    def __init__(self, vocab: int = 256, seq_len: int = 64, hidden: int = 128, heads: int = 4,
                 layers: int = 2, dropout: float = 0.1, dropout_impl: str = "native",
                 attention: str = "math"):
        super().__init__()
        vocab, seq_len = check_count("vocab", vocab), check_count("seq_len", seq_len, maximum=MAX_SEQ_LEN)
        hidden, heads = check_count("hidden", hidden), check_count("heads", heads)
        layers = check_count("layers", layers, maximum=MAX_LAYERS)
        dropout = fraction_below_one("dropout", dropout)
        check_choice("dropout_impl", dropout_impl, ("native", "module"))
        check_choice("attention", attention, ("math", "sdpa"))
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
        check_size("vocab, seq_len, hidden and layers", (2 * vocab + seq_len) * hidden + layers * 12 * hidden * hidden)
        dropout_cls = Dropout if dropout_impl == "native" else nn.Dropout
        self.seq_len = seq_len
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq_len, hidden)
        self.drop = dropout_cls(dropout)
        self.blocks = nn.Sequential(*[Block(hidden, heads, seq_len, dropout, dropout_cls, attention)
                                      for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, idx):
        s = idx.shape[1]
        if s > self.seq_len:
            raise ValueError(f"sequence of {s} tokens is longer than seq_len={self.seq_len}")
        x = self.drop(self.tok(idx) + self.pos(torch.arange(s, device=idx.device)))
        return self.head(self.ln_f(self.blocks(x)))


def lm_loss(logits, targets):
    """Next-token cross-entropy for ``(batch, seq, vocab)`` logits and ``(batch, seq)`` targets."""
    check_tensor("logits", logits, floating=True)
    check_tensor("targets", targets)
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(f"logits must be (batch, seq, vocab) and targets (batch, seq); got logits "
                         f"{tuple(logits.shape)} and targets {tuple(targets.shape)}")
    if targets.is_floating_point():
        raise TypeError(f"targets must hold integer token ids, got dtype {targets.dtype}")
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
