"""docs/guarantees.md G12-G15: pacing (rate limits per chat, per group, bot-wide) and retries.

Every test runs on both cores.  Limits are scaled down (tens of
milliseconds) so that the real clock can be used.  The tasks record
``sc.started``: the time of their own call, which is the very stamp the
limiter's windows hold (it is taken right before the call, after
``on_start``), so each window check is exact: no tolerance for a busy
machine.
"""

import gc
import random
import threading
import time
from collections import defaultdict

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fastdispatch import (
    Cancelled,
    DispatcherHooks,
    Pacing,
    RateLimit,
    RetryAfter,
    RetryPolicy,
    SendTimeout,
)

from helpers import max_in_window, wait_until


class Recorder:
    """A task factory that records (chat, seq, start, end) and overlaps."""

    def __init__(self):
        self.lock = threading.Lock()
        self.starts = defaultdict(list)     # chat -> [(seq, t)]
        self.all_starts = []
        self.running = set()
        self.overlaps = 0
        self.late_stamps = 0    # a stamp taken after the task's first line

    def task(self, chat, seq, work=0.0, fail=None):
        def run(sc):
            line = time.monotonic()
            t = sc.started
            with self.lock:
                if t is None or t > line:
                    self.late_stamps += 1
                if chat in self.running:
                    self.overlaps += 1
                self.running.add(chat)
                self.starts[chat].append((seq, t, sc.attempt))
                self.all_starts.append(t)
            try:
                if work:
                    time.sleep(work)
                if fail is not None:
                    exc = fail(sc)
                    if exc is not None:
                        raise exc
                return (chat, seq)
            finally:
                with self.lock:
                    self.running.discard(chat)
        return run


# ------------------------------------------------------------------ arguments

@pytest.mark.parametrize("args, exc", [
    ((0, 1), ValueError), ((-1, 1), ValueError), ((1, 0), ValueError),
    ((1, -1.0), ValueError), ((1, float("inf")), ValueError), ((1, float("nan")), ValueError),
    ((1.5, 1), TypeError), (("1", 1), TypeError), ((True, 1), TypeError), ((1, "1"), TypeError),
])
def test_rate_limit_rejects_bad_values_naming_the_argument(args, exc):
    with pytest.raises(exc, match="count|per"):
        RateLimit(*args)


def test_pacing_and_retry_policy_reject_bad_arguments():
    with pytest.raises(TypeError, match="global_limit"):
        Pacing(global_limit=30)
    with pytest.raises(TypeError, match="chat_limit"):
        Pacing(chat_limit=(1, 1))
    with pytest.raises(TypeError, match="limit_for"):
        Pacing(limit_for=5)
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="backoff"):
        RetryPolicy(backoff=-1)
    with pytest.raises(TypeError, match="retry_on"):
        RetryPolicy(retry_on=("ConnectionError",))
    with pytest.raises(ValueError, match="scope"):
        RetryAfter(1, scope="everything")
    with pytest.raises(ValueError, match="seconds"):
        RetryAfter(-1)


def test_dispatcher_rejects_bad_pacing_and_retry(impl):
    with pytest.raises(TypeError, match="pacing"):
        impl.OutboundDispatcher(pacing=RateLimit(1, 1))
    with pytest.raises(TypeError, match="retry"):
        impl.OutboundDispatcher(retry=3)


def test_telegram_preset_limits_groups_privately_and_bot_wide():
    p = Pacing.telegram(margin=0)
    assert p.global_limit == RateLimit(15, per=0.5)         # 30/s, in halves
    assert p.chat_limit == RateLimit(1, per=1.0)
    group = RateLimit(20, per=60.0)
    assert p.limit_for(-1001234) == group and p.limit_for("-42") == group
    assert p.limit_for(1234) is None and p.limit_for("1234") is None
    from fastdispatch import ChatInfo
    assert p.limit_for(ChatInfo("x", is_group=True)) == group
    assert p.limit_for(ChatInfo("x")) is None
    assert Pacing.telegram(broadcast=1000, margin=0).global_limit == RateLimit(1000, per=1.0)


def test_discord_preset_is_bot_wide_only():
    # Per-channel limits are learned from the answers (sc.report_limit).
    p = Pacing.discord()
    assert p.global_limit == RateLimit(50, per=1.0)
    assert p.chat_limit is None and p.limit_for is None


