"""The network edge: numbers from outside, secrets in the text servers
send back, nested JSON, replayed interactions, forged updates.

Where a platform's answer matters, a real HTTP server on 127.0.0.1
answers it: :class:`CannedServer` writes exactly the bytes a test gives
(what no well-behaved fake would send: a ``Content-Length: ²``)."""

import json
import logging
import socket
import threading
import time
import types
import unicodedata

import pytest

from fastdispatch import ChatInfo, Engine, SendRequest, TextMessage
from fastdispatch._netnum import parse_int, parse_seconds

from helpers import free_port, listening, wait_until

TG_TOKEN = "123456:SECRET-edge_token_value"


class CannedServer:
    """Answers every request on 127.0.0.1 with ``answer`` (raw bytes, built
    by ``make(request_bytes)`` when callable), then closes the connection."""

    def __init__(self, answer):
        self.answer = answer
        self.requests = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    head, _, body = data.partition(b"\r\n\r\n")
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            want = int(line.split(b":")[1])
                            while len(body) < want:
                                chunk = conn.recv(65536)
                                if not chunk:
                                    break
                                body += chunk
                    self.requests.append(head + b"\r\n\r\n" + body)
                    answer = self.answer(head) if callable(self.answer) else self.answer
                    conn.sendall(answer)
                except OSError:
                    pass

    def close(self):
        self._sock.close()


def http_answer(status, body, headers=()):
    lines = ["HTTP/1.1 %s" % status, "Connection: close"] + list(headers)
    # latin-1, as HTTP/1.1 header bytes are read: "\u00b2" is the one byte 0xB2
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _sc():
    """A SendContext stand-in that records the limits reported (``.reports``)."""
    reports = []
    return types.SimpleNamespace(
        reports=reports, remaining=lambda: 5.0, check=lambda: None,
        report_limit=lambda remaining, reset_after, **kw: reports.append((remaining,
                                                                           reset_after, kw)))


# -- one parser for numbers from the network ----------------------------------------

def _unicode_digits():
    """Every character Python calls a digit or a decimal that is not ASCII."""
    return [chr(c) for c in range(0x80, 0x110000)
            if (chr(c).isdigit() or chr(c).isdecimal() or unicodedata.numeric(chr(c), None)
                is not None) and not (0xD800 <= c < 0xE000)]


def test_network_numbers_are_ascii_digits_of_bounded_length():
    for ch in _unicode_digits():
        for text in (ch, "1" + ch, ch + "1", "1." + ch):
            assert parse_int(text) is None, repr(text)
            assert parse_seconds(text) is None, repr(text)
    for text in ("", " ", "-", "+1", "1e3", "inf", "nan", "1_0", "0x10", "1.", ".5", "1.2.3",
                 "1" * 20, "-1", "1\n", b"\xff", None, True, [1], 1.5):
        assert parse_int(text) is None, repr(text)
    for text in ("-1", "1e3", "inf", "nan", "1_0", "+1", "1" * 13, "1." + "1" * 10, -1,
                 float("nan"), True, None, b"\xff"):
        assert parse_seconds(text) is None, repr(text)
    assert parse_int("0") == 0 and parse_int(" 42\t") == 42 and parse_int(b"7") == 7
    assert parse_int("-12", signed=True) == -12 and parse_int("-12") is None
    assert parse_int("9" * 19) == int("9" * 19) and parse_int(5, hi=4) is None
    assert parse_int("12", max_digits=1) is None
    assert parse_seconds("0.250") == 0.25 and parse_seconds("3") == 3.0
    assert parse_seconds(10 ** 400) == 86400.0 and parse_seconds(float("inf")) == 86400.0
    assert parse_seconds("99999", cap=60.0) == 60.0 and parse_seconds("x", 1.0) == 1.0


def test_a_superscript_content_length_does_not_fail_a_delivered_telegram_message():
    from fastdispatch.telegram import TelegramSender
    body = json.dumps({"ok": True, "result": {"message_id": 7}}).encode()
    server = CannedServer(http_answer("200 OK", body, ["Content-Length: \u00b2"]))
    try:
        with TelegramSender(TG_TOKEN, base_url=server.url) as sender:
            assert sender.call("sendMessage", {"chat_id": 1, "text": "x"}) == {"message_id": 7}
    finally:
        server.close()


