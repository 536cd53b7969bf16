"""Run every chapter notebook on a CUDA machine and report what each measured there.

    python scripts/gpu_check.py [NOTEBOOK.ipynb ...]     (default: chapters/*/*.ipynb)

For each notebook it prints one line:

* pass or fail (every cell ran, the notebook's own asserts included);
* ledger / CUDA peak: for each training step the notebook measured with
  ``measure_training_memory``, the ledger's total (weights + gradients +
  optimizer state + saved activations) over the ledger's ``peak`` (the model,
  optimizer and inputs, plus ``torch.cuda.max_memory_allocated`` over what was
  allocated before the step, read after cuBLAS's workspace was made):
  how much of the real peak the inventory explains. Several steps: the
  smallest and largest ratio;
* step / prediction: the median training-step to prediction time ratio of each
  ``time_training_step`` call (CUDA events on a GPU);
* claims: the claims a page asserts only on the device where they were
  established (a CPU) and records elsewhere (``record("claim", name=...,
  held=...)``): how many held on this GPU, and the name of each that did not.

"-" means the notebook made no such measurement. Design: the notebooks are
not asked for anything. lessonlib's measurement helpers append a JSON line per
measurement to the file named by LESSONLIB_RECORD (lessonlib.measure.record);
this script sets it for each notebook, runs the notebook with nbclient in a
kernel of this Python, from the checkout (the setup cell uses it), and reads
the lines back. Exit status: 0 when every notebook passed, 1 when one failed,
2 when there is no CUDA device.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cuda_device() -> str | None:
    """The CUDA device's name, or None without one."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0)


def run_notebook(path: Path, record_file: Path, timeout: int = 600) -> tuple[bool, str]:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    os.environ["LESSONLIB_RECORD"] = str(record_file)  # the kernel inherits it
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        return True, ""
    except CellExecutionError as exc:
        return False, str(exc).strip().splitlines()[-1][:160]
    except Exception as exc:  # a dead kernel, a timeout
        return False, f"{type(exc).__name__}: {exc}"[:160]
    finally:
        os.environ.pop("LESSONLIB_RECORD", None)


def _span(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return format(lo, fmt) if abs(hi - lo) < 1e-12 else f"{lo:{fmt}}..{hi:{fmt}}"


def summarize(records: list[dict]) -> tuple[str, str]:
    """(ledger / CUDA peak, step / prediction) columns from one notebook's records."""
    ledger = [r["total"] / r["peak"] for r in records
              if r["kind"] == "ledger" and r.get("device") == "cuda" and r.get("peak")]
    timing = [r["step_over_prediction"] for r in records
              if r["kind"] == "timing" and r.get("device") == "cuda"]
    return _span(ledger, ".2f"), _span(timing, ".1f")


def claims(records: list[dict]) -> str:
    """The claims column: "-" without any, "2/2", or "1/2, not: <name>" from a notebook's CUDA records."""
    found = [r for r in records if r["kind"] == "claim" and r.get("device") == "cuda"]
    if not found:
        return "-"
    failed = [str(r.get("name")) for r in found if not r.get("held")]
    return f"{len(found) - len(failed)}/{len(found)}" + (f", not: {'; '.join(failed)}" if failed else "")


def main(argv: list[str]) -> int:
    name = cuda_device()
    if name is None:
        print("no CUDA device: nothing to check")
        return 2
    from lessonlib.measure.record import read

    paths = [Path(a).resolve() for a in argv] or sorted((ROOT / "chapters").glob("*/*.ipynb"))
    print(f"CUDA device: {name}")
    print(f"{'notebook':52} {'result':6} {'ledger/peak':>12} {'step/pred':>10} {'seconds':>8}  claims held")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for i, path in enumerate(paths):
            rec = Path(tmp) / f"{i}.jsonl"
            t0 = time.perf_counter()
            ok, why = run_notebook(path, rec)
            secs = time.perf_counter() - t0
            records = read(rec)
            ledger, timing = summarize(records)
            failed += not ok
            rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            print(f"{str(rel):52} {'pass' if ok else 'FAIL':6} {ledger:>12} {timing:>10} {secs:8.1f}  "
                  f"{claims(records)}" + (f"   {why}" if why else ""), flush=True)
    print(f"{len(paths) - failed} of {len(paths)} notebooks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