# ------------------------------------------------------------- sliding window

def test_chat_limit_is_a_sliding_window_per_chat(make_dispatcher):
    rec = Recorder()
    d = make_dispatcher(max_inflight=8, pacing=Pacing(chat_limit=RateLimit(3, per=0.3)))
    futs = [d.submit(c, rec.task(c, i)) for i in range(12) for c in range(4)]
    for f in futs:
        f.result(timeout=10)
    for c in range(4):
        times = [t for _, t, _ in rec.starts[c]]
        assert [s for s, _, _ in rec.starts[c]] == list(range(12))
        assert max_in_window(times, 0.3) <= 3
        # 12 starts at 3 per 0.3 s take at least 3 windows
        assert times[-1] - times[0] >= 3 * 0.3
    assert d.stats().paced > 0


def test_global_limit_holds_in_every_window_across_chats(make_dispatcher):
    rec = Recorder()
    d = make_dispatcher(max_inflight=16, pacing=Pacing(global_limit=RateLimit(20, per=0.3)))
    futs = [d.submit(c, rec.task(c, i)) for i in range(3) for c in range(40)]
    for f in futs:
        f.result(timeout=10)
    assert len(rec.all_starts) == 120
    assert max_in_window(rec.all_starts, 0.3) <= 20
    span = max(rec.all_starts) - min(rec.all_starts)
    assert span >= 5 * 0.3


def test_group_limit_from_limit_for_applies_to_groups_only(make_dispatcher):
    rec = Recorder()
    group = RateLimit(2, per=0.6)
    d = make_dispatcher(max_inflight=8, pacing=Pacing(
        chat_limit=RateLimit(5, per=0.3),
        limit_for=lambda chat: group if chat < 0 else None))
    futs = [d.submit(c, rec.task(c, i)) for i in range(6) for c in (-1, -2, 1, 2)]
    for f in futs:
        f.result(timeout=10)
    for c in (-1, -2):
        assert max_in_window([t for _, t, _ in rec.starts[c]], 0.6) <= 2
    for c in (1, 2):
        times = [t for _, t, _ in rec.starts[c]]
        assert max_in_window(times, 0.3) <= 5
        # The group limit did not apply: 6 starts at 2 per 0.6 s would
        # take at least 1.2 s.
        assert times[-1] - times[0] < 1.0
    assert rec.late_stamps == 0


def test_window_outlives_the_chat_queue(make_dispatcher):
    """A chat that sends, empties and sends again soon still respects its limit."""
    rec = Recorder()
    d = make_dispatcher(pacing=Pacing(chat_limit=RateLimit(1, per=0.3)))
    d.submit("c", rec.task("c", 0)).result(timeout=5)
    assert wait_until(lambda: d.active_chats == 0)
    time.sleep(0.06)
    d.submit("c", rec.task("c", 1)).result(timeout=5)
    (_, t0, _), (_, t1, _) = rec.starts["c"]
    assert t1 - t0 >= 0.3


def test_windows_are_forgotten_after_they_pass(make_dispatcher):
    """Limiter state does not grow with the number of chats ever seen."""
    d = make_dispatcher(max_inflight=4, pacing=Pacing(chat_limit=RateLimit(1, per=0.2)))
    for c in range(3000):
        d.post(c, lambda sc: None)
    assert d.drain(timeout=20)
    assert d._pacing_state()["windows"] > 0
    assert wait_until(lambda: d._pacing_state()["windows"] == 0, timeout=5)
    assert d._pacing_state()["expiry"] == 0


def test_paced_chats_hold_no_thread(make_dispatcher, impl):
    """500 parked chats: idle workers exit; only the timer thread is left."""
    release = threading.Event()
    d = make_dispatcher(max_inflight=8, idle_timeout=0.05,
                        pacing=Pacing(chat_limit=RateLimit(1, per=30.0)))
    for c in range(500):
        d.post(c, lambda sc: None)
    for c in range(500):
        d.post(c, lambda sc: release.set())     # each must wait 30 s
    assert wait_until(lambda: d.stats().parked == 500)
    assert wait_until(lambda: d.stats().threads == 0, timeout=5)
    assert wait_until(lambda: not d._workers, timeout=5)
    assert d._timer_thread.is_alive()
    assert d.active_chats == 500 and not release.is_set()
    d.force_close()
    assert d.drain(timeout=5)
    s = d.stats()
    assert s.parked == 0 and s.cancelled == 500 and s.completed == 500


