"""Published figures of real training runs, each with its source: the inputs of the "price a real run" page.

These are data, not results: the page computes everything else from them with
the course's calculators. Each :class:`Figure` names its document, the table or
section, and how it was checked when it was entered (``checked``). Where a
figure's value was confirmed through summaries that quote the document rather
than in the document's own text, or is derived from other figures, ``checked``
says so. Pure Python.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One published number: ``value`` in ``unit``, from ``source`` at ``where``; ``checked`` says how it was verified."""

    value: float
    unit: str
    source: str
    where: str
    checked: str


LLAMA3_PAPER = ("Llama Team, AI @ Meta (2024). The Llama 3 Herd of Models. arXiv:2407.21783")
LLAMA31_CARD = ("Meta (2024). Llama 3.1 model card. github.com/meta-llama/llama-models, "
                "models/llama3_1/MODEL_CARD.md")
LLAMA2_CARD = "Meta (2023). Llama 2 model card. github.com/meta-llama/llama, MODEL_CARD.md"

_CARD_READ = "read in the model card's text"
#: Compared with summaries that quote the document, not with the document itself (no copy of its text was
#: readable when the figure was entered); the page says so once, above its table of figures.
_SECONDARY = "secondary (as summaries quote it)"
#: Read in the report's own words, in a text conversion of its PDF (Markdown, kept in a public repository), not in
#: the PDF itself.
_REPORT_TEXT = "read in a text conversion of the report's PDF (its own words), not in the PDF itself"
#: Table 4's rows, read in the same text conversion of the report's PDF (the row of GPUs, TP, CP, PP, DP, sequence,
#: batch per DP, tokens per batch, TFLOP/s and MFU).
_TABLE4_READ = _REPORT_TEXT + "; Table 4's row"
_TABLE4_ROWS = (_TABLE4_READ + "; within a point of the row's TFLOP/s over the H100's 989.4 TFLOP/s dense peak")
#: Read in the report's own words, in a text conversion of its LaTeX source (kept in a public repository, chunked
#: for search), not in the PDF: its prose, not its tables (the conversion drops their rows).
_REPORT_PROSE = "read in a text conversion of the report's source (its own words, in its prose), not in the PDF"
#: Table 4's MFU for the two 8K-context configurations, which the prose beside the table also states.
_TABLE4_PROSE = (_REPORT_PROSE + "; the prose beside Table 4 gives '41% on 16K GPUs with DP=128 compared to 43% on "
                 "8K GPUs with DP=64'")
#: Read in Meta's released model definition of Llama 3.1 405B (github.com/meta-llama/llama-models, models/sku_list.py:
#: dim 16384, n_layers 126, n_heads 128, n_kv_heads 8), the same model the report's Table 3 describes.
_RELEASED = ("read in Meta's released model definition (llama-models, models/sku_list.py), not in Table 3 itself")
_CARD_SECONDARY = ("secondary (as summaries quote the card's 405B row); the page checks that "
                   "it gives the card's implied grid intensity back")

