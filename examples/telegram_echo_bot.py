"""A Telegram echo bot: long polling in, paced and retried replies out.

Run against the real Telegram Bot API (needs ``pip install 'fastdispatch[telegram]'``):

    TELEGRAM_BOT_TOKEN=123456:ABC... python examples/telegram_echo_bot.py

It answers ``/start``, ``/echo <text>`` and anything containing "hello" until
SIGTERM or Ctrl-C (``run_polling``): then it stops polling, lets the queued
replies go out (up to 30 s), confirms to Telegram the updates it answered
and exits 0, or 1 if a reply had to be dropped (an update whose replies did
not all go out is left to Telegram, which delivers it again to the next
run).  Without ``TELEGRAM_BOT_TOKEN`` the same bot runs against a local
``FakeTelegramServer`` (on 127.0.0.1, with Telegram's real limits): three
simulated users write to it, one of them in a group, the script prints the
conversation as the server recorded it and exits with status 0 only if every
reply arrived, in order.  ``telegram_webhook_bot.py`` is the same bot behind
a webhook.
"""

import logging
import os
import sys
import threading
import time

from fastdispatch import Engine, OutboundDispatcher, Pacing, RetryPolicy, rules
from fastdispatch.telegram import TelegramSender, run_polling


def build_bot(engine):
    @engine.on(rules.on_command("start"), block=True)
    def start(ctx):
        ctx.reply_text("Hi %s! Send /echo <text>." % (ctx.event.sender.display_name or "there"))

    @engine.on(rules.on_command("echo"), block=True)
    def echo(ctx):
        ctx.try_send_typing()  # best effort: "typing..." while the reply is queued
        ctx.reply_text(ctx.ext.get(rules.Command).args or "(nothing to echo)")

    @engine.on(rules.on_keyword("hello"), block=True)
    def hello(ctx):
        ctx.reply_text("hello, %s!" % (ctx.event.sender.display_name or "you"))


def make_engine():
    # Telegram's limits (1/s per chat, 20/min per group, 30/s bot-wide);
    # 429s wait out their retry_after, network errors and 5xx are retried.
    dispatcher = OutboundDispatcher(max_inflight=64, pacing=Pacing.telegram(),
                                    retry=RetryPolicy())
    engine = Engine(dispatcher)
    build_bot(engine)
    return engine


def run_real(token):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    sender = TelegramSender(token)
    me = sender.get_me()
    print("running as @%s; SIGTERM or Ctrl-C to stop" % me.get("username"))
    try:
        return run_polling(make_engine(), sender, poll_timeout=30, drain_timeout=30)
    finally:
        sender.close()


def run_fake():
    from fastdispatch.testing import FakeTelegramServer, telegram_limits

    conversation = [
        (101, "/start", "Ann", "Hi Ann! Send /echo <text>."),
        (101, "/echo one", "Ann", "one"),
        (202, "hello bot", "Bob", "hello, Bob!"),
        (101, "/echo two", "Ann", "two"),
        (-300, "/echo to the group", "Cid", "to the group"),
        (202, "/echo three", "Bob", "three"),
        (-300, "hello everyone", "Cid", "hello, Cid!"),
    ]
    with FakeTelegramServer(**telegram_limits()) as server:
        print("no TELEGRAM_BOT_TOKEN: running against a FakeTelegramServer at %s"
              % server.base_url)
        sender = TelegramSender("123456:fake", base_url=server.base_url)
        engine = make_engine()
        for chat, text, name, _ in conversation:
            server.push_message(chat, text, user_id=abs(chat) + 1, first_name=name)
        # run_polling returns when `done` is set (or on SIGTERM/Ctrl-C).
        done = threading.Event()

        def watch():
            deadline = time.monotonic() + 30
            while len(server.all_messages()) < len(conversation) and time.monotonic() < deadline:
                time.sleep(0.05)
            done.set()

        threading.Thread(target=watch, daemon=True).start()
        status = run_polling(engine, sender, poll_timeout=1, drain_timeout=30, stop=done)
        ok = True
        for chat in (101, 202, -300):
            expected = [reply for c, _, _, reply in conversation if c == chat]
            got = server.messages(chat)
            print("chat %5d: %s" % (chat, " | ".join(m.text for m in got)))
            ok = ok and [m.text for m in got] == expected
        print("typing indicators sent: %d" % len(server.chat_actions))
        print("replies arrived in order: %s" % ("yes" if ok else "NO"))
        return 0 if ok and status == 0 else 1


def main():
    token = os.environ.get("TELEGRAM_BOT_TOKEN")
    return run_real(token) if token else run_fake()


if __name__ == "__main__":
    sys.exit(main())
