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


def _at(*path, value=None, apply=None):
    """Set (or ``apply`` a function to) the entry at ``path`` inside the state: a value valid in kind, impossible
    in value or together with the rest. The file is re-saved with valid checksums: only check_state can tell."""
    def change(state):
        *parents, last = path
        holder = state
        for key in parents:
            holder = holder[key]
        holder[last] = apply(holder[last]) if apply is not None else value
    return _rewrite(change)


def _group(key, value):
    return _at("optimizer", "param_groups", 0, key, value=value)


def _two_groups(state):
    group = state["optimizer"]["param_groups"][0]
    state["optimizer"]["param_groups"] = [dict(group, params=[0, 1, 2]), dict(group, params=[3, 4, 5])]


def _drop_param_state(state):
    del state["optimizer"]["state"][4]


def _schedule_at_rate(lr):
    """The group's rate and the schedule's last rate both set to ``lr``: they agree, but not with StepLR's plan."""
    def change(state):
        state["optimizer"]["param_groups"][0]["lr"] = lr
        state["scheduler"]["_last_lr"] = [lr]
    return change


NAN, INF = float("nan"), float("inf")
#: Valid one by one, impossible as values or together: the entry each is refused by, named.
IMPOSSIBLE = {
    # Adam's hyper-parameters
    "optimizer lr = -1": (_group("lr", -1.0), "optimizer.param_groups[0].lr = -1.0"),
    "optimizer lr = nan": (_group("lr", NAN), "optimizer.param_groups[0].lr = nan"),
    "optimizer lr = inf": (_group("lr", INF), "optimizer.param_groups[0].lr = inf"),
    "optimizer eps = nan": (_group("eps", NAN), "optimizer.param_groups[0].eps = nan"),
    "optimizer eps = 0": (_group("eps", 0.0), "optimizer.param_groups[0].eps = 0.0"),
    "optimizer beta1 = 1": (_group("betas", (1.0, 0.999)), "optimizer.param_groups[0].betas[0] = 1.0"),
    "optimizer beta2 = -0.1": (_group("betas", (0.9, -0.1)), "optimizer.param_groups[0].betas[1] = -0.1"),
    "optimizer betas of 3": (_group("betas", (0.9, 0.99, 0.999)), "optimizer.param_groups[0].betas = "),
    "optimizer weight_decay = inf": (_group("weight_decay", INF), "optimizer.param_groups[0].weight_decay = inf"),
    "optimizer weight_decay = -0.01": (_group("weight_decay", -0.01), "param_groups[0].weight_decay = -0.01"),
    "optimizer amsgrad = 'yes'": (_group("amsgrad", "yes"), "optimizer.param_groups[0].amsgrad = 'yes'"),
    # param groups against the model
    "two param groups for a one-group optimizer": (_rewrite(_two_groups), "optimizer.param_groups holds 2 groups"),
    "a param group with 5 of 6 parameters": (_group("params", [0, 1, 2, 3, 4]), "optimizer.param_groups[0].params"),
    # Adam's state tensors against their parameters and the step
    "exp_avg of the wrong shape": (_at("optimizer", "state", 2, "exp_avg", value=torch.zeros(64, 16)),
                                   "optimizer.state[2].exp_avg has shape (64, 16)"),
    "exp_avg with a NaN": (_at("optimizer", "state", 0, "exp_avg", apply=lambda t: t.index_fill(0, torch.tensor([3]),
                                                                                                NAN)),
                           "optimizer.state[0].exp_avg holds 16 non-finite"),
    "exp_avg_sq negative": (_at("optimizer", "state", 1, "exp_avg_sq", apply=lambda t: -t),
                            "optimizer.state[1].exp_avg_sq holds negative"),
    "Adam step = nan": (_at("optimizer", "state", 3, "step", value=torch.tensor(NAN)),
                        "optimizer.state[3].step = nan"),
    "Adam step 11 at run step 10": (_at("optimizer", "state", 0, "step", value=torch.tensor(11.0)),
                                    "optimizer.state[0].step = 11.0 is impossible"),
    "Adam steps that differ": (_at("optimizer", "state", 5, "step", value=torch.tensor(9.0)),
                               "optimizer.state[5].step = 9, but another"),
    "Adam state missing for one parameter": (_rewrite(_drop_param_state), "no entry for parameters [4]"),
    # the schedule against the optimizer and the step
    "scheduler last_epoch = -1": (_at("scheduler", "last_epoch", value=-1), "scheduler.last_epoch = -1"),
    "scheduler last_epoch 7 at step 10": (_at("scheduler", "last_epoch", value=7), "scheduler.last_epoch = 7"),
    "scheduler _step_count = 3": (_at("scheduler", "_step_count", value=3), "scheduler._step_count = 3"),
    "scheduler gamma = nan": (_at("scheduler", "gamma", value=NAN), "scheduler.gamma = nan"),
    "scheduler base_lrs not the group's initial_lr": (_at("scheduler", "base_lrs", value=[0.5]),
                                                      "scheduler.base_lrs[0] = 0.5"),
    "scheduler _last_lr not the group's lr": (_at("scheduler", "_last_lr", value=[0.1]), "scheduler._last_lr[0] = 0.1"),
    "rate off StepLR's plan (group and schedule agree)": (_rewrite(_schedule_at_rate(0.1)),
                                                          "scheduler._last_lr[0] = 0.1 is impossible: a StepLR"),
    # the model's weights
    "a weight of the wrong shape": (_at("model", "3.weight", value=torch.zeros(64, 65)), "model.3.weight must be"),
    "an infinite bias": (_at("model", "6.bias", value=torch.tensor([INF])), "model.6.bias holds non-finite"),
    # RNG states
    "numpy has_gauss = inf": (_at("rng", "numpy", "has_gauss", value=INF), "numpy.has_gauss = inf"),
    "numpy has_gauss = 2": (_at("rng", "numpy", "has_gauss", value=2), "numpy.has_gauss = 2"),
    "numpy cached_gaussian = nan": (_at("rng", "numpy", "cached_gaussian", value=NAN), "numpy.cached_gaussian = nan"),
    "numpy pos = 625": (_at("rng", "numpy", "pos", value=625), "numpy.pos = 625"),
    "numpy pos = -1": (_at("rng", "numpy", "pos", value=-1), "numpy.pos = -1"),
    "numpy key of 623 words": (_at("rng", "numpy", "keys", apply=lambda t: t[:623]), "numpy.keys must be"),
    "numpy key word >= 2**32": (_at("rng", "numpy", "keys", apply=lambda t: t + 2**32), "numpy.keys holds values"),
    "numpy kind = 'PCG64'": (_at("rng", "numpy", "kind", value="PCG64"), "numpy.kind = 'PCG64'"),
    "torch RNG state as int64": (_at("rng", "torch", apply=lambda t: t.long()), "'s torch must be a 1-D uint8"),
    "torch RNG state cut short": (_at("rng", "torch", apply=lambda t: t[:-8]), "'s torch must be a 1-D uint8"),
    "python RNG version 2": (_at("rng", "python", "version", value=2), "python.version = 2"),
    "python RNG position 700": (_at("rng", "python", "state", apply=lambda t: t.index_fill(0, torch.tensor([624]),
                                                                                           700)),
                                "python.state[624] = 700"),
    "python gauss_next = inf": (_at("rng", "python", "gauss_next", value=INF), "python.gauss_next = inf"),
}

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
    # Valid checkpoints in the wrong place: whose checkpoint it is, and which step
    "re-saved without its run identity": (_resave_without_run, "of an unnamed run"),
    "the same step of another run (seed 1)": (_from_other_run, "(seed 1)"),
    "step 5 renamed to step 10": (_older_renamed, "holds step 5 of run"),
    "'model' entry of another run, re-signed": (_entry_from_other_run(False), "'model' entry fails its SHA-256"),
    "'model' entry of another run, plain SHA-256": (_entry_from_other_run(True), "'model' entry fails its SHA-256"),
    **IMPOSSIBLE,
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
    assert "resumed after step 5 from checkpoint-00000005.pt" in lines

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


