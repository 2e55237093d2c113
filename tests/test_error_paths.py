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

import asyncio
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

from helpers import wait_until


class Panic(BaseException):
    """A custom BaseException, the way a library's "abort" signal might look."""


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
    assert wait_until(lambda: d.inflight == 0 and d.active_chats == 0)
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


# ------------------------------------------------- 2. a chat id's __hash__/__eq__

class FlakyHash:
    """Hashes to 42, except that the calls numbered in ``fail_on`` raise."""

    def __init__(self, fail_on):
        self.calls = 0
        self.fail_on = fail_on

    def __hash__(self):
        self.calls += 1
        if self.calls in self.fail_on:
            raise RuntimeError("__hash__ call %d" % self.calls)
        return 42

    def __eq__(self, other):
        return self is other


@pytest.mark.parametrize("fail_on", [2, 3, 4, 5, 6])
def test_a_chat_id_whose_hash_raises_later_strands_nothing(make_dispatcher, fail_on):
    d = make_dispatcher(max_inflight=2)
    chat = FlakyHash({fail_on})
    try:
        fut = d.submit(chat, lambda sc: "ran")
    except RuntimeError:
        fut = None
    # A second task of the same chat, and one of another chat.
    try:
        fut2 = d.submit(chat, lambda sc: "ran too")
    except RuntimeError:
        fut2 = None
    other = d.submit("other", lambda sc: "other")
    assert other.result(5) == "other"
    for f, expected in ((fut, "ran"), (fut2, "ran too")):
        if f is not None:
            assert f.result(5) == expected
    assert d.drain(5)
    assert d.active_chats == 0
    assert _accounted(d)
    accepted = sum(f is not None for f in (fut, fut2)) + 1
    assert d.stats().submitted == accepted


def test_a_chat_id_whose_hash_changes_at_every_call_is_served(impl):
    # Before: submit never returned and the chat map grew without bound, so
    # this runs in a fresh interpreter.
    out = _run_script(impl, """
        import itertools, threading
        from fastdispatch import OutboundDispatcher
        counter = itertools.count()

        class Shifty:
            def __hash__(self):
                return next(counter)

        d = OutboundDispatcher()
        chat = Shifty()
        futs = []
        t = threading.Thread(target=lambda: futs.extend(
            d.submit(chat, lambda sc, i=i: i) for i in range(20)), daemon=True)
        t.start()
        t.join(3)
        if t.is_alive():
            print("submit did not return; active_chats=%d" % d.active_chats)
            import os; os._exit(0)
        assert [f.result(5) for f in futs] == list(range(20))
        assert d.shutdown(10)
        assert d.active_chats == 0
        s = d.stats()
        assert s.submitted == s.completed == 20, s
        print("ok")
    """, timeout=60)
    assert out.strip() == "ok"


class TouchyEq:
    """All instances hash alike; comparing two of them raises now and then."""

    def __init__(self, n, flaky):
        self.n = n
        self.flaky = flaky

    def __hash__(self):
        return 7

    def __eq__(self, other):
        if self.flaky[0] % 3 == 0:
            self.flaky[0] += 1
            raise RuntimeError("__eq__")
        self.flaky[0] += 1
        return isinstance(other, TouchyEq) and self.n == other.n


def test_a_chat_id_whose_eq_raises_strands_nothing(make_dispatcher):
    d = make_dispatcher(max_inflight=4)
    flaky = [1]
    futs = []
    for i in range(200):
        try:
            futs.append(d.submit(TouchyEq(i % 5, flaky), lambda sc, i=i: i))
        except RuntimeError:
            pass
    assert [f.result(5) for f in futs] == [f.result() for f in futs]
    assert d.drain(5)
    assert d.active_chats == 0 and _accounted(d)
    assert d.stats().completed == len(futs)


class ShyOne:
    """Equal to 1 (and hashes like it), but its first two comparisons raise."""

    def __init__(self):
        self.calls = 0

    def __hash__(self):
        return 1

    def __eq__(self, other):
        self.calls += 1
        if self.calls <= 2:
            raise RuntimeError("__eq__")
        return other == 1


