"""At-least-once intake and no silent loss, in one process: the engine's
EventOutcome, the poller's offsets, the webhook's answers and its memory of
update ids, FakeTelegramServer's webhook delivery, and run_polling /
run_webhook stopped by an Event.  The signal tests are in
test_telegram_signals.py."""

import gc
import http.client
import json
import logging
import threading
import time

import pytest

from fastdispatch import (
    ChatInfo,
    Engine,
    Event,
    RetryPolicy,
    SenderInfo,
    SendResult,
)
from fastdispatch.engine import EventOutcome
from fastdispatch.telegram import (
    PollerError,
    ShutdownReport,
    TelegramPoller,
    TelegramSender,
    run_polling,
    run_webhook,
    webhook_app,
)
from fastdispatch.testing import FakeTelegramServer

from helpers import free_port, listening, wait_until

TOKEN = "123456:intake"


def event(chat="1", text="hi"):
    return Event("test", ChatInfo(chat), SenderInfo("u"), text=text)


class GatedSender:
    """A sender whose sends wait for ``gate``; records what went."""

    def __init__(self):
        self.gate = threading.Event()
        self.sent = []
        self.lock = threading.Lock()

    def send(self, sc, request):
        self.gate.wait(10)
        with self.lock:
            self.sent.append(request.message.text)
        return SendResult("1")


# -- the engine: EventOutcome ----------------------------------------------------------

def test_an_event_settles_only_once_every_reply_was_sent(make_dispatcher):
    engine = Engine(make_dispatcher(max_inflight=4))
    sender = GatedSender()

    @engine.on()
    def two(ctx):
        ctx.reply_text("a")
        ctx.reply_text("b")

    outcome = engine.handle_event(event(), sender)
    assert isinstance(outcome, EventOutcome) and outcome.handlers == [two]
    assert outcome.queued == 2 and not outcome.settled and not outcome.wait(0.05)
    sender.gate.set()
    assert outcome.wait(10)
    assert (outcome.sent, outcome.failed, outcome.cancelled) == (2, 0, 0) and outcome.delivered


def test_pooled_handlers_replies_are_followed_until_the_handler_returned(make_dispatcher):
    engine = Engine(make_dispatcher(max_inflight=4))
    release = threading.Event()

    @engine.on(pooled=True)
    def slow(ctx):
        release.wait(10)
        ctx.reply_text("late but followed")

    sender = GatedSender()
    outcome = engine.handle_event(event(), sender)
    assert not outcome.wait(0.05) and outcome.queued == 0  # the handler has not returned
    release.set()
    assert wait_until(lambda: outcome.queued == 1)
    assert not outcome.settled  # its reply is still held
    sender.gate.set()
    assert outcome.wait(10) and outcome.delivered and sender.sent == ["late but followed"]


def test_a_reply_made_after_the_event_settled_is_not_followed(make_dispatcher):
    engine = Engine(make_dispatcher())
    kept = []

    @engine.on()
    def keep(ctx):
        kept.append(ctx)

    outcome = engine.handle_event(event(), GatedSender())
    assert outcome.settled and outcome.delivered
    sender = kept[0].sender
    sender.gate.set()
    kept[0].reply_text("later").result(10)
    assert outcome.queued == 0


def test_refused_replies_are_counted_on_the_outcome(make_dispatcher):
    engine = Engine(make_dispatcher(max_inflight=1, queue_size=1))
    sender = GatedSender()

    @engine.on()
    def three(ctx):
        for text in "abc":
            ctx.reply_text(text)

    outcome = engine.handle_event(event(), sender)
    # One runs (held by the gate), one waits, one is refused.
    assert outcome.queued == 2 and outcome.refused["queue_full"] == 1
    sender.gate.set()
    assert outcome.wait(10) and not outcome.delivered and outcome.sent == 2
    engine.shutdown(10)
    assert engine.closed
    with pytest.raises(RuntimeError):
        engine.handle_event(event(), sender)


