"""run_polling with an outbox: a bot killed mid-backlog and restarted answers every update.

The bot (outbox_bot_process.py) polls a FakeTelegramServer whose answers
take 50 ms, so its replies pile up in the outbox.  It is killed with
SIGKILL once the server's record shows its offset confirmed updates whose
replies had not all been sent (they were only durable in the file).  It is restarted, and stopped with SIGTERM once every update is
answered.  The server's record shows every update answered (both replies),
each chat's replies in update order, and how many came twice.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from fastdispatch.testing import FakeTelegramServer

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL and SIGTERM: POSIX")

HERE = os.path.dirname(os.path.abspath(__file__))
BOT = os.path.join(HERE, "outbox_bot_process.py")


def _env():
    import fastdispatch
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.abspath(fastdispatch.__file__)))
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.01)


def test_polling_bot_killed_mid_backlog_answers_every_update(tmp_path):
    updates, chats = 150, 10
    db = str(tmp_path / "replies.db")
    with FakeTelegramServer(latency=0.05) as server:
        texts = {}
        for i in range(updates):
            chat = 1000 + i % chats
            server.push_message(chat, "u%d" % i)
            texts.setdefault(chat, []).append("u%d" % i)
        seen = {}

        def offset_ran_ahead():
            # The offset confirmed updates whose replies had not all
            # arrived: they lived only in the outbox's file.  Read from the
            # server's record, whatever the machine's speed.
            confirmed = updates - server.pending_updates()
            arrived = {m.text for m in server.all_messages()}
            answered = sum(all("u%d /%d" % (i, k) in arrived for k in range(2))
                           for i in range(updates))
            seen.update(confirmed=confirmed, answered=answered)
            return server.stats()["sent"] >= 30 and confirmed > answered

        first = subprocess.Popen([sys.executable, BOT, server.base_url, db], env=_env())
        try:
            _wait(offset_ran_ahead, 120, "updates confirmed ahead of their replies")
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
        at_kill = server.stats()["sent"]
        assert at_kill < 2 * updates, "the backlog was gone before the kill"
        assert seen["confirmed"] > seen["answered"]
        second = subprocess.Popen([sys.executable, BOT, server.base_url, db], env=_env())
        try:
            def answered():
                return all({m.text for m in server.messages(chat)} >=
                           {"%s /%d" % (t, k) for t in texts[chat] for k in range(2)}
                           for chat in texts)
            _wait(answered, 120, "every update to be answered")
        finally:
            second.send_signal(signal.SIGTERM)
            code = second.wait(timeout=60)
        assert code == 0
        duplicates = 0
        for chat, sent in texts.items():
            got = [m.text for m in server.messages(chat)]
            duplicates += len(got) - len(set(got))
            # First arrivals in update order: each update's two replies in
            # order, and updates in the order Telegram gave them.
            firsts = list(dict.fromkeys(got))
            assert firsts == ["%s /%d" % (t, k) for t in sent for k in range(2)]
        assert server.pending_updates() == 0  # every update confirmed
    # A repeat comes only from what the kill left not done: the outbox's
    # rows in flight, or an update whose replies were not all durable.
    assert duplicates <= 2 * 8 * chats + 2 * 100, duplicates


def test_run_webhook_with_an_outbox_answers_200_once_replies_are_durable(tmp_path):
    import socket
    import threading

    from fastdispatch import Engine, OutboundDispatcher
    from fastdispatch.outbox import Outbox
    from fastdispatch.telegram import TelegramSender, run_webhook

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with FakeTelegramServer(latency=0.01) as server:
        sender = TelegramSender("123:outbox", base_url=server.base_url)
        sending = OutboundDispatcher(max_inflight=2)
        outbox = Outbox(str(tmp_path / "replies.db"), sending, senders={"telegram": sender},
                        durability="normal")
        engine = Engine(OutboundDispatcher(max_inflight=8))
        stored = []

        @engine.on()
        def echo(ctx):
            stored.append(ctx.reply_text(ctx.event.text + " /0"))

        for i in range(30):
            server.push_message(1 + i % 3, "m%d" % i)
        stop = threading.Event()

        def drive():
            _wait(lambda: server.stats().get("webhook_delivered", 0) == 30, 60, "deliveries")
            stop.set()

        threading.Thread(target=drive, daemon=True).start()
        code = run_webhook(engine, sender, port=port, url_path="/hook",
                           webhook_url="http://127.0.0.1:%d/hook" % port, stop=stop,
                           handle_signals=False, outbox=outbox)
        assert code == 0
        # Each reply the engine made resolved with the outbox's ticket: it
        # was committed before its update was answered 200.
        assert {a.status for a in server.webhooks.attempts()} == {200}
        assert len(stored) == 30 and all(f.result().raw.id > 0 for f in stored)
        assert outbox.close(timeout=30)
        sending.shutdown(timeout=30)
        for chat in (1, 2, 3):
            assert [m.text for m in server.messages(chat)] == \
                ["m%d /0" % i for i in range(30) if 1 + i % 3 == chat]
