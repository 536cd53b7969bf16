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

from ..checks import amount, choice, count, flag, instance, path as check_path
from .checkpoint import (KEEP, CheckpointError, atomic_save, capture_rng_state, check_rng_state,
                         checkpoint_files, load_checkpoint, load_latest, newest_checkpoint,
                         remove_stray_temporaries, restore_rng_state, save_checkpoint)

LOSS_LOG = "losses.txt"

#: What a resume restores: everything, only the model weights, or everything but the RNGs.
RESTORE_MODES = ("all", "weights", "no-rng")

#: The toy job's stated limits: its steps take about a millisecond each, so
#: 10 000 steps is some seconds; padding and slowed saves are for demonstrations.
MAX_STEPS = 10_000
MAX_STEP_SECONDS = 10.0
MAX_SLOW_SAVE_SECONDS = 60.0
N_EXAMPLES = 512
BATCH_SIZE = 32


def _check_job_args(run_dir, steps, save_every, seed, resume, restore, slow_save_seconds, stop_after,
                   step_seconds, keep, slow_save_from=0) -> dict:
    """Check :func:`train`'s arguments (also before a child process is started); return them cleaned."""
    return dict(
        run_dir=check_path("run_dir", run_dir),
        steps=count("steps", steps, maximum=MAX_STEPS),
        save_every=count("save_every", save_every, maximum=MAX_STEPS),
        seed=count("seed", seed, minimum=0, maximum=2**32 - 1),
        resume=flag("resume", resume),
        restore=choice("restore", restore, RESTORE_MODES),
        slow_save_seconds=amount("slow_save_seconds", slow_save_seconds, maximum=MAX_SLOW_SAVE_SECONDS),
        slow_save_from=count("slow_save_from", slow_save_from, minimum=0, maximum=MAX_STEPS),
        stop_after=None if stop_after is None else count("stop_after", stop_after, maximum=MAX_STEPS),
        step_seconds=amount("step_seconds", step_seconds, maximum=MAX_STEP_SECONDS),
        keep=count("keep", keep, maximum=1000),
    )