def test_replies_cancelled_at_a_forced_close_leave_the_event_undelivered(make_dispatcher):
    d = make_dispatcher(max_inflight=1)
    engine = Engine(d)
    sender = GatedSender()

    @engine.on()
    def two(ctx):
        ctx.reply_text("a")
        ctx.reply_text("b")

    outcome = engine.handle_event(event(), sender)
    assert wait_until(lambda: d.inflight == 1)
    d.force_close()
    sender.gate.set()
    assert outcome.wait(10)
    assert outcome.cancelled == 2 and not outcome.delivered


def test_an_outcome_callback_that_raises_is_logged(make_dispatcher, caplog):
    engine = Engine(make_dispatcher())
    outcome = engine.handle_event(event(), GatedSender())

    def bad(o):
        raise ValueError("boom")

    with caplog.at_level(logging.ERROR, "fastdispatch"):
        outcome.add_done_callback(bad)
    assert "EventOutcome callback" in caplog.text


# -- no silent loss: a refused reply nobody looked at is logged -------------------------

def test_an_unobserved_refused_reply_is_logged_once_with_its_chat(make_dispatcher, caplog):
    engine = Engine(make_dispatcher(max_inflight=1, queue_size=1))
    sender = GatedSender()

    @engine.on()
    def many(ctx):
        for i in range(5):
            ctx.reply_text("r%d" % i)  # three of them cannot be queued

    with caplog.at_level(logging.WARNING, "fastdispatch"):
        engine.process_event(event(chat="chat-42"), sender)
        gc.collect()
    lines = [r for r in caplog.records if "was not sent" in r.getMessage()]
    assert len(lines) == 3
    assert all("'chat-42'" in r.getMessage() and "QueueFull" in r.getMessage() for r in lines)
    sender.gate.set()


def test_a_refused_reply_whose_future_was_looked_at_is_not_logged(make_dispatcher, caplog):
    d = make_dispatcher()
    d.close()
    engine = Engine(d)
    seen = []

    @engine.on()
    def careful(ctx):
        fut = ctx.reply_text("x")
        seen.append(type(fut.exception()).__name__)

    with caplog.at_level(logging.WARNING, "fastdispatch"):
        engine.process_event(event(), GatedSender())
        gc.collect()
    assert seen == ["DispatcherClosed"]
    assert "was not sent" not in caplog.text


# -- the poller --------------------------------------------------------------------

@pytest.fixture
def server():
    with FakeTelegramServer() as s:
        yield s


@pytest.fixture
def sender(server):
    with TelegramSender(TOKEN, base_url=server.base_url, pool_size=8) as s:
        yield s


def echo_engine(dispatcher, replies=1):
    engine = Engine(dispatcher)

    @engine.on()
    def echo(ctx):
        for k in range(replies):
            ctx.reply_text("%s /%d" % (ctx.event.text, k))

    return engine


class GatedTelegramSender(TelegramSender):
    """A TelegramSender whose sends to chat "1" wait for ``gate``."""

    gate = None

    def send(self, sc, request):
        if request.target.id == "1":
            self.gate.wait(30)
        return super().send(sc, request)


def test_the_poller_confirms_an_update_only_once_its_replies_were_sent(server, impl):
    sender = GatedTelegramSender(TOKEN, base_url=server.base_url)
    sender.gate = threading.Event()
    engine = echo_engine(impl.OutboundDispatcher(max_inflight=2, retry=RetryPolicy()))
    server.push_message(1, "first")
    server.push_message(2, "second")
    poller = TelegramPoller(sender, engine, poll_timeout=1, recheck=0.05).start()
    try:
        # The server records chat 2's reply before it answers, and the
        # poller counts the update done once the answer is back: wait for
        # both (on a loaded machine the second comes later).
        assert wait_until(lambda: len(server.messages(2)) == 1 and poller.pending == 1)
        # The first update's reply is held: Telegram keeps both updates
        # (confirming the second would confirm the first), also after a few
        # of the poller's rechecks.
        time.sleep(0.2)
        assert poller.pending == 1 and server.pending_updates() == 2
        sender.gate.set()
        assert wait_until(lambda: server.pending_updates() == 0)
        assert poller.pending == 0
    finally:
        sender.gate.set()
        assert poller.stop(5)
        assert engine.shutdown(10)
    assert [m.text for m in server.messages(1)] == ["first /0"]


