"""Unit tests of lessonlib.measure.recovery: the checkpoint interval, resumable state,
atomic saves, and a real training process killed with SIGKILL during saves."""
from __future__ import annotations

import io
import math
import os
import pickle
import random
import signal
import time

import numpy as np
import pytest
import torch

from lessonlib.measure import recovery


# --- what to save and how ------------------------------------------------------

def test_rng_state_round_trips_through_a_weights_only_load():
    random.seed(1); np.random.seed(1); torch.manual_seed(1)
    state = recovery.capture_rng_state()
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    first = (random.random(), np.random.normal(size=3).tolist(), torch.rand(3).tolist())
    random.seed(99); np.random.seed(99); torch.manual_seed(99)
    recovery.restore_rng_state(loaded)
    again = (random.random(), np.random.normal(size=3).tolist(), torch.rand(3).tolist())
    assert first == again


def test_atomic_save_leaves_a_complete_file_and_no_temporaries(tmp_path):
    path = tmp_path / "checkpoint.pt"
    recovery.atomic_save({"w": torch.arange(5)}, path)
    recovery.atomic_save({"w": torch.arange(6)}, path)
    assert torch.equal(recovery.load_checkpoint(path)["w"], torch.arange(6))
    assert recovery.load_checkpoint(tmp_path)["w"].numel() == 6  # a run folder works too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    recovery.atomic_save({"step": 5}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot save this")

    with pytest.raises(RuntimeError):
        recovery.atomic_save({"step": 10, "bad": Unpicklable()}, path)
    assert recovery.load_checkpoint(path)["step"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


def test_weights_only_load_refuses_code(tmp_path):
    class Surprise:
        def __reduce__(self):
            return (os.getpid, ())

    torch.save({"x": Surprise()}, tmp_path / "evil.pt")
    with pytest.raises(pickle.UnpicklingError):
        recovery.load_checkpoint(tmp_path / "evil.pt")


def test_train_refuses_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="restore"):
        recovery.train(tmp_path, steps=2, restore="some")
    with pytest.raises(ValueError, match="steps"):
        recovery.train(tmp_path, steps=0)


def test_in_process_restore_modes(tmp_path):
    """Stop after step 10 (a clean stop), then resume to 20 three ways."""
    ref = tmp_path / "ref"
    recovery.train(ref, steps=20, save_every=5, out=io.StringIO())
    reference = recovery.read_losses(ref)
    threads = torch.get_num_threads()
    results = {}
    for mode in recovery.RESTORE_MODES:
        run = tmp_path / mode
        recovery.train(run, steps=20, save_every=5, stop_after=10, out=io.StringIO())
        recovery.train(run, steps=20, save_every=5, resume=True, restore=mode, out=io.StringIO())
        results[mode] = recovery.read_losses(run)
    assert torch.get_num_threads() == threads  # train() restores the thread count
    assert results["all"] == reference
    assert results["weights"] != reference and results["no-rng"] != reference
    assert all(results[m][s] == reference[s] for m in results for s in range(1, 11))


# --- real processes, real SIGKILL -------------------------------------------------

@pytest.mark.slow  # starts processes: seconds each
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_kill_during_save_always_leaves_the_last_complete_checkpoint(tmp_path):
    """Kill the training process in the middle of a save, several times; every
    time the last complete checkpoint loads and holds the last step reported
    saved. Then resume to the end: the losses equal an uninterrupted run's."""
    steps, every = 40, 5
    reference_dir = tmp_path / "reference"
    recovery.train(reference_dir, steps=steps, save_every=every, out=io.StringIO())
    run = tmp_path / "run"
    chooser = random.Random(7)
    next_save = every
    kills = 0
    for attempt in range(3):
        with recovery.TrainingProcess(run, steps=steps, save_every=every, resume=attempt > 0,
                                      slow_save_seconds=1.2) as job:
            target = next_save + every * chooser.randint(0, 1)
            assert job.wait_for(f"saving {target}"), job.lines
            time.sleep(chooser.uniform(0.05, 0.5))  # well inside the 1.2 s save
            job.kill()
            assert job.killed_by_sigkill
            kills += 1
            reported = [int(l.split()[1]) for l in job.lines if l.startswith("saved ")]
        partial = list(run.glob("*.tmp"))
        assert partial, "the kill should land while the temporary file is being written"
        with pytest.raises(Exception):
            torch.load(partial[0], weights_only=True)
        if (run / recovery.CHECKPOINT_NAME).exists():
            state = recovery.load_checkpoint(run)
            assert state["step"] == target - every
            if reported:
                assert state["step"] == reported[-1]
        else:
            assert target == every  # killed during the very first save: nothing to resume yet
        next_save = target + every
    assert kills == 3
    recovery.run_training(run, resume=True, steps=steps, save_every=every)
    resumed = recovery.read_losses(run)
    reference = recovery.read_losses(reference_dir)
    assert list(reference) == list(range(1, steps + 1))
    assert [v.hex() for v in resumed.values()] == [v.hex() for v in reference.values()]


@pytest.mark.slow  # starts processes: seconds each
def test_run_training_kills_at_a_step_and_cleans_up(tmp_path):
    result = recovery.run_training(tmp_path / "r", kill_at="step 7", steps=30, save_every=5, step_seconds=0.2)
    assert result["killed"]
    last_step = max(recovery.read_losses(tmp_path / "r"))
    assert 7 <= last_step < 10  # killed during step 8 or 9 (each padded to 0.2 s)
    assert result["last_saved"] == 5 == recovery.load_checkpoint(tmp_path / "r")["step"]
    with pytest.raises(RuntimeError, match="ended before"):
        recovery.run_training(tmp_path / "s", kill_at="step 99", steps=3, save_every=5)