def test_a_malformed_rng_state_is_refused_before_any_generator_is_restored(runs):
    """numpy's has_gauss=inf used to pass the check and then fail inside np.random.set_state with a raw
    OverflowError, after torch's generator had already been replaced."""
    import copy
    import random

    import numpy as np

    state = copy.deepcopy(checkpoint.load_checkpoint(recovery.newest_checkpoint(runs / "stopped"))["rng"])
    state["numpy"]["has_gauss"] = float("inf")
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    before = torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()
    with pytest.raises(recovery.CheckpointError, match=r"numpy\.has_gauss = inf is impossible"):
        recovery.restore_rng_state(state)
    assert torch.equal(torch.get_rng_state(), before[0])
    assert (np.random.get_state()[1] == before[1]).all() and random.getstate() == before[2]


def test_checkpoints_of_a_weights_only_resume_resume_again(tmp_path):
    """restore="weights" starts optimizer and schedule afresh, so its checkpoints count fewer optimizer steps
    than run steps: possible, and resumed (only more steps than the run, or a mismatch between them, is not)."""
    run = tmp_path / "run"
    recovery.train(run, steps=STEPS, save_every=EVERY, stop_after=5, out=io.StringIO())
    recovery.train(run, steps=STEPS, save_every=EVERY, stop_after=10, resume=True, restore="weights",
                   out=io.StringIO())
    state = checkpoint.load_checkpoint(recovery.newest_checkpoint(run))
    assert state["step"] == 10 and state["optimizer"]["state"][0]["step"] == 5 == state["scheduler"]["last_epoch"]
    recovery.check_state(state, STEPS)
    out = io.StringIO()
    recovery.train(run, steps=STEPS, save_every=EVERY, resume=True, out=out)
    assert "resumed after step 10 from checkpoint-00000010.pt" in out.getvalue().splitlines()


