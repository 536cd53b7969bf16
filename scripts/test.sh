#!/usr/bin/env bash
# Run every test in one pytest run: lessonlib unit tests, every notebook under nbval (in a
# Colab-like runtime), the exercises through the grader, the book build with warnings as
# errors (from the notebooks nbval just executed), the built pages in headless Chromium, and
# the tests that build extra environments (JupyterLab, nbgrader, the ipywidgets matrix).
# Two pytest workers share the two cores with pytest-xdist's --dist loadgroup:
# the notebooks, the book and the browser tests in order on one, the rest by module on both
# (conftest.py says how).
# The run prints a table of seconds by phase; this script adds the set-up and the total.
# Usage: bash scripts/test.sh [extra pytest arguments]
#   the inner loop:  bash scripts/test.sh -m "not slow"
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
NEED_BROWSER=1 bash scripts/setup.sh
setup=$((SECONDS - start))
. .venv/bin/activate
# Steadier timings for the optimizer step: keep glibc from handing memory back
# to the OS after every step (it made the optimizer step's time jitter less).
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296
# Two workers on two cores: torch (and the processes it starts) on one thread each, since a
# second thread would spin-wait for the core the other worker holds. The notebooks measure
# ratios within one run, so their checks hold on one thread as on two.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
WORKERS=${WORKERS:-2}
XDIST=(-n "$WORKERS" --dist loadgroup)
load() { cut -d' ' -f1-3 /proc/loadavg; }

# The Colab-like runtime every notebook runs in (tests/colab_env.py: a venv built on first use,
# about 40 s, then kept) is built in the background while pytest starts its workers and collects:
# otherwise the first notebook waits for it, on the run's longest chain. pytest takes the same
# file lock, so it waits for this build, or builds the runtime itself (and reports the error) if
# this one failed. The inner loop (-m "not slow") runs no notebook and does not build it.
builder=
if [[ " $* " != *"not slow"* ]]; then python tests/colab_env.py & builder=$!; fi
rc=0
python -m pytest "${XDIST[@]}" "$@" || rc=$?
[ -z "$builder" ] || wait "$builder" || true
echo "set-up ${setup} s, pytest $((SECONDS - start - setup)) s, total $((SECONDS - start)) s (exit ${rc}; load: $(load))"
exit $rc
