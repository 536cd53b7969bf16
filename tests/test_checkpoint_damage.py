"""The corruption matrix: damaged and wrong checkpoints are refused, named, and
skipped on resume, and the resumed run is still bitwise equal to one that was
never interrupted.

Every case starts from the same real run folder (checkpoints of steps 5 and 10
written by ``recovery.train``), damages the newest file one way, and records
what happened: the error from loading the file on its own, and which file a
resume fell back to. The table is printed (``pytest -s`` or ``-rP``) and kept
in the test report with ``record_property``.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil

import pytest
import torch

from lessonlib.measure import checkpoint, recovery

STEPS, EVERY = 15, 5
OTHER_RUN = []  # the folder of another run (seed 1, same steps), set by the fixture


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("damage")
    recovery.train(root / "reference", steps=STEPS, save_every=EVERY, out=io.StringIO())
    recovery.train(root / "stopped", steps=STEPS, save_every=EVERY, stop_after=10, out=io.StringIO())
    recovery.train(root / "other", steps=STEPS, save_every=EVERY, stop_after=10, seed=1, out=io.StringIO())
    OTHER_RUN.append(root / "other")
    return root


def _entries(path):
    """Byte offsets of each entry in a checkpoint file: {name: (start, size)}."""
    data = path.read_bytes()
    first, rest = data.split(b"\n", 1)
    header, _ = rest.split(b"\n", 1)
    offset = len(first) + 1 + len(header) + 1
    out = {}
    for name, size, _ in json.loads(header)["parts"]:
        out[name] = (offset, size)
        offset += size
    return out


def _flip(path, at, bit=0):
    data = bytearray(path.read_bytes())
    data[at] ^= 1 << bit
    path.write_bytes(bytes(data))


def _truncate(fraction):
    def damage(path):
        data = path.read_bytes()
        path.write_bytes(data[:int(len(data) * fraction)])
    return damage


def _flip_in(entry, where=0.5, bit=0):
    def damage(path):
        start, size = _entries(path)[entry]
        _flip(path, start + int(size * where), bit)
    return damage


def _flip_weight_mantissa(path):
    """Flip the lowest mantissa bit of one fp32 weight: the value changes by one ulp."""
    state = checkpoint.load_checkpoint(path)
    w = state["model"]["0.weight"]
    raw = w.flatten()[7].view(torch.int32).item().to_bytes(4, "little", signed=True)
    data = path.read_bytes()
    start, size = _entries(path)["model"]
    at = data.index(raw, start, start + size)
    _flip(path, at, 0)


def _resave(state, path):
    """Save ``state`` over ``path`` with valid checksums and the file's own run and step."""
    info = checkpoint.read_header(path)
    checkpoint.atomic_save(state, path, run=info["run"], step=info["step"])


def _rewrite(change):
    """Load, change a value, save again with valid checksums (and the file's run and step): loadable but wrong."""
    def damage(path):
        state = checkpoint.load_checkpoint(path)
        change(state)
        _resave(state, path)
    return damage


def _resave_without_run(path):
    """Save the same state again with valid checksums but no run identity (as an older lessonlib wrote it)."""
    checkpoint.atomic_save(checkpoint.load_checkpoint(path), path)


def _from_other_run(path):
    """The same step of another run (seed 1), copied in whole under the same name."""
    shutil.copyfile(OTHER_RUN[0] / path.name, path)


def _older_renamed(path):
    """The checkpoint of step 5 copied over the one of step 10 (a renamed file)."""
    shutil.copyfile(path.with_name("checkpoint-00000005.pt"), path)


def _entry_from_other_run(plain_hash):
    """Replace the 'model' entry by the other run's, and re-sign the header to match: with the other
    file's own checksum of that entry, or (``plain_hash``) a plain SHA-256 of its bytes."""
    def damage(path):
        other = OTHER_RUN[0] / path.name
        mine, theirs = path.read_bytes(), other.read_bytes()
        header = json.loads(mine.split(b"\n", 2)[1])
        their_parts = {n: (sz, d) for n, sz, d in json.loads(theirs.split(b"\n", 2)[1])["parts"]}
        blobs = []
        for i, (name, size, _) in enumerate(header["parts"]):
            src, (start, n) = (other, _entries(other)[name]) if name == "model" else (path, _entries(path)[name])
            blob = (theirs if src == other else mine)[start:start + n]
            blobs.append(blob)
            if name == "model":
                digest = hashlib.sha256(blob).hexdigest() if plain_hash else their_parts[name][1]
                header["parts"][i] = [name, len(blob), digest]
        line = json.dumps(header).encode()
        path.write_bytes(checkpoint.MAGIC + b" " + hashlib.sha256(line).hexdigest().encode() + b"\n" + line
                         + b"\n" + b"".join(blobs))
    return damage


class _Surprise:
    def __reduce__(self):
        return (os.system, ("echo this should never run",))


def _malicious(path):
    state = checkpoint.load_checkpoint(path)
    state["data"] = {"epoch": 0, "position": 0, "x": _Surprise()}
    _resave(state, path)  # valid checksums and identity: integrity is not safety


def _del(key, sub=None):
    def change(state):
        if sub is None:
            del state[key]
        else:
            del state[key][sub]
    return change


