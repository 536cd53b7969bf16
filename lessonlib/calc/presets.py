"""The model shapes the planner offers: GPT-style decoders, their parameter counts from their shapes.

:data:`PRESETS` holds a few well-known GPT sizes (parameters, layers, width, heads), each count
computed by :func:`transformer_params`; :mod:`lessonlib.calc.planner` re-exports them. Pure Python.
"""
from __future__ import annotations

from ..checks import count as check_count


#: Vocabulary of the GPT-2 tokenizer, used by the presets' embeddings.
GPT2_VOCAB = 50_257


def transformer_params(layers, hidden, vocab=GPT2_VOCAB, positions=2048) -> int:
    """Parameters of a GPT-style decoder from its shape (a count).

    Per layer 12*h**2 + 13*h: attention's four h x h matrices and the MLP's
    two h x 4h matrices, with their biases and two LayerNorms; plus the token
    and position embeddings ((vocab + positions) x h, the output layer
    sharing the token embedding) and a final LayerNorm (2h).

    GPT-2 small (12 layers of 768, 1024 positions) has 124,439,808:

    >>> transformer_params(12, 768, positions=1024)
    124439808
    """
    L = check_count("layers", layers)
    h = check_count("hidden", hidden)
    v = check_count("vocab", vocab)
    p = check_count("positions", positions)
    return 12 * L * h * h + 13 * L * h + (v + p) * h + 2 * h


def _preset(layers, hidden, heads, positions=2048):
    return dict(n_params=transformer_params(layers, hidden, positions=positions),
                layers=layers, hidden=hidden, heads=heads)


#: Model shapes for the interactive planner: parameters, layers, width, heads.
#: The parameter count is computed from the shape (:func:`transformer_params`);
#: each name is that count, rounded: 124.4M, 1.32B, 7.46B, 69.7B.
PRESETS = {
    "124M (GPT-2 small)": _preset(12, 768, 12, positions=1024),
    "1.3B": _preset(24, 2048, 16),
    "7.5B": _preset(36, 4096, 32),
    "70B": _preset(86, 8192, 64),
}
