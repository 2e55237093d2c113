"""The Engine's match path."""

import logging
import threading

import pytest

import fastdispatch
from fastdispatch.context import Context
from fastdispatch.engine import Engine
from fastdispatch.platform import Capabilities, ChatInfo, Event, SenderInfo, SendResult


def _event(text="hi", chat_id="c1", sender_id="u1"):
    return Event("test", ChatInfo(chat_id), SenderInfo(sender_id), text=text)


class RecordingSender:
    def __init__(self):
        self.lock = threading.Lock()
        self.sent = []

    def send(self, sc, request):
        with self.lock:
            self.sent.append((sc.chat_id, request.message.text))
        return SendResult()


def _always(ctx):
    return True


def _never(ctx):
    return False


@pytest.fixture
def engine(make_dispatcher):
    engine = Engine(make_dispatcher())
    yield engine
    engine.shutdown(timeout=10)


# -- matching order -----------------------------------------------------------------------


def test_matchers_run_in_priority_order_with_stable_ties(engine):
    order = []
    for name, priority in [("a", 5), ("b", -1), ("c", 5), ("d", 0), ("e", -1), ("f", 5)]:
        engine.on(priority=priority)(lambda ctx, name=name: order.append(name))
    engine.process_event(_event(), None)
    assert order == ["b", "e", "d", "a", "c", "f"]


def test_process_event_returns_the_handlers_run_in_order(engine):
    def first(ctx):
        pass

    def skipped(ctx):
        pass

    def second(ctx):
        pass

    engine.on(_always, priority=1)(second)
    engine.on(_never)(skipped)
    engine.on(_always)(first)
    assert engine.process_event(_event(), None) == [first, second]


def test_block_stops_the_walk_after_its_handler(engine):
    ran = []
    engine.on(priority=0)(lambda ctx: ran.append("before"))
    engine.on(_never, priority=1, block=True)(lambda ctx: ran.append("not matched"))
    engine.on(priority=2, block=True)(lambda ctx: ran.append("blocker"))
    engine.on(priority=3)(lambda ctx: ran.append("after"))
    assert len(engine.process_event(_event(), None)) == 2
    assert ran == ["before", "blocker"]


def test_every_rule_must_pass_and_the_first_failure_stops_the_check(engine):
    checked = []

    def rule(name, result):
        def check(ctx):
            checked.append(name)
            return result
        return check

    ran = []
    engine.on(rule("a", True), rule("b", False), rule("c", True))(lambda ctx: ran.append(1))
    engine.on(rule("d", True), rule("e", 1))(lambda ctx: ran.append(2))  # truthy counts
    engine.process_event(_event(), None)
    assert checked == ["a", "b", "d", "e"]
    assert ran == [2]


def test_matcher_without_rules_always_matches(engine):
    ran = []
    engine.on()(lambda ctx: ran.append(ctx.message_content))
    engine.process_event(_event(" x "), None)
    assert ran == ["x"]


def test_inline_handlers_and_rules_share_the_events_one_context(engine):
    seen = []

    def rule(ctx):
        seen.append(ctx)
        return True

    engine.on(rule)(lambda ctx: (seen.append(ctx), ctx.set("from_first", 1)))
    engine.on(rule)(lambda ctx: seen.append(ctx.get("from_first")))
    engine.process_event(_event(), None)
    assert seen[0] is seen[1] is seen[2]
    assert seen[3] == 1
    other = []
    engine.on()(other.append)
    engine.process_event(_event(), None)
    assert other[0] is not seen[0]  # a fresh Context per event


def test_context_carries_sender_dispatcher_and_capabilities(engine):
    seen = []
    engine.on()(seen.append)
    sender, caps = RecordingSender(), Capabilities(typing=True)
    engine.process_event(_event(), sender, caps)
    ctx = seen[0]
    assert isinstance(ctx, Context)
    assert ctx.sender is sender and ctx.dispatcher is engine.dispatcher
    assert ctx.get_platform_capabilities() is caps


# -- failures are isolated -------------------------------------------------------------------


def test_handler_exception_is_logged_and_later_matchers_still_run(engine, caplog):
    ran = []

    def broken(ctx):
        raise RuntimeError("handler bug")

    engine.on(priority=0)(broken)
    engine.on(priority=1)(lambda ctx: ran.append("next"))
    with caplog.at_level(logging.ERROR, logger="fastdispatch"):
        handled = engine.process_event(_event(), None)
    assert ran == ["next"] and handled[0] is broken
    assert [r.name for r in caplog.records] == ["fastdispatch"]
    assert "handler bug" in str(caplog.records[0].exc_info[1])


