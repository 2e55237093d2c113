"""fastdispatch.telegram against a real HTTP server on 127.0.0.1 (FakeTelegramServer):
every answer's mapping, both intake paths, bad input, and the token's secrecy."""

import http.client
import io
import json
import logging
import socket
import subprocess
import sys
import threading
import time
import traceback
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from socketserver import ThreadingMixIn

import pytest

from fastdispatch import (
    Capabilities,
    ChatInfo,
    Context,
    DispatcherError,
    Engine,
    Event,
    GroupMemberLister,
    MessageAuthorMuter,
    MessageDeleter,
    RetryAfter,
    Sender,
    SenderInfo,
    SendRequest,
    TextMessage,
    TypingSender,
)
from fastdispatch.telegram import (
    PlatformError,
    TelegramNetworkError,
    TelegramPoller,
    TelegramSender,
    update_to_event,
    webhook_app,
)
from fastdispatch.telegram import _sender as telegram_sender_module
from fastdispatch.testing import FakeTelegramServer

TOKEN = "123456:SECRET-token_value"
SECRET_PART = "SECRET-token_value"


@pytest.fixture
def server():
    with FakeTelegramServer() as s:
        yield s


@pytest.fixture
def sender(server):
    with TelegramSender(TOKEN, base_url=server.base_url, pool_size=8) as s:
        yield s


class FakeSC:
    """The two members of SendContext that TelegramSender reads."""

    def __init__(self, remaining=None):
        self._remaining = remaining

    def remaining(self):
        return self._remaining

    def check(self):
        raise TimeoutError("deadline passed")


def send(sender, chat="42", text="hi", remaining=5.0):
    return sender.send(FakeSC(remaining), SendRequest(ChatInfo(chat), TextMessage(text)))