#: Llama 3.1 405B, the page's run.
LLAMA3_405B = {
    "params": Figure(405e9, "parameters", LLAMA31_CARD, "model table (405B)", _CARD_READ),
    "layers": Figure(126, "layers", LLAMA3_PAPER, "Table 3", _RELEASED),
    "hidden": Figure(16384, "model dimension", LLAMA3_PAPER, "Table 3", _RELEASED),
    "heads": Figure(128, "attention heads", LLAMA3_PAPER, "Table 3", _RELEASED),
    "ffn": Figure(53248, "FFN (SwiGLU) width", LLAMA3_PAPER, "Table 3", _REPORT_TEXT),
    "tokens": Figure(15.6e12, "training tokens", LLAMA3_PAPER, "Section 3 (pre-training on 15.6T tokens)",
                     _REPORT_PROSE + "; the model card, read, says only '15T+'"),
    "flops": Figure(3.8e25, "training FLOPs of the flagship model", LLAMA3_PAPER, "Section 1",
                    _REPORT_PROSE),
    "gpus": Figure(16384, "H100-80GB GPUs", LLAMA3_PAPER, "Section 3.3.1 and Table 4", _TABLE4_READ),
    "tp": Figure(8, "tensor-parallel degree", LLAMA3_PAPER, "Table 4", _TABLE4_READ),
    "pp": Figure(16, "pipeline-parallel degree", LLAMA3_PAPER, "Table 4", _TABLE4_READ),
    "cp_long": Figure(16, "context-parallel degree in the 128K-context stage", LLAMA3_PAPER, "Table 4", _TABLE4_READ),
    "seq_len": Figure(8192, "tokens per sequence (main pre-training stage)", LLAMA3_PAPER,
                      "Table 4 and Section 3.4.1 (8K context before long-context training)", _TABLE4_READ),
    "tokens_per_batch": Figure(16e6, "tokens per global batch", LLAMA3_PAPER, "Table 4", _TABLE4_READ),
    # Table 4's batch column is sequences per data-parallel replica: 16 at 16,384 GPUs (DP 128, 8K context),
    # so the global batch is 16 x 128 = 2,048 sequences of 8,192 tokens = 2**24 tokens, the '16M'.
    "batch_per_dp_16k": Figure(16, "sequences per data-parallel replica, 16,384 GPUs at 8K context",
                               LLAMA3_PAPER, "Table 4 (batch size/DP)", _TABLE4_READ),
    # Table 4's three configurations: TFLOPs per GPU, and the BF16 MFU the report prints beside each.
    "tflops_8k_gpus": Figure(430, "TFLOP/s per GPU on 8,192 GPUs", LLAMA3_PAPER, "Table 4", _TABLE4_READ),
    "gpus_first_stage": Figure(8192, "GPUs in the first configuration", LLAMA3_PAPER, "Table 4", _TABLE4_READ),
    "tflops_16k_gpus": Figure(400, "TFLOP/s per GPU on 16,384 GPUs", LLAMA3_PAPER, "Table 4", _TABLE4_READ),
    "tflops_16k_long": Figure(380, "TFLOP/s per GPU on 16,384 GPUs, 128K context (CP 16)", LLAMA3_PAPER,
                              "Table 4", _TABLE4_READ),
    # Table 4's per-row BF16 MFU, one per configuration (430, 400 and 380 TFLOP/s over the 989.4 TFLOP/s peak
    # are 43.5, 40.4 and 38.4 %; the table prints 43, 41 and 38 %: the middle one is not the ratio rounded).
    "mfu_8k_gpus": Figure(0.43, "BF16 MFU on 8,192 GPUs, 8K context", LLAMA3_PAPER, "Table 4", _TABLE4_PROSE),
    "mfu_16k_gpus": Figure(0.41, "BF16 MFU on 16,384 GPUs, 8K context", LLAMA3_PAPER, "Table 4",
                           _TABLE4_PROSE + "; "
                           "NOT the row's 400 TFLOP/s over the H100's 989.4 TFLOP/s dense peak rounded: that is "
                           "40.4 %, which rounds to 40 %, so the report's FLOP count or peak differs slightly; the "
                           "pages compute 40.4 % and print the 41 % beside it"),
    "mfu_16k_long": Figure(0.38, "BF16 MFU on 16,384 GPUs, 128K context (CP 16)", LLAMA3_PAPER, "Table 4",
                           _TABLE4_ROWS),
    "gpu_hours": Figure(30.84e6, "H100-80GB GPU-hours (Llama 3.1 405B)", LLAMA31_CARD,
                        "Hardware and Software, training-time table", _CARD_READ),
    "snapshot_days": Figure(54, "days of pre-training in the reliability snapshot", LLAMA3_PAPER,
                            "Section 3.3.4 and Table 5", _REPORT_PROSE),
    "interruptions": Figure(466, "job interruptions in the snapshot", LLAMA3_PAPER, "Section 3.3.4", _REPORT_PROSE),
    "planned": Figure(47, "planned interruptions", LLAMA3_PAPER, "Section 3.3.4", _REPORT_PROSE),
    "unexpected": Figure(419, "unexpected interruptions", LLAMA3_PAPER, "Section 3.3.4 and Table 5", _REPORT_PROSE),
    "effective_training": Figure(0.90, "effective training time, a lower bound ('higher than 90 %')",
                                 LLAMA3_PAPER, "Section 3.3.4", _REPORT_PROSE),
    "ckpt_per_gpu_max": Figure(4e9, "bytes per GPU in a checkpoint, the largest ('1 MB to 4 GB')",
                               LLAMA3_PAPER, "Section 3.3.1 (Storage)", _REPORT_PROSE),
    "storage_sustained": Figure(2e12, "bytes/s sustained throughput of the storage (Tectonic)", LLAMA3_PAPER,
                                "Section 3.3.1 (Storage)", _REPORT_PROSE),
    "storage_peak": Figure(7e12, "bytes/s peak throughput of the storage", LLAMA3_PAPER,
                           "Section 3.3.1 (Storage)", _REPORT_PROSE),
    # the stages after the main one: context raised from 8K to 128K in six steps, then the learning rate annealed
    "tokens_long_context": Figure(800e9, "training tokens (about) in the long-context stage, its context raised "
                                  "from 8K to 128K in six steps", LLAMA3_PAPER,
                                  "Section 3.4.2 (Long Context Pre-Training)", _REPORT_TEXT),
    "tokens_annealing": Figure(40e6, "training tokens in the annealing, the last ones, at 128K context",
                               LLAMA3_PAPER, "Section 3.4.3 (Annealing)", _REPORT_TEXT),
}

