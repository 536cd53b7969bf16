"""3.12: what each DCP shard file holds, read from the checkpoint's metadata (explains why two processes that
hold the same shard bytes write files of different sizes)."""
import warnings

import pytest
import torch

from lessonlib.measure.distributed.sharded_checkpoint import ShardFile, shard_file_contents


def test_shard_file_contents_counts_items_values_and_framing(tmp_path):
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # no process group: DCP says it saves from one process, as intended here
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"w": torch.zeros(1000), "opt": {"step": torch.tensor(3.0)}, "epoch": 5}, checkpoint_id=tmp_path)
    (f,) = shard_file_contents(tmp_path)
    assert isinstance(f, ShardFile) and f.name.endswith(".distcp")
    assert f.items == 3 and f.whole == 2                    # two whole tensors and one pickled int
    assert f.data_bytes == 1000 * 4 + 4                     # the values themselves, float32
    assert f.bytes == (tmp_path / f.name).stat().st_size
    assert f.framing == f.bytes - f.data_bytes > 0          # every entry carries its own container


def test_shard_file_contents_refuses_a_folder_without_metadata(tmp_path):
    with pytest.raises(ValueError, match="path"):
        shard_file_contents(tmp_path)
    with pytest.raises((TypeError, ValueError), match="path"):
        shard_file_contents(3)
