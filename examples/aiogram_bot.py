"""An aiogram 3 echo bot whose replies go out through fastdispatch.

``DispatcherMiddleware`` is a session request middleware: every reply is
sent in its chat's order, one at a time per chat, paced to Telegram's
limits, and a 429 pauses only the chat it names (aiogram alone has no
pacing and no retry).  aiogram runs each update's handler as a task of its
own and the order still holds.

    pip install 'fastdispatch[aiogram]'
    TELEGRAM_BOT_TOKEN=123456:ABC... python examples/aiogram_bot.py   # a real bot

``TELEGRAM_API_URL`` (e.g. ``http://127.0.0.1:8081``, a self-hosted Bot API
server) replaces ``https://api.telegram.org``.  SIGTERM or Ctrl-C stop it
without losing a reply: aiogram stops polling, the middleware's shutdown
hook waits for the handlers still running, and the replies they queued
are sent before the bot's session closes.

Without ``TELEGRAM_BOT_TOKEN`` it runs against a local ``FakeTelegramServer``
(127.0.0.1, no token needed): 20 simulated users send 5 messages each, one
of them is told by the server to wait 2 s (a 429), and the script exits 0
only if every reply arrived, in order, never two at once in a chat.
"""

import asyncio
import os
import sys

from aiogram import Bot, Dispatcher
from aiogram.types import Message

from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer

from fastdispatch import Pacing
from fastdispatch.integrations.aiogram import DispatcherMiddleware

router = Dispatcher()


@router.message()
async def echo(message: Message):
    await message.answer("echo: " + message.text)


def make_bot(token, api_url=None):
    if not api_url:
        return Bot(token)
    return Bot(token, session=AiohttpSession(api=TelegramAPIServer.from_base(api_url)))


async def serve(bot, middleware, until=None):
    bot.session.middleware(middleware)
    # Stopping: wait for the handlers still running, then (when the session
    # closes) the middleware sends what they queued.
    router.shutdown.register(middleware.ashutdown)
    if until is None:
        await router.start_polling(bot)          # until SIGTERM or Ctrl-C
        return
    polling = asyncio.ensure_future(router.start_polling(
        bot, handle_signals=False, polling_timeout=1))
    await until()
    await router.stop_polling()
    await polling


def run_local():
    from fastdispatch.testing import FakeTelegramServer

    users, messages = range(1, 21), 5
    with FakeTelegramServer(latency=(0.0, 0.02), arrival_jitter=(0.0, 0.02)) as server:
        server.inject("too_many", chat_id=7, retry_after=2)
        # Telegram's limits scaled down 20x, so the demo takes seconds.
        middleware = DispatcherMiddleware(pacing=Pacing.telegram(speedup=20))

        async def all_answered():
            for n in range(messages):
                for user in users:
                    server.push_message(user, "message %d" % n)
            for _ in range(1200):            # at most a minute
                if server.stats().get("sent", 0) >= len(users) * messages:
                    return
                await asyncio.sleep(0.05)

        async def main():
            await serve(make_bot("123:fake", server.base_url), middleware, until=all_answered)

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
        asyncio.run(serve(make_bot(token, os.environ.get("TELEGRAM_API_URL")),
                          DispatcherMiddleware()))
        sys.exit(0)
    sys.exit(run_local())
