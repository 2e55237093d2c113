"""docs/guarantees.md G4, G7-G10: submit/post, Futures, timeouts, panics, hooks, stats."""

import asyncio
import concurrent.futures
import logging
import threading
import time

import pytest

from fastdispatch import (
    Cancelled,
    DispatcherClosed,
    DispatcherError,
    DispatcherHooks,
    DispatchInfo,
    QueueFull,
    RetryAfter,
    SendTimeout,
    TaskDiscarded,
)
from fastdispatch._types import Future


class Recorder:
    """Collects hook calls; thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls = []
        self.done = []

    def hooks(self, **overrides):
        def record(name):
            def hook(*args):
                with self.lock:
                    self.calls.append((name,) + args)
                    if name == "on_done":
                        self.done.append(args[0])
            return hook
        names = ("on_queued", "on_start", "on_done", "on_rejected")
        kwargs = {name: record(name) for name in names}
        kwargs.update(overrides)
        return DispatcherHooks(**kwargs)

    def named(self, name):
        with self.lock:
            return [c[1:] for c in self.calls if c[0] == name]


def blocker(d, chat):
    """Submit a task that holds ``chat`` until the returned event is set."""
    started = threading.Event()
    gate = threading.Event()
    fut = d.submit(chat, lambda sc: (started.set(), gate.wait(30))[1])
    assert started.wait(10)
    return gate, fut


# --------------------------------------------------------------------- submit

def test_submit_returns_a_real_future_with_the_task_result(make_dispatcher):
    d = make_dispatcher()
    fut = d.submit("chat_123", lambda sc: ("pong", sc.chat_id))
    assert isinstance(fut, concurrent.futures.Future)
    assert fut.result(timeout=5) == ("pong", "chat_123")


def test_task_exception_lands_in_its_future_and_chat_goes_on(make_dispatcher):
    d = make_dispatcher()

    def boom(sc):
        raise ValueError("nope")

    bad = d.submit("c", boom)
    good = d.submit("c", lambda sc: "after")
    with pytest.raises(ValueError, match="nope"):
        bad.result(5)
    assert good.result(5) == "after"
    assert d.drain(5)
    assert d.stats().failed == 1 and d.stats().completed == 1


def test_futures_work_with_asyncio_wrap_future(make_dispatcher):
    d = make_dispatcher()

    async def main():
        futs = [asyncio.wrap_future(d.submit(i % 3, lambda sc, i=i: i * 2)) for i in range(30)]
        return await asyncio.gather(*futs)

    assert asyncio.run(main()) == [i * 2 for i in range(30)]


def test_futures_work_with_concurrent_futures_wait(make_dispatcher):
    d = make_dispatcher()
    futs = [d.submit(i, lambda sc: sc.chat_id) for i in range(20)]
    done, not_done = concurrent.futures.wait(futs, timeout=10)
    assert not not_done
    assert sorted(f.result() for f in concurrent.futures.as_completed(futs)) == list(range(20))


def test_post_runs_the_task_without_a_future(make_dispatcher):
    rec = Recorder()
    d = make_dispatcher(hooks=rec.hooks())
    ran = []
    assert d.post("c", lambda sc: ran.append(1)) is None

    def boom(sc):
        raise KeyError("x")

    d.post("c", boom)
    assert d.drain(5)
    assert ran == [1]
    errors = [info.error for info in rec.done]
    assert errors[0] is None and isinstance(errors[1], KeyError)
    assert d.stats().completed == 1 and d.stats().failed == 1


def test_queue_full_raises_at_once_and_the_task_never_runs(make_dispatcher):
    rec = Recorder()
    d = make_dispatcher(queue_size=1, hooks=rec.hooks())
    gate, first = blocker(d, "c")
    d.submit("c", lambda sc: None)
    ran = []
    with pytest.raises(QueueFull, match="'c'"):
        d.submit("c", lambda sc: ran.append("submit"))
    with pytest.raises(QueueFull):
        d.post("c", lambda sc: ran.append("post"))
    rejected = rec.named("on_rejected")
    assert [chat for chat, _ in rejected] == ["c", "c"]
    assert all(isinstance(exc, QueueFull) for _, exc in rejected)
    d.submit("other", lambda sc: None).result(5)  # other chats are unaffected
    gate.set()
    assert d.drain(5)
    assert ran == []
    s = d.stats()
    assert s.rejected == 2 and s.submitted == 3


def test_submit_after_close_raises_dispatcher_closed(make_dispatcher):
    rec = Recorder()
    d = make_dispatcher(hooks=rec.hooks())
    d.close()
    assert d.closed
    with pytest.raises(DispatcherClosed):
        d.submit("c", lambda sc: None)
    with pytest.raises(DispatcherClosed):
        d.post("c", lambda sc: None)
    assert len(rec.named("on_rejected")) == 2
    assert d.stats().submitted == 0 and d.stats().rejected == 2


def test_errors_share_one_base_and_match_standard_ones():
    for exc in (QueueFull, DispatcherClosed, SendTimeout, TaskDiscarded, Cancelled):
        assert issubclass(exc, DispatcherError)
    assert issubclass(SendTimeout, TimeoutError)
    assert issubclass(Cancelled, concurrent.futures.CancelledError)


def test_caller_can_cancel_a_task_that_has_not_started(make_dispatcher):
    rec = Recorder()
    d = make_dispatcher(hooks=rec.hooks())
    gate, _ = blocker(d, "c")
    ran = []
    waiting = d.submit("c", lambda sc: ran.append(1))
    assert waiting.cancel()
    after = d.submit("c", lambda sc: "next")
    gate.set()
    assert after.result(5) == "next"
    assert d.drain(5)
    assert ran == [] and waiting.cancelled()
    assert d.stats().cancelled == 1
    assert any(isinstance(i.error, Cancelled) for i in rec.done)


def test_a_started_task_cannot_be_cancelled(make_dispatcher):
    d = make_dispatcher()
    gate, fut = blocker(d, "c")
    assert not fut.cancel()
    gate.set()
    assert fut.result(5) is True


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("chat_id, message", [
    (None, "chat_id must not be None"),
    ([1, 2], "chat_id must be hashable"),
    ({"a": 1}, "chat_id must be hashable"),
])
def test_bad_chat_id_raises_type_error_and_queues_nothing(make_dispatcher, chat_id, message):
    d = make_dispatcher()
    for call in (d.submit, d.post):
        with pytest.raises(TypeError, match=message):
            call(chat_id, lambda sc: None)
    assert d.active_chats == 0 and d.stats().submitted == 0


@pytest.mark.parametrize("task", [None, 42, "send", object()])
def test_non_callable_task_raises_type_error_and_queues_nothing(make_dispatcher, task):
    d = make_dispatcher()
    for call in (d.submit, d.post):
        with pytest.raises(TypeError, match="task must be callable"):
            call("c", task)
    assert d.active_chats == 0 and d.stats().submitted == 0


@pytest.mark.parametrize("kwargs, error, name", [
    ({"max_inflight": 0}, ValueError, "max_inflight"),
    ({"max_inflight": -3}, ValueError, "max_inflight"),
    ({"max_inflight": 2.5}, TypeError, "max_inflight"),
    ({"max_inflight": "8"}, TypeError, "max_inflight"),
    ({"max_inflight": True}, TypeError, "max_inflight"),
    ({"queue_size": 0}, ValueError, "queue_size"),
    ({"queue_size": None}, TypeError, "queue_size"),
    ({"send_timeout": 0}, ValueError, "send_timeout"),
    ({"send_timeout": -1.0}, ValueError, "send_timeout"),
    ({"send_timeout": float("nan")}, ValueError, "send_timeout"),
    ({"send_timeout": "30"}, TypeError, "send_timeout"),
    ({"idle_timeout": 0}, ValueError, "idle_timeout"),
    ({"idle_timeout": None}, TypeError, "idle_timeout"),
    ({"idle_timeout": float("inf")}, ValueError, "idle_timeout"),
    ({"recover": "log"}, TypeError, "recover"),
    ({"hooks": {"on_done": print}}, TypeError, "hooks"),
    ({"hooks": DispatcherHooks(on_done=42)}, TypeError, "hooks.on_done"),
])
def test_bad_configuration_raises_naming_the_argument(impl, kwargs, error, name):
    with pytest.raises(error, match=name):
        impl.OutboundDispatcher(**kwargs)


def test_arguments_are_keyword_only(impl):
    with pytest.raises(TypeError):
        impl.OutboundDispatcher(8)


# -------------------------------------------------------------------- timeouts

def test_timeout_releases_result_at_the_deadline_while_next_task_waits(make_dispatcher):
    rec = Recorder()
    d = make_dispatcher(send_timeout=0.3, hooks=rec.hooks())
    finished = threading.Event()
    seen = {}

    def overdue(sc):
        seen["deadline"] = sc.deadline
        time.sleep(0.8)          # ignores its deadline
        seen["cancelled_late"] = sc.cancelled
        finished.set()
        return "too late"

    def next_task(sc):
        seen["next_saw_overdue_finished"] = finished.is_set()
        return "next"

    t0 = time.monotonic()
    slow = d.submit("c", overdue)
    nxt = d.submit("c", next_task)
    with pytest.raises(SendTimeout):
        slow.result(5)
    released_after = time.monotonic() - t0
    assert 0.25 <= released_after < 0.7
    assert not nxt.done()                   # still waiting for the overdue one
    assert nxt.result(5) == "next"
    assert seen["next_saw_overdue_finished"] is True
    assert seen["cancelled_late"] is True
    assert abs(seen["deadline"] - (t0 + 0.3)) < 0.2
    assert d.drain(5)
    s = d.stats()
    assert s.timed_out == 1 and s.completed == 1
    timeouts = [i for i in rec.done if isinstance(i.error, SendTimeout)]
    assert len(timeouts) == 1 and timeouts[0].run_latency >= 0.25


def test_send_context_is_cancelled_at_the_deadline(make_dispatcher):
    d = make_dispatcher(send_timeout=0.2)
    seen = []

    def cooperative(sc):
        seen.append((sc.cancelled, sc.remaining()))
        sc.check()                       # not cancelled yet: returns
        seen.append(sc.wait(5))          # wakes at the deadline, not after 5 s
        seen.append(sc.remaining())
        sc.check()                       # raises SendTimeout

    t0 = time.monotonic()
    fut = d.submit("c", cooperative)
    with pytest.raises(SendTimeout):
        fut.result(5)
    assert d.drain(5)
    assert time.monotonic() - t0 < 2
    (cancelled, remaining), woke, left = seen
    assert not cancelled and 0 < remaining <= 0.2
    assert woke is True and left == 0.0


@pytest.mark.parametrize("parked_for", [0.2, 60.0])
def test_a_deadline_holds_whenever_the_timer_next_wakes(make_dispatcher, parked_for):
    # The timer sleeps until a parked chat may run again (a RetryAfter),
    # sooner than the next task's deadline (0.2 s: the start must not wake
    # it, and the timer must find the task when it wakes) or later (60 s: the
    # start must wake it).  Either way the task times out, although it never
    # returns by itself.
    d = make_dispatcher(send_timeout=1.0)
    attempts = []

    def parks_once(sc):
        attempts.append(sc.attempt)
        if sc.attempt == 1:
            raise RetryAfter(parked_for)
        return "ran again"

    parked = d.submit("parked", parks_once)
    t0 = time.monotonic()
    while d.stats().retried == 0:          # the chat is parked once this counts it
        assert time.monotonic() - t0 < 10, "the RetryAfter was never taken"
        time.sleep(0.005)
    release = threading.Event()
    stuck = d.submit("stuck", lambda sc: release.wait(30))
    try:
        with pytest.raises(SendTimeout):
            stuck.result(10)
    finally:
        release.set()
    assert d.stats().timed_out == 1
    if parked_for < 1:
        assert parked.result(10) == "ran again" and attempts == [1, 2]
    else:
        assert not parked.done() and attempts == [1]
        d.force_close()                    # (not 60 s of waiting)
        with pytest.raises(Cancelled):
            parked.result(10)


def test_no_timeout_means_no_deadline(make_dispatcher):
    d = make_dispatcher(send_timeout=None)
    fut = d.submit("c", lambda sc: (sc.deadline, sc.remaining(), sc.cancelled))
    assert fut.result(5) == (None, None, False)


def test_send_context_can_be_built_by_hand(impl):
    sc = impl.SendContext("chat", deadline=time.monotonic() + 60)
    assert sc.chat_id == "chat" and not sc.cancelled and 59 < sc.remaining() <= 60
    sc.check()
    assert sc.wait(0.01) is False
    expired = impl.SendContext("chat", deadline=time.monotonic() - 1)
    assert expired.cancelled and expired.remaining() == 0.0 and expired.wait(5) is True
    with pytest.raises(SendTimeout):
        expired.check()
    free = impl.SendContext("chat")
    assert free.deadline is None and free.remaining() is None


# ---------------------------------------------------------------------- panics

class Panic(BaseException):
    pass


@pytest.mark.parametrize("panic", [SystemExit(3), KeyboardInterrupt(), Panic("custom")])
def test_panic_discards_the_chat_and_resolves_every_future(make_dispatcher, panic):
    rec = Recorder()
    recovered = []
    order = []
    d = make_dispatcher(max_inflight=1, hooks=rec.hooks(),
                        recover=lambda exc: (recovered.append(exc),
                                             order.append(("recover", len(rec.done)))))
    gate, first = blocker(d, "c")

    def explode(sc):
        raise panic

    boom = d.submit("c", explode)
    behind = [d.submit("c", lambda sc: "never") for _ in range(3)]
    d.post("c", lambda sc: "never")
    gate.set()
    with pytest.raises(TaskDiscarded) as info:
        boom.result(5)
    assert info.value.__cause__ is panic
    for fut in behind:
        with pytest.raises(TaskDiscarded):
            fut.result(5)
    assert d.drain(5)
    assert recovered == [panic]
    assert order == [("recover", 6)]          # after on_done of all six tasks
    assert d.active_chats == 0
    # The worker survived: the same chat and others keep working.
    assert d.submit("c", lambda sc: "alive").result(5) == "alive"
    assert d.submit("d", lambda sc: "alive").result(5) == "alive"
    s = d.stats()
    assert (s.completed, s.failed, s.discarded) == (3, 1, 4)
    assert s.threads == 1


def test_panic_without_recover_is_logged(make_dispatcher, caplog):
    d = make_dispatcher()

    def explode(sc):
        raise Panic("x")

    with caplog.at_level(logging.ERROR, logger="fastdispatch"):
        fut = d.submit("c", explode)
        with pytest.raises(TaskDiscarded):
            fut.result(5)
        assert d.drain(5)
    assert any("panicked" in r.getMessage() for r in caplog.records)


# ----------------------------------------------------------------------- hooks

def test_hooks_see_queue_start_and_done(make_dispatcher):
    rec = Recorder()
    d = make_dispatcher(hooks=rec.hooks())
    gate, _ = blocker(d, "c")
    d.submit("c", lambda sc: None)
    d.submit("c", lambda sc: None)
    gate.set()
    assert d.drain(5)
    assert rec.named("on_queued") == [("c", 1), ("c", 1), ("c", 2)]
    assert rec.named("on_start") == [("c",)] * 3
    assert [i.queue_len for i in rec.done] == [0, 1, 0]
    for info in rec.done:
        assert isinstance(info, DispatchInfo) and info.chat_id == "c" and info.error is None
        assert info.queue_latency >= 0 and info.run_latency >= 0
        with pytest.raises(AttributeError):
            info.error = ValueError()
    assert rec.done[1].queue_latency > 0


@pytest.mark.parametrize("failing", ["on_queued", "on_start", "on_done", "on_rejected"])
def test_failing_hook_is_logged_and_recovered_and_loses_nothing(make_dispatcher, failing, caplog):
    def bad(*args):
        raise RuntimeError("hook bug")

    rec = Recorder()
    recovered = []
    d = make_dispatcher(queue_size=1, hooks=rec.hooks(**{failing: bad}),
                        recover=recovered.append)
    with caplog.at_level(logging.ERROR, logger="fastdispatch"):
        gate, first = blocker(d, "c")
        second = d.submit("c", lambda sc: "second")
        with pytest.raises(QueueFull):
            d.submit("c", lambda sc: "rejected")
        gate.set()
        assert first.result(5) is True and second.result(5) == "second"
        assert d.drain(5)
    assert recovered and all(isinstance(e, RuntimeError) for e in recovered)
    assert any(failing in r.getMessage() for r in caplog.records)
    assert d.submit("c", lambda sc: "still works").result(5) == "still works"


def test_recover_that_raises_is_logged_and_swallowed(make_dispatcher, caplog):
    def bad_recover(exc):
        raise RuntimeError("recover bug")

    d = make_dispatcher(recover=bad_recover,
                        hooks=DispatcherHooks(on_start=lambda chat: 1 / 0))
    with caplog.at_level(logging.ERROR, logger="fastdispatch"):
        assert d.submit("c", lambda sc: "ok").result(5) == "ok"
        assert d.drain(5)
    assert any("recover" in r.getMessage() for r in caplog.records)


# ----------------------------------------------------------------------- stats

def test_stats_account_for_every_accepted_task(make_dispatcher):
    d = make_dispatcher(queue_size=3, send_timeout=0.2, max_inflight=2)
    gate, _ = blocker(d, "a")
    futs = [d.submit("a", lambda sc: 1) for _ in range(3)]
    futs[0].cancel()
    with pytest.raises(QueueFull):
        d.submit("a", lambda sc: 1)
    d.submit("b", lambda sc: 1 / 0)
    d.submit("t", lambda sc: time.sleep(0.4))
    gate.set()
    assert d.drain(10)
    s = d.stats()
    assert s.submitted == 6 and s.rejected == 1
    assert (s.completed, s.failed, s.cancelled, s.timed_out) == (3, 1, 1, 1)
    assert s.submitted == s.completed + s.failed + s.discarded + s.cancelled + s.timed_out
    assert (s.active_chats, s.inflight) == (0, 0)
    assert s["completed"] == s.completed and dict(zip(s._fields, s))["failed"] == 1


def _compiled_result():
    # Whether the compiled core is here and gave Future its result().
    try:
        from fastdispatch import _ringbuf
    except ImportError:
        return False
    return _ringbuf._future_layout_is_known()


class _FalsyError(Exception):
    def __bool__(self):
        return False


@pytest.mark.parametrize("made", ["by-submit", "by-hand"])
def test_result_of_a_future_is_the_stdlibs_in_every_state(make_dispatcher, made):
    # The compiled core reads a finished Future's result from C: in every
    # state, result() does what concurrent.futures' own Future does.
    d = make_dispatcher()
    boom, falsy = ValueError("boom"), _FalsyError()

    def outcome(future, timeout=None):
        try:
            return ("value", future.result(timeout))
        except BaseException as exc:
            return ("raised", type(exc), exc if exc is boom or exc is falsy else None)

    plain = concurrent.futures.Future()
    plain.set_running_or_notify_cancel()
    held = threading.Event()
    if made == "by-submit":
        started = threading.Event()
        ours = d.submit("c", lambda sc: (started.set(), held.wait(10))[1])
        assert started.wait(10)
    else:
        ours = Future()
        ours.set_running_or_notify_cancel()
    assert outcome(ours, 0.01) == outcome(plain, 0.01) == (
        "raised", concurrent.futures.TimeoutError, None)
    if made == "by-submit":
        held.set()
        assert ours.result(10) is True
    else:
        ours.set_result(True)
    plain.set_result(True)
    for timeout in (None, 0, 5, "not a timeout"):
        assert outcome(ours, timeout) == outcome(plain, timeout) == ("value", True)
    for settle in (lambda f: f.set_exception(boom), lambda f: f.set_exception(falsy),
                   lambda f: f.cancel(), lambda f: f.set_result(None)):
        mine, theirs = Future(), concurrent.futures.Future()
        settle(mine)
        settle(theirs)
        assert outcome(mine) == outcome(theirs)
        assert outcome(mine, 0) == outcome(theirs, 0)
    # A result() blocked before the result came is woken with it.
    late, got = Future(), []
    waiter = threading.Thread(target=lambda: got.append(late.result(10)))
    waiter.start()
    time.sleep(0.05)
    late.set_result("late")
    waiter.join(10)
    assert got == ["late"]
    compiled = _compiled_result()   # (imports the compiled core, if it is here)
    assert (Future.result is not concurrent.futures.Future.result) == compiled
    assert Future.result.__name__ == "result"
    assert Future.result.__doc__ == concurrent.futures.Future.result.__doc__


def test_inflight_and_queue_len_are_readable_at_any_time(make_dispatcher):
    d = make_dispatcher()
    gate, _ = blocker(d, "c")
    d.submit("c", lambda sc: None)
    assert d.inflight == 1 and d.queue_len("c") == 1 and d.queue_len("x") == 0
    assert d.stats().inflight == 1
    gate.set()
    assert d.drain(5)
    assert d.inflight == 0


def test_future_from_submit_behaves_like_a_plain_future(make_dispatcher):
    d = make_dispatcher()
    started, gate = threading.Event(), threading.Event()
    fut = d.submit("c", lambda sc: (started.set(), gate.wait(10), "value")[2])
    # A subclass only in how it runs done-callbacks (see test_error_paths.py).
    assert isinstance(fut, concurrent.futures.Future)
    assert type(fut).__bases__ == (concurrent.futures.Future,)
    # And, once the compiled core is imported, in how result() reads a
    # finished one (test_result_of_a_future_is_the_stdlibs_in_every_state).
    own = {"_invoke_callbacks"} | ({"result"} if _compiled_result() else set())
    assert {k for k in vars(type(fut)) if not k.startswith("__")} == own
    assert started.wait(10)
    assert fut.running() and not fut.done() and not fut.cancel()
    called = []
    callback_ran = threading.Event()
    fut.add_done_callback(lambda f: (called.append(f), callback_ran.set()))
    released = []
    waiter = threading.Thread(target=lambda: released.append(fut.result(10)))
    waiter.start()
    time.sleep(0.05)                        # the waiter is blocked in result()
    gate.set()
    waiter.join(10)
    # The worker runs the callbacks after it has woken the waiter.
    assert callback_ran.wait(10)
    assert released == ["value"] and called == [fut]
    assert fut.done() and fut.exception() is None and "finished" in repr(fut)
    # A task that fails with no one waiting: the exception is stored all the same.
    bad = d.submit("c", lambda sc: 1 / 0)
    assert isinstance(bad.exception(10), ZeroDivisionError)
    late = []
    bad.add_done_callback(late.append)       # added after completion: runs at once
    assert late == [bad]