@pytest.mark.parametrize("header", ["X-RateLimit-Remaining", "X-RateLimit-Reset-After"])
def test_a_superscript_rate_limit_header_does_not_fail_a_delivered_discord_message(header):
    from fastdispatch.discord import DiscordSender
    body = json.dumps({"id": "99", "content": "x"}).encode()
    headers = {"X-RateLimit-Remaining": "4", "X-RateLimit-Reset-After": "1.5",
               "X-RateLimit-Bucket": "abc", "Content-Length": str(len(body))}
    headers[header] = "\u00b2"
    server = CannedServer(http_answer("200 OK", body, ["%s: %s" % kv for kv in headers.items()]))
    sc = _sc()
    try:
        with DiscordSender("MTEx.a.b", base_url=server.url) as sender:
            result = sender.send(sc, SendRequest(ChatInfo("123"), TextMessage("x")))
    finally:
        server.close()
    assert result.message_id == "99" and sc.reports == []


def test_non_ascii_digits_in_rate_limit_headers_are_not_read_as_numbers():
    from fastdispatch.discord._sender import report_headers, seconds_value
    sc = _sc()
    report_headers(sc, {"X-RateLimit-Remaining": "\u0661", "X-RateLimit-Reset-After": "1"}, "1")
    report_headers(sc, {"X-RateLimit-Remaining": "1", "X-RateLimit-Reset-After": "\u0661"}, "1")
    assert sc.reports == []
    assert seconds_value("\u0661", None) is None and seconds_value(" 1_0 ", None) is None


def _interactions_app():
    from fastdispatch.discord import DiscordSender, interactions_app
    from fastdispatch.testing import FakeDiscordServer
    fake = FakeDiscordServer()
    engine = Engine()
    sender = DiscordSender("MTEx.a.b", base_url="http://127.0.0.1:1")
    return interactions_app(engine, sender, public_key=fake.public_key), fake, engine


def _call(app, environ):
    seen = []
    body = b"".join(app(environ, lambda status, headers: seen.append(status)))
    return seen[0], body


def _environ(body, headers=(), method="POST"):
    import io
    environ = {"REQUEST_METHOD": method, "CONTENT_LENGTH": str(len(body)),
               "wsgi.input": io.BytesIO(body)}
    for k, v in dict(headers).items():
        environ["HTTP_" + k.upper().replace("-", "_")] = v
    return environ


def test_an_unsigned_interaction_with_a_superscript_timestamp_is_401_not_500(caplog):
    app, fake, engine = _interactions_app()
    try:
        for ts in ("\u00b2", "\u0661\u0662", "1" * 40):
            status, _ = _call(app, _environ(b"{}", {"X-Signature-Ed25519": "ab" * 64,
                                                     "X-Signature-Timestamp": ts}))
            assert status.startswith("401"), (ts, status)
        assert "Traceback" not in caplog.text
    finally:
        engine.shutdown(1)


@pytest.mark.parametrize("length", ["\u00b2", "\u0661", "1_0", " +1", "9" * 30])
def test_a_non_ascii_content_length_is_400_at_both_endpoints(length):
    import io
    from fastdispatch.telegram import TelegramSender, webhook_app
    app, fake, engine = _interactions_app()
    tg = webhook_app(engine, TelegramSender(TG_TOKEN, base_url="http://127.0.0.1:1"),
                     secret_token="s")
    try:
        for a, extra in ((app, {}), (tg, {"HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": "s"})):
            environ = dict(_environ(b"{}"), CONTENT_LENGTH=length, **extra)
            environ["wsgi.input"] = io.BytesIO(b"{}")
            status, _ = _call(a, environ)
            assert status.startswith("400"), (a, length, status)
    finally:
        engine.shutdown(1)


def test_chat_key_reads_only_ascii_digits_as_a_chat_number():
    from fastdispatch.integrations._common import chat_key
    assert chat_key("123") == 123 and chat_key("-100123") == -100123
    assert chat_key("\u00b2") == "\u00b2"  # not a ValueError
    assert chat_key("-\u00b2") == "-\u00b2"
    assert chat_key("\u0661\u0662") == "\u0661\u0662"  # not the chat 12
    assert chat_key("@name") == "@name"
    assert chat_key("9" * 400) == "9" * 400  # not a 400-digit int


