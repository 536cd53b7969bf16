"""Recovery checkpoints: a real training job that crashes and resumes exactly.

:func:`train` is a small training job with dropout, Adam, a learning-rate
schedule, data augmentation from numpy and Python RNGs and a data cursor. It
runs as its own process (``python -m lessonlib.measure.recovery``);
:class:`TrainingProcess` starts it, watches what it reports and can kill it
with ``SIGKILL`` at a chosen step or in the middle of a save. Saving itself is
:mod:`lessonlib.measure.checkpoint`; whose run a folder holds, and its one
writer, :mod:`lessonlib.measure.run_folder`; how often to save is
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
from .checkpoint import (KEEP, SET_ASIDE, CheckpointError, atomic_save, capture_rng_state,  # noqa: F401
                         check_checkpoint_paths, check_rng_state, checkpoint_files, load_checkpoint, load_latest,
                         newest_checkpoint, remove_stray_temporaries, restore_rng_state, save_checkpoint)
from .loss_log import LOSS_LOG, append_loss, read_losses, repair_loss_log  # noqa: F401 (read_losses re-exported)
from .run_folder import (LOCK_FILE, RUN_FILE, CheckpointPathError, CheckpointWriteError, FolderInUseError,
                         RunIdentity, RunMismatchError, acquire_folder, read_run, release_folder, run_folder,
                         write_run)
from .toy_job import BATCH_SIZE, JOB_CONFIG, MAX_STEPS, N_EXAMPLES, next_batch, build_job, check_state  # noqa: F401

#: What a resume restores: everything, only the model weights, or everything but the RNGs.
RESTORE_MODES = ("all", "weights", "no-rng")

#: The toy job's stated limits (MAX_STEPS: :mod:`.toy_job`); padding and slowed saves are for demonstrations.
MAX_STEP_SECONDS = 10.0
MAX_SLOW_SAVE_SECONDS = 60.0


def _check_job_args(run_dir, steps, save_every, seed, resume, restore, slow_save_seconds, stop_after,
                   step_seconds, keep, slow_save_from=0, replace=False) -> dict:
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
        replace=flag("replace", replace),
    )


def train(run_dir, steps: int = 60, save_every: int = 5, seed: int = 0, resume: bool = False,
          restore: str = "all", slow_save_seconds: float = 0.0, stop_after: int | None = None,
          step_seconds: float = 0.0, out=None, keep: int = KEEP, slow_save_from: int = 0,
          replace: bool = False) -> list[float]:
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
    REASON``, ``set aside FILE: REASON``, ``resumed after step N from FILE``, ``done``) go to
    ``out`` (stdout by default) for a parent process to watch.

    The folder belongs to one run and has one writer. A new run
    (``resume=False``) draws a run id, records it with the seed and
    :data:`JOB_CONFIG` in ``run_dir/run.json``, and refuses a folder that
    already holds another run's checkpoints or loss log
    (:class:`RunMismatchError`) unless ``replace=True``, which deletes them
    first. The job holds ``run_dir/writer.lock`` while it runs: a second job
    in the same folder is refused (:class:`FolderInUseError`, naming the
    holder); the lock of a job that was killed is taken over.

    ``resume=True`` continues the folder's run: a different ``seed`` (or
    configuration) is refused, saying whose run the folder holds. It resumes
    from the newest checkpoint of that run that verifies (checksums, its step
    against its name, its run, then :func:`check_state`); a damaged,
    misnamed, foreign or impossible newer file is skipped with a ``skipped``
    line (and set aside at the next save), and the steps after the one
    resumed from are simply run again. A loss log whose last line was cut
    (a kill, a full disk) is cut back to its last complete line first
    (``repaired losses.txt: ...``). In an empty folder it starts a new run.

    ``restore`` says what is put back (:data:`RESTORE_MODES`): ``"all"``; ``"weights"`` (model weights only: the
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
                       step_seconds, keep, slow_save_from, replace)
    if out is not None and not callable(getattr(out, "write", None)):
        raise TypeError(f"out must be a text stream (with a write method) or None, got {out!r}")
    import numpy as np
    import torch

    run_dir, steps, save_every, seed = a["run_dir"], a["steps"], a["save_every"], a["seed"]
    out = out or sys.stdout

    def say(line):
        print(line, file=out, flush=True)

    run_folder(run_dir, create=True)
    acquire_folder(run_dir, report=say)  # one writer: FolderInUseError names the live holder
    threads = torch.get_num_threads()
    try:
        check_checkpoint_paths(run_dir)  # a folder named like a checkpoint: refused now, not at its step
        run = _resumed_run(run_dir, seed) if a["resume"] else None
        if run is None:
            run = _new_run(run_dir, seed, a["replace"], say)
        torch.set_num_threads(1)  # one thread: the same arithmetic order in every process
        random.seed(seed)
        np.random.seed(seed)
        model, optimizer, scheduler, features, targets = build_job(seed, steps)
        start, data = 0, {"epoch": 0, "position": 0}
        for name in remove_stray_temporaries(run_dir):
            say(f"removed {name}")
        if a["resume"]:
            found = load_latest(run_dir, validate=lambda st: check_state(st, steps), report=say, run=run)
            if found is not None:
                state, path, _ = found
                model.load_state_dict(state["model"])
                if a["restore"] in ("all", "no-rng"):
                    optimizer.load_state_dict(state["optimizer"])
                    scheduler.load_state_dict(state["scheduler"])
                if a["restore"] == "all":
                    restore_rng_state(state["rng"])
                start, data = int(state["step"]), dict(state["data"])
                say(f"resumed after step {start} from {path.name}")
        cut = repair_loss_log(run_dir)
        if cut is not None:
            say(f"repaired {LOSS_LOG}: removed its cut last line {cut[:40]!r}")
        losses = []
        model.train()
        with open(run_dir / LOSS_LOG, "a") as log:
            last = steps if a["stop_after"] is None else min(steps, a["stop_after"])
            for step in range(start + 1, last + 1):
                x, y = next_batch(features, targets, data, seed)
                x = x + torch.from_numpy(np.random.normal(0.0, 0.05, size=tuple(x.shape)).astype(np.float32))
                x = x * random.uniform(0.9, 1.1)
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                value = loss.item()
                losses.append(value)
                append_loss(log, step, value)
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
                        on_progress=written, run=run, report=say)
                    print(f"saved {step}", file=out, flush=True)
    finally:
        torch.set_num_threads(threads)
        release_folder(run_dir)
    print("done", file=out, flush=True)
    return losses


def _job_run(seed: int) -> RunIdentity:
    return RunIdentity.new(seed, JOB_CONFIG)


def _resumed_run(run_dir: Path, seed: int) -> RunIdentity | None:
    """The folder's run, if ``seed`` and :data:`JOB_CONFIG` match it; None when there is nothing to resume."""
    recorded = read_run(run_dir)
    if recorded is None:
        if checkpoint_files(run_dir):
            raise RunMismatchError(f"run_dir {str(run_dir)!r} holds checkpoints but no {RUN_FILE}, so whose run they "
                                   f"are cannot be told, and they are not resumed. Use another folder, or pass "
                                   f"resume=False, replace=True to delete them and start a new run")
        return None
    mine = _job_run(seed)
    wrong = ([f"seed={seed}, but the run's seed is {recorded.seed}"] if recorded.seed != seed else []) + [
        f"{k}={mine.config.get(k)!r}, but the run's is {recorded.config.get(k)!r}"
        for k in sorted(set(mine.config) | set(recorded.config)) if mine.config.get(k) != recorded.config.get(k)]
    if wrong:
        raise RunMismatchError(f"run_dir {str(run_dir)!r} holds {recorded.describe()}, and resume=True continues "
                               f"that run: this call has {'; '.join(wrong)}. Resume it with seed={recorded.seed}, "
                               f"or start a new run in another folder")
    return recorded