def failure(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except BaseException as exc:  # noqa: B902
        return exc
    raise AssertionError("no exception")


# -- answers and their mapping --------------------------------------------------

def test_send_posts_send_message_and_returns_the_message_id(server, sender):
    result = send(sender, "42", "hello")
    assert result.message_id == "1" and result.raw["text"] == "hello"
    assert send(sender, "42", "again").message_id == "2"
    assert [m.text for m in server.messages("42")] == ["hello", "again"]
    assert isinstance(sender, Sender)


def test_429_becomes_retry_after_with_the_servers_retry_after(server, sender):
    server.inject("too_many", retry_after=3)
    exc = failure(send, sender)
    assert type(exc) is RetryAfter and exc.seconds == 3.0 and exc.scope == "chat"
    with FakeTelegramServer(chat_limit=(1, 10.0)) as limited:
        s = TelegramSender(TOKEN, base_url=limited.base_url)
        send(s)
        exc = failure(send, s)
        assert isinstance(exc, RetryAfter) and 9 < exc.seconds <= 10


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_5xx_becomes_a_retryable_connection_error(server, sender, status):
    server.inject("error", status=status)
    exc = failure(send, sender)
    assert isinstance(exc, TelegramNetworkError) and isinstance(exc, ConnectionError)
    assert exc.status == status and exc.method == "sendMessage"
    assert server.messages("42") == []


@pytest.mark.parametrize("fault", ["drop", "drop_after", "truncate"])
def test_a_connection_closed_before_or_during_the_answer_is_a_connection_error(
        server, sender, fault):
    server.inject(fault)
    exc = failure(send, sender)
    assert isinstance(exc, TelegramNetworkError) and exc.status is None
    # the pool recovers: the next send works on a fresh connection
    assert send(sender).message_id


def test_a_refused_connection_is_a_connection_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    s = TelegramSender(TOKEN, base_url="http://127.0.0.1:%d" % port)
    exc = failure(send, s)
    assert isinstance(exc, TelegramNetworkError)


def test_a_timeout_is_a_connection_error_and_comes_from_sc_remaining(server, sender):
    server.inject("delay", seconds=3)
    t0 = time.monotonic()
    exc = failure(send, sender, remaining=0.3)
    assert isinstance(exc, TelegramNetworkError) and "deadline" in exc.reason
    assert time.monotonic() - t0 < 2.5


def test_a_timeout_is_the_deadline_even_when_the_socket_times_out_first(
        server, sender, monkeypatch):
    # On a loaded machine the socket's own read timeout (the call's time
    # left) can fire before the watchdog's thread has run: the error is the
    # same.  A watchdog whose thread never fires stands for that thread.
    from fastdispatch import _http

    class Starved(_http._Watchdog):
        def _run(self):
            threading.Event().wait()

    monkeypatch.setattr(_http, "_watchdog", Starved())
    server.inject("delay", seconds=3)
    exc = failure(send, sender, remaining=0.3)
    assert isinstance(exc, TelegramNetworkError) and "deadline" in exc.reason, exc.reason


def test_a_spent_deadline_fails_before_any_request(server, sender):
    exc = failure(send, sender, remaining=0.0)
    assert isinstance(exc, TimeoutError)
    assert server.stats().get("requests", 0) == 0


def test_garbage_is_a_platform_error_and_not_retried(server, sender):
    server.inject("garbage")
    exc = failure(send, sender)
    assert type(exc) is PlatformError and exc.status == 200
    assert isinstance(exc, DispatcherError) and not isinstance(exc, ConnectionError)


def test_other_failures_are_platform_errors_with_status_and_description(server, sender):
    exc = failure(sender.delete_message, "42", "77")
    assert isinstance(exc, PlatformError)
    assert (exc.status, exc.description, exc.method) == (
        400, "Bad Request: message to delete not found", "deleteMessage")
    assert "400" in str(exc) and "message to delete not found" in str(exc)
    with FakeTelegramServer("1:right") as strict:
        exc = failure(send, TelegramSender("1:wrong", base_url=strict.base_url))
        assert isinstance(exc, PlatformError) and exc.status == 401


def test_json_answers_map_by_error_code(server, sender):
    # A proxy or a server that says 5xx in JSON: still retryable.
    server.inject("error", status=500)
    assert isinstance(failure(send, sender), TelegramNetworkError)
    # A 429 without parameters: retry after 1 s rather than hammering.
    from fastdispatch.telegram._sender import _decode
    _, err = _decode("sendMessage", 429, b'{"ok": false, "error_code": 429}')
    assert isinstance(err, RetryAfter) and err.seconds == 1.0
    _, err = _decode("sendMessage", 400, b'{"ok": false, "error_code": 400, '
                                         b'"description": "Bad Request: group chat was '
                                         b'upgraded", "parameters": {"migrate_to_chat_id": -5}}')
    assert isinstance(err, PlatformError) and err.parameters == {"migrate_to_chat_id": -5}
    _, err = _decode("sendMessage", 502, b"<html>")
    assert isinstance(err, TelegramNetworkError) and err.status == 502
    _, err = _decode("sendMessage", 200, b'{"no": "ok field"}')
    assert isinstance(err, PlatformError)


# -- the pool --------------------------------------------------------------------

def test_one_keep_alive_pool_is_shared_by_all_threads(server):
    sender = TelegramSender(TOKEN, base_url=server.base_url, pool_size=4)
    errors = []

    def worker(i):
        try:
            for j in range(25):
                send(sender, str(i), "m%d" % j)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert server.stats()["sent"] == 300
    assert server.stats()["connections"] <= 4  # 300 requests, at most pool_size connections


def test_the_client_never_retries_by_itself(server, sender):
    server.inject("error", 1)
    failure(send, sender)
    server.inject("drop", 1)
    failure(send, sender)
    assert server.stats()["requests"] == 2


# -- the token stays secret ------------------------------------------------------

def test_the_token_is_in_no_repr_exception_or_log(server, caplog):
    sender = TelegramSender(TOKEN, base_url=server.base_url)
    assert SECRET_PART not in repr(sender) and "123456" in repr(sender)
    with pytest.raises(TypeError):
        import pickle
        pickle.dumps(sender)
    seen = []
    with caplog.at_level(logging.DEBUG):
        send(sender)
        for fault in ("error", "too_many", "drop", "garbage", "truncate"):
            server.inject(fault)
            seen.append(failure(send, sender))
        server.inject("delay", seconds=2)
        seen.append(failure(send, sender, remaining=0.2))
        seen.append(failure(sender.delete_message, "42", "999"))
        dead = TelegramSender(TOKEN, base_url="http://127.0.0.1:1")
        seen.append(failure(send, dead))
        logging.getLogger("urllib3.connectionpool").debug("url %s", "/bot%s/x" % TOKEN)
    assert len(caplog.records) > 3  # urllib3 did log the requests
    assert SECRET_PART not in caplog.text and "<token>" in caplog.text
    for exc in seen:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        assert SECRET_PART not in text and SECRET_PART not in repr(exc)
        assert exc.__context__ is None and exc.__cause__ is None


# The garbage collector forgets a dead client's token from a finalizer, which
# may run inside the redaction filter's own critical section (a collection
# started by an allocation there): with a lock the finalizer waited for, the
# thread deadlocked on itself (the code before hung in this child within a
# fraction of a second, and once hung a whole CI run).  In a child, so a
# deadlock fails the test instead of hanging the suite.
_REDACT_CHURN = r"""
import gc, json, logging, sys, threading
from fastdispatch import _http
log = logging.getLogger("urllib3.connectionpool")
records = []
class Keep(logging.Handler):
    def emit(self, record):
        if len(records) < 100:
            records.append(record.getMessage())
log.addHandler(Keep())
log.setLevel(logging.DEBUG)
sys.setswitchinterval(1e-6)
gc.set_threshold(5)  # a collection every few allocations, in whichever thread
live = _http.JsonHttpClient("http://127.0.0.1:9", secrets=("LIVE-secret",))
stop = threading.Event()
def churn(k):
    n = 0
    while not stop.is_set():
        n += 1
        c = _http.JsonHttpClient("http://127.0.0.1:9", secrets=("dead-%d-%d" % (k, n),))
        c.cycle = c  # collected only by the garbage collector, at any allocation
        del c
threads = [threading.Thread(target=churn, args=(k,)) for k in range(2)]
for t in threads:
    t.start()
for i in range(20000):
    log.debug("url %s", "/botLIVE-secret/x")
stop.set()
for t in threads:
    t.join()
gc.collect()
_http.JsonHttpClient("http://127.0.0.1:9", secrets=("last",))  # takes the lock: forgets
gc.collect()
print(json.dumps([sorted(_http._redact.secrets), len(records),
                  sum("LIVE-secret" in r for r in records)]))
"""


def test_a_client_collected_inside_the_redaction_filter_does_not_deadlock():
    out = subprocess.run([sys.executable, "-c", _REDACT_CHURN], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    secrets, kept, leaked = json.loads(out.stdout)
    assert secrets == ["LIVE-secret"]  # every dead client's secret forgotten
    assert kept == 100 and leaked == 0


def test_bad_arguments_raise_naming_the_argument():
    with pytest.raises(TypeError, match="token"):
        TelegramSender(123)
    with pytest.raises(ValueError, match="token") as info:
        TelegramSender("12:has space")
    assert "has space" not in str(info.value)
    with pytest.raises(ValueError, match="base_url"):
        TelegramSender(TOKEN, base_url="ftp://x")
    with pytest.raises(ValueError, match="pool_size"):
        TelegramSender(TOKEN, pool_size=0)
    with pytest.raises(ValueError, match="timeout"):
        TelegramSender(TOKEN, timeout=-1)
    for name in ("timeout", "connect_timeout"):
        with pytest.raises(ValueError, match=name + ".*TIMEOUT_MAX"):
            TelegramSender(TOKEN, **{name: threading.TIMEOUT_MAX * 2})
    api = TelegramSender(TOKEN, base_url="http://127.0.0.1:9")
    try:
        # A per-call deadline is checked like the sender's own: every wait
        # made from it must fit a lock's wait.
        for bad in (threading.TIMEOUT_MAX * 2, float("nan"), -1, "5", True):
            with pytest.raises(ValueError, match="timeout"):
                api.call("getMe", timeout=bad)
    finally:
        api.close()


# -- the optional protocols --------------------------------------------------------

def test_optional_protocols_and_capabilities(server, sender):
    for protocol in (MessageDeleter, TypingSender, GroupMemberLister, MessageAuthorMuter):
        assert isinstance(sender, protocol)
    assert sender.capabilities() == Capabilities(delete_message=True, typing=True,
                                                 group_members=True, mute=True)
    sent = send(sender, "-1001234567890", "to delete")
    assert sender.delete_message("-1001234567890", sent.message_id) is True
    assert server.deleted == [("-1001234567890", 1)]
    assert sender.send_typing("-1001234567890") is True
    assert server.chat_actions == [("-1001234567890", "typing")]
    server.set_chat_administrators(-1001234567890, [
        {"id": 7, "is_bot": False, "first_name": "Ada", "last_name": "L"},
        {"id": 8, "is_bot": False, "first_name": "", "username": "bob"}])
    assert sender.get_group_members("-1001234567890") == [  # the bot, an administrator, is listed too
        SenderInfo("7", "Ada L"), SenderInfo("8", "bob"), SenderInfo("123456", "Fake Bot")]
    t0 = time.time()
    assert sender.mute("-1001234567890", "7", 5) is True
    chat, user, until, perms = server.restrictions[0]
    assert (chat, user) == ("-1001234567890", 7) and perms["can_send_messages"] is False
    assert until >= t0 + 30  # Telegram: under 30 s means forever, so at least 30 s
    with pytest.raises(ValueError, match="seconds"):
        sender.mute("-1001234567890", "7", 0)
    assert sender.get_me()["is_bot"] is True


def test_context_try_methods_reach_the_server(server, sender):
    event = Event("telegram", ChatInfo("-5", is_group=True), SenderInfo("9"), "x",
                  message_id="1")
    ctx = Context(event, sender=sender, capabilities=sender.capabilities())
    assert ctx.try_send_typing() is True
    assert ctx.try_get_group_members()[0].id == "1"
    assert server.chat_actions == [("-5", "typing")]


# -- update_to_event -----------------------------------------------------------------

def test_a_private_text_message_becomes_an_event():
    update = {"update_id": 10, "message": {
        "message_id": 5, "text": " hi ", "date": 0,
        "chat": {"id": 42, "type": "private", "first_name": "Ann", "last_name": "B"},
        "from": {"id": 42, "is_bot": False, "first_name": "Ann", "last_name": "B"}}}
    event = update_to_event(update)
    assert event == Event(platform="telegram", chat=ChatInfo("42", is_group=False, name="Ann B"),
                          sender=SenderInfo("42", "Ann B"), text=" hi ", message_id="5")
    assert event.raw is update and event.content() == "hi"


@pytest.mark.parametrize("chat_type,is_group", [("group", True), ("supergroup", True),
                                                 ("channel", False)])
def test_group_messages_are_groups_named_by_title(chat_type, is_group):
    event = update_to_event({"update_id": 1, "message": {
        "message_id": 1, "text": "x", "chat": {"id": -100, "type": chat_type, "title": "Team"},
        "from": {"id": 3, "first_name": "C", "username": "c"}}})
    assert event.chat == ChatInfo("-100", is_group=is_group, name="Team")
    assert event.sender == SenderInfo("3", "C")


@pytest.mark.parametrize("update", [
    {"update_id": 1, "edited_message": {"message_id": 1, "text": "x", "chat": {"id": 1}}},
    {"update_id": 1, "callback_query": {"id": "q"}},
    {"update_id": 1, "my_chat_member": {}},
    {"update_id": 1, "message": {"message_id": 1, "chat": {"id": 1}, "photo": []}},
    {"update_id": 1, "message": {"message_id": 1, "text": "x"}},
    {"update_id": 1, "message": {"message_id": 1, "text": "x", "chat": {"id": True}}},
    {"update_id": 1, "message": {"message_id": 1, "text": 5, "chat": {"id": 1}}},
    {"update_id": 1, "message": "not a dict"},
    {"update_id": 1},
    [], None, "message", 5,
])
def test_anything_but_a_text_message_becomes_none(update):
    assert update_to_event(update) is None


def test_a_message_without_from_uses_the_sender_chat():
    event = update_to_event({"update_id": 1, "message": {
        "message_id": 1, "text": "x", "chat": {"id": -1, "type": "supergroup", "title": "G"},
        "sender_chat": {"id": -1, "type": "supergroup", "title": "G"}}})
    assert event.sender == SenderInfo("-1", "G")


# -- intake: the engine that records what it was given -------------------------------

class RecordingEngine:
    """A real Engine whose handler records every event (and can raise)."""

    def __init__(self, raise_on=()):
        self.engine = Engine()
        self.events = []
        self.lock = threading.Lock()
        self.raise_on = raise_on

        @self.engine.on()
        def record(ctx):
            with self.lock:
                self.events.append(ctx.event)
            if ctx.event.text in self.raise_on:
                raise self.raise_on[ctx.event.text]

    def process_event(self, event, sender, capabilities=None):
        self.capabilities = capabilities
        return self.engine.process_event(event, sender, capabilities)

    def texts(self):
        with self.lock:
            return [e.text for e in self.events]

    def wait_for(self, n, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.events) >= n:
                return True
            time.sleep(0.01)
        return False


class Boom(BaseException):
    pass


# -- TelegramPoller -----------------------------------------------------------------

def test_the_poller_hands_each_update_to_the_engine_once_in_order(server, sender):
    rec = RecordingEngine()
    for i in range(30):
        server.push_message(1 + i % 3, "m%d" % i)
    server.push_update({"callback_query": {"id": "q"}})
    poller = TelegramPoller(sender, rec, poll_timeout=1).start()
    try:
        assert rec.wait_for(30)
        server.push_message(1, "late")
        assert rec.wait_for(31)
    finally:
        assert poller.stop(5)
    assert rec.texts() == ["m%d" % i for i in range(30)] + ["late"]
    assert poller.handled == 31 and poller.ignored == 1
    assert rec.capabilities == sender.capabilities()
    assert server.pending_updates() == 0  # stop() confirmed everything handled


@pytest.mark.parametrize("fault", ["error", "drop", "garbage", "truncate", "drop_after"])
def test_get_updates_errors_neither_skip_nor_repeat_updates(server, sender, fault):
    rec = RecordingEngine()
    for i in range(5):
        server.push_message(7, "a%d" % i)
    server.inject(fault, 3, method="getUpdates")
    poller = TelegramPoller(sender, rec, poll_timeout=1, backoff=0.01, max_backoff=0.05).start()
    try:
        assert rec.wait_for(5)
        for i in range(5):
            server.push_message(7, "b%d" % i)
        assert rec.wait_for(10)
        time.sleep(0.1)
    finally:
        assert poller.stop(5)
    assert rec.texts() == ["a%d" % i for i in range(5)] + ["b%d" % i for i in range(5)]
    assert poller.errors >= 3


def test_the_poller_waits_out_a_429(server, sender):
    rec = RecordingEngine()
    server.push_message(1, "x")
    server.inject("too_many", method="getUpdates", retry_after=0.5)
    t0 = time.monotonic()
    with TelegramPoller(sender, rec, poll_timeout=1):
        assert rec.wait_for(1)
    assert time.monotonic() - t0 >= 0.45


def test_a_handler_that_raises_does_not_stop_the_poller(server, sender):
    rec = RecordingEngine(raise_on={"bad": ValueError("x"), "worse": Boom()})
    for text in ("one", "bad", "two", "worse", "three"):
        server.push_message(1, text)
    with TelegramPoller(sender, rec, poll_timeout=1) as poller:
        assert rec.wait_for(5)
    assert rec.texts() == ["one", "bad", "two", "worse", "three"]
    assert not poller.running


def test_stop_returns_promptly_during_a_long_poll(server, sender):
    poller = TelegramPoller(sender, RecordingEngine(), poll_timeout=30).start()
    time.sleep(0.3)  # now inside a 30 s getUpdates
    t0 = time.monotonic()
    assert poller.stop(timeout=5) is True
    assert time.monotonic() - t0 < 2 and not poller.running


def test_a_restarted_poller_neither_repeats_nor_skips(server, sender):
    first = RecordingEngine()
    for i in range(4):
        server.push_message(3, "old%d" % i)
    with TelegramPoller(sender, first, poll_timeout=1):
        assert first.wait_for(4)
    for i in range(3):
        server.push_message(3, "new%d" % i)
    # A new process: a new sender, a new poller, no offset of its own.
    second = RecordingEngine()
    with TelegramPoller(TelegramSender(TOKEN, base_url=server.base_url), second,
                        poll_timeout=1) as poller:
        assert second.wait_for(3)
        time.sleep(0.2)
    assert first.texts() == ["old0", "old1", "old2", "old3"]
    assert second.texts() == ["new0", "new1", "new2"]
    # and the same poller object started again resumes from its offset
    server.push_message(3, "again")
    with poller:
        assert second.wait_for(4)
    assert second.texts()[-1] == "again" and len(second.texts()) == 4


def test_the_poller_can_resume_from_a_stored_offset(server, sender):
    ids = [server.push_message(1, "u%d" % i) for i in range(4)]
    rec = RecordingEngine()
    with TelegramPoller(sender, rec, poll_timeout=1, offset=ids[2]):
        assert rec.wait_for(2)
        time.sleep(0.1)
    assert rec.texts() == ["u2", "u3"]


def test_poller_arguments_are_checked(sender):
    with pytest.raises(TypeError, match="sender"):
        TelegramPoller(object(), Engine())
    with pytest.raises(TypeError, match="engine"):
        TelegramPoller(sender, object())
    with pytest.raises(ValueError, match="poll_timeout"):
        TelegramPoller(sender, Engine(), poll_timeout=-1)
    with pytest.raises(ValueError, match="limit"):
        TelegramPoller(sender, Engine(), limit=0)


# -- webhook_app ----------------------------------------------------------------------

class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def webhook(sender):
    rec = RecordingEngine(raise_on={"bad": ValueError("x"), "worse": Boom()})
    app = webhook_app(rec, sender, secret_token="s3cret")
    httpd = make_server("127.0.0.1", 0, app, server_class=_ThreadingWSGIServer,
                        handler_class=_QuietHandler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield httpd.server_address[1], app, rec
    httpd.shutdown()
    httpd.server_close()


def post(port, body, secret="s3cret", method="POST", headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    h = {"Content-Type": "application/json"}
    if secret is not None:
        h["X-Telegram-Bot-Api-Secret-Token"] = secret
    h.update(headers or {})
    conn.request(method, "/", body=body, headers=h)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status


def update(update_id, text, chat=1):
    return json.dumps({"update_id": update_id, "message": {
        "message_id": update_id, "text": text, "chat": {"id": chat, "type": "private"},
        "from": {"id": chat, "first_name": "U"}}}).encode()


def test_the_webhook_processes_an_update_with_the_right_secret(webhook):
    port, app, rec = webhook
    assert post(port, update(1, "hello")) == 200
    assert rec.texts() == ["hello"]


def test_the_webhook_refuses_a_wrong_or_missing_secret_with_403(webhook):
    port, app, rec = webhook
    assert post(port, update(1, "x"), secret="wrong") == 403
    assert post(port, update(2, "x"), secret="s3cre") == 403
    assert post(port, update(3, "x"), secret=None) == 403
    assert rec.texts() == [] and app.stats[403] == 3


def test_the_webhook_answers_bad_requests_with_4xx(webhook):
    port, app, rec = webhook
    assert post(port, b"{not json") == 400
    assert post(port, b"[1, 2]") == 400
    assert post(port, b"\xff\xfe") == 400
    assert post(port, b"", method="GET") == 405
    # announced too big: refused before a byte of the body is read
    assert post(port, b"x", headers={"Content-Length": str(2 << 20)}) == 413
    assert rec.texts() == []
    assert post(port, update(5, "still fine")) == 200


def test_unknown_update_kinds_are_answered_200_and_ignored(webhook):
    port, app, rec = webhook
    assert post(port, json.dumps({"update_id": 9, "callback_query": {}}).encode()) == 200
    assert post(port, json.dumps({"no_update_id": True}).encode()) == 200
    assert rec.texts() == []


def test_a_redelivered_update_is_handled_once(webhook):
    port, app, rec = webhook
    assert post(port, update(77, "once")) == 200
    assert post(port, update(77, "once")) == 200
    assert rec.texts() == ["once"] and app.stats["duplicates"] == 1


def test_handlers_that_raise_never_reach_the_server(webhook):
    port, app, rec = webhook
    assert post(port, update(1, "bad")) == 200
    assert post(port, update(2, "worse")) == 200
    assert post(port, update(3, "fine")) == 200
    assert rec.texts() == ["bad", "worse", "fine"]


def call_app(app, environ):
    statuses = []
    base = {"REQUEST_METHOD": "POST", "HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": "s3cret",
            "CONTENT_LENGTH": "2", "wsgi.input": io.BytesIO(b"{}")}
    base.update(environ)
    body = app(base, lambda status, headers: statuses.append(status))
    return statuses[0], b"".join(body)


class BrokenStream:
    def read(self, n=-1):
        raise OSError("client went away")


def test_the_webhook_never_raises_whatever_the_environ(sender):
    app = webhook_app(RecordingEngine(), sender, secret_token="s3cret")
    assert call_app(app, {"wsgi.input": BrokenStream()})[0].startswith("500")
    assert call_app(app, {"CONTENT_LENGTH": "nope"})[0].startswith("400")
    assert call_app(app, {"CONTENT_LENGTH": "-4"})[0].startswith("400")
    assert call_app(app, {"CONTENT_LENGTH": ""})[0].startswith("411")
    assert call_app(app, {"CONTENT_LENGTH": "", "wsgi.input_terminated": True})[0] \
        .startswith("200")
    assert call_app(app, {"wsgi.input": None})[0].startswith("400")
    assert call_app(app, {"REQUEST_METHOD": "PUT"})[0].startswith("405")
    assert call_app(app, {"HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": "s3cr\xe9t"})[0] \
        .startswith("403")


def test_a_flood_of_bad_requests_reads_nothing_big_and_keeps_nothing(sender):
    rec = RecordingEngine()
    app = webhook_app(rec, sender, secret_token="s3cret", max_body=1000, remember=100)

    class Unreadable:
        def read(self, n=-1):
            raise AssertionError("the body of a refused request was read")

    for _ in range(3000):
        assert call_app(app, {"HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": "no",
                              "wsgi.input": Unreadable()})[0].startswith("403")
        assert call_app(app, {"CONTENT_LENGTH": "1000000000",
                              "wsgi.input": Unreadable()})[0].startswith("413")
    for i in range(500):
        body = update(i, "x")
        call_app(app, {"CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)})
    assert len(app._recent) == 100 and not app._recent._busy
    assert app.stats[403] == 3000 and app.stats[413] == 3000 and app.stats[200] == 500


def test_webhook_arguments_are_checked(sender):
    with pytest.raises(ValueError, match="secret_token"):
        webhook_app(Engine(), sender, secret_token="has space")
    with pytest.raises(TypeError, match="engine"):
        webhook_app(object(), sender, secret_token=None)
    with pytest.raises(ValueError, match="max_body"):
        webhook_app(Engine(), sender, secret_token=None, max_body=0)
    assert "NOT set" in repr(webhook_app(Engine(), sender, secret_token=None))


def test_two_senders_with_one_token_both_stay_redacted(server, caplog):
    import gc

    first = TelegramSender(TOKEN, base_url=server.base_url)
    second = TelegramSender(TOKEN, base_url=server.base_url)
    del first
    gc.collect()
    with caplog.at_level(logging.DEBUG, logger="urllib3.connectionpool"):
        send(second)
    assert caplog.records and SECRET_PART not in caplog.text


def test_a_handler_may_stop_its_own_poller(server, sender):
    stopped = []
    engine = Engine()
    poller = TelegramPoller(sender, engine, poll_timeout=1)

    @engine.on(block=True)
    def stop_me(ctx):
        stopped.append(poller.stop(timeout=1))

    server.push_message(1, "stop")
    server.push_message(1, "never handled")
    poller.start()
    deadline = time.monotonic() + 10
    while poller.running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stopped == [False] and not poller.running
    assert server.pending_updates() == 1  # the first was confirmed, the second comes again


def test_a_token_not_shaped_like_a_bot_token_is_refused_at_the_call_without_showing_it():
    for token in ("justasecretvalue", "not-a-token", ":abc", "12:", "12:ab:cd", "\u00b2:ab",
                  "12:ab\u00e9", "abc:12"):
        with pytest.raises(ValueError, match="token is not a bot token") as info:
            TelegramSender(token, base_url="http://127.0.0.1:1")
        assert token not in str(info.value)
    assert TelegramSender("42:x", base_url="http://127.0.0.1:1").bot_id == "42"


def test_errors_survive_pickling_with_their_fields():
    import pickle

    err = pickle.loads(pickle.dumps(PlatformError(400, "Bad Request: x", {"a": 1}, "sendMessage")))
    assert (err.status, err.description, err.parameters, err.method) == (
        400, "Bad Request: x", {"a": 1}, "sendMessage")
    net = pickle.loads(pickle.dumps(TelegramNetworkError("sendMessage", "reset", 502)))
    assert (net.method, net.reason, net.status) == ("sendMessage", "reset", 502)


# -- every call has a total deadline ----------------------------------------------

class DribblingServer:
    """A real server on 127.0.0.1 that answers one byte every ``pause``
    seconds: from the status line on (``part="head"``) or after quick
    headers (``part="body"``).  It stops by itself when the client goes."""

    def __init__(self, part, pause=0.1, size=200):
        self.part, self.pause, self.size = part, pause, size
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.base_url = "http://127.0.0.1:%d" % self.port
        self.closed = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self):
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, conn):
        body = b'{"ok":true,"result":{"message_id":1,"pad":"' + b"x" * self.size + b'"}}'
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" \
            % len(body)
        try:
            conn.recv(65536)
            if self.part == "body":
                conn.sendall(head)
                slow = body
            else:
                slow = head + body
            for i in range(len(slow)):
                if self.closed.wait(self.pause):
                    break
                conn.sendall(slow[i:i + 1])
        except OSError:
            pass  # the client gave up: what the test wants
        finally:
            conn.close()

    def close(self):
        self.closed.set()
        self.sock.close()
        for t in self.threads:
            t.join(5)


@pytest.fixture(params=["head", "body"])
def dribbling(request):
    server = DribblingServer(request.param)
    yield server
    server.close()


def test_a_send_ends_at_its_deadline_however_slowly_the_server_answers(dribbling):
    # Each byte comes well within any per-read timeout; the whole answer
    # would take ~25 s.  The deadline is the send's remaining time.
    sender = TelegramSender(TOKEN, base_url=dribbling.base_url)
    t0 = time.monotonic()
    exc = failure(send, sender, remaining=1.0)
    took = time.monotonic() - t0
    assert isinstance(exc, TelegramNetworkError) and "deadline" in exc.reason, exc
    assert took < 3.0, took  # 1 s and the time to notice, not the ~25 s of the answer
    sender.close()


def test_calls_without_a_send_context_end_at_the_senders_timeout(dribbling):
    sender = TelegramSender(TOKEN, base_url=dribbling.base_url, timeout=0.5)
    for call in (sender.get_me, lambda: sender.call("getChat", {"chat_id": 1}),
                 lambda: sender.send_typing("1")):
        t0 = time.monotonic()
        exc = failure(call)
        assert isinstance(exc, TelegramNetworkError) and "deadline" in exc.reason
        assert time.monotonic() - t0 < 2.5
    conn = sender._connect(0.5)  # the poller's own connection: the same deadline
    t0 = time.monotonic()
    exc = failure(sender._call_on, conn, "getUpdates", {"timeout": 0}, 0.5)
    assert isinstance(exc, TelegramNetworkError) and time.monotonic() - t0 < 2.5
    conn.close()
    sender.close()


def test_the_deadline_watchdog_does_not_cut_a_connection_after_its_call_ended(server, sender):
    # Many short calls with short deadlines on the same keep-alive
    # connections: a watchdog that cut a connection after its call was over
    # would fail a later call that took it from the pool (before that call's
    # own, later, deadline), or cut it idle in the pool (a connection more).
    # A call may run out of its own time on a loaded machine: that fails it
    # only after its deadline, and costs the one connection it was on.
    ids, timed_out = [], 0
    for i in range(300):
        timeout = 0.05 + (i % 3) * 0.001
        t0 = time.monotonic()
        try:
            ids.append(sender.call("sendMessage", {"chat_id": 5, "text": str(i)},
                                   timeout=timeout)["message_id"])
        except TelegramNetworkError as exc:
            elapsed = time.monotonic() - t0
            assert "deadline" in exc.reason and elapsed >= timeout, (i, elapsed, exc)
            timed_out += 1
    time.sleep(0.1)
    assert ids == sorted(set(ids))
    assert send(sender, "5", "last").message_id == str(len(server.messages("5")))
    assert server.stats()["connections"] <= 1 + timed_out


# -- every number in an answer is outside input ------------------------------------

class CannedServer:
    """A real local HTTP server that answers each request with the next
    canned ``(status, body)`` (the last one again when they run out) and
    records the JSON it received."""

    def __init__(self, *answers):
        import http.server

        self.answers = list(answers)
        self.received = []
        canned = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                canned.received.append((self.path.rsplit("/", 1)[1], json.loads(body or b"{}")))
                status, data = canned.answers.pop(0) if len(canned.answers) > 1 \
                    else canned.answers[0]
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = "http://127.0.0.1:%d" % self.httpd.server_address[1]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def too_many(retry_after_json):
    return 429, (b'{"ok":false,"error_code":429,"description":"Too Many Requests",'
                 b'"parameters":{"retry_after":%s}}' % retry_after_json)


@pytest.mark.parametrize("value, seconds", [
    (b"3", 3.0), (b"2.5", 2.5), (b"0", 0.0),
    (b"1" + b"0" * 400, 86400.0),  # a 400-digit integer: once a bare OverflowError
    (b"1e308", 86400.0), (b"Infinity", 86400.0),  # json.loads reads Infinity and NaN
    (b"NaN", 1.0), (b"-5", 1.0), (b'"5"', 1.0), (b"true", 1.0), (b"null", 1.0), (b"[1]", 1.0),
    (b"{}", 1.0),
])
def test_a_429s_retry_after_always_becomes_a_bounded_retry_after(value, seconds):
    with CannedServer(too_many(value)) as canned:
        exc = failure(send, TelegramSender(TOKEN, base_url=canned.base_url))
    assert type(exc) is RetryAfter and exc.seconds == seconds
    assert 0 <= exc.seconds <= telegram_sender_module.MAX_RETRY_AFTER


@pytest.mark.parametrize("answer, kind", [
    # error_code: a huge or odd one falls back to the HTTP status
    ((400, b'{"ok":false,"error_code":1' + b"0" * 400 + b',"description":"x"}'), PlatformError),
    ((403, b'{"ok":false,"error_code":-1,"description":"x"}'), PlatformError),
    ((502, b'{"ok":false,"error_code":"502","description":"x"}'), TelegramNetworkError),
    # a number past Python's int-from-text digit limit: not a Bot API answer
    ((200, b'{"ok":true,"result":{"message_id":1' + b"0" * 5000 + b"}}"), PlatformError),
    # a huge description is cut
    ((400, b'{"ok":false,"error_code":400,"description":"' + b"d" * 100000 + b'"}'),
     PlatformError),
])
def test_every_number_an_answer_holds_maps_to_a_documented_error(answer, kind):
    with CannedServer(answer) as canned:
        exc = failure(send, TelegramSender(TOKEN, base_url=canned.base_url))
    assert type(exc) is kind, exc
    if isinstance(exc, PlatformError):
        assert exc.status == answer[0] and len(exc.description) <= 1003
    assert len(str(exc)) < 1200


@pytest.mark.parametrize("message_id", [b'"abc"', b"true", b"1.5", b"[1]", b"null"])
def test_a_message_id_that_is_not_an_integer_is_no_message_id(message_id):
    with CannedServer((200, b'{"ok":true,"result":{"message_id":%s}}' % message_id)) as canned:
        assert send(TelegramSender(TOKEN, base_url=canned.base_url)).message_id == ""


# -- a group that became a supergroup -----------------------------------------------

def test_a_send_to_a_migrated_group_is_resent_to_the_supergroup_and_reported(server):
    reported = []
    sender = TelegramSender(TOKEN, base_url=server.base_url,
                            on_migrate=lambda old, new: reported.append((old, new)))
    new = server.migrate_chat(-4123)
    result = send(sender, "-4123", "first")
    assert result.raw["chat"]["id"] == new and result.message_id == "2"  # 1: the service message
    assert reported == [("-4123", str(new))]
    assert sender.migrated_chat_id("-4123") == str(new) == sender.migrated_chat_id(-4123)
    assert sender.migrations() == {"-4123": str(new)}
    send(sender, "-4123", "second")  # straight to the supergroup: no second 400
    assert sender.send_typing("-4123") is True
    assert server.stats()["status_400"] == 1 and reported == [("-4123", str(new))]
    assert [m.text for m in server.messages(new)] == ["first", "second"]
    assert server.chat_actions == [(str(new), "typing")]


def test_a_migration_without_on_migrate_is_logged_as_a_warning(server, sender, caplog):
    new = server.migrate_chat(-88)
    with caplog.at_level(logging.WARNING, logger="fastdispatch.telegram"):
        assert send(sender, "-88", "x").raw["chat"]["id"] == new
    assert any("-88" in r.getMessage() and str(new) in r.getMessage() for r in caplog.records)


def test_an_on_migrate_that_raises_does_not_fail_the_send(server, caplog):
    def hook(old, new):
        raise RuntimeError("user code")
    sender = TelegramSender(TOKEN, base_url=server.base_url, on_migrate=hook)
    server.migrate_chat(-89)
    with caplog.at_level(logging.ERROR, logger="fastdispatch.telegram"):
        assert send(sender, "-89", "x").message_id
    assert any("on_migrate" in r.getMessage() for r in caplog.records)


def test_calls_about_a_message_of_the_old_group_are_not_resent(server, sender):
    send(sender, "-90", "x")
    new = server.migrate_chat(-90)
    exc = failure(sender.delete_message, "-90", "1")  # message 1 lives in the old group
    assert isinstance(exc, PlatformError) and exc.parameters == {"migrate_to_chat_id": new}
    assert sender.migrated_chat_id("-90") == str(new)  # but the mapping is learned
    assert server.deleted == []


def test_the_migration_memory_is_bounded_oldest_first(server):
    sender = TelegramSender(TOKEN, base_url=server.base_url, max_migrations=2,
                            on_migrate=lambda old, new: None)
    for group in (-1, -2, -3):
        server.migrate_chat(group)
        send(sender, str(group), "x")
    assert list(sender.migrations()) == ["-2", "-3"]


@pytest.mark.parametrize("target", [b'"abc"', b"true", b"12", b"0", b"-1" + b"0" * 30, b"null"])
def test_a_migrate_to_chat_id_that_is_not_a_supergroup_id_is_a_platform_error(target):
    answer = (400, b'{"ok":false,"error_code":400,"description":"Bad Request: group chat was '
                   b'upgraded to a supergroup chat","parameters":{"migrate_to_chat_id":%s}}'
              % target)
    with CannedServer(answer) as canned:
        exc = failure(send, TelegramSender(TOKEN, base_url=canned.base_url), "-5")
        assert isinstance(exc, PlatformError) and len(canned.received) == 1


def test_a_server_that_keeps_migrating_is_followed_a_bounded_number_of_times():
    answers = [(400, b'{"ok":false,"error_code":400,"description":"Bad Request: group chat was '
                     b'upgraded to a supergroup chat","parameters":{"migrate_to_chat_id":-10%d}}'
                % (10 ** 11 + i)) for i in range(10)]
    with CannedServer(*answers) as canned:
        exc = failure(send, TelegramSender(TOKEN, base_url=canned.base_url,
                                           on_migrate=lambda old, new: None), "-5")
        assert isinstance(exc, PlatformError) and len(canned.received) == 3
        assert [params["chat_id"] for _, params in canned.received][0] == "-5"


def test_50_queued_messages_to_a_group_that_migrates_mid_stream_all_arrive_once_in_order(impl):
    from fastdispatch import Pacing, RateLimit, RetryPolicy

    limit = RateLimit(10, per=0.1)
    with FakeTelegramServer(group_limit=limit, tolerance=0.02, exact_retry_after=True) as server:
        reported = []
        sender = TelegramSender(TOKEN, base_url=server.base_url,
                                on_migrate=lambda old, new: reported.append((old, new)))
        new = server.migrate_chat(-4123, after=20)  # after the 20th message has arrived
        d = impl.OutboundDispatcher(max_inflight=8, pacing=Pacing(chat_limit=limit),
                                    retry=RetryPolicy(max_attempts=5), send_timeout=10.0)
        texts = ["m%02d" % i for i in range(50)]
        futures = [d.submit("-4123", lambda sc, t=t: sender.send(
            sc, SendRequest(ChatInfo("-4123", is_group=True), TextMessage(t))))
            for t in texts]
        assert d.shutdown(timeout=60)
        results = [f.result(timeout=0) for f in futures]
        old_record = [m.text for m in server.messages(-4123)]
        new_record = [m.text for m in server.messages(new)]
    assert old_record == texts[:20]  # before the migration, in the group
    assert new_record == texts[20:]  # every later one in the supergroup, once, in order
    assert [r.raw["chat"]["id"] for r in results] == [-4123] * 20 + [new] * 30
    assert reported == [("-4123", str(new))]