def test_a_stopped_poller_leaves_unsent_replies_updates_to_the_next_one(server, sender, impl):
    d = impl.OutboundDispatcher(max_inflight=1)
    engine = echo_engine(d)
    server.inject("delay", 1, seconds=30.0)  # hangs until the forced close
    first = server.push_message(1, "stuck")
    poller = TelegramPoller(sender, engine, poll_timeout=1).start()
    assert wait_until(lambda: d.inflight == 1)
    assert poller.stop(5)
    assert poller.freeze() == 1
    d.force_close()
    assert poller.confirm()
    assert server.pending_updates() == 1  # "stuck" comes again
    # ... to the next poller, which answers it.
    engine2 = echo_engine(impl.OutboundDispatcher(max_inflight=1))
    with TelegramPoller(sender, engine2, poll_timeout=1):
        assert wait_until(lambda: len(server.messages(1)) >= 1)
    assert engine2.shutdown(10)
    assert server.messages(1)[-1].text == "stuck /0" and first > 0


@pytest.mark.parametrize("retry_after", [1e10, 1e9])
def test_a_huge_retry_after_from_get_updates_is_capped_and_the_poller_goes_on(
        server, sender, retry_after, caplog):
    rec = echo_engine(Engine().dispatcher)
    server.inject("too_many", 1, method="getUpdates", retry_after=retry_after)
    server.push_message(1, "after the 429")
    poller = TelegramPoller(sender, rec, poll_timeout=1, max_retry_after=0.2)
    with caplog.at_level(logging.WARNING, "fastdispatch.telegram"):
        poller.start()
        try:
            assert wait_until(lambda: len(server.messages(1)) == 1, 10)
            assert poller.running and poller.error is None
        finally:
            poller.stop(5)
            rec.shutdown(5)
    assert "max_retry_after" in caplog.text


def test_waits_a_caller_configures_are_bounded_at_the_call(sender):
    for name in ("max_retry_after", "backoff", "max_backoff", "recheck"):
        with pytest.raises(ValueError, match=name):
            TelegramPoller(sender, Engine(), **{name: 1e300})


def test_409_conflict_stops_the_poller_with_a_clear_error(server, sender, caplog):
    sender.call("setWebhook", {"url": "http://127.0.0.1:1/hook"})
    engine = Engine()
    poller = TelegramPoller(sender, engine, poll_timeout=1)
    with caplog.at_level(logging.ERROR, "fastdispatch.telegram"):
        poller.start()
        assert wait_until(lambda: not poller.running, 10)
    assert isinstance(poller.error, PollerError) and "webhook" in str(poller.error)
    assert poller.error.cause.status == 409
    assert "TelegramPoller stopped" in caplog.text
    engine.shutdown(5)


def test_409_with_on_conflict_delete_webhook_deletes_it_and_polls(server, sender):
    sender.call("setWebhook", {"url": "http://127.0.0.1:1/hook"})
    server.push_message(1, "hello")
    engine = echo_engine(Engine().dispatcher)
    poller = TelegramPoller(sender, engine, poll_timeout=1, on_conflict="delete_webhook")
    with poller:
        assert wait_until(lambda: len(server.messages(1)) == 1, 10)
    assert poller.error is None
    engine.shutdown(5)


