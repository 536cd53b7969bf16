#!/usr/bin/env bash
# Run every test: lessonlib unit tests, every notebook under nbval, the
# exercises through the grader, the book build with warnings as errors (from
# the notebooks nbval just executed), and the built pages in headless Chromium.
# pytest prints a table of seconds by phase at the end; this script adds the
# set-up and the total.
# Usage: bash scripts/test.sh [extra pytest arguments]
#   the inner loop:  bash scripts/test.sh -m "not slow"
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
NEED_BROWSER=1 bash scripts/setup.sh
setup=$((SECONDS - start))
. .venv/bin/activate
# Steadier timings for the optimizer step: keep glibc from handing memory back
# to the OS after every step (see DESIGN.md).
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296
rc=0
python -m pytest "$@" || rc=$?
echo "set-up ${setup} s, pytest $((SECONDS - start - setup)) s, total $((SECONDS - start)) s (exit ${rc}; load: $(cut -d' ' -f1-3 /proc/loadavg))"
exit $rc
