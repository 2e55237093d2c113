"""Pacing and retries under hostile input: every wait is bounded, nothing dies.

G12 in docs/guarantees.md ("A limit holds where the platform sees it") and the ground rule
that user code and platforms are hostile.  Each test is named after the
guarantee it protects and runs on both cores.  The families they stand for:

- every wait computed from outside input (a task's ``RetryAfter``, a
  ``RateLimit``, a ``RetryPolicy``) is bounded by ``threading.TIMEOUT_MAX``
  or refused at the call that set it;
- every time the timer decides to sleep, whatever makes work due wakes it;
- whatever a caller does to a Future it holds, the worker survives and the
  chat goes on;
- every per-key table the timer keeps is pruned;
- a start counts at the call, so windows hold on the times tasks were called.
"""

import logging
import random
import threading
import time
from collections import defaultdict

import pytest

from fastdispatch import (Cancelled, DispatcherHooks, Pacing, RateLimit, RetryAfter,
                          RetryPolicy, SendTimeout)
from fastdispatch._errors import DispatcherError

from helpers import max_in_window, wait_until


# --------------------------------------------------- the timer never stalls

def test_global_line_is_served_to_the_end_without_send_timeout(make_dispatcher):
    """Granting a whole window at once must not leave the timer asleep for good.

    With only a global limit and no send_timeout, nothing but the line's
    own progress wakes the timer; and it must still be there after
    ``idle_timeout`` while chats wait in the line.
    """
    d = make_dispatcher(max_inflight=64, send_timeout=None, idle_timeout=0.2,
                        pacing=Pacing(global_limit=RateLimit(30, per=0.1)))
    futs = [d.submit(chat, lambda sc: sc.started) for chat in range(200)]
    starts = [f.result(timeout=30) for f in futs]
    assert d.drain(timeout=10)
    assert max_in_window(starts, 0.1) <= 30
    assert d.stats().completed == 200


def test_line_waiting_for_a_slow_start_is_served_after_idle_timeout(make_dispatcher):
    """Chats in the line behind starts that take long to be made (a slow
    on_start) are granted once those starts are made, even when the timer
    had nothing else to watch for longer than idle_timeout."""
    def on_start(chat):
        if chat < 2:
            time.sleep(0.5)

    d = make_dispatcher(max_inflight=8, send_timeout=None, idle_timeout=0.1,
                        hooks=DispatcherHooks(on_start=on_start),
                        pacing=Pacing(global_limit=RateLimit(2, per=0.05)))
    futs = [d.submit(chat, lambda sc: sc.started) for chat in range(10)]
    starts = [f.result(timeout=30) for f in futs]
    assert max_in_window(starts, 0.05) <= 2
    assert d.drain(timeout=10)


# ------------------------------------------------ every wait is bounded

def test_waits_longer_than_a_lock_can_wait_are_refused_at_the_call():
    big = threading.TIMEOUT_MAX * 2
    with pytest.raises(ValueError, match="per"):
        RateLimit(1, per=big)
    with pytest.raises(ValueError, match="max_retry_after"):
        RetryPolicy(max_retry_after=big)
    with pytest.raises(ValueError, match="max_backoff"):
        RetryPolicy(max_backoff=big)
    with pytest.raises(ValueError, match="backoff"):
        RetryPolicy(backoff=big)
    # The largest accepted values are accepted.
    RateLimit(1, per=threading.TIMEOUT_MAX)
    RetryPolicy(max_retry_after=threading.TIMEOUT_MAX)


def test_the_longest_retry_after_allowed_leaves_the_timer_alive(make_dispatcher):
    """A RetryAfter as long as the policy allows parks its chat for that long;
    the timer thread still enforces other chats' deadlines."""
    d = make_dispatcher(send_timeout=0.3,
                        retry=RetryPolicy(max_retry_after=threading.TIMEOUT_MAX))
    parked = d.submit("parked", lambda sc: (_ for _ in ()).throw(
        RetryAfter(threading.TIMEOUT_MAX * 0.99)) if sc.attempt == 1 else "late")
    assert wait_until(lambda: d.stats().retried == 1)
    slow = d.submit("slow", lambda sc: time.sleep(0.6))
    with pytest.raises(SendTimeout):
        slow.result(timeout=5)
    assert d.submit("other", lambda sc: "ok").result(timeout=5) == "ok"
    d.force_close()
    assert parked.cancelled() or isinstance(parked.exception(timeout=5), Cancelled)


