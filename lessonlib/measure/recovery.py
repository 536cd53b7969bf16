"""Recovery checkpoints: a real training job that crashes and resumes exactly.

:func:`train` is a small training job with dropout, Adam, a learning-rate
schedule, data augmentation from numpy and Python RNGs and a data cursor. It
runs as its own process (``python -m lessonlib.measure.recovery``);
:class:`TrainingProcess` starts it, watches what it reports and can kill it
with ``SIGKILL`` at a chosen step or in the middle of a save. Saving itself is
:mod:`lessonlib.measure.checkpoint`; how often to save is
:mod:`lessonlib.calc.reliability`.

Large sharded jobs save with ``torch.distributed.checkpoint`` (every rank
writes its own shards, and a metadata file written last marks the checkpoint
complete); the ideas here are the same on one process.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .checkpoint import CHECKPOINT_NAME, atomic_save, capture_rng_state, load_checkpoint, restore_rng_state

LOSS_LOG = "losses.txt"

#: What a resume restores: everything, only the model weights, or everything but the RNGs.
RESTORE_MODES = ("all", "weights", "no-rng")


def _build(seed: int, steps: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    features = torch.randn(512, 16, generator=g)
    true_w = torch.randn(16, 1, generator=g)
    targets = torch.tanh(features @ true_w) + 0.1 * torch.randn(512, 1, generator=g)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2),
                          nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, steps // 3), gamma=0.5)
    return model, optimizer, scheduler, features, targets


def _batch(features, targets, data: dict, seed: int, batch_size: int = 32):
    """The next batch from a data cursor ``{"epoch", "position"}`` (advanced in place).

    The order inside an epoch is a permutation seeded by the epoch number, so
    the cursor alone says where the data stream is.
    """
    import torch

    n = features.shape[0]
    if data["position"] + batch_size > n:
        data["epoch"] += 1
        data["position"] = 0
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + data["epoch"]))
    idx = order[data["position"]:data["position"] + batch_size]
    data["position"] += batch_size
    return features[idx], targets[idx]


def train(run_dir, steps: int = 60, save_every: int = 5, seed: int = 0, resume: bool = False,
          restore: str = "all", slow_save_seconds: float = 0.0, stop_after: int | None = None,
          step_seconds: float = 0.0, out=None) -> list[float]:
    """A small, fully seeded training job that saves a resumable checkpoint.

    Every step draws from three RNGs (dropout: torch; input noise: numpy;
    feature scaling: Python's ``random``) and reads the next batch from a data
    cursor. After every ``save_every`` steps it saves model, optimizer,
    scheduler, all RNG states, the step and the data cursor with
    :func:`atomic_save` into ``run_dir/checkpoint.pt``. Each step's loss is
    appended to ``run_dir/losses.txt`` as ``step float.hex`` (exact), and
    progress lines (``step N``, ``saving N``, ``saved N``, ``done``) go to
    ``out`` (stdout by default) for a parent process to watch.

    ``resume=True`` continues from the checkpoint in ``run_dir``; ``restore``
    says what is put back (:data:`RESTORE_MODES`): ``"all"``; ``"weights"``
    (model weights only: the optimizer, schedule and RNGs start fresh; the
    step and data cursor are kept so the comparison is fair); ``"no-rng"``
    (everything but the RNG states). ``stop_after`` ends the run early after
    that step (a clean interruption; the schedule still plans for ``steps``).
    ``step_seconds`` pads each step to about that many seconds, like a bigger
    model's step: the toy step takes about a millisecond, far less than it
    takes a parent process to react to a progress line, so without padding a
    kill "at step 20" would land many steps later.
    Returns the losses of the steps it ran.

    It seeds every RNG itself and uses one CPU thread (restored on return), so
    it gives the same numbers in a fresh process or called in-process.
    """
    import numpy as np
    import torch

    if restore not in RESTORE_MODES:
        raise ValueError(f"restore must be one of {RESTORE_MODES}, got {restore!r}")
    if steps < 1 or save_every < 1:
        raise ValueError(f"steps and save_every must be positive, got {steps!r}, {save_every!r}")
    out = out or sys.stdout
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same arithmetic order in every process
    try:
        random.seed(seed)
        np.random.seed(seed)
        model, optimizer, scheduler, features, targets = _build(seed, steps)
        start, data = 0, {"epoch": 0, "position": 0}
        ckpt_path = run_dir / CHECKPOINT_NAME
        if resume and ckpt_path.exists():
            state = load_checkpoint(ckpt_path)
            model.load_state_dict(state["model"])
            if restore in ("all", "no-rng"):
                optimizer.load_state_dict(state["optimizer"])
                scheduler.load_state_dict(state["scheduler"])
            if restore == "all":
                restore_rng_state(state["rng"])
            start, data = int(state["step"]), dict(state["data"])
            print(f"resumed {start}", file=out, flush=True)
        losses = []
        model.train()
        with open(run_dir / LOSS_LOG, "a") as log:
            last = steps if stop_after is None else min(steps, stop_after)
            for step in range(start + 1, last + 1):
                x, y = _batch(features, targets, data, seed)
                x = x + torch.from_numpy(np.random.normal(0.0, 0.05, size=tuple(x.shape)).astype(np.float32))
                x = x * random.uniform(0.9, 1.1)
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                value = loss.item()
                losses.append(value)
                log.write(f"{step} {value.hex()}\n")
                log.flush()
                print(f"step {step}", file=out, flush=True)
                if step_seconds > 0:
                    time.sleep(step_seconds)
                if step % save_every == 0:
                    print(f"saving {step}", file=out, flush=True)
                    atomic_save({
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "rng": capture_rng_state(),
                        "step": step,
                        "data": dict(data),
                    }, ckpt_path, slow_write_seconds=slow_save_seconds)
                    print(f"saved {step}", file=out, flush=True)
    finally:
        torch.set_num_threads(threads)
    print("done", file=out, flush=True)
    return losses


def read_losses(run_dir) -> dict[int, float]:
    """The loss of every step in ``run_dir/losses.txt``: ``{step: loss}``.

    A step that ran twice (before a crash and again after the resume) keeps
    its last value, the one the finished job stands on.
    """
    losses: dict[int, float] = {}
    path = Path(run_dir) / LOSS_LOG
    if not path.exists():
        return losses
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                losses[int(parts[0])] = float.fromhex(parts[1])
            except ValueError:
                pass  # a line cut short by a kill
    return dict(sorted(losses.items()))


def copy_run(src, dst) -> Path:
    """Copy a run folder (checkpoint and loss log), e.g. to resume it two ways."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.tmp"))
    return Path(dst)