# The range of the three configurations is derived from Table 4's per-row values above, so the notes agree.
_MFU_ROWS = ("mfu_8k_gpus", "mfu_16k_gpus", "mfu_16k_long")
LLAMA3_405B["mfu_low"] = Figure(min(LLAMA3_405B[k].value for k in _MFU_ROWS),
                                "BF16 MFU, lowest of the three configurations", LLAMA3_PAPER, "Table 4",
                                "derived: the lowest of the three per-row values (mfu_8k_gpus, mfu_16k_gpus, "
                                "mfu_16k_long)")
LLAMA3_405B["mfu_high"] = Figure(max(LLAMA3_405B[k].value for k in _MFU_ROWS),
                                 "BF16 MFU, highest of the three configurations", LLAMA3_PAPER, "Table 4",
                                 "derived: the highest of the three per-row values (mfu_8k_gpus, mfu_16k_gpus, "
                                 "mfu_16k_long)")

#: Llama 2, the check on utilisation (and the exercise's run). All from the model card's tables.
LLAMA2_PAPER = ("Touvron et al. (2023). Llama 2: Open Foundation and Fine-Tuned Chat Models. arXiv:2307.09288")
# The card names the sizes 7B, 13B and 70B; the parameters are counted from the architecture (hidden, layers, MLP
# width, key/value heads, a 32,000-token vocabulary, untied input and output embeddings: tests/test_pricing.py
# counts them again), which give the 6.74B, 13.02B and 68.98B that summaries of the paper quote.
_COUNTED = ("counted from the architecture's shapes (the released configuration); the card rounds it to the "
            "size's name")
LLAMA2 = {
    "7B": {"params": Figure(6_738_415_616, "parameters", LLAMA2_PAPER, "Section 2 and the released 7B configuration",
                            _COUNTED),
           "gpu_hours": Figure(184_320, "A100-80GB GPU-hours", LLAMA2_CARD, "CO2 table, Time (GPU hours)", _CARD_READ)},
    "13B": {"params": Figure(13_015_864_320, "parameters", LLAMA2_PAPER,
                             "Section 2 and the released 13B configuration", _COUNTED),
            "gpu_hours": Figure(368_640, "A100-80GB GPU-hours", LLAMA2_CARD, "CO2 table, Time (GPU hours)", _CARD_READ)},
    "70B": {"params": Figure(68_976_648_192, "parameters", LLAMA2_PAPER,
                             "Section 2 and the released 70B configuration (grouped-query attention, 8 key/value heads)",
                             _COUNTED),
            "gpu_hours": Figure(1_720_320, "A100-80GB GPU-hours", LLAMA2_CARD, "CO2 table, Time (GPU hours)", _CARD_READ)},
}
LLAMA2_TOKENS = Figure(2.0e12, "training tokens (every size)", LLAMA2_CARD, "model table, Tokens", _CARD_READ)
LLAMA2_DEVICE = "A100 SXM 80GB"  # the card: "hardware of type A100-80GB"
LLAMA3_DEVICE = "H100 SXM 80GB"  # the card: "H100-80GB (TDP of 700W)"

DEEPSEEK_V3_REPORT = "DeepSeek-AI (2024). DeepSeek-V3 Technical Report. arXiv:2412.19437"
PALM_PAPER = "Chowdhery et al. (2022). PaLM: Scaling Language Modeling with Pathways. arXiv:2204.02311"