def test_ready_chats_take_turns_under_the_global_limit(make_dispatcher):
    """50 chats with one message each are not stuck behind one with a thousand."""
    rec = Recorder()
    d = make_dispatcher(max_inflight=4, queue_size=1000,
                        pacing=Pacing(global_limit=RateLimit(20, per=0.05)))
    big = [d.submit("big", rec.task("big", i)) for i in range(400)]
    time.sleep(0.02)
    small = [d.submit(c, rec.task(c, 0)) for c in range(50)]
    for f in small:
        f.result(timeout=20)
    done_big = sum(f.done() for f in big)
    # Fair turns: about one start of "big" per small chat while they wait.
    assert done_big < 150, done_big
    d.force_close()


def test_a_chat_with_room_for_a_burst_takes_every_other_start_of_a_busy_line(make_dispatcher):
    """A group (20 a minute) among many private chats (1 each) under a busy
    global limit: served once per turn of the line, its burst would spread
    over the whole backlog (and set the spread of its every later window);
    it takes every other start instead, and the private chats the others."""
    rec = Recorder()
    group = RateLimit(6, per=60.0)
    d = make_dispatcher(max_inflight=4, pacing=Pacing(
        global_limit=RateLimit(1, per=0.02), chat_limit=RateLimit(1, per=0.01),
        limit_for=lambda chat: group if chat < 0 else None))
    futs = [d.submit(c, rec.task(c, i)) for i in range(2) for c in range(1, 31)]
    futs += [d.submit(-1, rec.task(-1, i)) for i in range(6)]
    for f in futs:
        f.result(timeout=30)
    order = [chat for _, chat in sorted((t, chat) for chat, starts in rec.starts.items()
                                        for _, t, _ in starts)]
    assert len(order) == 66 and [s for s, _, _ in rec.starts[-1]] == list(range(6))
    # First come, first served, the group's six would be spread over the
    # line's 60 starts (about one per turn of 30 chats); every other start,
    # they are among the first 20 or so.
    assert max(i for i, chat in enumerate(order) if chat == -1) < 30, order
    for c in range(1, 31):
        assert [s for s, _, _ in rec.starts[c]] == [0, 1]


def test_a_burst_window_counts_each_start_from_its_answer(make_dispatcher):
    """The platform counts a request when it arrives, at the latest when it
    answers: in a window with room for a burst (2 per 0.3 s here), a start
    leaves the window ``per`` after the attempt's end, not after its start,
    so no lateness between the two lets a burst arrive too early."""
    starts, ends = [], []

    def task(sc):
        starts.append(sc.started)
        time.sleep(0.2)  # the request on its way and its answer
        ends.append(time.monotonic())

    d = make_dispatcher(pacing=Pacing(limit_for=lambda chat: RateLimit(2, per=0.3)))
    for f in [d.submit("group", task) for _ in range(5)]:
        f.result(timeout=30)
    assert len(starts) == 5
    for k in range(2, 5):
        # Counted from the starts, the third would begin at 0.4 s, 0.1 s
        # before the first's end plus the window.
        assert starts[k] >= ends[k - 2] + 0.3, (k, starts, ends)


# -------------------------------------------------------------------- retries

def test_retry_after_runs_the_same_task_again_before_later_ones(make_dispatcher):
    rec = Recorder()
    hits = []
    d = make_dispatcher(hooks=DispatcherHooks(
        on_retry=lambda chat, attempt, delay, exc: hits.append((chat, attempt, delay, type(exc)))))
    fail_once = lambda sc: RetryAfter(0.05) if sc.attempt == 1 else None  # noqa: E731
    futs = [d.submit("c", rec.task("c", 0, fail=fail_once))]
    futs += [d.submit("c", rec.task("c", i)) for i in (1, 2)]
    assert [f.result(timeout=5) for f in futs] == [("c", 0), ("c", 1), ("c", 2)]
    assert [(s, a) for s, _, a in rec.starts["c"]] == [(0, 1), (0, 2), (1, 1), (2, 1)]
    t = [t for _, t, _ in rec.starts["c"]]
    assert t[1] - t[0] >= 0.05
    assert hits == [("c", 1, 0.05, RetryAfter)]
    assert d.drain(timeout=5)  # the counters are updated just after the Future
    s = d.stats()
    assert s.retried == 1 and s.completed == 3 and s.submitted == 3


