"""A python-telegram-bot echo bot whose replies go out through fastdispatch.

``DispatcherRateLimiter`` is PTB's rate limiter: every reply is sent in its
chat's order, one at a time per chat, paced to Telegram's limits, and a 429
pauses only the chat it names.  PTB runs the handlers concurrently
(``concurrent_updates(True)``) and the order still holds.

    pip install 'fastdispatch[ptb]'
    TELEGRAM_BOT_TOKEN=123456:ABC... python examples/ptb_bot.py   # a real bot

``TELEGRAM_API_URL`` (e.g. ``http://127.0.0.1:8081``, a self-hosted Bot API
server) replaces ``https://api.telegram.org``.  SIGTERM or Ctrl-C stop it
without losing a reply: PTB stops polling, finishes the handlers running,
and the limiter sends what they queued before the process ends.

Without ``TELEGRAM_BOT_TOKEN`` it runs against a local ``FakeTelegramServer``
(127.0.0.1, no token needed): 20 simulated users send 5 messages each, one
of them is told by the server to wait 2 s (a 429), and the script exits 0
only if every reply arrived, in order, never two at once in a chat.
"""

import asyncio
import os
import sys

from telegram.ext import ApplicationBuilder, MessageHandler, filters

from fastdispatch import Pacing
from fastdispatch.integrations.ptb import DispatcherRateLimiter


async def echo(update, context):
    await context.bot.send_message(update.effective_chat.id, "echo: " + update.message.text)


def build(token, api_url=None, pacing=None):
    limiter = DispatcherRateLimiter() if pacing is None else DispatcherRateLimiter(pacing=pacing)
    builder = ApplicationBuilder().token(token).concurrent_updates(True).rate_limiter(limiter)
    if api_url:
        builder = (builder.base_url(api_url.rstrip("/") + "/bot")
                   .base_file_url(api_url.rstrip("/") + "/file/bot"))
    app = builder.build()
    app.add_handler(MessageHandler(filters.TEXT, echo))
    return app


def run_local():
    from fastdispatch.testing import FakeTelegramServer

    users, messages = range(1, 21), 5
    with FakeTelegramServer(latency=(0.0, 0.02), arrival_jitter=(0.0, 0.02)) as server:
        server.inject("too_many", chat_id=7, retry_after=2)
        # Telegram's limits scaled down 20x, so the demo takes seconds.
        app = build("123:fake", server.base_url, pacing=Pacing.telegram(speedup=20))

        async def main():
            async with app:              # initialize ... shutdown (the limiter's too)
                await app.start()
                await app.updater.start_polling(poll_interval=0.0, timeout=1)
                for n in range(messages):
                    for user in users:
                        server.push_message(user, "message %d" % n)
                for _ in range(1200):        # at most a minute
                    if server.stats().get("sent", 0) >= len(users) * messages:
                        break
                    await asyncio.sleep(0.05)
                await app.updater.stop()
                await app.stop()

        asyncio.run(main())
        wanted = ["echo: message %d" % n for n in range(messages)]
        in_order = all([m.text for m in server.messages(u)] == wanted for u in users)
        one_at_a_time = set(server.max_in_flight().values()) == {1}
        print("%d replies to %d users; in order: %s; one at a time per chat: %s; "
              "429s met: %d" % (server.stats()["sent"], len(users), in_order,
                               one_at_a_time, server.stats().get("injected_too_many", 0)))
        return 0 if in_order and one_at_a_time else 1


if __name__ == "__main__":
    token = os.environ.get("TELEGRAM_BOT_TOKEN")
    if token:
        build(token, os.environ.get("TELEGRAM_API_URL")).run_polling()
        sys.exit(0)
    sys.exit(run_local())
