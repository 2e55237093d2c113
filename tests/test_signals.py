"""Signal handlers never wait for a lock (fastdispatch._signals.SignalRelay).

A handler runs in the main thread between two of its bytecodes, possibly
inside a lock the main thread holds: the run helpers' main thread waits on
the very Event a SIGTERM sets.  The relay's handler only queues the signal;
its thread sets the Events.  These tests hold the lock and deliver the
signal, call for call as the interrupted main thread would.
"""

import logging
import signal
import sys
import threading
import time

import pytest

from fastdispatch._signals import SignalRelay
from fastdispatch._serve import Stopper

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


@pytest.fixture
def handlers():
    """The test's handlers of SIGTERM, SIGINT and SIGUSR1 are put back afterwards."""
    kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    yield kept
    for s, h in kept.items():
        signal.signal(s, h)


def call_holding(lock, fn, *args):
    """``fn(*args)`` in a thread that holds ``lock``, as a handler runs in a
    main thread interrupted inside it; True if it returned within 10 s."""
    def run():
        with lock:
            fn(*args)
    t = threading.Thread(target=run, daemon=True)  # a deadlocked one stays behind
    t.start()
    t.join(10)
    return not t.is_alive()


def test_a_sigterm_handled_inside_the_stop_events_lock_stops_and_a_second_forces(handlers):
    stopper = Stopper(None, True)
    try:
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler) and signal.getsignal(signal.SIGINT) == handler
        # Event.set() in the handler would wait here for the lock its own thread holds.
        assert call_holding(stopper.stop._cond, handler, signal.SIGTERM, None)
        assert stopper.stop.wait(10) and stopper.signum == signal.SIGTERM
        assert not stopper.force.is_set()
        assert call_holding(stopper.force._cond, handler, signal.SIGINT, None)
        assert stopper.force.wait(10)
    finally:
        stopper.restore()
    assert signal.getsignal(signal.SIGTERM) == handlers[signal.SIGTERM]
    assert signal.getsignal(signal.SIGINT) == handlers[signal.SIGINT]


def test_real_signals_reach_the_stopper_and_its_events(handlers):
    stopper = Stopper(None, True)
    main = threading.main_thread().ident
    try:
        signal.pthread_kill(main, signal.SIGTERM)
        assert stopper.stop.wait(10) and stopper.signum == signal.SIGTERM
        signal.pthread_kill(main, signal.SIGINT)
        assert stopper.force.wait(10)
    finally:
        stopper.restore()
    assert signal.getsignal(signal.SIGTERM) == handlers[signal.SIGTERM]


def test_without_handle_signals_nothing_is_installed(handlers):
    stopper = Stopper(None, False)
    assert signal.getsignal(signal.SIGTERM) == handlers[signal.SIGTERM]
    stopper.restore()


def test_signals_interrupting_a_main_thread_that_waits_on_the_reactions_lock(handlers):
    # The real thing, many times: a thread fires SIGUSR1 at the main thread
    # while it loops on Event.wait; each reaction takes that Event's lock.
    # With the GIL off a few hundred in 50,000 signals land while the main
    # thread holds it: a handler that took the lock itself would hang here.
    event = threading.Event()
    reactions = []

    def react(signum):
        event.clear()  # takes the Event's lock, as set() does
        reactions.append(signum)

    relay = SignalRelay(react, (signal.SIGUSR1,))
    assert relay.install()
    main = threading.main_thread().ident
    fired = threading.Event()

    def fire():
        for _ in range(5000):
            signal.pthread_kill(main, signal.SIGUSR1)
            time.sleep(0.0001)
        fired.set()

    kicker = threading.Thread(target=fire)
    kicker.start()
    try:
        while not fired.is_set():
            event.wait(0.00001)
        kicker.join()
    finally:
        relay.restore()
    assert reactions and set(reactions) == {signal.SIGUSR1}  # signals coalesce: not 5,000


def test_the_relay_keeps_the_order_survives_a_failing_reaction_and_hands_on_before_it_ends(
        handlers, caplog):
    seen = []
    gate = threading.Event()

    def react(signum):
        gate.wait(10)
        seen.append(signum)
        if len(seen) == 1:
            raise RuntimeError("a reaction that fails")

    relay = SignalRelay(react, (signal.SIGUSR1, signal.SIGTERM))
    assert relay.install()
    assert not relay.install()  # once
    handler = signal.getsignal(signal.SIGUSR1)
    for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR1):
        handler(signum, None)
    with caplog.at_level(logging.ERROR, logger="fastdispatch.signals"):
        gate.set()
        relay.restore()  # what arrived before it still reaches react
    assert seen == [signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR1]
    assert "reacting to signal" in caplog.text and "a reaction that fails" in caplog.text
    assert signal.getsignal(signal.SIGUSR1) == handlers[signal.SIGUSR1]
    assert not any(t.name == "fastdispatch-signals" for t in threading.enumerate())
    relay.restore()  # idempotent


def test_the_relay_installs_nothing_outside_the_main_thread(handlers):
    relay = SignalRelay(lambda signum: None, (signal.SIGUSR1,))
    result = []
    t = threading.Thread(target=lambda: result.append(relay.install()))
    t.start()
    t.join(10)
    assert result == [False]
    assert signal.getsignal(signal.SIGUSR1) == handlers[signal.SIGUSR1]
    relay.restore()
    with pytest.raises(TypeError, match="on_signal"):
        SignalRelay(None)