# -- deeply nested JSON ----------------------------------------------------------

def test_deeply_nested_json_is_400_not_a_500_at_both_endpoints(caplog):
    from fastdispatch.telegram import TelegramSender, webhook_app
    app, fake, engine = _interactions_app()
    tg = webhook_app(engine, TelegramSender(TG_TOKEN, base_url="http://127.0.0.1:1"),
                     secret_token="s")
    body = b"[" * 200_000 + b"]" * 200_000
    try:
        environ = _environ(body, {"X-Telegram-Bot-Api-Secret-Token": "s"})
        assert _call(tg, environ)[0].startswith("400")
        signed = fake.sign(body)
        assert _call(app, _environ(body, signed))[0].startswith("400")
        assert "Traceback" not in caplog.text and "RecursionError" not in caplog.text
    finally:
        engine.shutdown(1)


# -- secrets in the text a server sends back ---------------------------------------------

@pytest.mark.parametrize("status", ["400 Bad Request", "502 Bad Gateway"])
def test_a_proxy_echoing_the_path_puts_no_token_into_exceptions_or_logs(status, caplog):
    """The proxy's answer quotes the request line (and its percent-encoding)."""
    from fastdispatch.telegram import TelegramSender
    caplog.set_level(logging.DEBUG)

    def echo(head):
        line = head.split(b"\r\n")[0].decode("latin-1")
        quoted = line.replace(":", "%3A")
        text = "no route for %s (%s) (%s)" % (line, quoted, quoted.replace("%3A", "%3a"))
        body = json.dumps({"ok": False, "error_code": int(status[:3]),
                           "description": text}).encode()
        return http_answer(status, body, ["Content-Length: %d" % len(body)])
    server = CannedServer(echo)
    secret = TG_TOKEN.split(":")[1]
    try:
        with TelegramSender(TG_TOKEN, base_url=server.url) as sender:
            with pytest.raises(Exception) as info:
                sender.call("sendMessage", {"chat_id": 1, "text": "x"})
            logging.getLogger("fastdispatch.test").error("send failed: %s", info.value)
    finally:
        server.close()
    err = info.value
    assert "no route for POST /bot<token>/sendMessage" in str(err)
    for text in (str(err), repr(err), repr(err.args), caplog.text,
                 str(getattr(err, "description", "")), str(getattr(err, "reason", ""))):
        assert secret not in text
    import pickle
    assert secret not in str(pickle.loads(pickle.dumps(err)))


def test_a_discord_error_message_echoing_an_interaction_token_is_scrubbed():
    from fastdispatch.discord import DiscordSender, PlatformError

    def echo(head):
        line = head.split(b"\r\n")[0].decode("latin-1")
        body = json.dumps({"message": "bad path %s" % line, "code": 0}).encode()
        return http_answer("404 Not Found", body, ["Content-Length: %d" % len(body)])
    server = CannedServer(echo)
    token = "aW50ZXJhY3Rpb246c2VjcmV0LXRva2Vu"
    try:
        with DiscordSender("MTEx.a.b", base_url=server.url) as sender:
            with pytest.raises(PlatformError) as info:
                sender.send_followup(None, "123", token, "x")
    finally:
        server.close()
    assert "bad path" in str(info.value) and token not in str(info.value)


# -- forged updates ----------------------------------------------------------------

def test_webhook_app_without_a_secret_is_an_explicit_choice_and_said_loudly(caplog):
    from fastdispatch.telegram import TelegramSender, webhook_app
    sender = TelegramSender(TG_TOKEN, base_url="http://127.0.0.1:1")
    engine = Engine()
    try:
        with pytest.raises(TypeError, match="secret_token=") as info:
            webhook_app(engine, sender)
        assert "setWebhook" in str(info.value)
        caplog.set_level(logging.WARNING)
        webhook_app(engine, sender, secret_token=None)
        warning = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warning) == 1
        text = warning[0].getMessage()
        assert "forged" in text and "secret_token=" in text and "setWebhook" in text
        caplog.clear()
        webhook_app(engine, sender, secret_token="s3cret")
        assert not caplog.records
    finally:
        engine.shutdown(1)


# -- the servers: huge, slow and many clients ------------------------------------------