class TrainingProcess:
    """:func:`train` in a child process (``python -m lessonlib.measure.recovery``).

    Use it as a context manager: the child is always killed and reaped on
    exit, even when a cell fails. :meth:`wait_for` reads the child's progress
    lines until one matches; :meth:`kill` sends ``SIGKILL`` (on Windows,
    ``TerminateProcess``), which the child cannot catch or clean up after.
    """

    def __init__(self, run_dir, steps: int = 60, save_every: int = 5, seed: int = 0,
                 resume: bool = False, restore: str = "all", slow_save_seconds: float = 0.0,
                 step_seconds: float = 0.0):
        cmd = [sys.executable, "-m", "lessonlib.measure.recovery", str(run_dir), "--steps", str(steps),
               "--save-every", str(save_every), "--seed", str(seed), "--restore", restore,
               "--slow-save", str(slow_save_seconds), "--step-seconds", str(step_seconds)]
        if resume:
            cmd.append("--resume")
        self.lines: list[str] = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait_for(self, line: str, timeout: float = 120.0) -> bool:
        """Read progress lines until ``line`` appears (True) or the child ends (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.proc.stdout.readline()
            if not got:
                return False
            got = got.strip()
            self.lines.append(got)
            if got == line:
                return True
        raise TimeoutError(f"no {line!r} from the training process within {timeout} s")

    def kill(self) -> None:
        """Kill the child with SIGKILL and reap it."""
        if self.proc.poll() is None:
            if hasattr(signal, "SIGKILL"):
                os.kill(self.proc.pid, signal.SIGKILL)
            else:  # pragma: no cover - Windows
                self.proc.kill()
        self.proc.wait()

    def finish(self, timeout: float = 300.0) -> int:
        """Wait for the child to end; raise with its stderr if it failed."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self.lines += [l.strip() for l in out.splitlines()]
        if self.proc.returncode != 0:
            raise RuntimeError(f"training process failed (exit {self.proc.returncode}):\n{err[-3000:]}")
        return self.proc.returncode

    def close(self) -> None:
        self.kill()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()

    @property
    def killed_by_sigkill(self) -> bool:
        return self.proc.returncode == -getattr(signal, "SIGKILL", 9)


def run_training(run_dir, kill_at: str | None = None, kill_delay: float = 0.0, **kwargs) -> dict:
    """Run :func:`train` in a child process, optionally killing it.

    ``kill_at`` is a progress line to wait for (``"step 23"``, ``"saving 25"``);
    the child is killed with SIGKILL ``kill_delay`` seconds after it appears.
    ``kwargs`` go to :class:`TrainingProcess`. Returns a dict: ``killed``
    (bool), ``last_saved`` (the last step the child reported saved, or None)
    and ``lines`` (the progress lines it printed).
    """
    with TrainingProcess(run_dir, **kwargs) as p:
        if kill_at is None:
            p.finish()
            killed = False
        else:
            if not p.wait_for(kill_at):
                raise RuntimeError(f"the training process ended before {kill_at!r}")
            if kill_delay > 0:
                time.sleep(kill_delay)
            p.kill()
            killed = p.killed_by_sigkill
        saved = [int(l.split()[1]) for l in p.lines if l.startswith("saved ")]
        return {"killed": killed, "last_saved": saved[-1] if saved else None, "lines": list(p.lines)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lessonlib.measure.recovery",
                                     description="Run the small resumable training job.")
    parser.add_argument("run_dir")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--restore", choices=RESTORE_MODES, default="all")
    parser.add_argument("--slow-save", type=float, default=0.0,
                        help="spread each save over this many seconds (demonstrations)")
    parser.add_argument("--stop-after", type=int, default=None, help="end cleanly after this step")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="pad each step to this long")
    a = parser.parse_args(argv)
    train(a.run_dir, steps=a.steps, save_every=a.save_every, seed=a.seed, resume=a.resume,
          restore=a.restore, slow_save_seconds=a.slow_save, stop_after=a.stop_after,
          step_seconds=a.step_seconds)


if __name__ == "__main__":
    main()
