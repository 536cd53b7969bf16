"""lessonlib.measure.selective: selective recomputation with torch's create_selective_checkpoint_contexts.

Kept bytes, FLOPs and gradients measured on the course's GPT blocks against the formulas of lessonlib.calc.
"""
import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy

from lessonlib.calc.memory import activation_bytes_per_layer
from lessonlib.calc.planner import training_flops
from lessonlib.calc.recompute import (attention_core_flops_per_layer, matmul_outputs_bytes_per_layer,
                                      predicted_flops_ratio)
from lessonlib.measure import selective
from lessonlib.measure.compat import feature

B, S, H, A, L = 2, 32, 32, 4, 2


@pytest.fixture(scope="module")
def gpt():
    torch.set_num_threads(1)
    return selective.gpt_blocks(batch=B, seq_len=S, hidden=H, heads=A, layers=L, device="cpu")


def test_the_policy_saves_the_matrix_products_and_recomputes_the_rest():
    ctx = torch.utils.checkpoint.SelectiveCheckpointContext(is_recompute=False)
    aten = torch.ops.aten
    for op in (aten.mm.default, aten.addmm.default):
        assert selective.save_matmuls(ctx, op) == CheckpointPolicy.MUST_SAVE
    for op in (aten.bmm.default, aten._softmax.default, aten.native_dropout.default, aten.gelu.default,
               aten.native_layer_norm.default):
        assert selective.save_matmuls(ctx, op) == CheckpointPolicy.PREFER_RECOMPUTE
    with pytest.raises(TypeError, match="op"):
        selective.save_matmuls(ctx, "mm")
    with pytest.raises(TypeError, match="ctx"):
        selective.save_matmuls(None, aten.mm.default)
    assert selective.save_everything(ctx, aten.gelu.default) == CheckpointPolicy.MUST_SAVE


def test_the_fused_attention_policy_saves_the_kernel_so_backward_does_not_rerun_it():
    """save_matmuls reruns a fused attention kernel whole in backward; save_matmuls_and_attention keeps its output."""
    import functools
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sdpa = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.sdpa += func in selective.SDPA_OPS
            return func(*args, **(kwargs or {}))

    def attend(q):
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum(-1) @ torch.ones(8, 8)

    runs = {}
    for name in ("save_matmuls", "save_matmuls_and_attention"):
        q = torch.randn(1, 2, 8, 8, requires_grad=True)
        with Count() as c:
            checkpoint(attend, q, use_reentrant=False, context_fn=functools.partial(
                create_selective_checkpoint_contexts, selective.POLICIES[name])).sum().backward()
        runs[name] = c.sdpa
    assert runs["save_matmuls"] == runs["save_matmuls_and_attention"] + 1  # one forward rerun of the kernel
    ctx = torch.utils.checkpoint.SelectiveCheckpointContext(is_recompute=False)
    assert selective.save_matmuls_and_attention(ctx, torch.ops.aten.bmm.default) == CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.skipif(feature("mem_tracker") is None, reason="this torch has no CPU memory tracker")
def test_kept_bytes_match_the_formulas_to_the_byte(gpt):
    blocks, x = gpt
    ln_stats = 2 * 2 * S * B * 2  # LayerNorm mean and 1/std, which the paper leaves out
    want = {"none": L * (activation_bytes_per_layer(S, B, H, A, attention="stored") + ln_stats),
            "attention": L * (activation_bytes_per_layer(S, B, H, A, "attention", attention="stored") + ln_stats),
            "save_matmuls": L * matmul_outputs_bytes_per_layer(S, B, H),
            "full": L * activation_bytes_per_layer(S, B, H, A, "full")}
    got = {rc: selective.kept_after_forward(blocks, x, rc) for rc in want}
    assert got == want  # "attention" (the hand-written core checkpoint): Korthikanti's 34 s·b·h, LayerNorms' statistics too
    # the score term (Korthikanti's 5as/h) is gone under both recomputations
    assert got["save_matmuls"] < L * activation_bytes_per_layer(S, B, H, A, "attention", attention="stored")
    peaks = [selective.peak_step_bytes(blocks, x, rc) for rc in ("none", "save_matmuls", "full")]
    assert peaks[0] > peaks[1] > peaks[2]


def test_flops_match_the_formulas_exactly(gpt):
    blocks, x = gpt
    plain = selective.step_flops(blocks, x, "none")
    assert selective.step_flops(blocks, x, "save_matmuls") == plain + L * attention_core_flops_per_layer(S, B, H)
    assert selective.step_flops(blocks, x, "full") == round(plain * predicted_flops_ratio())
    # the hand-written "attention" reruns the same two score products as save_matmuls
    assert selective.step_flops(blocks, x, "attention") == selective.step_flops(blocks, x, "save_matmuls")
    # the planner's Korthikanti selective (recompute="attention") rebuilds the same two products: 4 s h a token a layer
    assert training_flops(10**6, B * S, "attention", S, H, L) - training_flops(10**6, B * S) == \
        L * attention_core_flops_per_layer(S, B, H)