def _run_on_thread(runner, sender, port_option, **kwargs):
    """``runner(Engine(), sender, **kwargs)`` on a thread, with a free port
    as ``port_option``, stopped by the returned Event: (port, stop, thread)."""
    port, stop = free_port(), threading.Event()
    kwargs.update({port_option: port, "stop": stop, "handle_signals": False,
                   "drain_timeout": 1, "request_timeout": 1.0})
    thread = threading.Thread(target=runner, args=(Engine(), sender), kwargs=kwargs,
                              daemon=True)
    thread.start()
    wait_until(lambda: listening(port), 20, "a listener on port %d" % port)
    return port, stop, thread


def _start_webhook():
    """run_webhook: 4 threads, 1 s per request (a small server shows the
    limits soonest)."""
    from fastdispatch.telegram import TelegramSender, run_webhook
    return _run_on_thread(run_webhook, TelegramSender(TG_TOKEN, base_url="http://127.0.0.1:1"),
                          "port", secret_token="s", threads=4)


def _start_interactions():
    from fastdispatch.discord import DiscordSender, run_interactions
    from fastdispatch.testing import FakeDiscordServer
    return _run_on_thread(run_interactions,
                          DiscordSender("MTEx.a.b", base_url="http://127.0.0.1:1"), "port",
                          public_key=FakeDiscordServer().public_key, threads=4)


def _start_health():
    """run_polling's own health listener (against a fake Telegram)."""
    from fastdispatch.telegram import TelegramSender, run_polling
    from fastdispatch.testing import FakeTelegramServer
    fake = FakeTelegramServer(TG_TOKEN).start()
    port, stop, thread = _run_on_thread(
        run_polling, TelegramSender(TG_TOKEN, base_url=fake.base_url), "health_port",
        poll_timeout=1)
    stop.fake = fake
    return port, stop, thread


def _start_metrics():
    """fastdispatch.metrics.serve: a Prometheus endpoint of its own."""
    from prometheus_client import CollectorRegistry
    from fastdispatch.metrics import serve
    server = serve(0, CollectorRegistry(), request_timeout=1.0)

    class _Done:
        def set(self):
            server.stop()

    class _Thread:
        def join(self, timeout):
            pass

        def is_alive(self):
            return False
    return server.port, _Done(), _Thread()


SERVERS = {"webhook": (_start_webhook, "/telegram"),
           "interactions": (_start_interactions, "/interactions"),
           "health": (_start_health, "/healthz"),
           "metrics": (_start_metrics, "/metrics")}


@pytest.fixture(params=sorted(SERVERS))
def served(request):
    start, path = SERVERS[request.param]
    port, stop, thread = start()
    yield request.param, port, path
    stop.set()
    thread.join(30)
    if hasattr(stop, "fake"):
        stop.fake.stop()
    assert not thread.is_alive()


