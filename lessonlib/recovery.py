"""Recovery checkpoints: save a training job so that it can resume exactly.

Three parts:

* **How often to save** (pure Python, no torch needed at import):
  :func:`young_daly_interval`, :func:`expected_overhead` and a Monte-Carlo
  check of the formula, :func:`simulate_overhead`. Times are in seconds.
* **What to save and how**: :func:`capture_rng_state` / :func:`restore_rng_state`
  (torch, CUDA, numpy and Python RNGs, as tensors so that
  ``torch.load(weights_only=True)`` accepts them), :func:`atomic_save`
  (temporary file, ``fsync``, ``os.replace``) and :func:`load_checkpoint`
  (always ``weights_only=True``: a checkpoint is a pickle, and an arbitrary
  pickle can run code when loaded).
* **A real crash**: :func:`train` is a small training job with dropout, Adam,
  a learning-rate schedule, data augmentation from numpy and Python RNGs and a
  data cursor. It runs as its own process (``python -m lessonlib.recovery``);
  :class:`TrainingProcess` starts it, watches what it reports and can kill it
  with ``SIGKILL`` at a chosen step or in the middle of a save.

Large sharded jobs save with ``torch.distributed.checkpoint`` (every rank
writes its own shards, and a metadata file written last marks the checkpoint
complete); the ideas here are the same on one process.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .checks import positive

__all__ = [
    "young_daly_interval",
    "expected_overhead",
    "simulate_overhead",
    "capture_rng_state",
    "restore_rng_state",
    "atomic_save",
    "load_checkpoint",
    "CHECKPOINT_NAME",
    "RESTORE_MODES",
    "train",
    "TrainingProcess",
    "run_training",
    "run_many",
    "plot_resume_comparison",
    "read_losses",
    "copy_run",
]

CHECKPOINT_NAME = "checkpoint.pt"
LOSS_LOG = "losses.txt"
#: What a resume restores: everything, only the model weights, or everything but the RNGs.
RESTORE_MODES = ("all", "weights", "no-rng")


# ---------------------------------------------------------------------------
# How often to save: pure calculations
# ---------------------------------------------------------------------------

def young_daly_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """Young's optimal time between recovery checkpoints, in seconds:
    ``sqrt(2 * checkpoint_seconds * mtbf_seconds)``.

    ``checkpoint_seconds`` is how long one save stalls training; ``mtbf_seconds``
    the mean time between failures of the whole job. It minimises
    :func:`expected_overhead` (Young 1974; Daly 2006 refines it for saves that
    are not small next to the MTBF). Raises ``ValueError`` for non-positive input.

    >>> young_daly_interval(300, 86400)   # 5-minute save, one failure a day: 2 hours
    7200.0
    """
    c = positive("checkpoint_seconds", checkpoint_seconds)
    m = positive("mtbf_seconds", mtbf_seconds)
    return math.sqrt(2.0 * c * m)


def expected_overhead(interval_seconds: float, checkpoint_seconds: float, mtbf_seconds: float,
                      restart_seconds: float = 0.0) -> float:
    """Expected time lost to checkpointing and failures, as a fraction of the
    useful work time (first order; 0.05 means the run takes 5 % longer).

    Over one interval of ``interval_seconds`` of useful work the job pays

    * ``checkpoint_seconds / interval_seconds``: the saves themselves (large
      when saving too often), and
    * ``(interval_seconds / 2 + restart_seconds) / mtbf_seconds``: a failure
      arrives on average half-way through an interval, so half an interval of
      work is redone, plus the restart (large when saving too rarely).

    The sum is a plain fraction; it is minimised at
    :func:`young_daly_interval`. Valid when the interval and the save are
    small next to the MTBF; :func:`simulate_overhead` checks it.
    ``restart_seconds`` may be zero; the others must be positive.
    """
    t = positive("interval_seconds", interval_seconds)
    c = positive("checkpoint_seconds", checkpoint_seconds)
    m = positive("mtbf_seconds", mtbf_seconds)
    if isinstance(restart_seconds, bool) or not isinstance(restart_seconds, (int, float)) \
            or not math.isfinite(restart_seconds) or restart_seconds < 0:
        raise ValueError(f"restart_seconds must be a non-negative number of seconds, got {restart_seconds!r}")
    return c / t + (t / 2.0 + restart_seconds) / m


def simulate_overhead(interval_seconds: float, checkpoint_seconds: float, mtbf_seconds: float,
                      work_seconds: float, restart_seconds: float = 0.0, trials: int = 200,
                      seed: int = 0) -> float:
    """Monte-Carlo measurement of the fraction of time lost, to compare with
    :func:`expected_overhead`.

    Simulates ``trials`` jobs that need ``work_seconds`` of useful work, save
    every ``interval_seconds`` of work (each save takes ``checkpoint_seconds``),
    and fail at exponentially distributed times with mean ``mtbf_seconds``
    (a failure loses the work since the last completed save and costs
    ``restart_seconds``). Returns the mean of (wall time − work) / work, the
    same quantity :func:`expected_overhead` approximates.
    """
    t = positive("interval_seconds", interval_seconds)
    c = positive("checkpoint_seconds", checkpoint_seconds)
    m = positive("mtbf_seconds", mtbf_seconds)
    w = positive("work_seconds", work_seconds)
    if restart_seconds < 0:
        raise ValueError(f"restart_seconds must be non-negative, got {restart_seconds!r}")
    if not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be a positive integer, got {trials!r}")
    rng = random.Random(seed)
    losses = []
    for _ in range(trials):
        wall, done = 0.0, 0.0
        next_failure = rng.expovariate(1.0 / m)
        while done < w:
            chunk = min(t, w - done)
            cost = chunk + (c if done + chunk < w else 0.0)  # no save after the last chunk
            if wall + cost <= next_failure:
                wall += cost
                done += chunk
            else:  # fail part-way: lose this chunk, restart, new failure clock
                wall = next_failure + restart_seconds
                next_failure = wall + rng.expovariate(1.0 / m)
        losses.append((wall - w) / w)
    return sum(losses) / len(losses)


# ---------------------------------------------------------------------------
# What to save, and saving it safely
# ---------------------------------------------------------------------------

def capture_rng_state() -> dict:
    """Every RNG state a training step may draw from, as tensors and plain types.

    ``torch`` (CPU generator, a ``uint8`` tensor), ``cuda`` (one per GPU, when
    present), ``numpy`` (the legacy global generator's Mersenne-Twister key as
    an ``int64`` tensor plus its position) and ``python`` (``random``'s state
    as an ``int64`` tensor). numpy's own state object holds an ``ndarray``,
    which ``torch.load(weights_only=True)`` refuses, hence the tensors.
    """
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, py_state, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": version, "state": torch.tensor(py_state, dtype=torch.int64),
                   "gauss_next": gauss_next},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Put back what :func:`capture_rng_state` captured."""
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["state"].tolist()), p["gauss_next"]))


