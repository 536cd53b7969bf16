"""Grade a synthetic class and report notebooks per minute and peak memory.

    .venv/bin/python scripts/bench_grading.py [--students 300] [--jobs 2] [--exercise 1a-price-the-training-step]

The class: a third hand in the instructor's answers, a third the same with one
answer wrong, a third the untouched student copy (which stops at its stubs).
Every notebook runs in the bubblewrap sandbox, as ``instructor.py grade``
does. Reports the wall time, notebooks per minute, the CPU seconds per
notebook (all processes), the time the reference process spent checking
answers (serial: it bounds throughput on a large machine), and peak memory:
the largest sum of resident memory over the grader and every process under
it (sampled every 0.2 s; shared library pages are counted once per process,
so this overstates), the largest single process, and the largest drop of
the machine's available memory. Results go to .bench/grading.json. Timings
on a shared machine move by 1.5-2x between runs: read them as such. The
report also says how the sandbox was isolated here (cgroup memory cap or
rlimits only; the sandbox's user).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nbformat  # noqa: E402

from lessonlib.grading import autograde, handout, limits, sandbox  # noqa: E402


def _tree_rss(root_pid: int, cpu: dict) -> tuple[int, int, int]:
    """(sum of RSS bytes, largest RSS, processes) over ``root_pid`` and its descendants.

    Also records each descendant's CPU seconds so far in ``cpu`` (keyed by pid and start time).
    """
    parent, rss, times = {}, {}, {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            parent[int(pid)] = int(fields[1])
            rss[int(pid)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
            times[int(pid)] = ((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), fields[19])
        except (OSError, ValueError, IndexError):
            pass
    mine = {root_pid}
    changed = True
    while changed:
        changed = False
        for pid, ppid in parent.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                changed = True
    for p in mine - {root_pid}:
        if p in times:
            cpu[(p, times[p][1])] = times[p][0]
    values = [rss.get(p, 0) for p in mine]
    return sum(values), max(values), len(mine)


def _available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


class Sampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.peak_sum = self.peak_one = self.peak_procs = 0
        self.available0 = _available()
        self.min_available = self.available0
        self.cpu: dict = {}  # CPU seconds of every process under the grader (sampled, so a little low)

    def run(self):
        while not self.stop.is_set():
            total, one, n = _tree_rss(os.getpid(), self.cpu)
            self.peak_sum, self.peak_one = max(self.peak_sum, total), max(self.peak_one, one)
            self.peak_procs = max(self.peak_procs, n)
            self.min_available = min(self.min_available, _available())
            time.sleep(0.2)


def make_class(folder: Path, exercise: Path, students: int) -> None:
    src = nbformat.read(exercise, as_version=4)
    blank = handout.student_notebook(src)
    solutions = {c.metadata["nbgrader"]["grade_id"]: c.source for c in src.cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    first = sorted(solutions)[0]
    for i in range(students):
        nb = nbformat.from_dict(blank)
        kind = i % 3
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if gid in solutions and kind < 2:
                cell.source = solutions[gid]
                if kind == 1 and gid == first:
                    cell.source += "\n# a wrong answer\n" + "\n".join(
                        f"{name} = None" for name in _names(solutions[gid]))
        (folder / f"student-{i:03d}").mkdir(parents=True)
        nbformat.write(nb, folder / f"student-{i:03d}" / exercise.name)


def _names(source: str) -> list[str]:
    import ast

    body = source.split(handout.BEGIN_SOLUTION)[1].split(handout.END_SOLUTION)[0]
    return [t.id for node in ast.parse(body).body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)][-1:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--students", type=int, default=300)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--exercise", default="1a-price-the-training-step")
    a = p.parse_args(argv)
    exercise = ROOT / "exercises" / f"{a.exercise}.ipynb"

    check_seconds = [0.0]
    original = autograde.Reference.check

    def timed(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            check_seconds[0] += time.perf_counter() - t

    autograde.Reference.check = timed
    done = [0]

    def progress(line):
        done[0] += 1
        if done[0] % 25 == 0:
            print(f"  {done[0]} / {a.students} started", flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        sub = Path(tmp) / "submitted"
        make_class(sub, exercise, a.students)
        sampler = Sampler()
        sampler.start()
        own0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.monotonic()
        results = autograde.grade_folder(sub, ROOT / "exercises", jobs=a.jobs, progress=progress)
        wall = time.monotonic() - t0
        own1 = resource.getrusage(resource.RUSAGE_SELF)
        sampler.stop.set()
        sampler.join()
    graded = [r for r in results if r.path]
    own = (own1.ru_utime - own0.ru_utime) + (own1.ru_stime - own0.ru_stime)
    cpu = own + sum(sampler.cpu.values())
    by_kind = {}
    for r in graded:
        kind = ("full", "one wrong", "blank")[int(r.student.split("-")[1]) % 3]
        by_kind.setdefault(kind, set()).add(r.score)
    report = {
        "exercise": a.exercise, "students": a.students, "jobs": a.jobs, "cpus": os.cpu_count(),
        "wall_seconds": round(wall, 1), "notebooks_per_minute": round(len(graded) / wall * 60, 1),
        "cpu_seconds_per_notebook": round(cpu / max(1, len(graded)), 2),
        "grader_cpu_seconds_per_notebook": round(own / max(1, len(graded)), 2),
        "load_average_1min_at_end": os.getloadavg()[0],
        "reference_check_seconds_per_notebook": round(check_seconds[0] / max(1, len(graded)), 3),
        "mean_seconds_per_notebook": round(sum(r.seconds for r in graded) / max(1, len(graded)), 2),
        "peak_rss_sum_mib": round(sampler.peak_sum / 2 ** 20), "peak_rss_one_process_mib": round(sampler.peak_one / 2 ** 20),
        "peak_processes": sampler.peak_procs,
        "peak_available_drop_mib": round((sampler.available0 - sampler.min_available) / 2 ** 20),
        "scores_by_kind": {k: sorted(v) for k, v in by_kind.items()},
        "isolation": {"cgroups": sorted(limits.cgroup_parents()), "sandbox_uid": sandbox.SANDBOX_UID,
                      "user_namespace": not sandbox.privileged()},
        "problems": sorted({r.problem for r in graded if r.problem})[:5],
    }
    print(json.dumps(report, indent=1))
    out = ROOT / ".bench"
    out.mkdir(exist_ok=True)
    (out / "grading.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