def _status_of(sock, timeout=5.0):
    """The status code of the answer on ``sock`` (None: closed without one)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return int(data.split()[1]) if data.startswith(b"HTTP/") else None


def _healthy(port, deadline=20.0):
    """GET /healthz until it answers 200 (a bound on a hang, not a speed test)."""
    import http.client
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return True
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.1)
    return False


def test_a_huge_request_header_is_refused_before_it_ends(served):
    name, port, path = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        head = ("POST %s HTTP/1.1\r\nHost: x\r\nX-Big: " % path).encode() + b"a" * (64 << 10)
        try:
            sock.sendall(head)  # never ends its headers: only a limit answers it
        except OSError:
            pass
        assert _status_of(sock) in (400, 413, 414, 431)


def test_a_huge_body_is_refused_unread_and_the_connection_closed(served):
    name, port, path = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "X-Telegram-Bot-Api-Secret-Token: wrong\r\n"
                      "Content-Length: %d\r\n\r\n" % (path, 200 << 20)).encode() + b"{")
        assert _status_of(sock) in (403, 405, 413)
        # and the server does not wait for the 200 MiB announced: it closes
        sock.settimeout(5)
        try:
            rest = b""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                rest += chunk
        except ConnectionResetError:
            pass


def test_slow_clients_cannot_hold_the_threads_past_the_request_deadline(served):
    """More clients than threads each send one header line every 0.3 s, for
    ever: cut at the 1 s deadline, they free the threads; a normal request
    is answered while they are still dripping."""
    name, port, path = served
    stop = threading.Event()
    closed = []

    def drip():
        with socket.create_connection(("127.0.0.1", port)) as sock:
            try:
                sock.sendall(("POST %s HTTP/1.1\r\n" % path).encode())
                while not stop.wait(0.3):
                    sock.sendall(b"X-Drip: 1\r\n")
            except OSError:
                closed.append(1)  # the server cut it

    drippers = [threading.Thread(target=drip, daemon=True) for _ in range(8)]
    for t in drippers:
        t.start()
    try:
        assert _healthy(port)
        end = time.monotonic() + 30
        while len(closed) < 8 and time.monotonic() < end:
            time.sleep(0.1)
        assert len(closed) == 8, closed
    finally:
        stop.set()
        for t in drippers:
            t.join(10)


def test_many_idle_clients_cannot_take_the_server_down(served):
    """300 connections that send nothing: bounded threads, bounded queue
    (the rest are answered 503 or closed), each cut at its deadline; the
    server answers a real request all along and ends with its threads."""
    name, port, path = served
    socks = []
    try:
        for _ in range(300):
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                break
        assert len(socks) >= 50
        assert _healthy(port)
        workers = [t for t in threading.enumerate() if t.name.startswith("CP Server Thread")]
        assert len(workers) <= 4 and threading.active_count() < 40  # not one per client
    finally:
        for s in socks:
            s.close()



# -- a newcomer sees what the runners do ----------------------------------------------

_RUNNER = """
import logging, sys, threading
from fastdispatch import Engine
from fastdispatch.telegram import TelegramSender, run_polling
from fastdispatch.testing import FakeTelegramServer
if sys.argv[1] == "configured":
    logging.basicConfig(level=logging.WARNING)
with FakeTelegramServer("1:a") as fake:
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    sys.exit(run_polling(Engine(), TelegramSender("1:a", base_url=fake.base_url),
                         poll_timeout=1, stop=stop, handle_signals=False))