def test_recomputation_leaves_the_gradients_unchanged(gpt):
    blocks, x = gpt
    grads = {}
    for rc in (*selective.RECOMPUTE, "attention"):
        blocks.zero_grad(set_to_none=True)
        x.grad = None
        torch.manual_seed(3)  # the same dropout masks: checkpoint restores the RNG state when it recomputes
        selective.forward(blocks, x, rc).float().pow(2).mean().backward()
        grads[rc] = [p.grad.clone() for p in blocks.parameters()] + [x.grad.clone()]
    blocks.zero_grad(set_to_none=True)
    x.grad = None
    for rc in ("save_matmuls", "full", "attention"):
        assert all(torch.equal(a, b) for a, b in zip(grads["none"], grads[rc])), rc


def test_time_ratios_and_compare_return_every_setting(gpt):
    blocks, x = gpt
    t = selective.time_ratios(blocks, x, rounds=2)
    assert set(t) == {*selective.RECOMPUTE, selective.POLICY_ONLY, selective.CORE_ONLY} and t["none"] == 1.0 and all(v > 0 for v in t.values())
    rows = selective.compare(blocks, x, ["none", "full"])
    assert [r.recompute for r in rows] == ["none", "full"] and rows[0].flops < rows[1].flops


def test_per_round_ratios_are_the_rounds_time_ratios_takes_the_median_of(gpt):
    """2.3 judged a difference of two medians against the rounds' spread, which time_ratios did not return."""
    blocks, x = gpt
    r = selective.time_ratio_rounds(blocks, x, rounds=3)
    assert set(r) == {*selective.RECOMPUTE, selective.POLICY_ONLY, selective.CORE_ONLY} and all(len(v) == 3 for v in r.values())
    assert r["none"] == [1.0, 1.0, 1.0] and all(v > 0 for vs in r.values() for v in vs)
    with pytest.raises(ValueError, match="rounds"):
        selective.time_ratio_rounds(blocks, x, rounds=0)


def test_bad_arguments_are_refused_by_name(gpt):
    blocks, x = gpt
    with pytest.raises(ValueError, match="recompute"):
        selective.forward(blocks, x, "some")
    with pytest.raises(ValueError, match="recompute"):  # "selective" names a family of policies, not one
        selective.forward(blocks, x, "selective")
    with pytest.raises(TypeError, match="policy"):  # one argument names the policy: recompute
        selective.forward(blocks, x, "save_matmuls", policy="save_matmuls")
    with pytest.raises(TypeError, match="blocks"):
        selective.forward(list(blocks), x)
    with pytest.raises(ValueError, match="x"):
        selective.forward(blocks, torch.randn(2, 8, H + 1, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="seq_len"):
        selective.gpt_blocks(batch=1, seq_len=4096, hidden=8, heads=2)
    with pytest.raises(ValueError, match="rounds"):
        selective.time_ratios(blocks, x, rounds=10**6)
    with pytest.raises(ValueError, match="settings"):
        selective.compare(blocks, x, ["half"])


def test_blocks_without_dropout_keep_no_masks_and_draw_no_random_numbers():
    """dropout=0.0 (2.3's clock, as most LLMs are pretrained): no dropout runs, so no random number is drawn; the
    default (0.1) draws them, and a rate of 1 or more is refused by name."""
    blocks, x = selective.gpt_blocks(batch=B, seq_len=S, hidden=H, heads=A, layers=L, device="cpu", dropout=0.0)
    assert all(m.p == 0.0 for m in blocks.modules() if hasattr(m, "p"))
    with torch.no_grad():
        seeded = torch.get_rng_state()
        blocks.train()(x)
        assert torch.equal(torch.get_rng_state(), seeded)  # no random numbers drawn
        with_dropout, _ = selective.gpt_blocks(batch=B, seq_len=S, hidden=H, heads=A, layers=L, device="cpu")
        seeded = torch.get_rng_state()
        with_dropout.train()(x)
        assert not torch.equal(torch.get_rng_state(), seeded)  # the default draws them
    with pytest.raises(ValueError, match="dropout"):
        selective.gpt_blocks(batch=1, seq_len=8, hidden=8, heads=2, dropout=1.5)


def test_core_checkpointed_is_korthikanti_selective_without_a_policy():
    """The hand-written split: the same output and gradients as a plain step, the same FLOPs as the policy
    (both score products rerun), and the bytes of Korthikanti et al.'s selective (34 s·b·h a layer)."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)
    blocks, x = selective.gpt_blocks(batch=B, seq_len=S, hidden=H, heads=A, layers=L, device="cpu", dropout=0.0)
    plain = selective.forward(blocks, x, "none")
    plain.float().pow(2).mean().backward()
    want = x.grad.clone()
    x.grad = None
    blocks.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as counter:
        out = selective.core_checkpointed(blocks, x)
        out.float().pow(2).mean().backward()
    assert torch.equal(out, plain) and torch.equal(x.grad, want)
    x.grad = None
    blocks.zero_grad(set_to_none=True)
    assert counter.get_total_flops() == selective.step_flops(blocks, x, "save_matmuls")
    assert counter.get_total_flops() > selective.step_flops(blocks, x, "none")
    with pytest.raises(ValueError, match="blocks"):
        selective.core_checkpointed(torch.nn.Sequential(torch.nn.Linear(H, H)), x)