def check_state(state: dict, steps: int) -> dict:
    """Refuse a loaded training state with impossible values (:class:`CheckpointError`).

    A checkpoint can pass its checksum and still be wrong: written by a buggy
    job, or edited by hand. Before anything is restored: every part present;
    ``1 <= step <= steps``; a data cursor with ``epoch >= 0`` and
    ``0 <= position <= N_EXAMPLES``; a complete RNG state.
    """
    instance("state", state, dict, "a dict (a loaded checkpoint)")
    steps = count("steps", steps, maximum=MAX_STEPS)
    missing = [k for k in ("model", "optimizer", "scheduler", "rng", "step", "data") if k not in state]
    if missing:
        raise CheckpointError(f"the state has no {', '.join(map(repr, missing))}: it cannot resume exactly")
    step = state["step"]
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= steps:
        raise CheckpointError(f"step {step!r} is impossible for this run: it must be a whole number from 1 to "
                              f"{steps} (the run's steps)")
    data = state["data"]
    if not isinstance(data, dict) or set(data) != {"epoch", "position"}:
        raise CheckpointError(f"the data cursor {data!r} must be a dict with 'epoch' and 'position'")
    for key, top in (("epoch", step * BATCH_SIZE // N_EXAMPLES + 1), ("position", N_EXAMPLES)):
        v = data[key]
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= top:
            raise CheckpointError(f"the data cursor's {key} {v!r} is impossible: it must be from 0 to {top}")
    check_rng_state(state["rng"])
    return state


def _build(seed: int, steps: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    features = torch.randn(N_EXAMPLES, 16, generator=g)
    true_w = torch.randn(16, 1, generator=g)
    targets = torch.tanh(features @ true_w) + 0.1 * torch.randn(512, 1, generator=g)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2),
                          nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, steps // 3), gamma=0.5)
    return model, optimizer, scheduler, features, targets


def _batch(features, targets, data: dict, seed: int, batch_size: int = BATCH_SIZE):
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
          step_seconds: float = 0.0, out=None, keep: int = KEEP, slow_save_from: int = 0) -> list[float]:
    """A small, fully seeded training job that saves resumable checkpoints.

    Every step draws from three RNGs (dropout: torch; input noise: numpy;
    feature scaling: Python's ``random``) and reads the next batch from a data
    cursor. After every ``save_every`` steps it saves model, optimizer,
    scheduler, all RNG states, the step and the data cursor with
    :func:`~lessonlib.measure.checkpoint.save_checkpoint` into
    ``run_dir/checkpoint-<step>.pt`` (checksummed, atomic, the newest ``keep``
    kept). Each step's loss is appended to ``run_dir/losses.txt`` as
    ``step float.hex`` (exact), and progress lines (``step N``, ``saving N``,
    ``writing N k/20`` during a slowed save, ``saved N``, ``skipped FILE:
    REASON``, ``resumed N``, ``done``) go to ``out`` (stdout by default) for a
    parent process to watch.

    ``resume=True`` continues from the newest checkpoint in ``run_dir`` that
    verifies (checksums, then :func:`check_state`); a damaged or impossible
    newer file is skipped with a ``skipped`` line, and the steps after the
    one resumed from are simply run again. ``restore`` says what is put back
    (:data:`RESTORE_MODES`): ``"all"``; ``"weights"`` (model weights only: the
    optimizer, schedule and RNGs start fresh; the step and data cursor are
    kept so the comparison is fair); ``"no-rng"`` (everything but the RNG
    states). ``stop_after`` ends the run early after that step (a clean
    interruption; the schedule still plans for ``steps``). ``step_seconds``
    pads each step to about that many seconds, like a bigger model's step:
    the toy step takes about a millisecond, far less than it takes a parent
    process to react to a progress line. ``slow_save_seconds`` spreads each
    save over that many seconds (so a kill can land inside it); with
    ``slow_save_from``, only the saves from that step on (the one a kill is
    aimed at: the saves before it take no longer than usual).
    At most :data:`MAX_STEPS` steps. Returns the losses of the steps it ran.

    It seeds every RNG itself and uses one CPU thread (restored on return), so
    it gives the same numbers in a fresh process or called in-process.
    """
    a = _check_job_args(run_dir, steps, save_every, seed, resume, restore, slow_save_seconds, stop_after,
                       step_seconds, keep, slow_save_from)
    if out is not None and not callable(getattr(out, "write", None)):
        raise TypeError(f"out must be a text stream (with a write method) or None, got {out!r}")
    import numpy as np
    import torch

    run_dir, steps, save_every, seed = a["run_dir"], a["steps"], a["save_every"], a["seed"]
    out = out or sys.stdout
    run_dir.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same arithmetic order in every process
    try:
        random.seed(seed)
        np.random.seed(seed)
        model, optimizer, scheduler, features, targets = _build(seed, steps)
        start, data = 0, {"epoch": 0, "position": 0}
        for name in remove_stray_temporaries(run_dir):
            print(f"removed {name}", file=out, flush=True)
        if a["resume"]:
            found = load_latest(run_dir, validate=lambda st: check_state(st, steps),
                                report=lambda line: print(line, file=out, flush=True))
            if found is not None:
                state, path, _ = found
                model.load_state_dict(state["model"])
                if a["restore"] in ("all", "no-rng"):
                    optimizer.load_state_dict(state["optimizer"])
                    scheduler.load_state_dict(state["scheduler"])
                if a["restore"] == "all":
                    restore_rng_state(state["rng"])
                start, data = int(state["step"]), dict(state["data"])
                print(f"resumed {start} from {path.name}", file=out, flush=True)
        losses = []
        model.train()
        with open(run_dir / LOSS_LOG, "a") as log:
            last = steps if a["stop_after"] is None else min(steps, a["stop_after"])
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
                if a["step_seconds"] > 0:
                    time.sleep(a["step_seconds"])
                if step % save_every == 0:
                    print(f"saving {step}", file=out, flush=True)
                    slow = a["slow_save_seconds"] if step >= a["slow_save_from"] else 0.0

                    def written(done, total, step=step, chunk=[0]):
                        chunk[0] += 1
                        if slow > 0:
                            print(f"writing {step} {chunk[0]}/20", file=out, flush=True)

                    save_checkpoint({
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "rng": capture_rng_state(),
                        "step": step,
                        "data": dict(data),
                    }, run_dir, step, keep=a["keep"], slow_write_seconds=slow,
                        on_progress=written)
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
    path = check_path("run_dir", run_dir) / LOSS_LOG
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
    """Copy a run folder (checkpoints and loss log, not stray ``*.tmp`` files), e.g. to resume it two ways."""
    src, dst = check_path("src", src), check_path("dst", dst)
    if not src.is_dir():
        raise ValueError(f"src {str(src)!r} is not a folder")
    if dst.exists():
        raise ValueError(f"dst {str(dst)!r} already exists")
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.tmp"))
    return Path(dst)


class TrainingProcess:
    """:func:`train` in a child process (``python -m lessonlib.measure.recovery``).

    The arguments are :func:`train`'s, checked here before the child starts
    (a mistake is a ``ValueError`` naming the argument, not argparse text from
    the child). Use it as a context manager: the child is always killed and
    reaped on exit, when a cell fails and when it is interrupted
    (``KeyboardInterrupt``, the Jupyter stop button). :meth:`wait_for` reads
    the child's progress lines until one matches; :meth:`kill` sends
    ``SIGKILL`` (on Windows, ``TerminateProcess``), which the child cannot
    catch or clean up after.
    """

    def __init__(self, run_dir, steps: int = 60, save_every: int = 5, seed: int = 0,
                 resume: bool = False, restore: str = "all", slow_save_seconds: float = 0.0,
                 step_seconds: float = 0.0, stop_after: int | None = None, keep: int = KEEP,
                 slow_save_from: int = 0):
        a = _check_job_args(run_dir, steps, save_every, seed, resume, restore, slow_save_seconds, stop_after,
                           step_seconds, keep, slow_save_from)
        cmd = [sys.executable, "-m", "lessonlib.measure.recovery", str(a["run_dir"]), "--steps", str(a["steps"]),
               "--save-every", str(a["save_every"]), "--seed", str(a["seed"]), "--restore", a["restore"],
               "--slow-save", repr(a["slow_save_seconds"]), "--slow-save-from", str(a["slow_save_from"]),
               "--step-seconds", repr(a["step_seconds"]),
               "--keep", str(a["keep"])]
        if a["stop_after"] is not None:
            cmd += ["--stop-after", str(a["stop_after"])]
        if a["resume"]:
            cmd.append("--resume")
        self.lines: list[str] = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait_for(self, line: str, timeout: float = 120.0) -> bool:
        """Read progress lines until ``line`` appears (True) or the child ends (False)."""
        instance("line", line, str, "a progress line such as 'step 7'")
        timeout = amount("timeout", timeout, allow_zero=False)
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
        timeout = amount("timeout", timeout, allow_zero=False)
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
        """Kill and reap the child if it still runs, and close its pipes (safe to call twice)."""
        self.kill()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()

    def __del__(self):  # a TrainingProcess dropped without ``with`` still leaves no child behind
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            try:
                proc.kill()
                proc.wait(timeout=5)
            except Exception:
                pass

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
    if kill_at is not None:
        instance("kill_at", kill_at, str, "a progress line such as 'step 7', or None")
    kill_delay = amount("kill_delay", kill_delay, maximum=MAX_STEP_SECONDS * 10)
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
    parser.add_argument("--slow-save-from", type=int, default=0, help="slow only the saves from this step on")
    parser.add_argument("--stop-after", type=int, default=None, help="end cleanly after this step")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="pad each step to this long")
    parser.add_argument("--keep", type=int, default=KEEP, help="complete checkpoints to keep")
    a = parser.parse_args(argv)
    try:
        train(a.run_dir, steps=a.steps, save_every=a.save_every, seed=a.seed, resume=a.resume,
              restore=a.restore, slow_save_seconds=a.slow_save, stop_after=a.stop_after,
              step_seconds=a.step_seconds, keep=a.keep, slow_save_from=a.slow_save_from)
    except CheckpointError as err:  # every checkpoint damaged: say so plainly, no traceback
        sys.exit(f"cannot resume: {err}")


if __name__ == "__main__":
    main()