def test_the_poller_thread_never_dies_silently(server, sender, caplog):
    engine = echo_engine(Engine().dispatcher)
    poller = TelegramPoller(sender, engine, poll_timeout=1, backoff=0.01, max_backoff=0.01)
    real, calls = poller._handle_batch, []

    def broken_once(updates):
        if not calls:
            calls.append(1)
            raise KeyError("a bug")
        return real(updates)

    poller._handle_batch = broken_once
    server.push_message(1, "still answered")
    with caplog.at_level(logging.ERROR, "fastdispatch.telegram"):
        with poller:
            assert wait_until(lambda: len(server.messages(1)) == 1, 10)
            assert poller.running
    assert "unexpected error" in caplog.text and "KeyError" in caplog.text
    engine.shutdown(5)


def test_a_full_chat_queue_holds_updates_back_and_loses_no_reply(server, sender, impl):
    server.latency = 0.02
    engine = echo_engine(impl.OutboundDispatcher(max_inflight=1, queue_size=2))
    for i in range(12):
        server.push_message(7, "m%d" % i)
    poller = TelegramPoller(sender, engine, poll_timeout=1, recheck=0.05).start()
    try:
        assert wait_until(lambda: len(server.messages(7)) == 12, 30)
    finally:
        poller.stop(5)
        engine.shutdown(10)
    assert [m.text for m in server.messages(7)] == ["m%d /0" % i for i in range(12)]
    assert poller.busy > 0 and poller.lost_replies == 0


# -- the webhook app -----------------------------------------------------------------

def call(app, update=None, body=None, secret=None):
    if body is None:
        body = json.dumps(update).encode()
    environ = {"REQUEST_METHOD": "POST", "CONTENT_LENGTH": str(len(body)),
               "wsgi.input": __import__("io").BytesIO(body)}
    if secret:
        environ["HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN"] = secret
    out = {}
    app(environ, lambda status, headers: out.update(status=int(status[:3]), headers=headers))
    return out["status"]


def update(update_id, text="hi", chat=1):
    return {"update_id": update_id, "message": {"message_id": update_id, "text": text,
                                                "chat": {"id": chat, "type": "private"}}}


def test_the_webhook_answers_503_once_closed_and_forgets_the_id(make_dispatcher):
    engine = echo_engine(make_dispatcher())
    sender = GatedSender()
    sender.gate.set()
    app = webhook_app(engine, sender, secret_token=None)
    assert call(app, update(1)) == 200
    app.close()
    assert call(app, update(2)) == 503
    assert call(app, update(1)) == 503  # closed: even a duplicate is not acknowledged
    assert app.stats[503] == 2 and app.stats["handled"] == 1


def test_the_webhook_answers_503_during_the_engines_shutdown(make_dispatcher):
    engine = echo_engine(make_dispatcher())
    sender = GatedSender()
    app = webhook_app(engine, sender, secret_token=None)
    assert call(app, update(1)) == 200
    t = threading.Thread(target=engine.shutdown, args=(10,))
    t.start()
    assert wait_until(lambda: engine.closed)
    assert [call(app, update(i)) for i in range(2, 7)] == [503] * 5
    sender.gate.set()
    t.join()
    assert 2 not in app._recent._done  # not remembered: Telegram's redelivery is handled


def test_the_webhook_answers_429_when_the_chats_queue_is_full_then_takes_it(make_dispatcher):
    d = make_dispatcher(max_inflight=1, queue_size=1)
    engine = echo_engine(d)
    sender = GatedSender()
    app = webhook_app(engine, sender, secret_token=None)
    assert call(app, update(1)) == 200  # runs (held)
    assert wait_until(lambda: d.inflight == 1)
    assert call(app, update(2)) == 200  # waits
    assert call(app, update(3)) == 429  # refused whole: nothing was queued
    assert call(app, update(4)) == 429  # now known full: held back before it runs
    sender.gate.set()
    assert d.drain(10)
    assert call(app, update(3)) == 200  # the redeliveries
    assert d.drain(10)
    assert call(app, update(4)) == 200
    assert d.drain(10)
    assert sender.sent == ["hi /0"] * 4 and app.stats["lost_replies"] == 0


