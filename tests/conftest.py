"""Shared fixtures: every behaviour test runs against both core implementations.

The ``impl`` fixture is parametrized over the compiled core (``cython``) and
the pure-Python twin (``python``).  If the extension is not built, the
``cython`` runs fail with a clear message, unless ``--no-c-extensions`` is
given or ``FASTDISPATCH_NO_EXTENSIONS=1`` is set, in which case they are
skipped.  ``FASTDISPATCH_SOAK=1`` makes the stress tests run much longer.
"""

import importlib
import os
import sys
import types

import pytest

from fastdispatch._dispatcher import build_dispatcher_class

SOAK = os.environ.get("FASTDISPATCH_SOAK", "") not in ("", "0")


def pytest_addoption(parser):
    parser.addoption("--no-c-extensions", action="store_true", default=False,
                     help="skip the tests of the compiled core")


def _no_extensions(config):
    return (config.getoption("--no-c-extensions")
            or os.environ.get("FASTDISPATCH_NO_EXTENSIONS", "") not in ("", "0"))


def _load(name):
    module = importlib.import_module(
        "fastdispatch._ringbuf" if name == "cython" else "fastdispatch._core_py")
    return types.SimpleNamespace(
        name=name,
        core=module,
        OutboundDispatcher=build_dispatcher_class(module),
        SendContext=module.SendContext,
        RingBuffer=module.RingBuffer,
        ChatQueue=module.ChatQueue,
        # The module whose globals a room's code reads: the compiled core
        # includes every room in one module; the twin keeps each in its own.
        room=(lambda room: module) if name == "cython" else (
            lambda room: importlib.import_module("fastdispatch._core." + room)),
    )


_IMPLS = {}


@pytest.fixture(params=["cython", "python"])
def impl(request):
    """The core implementation under test: ``.name``, ``.OutboundDispatcher``, ..."""
    name = request.param
    if name == "cython" and _no_extensions(request.config):
        pytest.skip("compiled core disabled (--no-c-extensions)")
    if name not in _IMPLS:
        try:
            _IMPLS[name] = _load(name)
        except ImportError as exc:
            pytest.fail("the compiled core fastdispatch._ringbuf is not built (%s); "
                        "install the package with a C compiler, or pass "
                        "--no-c-extensions" % (exc,), pytrace=False)
    return _IMPLS[name]


@pytest.fixture
def make_dispatcher(impl):
    """``make_dispatcher(**kwargs)``: a dispatcher of the current ``impl``.

    Each one is shut down at teardown, and the test fails if that does not
    finish: a test must not leave work behind.
    """
    made = []

    def make(**kwargs):
        d = impl.OutboundDispatcher(**kwargs)
        made.append(d)
        return d

    yield make
    leftover = [d for d in made if not d.shutdown(timeout=15)]
    for d in leftover:
        d.force_close()
    assert not leftover, "a dispatcher still had work 15 s after the test"


@pytest.fixture
def tiny_switch_interval():
    """Force very frequent thread switches while the test runs."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


@pytest.fixture
def soak_factor():
    """How many times longer stress tests run (20 with FASTDISPATCH_SOAK=1)."""
    return 20 if SOAK else 1
