#!/usr/bin/env bash
# Run every test: lessonlib unit tests, every notebook under nbval, the book
# build with warnings as errors, and the built pages in headless Chromium.
# Usage: bash scripts/test.sh [extra pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
NEED_BROWSER=1 bash scripts/setup.sh
. .venv/bin/activate
# Steadier timings for the optimizer step: keep glibc from handing memory back
# to the OS after every step (see DESIGN.md).
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296
exec python -m pytest "$@"
