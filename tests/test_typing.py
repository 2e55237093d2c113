"""Type checkers see the real API: signatures, ``Future[T]``, reported mistakes.

``OutboundDispatcher`` is the class of the core chosen at import, which no
checker can follow; the stubs ``_dispatcher.pyi``, ``_ringbuf.pyi`` and
``pacing.pyi`` declare what checkers see.  These tests keep that true:

- ``tests/typing/uses_ok.py`` (correct uses, with ``assert_type``) passes
  mypy and pyright with no error;
- ``tests/typing/mistakes.py`` makes each checker report an error on every
  line marked ``# error`` and on no other line;
- the stubs match the objects at run time: ``mypy.stubtest`` for the stubbed
  modules, and a comparison of ``_dispatcher.pyi`` with the class on each
  core.

The checkers run on copies of the files in a temporary directory, so they
resolve ``fastdispatch`` to the installed package, as a user's would.
pyright comes from PyPI and runs on the machine's Node.js.
"""

import ast
import inspect
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = os.path.join(HERE, "typing")
FILES = ("uses_ok.py", "mistakes.py")


def _marked_lines(name):
    with open(os.path.join(CASES, name)) as f:
        return {i for i, line in enumerate(f, 1) if re.search(r"#\s*error:", line)}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("typing")
    for name in FILES:
        shutil.copy(os.path.join(CASES, name), tmp / name)
    return tmp


def _run(cmd, cwd, timeout=600):
    env = dict(os.environ, PYRIGHT_PYTHON_IGNORE_WARNINGS="1", NO_COLOR="1")
    return subprocess.run(cmd, cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def mypy_errors(cases):
    """file name -> {line: [messages]} from one mypy run over both files."""
    import mypy  # noqa: F401  (in the test extra: missing is a failure, not a skip)
    proc = _run([sys.executable, "-m", "mypy", "--cache-dir", str(cases / ".mypy_cache"),
                 "--show-error-codes", "--no-error-summary", "--no-pretty",
                 "--hide-error-context", *FILES], cases)
    errors = {name: {} for name in FILES}
    for line in proc.stdout.splitlines():
        found = re.match(r"^(?P<file>[^:]+):(?P<line>\d+): error: (?P<msg>.*)$", line)
        if found:
            errors[os.path.basename(found["file"])].setdefault(
                int(found["line"]), []).append(found["msg"])
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not any(errors.values())):
        pytest.fail("mypy did not run:\n%s%s" % (proc.stdout, proc.stderr))
    return errors


@pytest.fixture(scope="module")
def pyright_errors(cases):
    """file name -> {line: [messages]} from one pyright run over both files."""
    import pyright  # noqa: F401  (in the test extra)
    proc = _run([sys.executable, "-m", "pyright", "--outputjson",
                 "--pythonpath", sys.executable, *FILES], cases)
    try:
        report = json.loads(proc.stdout[proc.stdout.index("{"):])
    except ValueError:
        pytest.fail("pyright did not run (it needs Node.js on PATH):\n%s%s"
                    % (proc.stdout, proc.stderr))
    errors = {name: {} for name in FILES}
    for diag in report["generalDiagnostics"]:
        if diag["severity"] == "error":
            errors[os.path.basename(diag["file"])].setdefault(
                diag["range"]["start"]["line"] + 1, []).append(diag["message"])
    return errors


@pytest.fixture(params=["mypy", "pyright"])
def checker(request):
    return request.getfixturevalue(request.param + "_errors")


def test_checkers_accept_every_correct_use(checker):
    assert checker["uses_ok.py"] == {}


def test_checkers_report_every_planted_mistake_and_nothing_else(checker):
    reported = checker["mistakes.py"]
    marked = _marked_lines("mistakes.py")
    assert len(marked) >= 7
    assert sorted(marked - set(reported)) == [], "mistakes the checker missed"
    assert {n: m for n, m in reported.items() if n not in marked} == {}, \
        "errors on correct lines"


def test_submit_returns_a_future_of_the_tasks_result(mypy_errors, pyright_errors):
    # The newcomer's case: x: str = d.submit(c, returns_int).result()
    with open(os.path.join(CASES, "mistakes.py")) as f:
        line = next(i for i, text in enumerate(f, 1) if "x: str = d.submit" in text)
    assert any('"int"' in m for m in mypy_errors["mistakes.py"][line])
    assert any('"int"' in m for m in pyright_errors["mistakes.py"][line])