def test_the_longest_window_allowed_leaves_the_timer_alive(make_dispatcher):
    d = make_dispatcher(send_timeout=0.3,
                        pacing=Pacing(chat_limit=RateLimit(1, per=threading.TIMEOUT_MAX)))
    assert d.submit("c", lambda sc: 1).result(timeout=5) == 1
    second = d.submit("c", lambda sc: 2)          # parked for ~292 years
    with pytest.raises(SendTimeout):
        d.submit("slow", lambda sc: time.sleep(0.6)).result(timeout=5)
    d.force_close()
    assert second.cancelled()


class RawRetryAfter(RetryAfter):
    """A RetryAfter that keeps the raw header: ``seconds`` is whatever came."""

    def __init__(self, raw):
        super().__init__(0)
        self.seconds = raw


class HostileScope(RetryAfter):
    class _Scope:
        def __eq__(self, other):
            raise RuntimeError("scope comparison")
        __hash__ = None

    def __init__(self):
        super().__init__(0.01)
        self.scope = self._Scope()


@pytest.mark.parametrize("raw, error", [
    ("120", TypeError), (None, TypeError), (b"1", TypeError), (object(), TypeError),
    (float("nan"), ValueError), (-3.0, ValueError),
])
def test_a_retry_after_whose_seconds_is_not_a_number_fails_only_its_task(
        make_dispatcher, raw, error):
    d = make_dispatcher(max_inflight=2)
    bad = d.submit("c", lambda sc: (_ for _ in ()).throw(RawRetryAfter(raw)))
    after = d.submit("c", lambda sc: "next")
    exc = bad.exception(timeout=5)
    assert isinstance(exc, error) and "seconds" in str(exc)
    assert isinstance(exc.__cause__, RawRetryAfter)
    assert after.result(timeout=5) == "next"
    assert d.drain(timeout=5)
    s = d.stats()
    assert s.failed == 1 and s.completed == 1 and s.inflight == 0


def test_a_retry_after_too_long_for_a_float_fails_with_itself(make_dispatcher):
    d = make_dispatcher()
    fut = d.submit("c", lambda sc: (_ for _ in ()).throw(RawRetryAfter(10 ** 400)))
    assert isinstance(fut.exception(timeout=5), RawRetryAfter)
    assert d.submit("c", lambda sc: "next").result(timeout=5) == "next"


def test_a_retry_after_with_a_hostile_scope_pauses_only_its_chat(make_dispatcher):
    d = make_dispatcher()
    fut = d.submit("c", lambda sc: (_ for _ in ()).throw(HostileScope())
                   if sc.attempt == 1 else sc.attempt)
    assert fut.result(timeout=5) == 2


def test_a_retry_on_class_that_raises_in_isinstance_fails_only_its_task(make_dispatcher):
    class Meta(type):
        def __instancecheck__(cls, obj):
            raise RuntimeError("isinstance")

    class Hostile(Exception, metaclass=Meta):
        pass

    d = make_dispatcher(retry=RetryPolicy(retry_on=(Hostile,)))
    fut = d.submit("c", lambda sc: (_ for _ in ()).throw(ValueError("boom")))
    exc = fut.exception(timeout=5)
    assert isinstance(exc, RuntimeError) and isinstance(exc.__cause__, ValueError)
    assert d.submit("c", lambda sc: "next").result(timeout=5) == "next"
    assert d.drain(timeout=5)


# ------------------------------------- the caller's Future is the caller's

def test_a_caller_resolving_its_future_while_the_task_runs_does_not_stop_the_chat(
        make_dispatcher):
    d = make_dispatcher(max_inflight=2)
    running, release = threading.Event(), threading.Event()

    def task(sc):
        running.set()
        release.wait(5)
        return "from the task"

    fut = d.submit("c", task)
    assert running.wait(5)
    fut.set_result("from the caller")
    release.set()
    assert d.submit("c", lambda sc: "next").result(timeout=5) == "next"
    assert fut.result() == "from the caller"
    assert d.drain(timeout=5)
    s = d.stats()
    assert s.completed == 2 and s.threads <= 2


