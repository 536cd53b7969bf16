"""What a checkpoint file holds, byte for byte: tensors, containers, header."""
import pytest
import torch

from lessonlib.measure.checkpoint import atomic_save
from lessonlib.measure.checkpoint_format import read_header
from lessonlib.measure.crash_demo import container_cost, entry_bytes, saved_bytes


def test_entry_bytes_splits_tensors_from_the_container():
    shared = torch.zeros(10)
    e = entry_bytes({"a": shared, "b": [shared[2:], torch.ones(3, dtype=torch.float64)], "n": 3})
    assert (e.tensors, e.tensor_bytes) == (2, 40 + 24)  # a view of a saved storage costs nothing more
    assert e.file_bytes == saved_bytes({"a": shared, "b": [shared[2:], torch.ones(3, dtype=torch.float64)], "n": 3})
    assert e.overhead == e.file_bytes - 64
    assert entry_bytes({}).tensor_bytes == 0


def test_container_cost_predicts_a_file_of_many_tensors():
    cost = container_cost()
    assert cost.fixed == saved_bytes({})
    # a zip local header (30 B) and directory entry (46 B) with the name twice, the pickle's line, padding to 64 B
    assert 100 < cost.per_tensor < 400
    many = {f"w{i}": torch.zeros(256) for i in range(40)}
    e = entry_bytes(many)
    assert e.overhead == pytest.approx(cost.fixed + 40 * cost.per_tensor, rel=0.05)
    with pytest.raises(ValueError, match="tensors"):
        container_cost(0)


def test_a_checkpoint_file_is_its_header_and_its_entries(tmp_path):
    state = {"model": {"w": torch.randn(8, 8)}, "step": 3}
    path = atomic_save(state, tmp_path / "checkpoint-00000003.pt", step=3)
    parts = read_header(path)["parts"]
    assert [p[:2] for p in parts] == [[k, entry_bytes(v).file_bytes] for k, v in state.items()]
    header = path.stat().st_size - sum(p[1] for p in parts)
    assert 0 < header < 1000
