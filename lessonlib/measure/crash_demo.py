"""The two crashes the recovery page stages, and the size of what a checkpoint holds.

:func:`entry_bytes` splits each entry of a checkpoint into its tensors' bytes and
the container ``torch.save`` wraps them in; :func:`container_cost` measures that
container: a fixed part per file and a part per tensor.

:func:`crash_twice` kills a training job (``lessonlib.measure.recovery``) with
SIGKILL at a random step, keeps copies of that moment, resumes it, and kills
it again in the middle of a save. Its random moments come from a seeded
generator, so the page is reproducible.
"""
from __future__ import annotations

import io
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import load_checkpoint
from .recovery import copy_run, read_losses, run_training


def saved_bytes(obj) -> int:
    """Bytes ``torch.save`` writes for ``obj`` (a state dict, an RNG state, a number)."""
    if callable(obj) and not isinstance(obj, torch.Tensor):
        raise TypeError(f"obj must be data (tensors, numbers, containers), got {obj!r:.80}")
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getbuffer().nbytes


def _tensors(obj, found: dict) -> dict:
    """{storage key: bytes} of every tensor in nested dicts, lists and tuples (a storage counts once)."""
    if isinstance(obj, torch.Tensor):
        st = obj.untyped_storage()
        found[(obj.device.type, st.data_ptr())] = st.nbytes()
    elif isinstance(obj, dict):
        for v in obj.values():
            _tensors(v, found)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _tensors(v, found)
    return found


@dataclass
class EntryBytes:
    """One entry of a checkpoint as ``torch.save`` writes it, bytes.

    file_bytes:    what ``torch.save`` wrote for it (:func:`saved_bytes`)
    tensor_bytes:  the bytes of its tensors' storages, the payload
    tensors:       how many tensors it holds
    """

    file_bytes: int
    tensor_bytes: int
    tensors: int

    @property
    def overhead(self) -> int:
        """file_bytes - tensor_bytes: the container (zip records, pickle, alignment), bytes."""
        return self.file_bytes - self.tensor_bytes


def entry_bytes(obj) -> EntryBytes:
    """Split what ``torch.save`` writes for ``obj`` into its tensors' bytes and the container around them."""
    found = _tensors(obj, {})
    return EntryBytes(saved_bytes(obj), sum(found.values()), len(found))


@dataclass
class ContainerCost:
    """What ``torch.save``'s zip container adds around the tensors, measured, bytes.

    fixed:       the file of an empty dict: the zip's records that every file has (the pickle,
                 format version, byte order, storage alignment, serialization id) and its directory
    per_tensor:  each further tensor: its own zip record (a local header and a directory
                 entry, both naming it), padding that aligns its data to 64 bytes, and its
                 line in the pickle
    """

    fixed: int
    per_tensor: float


def container_cost(tensors: int = 16) -> ContainerCost:
    """Measure :class:`ContainerCost` by saving ``{}`` and a dict of ``tensors`` one-number tensors."""
    from ..checks import count

    n = count("tensors", tensors, maximum=10_000)
    fixed = saved_bytes({})
    many = {f"t{i}": torch.zeros(1) for i in range(n)}
    return ContainerCost(fixed, (saved_bytes(many) - fixed - 4 * n) / n)


@dataclass
class TwoCrashes:
    """What the two kills left: the steps involved and each job's result (``run_training``'s dict)."""

    kill_step: int      #: the step after which the first kill was aimed
    last_logged: int    #: the last step that finished before the first kill
    resumed_from: int   #: the step of the last complete checkpoint after the first kill
    save_step: int      #: the step whose save the second kill interrupted
    first: dict
    second: dict
    leftovers: list     #: names of the temporary files the second kill left behind


def crash_twice(crash_dir, copies=(), seed: int = 7, steps: int = 60, save_every: int = 5,
                progress=None) -> TwoCrashes:
    """Kill a job at a random step (12-28), copy the moment to each of ``copies``, resume, kill it mid-save.

    ``progress`` optionally wraps the two phases (``lessonlib.progress.progress``).
    Raises RuntimeError if a kill did not land (the job finished first).
    """
    from ..checks import count, function, path, sequence

    crash_dir = path("crash_dir", crash_dir)
    copies = [path(f"copies[{i}]", c) for i, c in enumerate(sequence("copies", copies, allow_empty=True))]
    seed = count("seed", seed, minimum=0)
    steps, save_every = count("steps", steps, maximum=10_000), count("save_every", save_every, maximum=10_000)
    if progress is not None:
        function("progress", progress)
    chooser = random.Random(seed)  # the "random moments", seeded so the page is reproducible
    phases = ["crash at a random moment", "resume, then crash in the middle of a save"]
    out = {}
    for phase in (phases if progress is None else progress(phases, desc="two crashes")):
        if phase == phases[0]:  # after a random step: mid-step or mid-save, whatever it hits
            out["kill_step"] = chooser.randint(12, 28)
            out["first"] = run_training(crash_dir, kill_at=f"step {out['kill_step']}",
                                        kill_delay=chooser.uniform(0, 0.05), steps=steps, save_every=save_every,
                                        step_seconds=0.05)
            if not out["first"]["killed"]:
                raise RuntimeError("the first kill did not land: the job finished first")
            out["last_logged"] = max(read_losses(crash_dir))
            out["resumed_from"] = load_checkpoint(crash_dir)["step"]
            for dst in copies:  # copies of this moment, to try incomplete restores later
                copy_run(crash_dir, dst)
        else:
            out["save_step"] = out["resumed_from"] + save_every * chooser.randint(2, 4)
            out["second"] = run_training(crash_dir, kill_at=f"saving {out['save_step']}",
                                         kill_delay=chooser.uniform(0.2, 0.6), resume=True, steps=steps,
                                         save_every=save_every, slow_save_seconds=1.5,
                                         slow_save_from=out["save_step"])  # only that save is slowed
            if not out["second"]["killed"]:
                raise RuntimeError("the second kill did not land: the save finished first")
    leftovers = sorted(p.name for p in crash_dir.glob("*.tmp"))
    return TwoCrashes(leftovers=leftovers, **out)