def _new_run(run_dir: Path, seed: int, replace: bool, say) -> RunIdentity:
    """Record a new run in ``run_dir``; refuse (or with ``replace``, delete) another run's files there."""
    recorded, files = read_run(run_dir), checkpoint_files(run_dir)
    aside = sorted(run_dir.glob("*" + SET_ASIDE))
    log = run_dir / LOSS_LOG
    has_log = log.is_file() and log.stat().st_size > 0
    if recorded is not None or files or aside or has_log:
        held = ", ".join(filter(None, [
            recorded.describe() if recorded is not None else "",
            f"checkpoints of steps {files[0][0]} to {files[-1][0]}" if files else "",
            f"{len(aside)} set-aside files" if aside else "", "a loss log" if has_log else ""]))
        if not replace:
            raise RunMismatchError(
                f"run_dir {str(run_dir)!r} already holds another run's files ({held}); a new run will not write over "
                f"them (its loss log would mix with theirs, and a later resume would continue theirs). Resume it "
                f"(resume=True{f', seed={recorded.seed}' if recorded is not None else ''}), use another folder, or "
                f"pass replace=True to delete them first")
        for p in [p for _, p in files] + aside + [run_dir / RUN_FILE, log]:
            p.unlink(missing_ok=True)
        say(f"replaced {held}")
    run = _job_run(seed)
    write_run(run_dir, run)
    return run