def test_retry_after_pauses_only_its_chat(make_dispatcher):
    rec = Recorder()
    d = make_dispatcher(max_inflight=4)
    slow = d.submit("slow", rec.task("slow", 0, fail=lambda sc: RetryAfter(0.5) if sc.attempt == 1 else None))
    others = [d.submit(c, rec.task(c, i)) for i in range(5) for c in ("a", "b")]
    for f in others:
        f.result(timeout=5)
    assert not slow.done()  # still waiting out its 0.5 s
    assert slow.result(timeout=5) == ("slow", 0)


def test_global_retry_after_pauses_every_chat(make_dispatcher):
    rec = Recorder()
    d = make_dispatcher(max_inflight=4)
    first = d.submit("g", rec.task("g", 0, fail=lambda sc: RetryAfter(0.3, scope="global")
                                     if sc.attempt == 1 else None))
    assert wait_until(lambda: d.stats().retried == 1)
    t_retry = time.monotonic()
    later = [d.submit(c, rec.task(c, 0)) for c in range(10)]
    for f in later + [first]:
        f.result(timeout=5)
    starts = [t for c in range(10) for _, t, _ in rec.starts[c]]
    assert min(starts) >= t_retry + 0.3 - 0.05


def test_retry_after_above_the_cap_fails_at_once(make_dispatcher):
    rec = Recorder()
    d = make_dispatcher(retry=RetryPolicy(max_retry_after=1.0))
    f = d.submit("c", rec.task("c", 0, fail=lambda sc: RetryAfter(3600)))
    nxt = d.submit("c", rec.task("c", 1))
    with pytest.raises(RetryAfter) as info:
        f.result(timeout=2)
    assert info.value.seconds == 3600
    assert nxt.result(timeout=2) == ("c", 1)
    assert d.drain(timeout=5)
    assert d.stats().retried == 0 and d.stats().failed == 1


def test_retry_after_is_honoured_without_a_policy_but_nothing_else_is_retried(make_dispatcher):
    d = make_dispatcher()
    calls = []

    def flaky(sc):
        calls.append(sc.attempt)
        if sc.attempt == 1:
            raise RetryAfter(0.01)
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        d.submit("c", flaky).result(timeout=5)
    assert calls == [1, 2]


def test_retry_on_errors_back_off_and_count_attempts(make_dispatcher):
    d = make_dispatcher(retry=RetryPolicy(max_attempts=4, backoff=0.02, max_backoff=0.05))
    seen = []
    delays = []

    def always_down(sc):
        seen.append((sc.attempt, time.monotonic()))
        raise ConnectionError("down %d" % sc.attempt)

    d2 = make_dispatcher(retry=RetryPolicy(max_attempts=4, backoff=0.02, max_backoff=0.05),
                         hooks=DispatcherHooks(on_retry=lambda c, a, delay, e: delays.append((a, delay))))
    with pytest.raises(ConnectionError, match="down 4"):
        d2.submit("c", always_down).result(timeout=5)
    assert [a for a, _ in seen] == [1, 2, 3, 4]
    assert [a for a, _ in delays] == [1, 2, 3]
    for attempt, delay in delays:
        assert 0 <= delay <= min(0.05, 0.02 * 2 ** (attempt - 1))
    for (_, t0), (_, t1), (_, delay) in zip(seen, seen[1:], delays):
        assert t1 - t0 >= delay
    assert d2.drain(timeout=5)
    s = d2.stats()
    assert s.retried == 3 and s.failed == 1
    # A plain error outside retry_on fails at once.
    with pytest.raises(ValueError):
        d.submit("c", lambda sc: (_ for _ in ()).throw(ValueError("no"))).result(timeout=5)
    assert d.stats().retried == 0


