#!/usr/bin/env bash
# Set up a virtual environment with fastdispatch built from this checkout,
# then run one of: demo | test | bench.
#
#   bash tools/dev.sh demo    # python -m fastdispatch demo
#   bash tools/dev.sh test    # the whole test suite, on both cores
#   bash tools/dev.sh bench   # the pytest-benchmark suite in bench/
#
# VENV (default .venv) and PYTHON (default python3) choose where and with
# which interpreter.  The package is installed (not editable) with its C
# extension required, so the tests exercise what a user's pip would build.
set -euo pipefail
cd "$(dirname "$0")/.."

cmd="${1:-}"
shift || true
case "$cmd" in
  demo|test|bench) ;;
  *) echo "usage: bash tools/dev.sh demo|test|bench [args...]" >&2; exit 2 ;;
esac

VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
py="$VENV/bin/python"
FASTDISPATCH_REQUIRE_EXTENSIONS=1 "$py" -m pip install --quiet ".[test,cluster]"

case "$cmd" in
  demo)
    exec "$py" -m fastdispatch demo "$@" ;;
  test)
    set +e
    "$py" -m pytest "$@"
    rc=$?
    set -e
    if [ "$rc" -eq 5 ]; then
      echo "pytest collected no tests: failing" >&2
      exit 1
    fi
    exit "$rc" ;;
  bench)
    exec "$py" -m pytest bench/ --benchmark-only "$@" ;;
esac