@pytest.mark.parametrize("meddle", ["set_running", "set_result", "set_exception",
                                    "cancel_and_notify"])
def test_a_caller_moving_its_future_on_before_the_start_does_not_stop_the_chat(
        make_dispatcher, meddle):
    """Only cancel() skips a task; whatever else the caller does to the
    Future before the task starts, the task runs and the chat goes on."""
    d = make_dispatcher(max_inflight=2)
    gate = threading.Event()
    ran = []
    d.submit("c", lambda sc: gate.wait(5))
    fut = d.submit("c", lambda sc: ran.append("ran"))
    if meddle == "set_running":
        assert fut.set_running_or_notify_cancel()
    elif meddle == "set_result":
        fut.set_result("mine")
    elif meddle == "set_exception":
        fut.set_exception(KeyError("mine"))
    else:
        assert fut.cancel()
        assert not fut.set_running_or_notify_cancel()
    gate.set()
    assert d.submit("c", lambda sc: "next").result(timeout=5) == "next"
    assert d.drain(timeout=5)
    assert ran == ([] if meddle == "cancel_and_notify" else ["ran"])
    s = d.stats()
    assert s.submitted == s.completed + s.failed + s.cancelled + s.discarded + s.timed_out


def test_a_caller_resolving_a_future_that_times_out_leaves_the_timer_alive(make_dispatcher):
    d = make_dispatcher(send_timeout=0.3)
    running = threading.Event()

    def task(sc):
        running.set()
        time.sleep(0.6)

    fut = d.submit("c", task)
    assert running.wait(5)
    fut.set_result("mine")
    # The deadline passes; the timer's set_exception meets a done Future.
    with pytest.raises(SendTimeout):
        d.submit("other", lambda sc: time.sleep(0.6)).result(timeout=5)
    assert d.drain(timeout=5)
    assert d.stats().timed_out == 2


# ------------------------------------------------- the timer's tables shrink

def test_timer_tables_do_not_grow_with_every_distinct_period(make_dispatcher):
    d = make_dispatcher(max_inflight=8, pacing=Pacing(
        limit_for=lambda chat: RateLimit(1, per=0.02 + chat * 1e-7)))
    for chat in range(2000):
        d.post(chat, lambda sc: None)
    assert d.drain(timeout=30)
    assert wait_until(lambda: d._pacing_state()["windows"] == 0, timeout=10)
    state = d._pacing_state()
    assert state["expiry"] == 0 and state["expiry_lists"] == 0


def test_a_window_whose_chat_never_started_is_forgotten(make_dispatcher):
    """A chat gets its window before its first start; if that start never
    comes (here: its task is cancelled while it waits in the global line),
    the window is forgotten all the same."""
    d = make_dispatcher(pacing=Pacing(chat_limit=RateLimit(1, per=0.05),
                                      global_limit=RateLimit(1, per=0.5)))
    assert d.submit("a", lambda sc: "a").result(timeout=5) == "a"
    waiting = d.submit("b", lambda sc: "b")
    assert wait_until(lambda: d._pacing_state()["line"] == 1)
    assert d._pacing_state()["windows"] == 2
    assert waiting.cancel()
    assert d.drain(timeout=5)
    assert wait_until(lambda: d._pacing_state()["windows"] == 0, timeout=5)


def test_force_close_forgets_every_window(make_dispatcher):
    d = make_dispatcher(pacing=Pacing(chat_limit=RateLimit(1, per=60.0)))
    for chat in range(5):
        d.submit(chat, lambda sc: None).result(timeout=5)
    assert d._pacing_state()["windows"] == 5
    d.force_close()
    state = d._pacing_state()
    assert state["windows"] == state["expiry"] == state["expiry_lists"] == 0


# ------------------------------------------- a start counts at the call

