"""Recovery checkpoints for sharded state, with ``torch.distributed.checkpoint`` (DCP).

With ``fully_shard`` no process holds the whole model or optimizer, so no
process can ``torch.save`` it alone. DCP writes each rank's shards in
parallel, with metadata that records which slice of which tensor each file
holds; loading reads the slices each *new* rank needs, so the state can be
loaded on a different number of processes than saved it (resharding).

* :func:`save_sharded` - train :data:`~lessonlib.measure.distributed.fsdp.MODEL`
  with ``fully_shard`` on ``world_size`` processes for a few steps, save model
  and optimizer with ``dcp.save``, and return, for comparison, the same state
  gathered whole (``full_state_dict=True``), the loss the next step starts from and the loss after it.
* :func:`load_unsharded` - load the checkpoint into one ordinary process,
  with no process group: an unsharded model and optimizer.
* :func:`load_sharded` - load it into ``fully_shard`` on another number of
  processes, and gather the result whole to check it.
* :func:`compare_states` - largest difference between two state dicts.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
import os
import time
import warnings
from pathlib import Path

from ...checks import count as check_count, path as check_path, positive as check_positive
from ..compat import require_all
from .launch import launch
from .fsdp import build_model, shard_model, token_batch
from .quiet import known_warnings_silenced

__all__ = ["save_sharded", "load_unsharded", "load_sharded", "compare_states", "checkpoint_files", "ShardFile", "shard_file_contents"]


#: Rounds of (``dcp.async_save``, ``dcp.save``) that :func:`save_sharded` times when given ``async_path``.
SAVE_ROUNDS = 3


def _save_worker(rank, world_size, device, progress, path, steps, global_batch, lr, async_path):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from ..models import lm_loss

    with known_warnings_silenced():
        mesh = init_device_mesh(device.type, (world_size,))
        model = shard_model(build_model().to(device), mesh, reshard=True)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        x, y = (t.to(device) for t in token_batch(global_batch))
        share = global_batch // world_size
        xs, ys = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]

        def step():
            opt.zero_grad(set_to_none=True)
            loss = lm_loss(model(xs), ys)
            loss.backward()
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            return mean.item() / world_size

        losses = [step() for _ in range(steps)]
        model_sd, optim_sd = get_state_dict(model, opt)  # each rank: its own shards (DTensors)
        state = {"model": model_sd, "optim": optim_sd}

        def timed_save():
            dist.barrier()  # every process starts the save together: its time is the stop a run pays for it
            t0 = time.perf_counter()
            dcp.save(state, checkpoint_id=path)
            return time.perf_counter() - t0

        def timed_async_save():
            dist.barrier()
            t0 = time.perf_counter()
            future = dcp.async_save(state, checkpoint_id=async_path)
            blocking = time.perf_counter() - t0  # what training waits for: planning, and staging in CPU memory
            future.result()  # the files are written (a run would wait here only before its next save)
            return blocking, time.perf_counter() - t0

        if async_path is None:
            save_seconds, async_seconds = timed_save(), None
        else:  # rounds of both, in turn; each keeps its fastest round (other programs only add time)
            with warnings.catch_warnings():  # each round overwrites the last on purpose; torch warns that it does
                warnings.filterwarnings("ignore", message="Detected an existing checkpoint", category=UserWarning)
                rounds = [(timed_async_save(), timed_save()) for _ in range(SAVE_ROUNDS)]
            save_seconds = min(t for _, t in rounds)
            async_seconds = min(a for a, _ in rounds)
        local_bytes = sum(v.to_local().numel() * v.element_size() for v in model_sd.values() if hasattr(v, "to_local"))
        full_model, full_optim = get_state_dict(
            model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        full_optim = copy.deepcopy(full_optim)  # some entries (the step counters) are the live tensors: the step below moves them
        with torch.no_grad():  # the loss the next step starts from, on the whole batch
            next_loss = lm_loss(model(xs), ys).detach().clone()
        dist.all_reduce(next_loss)
        step()  # one step more from the saved state, to compare with a resumed run's first step
        with torch.no_grad():
            after_step = lm_loss(model(xs), ys).detach().clone()
        dist.all_reduce(after_step)
        progress.put(1)
    out = {"rank": rank, "losses": losses, "next_loss": next_loss.item() / world_size,
           "after_step_loss": after_step.item() / world_size, "local_model_bytes": local_bytes,
           "save_seconds": save_seconds, "async_seconds": async_seconds}
    if rank == 0:
        out["full_model"] = {k: v.clone() for k, v in full_model.items()}
        out["full_optim"] = full_optim
    return out


def save_sharded(path, world_size: int = 2, steps: int = 3, global_batch: int = 8, lr: float = 1e-3,
                 timeout: float = 180.0, async_path=None) -> dict:
    """Train with ``fully_shard`` on ``world_size`` processes and save a DCP checkpoint in folder ``path``.

    Returns ``{"losses", "next_loss", "after_step_loss" (the loss after one more step, taken after the
    saves), "local_model_bytes" (per rank: bytes
    of model shards each rank wrote), "save_seconds" (per rank: how long its
    ``dcp.save`` took, from a common start), "async_seconds", "full_model", "full_optim"}``; the
    last two are the state gathered whole on rank 0, for checking a load.

    With ``async_path`` (another folder) the same state is saved :data:`SAVE_ROUNDS` times each way, in
    turn: with ``dcp.async_save`` into ``async_path``, then with ``dcp.save`` into ``path``. Then
    ``save_seconds`` is each rank's fastest ``dcp.save``, and ``async_seconds`` holds, per rank, the fastest
    round's ``(blocking, total)`` seconds from a common start: until the call returned (the stop a run pays:
    the state staged in CPU memory) and until its files were written. Without it ``async_seconds`` is ``None``.
    """
    from ..precision import MAX_LR
    from .fsdp import MAX_GLOBAL_BATCH, MAX_STEPS
    from .launch import MAX_WORLD_SIZE

    world_size = check_count("world_size", world_size, minimum=2, maximum=MAX_WORLD_SIZE)
    steps = check_count("steps", steps, maximum=MAX_STEPS)
    global_batch = check_count("global_batch", global_batch, maximum=MAX_GLOBAL_BATCH)
    if global_batch % world_size:
        raise ValueError(f"global_batch {global_batch} does not divide evenly by world_size={world_size}")
    path = check_path("path", path)
    lr = check_positive("lr", lr, maximum=MAX_LR)  # lr=1e30 trained into a NaN-filled checkpoint
    if async_path is not None:
        async_path = check_path("async_path", async_path)
        if async_path.resolve() == path.resolve():
            raise ValueError(f"async_path must be another folder than path ({str(path)!r}): each save writes its own")
        async_path.mkdir(parents=True, exist_ok=True)
    path.mkdir(parents=True, exist_ok=True)
    require_all('fully_shard')  # before starting processes: one clear error on an older torch
    per_rank = launch(_save_worker, world_size, args=(str(path), steps, global_batch, lr,
                                                      None if async_path is None else str(async_path)),
                      timeout=timeout,
                      progress_total=world_size, desc=f"sharded save from {world_size} processes")
    r0 = per_rank[0]
    return {"losses": r0["losses"], "next_loss": r0["next_loss"], "after_step_loss": r0["after_step_loss"],
            "local_model_bytes": [r["local_model_bytes"] for r in per_rank],
            "save_seconds": [r["save_seconds"] for r in per_rank],
            "async_seconds": None if async_path is None else [r["async_seconds"] for r in per_rank],
            "full_model": r0["full_model"], "full_optim": r0["full_optim"]}


def checkpoint_files(path) -> list:
    """``(name, bytes)`` of each file DCP wrote in ``path``, sorted by name."""
    path = check_path("path", path)
    if not path.is_dir():
        raise ValueError(f"path {str(path)!r} is not a folder")
    return sorted((p.name, p.stat().st_size) for p in path.iterdir() if p.is_file())


@dataclass(frozen=True)
class ShardFile:
    """What one DCP shard file holds, read from the checkpoint's ``.metadata`` (bytes throughout).

    name:        the file (``__<rank>_0.distcp``: written by that process)
    bytes:       its size on disk
    items:       entries written into it (tensor chunks and pickled non-tensor values)
    whole:       of those, tensors written whole, by this process only: a tensor every process holds alike
                 (not sharded, such as Adam's step counter) is written once, by one process
    data_bytes:  the tensors' own values (elements x bytes per element)
    framing:     bytes - data_bytes: each entry's container and header, and the pickled non-tensors
    """

    name: str
    bytes: int
    items: int
    whole: int
    data_bytes: int

    @property
    def framing(self) -> int:
        return self.bytes - self.data_bytes


def shard_file_contents(path) -> list:
    """One :class:`ShardFile` per ``.distcp`` file of the DCP checkpoint in folder ``path``, sorted by name."""
    import math

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = check_path("path", path)
    if not (path / ".metadata").is_file():
        raise ValueError(f"path {str(path)!r} holds no DCP checkpoint (no .metadata)")
    md = dcp.FileSystemReader(str(path)).read_metadata()
    tally = {}
    for index, info in md.storage_data.items():
        t = tally.setdefault(info.relative_path, {"items": 0, "whole": 0, "data": 0})
        t["items"] += 1
        meta = md.state_dict_metadata[index.fqn]
        if isinstance(meta, TensorStorageMetadata):
            chunk = next(c for c in meta.chunks if c.offsets == index.offset)
            t["data"] += math.prod(chunk.sizes) * torch.empty((), dtype=meta.properties.dtype).element_size()
            t["whole"] += len(meta.chunks) == 1
    return [ShardFile(name, (path / name).stat().st_size, t["items"], t["whole"], t["data"])
            for name, t in sorted(tally.items())]


def load_unsharded(path, lr: float = 1e-3):
    """Load the DCP checkpoint in ``path`` into one process: an ordinary model and Adam optimizer.

    No process group is needed: DCP reads every slice into this process's
    full-size tensors. Returns ``(model, optimizer)``.
    """
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = check_path("path", path)
    lr = check_positive("lr", lr)
    if not path.is_dir() or not (path / ".metadata").exists():
        raise ValueError(f"path {str(path)!r} holds no torch.distributed.checkpoint checkpoint (.metadata missing)")
    with known_warnings_silenced():
        model = build_model()
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        model_sd, optim_sd = get_state_dict(model, opt)  # the layout to fill: full-size tensors
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return model, opt


def _load_worker(rank, world_size, device, progress, path, lr):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    with known_warnings_silenced():
        model = shard_model(build_model().to(device), init_device_mesh(device.type, (world_size,)), reshard=True)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        model_sd, optim_sd = get_state_dict(model, opt)  # this process's shards, in the new layout
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)  # each process reads the saved chunks that overlap its rows
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        rows = {k: tuple(v.to_local().shape) for k, v in model.state_dict().items() if hasattr(v, "to_local")}
        full_model, full_optim = get_state_dict(
            model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        progress.put(1)
    out = {"rank": rank, "local_shapes": rows}
    if rank == 0:
        out["full_model"] = {k: v.clone() for k, v in full_model.items()}
        out["full_optim"] = copy.deepcopy(full_optim)
    return out


def load_sharded(path, world_size: int = 3, lr: float = 1e-3, timeout: float = 120.0) -> dict:
    """Load the DCP checkpoint in ``path`` into ``fully_shard`` on ``world_size`` processes (any number:
    each reads the saved chunks that overlap its own rows), then gather it whole on rank 0 to check it.

    Returns ``{"local_shapes" (per rank: each model tensor's local shape), "full_model", "full_optim"}``.
    """
    from .launch import MAX_WORLD_SIZE

    world_size = check_count("world_size", world_size, minimum=2, maximum=MAX_WORLD_SIZE)
    path = check_path("path", path)
    lr = check_positive("lr", lr)
    if not path.is_dir() or not (path / ".metadata").exists():
        raise ValueError(f"path {str(path)!r} holds no torch.distributed.checkpoint checkpoint (.metadata missing)")
    require_all('fully_shard')
    per_rank = launch(_load_worker, world_size, args=(str(path), lr), timeout=timeout,
                      progress_total=world_size, desc=f"sharded load on {world_size} processes")
    return {"local_shapes": [r["local_shapes"] for r in per_rank],
            "full_model": per_rank[0]["full_model"], "full_optim": per_rank[0]["full_optim"]}


def _flatten(prefix, obj, out):
    import torch

    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flatten(f"{prefix}.{i}", v, out)
    return out


def compare_states(a, b) -> dict:
    """Compare two (nested) state dicts: ``{"tensors", "same_keys", "max_diff", "equal"}``.

    ``equal`` is True when the keys match and every tensor is bitwise equal.
    """
    import torch

    fa, fb = _flatten("", a, {}), _flatten("", b, {})
    same = set(fa) == set(fb)
    diffs = [(fa[k].double() - fb[k].double()).abs().max().item() if fa[k].numel() else 0.0
             for k in fa if k in fb and fa[k].shape == fb[k].shape]
    equal = same and all(fa[k].shape == fb[k].shape and torch.equal(fa[k], fb[k]) for k in fa)
    return {"tensors": len(fa), "same_keys": same, "max_diff": max(diffs, default=0.0), "equal": equal}
