"""A pyTelegramBotAPI (threaded ``TeleBot``) echo bot whose replies go out
through fastdispatch.

``DispatcherRequestSender`` is the library's ``apihelper.CUSTOM_REQUEST_SENDER``
hook: every request is sent in its chat's order, one at a time per chat,
paced to Telegram's limits, and a 429 pauses only the chat it names.
``TeleBot`` runs handlers on a pool of threads, so one chat's handlers may
run at once; its replies still go out one at a time, in the order they
were made.

    pip install 'fastdispatch[telebot]'
    TELEGRAM_BOT_TOKEN=123456:ABC... python examples/telebot_bot.py   # a real bot

``TELEGRAM_API_URL`` (e.g. ``http://127.0.0.1:8081``, a self-hosted Bot API
server) replaces ``https://api.telegram.org``.  ``run_polling`` stops it on
SIGTERM or Ctrl-C without losing a reply: the updates already fetched are
handled (TeleBot's own worker queue drained), their replies sent, and the
handled updates confirmed to Telegram before the process ends.

Without ``TELEGRAM_BOT_TOKEN`` it runs against a local ``FakeTelegramServer``
(127.0.0.1, no token needed): 20 simulated users send 5 messages each, one
of them is told by the server to wait 2 s (a 429), and the script exits 0
only if every user got 5 replies, never two at once in a chat.
"""

import os
import sys
import threading
import time

import telebot
from telebot import apihelper

from fastdispatch import Pacing
from fastdispatch.integrations.telebot import DispatcherRequestSender, run_polling


def build(token, sender):
    apihelper.CUSTOM_REQUEST_SENDER = sender                 # process-wide
    bot = telebot.TeleBot(token, num_threads=16)

    @bot.message_handler(func=lambda message: True)
    def echo(message):
        bot.send_message(message.chat.id, "echo: " + message.text)

    return bot


def run_local():
    from fastdispatch.testing import FakeTelegramServer

    users, messages = range(1, 21), 5
    with FakeTelegramServer(latency=(0.0, 0.02), arrival_jitter=(0.0, 0.02)) as server:
        server.inject("too_many", chat_id=7, retry_after=2)
        apihelper.API_URL = server.base_url + "/bot{0}/{1}"
        # Telegram's limits scaled down 20x, so the demo takes seconds.
        sender = DispatcherRequestSender(pacing=Pacing.telegram(speedup=20))
        bot = build("123:fake", sender)
        poller = threading.Thread(target=bot.infinity_polling, kwargs=dict(
            timeout=10, long_polling_timeout=1), daemon=True)
        poller.start()
        for n in range(messages):
            for user in users:
                server.push_message(user, "message %d" % n)
        for _ in range(1200):                # at most a minute
            if server.stats().get("sent", 0) >= len(users) * messages:
                break
            time.sleep(0.05)
        bot.stop_bot()
        poller.join(15)
        sender.close()
        wanted = sorted("echo: message %d" % n for n in range(messages))
        all_there = all(sorted(m.text for m in server.messages(u)) == wanted for u in users)
        one_at_a_time = set(server.max_in_flight().values()) == {1}
        print("%d replies to %d users; all there: %s; one at a time per chat: %s; "
              "429s met: %d" % (server.stats()["sent"], len(users), all_there,
                               one_at_a_time, server.stats().get("injected_too_many", 0)))
        return 0 if all_there and one_at_a_time else 1


if __name__ == "__main__":
    token = os.environ.get("TELEGRAM_BOT_TOKEN")
    if token:
        api_url = os.environ.get("TELEGRAM_API_URL")
        if api_url:
            apihelper.API_URL = api_url.rstrip("/") + "/bot{0}/{1}"
        sys.exit(0 if run_polling(build(token, DispatcherRequestSender())) else 1)
    sys.exit(run_local())
