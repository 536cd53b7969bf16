"""lessonlib.calc.sharding: ZeRO bytes per device, FSDP2's shards and padding, a step's collectives."""
import pytest

from lessonlib.calc.memory import training_state_bytes
from lessonlib.calc.sharding import (fsdp_local_numel, fsdp_padded_numel, fsdp_shard_rows, zero_state_bytes,
                                     zero_step_traffic)


def test_stage_zero_is_the_unsharded_state():
    for opt in ("sgd", "momentum", "adam"):
        for prec in ("fp32", "bf16_master"):
            assert zero_state_bytes(1000, 8, 0, opt, prec) == training_state_bytes(1000, opt, prec)


def test_stages_of_the_zero_paper():
    # Rajbhandari et al. (2020), Figure 1: 7.5B parameters, Adam, mixed precision (K = 12), N = 64:
    # 120 GB unsharded, 31.4 GB at stage 1, 16.6 GB at stage 2, 1.9 GB at stage 3.
    n, d = 7_500_000_000, 64
    got = [zero_state_bytes(n, d, s).total / 1e9 for s in range(4)]
    assert got[0] == 120
    assert round(got[1], 1) == 31.4 and round(got[2], 1) == 16.6 and round(got[3], 2) == 1.88


def test_what_each_stage_shards_exactly():
    n, d = 1200, 4
    s1, s2, s3 = (zero_state_bytes(n, d, s) for s in (1, 2, 3))
    assert (s1.weights, s1.gradients, s1.master_weights, s1.optimizer_state) == (2 * n, 2 * n, 4 * n // d, 8 * n // d)
    assert (s2.weights, s2.gradients) == (2 * n, 2 * n // d)
    assert s3.total * d == training_state_bytes(n).total  # stage 3 divides all 16 bytes
    for s in (s1, s2, s3):
        assert s.total == s.weights + s.gradients + s.master_weights + s.optimizer_state


def test_padding_to_a_multiple_of_devices():
    # 10 parameters on 4 devices: each keeps ceil(10/4) = 3 parameters' worth (the flat buffer padded to 12)
    assert zero_state_bytes(10, 4, 3, "adam", "fp32").total == 16 * 3
    assert zero_step_traffic(10, 4, 3, 4)["reduce_scatter"] == 12 * 4


def test_one_device_keeps_everything():
    for s in range(4):
        assert zero_state_bytes(777, 1, s) == training_state_bytes(777)


def test_fsdp_shards_follow_torch_chunk():
    assert [fsdp_shard_rows(10, 4, r) for r in range(4)] == [3, 3, 3, 1]
    assert [fsdp_shard_rows(2, 4, r) for r in range(4)] == [1, 1, 0, 0]
    assert [fsdp_shard_rows(8, 4, r) for r in range(4)] == [2, 2, 2, 2]
    shapes = [(256, 64), (256,), (1, 256), (1,), ()]
    per_rank = [fsdp_local_numel(shapes, 2, r) for r in range(2)]
    assert per_rank == [128 * 64 + 128 + 256 + 1 + 1, 128 * 64 + 128]
    assert sum(per_rank) == 256 * 64 + 256 + 256 + 1 + 1  # nothing lost, nothing doubled
    assert fsdp_padded_numel(shapes, 2) == 256 * 64 + 256 + 2 * 256 + 2 + 2


def test_step_traffic_by_stage():
    n, d = 1000, 4
    t0, t1, t3 = (zero_step_traffic(n, d, s, 2) for s in (0, 1, 3))
    assert t0["all_reduce"] == 2 * n and t0["sent_per_device"] == 2 * (d - 1) / d * 2 * n
    assert t1["sent_per_device"] == t0["sent_per_device"]  # reduce-scatter + all-gather = an all-reduce
    assert t3["all_gather"] == 2 * 2 * n and t3["reduce_scatter"] == 2 * n
    assert t3["sent_per_device"] == 1.5 * t0["sent_per_device"]


@pytest.mark.parametrize("kwargs,word", [
    (dict(n_params=0, world_size=2, stage=3), "n_params"),
    (dict(n_params=10, world_size=0, stage=3), "world_size"),
    (dict(n_params=10, world_size=2.5, stage=3), "world_size"),
    (dict(n_params=10, world_size=2, stage=4), "stage"),
    (dict(n_params=10, world_size=2, stage=True), "stage"),
    (dict(n_params=10, world_size=2, stage="3"), "stage"),
    (dict(n_params=10, world_size=2, stage=1, optimizer="lion"), "optimizer"),
    (dict(n_params=10, world_size=2, stage=1, precision="fp4"), "precision"),
])
def test_zero_state_bytes_bad_input(kwargs, word):
    with pytest.raises(ValueError, match=word):
        zero_state_bytes(**kwargs)


def test_shard_helpers_bad_input():
    with pytest.raises(ValueError, match="rank"):
        fsdp_shard_rows(10, 4, 4)
    with pytest.raises(ValueError, match="rows"):
        fsdp_shard_rows(-1, 4, 0)
    with pytest.raises(ValueError, match="shapes"):
        fsdp_local_numel([5], 2, 0)
    with pytest.raises(ValueError, match="shapes"):
        fsdp_local_numel([(2.5, 3)], 2, 0)
    with pytest.raises(ValueError, match="bytes_per_value"):
        zero_step_traffic(10, 2, 3, 0)