def test_send_timeout_applies_to_each_attempt(make_dispatcher):
    d = make_dispatcher(send_timeout=0.2)
    deadlines = []

    def task(sc):
        deadlines.append((sc.attempt, sc.deadline, sc.started, time.monotonic()))
        if sc.attempt < 3:
            raise RetryAfter(0.15)
        return "ok"

    assert d.submit("c", task).result(timeout=5) == "ok"
    assert [attempt for attempt, _, _, _ in deadlines] == [1, 2, 3]
    for attempt, deadline, started, line in deadlines:
        # each attempt's deadline counts from its own call
        assert deadline == started + 0.2 and started <= line
    with pytest.raises(SendTimeout):
        d.submit("c", lambda sc: time.sleep(0.4)).result(timeout=5)


def test_limit_for_that_fails_fails_the_task_and_the_dispatcher_goes_on(make_dispatcher):
    def limit_for(chat):
        if chat == "raises":
            raise LookupError("no such chat")
        if chat == "garbage":
            return (1, 1)
        return None
    d = make_dispatcher(pacing=Pacing(chat_limit=RateLimit(100, per=1.0), limit_for=limit_for))
    bad1 = d.submit("raises", lambda sc: "x")
    bad2 = d.submit("garbage", lambda sc: "x")
    good = d.submit("fine", lambda sc: "ok")
    with pytest.raises(TypeError, match="limit_for") as info:
        bad1.result(timeout=5)
    assert isinstance(info.value.__cause__, LookupError)
    with pytest.raises(TypeError, match="RateLimit"):
        bad2.result(timeout=5)
    assert good.result(timeout=5) == "ok"
    assert d.drain(timeout=5)
    s = d.stats()
    assert s.failed == 2 and s.completed == 1