#: Llama 3.1 405B's energy and emissions, from the model card's "Training Energy Use" and
#: "Training Greenhouse Gas Emissions" (the GPU-hours are LLAMA3_405B["gpu_hours"]).
LLAMA31_405B_ENERGY = {
    "tdp_watts": Figure(700, "W per H100-80GB (TDP)", LLAMA31_CARD, "Training Energy Use", _CARD_READ),
    "location_tco2": Figure(8930, "tCO2eq, location-based (405B)", LLAMA31_CARD,
                            "Training Greenhouse Gas Emissions, table (405B row)", _CARD_SECONDARY),
}

#: DeepSeek-V3, the exercise's and the money calculator's mixture-of-experts run.
DEEPSEEK_V3 = {
    "total_params": Figure(671e9, "parameters in all (every expert)", DEEPSEEK_V3_REPORT, "Abstract", _SECONDARY),
    "active_params": Figure(37e9, "parameters active per token", DEEPSEEK_V3_REPORT, "Abstract", _SECONDARY),
    "tokens": Figure(14.8e12, "pre-training tokens", DEEPSEEK_V3_REPORT, "Abstract", _SECONDARY),
    "gpus": Figure(2048, "H800 GPUs", DEEPSEEK_V3_REPORT, "Section 3.1", _SECONDARY),
    "gpu_hours": Figure(2.788e6, "H800 GPU-hours, whole training", DEEPSEEK_V3_REPORT, "Table 1", _SECONDARY),
    # Table 1 splits the whole into pre-training (2,664K), context extension (119K) and post-training (5K):
    # the pre-training tokens' FLOPs belong over the pre-training hours
    "pretrain_gpu_hours": Figure(2.664e6, "H800 GPU-hours, pre-training only", DEEPSEEK_V3_REPORT,
                                 "Table 1 (Pre-Training row)", _SECONDARY),
    "price_per_gpu_hour": Figure(2.0, "US dollars per H800 GPU-hour (the report's assumed rental price)",
                                 DEEPSEEK_V3_REPORT, "Table 1 and the text under it ('assuming the rental price "
                                 "of the H800 GPU is $2 per GPU hour')", _SECONDARY),
    "dollars": Figure(5.576e6, "US dollars, the report's total at that price", DEEPSEEK_V3_REPORT, "Table 1",
                      _SECONDARY),
    # the shape and layout, for the layout page
    "layers": Figure(61, "layers", DEEPSEEK_V3_REPORT, "Section 4.2 (model hyper-parameters)", _SECONDARY),
    "dense_layers": Figure(3, "first layers with a dense MLP instead of experts", DEEPSEEK_V3_REPORT,
                           "Section 4.2", _SECONDARY),
    "hidden": Figure(7168, "hidden dimension", DEEPSEEK_V3_REPORT, "Section 4.2", _SECONDARY),
    "heads": Figure(128, "attention heads", DEEPSEEK_V3_REPORT, "Section 4.2", _SECONDARY),
    "experts": Figure(256, "routed experts per MoE layer", DEEPSEEK_V3_REPORT, "Section 4.2", _SECONDARY),
    "expert_hidden": Figure(2048, "intermediate dimension of each expert", DEEPSEEK_V3_REPORT, "Section 4.2",
                            _SECONDARY),
    "top_k": Figure(8, "routed experts per token", DEEPSEEK_V3_REPORT, "Section 4.2", _SECONDARY),
    "nodes_per_token": Figure(4, "nodes at most that a token's experts sit on", DEEPSEEK_V3_REPORT,
                              "Sections 2.1.2 and 3.2.2 (node-limited routing)", _SECONDARY),
    "seq_len": Figure(4096, "tokens per sequence (pre-training)", DEEPSEEK_V3_REPORT, "Section 4.2", _SECONDARY),
    "batch": Figure(15360, "sequences per batch after the ramp-up", DEEPSEEK_V3_REPORT, "Section 4.2",
                    _SECONDARY),
    "pp": Figure(16, "pipeline-parallel degree", DEEPSEEK_V3_REPORT, "Section 3.2", _SECONDARY),
    "ep": Figure(64, "expert-parallel degree (across 8 nodes)", DEEPSEEK_V3_REPORT, "Section 3.2", _SECONDARY),
    "zero": Figure(1, "ZeRO stage of the data-parallel copies", DEEPSEEK_V3_REPORT, "Section 3.2", _SECONDARY),
}