def test_each_worker_removes_its_own_queue_next_to_an_equal_plain_key(make_dispatcher):
    # ShyOne() lands in the map next to the plain key 1 (its comparisons
    # raised); removing it must not remove 1's queue instead.
    d = make_dispatcher(max_inflight=4)
    gate, one = _blocker(d, 1)
    shy = d.submit(ShyOne(), lambda sc: "shy")
    assert shy.result(5) == "shy"
    assert wait_until(lambda: d.active_chats == 1)
    # Chat 1's queue must still be in the map: its next task waits for the
    # running one instead of getting a queue (and a worker) of its own.
    started = threading.Event()
    futs = []
    submitter = threading.Thread(
        target=lambda: futs.append(d.submit(1, lambda sc: started.set())), daemon=True)
    submitter.start()
    submitter.join(5)
    assert not submitter.is_alive(), "submit did not return"
    assert not started.wait(0.3), "two tasks of chat 1 ran at once"
    gate.set()
    assert one.result(5) is True and futs[0].result(5) is None
    assert d.drain(5) and d.active_chats == 0 and _accounted(d)


# ---------------------------------------------------- 3. a chat id's __repr__

class BadRepr:
    def __repr__(self):
        raise RuntimeError("__repr__ of a chat id")


def test_queue_full_is_raised_even_if_the_chat_id_repr_raises(make_dispatcher):
    d = make_dispatcher(queue_size=1)
    chat = BadRepr()
    gate, first = _blocker(d, chat)
    second = d.submit(chat, lambda sc: "second")
    with pytest.raises(QueueFull) as info:
        d.submit(chat, lambda sc: "rejected")
    assert "BadRepr" in str(info.value)
    gate.set()
    assert first.result(5) is True and second.result(5) == "second"
    assert d.drain(5)
    s = d.stats()
    assert s.rejected == 1 and s.submitted == 2 and _accounted(d)


def test_deadlines_go_on_when_a_timed_out_chat_id_repr_raises(make_dispatcher):
    d = make_dispatcher(send_timeout=0.2)
    slow = d.submit(BadRepr(), lambda sc: time.sleep(1.0))
    with pytest.raises(SendTimeout):
        slow.result(5)
    later = d.submit("later", lambda sc: time.sleep(1.0))
    with pytest.raises(SendTimeout):
        later.result(5)
    assert d.drain(5) and _accounted(d)
    assert d.stats().timed_out == 2


def test_a_panic_in_a_chat_whose_repr_raises_discards_and_goes_on(make_dispatcher, caplog):
    d = make_dispatcher(max_inflight=1)
    chat = BadRepr()
    gate, first = _blocker(d, chat)
    panics = d.submit(chat, lambda sc: (_ for _ in ()).throw(Panic("boom")))
    waiting = d.submit(chat, lambda sc: "never")
    with caplog.at_level(logging.CRITICAL, logger="fastdispatch"):
        gate.set()
        with pytest.raises(TaskDiscarded):
            panics.result(5)
        with pytest.raises(TaskDiscarded):
            waiting.result(5)
    assert d.submit("next", lambda sc: "next").result(5) == "next"
    assert d.drain(5) and d.active_chats == 0 and _accounted(d)


class ReprlessPanic(BaseException):
    def __repr__(self):
        raise RuntimeError("__repr__ of an exception")

    def __str__(self):
        raise RuntimeError("__str__ of an exception")


def test_a_panic_whose_repr_raises_still_resolves_its_future(make_dispatcher, caplog):
    d = make_dispatcher(max_inflight=1)

    def task(sc):
        raise ReprlessPanic()

    with caplog.at_level(logging.CRITICAL, logger="fastdispatch"):
        fut = d.submit("c", task)
        with pytest.raises(TaskDiscarded) as info:
            fut.result(5)
    assert isinstance(info.value.__cause__, ReprlessPanic)
    assert d.submit("c", lambda sc: "next").result(5) == "next"
    assert d.drain(5) and _accounted(d)


# ------------------------------------- 4. done-callbacks raising BaseException

def _raise(exc):
    def callback(fut):
        raise exc
    return callback


def test_a_done_callback_raising_system_exit_kills_no_worker(make_dispatcher, caplog):
    d = make_dispatcher(max_inflight=1)
    gate, first = _blocker(d, "a")
    seen = []
    first.add_done_callback(_raise(SystemExit(1)))
    first.add_done_callback(seen.append)          # still runs after the raiser
    second = d.submit("a", lambda sc: "second")
    other = d.submit("b", lambda sc: "other")
    with caplog.at_level(logging.CRITICAL):
        gate.set()
        assert first.result(5) is True
        assert second.result(5) == "second" and other.result(5) == "other"
    assert seen == [first]
    assert d.drain(5) and _accounted(d)
    assert d.stats().completed == 3


