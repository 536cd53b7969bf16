#!/usr/bin/env bash
# Prepare everything the book and the tests need, on a machine that has only
# python3 (and apt-get, when run as root). Safe to run again: it skips what is
# already done. Used by scripts/book.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating virtual environment $VENV"
  if ! "$PY" -m venv "$VENV" 2>/dev/null; then
    # Debian's python3 ships venv separately.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
      rm -rf "$VENV"; "$PY" -m venv "$VENV"
    else
      echo "error: '$PY -m venv' failed; install python3-venv and run again" >&2; exit 1
    fi
  fi
fi

# Reinstall only when the package's requirements changed.
stamp="$VENV/.lessonlib-installed"
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "==> installing lessonlib with the book, test and grading extras (torch pinned by constraints.txt)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[book,test,grading]"
  echo "$want" > "$stamp"
fi

# The browser tests drive Debian's Chromium through Playwright (never
# 'playwright install', which downloads a browser).
if [ "${NEED_BROWSER:-0}" = 1 ] && ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "==> installing Debian's chromium for the browser tests"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
  else
    echo "error: the browser tests need Debian's chromium: sudo apt-get install chromium" >&2; exit 1
  fi
fi