def test_a_redelivery_during_the_first_delivery_is_answered_503(make_dispatcher):
    release = threading.Event()
    engine = Engine(make_dispatcher())

    @engine.on()
    def slow(ctx):
        release.wait(10)

    app = webhook_app(engine, GatedSender(), secret_token=None)
    first = []
    t = threading.Thread(target=lambda: first.append(call(app, update(5))))
    t.start()
    assert wait_until(lambda: 5 in app._recent._busy)
    assert call(app, update(5)) == 503 and app.stats["in_progress"] == 1
    release.set()
    t.join()
    assert first == [200] and call(app, update(5)) == 200 and app.stats["duplicates"] == 1


def test_update_ids_are_remembered_for_a_while_and_a_bounded_number(make_dispatcher):
    engine = Engine(make_dispatcher())
    handled = []
    engine.on()(lambda ctx: handled.append(ctx.event.text))
    app = webhook_app(engine, GatedSender(), secret_token=None, remember=3, remember_seconds=0.2)
    for i in range(1, 5):
        assert call(app, update(i, "u%d" % i)) == 200
    assert len(app._recent) == 3  # the count bound: update 1 was forgotten
    assert call(app, update(4, "again")) == 200 and handled[-1] == "u4"  # a duplicate
    assert call(app, update(1, "u1 again")) == 200 and handled[-1] == "u1 again"
    time.sleep(0.25)  # the time bound
    assert call(app, update(4, "u4 later")) == 200 and handled[-1] == "u4 later"


def test_webhook_memory_arguments_are_checked(make_dispatcher):
    engine = Engine(make_dispatcher())
    with pytest.raises(ValueError, match="remember_seconds"):
        webhook_app(engine, GatedSender(), secret_token=None, remember_seconds=float("inf"))


# -- FakeTelegramServer delivers webhooks ----------------------------------------------

class Recorder:
    """A WSGI app that answers by a plan: per update id, the statuses of its
    successive deliveries (then 200), or "slow" (sleeps past the timeout)."""

    def __init__(self, plan=None):
        self.plan = {k: list(v) for k, v in (plan or {}).items()}
        self.lock = threading.Lock()
        self.got = []  # (update_id, secret, status answered)

    def __call__(self, environ, start_response):
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        uid = json.loads(body)["update_id"]
        with self.lock:
            todo = self.plan.get(uid)
            answer = todo.pop(0) if todo else 200
        if answer == "slow":
            time.sleep(0.6)
            answer = 200  # too late: the fake gave up waiting
        with self.lock:
            self.got.append((uid, environ.get("HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN"), answer))
        start_response("%d X" % answer, [("Content-Length", "0")])
        return [b""]


@pytest.fixture
def wsgi_server():
    from cheroot import wsgi

    servers = []

    def serve(app):
        s = wsgi.Server(("127.0.0.1", 0), app, numthreads=8)
        s.prepare()
        threading.Thread(target=s.serve, daemon=True).start()
        servers.append(s)
        return "http://127.0.0.1:%d/hook" % s.bind_addr[1]

    yield serve
    for s in servers:
        s.stop()