def test_a_done_callback_raising_keyboard_interrupt_on_timeout_keeps_the_deadlines(
        make_dispatcher, caplog):
    d = make_dispatcher(send_timeout=0.2)
    with caplog.at_level(logging.CRITICAL):
        slow = d.submit("a", lambda sc: time.sleep(1.0))
        slow.add_done_callback(_raise(KeyboardInterrupt()))
        with pytest.raises(SendTimeout):
            slow.result(5)
        later = d.submit("b", lambda sc: time.sleep(1.0))
        with pytest.raises(SendTimeout):
            later.result(5)
        assert d.drain(5)
    assert d.stats().timed_out == 2 and _accounted(d)


def test_force_close_resolves_every_future_despite_raising_done_callbacks(
        make_dispatcher, caplog):
    d = make_dispatcher(max_inflight=4)
    running = [_blocker(d, chat, cooperative=True)[1] for chat in "abc"]
    waiting = [d.submit(chat, lambda sc: None) for chat in "abc"]
    for fut in running + waiting:
        fut.add_done_callback(_raise(SystemExit(2)))
    escaped = None
    with caplog.at_level(logging.CRITICAL):
        try:
            d.force_close()
        except BaseException as exc:    # noqa: B902 -- that is the bug
            escaped = exc
        assert escaped is None
        for fut in running:
            with pytest.raises(Cancelled):
                fut.result(5)
        for fut in waiting:
            assert fut.cancelled() or isinstance(fut.exception(5), Cancelled)
        assert d.drain(5)
    assert _accounted(d)


# ---------------------------------------------------- 5. Thread.start failing

@pytest.fixture
def refuse_threads(monkeypatch):
    """``refuse_threads(prefix, n)``: the next ``n`` starts of such threads fail."""
    real_start = threading.Thread.start
    budget = {}

    def start(self):
        for prefix in list(budget):
            if self.name.startswith(prefix) and budget[prefix] > 0:
                budget[prefix] -= 1
                raise RuntimeError("can't start new thread")
        return real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)

    def refuse(prefix, n=1):
        budget[prefix] = n
    return refuse


def test_a_worker_that_cannot_start_is_forgotten_and_shutdown_still_joins(
        make_dispatcher, refuse_threads, caplog):
    d = make_dispatcher()
    refuse_threads("fastdispatch-worker", 1)
    with caplog.at_level(logging.CRITICAL, logger="fastdispatch"):
        first = d.submit("a", lambda sc: "a")
    assert d.stats().threads == 0
    # The next submit starts a worker, which serves both chats.
    assert d.submit("b", lambda sc: "b").result(5) == "b"
    assert first.result(5) == "a"
    assert d.shutdown(5) is True


def test_a_deadline_thread_that_cannot_start_kills_no_worker(
        make_dispatcher, refuse_threads, caplog):
    d = make_dispatcher(send_timeout=0.3, max_inflight=1)
    refuse_threads("fastdispatch-deadlines", 1)
    with caplog.at_level(logging.CRITICAL, logger="fastdispatch"):
        assert d.submit("a", lambda sc: "a").result(5) == "a"
    # The next task with a deadline starts the thread, and deadlines hold.
    slow = d.submit("b", lambda sc: time.sleep(1.5))
    with pytest.raises(SendTimeout):
        slow.result(5)
    assert d.drain(5) and _accounted(d)
    assert d.shutdown(5) is True


# ------------------------------- 6. nothing runs after force_close() returned

def test_no_task_starts_after_force_close_returned(make_dispatcher):
    ran = []
    slow_hook = DispatcherHooks(on_done=lambda info: time.sleep(0.2))
    d = make_dispatcher(max_inflight=8, hooks=slow_hook)
    firsts = [_blocker(d, chat, cooperative=True)[1] for chat in range(8)]
    seconds = [d.submit(chat, lambda sc, chat=chat: ran.append(chat)) for chat in range(8)]
    d.force_close()
    time.sleep(0.5)
    assert ran == []
    for fut in firsts:
        with pytest.raises(Cancelled):
            fut.result(5)
    for fut in seconds:
        assert fut.done() and (fut.cancelled() or isinstance(fut.exception(), Cancelled))
    assert d.drain(5) and _accounted(d)