def test_rule_exception_is_logged_and_counts_as_no_match(engine, caplog):
    ran = []

    def broken_rule(ctx):
        raise KeyError("rule bug")

    engine.on(broken_rule)(lambda ctx: ran.append("never"))
    engine.on()(lambda ctx: ran.append("next"))
    with caplog.at_level(logging.ERROR, logger="fastdispatch"):
        engine.process_event(_event(), None)
    assert ran == ["next"]
    assert any("rule bug" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


# -- deferred rule effects ---------------------------------------------------------------------


def _deferring(log, name, result=True):
    def rule(ctx):
        ctx.defer_rule_effect(lambda: log.append(name))
        return result
    return rule


def test_effects_committed_only_when_every_rule_of_the_matcher_passed(engine):
    log = []
    engine.on(_deferring(log, "a1"), _deferring(log, "a2", False))(lambda ctx: None)
    engine.on(_deferring(log, "b1"), _deferring(log, "b2"))(lambda ctx: None)
    engine.on(_deferring(log, "c1"), _never)(lambda ctx: None)
    engine.process_event(_event(), None)
    assert log == ["b1", "b2"]


def test_effects_are_committed_before_the_handler_runs(engine):
    log = []
    engine.on(_deferring(log, "effect"))(lambda ctx: log.append("handler"))
    engine.process_event(_event(), None)
    assert log == ["effect", "handler"]


def test_effects_of_a_matcher_after_a_block_are_never_registered(engine):
    log = []
    engine.on(block=True)(lambda ctx: None)
    engine.on(_deferring(log, "late"))(lambda ctx: None)
    engine.process_event(_event(), None)
    assert log == []


# -- pooled handlers ------------------------------------------------------------------------------


def test_pooled_handler_runs_on_a_pool_thread_with_a_clone(make_dispatcher):
    engine = Engine(make_dispatcher(), pool_size=2)
    inline, pooled = [], []
    done = threading.Event()

    @engine.on(priority=0)
    def first(ctx):
        ctx.set("before", 1)
        inline.append(ctx)

    @engine.on(priority=1, pooled=True)
    def in_pool(ctx):
        pooled.append((ctx, threading.current_thread()))
        done.set()

    @engine.on(priority=2)
    def last(ctx):
        inline.append(ctx)

    assert engine.process_event(_event(), None) == [first, in_pool, last]
    assert done.wait(5)
    clone, thread = pooled[0]
    assert thread is not threading.current_thread()
    assert thread.name.startswith("fastdispatch-handler")
    assert inline[0] is inline[1] and clone is not inline[0]
    assert clone.event is inline[0].event and clone.get("before") == 1
    assert engine.shutdown(timeout=10)


def test_pooled_handler_gets_the_context_as_it_was_at_hand_over(make_dispatcher):
    engine = Engine(make_dispatcher())
    go, seen = threading.Event(), []
    done = threading.Event()

    @engine.on(priority=0, pooled=True)
    def in_pool(ctx):
        go.wait(5)
        seen.append((ctx.all(), ctx.cancelled))
        done.set()

    @engine.on(priority=1)
    def later_inline(ctx):
        ctx.set("later", 1)
        ctx.cancel()

    engine.process_event(_event(), None)
    go.set()
    assert done.wait(5)
    assert seen == [({}, False)]
    assert engine.shutdown(timeout=10)


def test_pooled_handlers_run_on_a_bounded_pool(make_dispatcher):
    engine = Engine(make_dispatcher(), pool_size=2)
    release = threading.Event()
    lock = threading.Lock()
    running, max_running = [0], [0]
    two_running = threading.Event()
    finished = threading.Semaphore(0)

    def handler(ctx):
        with lock:
            running[0] += 1
            max_running[0] = max(max_running[0], running[0])
            if running[0] == 2:
                two_running.set()
        release.wait(5)
        with lock:
            running[0] -= 1
        finished.release()

    for _ in range(5):
        engine.on(pooled=True)(handler)
    threads_before = set(threading.enumerate())
    assert len(engine.process_event(_event(), None)) == 5
    assert two_running.wait(5)
    pool_threads = [t for t in set(threading.enumerate()) - threads_before
                    if t.name.startswith("fastdispatch-handler")]
    assert len(pool_threads) == 2
    release.set()
    for _ in range(5):
        assert finished.acquire(timeout=5)
    assert max_running[0] == 2
    assert engine.shutdown(timeout=10)


def test_pooled_handler_exception_is_logged_and_isolated(make_dispatcher, caplog):
    engine = Engine(make_dispatcher())
    survived = threading.Event()

    def broken(ctx):
        raise ValueError("pooled bug")

    engine.on(pooled=True)(broken)
    engine.on(pooled=True, priority=1)(lambda ctx: survived.set())
    with caplog.at_level(logging.ERROR, logger="fastdispatch"):
        engine.process_event(_event(), None)
        assert engine.shutdown(timeout=10)
    assert survived.is_set()
    assert any("pooled bug" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


# -- replies ------------------------------------------------------------------------------------


def test_burst_of_replies_from_one_handler_is_delivered_in_order(make_dispatcher):
    engine = Engine(make_dispatcher(max_inflight=4))
    sender = RecordingSender()

    @engine.on()
    def chatty(ctx):
        for i in range(50):
            ctx.reply_text(str(i))

    engine.process_event(_event(chat_id="a"), sender)
    engine.process_event(_event(chat_id="b"), sender)
    assert engine.shutdown(timeout=10)
    for chat in ("a", "b"):
        assert [text for c, text in sender.sent if c == chat] == [str(i) for i in range(50)]


def test_concurrent_events_keep_per_chat_reply_order(make_dispatcher):
    engine = Engine(make_dispatcher(max_inflight=8, queue_size=64))
    sender = RecordingSender()
    engine.on()(lambda ctx: ctx.reply_text(ctx.message_content))
    threads, per_thread = 4, 40
    start = threading.Barrier(threads)

    def feed(chat):
        start.wait()
        for i in range(per_thread):
            engine.process_event(_event(text=f"{chat}:{i}", chat_id=chat), sender)

    workers = [threading.Thread(target=feed, args=(f"chat{n}",)) for n in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(10)
    assert engine.shutdown(timeout=10)
    for n in range(threads):
        chat = f"chat{n}"
        assert [text for c, text in sender.sent if c == chat] == [
            f"{chat}:{i}" for i in range(per_thread)]


# -- lifecycle --------------------------------------------------------------------------------


class WatchedDispatcher:
    """Passes everything to a real dispatcher; notes when it is told to stop."""

    def __init__(self, inner):
        self.inner = inner
        self.stopping = threading.Event()

    def submit(self, chat_id, task):
        return self.inner.submit(chat_id, task)

    def close(self):
        self.stopping.set()
        self.inner.close()

    def shutdown(self, timeout=None):
        self.stopping.set()
        return self.inner.shutdown(timeout)


def test_shutdown_lets_pooled_handlers_finish_before_the_dispatcher_stops(make_dispatcher):
    dispatcher = WatchedDispatcher(make_dispatcher())
    engine = Engine(dispatcher)
    sender = RecordingSender()
    started, stopped_early = threading.Event(), []

    @engine.on(pooled=True)
    def slow(ctx):
        started.set()
        # If the engine stopped the dispatcher while this handler still runs,
        # this wait would end at once and the reply below would be refused.
        stopped_early.append(dispatcher.stopping.wait(0.2))
        ctx.reply_text("from the pool")

    engine.process_event(_event(), sender)
    assert started.wait(5)
    assert engine.shutdown(timeout=10) is True
    assert stopped_early == [False]
    assert sender.sent == [("c1", "from the pool")]
    assert dispatcher.inner.closed


def test_shutdown_returns_false_when_time_runs_out(make_dispatcher):
    dispatcher = make_dispatcher()
    engine = Engine(dispatcher)
    release = threading.Event()
    engine.on(pooled=True)(lambda ctx: release.wait(5))
    engine.process_event(_event(), None)
    try:
        assert engine.shutdown(timeout=0.05) is False
    finally:
        release.set()
    assert engine.shutdown(timeout=10) is True
    assert dispatcher.closed


def test_process_event_after_shutdown_raises(engine):
    engine.shutdown(timeout=10)
    with pytest.raises(RuntimeError):
        engine.process_event(_event(), None)


def test_engine_without_dispatcher_makes_and_shuts_down_its_own():
    with Engine() as engine:
        assert isinstance(engine.dispatcher, fastdispatch.OutboundDispatcher)
        sender = RecordingSender()
        engine.on()(lambda ctx: ctx.reply_text("pong"))
        engine.process_event(_event(), sender)
    assert engine.dispatcher.closed
    assert sender.sent == [("c1", "pong")]


# -- bad input ---------------------------------------------------------------------------------


def test_on_returns_the_handler_unchanged(engine):
    def handler(ctx):
        pass

    assert engine.on(_always, priority=3, block=True, pooled=True)(handler) is handler


@pytest.mark.parametrize("call", [
    lambda e: e.on("not a rule"),
    lambda e: e.on(_always, priority="high"),
    lambda e: e.on(_always, priority=1.5),
    lambda e: e.on(_always)("not a handler"),
    lambda e: e.process_event("not an event", None),
    lambda e: e.process_event(_event(), object()),
    lambda e: e.process_event(_event(), None, capabilities="all"),
    lambda e: e.shutdown(timeout="soon"),
])
def test_bad_arguments_raise_type_error(engine, call):
    with pytest.raises(TypeError):
        call(engine)


@pytest.mark.parametrize("kwargs, exc", [
    ({"dispatcher": object()}, TypeError),
    ({"pool_size": 0}, ValueError),
    ({"pool_size": 2.0}, TypeError),
])
def test_bad_engine_arguments_are_refused(kwargs, exc):
    with pytest.raises(exc):
        Engine(**kwargs)