#: DeepSeek-V3's FP8 products on Hopper (H800): the tensor cores keep partial sums with limited precision, so
#: the partial sums are promoted to FP32 registers at fixed intervals of the inner dimension.
DEEPSEEK_V3_FP8_ACCUMULATION = {
    "bits": Figure(14, "bits the FP8 tensor cores' accumulation retains, about", DEEPSEEK_V3_REPORT,
                   "Section 3.3.2", _SECONDARY),
    "interval": Figure(128, "elements of the inner dimension between promotions to FP32 (N_C)", DEEPSEEK_V3_REPORT,
                       "Section 3.3.2", _SECONDARY),
    # fine-grained scaling: one scale per 1 x tile of activations, per tile x tile block of weights
    "tile": Figure(128, "values a side of a scaling tile (1 x 128 activations, 128 x 128 weights)",
                   DEEPSEEK_V3_REPORT, "Section 3.3.2", _SECONDARY),
}

#: Llama 3 405B's key/value heads (grouped-query attention), for the layout page.
LLAMA3_405B_KV_HEADS = Figure(8, "key/value heads", LLAMA3_PAPER, "Table 3", _RELEASED)
#: Llama 3's vocabulary (the output layer's rows, the logits a token): pages 1.3 and 3.11.
LLAMA3_VOCAB = Figure(128_256, "vocabulary entries", LLAMA3_PAPER, "Section 3.2 and Table 3 (128K)",
                      "vocab_size in Meta's released model configuration; the report rounds it to 128K")
DEEPSEEK_V3_DEVICE = "H800 SXM 80GB"

#: PaLM 540B, the published run that reports both utilisations (MFU without, HFU with recomputation).
PALM_540B = {
    "mfu": Figure(0.462, "model FLOPs utilisation", PALM_PAPER, "Section 4.1 and Table 3", _SECONDARY),
    "hfu": Figure(0.578, "hardware FLOPs utilisation (with rematerialisation)", PALM_PAPER,
                  "Section 4.1 and Table 3", _SECONDARY),
}

#: Chinchilla: the compute-optimal rule of about 20 training tokens per parameter (70B parameters on 1.4T tokens).
CHINCHILLA_PAPER = ("Hoffmann et al. (2022). Training Compute-Optimal Large Language Models. arXiv:2203.15556")
CHINCHILLA = {
    "params": Figure(70e9, "parameters (Chinchilla)", CHINCHILLA_PAPER, "Section 4 and Table 1", _SECONDARY),
    "tokens": Figure(1.4e12, "training tokens (Chinchilla)", CHINCHILLA_PAPER, "Section 4 and Table 1", _SECONDARY),
}
#: PyTorch's DDP on real GPUs: the measurement the CPU pages cannot make (3.2 and 3.3 render it).
DDP_PAPER = ("Li et al. (2020). PyTorch Distributed: Experiences on Accelerating Data Parallel Training. "
             "Proceedings of the VLDB Endowment 13(12). arXiv:2006.15704")
_DDP_ABSTRACT = ("read in the paper's abstract (huggingface.co/papers/2006.15704); the abstract states the GPU "
                 "count and 'near-linear scalability', not a speedup or efficiency, so the pages give no such number")
PYTORCH_DDP = {
    "gpus": Figure(256, "GPUs over which DDP, configured appropriately, scaled near-linearly", DDP_PAPER,
                   "Abstract", _DDP_ABSTRACT),
}
#: What the abstract states without a number: the techniques behind that scaling (the pages quote no figure
#: for the benefit of each: none was found stated in a source the course could read).
PYTORCH_DDP_TECHNIQUES = ("bucketing gradients", "overlapping computation with communication",
                          "skipping gradient synchronization")

#: Selective recomputation's time on real GPUs: the measurement the CPU page (2.3) cannot make.
KORTHIKANTI_PAPER = ("Korthikanti et al. (2022). Reducing Activation Recomputation in Large Transformer Models. "
                     "MLSys 2023. arXiv:2205.05198")
