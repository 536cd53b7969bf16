"""Fine-tuning and serving: LoRA against full fine-tuning, and the KV cache, measured and by formula."""
import pytest
import torch

from lessonlib.calc import serving
from lessonlib.calc.memory import training_state_bytes
from lessonlib.measure import compat, data, models
from lessonlib.measure.finetune import LoRALinear, add_lora, greedy_decode, greedy_decode_uncached, trainable_params
from lessonlib.measure.memory import measure_training_memory, peak_memory


def _gpt():
    torch.manual_seed(0)
    return models.TinyGPT(seq_len=32, hidden=64, heads=4, layers=2)


def test_lora_layer_equals_its_base_at_the_start_and_trains_only_a_and_b():
    torch.manual_seed(0)
    base = torch.nn.Linear(16, 24)
    layer = LoRALinear(base, rank=4, alpha=8)
    x = torch.randn(5, 16)
    assert torch.equal(layer(x), base(x))  # B = 0
    assert [n for n, p in layer.named_parameters() if p.requires_grad] == ["A", "B"]
    assert trainable_params(layer) == serving.lora_params(16, 24, 4)
    layer(x).sum().backward()
    assert base.weight.grad is None and layer.B.grad is not None
    with torch.no_grad():
        layer.B.fill_(1.0)
    assert torch.allclose(layer(x), base(x) + 2.0 * x @ layer.A.T @ layer.B.T)  # alpha / rank = 2


def test_full_and_lora_ledgers_match_the_formula():
    tok, tgt = data.make_tokens(1, 32)
    full_model, lora_model = _gpt(), add_lora(_gpt(), rank=4)
    full = measure_training_memory(full_model, tok, tgt, models.lm_loss, torch.optim.Adam(full_model.parameters()))
    trained = [p for p in lora_model.parameters() if p.requires_grad]
    lora = measure_training_memory(lora_model, tok, tgt, models.lm_loss, torch.optim.Adam(trained))
    n, t = models.n_params(lora_model), trainable_params(lora_model)
    assert t == 2 * sum(serving.lora_params(*s, 4) for s in ((64, 192), (64, 64), (64, 256), (256, 64)))  # 2 layers
    f_full = serving.finetune_state_bytes(models.n_params(full_model), models.n_params(full_model))
    f_lora = serving.finetune_state_bytes(n, t)
    assert f_full.total == training_state_bytes(models.n_params(full_model), "adam", "fp32").total
    assert (lora.weights, lora.gradients) == (f_lora.weights, f_lora.gradients)
    assert lora.optimizer_state == f_lora.optimizer_state + 4 * len(trained)  # Adam's step counters
    assert (full.weights, full.gradients) == (f_full.weights, f_full.gradients)
    assert lora.activations > 0.8 * full.activations  # backward still runs through every layer
    if lora.peak is not None:  # MemTracker ran the frozen model (it refuses frozen parameters unpatched)
        assert lora.peak < full.peak


def test_frozen_aware_tracker_counts_what_the_plain_tracker_counts():
    MemTracker = compat.feature("mem_tracker")
    if MemTracker is None:
        pytest.skip("this torch has no MemTracker")
    model = _gpt()
    tok, tgt = data.make_tokens(2, 32)

    def peak(cls):
        tracker = cls()
        tracker.track_external(model)
        with tracker:
            models.lm_loss(model(tok), tgt).backward()
        model.zero_grad(set_to_none=True)
        return sum(d.get("Total", 0) for d in tracker.get_tracker_snapshot("peak").values())

    class NoHooks(compat.frozen_aware(MemTracker)):  # what the frozen-aware tracker does on every module
        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            return MemTracker._track_module_params_and_buffers(self, module, install_grad_hooks=False)

    assert peak(NoHooks) == peak(MemTracker)
    with pytest.raises(TypeError, match="tracker_class"):
        compat.frozen_aware("MemTracker")


def test_cached_decode_equals_the_uncached_one_and_its_cache_the_formula():
    model = _gpt()
    prompt = data.make_tokens(3, 5)[0]
    decoded, peak = peak_memory(lambda: greedy_decode(model, prompt, 12), track=[model])
    assert torch.equal(decoded.tokens, greedy_decode_uncached(model, prompt, 12))
    assert decoded.tokens.shape == (3, 17) and decoded.cached_tokens == 17
    assert decoded.cache_bytes == serving.kv_cache_bytes(2, 4, 16, 17, 3, bytes_per_value=4)
    if peak is not None:
        assert peak.added >= decoded.cache_bytes
    assert model.training  # mode restored


def test_decode_refuses_what_does_not_fit():
    model = _gpt()
    with pytest.raises(ValueError, match="new_tokens"):
        greedy_decode(model, torch.zeros(1, 30, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="prompt"):
        greedy_decode(model, torch.zeros(4), 2)
    with pytest.raises(ValueError, match="LoRA"):
        greedy_decode(add_lora(_gpt()), torch.zeros(1, 3, dtype=torch.long), 2)


def test_kv_cache_formula_and_published_shapes():
    assert serving.kv_cache_bytes_per_token(32, 8, 128) == 131072  # Llama 3 8B, bf16: 128 KiB
    s8, s70 = serving.serving_memory(serving.LLAMA3_8B), serving.serving_memory(serving.LLAMA3_70B)
    assert s8.kv_per_sequence == 131072 * 8192 and s8.kv_without_gqa == 4 * s8.kv_per_sequence
    assert s70.kv_per_token == 2 * 80 * 8 * 128 * 2 and s70.kv_without_gqa == 8 * s70.kv_per_sequence
    assert s8.sequences_to_match_weights == pytest.approx(16e9 / s8.kv_per_sequence)
    with pytest.raises(ValueError, match="kv_heads"):
        serving.kv_cache_bytes_per_token(32, 0, 128)
    with pytest.raises(TypeError, match="model"):
        serving.serving_memory({"layers": 3})


def test_finetune_formula():
    f = serving.finetune_state_bytes(1000, 10, "adam", "bf16_master")
    assert (f.weights, f.gradients, f.master_weights, f.optimizer_state) == (2000, 20, 40, 80)
    assert f.trained_share == pytest.approx(140 / 2140)
    with pytest.raises(ValueError, match="trainable"):
        serving.finetune_state_bytes(10, 11)
    with pytest.raises(ValueError, match="rank"):
        serving.lora_params(4, 8, 5)


def test_no_chapter_says_serving_holds_only_the_weights():
    # Serving also holds a KV cache; a page that says "only the weights" contradicts the
    # fine-tuning and serving page, which measures it.
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    claim = re.compile(r"serv\w*\W[^.]{0,60}\b(one thing|only)\b[^.]{0,40}\bweights\b", re.I | re.S)
    found = [(p.name, m.group(0)) for p in sorted((root / "chapters").rglob("*.md"))
             for m in claim.finditer(p.read_text())]
    assert not found, found
    assert claim.search("Serving a model holds one thing: its weights.")  # the check finds the old sentence
