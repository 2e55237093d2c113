"""docs/guarantees.md G16: limits the platform announces (``sc.report_limit``), on both cores.

A platform such as Discord announces on every answer how many requests
remain in a bucket and when it resets; a task hands that to the dispatcher,
which then parks the chats the bucket covers once it is spent.  These tests
pin the contract: a chat's own bucket, shared buckets, the global one, a
later report replacing an earlier one, buckets forgotten after their reset
(the tables stay bounded), configured and learned limits together, parked
chats holding no thread, bad and hostile values, and a model of the starts
(hypothesis).

Timing checks read stamps, never the wall clock against a floor: a task's
own ``sc.started`` (the stamp the limiter takes for its start) and the
monotonic times a task reads right before and right after its report (the
limiter's reset lies between ``before + reset_after`` and ``after +
reset_after``), so a loaded machine can make a test slow, not wrong.
"""

import sys
import threading
import time
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastdispatch import Pacing, RateLimit

from helpers import wait_until


class Log:
    """Tasks that record their start stamp and, around a report, the clock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.starts = defaultdict(list)   # chat -> [started]
        self.reports = []                 # (chat, before, after, args, kwargs)

    def task(self, chat, *reports):
        def run(sc):
            with self.lock:
                self.starts[chat].append(sc.started)
            for args, kwargs in reports:
                before = time.monotonic()
                sc.report_limit(*args, **kwargs)
                after = time.monotonic()
                with self.lock:
                    self.reports.append((chat, before, after, args, kwargs))
            return sc.started
        return run


def report(*args, **kwargs):
    return (args, kwargs)


# ------------------------------------------------------------------ bad values

@pytest.mark.parametrize("args, kwargs, exc, name", [
    ((-1, 1.0), {}, ValueError, "remaining"),
    ((1.0, 1.0), {}, TypeError, "remaining"),
    (("3", 1.0), {}, TypeError, "remaining"),
    ((True, 1.0), {}, TypeError, "remaining"),
    ((None, 1.0), {}, TypeError, "remaining"),
    ((1, -0.5), {}, ValueError, "reset_after"),
    ((1, float("nan")), {}, ValueError, "reset_after"),
    ((1, float("inf")), {}, ValueError, "reset_after"),
    ((1, threading.TIMEOUT_MAX * 2), {}, ValueError, "reset_after"),
    ((1, 10 ** 400), {}, ValueError, "reset_after"),
    ((1, "1.5"), {}, TypeError, "reset_after"),
    ((1, False), {}, TypeError, "reset_after"),
    ((1, None), {}, TypeError, "reset_after"),
    ((1, 1.0), {"bucket": 5}, TypeError, "bucket"),
    ((1, 1.0), {"bucket": b"abc"}, TypeError, "bucket"),
    ((1, 1.0), {"bucket": ""}, ValueError, "bucket"),
    ((1, 1.0), {"scope": "everything"}, ValueError, "scope"),
    ((1, 1.0), {"scope": None}, TypeError, "scope"),
])
def test_bad_report_fails_the_task_naming_the_argument(make_dispatcher, args, kwargs, exc,
                                                       name):
    d = make_dispatcher()
    fut = d.submit("c", lambda sc: sc.report_limit(*args, **kwargs))
    with pytest.raises(exc, match=name):
        fut.result(timeout=10)
    # Nothing was learned, the chat goes on at once.
    assert d.submit("c", lambda sc: 7).result(timeout=10) == 7
    assert d._pacing_state()["buckets"] == 0


def test_report_outside_a_dispatcher_is_checked_then_dropped(impl):
    sc = impl.SendContext("c")
    sc.report_limit(0, 1.0, bucket="b")          # nowhere to go: no error
    sc.report_limit(3, 0, scope="global")
    with pytest.raises(ValueError, match="remaining"):
        sc.report_limit(-1, 1.0)


def test_a_context_kept_after_its_dispatcher_is_gone_reports_nowhere(impl):
    import gc
    import weakref
    kept = []
    d = impl.OutboundDispatcher()
    d.submit("c", kept.append).result(timeout=10)
    assert d.shutdown(timeout=10)
    gone = weakref.ref(d)
    del d
    gc.collect()
    assert gone() is None           # the kept SendContext does not hold it
    kept[0].report_limit(0, 1.0)    # checked, then dropped: no crash
    kept[0].report_limit(0, 1.0, scope="global")
    with pytest.raises(TypeError, match="remaining"):
        kept[0].report_limit("0", 1.0)


def test_report_needs_keywords_for_bucket_and_scope(impl):
    with pytest.raises(TypeError):
        impl.SendContext("c").report_limit(1, 1.0, "bucket")


# ------------------------------------------------------------------ semantics

def test_spent_chat_budget_parks_that_chat_until_the_reset(make_dispatcher):
    log = Log()
    d = make_dispatcher()
    first = d.submit("a", log.task("a", report(0, 0.3)))
    second = d.submit("a", log.task("a"))
    other = d.submit("b", log.task("b"))
    second.result(timeout=10)
    other.result(timeout=10)
    first.result(timeout=10)
    (_, before, _, _, _), = log.reports
    assert log.starts["a"][1] >= before + 0.3
    # The other chat was not held: it started before the parked chat.
    assert log.starts["b"][0] < log.starts["a"][1]
    assert d.stats().paced == 1


def test_remaining_starts_go_then_the_chat_waits(make_dispatcher):
    log = Log()
    d = make_dispatcher()
    futs = [d.submit("a", log.task("a", report(2, 0.3)))]
    futs += [d.submit("a", log.task("a")) for _ in range(3)]
    for f in futs:
        f.result(timeout=10)
    (_, before, after, _, _), = log.reports
    s = log.starts["a"]
    # Two more starts were allowed before the reset, the third waited.
    assert s[3] >= before + 0.3
    assert d.stats().paced == 1


def test_shared_bucket_is_one_budget_across_chats(make_dispatcher):
    log = Log()
    d = make_dispatcher()
    d.submit("a", log.task("a", report(5, 30.0, bucket="route"))).result(timeout=10)
    d.submit("b", log.task("b", report(0, 0.3, bucket="route"))).result(timeout=10)
    later_a = d.submit("a", log.task("a"))
    later_c = d.submit("c", log.task("c"))      # never reported the bucket
    later_a.result(timeout=10)
    later_c.result(timeout=10)
    b_before = log.reports[1][1]
    assert log.starts["a"][1] >= b_before + 0.3
    assert log.starts["c"][0] < log.starts["a"][1]
    state = d._pacing_state()
    assert state["links"] <= 2


def test_bucket_wins_over_scope(make_dispatcher):
    log = Log()
    d = make_dispatcher()
    d.submit("a", log.task("a", report(0, 0.5, bucket="x", scope="global"))).result(timeout=10)
    # Not global: another chat goes on at once (it would wait 0.5 s otherwise).
    d.submit("b", log.task("b")).result(timeout=10)
    d.submit("a", log.task("a")).result(timeout=10)
    assert log.starts["b"][0] < log.starts["a"][1]
    assert log.starts["a"][1] >= log.reports[0][1] + 0.5


def test_global_scope_covers_every_chat(make_dispatcher):
    log = Log()
    d = make_dispatcher()
    d.submit("a", log.task("a", report(0, 0.3, scope="global"))).result(timeout=10)
    futs = [d.submit(c, log.task(c)) for c in ("b", "c", "d")]
    for f in futs:
        f.result(timeout=10)
    before = log.reports[0][1]
    for c in ("b", "c", "d"):
        assert log.starts[c][0] >= before + 0.3


def test_a_later_report_replaces_an_earlier_one(make_dispatcher):
    log = Log()
    d = make_dispatcher()
    # A long wait replaced by a budget: the next start does not wait 60 s.
    d.submit("a", log.task("a", report(0, 60.0), report(3, 0.2))).result(timeout=10)
    d.submit("a", log.task("a")).result(timeout=20)
    # A budget replaced by a spent one: the next start waits for its reset.
    d.submit("b", log.task("b", report(5, 60.0), report(0, 0.3))).result(timeout=10)
    d.submit("b", log.task("b")).result(timeout=10)
    second = [r for r in log.reports if r[0] == "b"][1]
    assert log.starts["b"][1] >= second[1] + 0.3


def test_zero_reset_after_constrains_nothing(make_dispatcher):
    d = make_dispatcher()
    d.submit("a", lambda sc: sc.report_limit(0, 0)).result(timeout=10)
    assert d.submit("a", lambda sc: 1).result(timeout=10) == 1
    assert d.stats().paced == 0


def test_configured_and_learned_limits_both_apply(make_dispatcher):
    log = Log()
    per = 0.15
    d = make_dispatcher(pacing=Pacing(chat_limit=RateLimit(1, per=per)))
    # A generous learned budget does not lift the configured window ...
    futs = [d.submit("a", log.task("a", report(100, 30.0)))]
    futs += [d.submit("a", log.task("a")) for _ in range(3)]
    for f in futs:
        f.result(timeout=10)
    s = log.starts["a"]
    assert all(b - a >= per for a, b in zip(s, s[1:]))
    # ... and a spent one holds a chat the window would let go.
    d2 = make_dispatcher(pacing=Pacing(chat_limit=RateLimit(100, per=1.0)))
    log2 = Log()
    d2.submit("a", log2.task("a", report(0, 0.3))).result(timeout=10)
    d2.submit("a", log2.task("a")).result(timeout=10)
    assert log2.starts["a"][1] >= log2.reports[0][1] + 0.3


def test_learned_limits_with_global_configured_limit(make_dispatcher):
    log = Log()
    d = make_dispatcher(pacing=Pacing(global_limit=RateLimit(50, per=1.0)))
    d.submit("a", log.task("a", report(0, 0.3, bucket="r"))).result(timeout=10)
    futs = [d.submit("a", log.task("a"))] + [d.submit(c, log.task(c)) for c in range(20)]
    for f in futs:
        f.result(timeout=10)
    assert log.starts["a"][1] >= log.reports[0][1] + 0.3
    assert min(log.starts[c][0] for c in range(20)) < log.starts["a"][1]


def test_learned_buckets_are_forgotten_after_their_reset(make_dispatcher, impl):
    """100,000 chats report a budget: once the resets passed, nothing is left."""
    n = 100_000
    d = make_dispatcher(max_inflight=8)
    futs = []
    for c in range(n):
        if c % 10 == 0:
            task = lambda sc: sc.report_limit(3, 0.05, bucket="shared-%d" % (hash(sc.chat_id) % 50))
        else:
            task = lambda sc: sc.report_limit(3, 0.05)
        futs.append(d.submit(c, task))
    d.submit(-1, lambda sc: sc.report_limit(100, 0.05, scope="global")).result(timeout=60)
    assert d.drain(timeout=120)
    for f in futs[-10:]:
        f.result(timeout=1)
    assert wait_until(lambda: d._pacing_state()["buckets"] == 0, timeout=30), d._pacing_state()
    state = d._pacing_state()
    assert state["links"] == 0 and state["bucket_heap"] == 0 and state["wakeups"] == 0
    assert d.active_chats == 0


def test_parked_chats_hold_no_thread(make_dispatcher):
    """300 chats parked by spent budgets: idle workers exit, the timer is left."""
    release = threading.Event()
    d = make_dispatcher(max_inflight=8, idle_timeout=0.05)
    for c in range(300):
        d.post(c, lambda sc: sc.report_limit(0, 30.0))
    for c in range(300):
        d.post(c, lambda sc: release.set())      # each must wait 30 s
    assert wait_until(lambda: d.stats().parked == 300)
    assert wait_until(lambda: d.stats().threads == 0, timeout=5)
    assert wait_until(lambda: not d._workers, timeout=5)
    assert d._timer_thread.is_alive()
    assert d.active_chats == 300 and not release.is_set()
    d.force_close()
    assert d.drain(timeout=5)
    s = d.stats()
    assert s.parked == 0 and s.cancelled == 300 and s.completed == 300
    assert d._pacing_state()["buckets"] == 0


def test_force_close_cancels_chats_parked_by_a_learned_limit(make_dispatcher):
    d = make_dispatcher()
    d.submit("a", lambda sc: sc.report_limit(0, 60.0, scope="global")).result(timeout=10)
    futs = [d.submit(c, lambda sc: 1) for c in range(10)]
    assert wait_until(lambda: d.stats().parked == 10)
    d.force_close()
    assert d.drain(timeout=5)
    assert all(f.cancelled() for f in futs)


# ------------------------------------------------------------------ hostile values

class _EvilInt(int):
    def _boom(self, *a):
        raise RuntimeError("hostile int")
    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _boom
    __index__ = __int__ = __float__ = __hash__ = _boom
    __add__ = __radd__ = __sub__ = __rsub__ = _boom


class _EvilFloat(float):
    def _boom(self, *a):
        raise RuntimeError("hostile float")
    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _boom
    __float__ = __add__ = __radd__ = __hash__ = _boom


class _EvilStr(str):
    def _boom(self, *a):
        raise RuntimeError("hostile str")
    __eq__ = __ne__ = __hash__ = __str__ = _boom


class _EvilChat:
    def __hash__(self):
        return 42

    def __eq__(self, other):
        raise RuntimeError("hostile chat id")


def test_hostile_values_never_reach_the_limiter(make_dispatcher):
    log = Log()
    d = make_dispatcher(max_inflight=4)
    d.submit("a", log.task("a", report(_EvilInt(0), _EvilFloat(0.2),
                                       bucket=_EvilStr("route")))).result(timeout=10)
    d.submit("b", log.task("b", report(_EvilInt(1), _EvilInt(0), scope=_EvilStr("global")))
             ).result(timeout=10)
    d.submit("a", log.task("a")).result(timeout=10)
    assert log.starts["a"][1] >= log.reports[0][1] + 0.2
    chat = _EvilChat()
    d.submit(chat, lambda sc: sc.report_limit(0, 0.1)).result(timeout=10)
    d.submit(chat, lambda sc: sc.report_limit(0, 0.1, bucket="route")).result(timeout=10)
    d.submit(_EvilChat(), lambda sc: 1).result(timeout=10)
    # The timer forgot everything and is alive; the workers go on.
    assert wait_until(lambda: d._pacing_state()["buckets"] == 0, timeout=10)
    assert d.submit("z", lambda sc: 5).result(timeout=10) == 5


def test_a_report_whose_type_check_raises_fails_only_its_task(make_dispatcher):
    class Sneaky:
        @property
        def __class__(self):
            raise RuntimeError("no class for you")

    d = make_dispatcher()
    fut = d.submit("a", lambda sc: sc.report_limit(Sneaky(), 1.0))
    with pytest.raises((RuntimeError, TypeError)):
        fut.result(timeout=10)
    assert d.submit("a", lambda sc: 1).result(timeout=10) == 1


def test_huge_remaining_is_a_budget_that_never_runs_out(make_dispatcher):
    d = make_dispatcher()
    d.submit("a", lambda sc: sc.report_limit(10 ** 30, 30.0)).result(timeout=10)
    for _ in range(5):
        d.submit("a", lambda sc: 1).result(timeout=10)
    assert d.stats().paced == 0


# ------------------------------------------------------------------ stress

def test_many_producers_with_forced_thread_switches(make_dispatcher):
    """Chats that report small budgets while many threads submit: every
    chat's starts keep within each of its budgets, nothing is lost."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        log = Log()
        d = make_dispatcher(max_inflight=16)
        futs = []
        futs_lock = threading.Lock()

        def producer(p):
            for i in range(30):
                chat = (p * 7 + i) % 12
                if i % 3 == 0:
                    task = log.task(chat, report(1, 0.05))
                elif i % 7 == 0:
                    task = log.task(chat, report(2, 0.03, bucket="b%d" % (chat % 3)))
                else:
                    task = log.task(chat)
                f = d.submit(chat, task)
                with futs_lock:
                    futs.append(f)

        threads = [threading.Thread(target=producer, args=(p,)) for p in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for f in futs:
            f.result(timeout=60)
    finally:
        sys.setswitchinterval(old)
    assert len(futs) == 240
    # Chat scope is exact (a chat's own starts never overlap its report):
    # after each report (1, 0.05) at most one more start of that chat falls
    # before the reset, until the chat's next report of that scope.
    for chat, before, after, args, kwargs in log.reports:
        if kwargs:
            continue
        remaining, reset_after = args
        nxt = min([r[1] for r in log.reports
                   if r[0] == chat and not r[4] and r[1] > after] or [float("inf")])
        end = min(before + reset_after, nxt)
        inside = [s for s in log.starts[chat] if after < s < end]
        assert len(inside) <= remaining, (chat, before, inside)
    assert wait_until(lambda: d._pacing_state()["buckets"] == 0, timeout=10)


# ------------------------------------------------------------------ model

_REPORT = st.one_of(
    st.none(),
    st.tuples(st.integers(0, 2), st.sampled_from([0.0, 0.01, 0.02, 0.04]),
              st.sampled_from(["chat", "global", "s1", "s2"])),
)
_PLAN = st.lists(st.tuples(st.integers(0, 3), _REPORT), min_size=1, max_size=25)


def _check_against_model(events):
    """``events``: (chat, started, report or None, before, after), in start
    order (one worker: starts and reports never overlap).

    The model: a report R of bucket K allows at most ``remaining`` starts
    of the chats K covers after it, before its reset, until the next report
    of K.  K covers: the reporting chat (chat scope), every chat (global),
    or the chats whose last shared report named K since K last reset.  When
    the clock cannot tell whether K had reset when a chat reported it, only
    the chats K surely covers are counted.
    """
    reports = [(i, e) for i, e in enumerate(events) if e[2] is not None]
    for n, (i, (chat, _, (remaining, reset_after, kind), before, after)) in enumerate(reports):
        key = ("chat", chat) if kind == "chat" else (kind,)
        later = [e for j, e in reports[n + 1:]
                 if (("chat", e[0]) if e[2][2] == "chat" else (e[2][2],)) == key]
        end = min(before + reset_after, later[0][3] if later else float("inf"))
        if kind == "chat":
            covered = {chat}
        elif kind == "global":
            covered = None
        else:
            covered = _surely_in_bucket(events, i, kind)
        inside = [e for e in events[i + 1:]
                  if after < e[1] < end and (covered is None or e[0] in covered)]
        assert len(inside) <= remaining, (events[i], inside)


def _surely_in_bucket(events, i, kind):
    # The chats surely in shared bucket ``kind`` right after event i (its
    # report), that stay in it (they name no other shared bucket) from then on.
    members = set()
    reset_lo = reset_hi = None      # the bucket's reset lies in [lo, hi]
    for chat, _, rep, before, after in events[:i + 1]:
        if rep is None or rep[2] in ("chat", "global"):
            continue
        if rep[2] != kind:
            members.discard(chat)
            continue
        if reset_lo is None or before >= reset_hi:
            members = set()         # surely reset: a new bucket
        elif after >= reset_lo:
            members = set()         # maybe reset: count only the sure ones
        members.add(chat)
        reset_lo, reset_hi = before + rep[1], after + rep[1]
    leaving = {e[0] for e in events[i + 1:]
               if e[2] is not None and e[2][2] not in ("chat", "global", kind)}
    return members - leaving


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plan=_PLAN)
def test_starts_keep_within_every_learned_budget(impl, plan):
    d = impl.OutboundDispatcher(max_inflight=1)
    events = []
    lock = threading.Lock()

    def task_for(chat, rep):
        def run(sc):
            before = after = None
            if rep is not None:
                remaining, reset_after, kind = rep
                before = time.monotonic()
                if kind == "chat":
                    sc.report_limit(remaining, reset_after)
                elif kind == "global":
                    sc.report_limit(remaining, reset_after, scope="global")
                else:
                    sc.report_limit(remaining, reset_after, bucket=kind)
                after = time.monotonic()
            with lock:
                events.append((chat, sc.started, rep, before, after))
        return run

    try:
        futs = [d.submit(chat, task_for(chat, rep)) for chat, rep in plan]
        for f in futs:
            f.result(timeout=30)
    finally:
        assert d.shutdown(timeout=30)
    events.sort(key=lambda e: e[1])
    assert len(events) == len(plan)
    # Each chat's tasks ran in submission order.
    for chat in range(4):
        mine = [rep for c, rep in plan if c == chat]
        assert [e[2] for e in events if e[0] == chat] == mine
    _check_against_model(events)