def test_the_fake_delivers_webhooks_in_order_per_chat_and_again_after_failures(wsgi_server):
    with FakeTelegramServer() as server:
        server.webhooks.backoff = 0.05
        server.webhooks.timeout = 0.3
        ids = [server.push_message(1 + i % 3, "m%d" % i) for i in range(12)]
        plan = {ids[0]: [500, 503], ids[4]: ["slow"], ids[7]: [429]}
        app = Recorder(plan)
        url = wsgi_server(app)
        sender = TelegramSender(TOKEN, base_url=server.base_url)
        sender.call("setWebhook", {"url": url, "secret_token": "sec"})
        assert wait_until(lambda: server.pending_updates() == 0, 20)
        info = sender.call("getWebhookInfo")
        attempts = server.webhooks.attempts()
    assert info["url"] == url and info["pending_update_count"] == 0
    assert all(secret == "sec" for _, secret, _ in app.got)
    # Each failed update was tried again until answered 2xx ...
    assert [a.status for a in attempts if a.update_id == ids[0]] == [500, 503, 200]
    assert [a.status for a in attempts if a.update_id == ids[7]] == [429, 200]
    slow = [a for a in attempts if a.update_id == ids[4]]
    assert slow[0].status is None and "timed out" in slow[0].error and slow[-1].status == 200
    # ... after a back-off that grows ...
    t0 = [a.at for a in attempts if a.update_id == ids[0]]
    assert t0[1] - t0[0] >= 0.05 and t0[2] - t0[1] >= 0.1
    # ... and no later update of its chat was delivered meanwhile: per chat,
    # the first successful delivery of each update is in push order.
    for chat in (1, 2, 3):
        ok = [a.update_id for a in attempts if a.chat == chat and a.status == 200]
        mine = [u for i, u in enumerate(ids) if 1 + i % 3 == chat]
        assert ok == mine
        tried = [a.update_id for a in attempts if a.chat == chat]
        assert tried == sorted(tried)  # never an update before an earlier one was done


def test_the_fake_keeps_updates_while_the_bot_is_down_and_delivers_them_later(wsgi_server):
    with FakeTelegramServer() as server:
        server.webhooks.backoff = 0.02
        server.webhooks.max_backoff = 0.1
        port = free_port()
        sender = TelegramSender(TOKEN, base_url=server.base_url)
        sender.call("setWebhook", {"url": "http://127.0.0.1:%d/" % port})
        for i in range(5):
            server.push_message(1, "m%d" % i)
        assert wait_until(lambda: len(server.webhooks.attempts()) >= 3)
        assert server.pending_updates() == 5  # refused connections: nothing delivered
        from cheroot import wsgi
        app = Recorder()
        s = wsgi.Server(("127.0.0.1", port), app, numthreads=2)
        s.prepare()
        threading.Thread(target=s.serve, daemon=True).start()
        try:
            assert wait_until(lambda: server.pending_updates() == 0, 20)
        finally:
            s.stop()
        assert [u for u, _, _ in app.got] == sorted(u for u, _, _ in app.got)
        sender.call("deleteWebhook")
        assert sender.call("getWebhookInfo")["url"] == ""


# -- run_polling and run_webhook, stopped by an Event -----------------------------------

def get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    r = conn.getresponse()
    return r.status, r.read().decode()


def test_run_webhook_registers_serves_health_and_drains_every_reply(impl):
    with FakeTelegramServer(latency=0.01) as server:
        sender = TelegramSender(TOKEN, base_url=server.base_url)
        engine = echo_engine(impl.OutboundDispatcher(max_inflight=2))
        port = free_port()
        stop = threading.Event()
        reports, seen = [], {}

        def drive():
            assert wait_until(lambda: server.stats().get("webhook_delivered", 0) == 40, 30)
            seen["health"] = get(port, "/healthz")
            seen["metrics"] = get(port, "/metrics")
            seen["other"] = get(port, "/nothing")
            stop.set()

        for i in range(40):
            server.push_message(1 + i % 4, "m%d" % i)
        threading.Thread(target=drive, daemon=True).start()
        code = run_webhook(engine, sender, port=port, url_path="/hook",
                           webhook_url="http://127.0.0.1:%d/hook" % port, stop=stop,
                           on_shutdown=reports.append)
        assert server.webhooks.attempts()[0].status == 200
        got = len(server.all_messages())
    assert code == 0 and got == 40
    report = reports[0]
    assert isinstance(report, ShutdownReport)
    assert (report.handled, report.sent, report.dropped, report.exit_code) == (40, 40, 0, 0)
    assert seen["health"][0] == 200 and '"ok"' in seen["health"][1]
    assert 'fastdispatch_telegram_updates_total{outcome="handled"} 40' in seen["metrics"][1]
    assert seen["other"][0] == 404