@pytest.mark.parametrize("opt", ["adam-amsgrad-two-groups", "adamw"])
def test_the_optimizer_checks_accept_real_states_and_refuse_a_broken_maximum(opt):
    """A positive control for the general checks: real Adam states (two groups, amsgrad; AdamW) pass,
    and AMSGrad's running maximum below the second moment is refused."""
    from lessonlib.measure import optim_state

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    params = list(model.parameters())
    if opt == "adamw":
        optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    else:
        optimizer = torch.optim.Adam([{"params": params[:2]}, {"params": params[2:], "lr": 1e-3}], lr=1e-2,
                                     amsgrad=True)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    groups = [[tuple(p.shape) for p in g["params"]] for g in optimizer.param_groups]
    assert optim_state.check_adam_state(optimizer.state_dict(), groups, 0) == 0
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(5, 3)).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
    sd = optimizer.state_dict()
    assert optim_state.check_adam_state(sd, groups, 3) == 3
    optim_state.check_scheduler_state(scheduler.state_dict(), sd, 3)
    with pytest.raises(recovery.CheckpointError, match=r"scheduler\.last_epoch = 3 is impossible: it must be 2"):
        optim_state.check_scheduler_state(scheduler.state_dict(), sd, 2)
    if opt != "adamw":
        sd["state"][1]["max_exp_avg_sq"] = sd["state"][1]["exp_avg_sq"] / 2
        with pytest.raises(recovery.CheckpointError, match=r"optimizer\.state\[1\]\.max_exp_avg_sq is below"):
            optim_state.check_adam_state(sd, groups, 3)
