"""Ring attention (context parallelism): block counts, memory and agreement with full causal attention."""
import pytest

from lessonlib.calc.sequence import (causal_block_counts, causal_imbalance, causal_work, ring_attention_saved_bytes,
                                     ring_overlap_tokens, sequence_layout)


def _brute_force_blocks(devices, layout):
    chunks = sequence_layout(devices, layout)
    return [sum(1 for q in mine for other in chunks for k in other if k <= q) for mine in chunks]


@pytest.mark.parametrize("devices", [1, 2, 3, 4, 8, 16])
def test_block_counts_are_the_causal_pairs(devices):
    for layout in ("contiguous", "zigzag"):
        assert causal_block_counts(devices, layout) == _brute_force_blocks(devices, layout)
        assert sum(causal_block_counts(devices, layout)) == devices * (2 * devices + 1)
        assert sorted(c for cs in sequence_layout(devices, layout) for c in cs) == list(range(2 * devices))
    contiguous = causal_block_counts(devices, "contiguous")
    assert contiguous == [4 * r + 3 for r in range(devices)]  # the last device does the most
    assert set(causal_block_counts(devices, "zigzag")) == {2 * devices + 1}
    assert causal_imbalance(devices, "zigzag") == 1.0
    assert causal_imbalance(devices, "contiguous") == pytest.approx((4 * devices - 1) / (2 * devices + 1))


@pytest.mark.parametrize("devices", [1, 2, 3, 4, 8])
def test_causal_work_counts_diagonal_blocks_half(devices):
    n = 8 * devices  # tokens a side of a fine grid: 4 per chunk; a chunk pair's work is its unmasked pairs / 16
    chunk = n // (2 * devices)
    exact = [sum(1 for c in mine for qt in range(c * chunk, (c + 1) * chunk) for kt in range(qt + 1)) / chunk ** 2
             for mine in sequence_layout(devices, "contiguous")]
    work = causal_work(devices, "contiguous")
    # the token-level count also keeps the diagonal's own pairs (chunk / 2 of them per diagonal block)
    assert work == pytest.approx([e - 2 * (chunk / 2) / chunk ** 2 for e in exact])
    assert sum(work) == 2 * devices ** 2 and set(causal_work(devices, "zigzag")) == {2.0 * devices}
    assert causal_imbalance(devices, "contiguous", count="work") == pytest.approx((4 * devices - 2) / (2 * devices))


def test_ring_overlap_tokens_is_where_compute_meets_the_send():
    h, kv, f, alpha, beta = 16384, 1024, 6e14, 9.6e-6, 50e9
    x = ring_overlap_tokens(h, kv, f, alpha, beta)
    assert 2 * x * x * h / f == pytest.approx(alpha + 2 * 2 * x * kv / beta)
    assert ring_overlap_tokens(h, h, f, alpha, beta) > 10 * x  # wider K/V (no grouped-query attention): later
    assert ring_overlap_tokens(h, kv, f, 0.0, beta) < x  # no latency: earlier
    with pytest.raises(ValueError, match="kv_hidden"):
        ring_overlap_tokens(h, 2 * h, f, alpha, beta)


def test_saved_bytes_divide_by_devices():
    one = ring_attention_saved_bytes(1024, 1, 128, 4, 1)
    assert one == 4 * 4 * 1024 * 128 + 4 * 4 * 1024  # q, k, v, out in float32, and a float32 lse per query
    assert ring_attention_saved_bytes(1024, 1, 128, 4, 4) * 4 == one
    with pytest.raises(ValueError, match="world_size"):
        ring_attention_saved_bytes(1024, 1, 128, 4, 3)


@pytest.mark.parametrize("kwargs, word", [
    (dict(world_size=1), "world_size"), (dict(seq_len=1022), "seq_len"), (dict(heads=0), "heads"),
    (dict(repeats=0), "repeats"), (dict(timeout=0), "timeout"), (dict(batch=64, seq_len=1024), "holds"), (dict(batch=512, seq_len=256, head_dim=256), "values"),
    (dict(head_dim=1.5), "head_dim")])
def test_run_refuses_bad_arguments_before_starting_processes(kwargs, word):
    from lessonlib.measure.distributed.ring_attention import run_ring_attention

    with pytest.raises((ValueError, TypeError), match=word):
        run_ring_attention(**kwargs)


def test_ring_functions_refuse_to_run_outside_a_process_group():
    import torch

    from lessonlib.measure.distributed.ring_attention import ring_forward

    q = torch.zeros(1, 1, 4, 2)
    with pytest.raises(RuntimeError, match="process group"):
        ring_forward(q, q, q, [[0, 1]])
    with pytest.raises(ValueError, match="layout"):
        ring_forward(q, q, q, [[0, 2]])
    with pytest.raises(ValueError, match="k has shape"):
        ring_forward(q, q[..., :2, :], q, [[0, 1]])


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_ring_attention_matches_sdpa_with_formula_memory(world_size):
    from lessonlib.measure.distributed.ring_attention import run_ring_attention

    seq_len, heads, head_dim = 384, 2, 16
    per_rank = run_ring_attention(world_size=world_size, batch=1, heads=heads, seq_len=seq_len, head_dim=head_dim,
                                  repeats=1)
    hidden = heads * head_dim
    for r in per_rank:
        assert r["full_saved_bytes"] == ring_attention_saved_bytes(seq_len, 1, hidden, heads, 1)
        for name, got in r["layouts"].items():
            assert got["blocks"] == causal_block_counts(world_size, name)[r["rank"]]
            assert got["saved_bytes"] == ring_attention_saved_bytes(seq_len, 1, hidden, heads, world_size)
            # Higham's worst case for a float32 sum of seq_len terms taken in another order: seq_len * 2**-24
            bound = seq_len * 2 ** -24
            assert got["out_max_diff"] <= bound * r["ref_max"]
            assert got["grad_max_diff"] <= bound * got["grad_max"]
        cp = r["torch_context_parallel"]
        assert cp["ran"] or "sharding strategy" in cp["error"]


def test_allgather_attention_refuses_to_run_outside_a_process_group():
    import torch

    from lessonlib.measure.distributed.ring_attention import allgather_attention

    q = torch.zeros(1, 1, 4, 2)
    with pytest.raises(RuntimeError, match="process group"):
        allgather_attention(q, q, q, [[0, 1]])
    with pytest.raises(ValueError, match="layout"):
        allgather_attention(q, q, q, [[0, 2]])


@pytest.mark.slow
def test_allgather_context_parallel_matches_sdpa():
    # Llama 3's variant: all-gather K and V, local causal attention; output and q/k/v gradients equal SDPA's
    from lessonlib.measure.distributed.ring_attention import run_ring_attention

    seq_len = 384
    for r in run_ring_attention(world_size=3, batch=1, heads=2, seq_len=seq_len, head_dim=16, repeats=1):
        ag = r["allgather"]
        bound = seq_len * 2 ** -24  # the same float32 reordering bound as the ring's
        assert ag["out_max_diff"] <= bound * r["ref_max"]
        assert ag["grad_max_diff"] <= bound * ag["grad_max"]