def test_a_start_is_counted_when_the_task_is_called_after_on_start(make_dispatcher):
    """A slow on_start cannot squeeze two calls of a chat closer than its window."""
    hook_done = []

    def on_start(chat):
        if not hook_done:
            time.sleep(0.3)
        hook_done.append(time.monotonic())

    calls = []

    def task(sc):
        calls.append((sc.started, time.monotonic()))

    d = make_dispatcher(hooks=DispatcherHooks(on_start=on_start),
                        pacing=Pacing(chat_limit=RateLimit(1, per=0.5)))
    d.submit("c", task)
    d.submit("c", task).result(timeout=5)
    (s1, line1), (s2, line2) = calls
    assert s1 >= hook_done[0] and s1 <= line1 and s2 <= line2
    assert s2 - s1 >= 0.5
    assert line2 - line1 >= 0.5 - (line1 - s1)


def test_global_window_holds_on_call_times_under_contention(make_dispatcher,
                                                            tiny_switch_interval):
    """Concurrent chats, hooks that take their time: at most count calls in
    any window, on the times the tasks were called."""
    rng = random.Random(3)
    delays = [rng.choice([0, 0, 0.001, 0.005]) for _ in range(400)]

    def on_start(chat):
        if delays[chat]:
            time.sleep(delays[chat])

    d = make_dispatcher(max_inflight=16, hooks=DispatcherHooks(on_start=on_start),
                        pacing=Pacing(global_limit=RateLimit(10, per=0.1)))
    futs = [d.submit(chat, lambda sc: sc.started) for chat in range(400)]
    starts = [f.result(timeout=60) for f in futs]
    assert max_in_window(starts, 0.1) <= 10


def test_a_refused_attempt_does_not_cost_the_chat_a_window(make_dispatcher):
    """After a RetryAfter the retry goes as soon as retry_after allows: the
    refused attempt is not held against the chat's window as well."""
    calls = []

    def task(sc):
        calls.append(sc.started)
        if sc.attempt == 1:
            raise RetryAfter(0.01)
        return "sent"

    d = make_dispatcher(pacing=Pacing(chat_limit=RateLimit(1, per=5.0)))
    assert d.submit("c", task).result(timeout=4) == "sent"
    assert calls[1] - calls[0] >= 0.01
    # The accepted attempt is held against the window as usual.
    late = d.submit("c", lambda sc: sc.started)
    time.sleep(0.2)
    assert not late.done()
    d.force_close()


# --------------------------------------------- a failing post is not silent

def test_a_failing_post_task_is_logged_once_with_its_traceback(make_dispatcher, caplog):
    d = make_dispatcher()

    def broken(sc):
        raise KeyError("no such user")

    with caplog.at_level(logging.ERROR, logger="fastdispatch"):
        d.post("chat-7", broken)
        assert d.drain(timeout=5)
    records = [r for r in caplog.records if "posted" in r.getMessage()]
    assert len(records) == 1
    assert "chat-7" in records[0].getMessage()
    assert records[0].exc_info[0] is KeyError
    assert "broken" in caplog.text  # the traceback names the task


def test_a_post_that_times_out_is_logged(make_dispatcher, caplog):
    d = make_dispatcher(send_timeout=0.1)
    with caplog.at_level(logging.ERROR, logger="fastdispatch"):
        d.post("c", lambda sc: time.sleep(0.3))
        assert d.drain(timeout=5)
    records = [r for r in caplog.records if "posted" in r.getMessage()]
    assert len(records) == 1 and records[0].exc_info[0] is SendTimeout


def test_a_failing_post_task_observed_by_on_done_is_not_logged(make_dispatcher, caplog):
    seen = []
    d = make_dispatcher(hooks=DispatcherHooks(on_done=lambda info: seen.append(info.error)))
    with caplog.at_level(logging.DEBUG, logger="fastdispatch"):
        d.post("c", lambda sc: {}["missing"])
        d.post("c", lambda sc: None)
        assert d.drain(timeout=5)
    assert not [r for r in caplog.records if "posted" in r.getMessage()]
    assert isinstance(seen[0], KeyError) and seen[1] is None


