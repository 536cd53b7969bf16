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
    path = tmp_path / "state.pt"
    recovery.atomic_save({"w": torch.arange(5)}, path)
    recovery.atomic_save({"w": torch.arange(6)}, path)
    assert torch.equal(recovery.load_checkpoint(path)["w"], torch.arange(6))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


def test_save_checkpoint_keeps_the_newest_k_and_a_folder_loads_the_newest(tmp_path):
    for step in (5, 10, 15, 20):
        recovery.save_checkpoint({"step": step}, tmp_path, step, keep=3)
    assert [s for s, _ in recovery.checkpoint_files(tmp_path)] == [10, 15, 20]
    assert recovery.load_checkpoint(tmp_path)["step"] == 20  # a run folder: the newest that verifies
    (tmp_path / "checkpoint-00000025.pt.abcd.tmp").write_bytes(b"half a file")
    recovery.save_checkpoint({"step": 25}, tmp_path, 25, keep=3)  # the next save removes the stray file
    assert (tmp_path / "writer.lock").is_file()  # this process is the folder's writer until it lets go
    recovery.release_folder(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-00000015.pt", "checkpoint-00000020.pt", "checkpoint-00000025.pt"]


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "state.pt"
    recovery.atomic_save({"step": 5}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot save this")

    with pytest.raises(RuntimeError):
        recovery.atomic_save({"step": 10, "bad": Unpicklable()}, path)
    assert recovery.load_checkpoint(path)["step"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


def test_weights_only_load_refuses_code(tmp_path):
    class Surprise:
        def __reduce__(self):
            return (os.getpid, ())

    # Checksums say nothing about intent: a hostile file written with valid ones
    # must still be refused by torch.load(weights_only=True).
    recovery.atomic_save({"x": Surprise()}, tmp_path / "evil.pt")
    with pytest.raises(pickle.UnpicklingError):
        recovery.load_checkpoint(tmp_path / "evil.pt")


@pytest.mark.parametrize("kwargs, name", [
    (dict(restore="some"), "restore"), (dict(steps=0), "steps"), (dict(steps=10**30), "steps"),
    (dict(steps=float("nan")), "steps"), (dict(save_every=float("nan")), "save_every"),
    (dict(save_every=True), "save_every"), (dict(seed=-1), "seed"), (dict(resume="yes"), "resume"),
    (dict(step_seconds=float("inf")), "step_seconds"), (dict(slow_save_seconds=-1), "slow_save_seconds"),
    (dict(keep=0), "keep"), (dict(stop_after=2.5), "stop_after"), (dict(run_dir=None), "run_dir"),
    (dict(slow_save_from=-1), "slow_save_from"), (dict(slow_save_from="5"), "slow_save_from"),
    (dict(replace="yes"), "replace"), (dict(replace=1), "replace")])
def test_train_refuses_bad_arguments_before_any_work(tmp_path, kwargs, name):
    """In process and in a child: the same check, before a step runs or a process starts."""
    args = dict(run_dir=tmp_path / "run", steps=2)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=name):
        recovery.train(**args, out=io.StringIO())
    with pytest.raises((ValueError, TypeError), match=name):
        recovery.TrainingProcess(**args)
    with pytest.raises((ValueError, TypeError), match=name):
        recovery.run_training(**args)
    assert not (tmp_path / "run").exists()  # nothing was started


def test_only_the_saves_from_slow_save_from_on_are_slowed(tmp_path):
    out = io.StringIO()
    recovery.train(tmp_path / "run", steps=10, save_every=5, slow_save_seconds=0.2, slow_save_from=10, out=out)
    lines = out.getvalue().splitlines()
    assert not any(l.startswith("writing 5 ") for l in lines)  # the save of step 5: at full speed
    assert [l for l in lines if l.startswith("writing 10 ")] == [f"writing 10 {k}/20" for k in range(1, 21)]


def test_train_states_its_maximum():
    # the limit is read from the library, not restated: the error names it as the docstring does
    with pytest.raises(ValueError, match=f"steps must be at most {recovery.MAX_STEPS:,}"):
        recovery.train("unused", steps=recovery.MAX_STEPS + 1)


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
    saved. Then resume to the end: the losses equal an uninterrupted run's.

    The kill is timed by the child, not by a clock: the save aimed at (the only
    one slowed: ``slow_save_from``) reports each twentieth of the file it has
    flushed to the temporary file (``writing N k/20``), and the kill follows
    chunk k, chosen at random from 1 to 8. The
    rest of the save still takes 12 or more chunks of 0.1 s, so the kill lands
    inside it unless this process is over a second late to react."""
    steps, every = 40, 5
    reference_dir = tmp_path / "reference"
    recovery.train(reference_dir, steps=steps, save_every=every, out=io.StringIO())
    run = tmp_path / "run"
    chooser = random.Random(7)
    next_save = every
    kills = 0
    for attempt in range(3):
        target = next_save + every * chooser.randint(0, 1)
        chunk = chooser.randint(1, 8)
        with recovery.TrainingProcess(run, steps=steps, save_every=every, resume=attempt > 0,
                                      slow_save_seconds=2.0, slow_save_from=target) as job:
            assert job.wait_for(f"writing {target} {chunk}/20"), job.lines
            job.kill()
            assert job.killed_by_sigkill
            kills += 1
            reported = [int(l.split()[1]) for l in job.lines if l.startswith("saved ")]
            assert f"saved {target}" not in job.lines
        partial = list(run.glob("*.tmp"))
        assert len(partial) == 1, "the kill landed while the temporary file was being written"
        with pytest.raises(recovery.CheckpointError):
            recovery.load_checkpoint(partial[0])
        files = recovery.checkpoint_files(run)
        if files:
            state = recovery.load_checkpoint(run)
            assert state["step"] == target - every == files[-1][0]
            if reported:
                assert state["step"] == reported[-1]
            assert len(files) <= recovery.KEEP
        else:
            assert target == every  # killed during the very first save: nothing to resume yet
        next_save = target + every
    assert kills == 3
    result = recovery.run_training(run, resume=True, steps=steps, save_every=every)
    assert any(l.startswith("removed ") and l.endswith(".tmp") for l in result["lines"]), result["lines"][:5]
    assert not list(run.glob("*.tmp"))
    resumed = recovery.read_losses(run)
    reference = recovery.read_losses(reference_dir)
    assert list(reference) == list(range(1, steps + 1))
    assert [v.hex() for v in resumed.values()] == [v.hex() for v in reference.values()]


@pytest.mark.slow  # starts processes: seconds each
def test_run_training_kills_at_a_step_and_cleans_up(tmp_path):
    # Steps padded to 0.5 s: killed after "step 3", the job is inside step 3's
    # padding or step 4's; the save of step 4 comes a full second after the
    # line, so the kill lands before it unless this process is a second late.
    result = recovery.run_training(tmp_path / "r", kill_at="step 3", steps=30, save_every=2, step_seconds=0.5)
    assert result["killed"]
    last_step = max(recovery.read_losses(tmp_path / "r"))
    assert 3 <= last_step < 5
    assert result["last_saved"] == 2 == recovery.load_checkpoint(tmp_path / "r")["step"]
    with pytest.raises(RuntimeError, match="ended before"):
        recovery.run_training(tmp_path / "s", kill_at="step 99", steps=3, save_every=5)


@pytest.mark.parametrize("kwargs, name", [
    (dict(steps=0), "steps"), (dict(save_every=-1), "save_every"), (dict(seed=-1), "seed"),
    (dict(copies=[3]), r"copies\[0\]"), (dict(progress=5), "progress"), (dict(steps=10**6), "steps"),
])
def test_crash_twice_refuses_bad_arguments_before_starting_any_process(tmp_path, kwargs, name):
    """crash_twice is deny-listed in the fuzz test (it starts and kills jobs): its checks are tested here."""
    from lessonlib.measure.crash_demo import crash_twice

    with pytest.raises((ValueError, TypeError), match=name):
        crash_twice(tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