_KORTHIKANTI_ABSTRACT = "read in the paper's abstract (mlsys.org/virtual/2023/poster/2445 and arXiv:2205.05198)"
KORTHIKANTI_530B = {
    "gpus": Figure(2240, "A100 GPUs training a 530B-parameter GPT-3-style model", KORTHIKANTI_PAPER, "Abstract",
                   _KORTHIKANTI_ABSTRACT),
    "mfu_full": Figure(42.1, "% MFU with full recomputation", KORTHIKANTI_PAPER, "Abstract", _KORTHIKANTI_ABSTRACT),
    "mfu_selective": Figure(54.2, "% MFU with selective recomputation and sequence parallelism", KORTHIKANTI_PAPER,
                            "Abstract", _KORTHIKANTI_ABSTRACT),
    "overhead_removed": Figure(90, "% of recomputation's execution-time overhead removed (stated as 'over')",
                               KORTHIKANTI_PAPER, "Abstract", _KORTHIKANTI_ABSTRACT),
}

#: Llama 3 8B, trained far past Chinchilla's ratio: 15T+ tokens (the 405B's 15.6T, LLAMA3_405B['tokens']).
LLAMA3_CARD = "Meta (2024). Llama 3 model card. github.com/meta-llama/llama3, MODEL_CARD.md"
LLAMA3_8B = {
    "params": Figure(8e9, "parameters (the size's name)", LLAMA3_CARD, "model table (8B)", _CARD_READ),
    "tokens": Figure(15e12, "training tokens ('15T+')", LLAMA3_CARD, "model table, Token count", _CARD_READ),
}


def format_value(figure: Figure) -> str:
    """The value as a reader would write it, with its unit: '126 layers', '30.84 million GPU-hours', '38 %'."""
    if not isinstance(figure, Figure):
        raise TypeError(f"figure must be a published Figure, got {type(figure).__name__}")
    x = figure.value
    if x < 1:
        text = f"{100 * x:g} %"
    elif x >= 1e9:
        mantissa, exponent = f"{x:.4g}".split("e+")
        text = f"{mantissa} × 10" + str(int(exponent)).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))
    elif x >= 1e6:
        text = f"{x / 1e6:g} million"
    else:
        text = f"{x:,.0f}" if float(x).is_integer() else f"{x:,g}"
    return f"{text} {figure.unit}"


@dataclass(frozen=True)
class SharedQuantity:
    """A quantity that more than one page states: where its value comes from (``computed_by``) and ``typed``,
    a regular expression that matches the quantity typed as a literal into a page's text source."""

    name: str
    computed_by: str
    typed: str


_NUM = r"(?<![\w.{])\d[\d.,]*"
#: One value per quantity: every page computes these from ``computed_by``, and
#: tests/test_one_value.py fails on a page that types one of them instead.
SHARED_QUANTITIES = {
    "device rate": SharedQuantity(
        "device rate", "lessonlib.calc.hardware: sustained_flops_per_s() or device(name).peak_flops_per_s, "
                       "printed with hardware.rate_text",
        _NUM + r"\s*(?:[eE]\+?1[1-6]|× ?10[⁰¹²³⁴⁵⁶⁷⁸⁹]+)\s*(?:FLOP/s|FLOPs? per second)"
        + "|" + _NUM + r"\s*[GTP]FLOP/s"
        + r"|\b\w*(?:rate|flops|peak)\w*\s*=\s*\d[\d_.]*[eE]\+?1[1-6]\b"),
    "utilisation": SharedQuantity(
        "utilisation", "lessonlib.calc.hardware.UTILISATION, or a published Figure (LLAMA3_405B['mfu_low'], ...)",
        _NUM + r"\s*%\s*(?:MFU|HFU|utili[sz]ation|of (?:an? |the |its )?[\w -]{0,20}peak)"),
    "model size": SharedQuantity(
        "model size", "lessonlib.calc.planner.PRESETS[name]['n_params'] or a published Figure's value",
        _NUM + r"\s*(?:B|billion|M|million)[- ]param\w*"),
    "Llama 3 batch": SharedQuantity(
        "Llama 3 batch", "LLAMA3_405B['batch_per_dp_16k'] x the data-parallel degree (gpus / (tp x pp)), "
                         "times LLAMA3_405B['seq_len'] for tokens",
        r"(?<![\w.{])(?:1,?953|2,?048|15|16)\s*(?:sequences (?:of 8,?192|per (?:replica|DP))|per replica)"
        r"|(?<![\w.{])(?:975|930)(?:,000| ?k)\s*steps"),
    "all-reduce time": SharedQuantity(
        "all-reduce time", "lessonlib.calc.comm.collective_seconds, or the page's own measurement",
        r"all-reduce[^.\n{]{0,40}?" + _NUM + r"\s*(?:ms|µs|s)\b"),
}
