"""End to end over real HTTP: the dispatcher, TelegramSender and a FakeTelegramServer
that refuses, fails and drops a share of the sends.  Runs on both cores."""

import collections
import threading

from fastdispatch import ChatInfo, Engine, Pacing, RateLimit, RetryPolicy, SendRequest, TextMessage
from fastdispatch import rules
from fastdispatch.telegram import TelegramPoller, TelegramSender
from fastdispatch.testing import FakeTelegramServer

TOKEN = "42:e2e"


def numbers_per_chat(server, chats):
    return {c: [int(m.text.rsplit("#", 1)[1]) for m in server.messages(c)] for c in chats}


def test_3000_messages_to_300_chats_arrive_in_order_through_429s_and_5xx(impl):
    chats = [str(1000 + i) if i % 10 else str(-1000 - i) for i in range(300)]
    with FakeTelegramServer(seed=11, exact_retry_after=True) as server:
        # 429s, 5xx, connections dropped before the send (nothing arrived)
        # and after it (it arrived, the answer was lost: the one case where a
        # retry may deliver a message twice).
        server.set_fault_rates(too_many=0.05, error=0.05, drop=0.01, drop_after=0.01,
                               retry_after=0.01, status=502)
        sender = TelegramSender(TOKEN, base_url=server.base_url, pool_size=32)
        retry = RetryPolicy(max_attempts=40, backoff=0.002, max_backoff=0.02)
        d = impl.OutboundDispatcher(max_inflight=32, queue_size=10, send_timeout=10.0,
                                    retry=retry)
        futures = []
        for n in range(10):
            for chat in chats:
                request = SendRequest(ChatInfo(chat, is_group=chat.startswith("-")),
                                      TextMessage("%s #%d" % (chat, n)))
                futures.append(d.submit(chat, lambda sc, r=request: sender.send(sc, r)))
        assert d.shutdown(timeout=120)
        assert all(f.exception() is None for f in futures), \
            collections.Counter(type(f.exception()).__name__ for f in futures)
        stats = server.stats()
        got = numbers_per_chat(server, chats)
    assert stats["injected_too_many"] > 50 and stats["injected_error"] > 50
    assert stats["injected_drop"] > 5 and stats["injected_drop_after"] > 5
    duplicates = 0
    for chat, numbers in got.items():
        deduplicated = [n for i, n in enumerate(numbers) if i == 0 or numbers[i - 1] != n]
        assert deduplicated == list(range(10)), (chat, numbers)  # all, once each, in order
        duplicates += len(numbers) - len(deduplicated)
    # A message arrives twice only when the server really failed mid-send.
    assert duplicates <= stats["injected_drop_after"]
    assert d.stats().retried >= stats["injected_too_many"] + stats["injected_error"]


def test_paced_sends_meet_no_limit_and_keep_order(impl):
    limits = {"chat_limit": RateLimit(1, per=0.1), "global_limit": RateLimit(30, per=0.1)}
    with FakeTelegramServer(**limits, tolerance=0.05, exact_retry_after=True) as server:
        sender = TelegramSender(TOKEN, base_url=server.base_url, pool_size=32)
        d = impl.OutboundDispatcher(max_inflight=32, pacing=Pacing(**limits),
                                    retry=RetryPolicy(max_attempts=10))
        chats = [str(i) for i in range(1, 41)]
        futures = [d.submit(c, lambda sc, r=SendRequest(ChatInfo(c), TextMessage("%s #%d" % (c, n))):
                            sender.send(sc, r))
                   for n in range(3) for c in chats]
        assert d.shutdown(timeout=60)
        assert all(f.exception() is None for f in futures)
        got = numbers_per_chat(server, chats)
    assert all(numbers == [0, 1, 2] for numbers in got.values())
    # every chat's sends were at least its window apart, as the server saw them
    for chat in chats:
        times = [m.at for m in server.messages(chat)]
        assert all(b - a >= 0.1 - 0.05 for a, b in zip(times, times[1:]))


def test_an_echo_bot_polls_updates_and_replies_in_order(impl):
    with FakeTelegramServer() as server:
        sender = TelegramSender(TOKEN, base_url=server.base_url)
        engine = Engine(impl.OutboundDispatcher(max_inflight=8, retry=RetryPolicy()))

        @engine.on(rules.on_command("echo"), block=True)
        def echo(ctx):
            ctx.reply_text(ctx.ext.get(rules.Command).args)

        server.inject("error", 3, status=503)  # the first replies meet a 503: retried
        for i in range(20):
            server.push_message(5 + i % 2, "/echo %d" % i)
        done = threading.Event()
        poller = TelegramPoller(sender, engine, poll_timeout=1).start()
        try:
            for _ in range(200):
                if len(server.all_messages()) >= 20:
                    done.set()
                    break
                threading.Event().wait(0.05)
        finally:
            assert poller.stop(5)
            assert engine.shutdown(10)
        assert done.is_set()
        assert [m.text for m in server.messages(5)] == [str(i) for i in range(0, 20, 2)]
        assert [m.text for m in server.messages(6)] == [str(i) for i in range(1, 20, 2)]


def test_the_telegram_example_runs_against_a_fake_server_without_a_token():
    import os
    import pathlib
    import subprocess
    import sys

    import pytest

    script = pathlib.Path(__file__).resolve().parent.parent / "examples" / "telegram_echo_bot.py"
    if not script.exists():
        pytest.skip("examples/ is not part of this copy of the tests")
    env = {k: v for k, v in os.environ.items() if k != "TELEGRAM_BOT_TOKEN"}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FakeTelegramServer" in out.stdout
    assert "replies arrived in order: yes" in out.stdout


def test_an_echo_bot_behind_a_webhook_replies_in_order(impl):
    import http.client
    import json
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from fastdispatch.telegram import webhook_app

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    with FakeTelegramServer(exact_retry_after=True) as server:
        sender = TelegramSender(TOKEN, base_url=server.base_url)
        engine = Engine(impl.OutboundDispatcher(max_inflight=8, retry=RetryPolicy()))

        @engine.on(rules.on_command("echo"), block=True)
        def echo(ctx):
            ctx.reply_text(ctx.ext.get(rules.Command).args)

        server.inject("too_many", 2, retry_after=0.05)  # replies meet a 429: retried in order
        httpd = make_server("127.0.0.1", 0, webhook_app(engine, sender, secret_token="hook"),
                            server_class=Server, handler_class=Quiet)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", httpd.server_address[1], timeout=10)
            for i in range(30):
                chat = 7 + i % 3
                body = json.dumps({"update_id": 500 + i, "message": {
                    "message_id": i, "text": "/echo %d" % i,
                    "chat": {"id": chat, "type": "private"},
                    "from": {"id": chat, "first_name": "U"}}}).encode()
                conn.request("POST", "/", body=body, headers={
                    "Content-Type": "application/json",
                    "X-Telegram-Bot-Api-Secret-Token": "hook"})
                resp = conn.getresponse()
                resp.read()
                assert resp.status == 200
                conn.close()
            assert engine.shutdown(20)
        finally:
            httpd.shutdown()
            httpd.server_close()
        for k, chat in enumerate((7, 8, 9)):
            assert [m.text for m in server.messages(chat)] == [str(i) for i in range(k, 30, 3)]
