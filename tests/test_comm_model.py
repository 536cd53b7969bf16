"""lessonlib.calc.comm: the alpha-beta model, its fit, and the cluster links."""
import math

import pytest

from lessonlib.calc.comm import LINKS, Link, collective_seconds, fit_alpha_beta, relative_errors, ring_steps


def test_ring_steps():
    assert [ring_steps("all_reduce", n) for n in (1, 2, 8)] == [0, 2, 14]
    assert [ring_steps("all_gather", n) for n in (1, 2, 8)] == [0, 1, 7]
    assert ring_steps("reduce_scatter", 4) == 3


def test_collective_time():
    # 2(N-1) steps, each alpha plus a chunk of n/N bytes at beta
    assert collective_seconds("all_reduce", 8e9, 8, 1e-5, 100e9) == pytest.approx(14 * (1e-5 + 1e9 / 100e9))
    assert collective_seconds("all_gather", 1e6, 1, 1.0, 1.0) == 0.0  # one device sends nothing
    # an all-reduce costs an all-gather plus a reduce-scatter
    args = (3e8, 16, 5e-6, 50e9)
    assert collective_seconds("all_reduce", *args) == pytest.approx(
        collective_seconds("all_gather", *args) + collective_seconds("reduce_scatter", *args))


def test_fit_recovers_alpha_and_beta_exactly_from_model_data():
    alpha, beta = 40e-6, 2.5e9
    sizes = [2 ** k for k in range(10, 25, 2)]
    for collective, n in (("all_reduce", 2), ("all_gather", 4), ("all_reduce", 8)):
        times = [collective_seconds(collective, x, n, alpha, beta) for x in sizes]
        link = fit_alpha_beta(sizes, times, collective, n)
        assert link.alpha_s == pytest.approx(alpha, rel=1e-9)
        assert link.beta_bytes_per_s == pytest.approx(beta, rel=1e-9)
        assert max(abs(e) for e in relative_errors(link, collective, sizes, times, n)) < 1e-9
    assert math.isclose(link.alpha_us, 40.0) and math.isclose(link.beta_GBps, 2.5)


def test_fit_weighs_small_messages():
    # noise of 10 % on every sample: a fit on relative error keeps alpha within about that
    alpha, beta = 50e-6, 1e9
    sizes = [2 ** k for k in range(10, 25, 2)]
    times = [collective_seconds("all_reduce", x, 2, alpha, beta) * (1.1 if i % 2 else 0.9)
             for i, x in enumerate(sizes)]
    link = fit_alpha_beta(sizes, times)
    assert 0.8 < link.alpha_s / alpha < 1.2 and 0.8 < link.beta_bytes_per_s / beta < 1.2


@pytest.mark.parametrize("args,word", [
    (([1, 2], [1.0]), "same length"),
    (([1000, 1000], [1.0, 1.1]), "two different"),
    (([1000, 2000], [0.0, 1.0]), "seconds"),
    (([1000, -2000], [1.0, 1.0]), "n_bytes"),
    ((["a", 2000], [1.0, 1.0]), "n_bytes"),
    (([1000, 2000], [2.0, 1.0]), "latency-bandwidth"),
])
def test_fit_bad_input(args, word):
    with pytest.raises(ValueError, match=word):
        fit_alpha_beta(*args)


def test_collective_bad_input():
    with pytest.raises(ValueError, match="collective"):
        collective_seconds("broadcast", 1, 2, 1e-6, 1e9)
    with pytest.raises(ValueError, match="beta_bytes_per_s"):
        collective_seconds("all_reduce", 1, 2, 1e-6, 0)
    with pytest.raises(ValueError, match="alpha_s"):
        collective_seconds("all_reduce", 1, 2, -1e-6, 1e9)
    with pytest.raises(ValueError, match="world_size"):
        collective_seconds("all_reduce", 1, 0, 1e-6, 1e9)


def test_links_are_data_with_sources():
    assert set(LINKS) == {"nvlink", "infiniband"}
    for link in LINKS.values():
        assert isinstance(link, Link) and link.alpha_s > 0 and link.beta_bytes_per_s > 0
        assert "http" in link.source
    # NVLink: 900 GB/s both ways together; InfiniBand NDR: 400 Gb/s = 50 GB/s each way
    assert LINKS["nvlink"].beta_bytes_per_s == 900e9 / 2
    assert LINKS["infiniband"].beta_bytes_per_s == 400e9 / 8


def test_multi_node_collectives_against_hand_arithmetic():
    """Rail-optimised nodes: 8 NCCL rings, one through each GPU's port, or a hierarchical all-reduce,
    each checked against arithmetic written out here; the flat single-port ring is the contrast."""
    from lessonlib.calc.comm import multi_node_seconds
    nv, ib = LINKS["nvlink"], LINKS["infiniband"]
    n, N, g = 15e9, 64, 8  # 15 GB of bf16 gradients over 8 nodes of 8 GPUs
    K = N // g
    # rings: 2(N-1) steps; 2(K-1) of them cross nodes (network latency), the rest NVLink's; bytes at
    # min(450, 8 x 50) = 400 GB/s
    rings = (2 * (N - 1) - 2 * (K - 1)) * 3.4e-6 + 2 * (K - 1) * 9.6e-6 + 2 * (N - 1) * n / (N * 400e9)
    assert multi_node_seconds("all_reduce", n, N, g, nv, ib) == pytest.approx(rings, rel=1e-12)
    # hierarchical: reduce-scatter in the node (7 steps of n/8 over NVLink), 8 rails each all-reducing n/8
    # over K nodes, all-gather in the node
    inside = 7 * (3.4e-6 + n / (8 * 450e9))
    rails = 2 * (K - 1) * (9.6e-6 + (n / 8) / (K * 50e9))
    assert multi_node_seconds("all_reduce", n, N, g, nv, ib, "hierarchical") == pytest.approx(2 * inside + rails)
    half = (K - 1) * (9.6e-6 + (n / 8) / (K * 50e9))
    for kind in ("all_gather", "reduce_scatter"):
        assert multi_node_seconds(kind, n, N, g, nv, ib, "hierarchical") == pytest.approx(inside + half)
    single = 2 * (N - 1) * (9.6e-6 + n / (N * 50e9))
    assert multi_node_seconds("all_reduce", n, N, g, nv, ib, "single_port") == pytest.approx(single)
    # the single-port ring is 6-8x too pessimistic for a large buffer
    assert 6 < single / multi_node_seconds("all_reduce", n, N, g, nv, ib) < 8.5
    # one GPU a node (a data-parallel group under 8-way tensor parallelism): every algorithm is the flat ring
    for algo in ("rings", "hierarchical", "single_port"):
        assert multi_node_seconds("all_reduce", n, 128, 1, nv, ib, algo) == pytest.approx(
            collective_seconds("all_reduce", n, 128, ib.alpha_s, ib.beta_bytes_per_s))
    # inside one node: NVLink's ring
    assert multi_node_seconds("all_gather", n, 8, 8, nv, ib) == pytest.approx(nv.seconds("all_gather", n, 8))
    with pytest.raises(ValueError, match="per_node"):
        multi_node_seconds("all_reduce", n, 12, 8, nv, ib)
    with pytest.raises(ValueError, match="algorithm"):
        multi_node_seconds("all_reduce", n, 64, 8, nv, ib, "tree")
    with pytest.raises(TypeError, match="inter"):
        multi_node_seconds("all_reduce", n, 64, 8, nv, "infiniband")