def test_run_polling_past_its_deadline_drops_reports_and_exits_1(impl, caplog):
    with FakeTelegramServer() as server:
        sender = TelegramSender(TOKEN, base_url=server.base_url)
        d = impl.OutboundDispatcher(max_inflight=1)
        engine = echo_engine(d, replies=3)
        server.inject("delay", 1, seconds=3.0)
        server.push_message(1, "slow")
        server.push_message(2, "fast")
        stop = threading.Event()
        reports = []

        def drive():
            assert wait_until(lambda: d.inflight == 1 and d.stats().submitted == 6)
            stop.set()

        threading.Thread(target=drive, daemon=True).start()
        with caplog.at_level(logging.INFO, "fastdispatch.telegram"):
            code = run_polling(engine, sender, poll_timeout=1, drain_timeout=0.3, stop=stop,
                               on_shutdown=reports.append)
        pending = server.pending_updates()
    report = reports[0]
    assert code == 1 and report.exit_code == 1
    assert report.handled == 2 and report.dropped == 6 and report.unconfirmed == 2
    assert pending == 2  # both come again to the next process
    assert "6 dropped at the 0.3 s deadline" in caplog.text


def test_run_polling_exits_2_when_a_webhook_blocks_it(server, sender):
    sender.call("setWebhook", {"url": "http://127.0.0.1:1/"})
    engine = Engine()
    code = run_polling(engine, sender, poll_timeout=1, delete_webhook=False,
                       stop=threading.Event())
    assert code == 2


def test_run_polling_serves_health_on_request(server, sender):
    engine = echo_engine(Engine().dispatcher)
    port = free_port()
    stop = threading.Event()
    seen = {}

    def drive():
        assert wait_until(lambda: listening(port))
        seen["health"] = get(port, "/healthz")
        seen["metrics"] = get(port, "/metrics")
        stop.set()

    threading.Thread(target=drive, daemon=True).start()
    assert run_polling(engine, sender, poll_timeout=1, health_port=port, stop=stop) == 0
    assert seen["health"] == (200, '{"status": "ok", "mode": "polling"}\n')
    assert "fastdispatch_telegram_pending_updates 0" in seen["metrics"][1]


def test_run_helpers_check_their_arguments(sender):
    with pytest.raises(TypeError, match="sender"):
        run_polling(Engine(), object())
    with pytest.raises(ValueError, match="drain_timeout"):
        run_polling(Engine(), sender, drain_timeout=-1)
    with pytest.raises(ValueError, match="url_path"):
        run_webhook(Engine(), sender, port=0, url_path="nope")
    with pytest.raises(TypeError, match="stop"):
        run_polling(Engine(), sender, stop=True, delete_webhook=False)



def test_a_poller_whose_polls_come_back_empty_at_once_does_not_spin(make_dispatcher):
    # poll_timeout=0: the server answers [] at once, as one that does not
    # hold long polls does.  The count is the server's (its requests but the
    # replies it recorded), the bound follows from the time it had (a slow
    # machine makes fewer requests, never more): one poll per idle_pause,
    # plus the first, the one right after the message (no pause follows
    # work), the one in flight at stop and the start's own requests.
    engine = echo_engine(make_dispatcher())
    with FakeTelegramServer(TOKEN) as server:
        sender = TelegramSender(TOKEN, base_url=server.base_url)
        poller = TelegramPoller(sender, engine, poll_timeout=0, idle_pause=0.2)
        started = time.monotonic()
        poller.start()
        time.sleep(1.0)
        server.push_message(5, "still heard")
        assert wait_until(lambda: poller.handled == 1)
        poller.stop(5)
        elapsed = time.monotonic() - started
        stats = server.stats()
        polls = stats["requests"] - stats.get("sent", 0)
    engine.shutdown(5)
    assert polls <= elapsed / 0.2 + 5, (polls, elapsed)