"""


@pytest.mark.parametrize("logging_", ["none", "configured"])
def test_the_runners_say_what_they_do_to_a_program_without_logging(logging_):
    import os
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _RUNNER, logging_], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    said = [line for line in lines if "polling for updates" in line or "shutdown:" in line]
    if logging_ == "none":
        assert len(said) == 2 and all(line.startswith("fastdispatch: ") for line in said)
    else:  # the program chose WARNING: nothing more from the package
        assert said == [] and out.stderr == ""


# -- replayed interactions -------------------------------------------------------------

def test_a_replayed_signed_interaction_does_not_run_the_handler_again():
    from fastdispatch.discord import DiscordSender, run_interactions
    from fastdispatch.testing import FakeDiscordServer
    token = "MTEwMDAwMDAwMDAwMDAwMDAwMQ.GhIjKl.replay-token-value"
    with FakeDiscordServer(token) as fake:
        engine = Engine()
        runs = []

        @engine.on(lambda ctx: True)
        def echo(ctx):
            runs.append(ctx.event.message_id)
            ctx.reply_text("echo")

        sender = DiscordSender(token, base_url=fake.api_url)
        port, stop = free_port(), threading.Event()
        thread = threading.Thread(target=run_interactions, args=(engine, sender), kwargs=dict(
            public_key=fake.public_key, port=port, stop=stop, handle_signals=False),
            daemon=True)
        thread.start()
        wait_until(lambda: listening(port), 20, "a listener on port %d" % port)
        url = "http://127.0.0.1:%d/interactions" % port
        try:
            body = json.dumps(fake.make_interaction("77", "echo", text="hi")).encode()
            headers = fake.sign(body)
            for _ in range(3):  # the same bytes, the same signature, within max_age
                assert fake.post_interaction(url, body, sign=False, headers=headers) == (
                    200, {"type": 5})
            other = json.dumps(fake.make_interaction("77", "echo", text="again")).encode()
            assert fake.post_interaction(url, other)[0] == 200
            end = time.monotonic() + 30
            while len(fake.messages("77")) < 2 and time.monotonic() < end:
                time.sleep(0.02)
        finally:
            stop.set()
            thread.join(30)
        assert len(runs) == 2 and len(set(runs)) == 2
        assert len(fake.messages("77")) == 2


# -- a bot-wide bound on replies pending -------------------------------------------------

class _Gated:
    """A sender whose sends wait for ``gate``."""

    def __init__(self):
        self.gate = threading.Event()
        self.sent = []

    def send(self, sc, request):
        self.gate.wait(30)
        self.sent.append(request.target.id)
        from fastdispatch import SendResult
        return SendResult("1")

    def capabilities(self):
        from fastdispatch import Capabilities
        return Capabilities()


def _echo_engine(dispatcher):
    engine = Engine(dispatcher=dispatcher)

    @engine.on(lambda ctx: True)
    def echo(ctx):
        ctx.reply_text("echo")
    return engine


def _update(i, chat):
    return {"update_id": i, "message": {"message_id": i, "text": "hi", "chat": {
        "id": chat, "type": "private"}, "from": {"id": chat, "first_name": "u"}}}


def test_a_flood_from_many_chats_is_left_to_telegram_not_piled_up_in_memory(make_dispatcher):
    """Webhook: past max_pending replies across all chats, updates from new
    chats are answered 429 (Telegram redelivers them); none is lost."""
    from fastdispatch.telegram import webhook_app
    d = make_dispatcher(max_inflight=2)
    engine = _echo_engine(d)
    sender = _Gated()
    app = webhook_app(engine, sender, secret_token=None, max_pending=10)
    statuses = {}
    for i in range(200):  # 200 chats, one update each
        body = json.dumps(_update(i, 1000 + i)).encode()
        statuses[i] = _call(app, _environ(body))[0][:3]
        assert d._pending_count() <= 10
    accepted = [i for i, s in statuses.items() if s == "200"]
    assert len(accepted) == 10 and set(statuses.values()) == {"200", "429"}
    assert app.stats["bot_busy"] == 190
    sender.gate.set()
    for i in sorted(set(statuses) - set(accepted)):  # Telegram's redeliveries, later
        body = json.dumps(_update(i, 1000 + i)).encode()
        while _call(app, _environ(body))[0][:3] != "200":
            time.sleep(0.01)
    assert d.drain(30)
    assert sorted(sender.sent) == sorted(str(1000 + i) for i in range(200))
    engine.shutdown(5)


def test_the_poller_holds_its_offset_past_max_pending_replies(make_dispatcher):
    from fastdispatch.telegram import TelegramPoller, TelegramSender
    from fastdispatch.testing import FakeTelegramServer
    d = make_dispatcher(max_inflight=2)
    engine = _echo_engine(d)
    gated = _Gated()
    with FakeTelegramServer(TG_TOKEN) as fake:
        sender = TelegramSender(TG_TOKEN, base_url=fake.base_url)
        for i in range(60):
            fake.push_message(2000 + i, "m%d" % i)
        poller = TelegramPoller(sender, engine, poll_timeout=1, max_pending=8)
        sender.send = gated.send  # replies wait for the gate; polling goes on
        poller.start()
        end = time.monotonic() + 10
        while poller.busy == 0 and time.monotonic() < end:
            time.sleep(0.02)
        assert poller.busy > 0 and poller.handled <= 8 and d._pending_count() <= 8
        assert fake.pending_updates() >= 52  # not confirmed: Telegram keeps them
        gated.gate.set()
        end = time.monotonic() + 60
        while poller.handled < 60 and time.monotonic() < end:
            time.sleep(0.02)
        poller.stop(10)
        assert d.drain(30)
        poller.confirm()
        assert poller.handled == 60 and fake.pending_updates() == 0
    assert sorted(gated.sent) == sorted(str(2000 + i) for i in range(60))
    engine.shutdown(5)


def test_a_webhook_path_made_of_the_token_is_not_logged(caplog):
    from fastdispatch.telegram import TelegramSender, run_webhook
    caplog.set_level(logging.DEBUG)
    sender = TelegramSender(TG_TOKEN, base_url="http://127.0.0.1:1")
    port, stop, thread = _run_on_thread(run_webhook, sender, "port", secret_token="s",
                                        url_path="/" + TG_TOKEN)
    stop.set()
    thread.join(30)
    assert "webhook on http://127.0.0.1:%d/<token>" % port in caplog.text
    assert TG_TOKEN.split(":")[1] not in caplog.text