# ---------------------------------------------- 7. no thread outlives its use

def test_force_close_leaves_no_thread_behind(impl):
    out = _run_script(impl, """
        import threading, time
        from fastdispatch import OutboundDispatcher

        for _ in range(300):
            d = OutboundDispatcher(send_timeout=5, idle_timeout=60)
            started = threading.Event()
            d.submit("c", lambda sc: (started.set(), sc.wait(5)))
            assert started.wait(5)
            d.force_close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            left = [t.name for t in threading.enumerate() if t.name.startswith("fastdispatch-")]
            if not left:
                break
            time.sleep(0.05)
        print(len(left))
    """)
    assert out.strip() == "0"


def test_a_dropped_dispatcher_is_collected_with_its_threads(impl):
    out = _run_script(impl, """
        import gc, threading, time, weakref
        from fastdispatch import OutboundDispatcher

        refs = []
        for _ in range(20):
            d = OutboundDispatcher(send_timeout=5, idle_timeout=0.1)
            assert d.submit("c", lambda sc: "ok").result(5) == "ok"
            refs.append(weakref.ref(d))
            del d
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            gc.collect()
            left = [t.name for t in threading.enumerate() if t.name.startswith("fastdispatch-")]
            alive = sum(r() is not None for r in refs)
            if not left and not alive:
                break
            time.sleep(0.05)
        print(len(left), alive)
    """)
    assert out.strip() == "0 0"


def test_the_deadline_thread_ends_when_idle_and_comes_back_with_work(make_dispatcher):
    d = make_dispatcher(send_timeout=0.3, idle_timeout=0.1)

    def deadline_threads():
        return [t for t in threading.enumerate() if t.name == "fastdispatch-deadlines"
                and t is d._timer_thread]

    assert d.submit("a", lambda sc: "a").result(5) == "a"
    assert wait_until(lambda: not deadline_threads() or not d._timer_thread.is_alive())
    for _ in range(2):
        slow = d.submit("b", lambda sc: time.sleep(1.5))
        with pytest.raises(SendTimeout):
            slow.result(5)
        assert d.drain(5)
        # idle for idle_timeout: the deadline thread ends
        assert wait_until(lambda: not d._timer_thread.is_alive())
    assert d.stats().timed_out == 2 and _accounted(d)


# --------------------------------------------- 8. hooks raising BaseException

def test_an_on_queued_hook_raising_base_exception_still_returns_the_future(make_dispatcher):
    def on_queued(chat, n):
        raise Panic("on_queued")

    recovered = []
    d = make_dispatcher(hooks=DispatcherHooks(on_queued=on_queued), recover=recovered.append)
    fut = d.submit("c", lambda sc: "ran")
    assert fut.result(5) == "ran"
    d.post("c", lambda sc: None)
    assert d.drain(5) and _accounted(d)
    assert len(recovered) == 2 and all(isinstance(e, Panic) for e in recovered)


def test_an_on_rejected_hook_raising_base_exception_still_raises_queue_full(make_dispatcher):
    def on_rejected(chat, exc):
        raise Panic("on_rejected")

    recovered = []
    d = make_dispatcher(queue_size=1, hooks=DispatcherHooks(on_rejected=on_rejected),
                        recover=recovered.append)
    gate, first = _blocker(d, "c")
    second = d.submit("c", lambda sc: "second")
    with pytest.raises(QueueFull):
        d.submit("c", lambda sc: None)
    gate.set()
    assert second.result(5) == "second"
    assert d.drain(5) and _accounted(d) and d.stats().rejected == 1
    assert len(recovered) == 1 and isinstance(recovered[0], Panic)


@pytest.mark.parametrize("hook", ["on_start", "on_done"])
def test_worker_hooks_raising_base_exception_lose_nothing(make_dispatcher, hook):
    def bad(*args):
        raise Panic(hook)

    recovered = []
    d = make_dispatcher(hooks=DispatcherHooks(**{hook: bad}), recover=recovered.append,
                        send_timeout=0.2)
    futs = [d.submit("c", lambda sc, i=i: i) for i in range(3)]
    assert [f.result(5) for f in futs] == [0, 1, 2]
    slow = d.submit("c", lambda sc: time.sleep(1.0))
    with pytest.raises(SendTimeout):
        slow.result(5)
    assert d.drain(5) and _accounted(d)
    assert len(recovered) == 4


