"""Hostile user code: whatever it does, no dispatcher thread dies, every
accepted Future is resolved, the counters stay exact and drain() tells the truth.

User code reaches the dispatcher through tasks, hooks, ``recover``, the
done-callbacks of the Futures it hands out, a chat id's ``__hash__``,
``__eq__`` and ``__repr__``, and the arguments it passes (timeouts, sizes).
Each test below drives one of those into a failure that used to strand a
Future, kill a worker or the deadline thread, or leak a thread, and checks the
rule above on both cores.  ``docs/dispatcher.md`` ("Hostile user code")
states the resulting behaviour.
"""

import concurrent.futures
import gc
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from fastdispatch import (
    Cancelled,
    DispatcherHooks,
    QueueFull,
    SendTimeout,
    TaskDiscarded,
)


class Panic(BaseException):
    """A custom BaseException, the way a library's "abort" signal might look."""


def _wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _blocker(d, chat, cooperative=False):
    """Submit a task that holds ``chat`` until the returned gate is set."""
    started = threading.Event()
    gate = threading.Event()

    def hold(sc):
        started.set()
        if cooperative:
            return sc.wait(30)
        return gate.wait(30)

    fut = d.submit(chat, hold)
    assert started.wait(10)
    return gate, fut


def _accounted(d):
    s = d.stats()
    return s.submitted == s.completed + s.failed + s.discarded + s.cancelled + s.timed_out


@pytest.fixture(autouse=True)
def thread_deaths(monkeypatch):
    """Fail the test if any thread dies of an exception (SystemExit included)."""
    deaths = []

    def hook(args):
        deaths.append((args.thread.name if args.thread else "?", args.exc_type.__name__))

    monkeypatch.setattr(threading, "excepthook", hook)
    yield deaths
    assert not deaths, "threads died: %r" % (deaths,)


def _run_script(impl, body, timeout=60):
    """Run ``body`` in a fresh interpreter on ``impl``'s core; return stdout."""
    script = textwrap.dedent("""
        import fastdispatch
        assert fastdispatch.IMPLEMENTATION == "<core>", fastdispatch.IMPLEMENTATION
    """).replace("<core>", impl.name) + textwrap.dedent(body)
    env = dict(os.environ, FASTDISPATCH_NO_EXTENSIONS="1" if impl.name == "python" else "0")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


# --------------------------------------------- 1. timeouts beyond TIMEOUT_MAX

@pytest.mark.parametrize("argument", ["send_timeout", "idle_timeout"])
def test_timeouts_above_timeout_max_are_refused_at_the_call(impl, argument):
    with pytest.raises(ValueError, match=argument):
        impl.OutboundDispatcher(**{argument: 1e10})
    with pytest.raises(ValueError, match=argument):
        impl.OutboundDispatcher(**{argument: threading.TIMEOUT_MAX * 2})


def test_drain_and_shutdown_refuse_a_timeout_above_timeout_max_and_stay_open(make_dispatcher):
    d = make_dispatcher()
    with pytest.raises(ValueError, match="timeout"):
        d.drain(1e10)
    with pytest.raises(ValueError, match="timeout"):
        d.shutdown(1e10)
    assert not d.closed
    assert d.submit("c", lambda sc: "open").result(5) == "open"


def test_the_largest_accepted_timeouts_keep_every_thread_alive(make_dispatcher):
    d = make_dispatcher(idle_timeout=threading.TIMEOUT_MAX,
                        send_timeout=threading.TIMEOUT_MAX, max_inflight=1)
    assert d.submit("a", lambda sc: sc.remaining() > 0).result(5) is True
    assert _wait_until(lambda: d.inflight == 0 and d.active_chats == 0)
    time.sleep(0.2)             # the only worker is now idle, waiting TIMEOUT_MAX
    assert d.submit("b", lambda sc: "served").result(5) == "served"
    assert d.drain(threading.TIMEOUT_MAX)


def test_send_context_wait_accepts_any_timeout(make_dispatcher):
    d = make_dispatcher(send_timeout=None)
    started = threading.Event()

    def waits_forever(sc):
        started.set()
        return sc.wait(1e10)    # beyond TIMEOUT_MAX: means "until cancelled"

    fut = d.submit("c", waits_forever)
    assert started.wait(5)
    time.sleep(0.1)
    assert not fut.done()
    d.force_close()
    with pytest.raises(Cancelled):
        fut.result(5)