def _set(key, value, sub=None):
    def change(state):
        if sub is None:
            state[key] = value
        else:
            state[key][sub] = value
    return change


CASES = {
    # truncation at several offsets
    "truncated to 0 bytes": (_truncate(0.0), "not a checksummed checkpoint"),
    "truncated inside the header": (_truncate(0.003), "header"),
    "truncated at 50 %": (_truncate(0.5), "truncated"),
    "truncated by the last byte": (_truncate(0.99999), "truncated"),
    # bit flips
    "bit flip in a weight (lowest mantissa bit)": (_flip_weight_mantissa, "'model' entry fails its SHA-256"),
    "bit flip in the optimizer state": (_flip_in("optimizer", 0.6, 3), "'optimizer' entry fails its SHA-256"),
    "bit flip in the RNG state": (_flip_in("rng", 0.4, 7), "'rng' entry fails its SHA-256"),
    "bit flip in the step (metadata)": (_flip_in("step", 0.5, 1), "'step' entry fails its SHA-256"),
    "bit flip in the data cursor (metadata)": (_flip_in("data", 0.5, 2), "'data' entry fails its SHA-256"),
    "bit flip in the header": (lambda p: _flip(p, 40, 0), "header fails its checksum"),
    # wrong values that load
    # (a step entry that disagrees with the header and the name is refused before check_state sees it)
    "step = 10**9": (_rewrite(_set("step", 10**9)), "holds step 1000000000 in its 'step' entry"),
    "step = -3": (_rewrite(_set("step", -3)), "holds step -3 in its 'step' entry"),
    "negative data cursor": (_rewrite(_set("data", -32, "position")), "position -32 is impossible"),
    "RNG state missing": (_rewrite(_del("rng")), "has no 'rng'"),
    "numpy RNG missing": (_rewrite(_del("rng", "numpy")), "no 'numpy' generator"),
    "optimizer missing": (_rewrite(_del("optimizer")), "has no 'optimizer'"),
    # a hostile pickle with valid checksums
    "malicious pickle (valid checksums)": (_malicious, "Weights only load failed"),
    # valid checkpoints in the wrong place (issue 27): whose checkpoint it is, and which step
    "re-saved without its run identity": (_resave_without_run, "of an unnamed run"),
    "the same step of another run (seed 1)": (_from_other_run, "(seed 1)"),
    "step 5 renamed to step 10": (_older_renamed, "holds step 5 of run"),
    "'model' entry of another run, re-signed": (_entry_from_other_run(False), "'model' entry fails its SHA-256"),
    "'model' entry of another run, plain SHA-256": (_entry_from_other_run(True), "'model' entry fails its SHA-256"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_corruption_matrix(runs, tmp_path, case, record_property, capsys):
    damage, expected = CASES[case]
    run = tmp_path / "run"
    shutil.copytree(runs / "stopped", run)
    newest = recovery.newest_checkpoint(run)
    assert newest.name == "checkpoint-00000010.pt"
    damage(newest)

    # 1. The file on its own: refused with a message naming the file and the damage.
    try:
        recovery.check_state(checkpoint.load_checkpoint(newest, run=checkpoint.read_run(run)), STEPS)
        outcome = "LOADED"
    except (ValueError, pickle.UnpicklingError) as err:
        outcome = f"{type(err).__name__}: {str(err).splitlines()[0][:150]}"
    assert outcome != "LOADED"
    assert expected in outcome

    # 2. A resume skips it, says why, and falls back to the checkpoint of step 5.
    out = io.StringIO()
    recovery.train(run, steps=STEPS, save_every=EVERY, resume=True, out=out)
    lines = out.getvalue().splitlines()
    skipped = [l for l in lines if l.startswith("skipped ")]
    assert skipped and skipped[0].startswith("skipped checkpoint-00000010.pt:") and expected in skipped[0]
    assert "resumed 5 from checkpoint-00000005.pt" in lines

    # 3. The steps lost are redone deterministically: bitwise equal to the uninterrupted run.
    resumed, reference = recovery.read_losses(run), recovery.read_losses(runs / "reference")
    assert [v.hex() for v in resumed.values()] == [v.hex() for v in reference.values()]

    record_property("outcome", outcome)
    with capsys.disabled():
        print(f"\n  {case:45s} | {outcome[:110]} | resumed from step 5, bitwise equal")


def test_no_checkpoint_verifies_is_an_error_not_a_fresh_start(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs / "stopped", run)
    for _, path in recovery.checkpoint_files(run):
        _truncate(0.5)(path)
    with pytest.raises(recovery.CheckpointError, match="no checkpoint in .* verifies"):
        recovery.train(run, steps=STEPS, save_every=EVERY, resume=True, out=io.StringIO())


def test_the_malicious_pickle_never_runs(runs, tmp_path, capfd):
    run = tmp_path / "run"
    shutil.copytree(runs / "stopped", run)
    _malicious(recovery.newest_checkpoint(run))
    with pytest.raises(pickle.UnpicklingError):
        checkpoint.load_checkpoint(recovery.newest_checkpoint(run))
    assert "should never run" not in capfd.readouterr().out
