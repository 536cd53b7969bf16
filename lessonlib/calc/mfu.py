"""Model FLOPs against hardware FLOPs: MFU, HFU, recomputation and causal attention. Pure Python.

* **Model FLOPs** are what the model needs: the weights' matrix products
  (6 per parameter per token: 2 forward, 4 backward) plus the attention
  scores and their weighted sum (12 x layers x seq_len x hidden per token for
  a full s x s score matrix: 4 forward, 8 backward).
* **Hardware FLOPs** are what the devices do: the model FLOPs plus the
  forward work that recomputation repeats (full: the whole forward again;
  "attention": only the attention core's scores, Korthikanti et al.'s selective recomputation).
* **MFU** = model FLOPs per second / peak; **HFU** = hardware FLOPs per second /
  peak. Recomputation adds hardware FLOPs and time, never model FLOPs: it
  raises HFU at a given step time and leaves MFU where it is (or lowers it,
  since the step gets longer).
* **Causal attention** computes only the scores below the diagonal: half the
  s x s matrix. ``causal=True`` (the course's one convention, on every page that
  counts FLOPs) counts half: 6N + 6 x layers x seq_len x hidden per token. PaLM's
  published MFU formula (its Appendix B), 6N + 12 L H Q T per token, counts the
  full matrix, as most published MFUs do: ``causal=False``.
  :func:`attention_share` gives the attention term as a share of 6N, either way.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import choice, count, flag, positive, result

RECOMPUTE = ("none", "attention", "full")  # of lessonlib.calc.recompute.RECOMPUTE_POLICIES


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of training on ``tokens`` tokens: ``dense`` (6 N per token), ``attention`` (the scores),
    ``recomputed`` (forward work recomputation repeats); ``model`` and ``hardware`` add them up."""

    dense: float
    attention: float
    recomputed: float

    @property
    def model(self) -> float:
        """Model FLOPs: what the model needs, whatever the implementation."""
        return self.dense + self.attention

    @property
    def hardware(self) -> float:
        """Hardware FLOPs: the model FLOPs plus what recomputation repeats."""
        return self.model + self.recomputed


def model_hardware_flops(n_params, tokens, layers, seq_len, hidden, causal=True, recompute="none") -> StepFlops:
    """The :class:`StepFlops` of training a ``layers``-layer model of ``n_params`` parameters on ``tokens`` tokens.

    Sequences are ``seq_len`` tokens, the model dimension ``hidden``; ``causal`` counts
    half the score matrix; ``recompute`` is ``"none"``, ``"attention"`` (Korthikanti et al.'s selective
    recomputation: the attention scores' forward again) or ``"full"`` (the whole forward again).

    >>> f = model_hardware_flops(1e9, 1, 24, 2048, 2048, causal=False)
    >>> f.dense, f.attention                         # 6 N, 12 L s h
    (6000000000.0, 1207959552.0)
    >>> model_hardware_flops(1e9, 1, 24, 2048, 2048).attention  # causal: half
    603979776.0
    """
    n = positive("n_params", n_params)
    t = positive("tokens", tokens)
    L, s, h = count("layers", layers), count("seq_len", seq_len), count("hidden", hidden)
    half = 0.5 if flag("causal", causal) else 1.0
    mode = choice("recompute", recompute, RECOMPUTE)
    dense = 6.0 * n * t
    attention = 12.0 * L * s * h * half * t
    forward_attention = attention / 3          # 4 of the 12: the forward scores and weighted sum
    recomputed = {"none": 0.0, "attention": forward_attention, "full": dense / 3 + forward_attention}[mode]
    return StepFlops(dense=dense, attention=attention, recomputed=recomputed)


def attention_share(n_params, layers, seq_len, hidden, causal=True) -> float:
    """Attention's model FLOPs over the weights' 6N, per token (dimensionless): 6 L s h / 6N causal, twice that
    with ``causal=False`` (PaLM's count). The one source of every attention share the pages state.

    >>> round(attention_share(1e9, 24, 2048, 2048), 4)       # causal: half the score matrix
    0.1007
    >>> round(attention_share(1e9, 24, 2048, 2048, causal=False), 4)   # PaLM's: the full matrix
    0.2013
    """
    f = model_hardware_flops(n_params, 1, layers, seq_len, hidden, causal=causal)
    return result(f.attention / f.dense, "n_params, layers, seq_len and hidden", "an attention share of 6N")


def flops_utilisation(flops, seconds, peak_flops_per_s, world_size=1) -> float:
    """FLOPs per second over the peak of ``world_size`` devices: MFU when ``flops`` are model FLOPs, HFU when hardware FLOPs.

    Refused above 1 (no device exceeds its peak): the usual causes are the peak
    of the wrong device, or a mixture-of-experts model's total parameters
    counted instead of its active ones.
    """
    u = positive("flops", flops) / (positive("seconds", seconds) * positive("peak_flops_per_s", peak_flops_per_s)
                                    * count("world_size", world_size))
    return result(u, "flops, seconds, peak_flops_per_s and world_size", "a utilisation", high=1.0,
                  hint="a device cannot exceed its peak: check the device's peak, and for a mixture-of-experts "
                       "model count the active parameters per token, not the total")


def hfu_from_mfu(mfu, flops: StepFlops) -> float:
    """The HFU of a step that reached ``mfu``: the same time, the hardware FLOPs instead of the model FLOPs."""
    if not isinstance(flops, StepFlops):
        raise TypeError(f"flops must be a StepFlops (from model_hardware_flops), got {type(flops).__name__}")
    return result(positive("mfu", mfu) * flops.hardware / flops.model, "mfu and flops", "a utilisation", high=1.0)