def atomic_save(obj, path, slow_write_seconds: float = 0.0) -> Path:
    """Save ``obj`` with ``torch.save`` so that ``path`` is always complete.

    The bytes go to a temporary file in the same folder; it is flushed and
    ``os.fsync``-ed (the data is on disk, not only in the page cache), then
    ``os.replace`` renames it over ``path`` in one step, and the folder is
    synced so the rename itself survives a power cut. A crash at any moment
    leaves either the previous complete file or the new one, never half of
    one (at worst a stray ``*.tmp`` file, which :func:`load_checkpoint` ignores).

    ``slow_write_seconds`` spreads the writing over that many seconds (for
    demonstrations: it gives a kill time to land in the middle of a save).
    Returns the path.
    """
    import io

    import torch

    path = Path(path)
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getbuffer()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            chunks = 20 if slow_write_seconds > 0 else 1
            step = math.ceil(len(data) / chunks)
            for i in range(0, len(data), step):
                f.write(data[i:i + step])
                if slow_write_seconds > 0:
                    f.flush()
                    time.sleep(slow_write_seconds / chunks)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    if hasattr(os, "O_DIRECTORY"):  # POSIX: make the rename durable too
        dfd = os.open(path.parent, os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return path


def load_checkpoint(path, map_location="cpu") -> dict:
    """Load a checkpoint with ``torch.load(weights_only=True)``.

    ``weights_only=True`` unpickles only tensors, containers and plain types:
    a checkpoint is a pickle, and a crafted pickle runs code when loaded.
    ``path`` may be a file or a run folder (then its ``checkpoint.pt``).
    """
    import torch

    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    return torch.load(path, map_location=map_location, weights_only=True)


# ---------------------------------------------------------------------------
# The training job (runs in its own process)
# ---------------------------------------------------------------------------

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
    """:func:`train` in a child process (``python -m lessonlib.recovery``).

    Use it as a context manager: the child is always killed and reaped on
    exit, even when a cell fails. :meth:`wait_for` reads the child's progress
    lines until one matches; :meth:`kill` sends ``SIGKILL`` (on Windows,
    ``TerminateProcess``), which the child cannot catch or clean up after.
    """

    def __init__(self, run_dir, steps: int = 60, save_every: int = 5, seed: int = 0,
                 resume: bool = False, restore: str = "all", slow_save_seconds: float = 0.0,
                 step_seconds: float = 0.0):
        cmd = [sys.executable, "-m", "lessonlib.recovery", str(run_dir), "--steps", str(steps),
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


def run_many(jobs: dict) -> dict:
    """Run several :func:`train` jobs side by side, each in its own process.

    ``jobs`` maps a name to :class:`TrainingProcess` keyword arguments (with
    ``run_dir``). Waits for all; every child is reaped even if one fails.
    Returns ``{name: progress lines}``.
    """
    from contextlib import ExitStack

    with ExitStack() as stack:
        procs = {name: stack.enter_context(TrainingProcess(**kw)) for name, kw in jobs.items()}
        for p in procs.values():
            p.finish()
        return {name: list(p.lines) for name, p in procs.items()}


def plot_resume_comparison(reference: dict, resumed: dict, resumed_from: int | None = None,
                           title: str = "Resuming after a crash: what each restore gives"):
    """Loss per step of resumed runs against the uninterrupted ``reference``.

    ``reference`` and each value of ``resumed`` are ``{step: loss}`` (from
    :func:`read_losses`); ``resumed`` maps a label to one run. Top panel: the
    losses; bottom panel: the absolute difference from the reference (zero
    where the resume is exact). Returns the matplotlib figure.
    """
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    steps = list(reference)
    top.plot(steps, [reference[s] for s in steps], color="black", lw=2.5, alpha=0.35,
             label="uninterrupted run")
    styles = ["-", "--", "-.", ":"]
    for i, (label, run) in enumerate(resumed.items()):
        xs = [s for s in steps if s in run]
        top.plot(xs, [run[s] for s in xs], styles[i % len(styles)], lw=1.3, label=label)
        bottom.plot(xs, [abs(run[s] - reference[s]) for s in xs], styles[i % len(styles)], lw=1.3, label=label)
    for ax in (top, bottom):
        if resumed_from is not None:
            ax.axvline(resumed_from + 0.5, color="grey", ls=":", lw=1)
        ax.grid(alpha=0.3)
    if resumed_from is not None:
        top.text(resumed_from + 1, top.get_ylim()[1], "resumed from the checkpoint", va="top", fontsize=8, color="grey")
    top.set_ylabel("training loss (MSE)")
    top.legend(fontsize=8)
    bottom.set_ylabel("|loss − uninterrupted loss|")
    bottom.set_xlabel("training step")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lessonlib.recovery",
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
