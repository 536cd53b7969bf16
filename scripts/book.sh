#!/usr/bin/env bash
# Build the HTML book (executing every notebook) and say where to open it.
# Usage: bash scripts/book.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# Warnings are errors; a failing cell fails the build (nb_execution_raise_on_error).
# Progress bars are silent in the static pages (lessonlib.progress).
export LESSONLIB_STATIC_BUILD=1
jupyter-book build . --all -W -n --keep-going
echo
echo "The book is built. Open: file://$PWD/_build/html/index.html"