# ------------------------------------------------------------- stubs vs runtime


def _stub_class(stub, name):
    import fastdispatch
    with open(os.path.join(os.path.dirname(fastdispatch.__file__), stub)) as f:
        tree = ast.parse(f.read())
    return next(node for node in tree.body
                if isinstance(node, ast.ClassDef) and node.name == name)


def _declared(cls_node):
    names = {}
    for node in cls_node.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = node
    return names


def _stub_params(func):
    """[(name, kind, default)] of a stub's def, without self; ``...`` -> Ellipsis."""
    a = func.args
    out = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for arg, default in zip(positional, defaults):
        kind = ("POSITIONAL_ONLY" if arg in a.posonlyargs else "POSITIONAL_OR_KEYWORD")
        out.append((arg.arg, kind, default))
    if a.vararg:
        out.append((a.vararg.arg, "VAR_POSITIONAL", None))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, "KEYWORD_ONLY", default))
    if a.kwarg:
        out.append((a.kwarg.arg, "VAR_KEYWORD", None))
    result = []
    for name, kind, default in out[1:]:    # drop self
        if default is None:
            value = inspect.Parameter.empty
        elif isinstance(default, ast.Constant) and default.value is Ellipsis:
            value = Ellipsis
        else:
            value = ast.literal_eval(default)
        result.append((name, kind, value))
    return result


def _runtime_params(obj):
    params = list(inspect.signature(obj).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return [(p.name, p.kind.name, p.default) for p in params]


def test_dispatcher_stub_matches_the_class_of_each_core(impl):
    cls = impl.OutboundDispatcher
    stub = _declared(_stub_class("_dispatcher.pyi", "OutboundDispatcher"))
    base = _declared(_stub_class("_ringbuf.pyi", "DispatcherCore"))
    # Same public names: nothing the checkers miss, nothing they invent.
    public_runtime = {n for n in dir(cls) if not n.startswith("_")}
    public_stub = {n for n in set(stub) | set(base) if not n.startswith("_")}
    assert public_runtime == public_stub
    # Same parameters (names, kinds, defaults) for every method the stub declares.
    for name, node in stub.items():
        if name in ("__enter__", "__exit__"):
            continue   # (*exc_info) at run time; the stub spells the three out
        runtime = getattr(cls, name)
        if isinstance(runtime, property):
            continue
        assert _runtime_params(runtime) == _stub_params(node), name


def test_stubs_match_the_modules_at_run_time(request, tmp_path):
    # mypy's stubtest on the modules that have a stub: _ringbuf.pyi against
    # the compiled core, pacing.pyi against pacing.py, _dispatcher.pyi against
    # _dispatcher.py.  (Modules without a stub are their own declaration; run
    # over them, stubtest reports typing-module noise that varies with the
    # mypy release.)
    if request.config.getoption("--no-c-extensions") or os.environ.get(
            "FASTDISPATCH_NO_EXTENSIONS", "") not in ("", "0"):
        pytest.skip("compiled core disabled (--no-c-extensions)")
    pytest.importorskip("mypy.stubtest")
    from mypy.version import __version__ as mypy_version
    if int(mypy_version.split(".")[0]) < 2:
        # mypy 2 needs ast-serialize, which has no wheel for every interpreter
        # (none for free-threaded 3.13): pip then falls back to mypy 1, whose
        # stubtest reports a few dozen differences that mypy 2's does not.
        # The allowlist is kept for mypy 2; the other builds check the stubs.
        pytest.skip("stubtest of mypy %s: the allowlist is kept for mypy 2" % mypy_version)
    import fastdispatch._ringbuf  # noqa: F401  (the conftest's rule: built, or say so)
    proc = _run([sys.executable, "-m", "mypy.stubtest", "fastdispatch._ringbuf",
                 "fastdispatch.pacing", "fastdispatch._dispatcher",
                 "--allowlist", os.path.join(CASES, "stubtest-allowlist.txt"),
                 "--ignore-unused-allowlist"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