def copy_run(src, dst) -> Path:
    """Copy a run folder (checkpoints, ``run.json`` and loss log; not stray ``*.tmp`` files or the writer
    lock), e.g. to resume it two ways: the copy continues the same run, so its checkpoints load there."""
    src, dst = check_path("src", src), check_path("dst", dst)
    if not src.is_dir():
        raise ValueError(f"src {str(src)!r} is not a folder")
    if dst.exists():
        raise ValueError(f"dst {str(dst)!r} already exists")
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.tmp", LOCK_FILE))
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
                 slow_save_from: int = 0, replace: bool = False):
        a = _check_job_args(run_dir, steps, save_every, seed, resume, restore, slow_save_seconds, stop_after,
                           step_seconds, keep, slow_save_from, replace)
        cmd = [sys.executable, "-m", "lessonlib.measure.recovery", str(a["run_dir"]), "--steps", str(a["steps"]),
               "--save-every", str(a["save_every"]), "--seed", str(a["seed"]), "--restore", a["restore"],
               "--slow-save", repr(a["slow_save_seconds"]), "--slow-save-from", str(a["slow_save_from"]),
               "--step-seconds", repr(a["step_seconds"]),
               "--keep", str(a["keep"])]
        if a["stop_after"] is not None:
            cmd += ["--stop-after", str(a["stop_after"])]
        if a["resume"]:
            cmd.append("--resume")
        if a["replace"]:
            cmd.append("--replace")
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
    """Run the small resumable training job from the command line (``python -m lessonlib.measure.recovery RUN_DIR``)."""
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
    parser.add_argument("--replace", action="store_true", help="a new run may delete another run's files")
    a = parser.parse_args(argv)
    try:
        train(a.run_dir, steps=a.steps, save_every=a.save_every, seed=a.seed, resume=a.resume,
              restore=a.restore, slow_save_seconds=a.slow_save, stop_after=a.stop_after,
              step_seconds=a.step_seconds, keep=a.keep, slow_save_from=a.slow_save_from, replace=a.replace)
    except (CheckpointError, CheckpointPathError, CheckpointWriteError, FolderInUseError) as err:
        # every checkpoint damaged, another run's folder, another writer, a full disk: say so plainly
        sys.exit(f"cannot {'resume' if a.resume else 'train'}: {err}")


if __name__ == "__main__":
    main()
