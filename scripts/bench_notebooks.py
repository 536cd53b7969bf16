"""Execute every course notebook and print its wall time and the total.

    .venv/bin/python scripts/bench_notebooks.py [NOTEBOOK ...]

A benchmark, not a test: timings on shared machines move by 1.5-2x between
runs. The course's budget on a 2-core CPU: each notebook <= 60 s, the whole
book <= 4 min.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
PER_NOTEBOOK_S, TOTAL_S = 60, 240


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted(
        p for d in ("chapters", "exercises") for p in (ROOT / d).rglob("*.ipynb")
        if ".ipynb_checkpoints" not in p.parts)
    total, over = 0.0, []
    print(f"{'notebook':<60} {'seconds':>8}")
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        t0 = time.perf_counter()
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       extra_arguments=["--IPKernelApp.log_level=ERROR"],
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        dt = time.perf_counter() - t0
        total += dt
        flag = "  OVER BUDGET" if dt > PER_NOTEBOOK_S else ""
        if flag:
            over.append(path)
        print(f"{str(path.relative_to(ROOT)) if path.is_absolute() else str(path):<60} {dt:8.1f}{flag}", flush=True)
    print(f"{'total':<60} {total:8.1f}{'  OVER BUDGET' if total > TOTAL_S else ''}")
    print(f"budget: each <= {PER_NOTEBOOK_S} s, total <= {TOTAL_S} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
