#!/usr/bin/env bash
# Set up a virtual environment with fastdispatch built from this checkout,
# then run one of: demo | test | bench.
#
#   bash tools/dev.sh demo    # python -m fastdispatch demo
#   bash tools/dev.sh test    # the whole test suite, on both cores
#   bash tools/dev.sh bench   # the pytest-benchmark suite in bench/
#   PYTHON=python3.13t bash tools/dev.sh freethreaded   # suite + soak, GIL off
#
# VENV (default .venv) and PYTHON (default python3) choose where and with
# which interpreter.  The package is installed (not editable) with its C
# extension required, so the tests exercise what a user's pip would build.
set -euo pipefail
cd "$(dirname "$0")/.."

cmd="${1:-}"
shift || true

# Free-threaded CPython (3.13t and later): the whole suite, then the stress
# tests at soak length, with the GIL off; and proof that importing the
# compiled core leaves it off.  PYTHON must name such an interpreter (one
# built with --disable-gil, e.g. "python3.13t"); the venv is .venv-ft unless
# VENV says otherwise.  Extra arguments go to both pytest runs.
case "$cmd" in
  freethreaded)
    PYTHON="${PYTHON:-}"
    if [ -z "$PYTHON" ] || ! "$PYTHON" -c 'import sysconfig, sys; sys.exit(0 if sysconfig.get_config_var("Py_GIL_DISABLED") else 1)' 2>/dev/null; then
      echo "freethreaded: set PYTHON to a free-threaded CPython (built with" >&2
      echo "--disable-gil, e.g. PYTHON=python3.13t; python.org and uv ship one)" >&2
      exit 2
    fi
    VENV="${VENV:-.venv-ft}"
    if [ ! -x "$VENV/bin/python" ]; then
      "$PYTHON" -m venv "$VENV"
      "$VENV/bin/python" -m pip install --quiet --upgrade pip
    fi
    py="$VENV/bin/python"
    # --prefer-binary: a test dependency's newest release may exist only as an
    # sdist needing a toolchain for the free-threaded ABI; take its last wheel.
    FASTDISPATCH_REQUIRE_EXTENSIONS=1 "$py" -m pip install --quiet --prefer-binary ".[test]"
    # Without PYTHON_GIL=0 (which would force the GIL off whatever the
    # extension says): an extension not declared free-threading compatible
    # would turn it back on at import, with a RuntimeWarning.
    env -u PYTHON_GIL "$py" -W error::RuntimeWarning -c '
import sys, fastdispatch
assert fastdispatch.IMPLEMENTATION == "cython", fastdispatch.IMPLEMENTATION
assert not sys._is_gil_enabled(), "importing fastdispatch re-enabled the GIL"
print("%s: GIL off after importing fastdispatch (compiled core)" % sys.version.split()[0])'
    set +e
    PYTHON_GIL=0 "$py" -m pytest "$@"
    rc=$?
    if [ "$rc" -eq 0 ]; then
      PYTHON_GIL=0 FASTDISPATCH_SOAK=1 "$py" -m pytest -m stress "$@"
      rc=$?
    fi
    exit "$rc" ;;
esac

case "$cmd" in
  demo|test|bench) ;;
  *) echo "usage: bash tools/dev.sh demo|test|bench|freethreaded [args...]" >&2; exit 2 ;;
esac

VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
py="$VENV/bin/python"
FASTDISPATCH_REQUIRE_EXTENSIONS=1 "$py" -m pip install --quiet ".[test]"

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