def test_a_recover_raising_base_exception_is_contained(make_dispatcher, caplog):
    def recover(exc):
        raise Panic("recover")

    d = make_dispatcher(recover=recover, max_inflight=1)
    with caplog.at_level(logging.CRITICAL, logger="fastdispatch"):
        fut = d.submit("c", lambda sc: (_ for _ in ()).throw(Panic("task")))
        with pytest.raises(TaskDiscarded):
            fut.result(5)
        assert d.submit("c", lambda sc: "next").result(5) == "next"
    assert d.drain(5) and _accounted(d)


def test_a_task_submitted_as_the_panicked_task_resolves_runs(make_dispatcher):
    # Whoever sees the panicked task's TaskDiscarded may submit to the chat
    # again at once: that task is new, not one of the waiting tasks the
    # panic discards.  A done callback submits at the very moment the
    # Future is resolved, on the worker (the chat used to be cleared only
    # after that, and discarded this task too).
    d = make_dispatcher(max_inflight=1)
    gate = threading.Event()
    after = []
    fut = d.submit("c", lambda sc: gate.wait(10) and (_ for _ in ()).throw(Panic("task")))
    fut.add_done_callback(lambda f: after.append(d.submit("c", lambda sc: "next")))
    gate.set()
    with pytest.raises(TaskDiscarded):
        fut.result(5)
    assert wait_until(lambda: after)
    assert after[0].result(5) == "next"
    assert d.drain(5) and _accounted(d)


def test_after_drain_nothing_is_in_flight(make_dispatcher, tiny_switch_interval):
    # drain() returns once nothing is pending, no chat is left and no
    # worker holds a slot: stats() read right after it shows inflight 0
    # (it could show the slot of a worker still removing the last chat,
    # e.g. after a panic, which closes its chat before the task ends).
    d = make_dispatcher(max_inflight=2, recover=lambda exc: None)
    for n in range(200):
        futures = [d.submit("p%d" % (n % 3), lambda sc: (_ for _ in ()).throw(Panic("x"))),
                   d.submit("q%d" % n, lambda sc: None)]
        assert d.drain(10)
        s = d.stats()
        assert (s.inflight, s.active_chats) == (0, 0), (n, s)
        for f in futures:
            assert f.done()


# ------------------------------------ 9. hooks never hold the deadline thread

def test_a_blocking_on_done_hook_does_not_delay_other_timeouts(make_dispatcher):
    release = threading.Event()

    def on_done(info):
        if info.chat_id == "hook-blocks" and isinstance(info.error, SendTimeout):
            release.wait(10)

    d = make_dispatcher(send_timeout=0.2, max_inflight=4,
                        hooks=DispatcherHooks(on_done=on_done))
    try:
        first = d.submit("hook-blocks", lambda sc: time.sleep(1.0))
        with pytest.raises(SendTimeout):
            first.result(5)
        other = d.submit("other", lambda sc: time.sleep(1.5))
        with pytest.raises(SendTimeout):
            other.result(1.0)     # its deadline is 0.2 s away
    finally:
        release.set()
    assert d.drain(5) and d.stats().timed_out == 2


def test_a_blocking_on_done_hook_does_not_hold_force_close(make_dispatcher):
    release = threading.Event()
    d = make_dispatcher(hooks=DispatcherHooks(on_done=lambda info: release.wait(10)))
    try:
        _, fut = _blocker(d, "c", cooperative=True)
        t0 = time.monotonic()
        closer = threading.Thread(target=d.force_close)
        closer.start()
        closer.join(2)
        assert not closer.is_alive()
        with pytest.raises(Cancelled):
            fut.result(2)
    finally:
        release.set()
    assert time.monotonic() - t0 < 5
    assert d.drain(5) and _accounted(d)


# -------------------------------------- 10. bounded QueueFull / error messages

class HugeRepr:
    def __repr__(self):
        return "H" * 5_000_000


@pytest.mark.parametrize("chat", ["x" * 10_000_000, b"y" * 10_000_000, HugeRepr(),
                                  ("tenant", "z" * 1_000_000)],
                         ids=["str", "bytes", "object", "tuple"])
