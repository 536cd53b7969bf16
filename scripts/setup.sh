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

# uv installs the same versions as pip in well under half the time (it unpacks the
# wheels on both cores and compiles their bytecode in parallel). It reads none of
# pip's configuration, so the machine's pip settings (the wheels on disk, the local
# index, the caps on torch) are handed to it; pip resolves across all its indexes,
# and so does uv with unsafe-best-match. Where uv cannot be had, pip installs.
pip_setting() {  # $1: a pip option; its value from pip's configuration, the environment first
  local list
  list=$("$VENV/bin/python" -m pip config list 2>/dev/null) || return 0
  { sed -n "s/^:env:\.$1='\(.*\)'\$/\1/p" <<<"$list"; sed -n "s/^global\.$1='\(.*\)'\$/\1/p" <<<"$list"; } | head -1
}
install_with_uv() {
  "$VENV/bin/python" -m pip install -q uv >/dev/null 2>&1 || return 1
  local args=() v
  for v in $(pip_setting index-url); do args+=(--index-url "$v"); done
  for v in $(pip_setting extra-index-url); do
    [[ $v == file://* && ! -d ${v#file://} ]] || args+=(--extra-index-url "$v")  # pip skips a missing folder too
  done
  for v in $(pip_setting find-links); do args+=(--find-links "$v"); done
  for v in $(pip_setting constraint); do args+=(-c "$v"); done
  v=$(pip_setting cert); [ -z "$v" ] || export SSL_CERT_FILE="$v"
  "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --compile-bytecode --index-strategy unsafe-best-match \
    "${args[@]}" -c constraints.txt -e ".[book,test,grading]"
}

# Reinstall only when the package's requirements changed.
stamp="$VENV/.lessonlib-installed"
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "==> installing lessonlib with the book, test and grading extras (torch pinned by constraints.txt)"
  if ! install_with_uv; then
    echo "==> (uv was not available or failed: installing with pip)"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[book,test,grading]"
  fi
  echo "$want" > "$stamp"
fi

# Bytecode for the course's own modules. Python writes it on first import, except where
# PYTHONDONTWRITEBYTECODE is set (this machine, and some CI runners): there every process
# (a notebook's kernel, a started worker, the grader's sandbox) compiled lessonlib again,
# about 0.25 s of CPU each, and a run of the tests starts a few hundred. Python still checks
# each source against its bytecode, so an edited file is compiled afresh, as without this.
"$VENV/bin/python" -m compileall -q -j 0 lessonlib tests scripts exercises >/dev/null

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