def test_a_failing_submit_task_is_left_to_its_future(make_dispatcher, caplog):
    d = make_dispatcher()
    with caplog.at_level(logging.DEBUG, logger="fastdispatch"):
        fut = d.submit("c", lambda sc: {}["missing"])
        assert isinstance(fut.exception(timeout=5), KeyError)
        assert d.drain(timeout=5)
    assert not [r for r in caplog.records if "posted" in r.getMessage()]


# --------------------------------------------------------- the random soak

@pytest.mark.stress
@pytest.mark.parametrize("send_timeout", [None, 0.5])
def test_random_mix_of_limits_retries_cancels_and_slow_hooks_keeps_every_promise(
        make_dispatcher, tiny_switch_interval, soak_factor, send_timeout):
    """Global and chat limits, RetryAfter of both scopes, retry_on errors,
    cancels, hooks that sleep, many producers: afterwards no Future is
    pending, the counters are exact, each chat ran in order and never two
    at once, and every window held on the times the tasks were called."""
    rng = random.Random(11 if send_timeout is None else 12)
    glob, chat_limit, group = RateLimit(25, per=0.1), RateLimit(2, per=0.05), RateLimit(1, per=0.1)
    lock = threading.Lock()
    starts = defaultdict(list)          # chat -> [(seq, attempt, started)]
    all_starts = []
    running = set()
    overlaps = []

    def on_start(chat):
        if rng.random() < 0.05:
            time.sleep(0.002)

    d = make_dispatcher(
        max_inflight=12, queue_size=10_000, send_timeout=send_timeout,
        hooks=DispatcherHooks(on_start=on_start),
        retry=RetryPolicy(max_attempts=4, backoff=0.001, max_backoff=0.004),
        pacing=Pacing(global_limit=glob, chat_limit=chat_limit,
                      limit_for=lambda c: group if c[1] < 0 else None))

    def make_task(chat, seq, plan):
        def task(sc):
            with lock:
                if chat in running:
                    overlaps.append(chat)
                running.add(chat)
                kind = plan[sc.attempt - 1] if sc.attempt <= len(plan) else None
                starts[chat].append((seq, kind, sc.started))
                all_starts.append(sc.started)
            try:
                if kind == "chat":
                    raise RetryAfter(0.003)
                if kind == "global":
                    raise RetryAfter(0.002, scope="global")
                if kind == "conn":
                    raise ConnectionError("flaky")
                if kind == "fail":
                    raise ValueError("bad request")
                return seq
            finally:
                with lock:
                    running.discard(chat)
        return task

    futs = []
    per_producer = 120 * soak_factor

    def producer(p):
        local = random.Random(p)
        mine = []
        for seq in range(per_producer):
            chat = (p, local.choice([-1, -2, 1, 2, 3, 4, 5]))
            plan = [local.choice(["chat", "global", "conn", "fail"])
                    for _ in range(local.choice([0, 0, 0, 0, 1, 2]))]
            fut = d.submit(chat, make_task(chat, seq, plan))
            if local.random() < 0.05:
                fut.cancel()
            mine.append(fut)
        with lock:
            futs.extend(mine)

    threads = [threading.Thread(target=producer, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert d.drain(timeout=120)
    assert all(f.done() for f in futs)
    s = d.stats()
    assert s.submitted == len(futs)
    assert s.submitted == s.completed + s.failed + s.discarded + s.cancelled + s.timed_out
    assert s.inflight == 0 and s.parked == 0 and d.active_chats == 0
    assert not overlaps
    for chat, runs in starts.items():
        seqs = [seq for seq, _, _ in runs]
        assert seqs == sorted(seqs), chat
        # An attempt refused with RetryAfter is not held against its chat's
        # window (the bot-wide one still counts it).
        times = [t for _, kind, t in runs if kind not in ("chat", "global")]
        limit = group if chat[1] < 0 else chat_limit
        assert max_in_window(times, limit.per) <= limit.count, chat
    assert max_in_window(all_starts, glob.per) <= glob.count
    for f in futs:
        if not f.cancelled() and f.exception() is not None:
            assert isinstance(f.exception(), (ValueError, ConnectionError, RetryAfter,
                                              DispatcherError)), f.exception()