def test_queue_full_messages_stay_short_whatever_the_chat_id(make_dispatcher, chat):
    d = make_dispatcher(queue_size=1)
    gate, _ = _blocker(d, chat)
    d.submit(chat, lambda sc: None)
    for _ in range(5):
        with pytest.raises(QueueFull) as info:
            d.submit(chat, lambda sc: None)
        assert len(str(info.value)) < 300
    gate.set()
    assert d.drain(5)


def test_timeout_and_discard_messages_stay_short_whatever_the_chat_id(make_dispatcher, caplog):
    chat = "x" * 1_000_000
    d = make_dispatcher(send_timeout=0.2, max_inflight=1)
    slow = d.submit(chat, lambda sc: time.sleep(1.0))
    with pytest.raises(SendTimeout) as timeout:
        slow.result(5)
    assert len(str(timeout.value)) < 300
    with caplog.at_level(logging.CRITICAL, logger="fastdispatch"):
        panics = d.submit(chat, lambda sc: (_ for _ in ()).throw(Panic()))
        waiting = d.submit(chat, lambda sc: None)
        with pytest.raises(TaskDiscarded):
            panics.result(5)
        with pytest.raises(TaskDiscarded) as discarded:
            waiting.result(5)
    assert len(str(discarded.value)) < 300
    assert d.drain(5)


# ------------------------------------------------- 11. sizes: one limit, both cores

@pytest.mark.parametrize("argument", ["max_inflight", "queue_size"])
def test_sizes_above_sys_maxsize_are_refused_the_same_way_by_both_cores(impl, argument):
    with pytest.raises(ValueError, match=argument):
        impl.OutboundDispatcher(**{argument: 2 ** 63})
    with pytest.raises(ValueError, match=argument):
        impl.OutboundDispatcher(**{argument: sys.maxsize + 1})


@pytest.mark.parametrize("argument", ["max_inflight", "queue_size"])
def test_sizes_up_to_sys_maxsize_work_on_both_cores(make_dispatcher, argument):
    d = make_dispatcher(**{argument: sys.maxsize})
    futs = [d.submit(i % 3, lambda sc, i=i: i) for i in range(30)]
    assert [f.result(5) for f in futs] == list(range(30))


def test_ring_buffer_capacity_limits_agree_between_cores(impl):
    with pytest.raises(ValueError, match="capacity"):
        impl.RingBuffer(2 ** 63)
    with pytest.raises(ValueError, match="capacity"):
        impl.RingBuffer(0)
    ring = impl.RingBuffer(sys.maxsize)
    assert ring.push(1) and len(ring) == 1 and ring.pop() == 1


# ---------------------------- 12. cancelled Futures are seen by wait/as_completed

def test_futures_cancelled_by_force_close_wake_wait_and_as_completed(make_dispatcher):
    d = make_dispatcher(max_inflight=1)
    _, running = _blocker(d, "c", cooperative=True)
    waiting = [d.submit("c", lambda sc: None) for _ in range(3)]
    futs = [running] + waiting
    result = {}

    def waiter():
        result["wait"] = concurrent.futures.wait(futs, timeout=5)
        result["as_completed"] = list(concurrent.futures.as_completed(futs, timeout=5))

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.1)             # the waiter is blocked in wait()
    d.force_close()
    t.join(15)
    assert not t.is_alive()
    done, not_done = result["wait"]
    assert len(done) == 4 and not not_done
    assert len(result["as_completed"]) == 4


def test_a_future_cancelled_by_its_caller_and_then_discarded_wakes_wait(make_dispatcher, caplog):
    d = make_dispatcher(max_inflight=1)
    gate, _ = _blocker(d, "c")
    panics = d.submit("c", lambda sc: (_ for _ in ()).throw(Panic()))
    cancelled = d.submit("c", lambda sc: None)
    assert cancelled.cancel()
    with caplog.at_level(logging.CRITICAL, logger="fastdispatch"):
        gate.set()
        with pytest.raises(TaskDiscarded):
            panics.result(5)
        done, _ = concurrent.futures.wait([cancelled], timeout=5)
    assert done == {cancelled}
    assert d.drain(5) and _accounted(d)


# ------------------------------------------------------ 13. everything at once

