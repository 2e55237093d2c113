"""python-telegram-bot: fastdispatch's DispatcherRateLimiter against PTB's own
AIORateLimiter, on the same local server and the same workload.

    bash tools/dev.sh test --co -q     # the test extras: PTB, and aiolimiter for AIORateLimiter
    .venv/bin/python bench/ptb_rate_limiters.py [--chats 200] [--replies 5] [--speedup 5] [--rounds 2]

A ``FakeTelegramServer`` in a process of its own (so that its CPU is not
taken from the bot's; the bot reads its record through the control
endpoint) enforces Telegram's limits scaled
down ``--speedup`` times (``telegram_limits``: 1 message per chat per
1/speedup s, 30 bot-wide per 1/speedup s), answers 429 with the exact
``retry_after``, and holds each request a random 0-10 ms before processing
it and 0-20 ms before answering (its windows are 10 ms shorter: the
tolerance a server needs for that jitter).  A PTB ``Application`` with
``concurrent_updates(True)`` answers every message with one reply; the
server is given ``--replies`` messages for each of ``--chats`` chats, and
tells one chat to wait 3 s (an injected 429 on its first reply).  Each
limiter is configured for the same scaled limits (AIORateLimiter: the
bot-wide rate, ``max_retries=10``; DispatcherRateLimiter: ``Pacing`` with
the chat and bot-wide limits, ``RetryPolicy(max_attempts=10)``).

Reported per limiter, from what the server recorded:

- delivered during the 3 s: replies of the other chats that arrived while
  the one chat waited (from the moment its 429 reached the bot);
- order violations: chats whose replies arrived in another order than the
  handlers made them, and chats that had two requests in flight at once;
- 429s met: the server's answers 429 (the injected one included);
- wall time / the least time the limits allow (the bot-wide limit for all
  replies, or the waiting chat's 3 s and its remaining replies);
- replies lost (a request that failed for good).

The limiters run in turn, twice each, in alternating order; each run is
printed.  The figures in docs/asyncio.md come from this script.
"""

import argparse
import asyncio
import collections
import json
import multiprocessing
import platform
import sys
import time
import urllib.request

WAIT = 3


def _serve(kwargs, pipe):
    # The child process: a server until the parent says stop.
    from fastdispatch.testing import FakeTelegramServer

    with FakeTelegramServer(control=True, **kwargs) as server:
        pipe.send(server.base_url)
        pipe.recv()


class RemoteServer:
    """A FakeTelegramServer in a child process, read over its control endpoint."""

    def __init__(self, **kwargs):
        self.pipe, child = multiprocessing.Pipe()
        self.process = multiprocessing.Process(target=_serve, args=(kwargs, child), daemon=True)
        self.process.start()
        self.base_url = self.pipe.recv()

    def control(self, action, **kwargs):
        request = urllib.request.Request(
            self.base_url + "/control/" + action, data=json.dumps(kwargs).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())["result"]

    def close(self):
        self.pipe.send("stop")
        self.process.join(30)