@pytest.mark.stress
def test_order_and_no_overlap_with_random_retry_afters(make_dispatcher, tiny_switch_interval,
                                                       soak_factor):
    rec = Recorder()
    rng = random.Random(7)
    d = make_dispatcher(max_inflight=8, queue_size=10_000,
                        retry=RetryPolicy(max_attempts=10, backoff=0.001, max_backoff=0.005,
                                          retry_on=(ConnectionError,)))
    chats = 40
    per_producer = 150 * soak_factor
    plan = {}

    def fail_for(key):
        kinds = plan[key]

        def fail(sc):
            if sc.attempt <= len(kinds):
                kind = kinds[sc.attempt - 1]
                return RetryAfter(0.002) if kind == "ra" else ConnectionError("flaky")
            return None
        return fail

    futs = []
    lock = threading.Lock()

    def producer(p):
        local = random.Random(p)
        mine = []
        for i in range(per_producer):
            chat = (p, local.randrange(chats // 4))
            key = (chat, i)
            plan[key] = [local.choice(["ra", "ce"]) for _ in range(local.choice([0, 0, 0, 1, 2]))]
            mine.append(d.submit(chat, rec.task(chat, i, fail=fail_for(key))))
        with lock:
            futs.extend(mine)

    threads = [threading.Thread(target=producer, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for f in futs:
        f.result(timeout=60)
    assert d.drain(timeout=10)
    assert rec.overlaps == 0
    for chat, starts in rec.starts.items():
        seqs = [s for s, _, _ in starts]
        # every attempt of a task comes before any later task of its chat
        assert seqs == sorted(seqs), chat
    s = d.stats()
    assert s.completed == len(futs) and s.retried == sum(len(k) for k in plan.values())
    del rng


# ---------------------------------------------------------- lifecycle, parked

def test_drain_waits_for_parked_and_retrying_work(make_dispatcher):
    d = make_dispatcher(pacing=Pacing(chat_limit=RateLimit(1, per=0.3)))
    done = []
    d.post("p", lambda sc: done.append(1))
    d.post("p", lambda sc: done.append(2))        # parked for 0.3 s
    d.post("r", lambda sc: (_ for _ in ()).throw(RetryAfter(0.3)) if sc.attempt == 1 else done.append(3))
    assert not d.drain(timeout=0.1)
    assert d.drain(timeout=5)
    assert sorted(done) == [1, 2, 3]


def test_force_close_cancels_parked_and_retrying_work_and_nothing_starts_after(make_dispatcher):
    started = []
    d = make_dispatcher(pacing=Pacing(chat_limit=RateLimit(1, per=0.3)))
    d.submit("p", lambda sc: started.append("p0")).result(timeout=5)
    parked = [d.submit("p", lambda sc: started.append("p")) for _ in range(3)]
    retrying = d.submit("r", lambda sc: (_ for _ in ()).throw(RetryAfter(0.2)))
    assert wait_until(lambda: d.stats().parked == 2)
    d.force_close()
    assert d.drain(timeout=2)
    time.sleep(0.5)
    assert started == ["p0"]
    assert parked[0].cancelled() and all(f.cancelled() for f in parked[1:])
    with pytest.raises(Cancelled):
        retrying.result(timeout=1)
    s = d.stats()
    assert s.parked == 0 and s.cancelled == 4
    assert s.submitted == s.completed + s.failed + s.cancelled + s.discarded + s.timed_out


# -------------------------------------------------- the limiter against a model

class WindowMachine(RuleBasedStateMachine):
    """The core's sliding window against the plain definition.

    The model keeps every start made and the number pending (admitted, not
    yet made); a start at ``t`` is allowed iff fewer than ``count`` of them
    fall in ``(t - per, t]``, the pending ones counting as inside.
    ``next_start(g)`` must be the earliest time at which ``g + 1`` more
    starts fit.  A start the platform refused (``pop_newest``, right after
    its commit) no longer counts.
    """

    core = None

    def __init__(self):
        super().__init__()
        self.count = random.Random(len(self.__dict__)).randint(1, 4)
        self.per = 1.0
        self.window = self.core._Window(RateLimit(self.count, self.per))
        self.now = 0.0
        self.starts = []
        self.pending = 0
        self.just_committed = False

    def allowed_model(self, t, extra=0):
        inside = sum(1 for s in self.starts if s + self.per > t)
        return inside + self.pending + extra < self.count

    @rule(dt=st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.999, 1.0, 1.5]))
    def advance(self, dt):
        self.now += dt
        self.just_committed = False

    @rule()
    def start_if_allowed(self):
        allowed = self.window.next_start(0) <= self.now
        assert allowed == self.allowed_model(self.now)
        if allowed:
            self.window.add(self.now)
            self.starts.append(self.now)
            self.just_committed = True

    @rule()
    def reserve_if_allowed(self):
        allowed = self.window.next_start(0) <= self.now
        assert allowed == self.allowed_model(self.now)
        if allowed:
            self.window.reserve()
            self.pending += 1
            self.just_committed = False

    @precondition(lambda self: self.pending)
    @rule()
    def commit(self):
        self.window.commit(self.now)
        self.pending -= 1
        self.starts.append(self.now)
        self.just_committed = True

    @precondition(lambda self: self.pending)
    @rule()
    def release(self):
        self.window.release()
        self.pending -= 1
        self.just_committed = False

    @precondition(lambda self: self.just_committed)
    @rule()
    def refused(self):
        self.window.pop_newest()
        self.starts.pop()
        self.just_committed = False

    @precondition(lambda self: self.count > 1)
    @rule(g=st.integers(min_value=0, max_value=3))
    def grants(self, g):
        g = min(g, self.count - 1)
        t = self.window.next_start(g)
        if self.pending + g >= self.count:
            assert t == float("inf")  # only a pending start's commit can free a place
            return
        # at t, g + 1 more starts fit; just before t they did not
        assert self.allowed_model(max(t, self.now), g)
        if t > self.now:
            assert not self.allowed_model(t - 1e-9, g)

    @invariant()
    def never_more_than_count_in_a_window(self):
        assert max_in_window(self.starts, self.per) <= self.count
        # the pending starts will be made now or later: room is kept for them
        recent = sum(1 for s in self.starts if s + self.per > self.now)
        assert recent + self.pending <= self.count


def test_sliding_window_matches_a_model(impl):
    machine = type("WindowMachine_" + impl.name, (WindowMachine,), {"core": impl.core})
    machine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
    machine.TestCase().runTest()


def test_parked_state_is_released_with_the_dispatcher(make_dispatcher):
    d = make_dispatcher(pacing=Pacing(chat_limit=RateLimit(1, per=0.05)))
    for c in range(200):
        d.post(c, lambda sc: None)
    assert d.shutdown(timeout=5)
    gc.collect()
    assert d.stats().parked == 0