def test_no_future_is_left_pending_by_a_storm_of_hostile_code(make_dispatcher, caplog):
    """Everything at once: each accepted Future ends, counters add up."""
    kinds = [Panic("p"), SystemExit(0), KeyboardInterrupt(), ValueError("v"), None]

    def task(i):
        def run(sc):
            exc = kinds[i % len(kinds)]
            if exc is not None:
                raise exc
            return i
        return run

    def on_done(info):
        if info.queue_len % 2:
            raise Panic("on_done")

    d = make_dispatcher(max_inflight=4, queue_size=8, send_timeout=0.5,
                        hooks=DispatcherHooks(on_done=on_done, on_start=_raise(Panic("s"))),
                        recover=_raise(SystemExit(3)))
    futs = []
    with caplog.at_level(logging.CRITICAL):
        for i in range(400):
            if i % 10 == 0:
                chat = BadRepr()
            elif i % 10 == 5:
                chat = FlakyHash({2})
            else:
                chat = i % 13
            try:
                fut = d.submit(chat, task(i))
            except (QueueFull, RuntimeError):
                continue
            try:
                fut.add_done_callback(_raise(kinds[i % 3]))
            except BaseException:     # noqa: B902 -- already done: ran right here
                pass
            futs.append(fut)
        done, not_done = concurrent.futures.wait(futs, timeout=30)
        assert not not_done
        assert d.drain(10)
    gc.collect()
    assert d.active_chats == 0 and _accounted(d)


# ---------------------------------- 14. a Future seen done is already counted

def test_a_future_seen_done_is_already_counted(make_dispatcher):
    d = make_dispatcher(send_timeout=0.2, max_inflight=2)
    seen = []

    def check(expected_field):
        def callback(fut):
            seen.append(getattr(d.stats(), expected_field))
        return callback

    ok = d.submit("a", lambda sc: "ok")
    ok.add_done_callback(check("completed"))
    bad = d.submit("b", lambda sc: 1 / 0)
    bad.add_done_callback(check("failed"))
    slow = d.submit("c", lambda sc: time.sleep(1.0))
    slow.add_done_callback(check("timed_out"))
    for fut in (ok, bad, slow):
        concurrent.futures.wait([fut], timeout=5)
    assert d.drain(5)
    assert seen == [1, 1, 1]


# ------------------------------------------------ mistakes named in the user's terms

def test_wrong_constructor_arguments_name_the_class_and_the_argument(impl):
    with pytest.raises(TypeError) as caught:
        impl.OutboundDispatcher(8)
    message = str(caught.value)
    assert "OutboundDispatcher()" in message and "keyword arguments only" in message
    assert "_Lifecycle" not in message and "max_inflight=8" in message
    with pytest.raises(TypeError) as caught:
        impl.OutboundDispatcher(max_inflght=3)
    message = str(caught.value)
    assert "OutboundDispatcher()" in message and "'max_inflght'" in message
    assert "did you mean 'max_inflight'" in message and "_Lifecycle" not in message

    class Mine(impl.OutboundDispatcher):   # a subclass is named by its own name
        pass
    with pytest.raises(TypeError, match=r"^Mine\(\) got an unexpected keyword argument 'nope'"):
        Mine(nope=1)


def test_asubmit_outside_a_running_loop_says_how_to_call_it(make_dispatcher):
    d = make_dispatcher()
    coro = d.asubmit(1, lambda sc: None)
    with pytest.raises(RuntimeError, match="coroutine running on an event loop"):
        coro.send(None)
    coro.close()
    assert d.stats().submitted == 0


def test_a_task_that_takes_no_send_context_is_told_what_it_receives(make_dispatcher):
    d = make_dispatcher()

    def takes_nothing():
        return 1

    def raises_its_own_type_error(sc):
        return int("x", base=sc)   # a TypeError of the task's own code

    for task in (lambda: 1, takes_nothing, lambda sc, extra: 1):
        error = d.submit(42, task).exception(10)
        assert isinstance(error, TypeError)
        assert "a task receives one argument, the SendContext" in str(error), error
        assert "chat 42" in str(error) and isinstance(error.__cause__, TypeError)
    own = d.submit(42, raises_its_own_type_error).exception(10)
    assert isinstance(own, TypeError) and "SendContext of its send" not in str(own)

    async def main():
        async def coro_without_sc():
            return 1
        with pytest.raises(TypeError, match="a task receives one argument"):
            await d.asubmit(7, coro_without_sc)

    asyncio.run(main())
    assert d.drain(10)
    s = d.stats()
    assert s.failed == 5 and s.submitted == s.failed