def run_once(kind, chats, replies, speedup, seed):
    import telegram.error
    from telegram.ext import AIORateLimiter, ApplicationBuilder, MessageHandler, filters

    from fastdispatch import Pacing, RateLimit, RetryPolicy
    from fastdispatch.integrations.ptb import DispatcherRateLimiter
    from fastdispatch.testing import telegram_limits

    limits = telegram_limits(speedup)
    per = 1.0 / speedup
    flood_at = []  # when the injected 429 reached the bot
    made = collections.defaultdict(list)  # chat -> replies in the order handlers made them
    lost = []
    waiting = 10 ** 6

    def watching(base):
        class Watching(base):
            async def process_request(self, callback, args, kwargs, endpoint, data,
                                      rate_limit_args):
                async def watched(*a, **k):
                    try:
                        return await callback(*a, **k)
                    except telegram.error.RetryAfter:
                        if data.get("chat_id") == waiting and not flood_at:
                            flood_at.append(time.monotonic())
                        raise
                return await super().process_request(watched, args, kwargs, endpoint, data,
                                                     rate_limit_args)
        return Watching

    if kind == "AIORateLimiter":
        limiter = watching(AIORateLimiter)(overall_max_rate=30, overall_time_period=per,
                                           max_retries=10)
    else:
        limiter = watching(DispatcherRateLimiter)(
            pacing=Pacing(global_limit=RateLimit(30, per=per),
                          chat_limit=RateLimit(1, per=per)),
            retry=RetryPolicy(max_attempts=10))

    async def reply(update, context):
        chat, text = update.effective_chat.id, "r:" + update.message.text
        made[chat].append(text)
        try:
            await context.bot.send_message(chat, text)
        except Exception as exc:  # noqa: BLE001 - counted, the run goes on
            lost.append((chat, text, type(exc).__name__))

    all_chats = [waiting] + [waiting + 1 + i for i in range(chats - 1)]
    total = chats * replies
    server = RemoteServer(exact_retry_after=True, latency=(0.0, 0.02),
                          arrival_jitter=(0.0, 0.01), tolerance=0.01, seed=seed,
                          chat_limit=limits["chat_limit"], global_limit=limits["global_limit"])
    try:
        server.control("inject", fault="too_many", chat_id=waiting, retry_after=WAIT)
        app = (ApplicationBuilder().token("123:bench").base_url(server.base_url + "/bot")
               .concurrent_updates(True).connection_pool_size(256).rate_limiter(limiter)
               .build())
        app.add_handler(MessageHandler(filters.TEXT, reply))

        async def main():
            async with app:
                await app.start()
                loop = asyncio.get_running_loop()
                for n in range(replies):
                    for chat in all_chats:
                        server.control("push_message", chat_id=chat, text="m%d" % n)
                t0 = time.monotonic()
                await app.updater.start_polling(poll_interval=0.0, timeout=1)
                deadline = t0 + 120
                while time.monotonic() < deadline:
                    sent = (await loop.run_in_executor(None, server.control, "stats"))["sent"]
                    if sent + len(lost) >= total:
                        break
                    await asyncio.sleep(0.02)
                took = time.monotonic() - t0
                await app.updater.stop()
                await app.stop()
                return t0, took

        t0, took = asyncio.run(main())
        stats = server.control("stats")
        arrived = server.control("all_messages")   # time.monotonic(): one clock per machine
        flood = flood_at[0] if flood_at else t0
        during = sum(1 for m in arrived
                     if m["chat_id"] != str(waiting) and flood < m["at"] < flood + WAIT)
        by_chat = collections.defaultdict(list)
        for m in arrived:
            by_chat[m["chat_id"]].append(m["text"])
        disorder = sum(1 for chat in all_chats if by_chat[str(chat)] != made[chat])
        overlap = sum(1 for n in server.control("max_in_flight").values() if n > 1)
        minimum = max((total - 30) * per / 30, WAIT + (replies - 1) * per)
        return {"delivered during the 3 s": during, "chats out of order": disorder,
                "chats with 2 in flight": overlap, "429s met": stats.get("status_429", 0),
                "wall / minimum": took / minimum, "lost": len(lost),
                "delivered": stats.get("sent", 0)}
    finally:
        server.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, default=200)
    parser.add_argument("--replies", type=int, default=5)
    parser.add_argument("--speedup", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    print("python %s on %s; %d chats x %d replies, limits / %g, one 429 of %d s"
          % (platform.python_version(), platform.machine(), args.chats, args.replies,
             args.speedup, WAIT))
    kinds = ["DispatcherRateLimiter", "AIORateLimiter"]
    for r in range(args.rounds):
        for kind in (kinds if r % 2 == 0 else kinds[::-1]):
            result = run_once(kind, args.chats, args.replies, args.speedup, seed=r)
            print("%-22s %s" % (kind, ", ".join(
                "%s: %s" % (k, ("%.2f" % v) if isinstance(v, float) else v)
                for k, v in result.items())))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
