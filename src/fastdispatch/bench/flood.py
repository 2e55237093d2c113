"""The flood: what a bot built on a Telegram library meets when every chat
talks at once, through each plug-in and python-telegram-bot's own
``AIORateLimiter``, in one run.

    python -m fastdispatch bench flood [--speedup 10] [--only NAME] [--rounds 1]
    python bench/flood.py ...                           # the same, from the repository

The workload: 100 private chats x 30 messages and one group x 200, pushed
to a ``FakeTelegramServer`` with Telegram's limits ``--speedup`` times
faster (``telegram_limits``: 1 message per chat, 20 per group per 60 s,
30 bot-wide per 1 s, each window divided by the speedup) before the bot
starts; the bot answers every message with one reply.  The server runs in
a process of its own (its CPU is not taken from the bot's), holds each
request a random 0-10 ms before it counts it (network paths of different
lengths) and each answer 0-20 ms (the round trip), and answers a request
over a limit with 429 and Telegram's ``retry_after`` (whole seconds).
Each bot runs in a fresh process too, with its library's defaults and the
one line of its plug-in:

- ``ptb``: python-telegram-bot, ``concurrent_updates(True)``,
  ``.rate_limiter(DispatcherRateLimiter(pacing=Pacing.telegram(speedup=N)))``;
- ``ptb-aiorl``: the same bot with ``AIORateLimiter(overall_max_rate=30,
  overall_time_period=1/N, group_max_rate=20, group_time_period=60/N,
  max_retries=3)``, python-telegram-bot's own;
- ``aiogram``: aiogram 3, ``bot.session.middleware(DispatcherMiddleware(
  pacing=Pacing.telegram(speedup=N)))``;
- ``telebot``: pyTelegramBotAPI's threaded ``TeleBot``,
  ``apihelper.CUSTOM_REQUEST_SENDER = DispatcherRequestSender(
  pacing=Pacing.telegram(speedup=N))``.

Reported, from the server's record: 429s met, replies lost (never
recorded), duplicates (recorded twice), order violations (replies of a
chat recorded in another order than its handlers made them: each reply
that arrived after one its handler made later), the most requests of one
chat in flight at once, and the wall time (from the start of polling to
the last reply) against the least the limits allow (the group's: 200
messages at 20 per window need 9 windows after the first).
"""

import argparse
import collections
import json
import multiprocessing
import platform
import sys
import time
import urllib.request

__all__ = ["KINDS", "run_flood", "main"]

KINDS = ("ptb", "ptb-aiorl", "aiogram", "telebot")
PRIVATE_CHATS, PRIVATE_MESSAGES = 100, 30
GROUP, GROUP_MESSAGES = -1001000000001, 200
TOKEN = "123456:flood"


def plan(private_chats=PRIVATE_CHATS, private_messages=PRIVATE_MESSAGES,
         group_messages=GROUP_MESSAGES):
    """The messages users send, in the order they reach the bot: round after
    round, each private chat once and the group in between."""
    order = []
    group_left = group_messages
    for n in range(private_messages):
        rounds_left = private_messages - n
        share = -(-group_left // rounds_left)  # the group's messages spread over the rounds
        step = max(1, private_chats // max(1, share))
        g = 0
        for i in range(private_chats):
            order.append((1000 + i, "m%d" % n))
            if g < share and i % step == step - 1:
                order.append((GROUP, "m%d" % (group_messages - group_left)))
                group_left -= 1
                g += 1
        while g < share:
            order.append((GROUP, "m%d" % (group_messages - group_left)))
            group_left -= 1
            g += 1
    return order


def ideal_seconds(speedup, private_messages=PRIVATE_MESSAGES, group_messages=GROUP_MESSAGES,
                  total=None):
    """The least time the limits allow: the group's windows, a private
    chat's, or the bot-wide limit, whichever is longest."""
    if total is None:
        total = PRIVATE_CHATS * private_messages + group_messages
    group = (-(-group_messages // 20) - 1) * 60.0 / speedup
    private = (private_messages - 1) * 1.0 / speedup
    bot_wide = (-(-total // 30) - 1) * 1.0 / speedup
    return max(group, private, bot_wide)


# -- the server, in a process of its own ------------------------------------

def _serve(speedup, order, seed, pipe):
    from ..testing import FakeTelegramServer, telegram_limits

    with FakeTelegramServer(control=True, latency=(0.0, 0.02), arrival_jitter=(0.0, 0.01),
                            seed=seed, **telegram_limits(speedup)) as server:
        for chat, text in order:
            server.push_message(chat, text, user_id=7 if chat < 0 else None)
        pipe.send(server.base_url)
        pipe.recv()


def _control(base_url, action, **kwargs):
    request = urllib.request.Request(
        base_url + "/control/" + action, data=json.dumps(kwargs).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())["result"]


def _sent(base_url):
    return _control(base_url, "stats").get("sent", 0)


# -- the bots, each in a fresh process ---------------------------------------

def _pacing(speedup, margin):
    from .. import Pacing

    if margin is None:
        return Pacing.telegram(speedup=speedup)
    return Pacing.telegram(speedup=speedup, margin=margin)


class _Made:
    """What the handlers made: each chat's replies in the order they asked
    for them, and the requests that failed for good."""

    def __init__(self):
        self.by_chat = collections.defaultdict(list)
        self.failed = []

    def reply_text(self, chat, text):
        reply = "r:" + text
        self.by_chat[str(chat)].append(reply)
        return reply


def _wait_for_replies(base_url, total, made, deadline, sleep=time.sleep):
    while time.monotonic() < deadline:
        if _sent(base_url) + len(made.failed) >= total:
            return True
        sleep(0.05)
    return False


def _run_ptb(base_url, speedup, margin, total, deadline, aiorl):
    import asyncio

    from telegram.ext import AIORateLimiter, ApplicationBuilder, MessageHandler, filters

    from ..integrations.ptb import DispatcherRateLimiter

    made = _Made()
    if aiorl:
        limiter = AIORateLimiter(overall_max_rate=30, overall_time_period=1.0 / speedup,
                                 group_max_rate=20, group_time_period=60.0 / speedup,
                                 max_retries=3)
    else:
        limiter = DispatcherRateLimiter(pacing=_pacing(speedup, margin))

    async def reply(update, context):
        chat = update.effective_chat.id
        text = made.reply_text(chat, update.message.text)
        try:
            await context.bot.send_message(chat, text)
        except Exception as exc:  # noqa: BLE001 - counted; the run goes on
            made.failed.append((chat, text, type(exc).__name__))

    app = (ApplicationBuilder().token(TOKEN).base_url(base_url + "/bot")
           .concurrent_updates(True).rate_limiter(limiter).build())
    app.add_handler(MessageHandler(filters.TEXT, reply))

    async def main():
        async with app:
            await app.start()
            t0 = time.monotonic()
            await app.updater.start_polling(poll_interval=0.0, timeout=1)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, _wait_for_replies, base_url, total, made,
                                       deadline)
            await app.updater.stop()
            await app.stop()
            return t0

    return asyncio.run(main()), made


def _run_aiogram(base_url, speedup, margin, total, deadline):
    import asyncio

    from aiogram import Bot, Dispatcher
    from aiogram.client.session.aiohttp import AiohttpSession
    from aiogram.client.telegram import TelegramAPIServer

    from ..integrations.aiogram import DispatcherMiddleware

    made = _Made()
    dp = Dispatcher()

    @dp.message()
    async def reply(message):
        text = made.reply_text(message.chat.id, message.text)
        try:
            await message.answer(text)
        except Exception as exc:  # noqa: BLE001 - counted; the run goes on
            made.failed.append((message.chat.id, text, type(exc).__name__))

    async def main():
        bot = Bot(TOKEN, session=AiohttpSession(api=TelegramAPIServer.from_base(base_url)))
        bot.session.middleware(DispatcherMiddleware(pacing=_pacing(speedup, margin)))
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        polling = asyncio.ensure_future(dp.start_polling(bot, handle_signals=False,
                                                         polling_timeout=1))
        await loop.run_in_executor(None, _wait_for_replies, base_url, total, made, deadline)
        await dp.stop_polling()
        await polling
        return t0

    return asyncio.run(main()), made


def _run_telebot(base_url, speedup, margin, total, deadline):
    import threading

    import telebot
    from telebot import apihelper

    from ..integrations.telebot import DispatcherRequestSender

    made = _Made()
    apihelper.API_URL = base_url + "/bot{0}/{1}"
    sender = apihelper.CUSTOM_REQUEST_SENDER = DispatcherRequestSender(
        pacing=_pacing(speedup, margin))
    bot = telebot.TeleBot(TOKEN)

    @bot.message_handler(func=lambda message: True)
    def reply(message):
        text = made.reply_text(message.chat.id, message.text)
        try:
            bot.send_message(message.chat.id, text)
        except Exception as exc:  # noqa: BLE001 - counted; the run goes on
            made.failed.append((message.chat.id, text, type(exc).__name__))

    t0 = time.monotonic()
    polling = threading.Thread(target=bot.polling,
                               kwargs=dict(non_stop=True, interval=0, timeout=1))
    polling.start()
    _wait_for_replies(base_url, total, made, deadline)
    bot.stop_polling()
    polling.join(30)
    sender.close()
    return t0, made


def _bot_process(kind, base_url, speedup, margin, total, timeout, pipe):
    deadline = time.monotonic() + timeout
    if kind in ("ptb", "ptb-aiorl"):
        t0, made = _run_ptb(base_url, speedup, margin, total, deadline,
                            aiorl=kind == "ptb-aiorl")
    elif kind == "aiogram":
        t0, made = _run_aiogram(base_url, speedup, margin, total, deadline)
    else:
        t0, made = _run_telebot(base_url, speedup, margin, total, deadline)
    pipe.send({"t0": t0, "made": dict(made.by_chat), "failed": len(made.failed),
               "errors": sorted(collections.Counter(e[2] for e in made.failed).items())})


# -- one run ------------------------------------------------------------------

def _order_violations(arrived, made):
    """Replies recorded after one that their handlers made later."""
    rank = {text: i for i, text in enumerate(made)}
    late, highest = 0, -1
    for text in arrived:
        r = rank.get(text, -1)
        if r < highest:
            late += 1
        highest = max(highest, r)
    return late


def run_flood(kind, speedup=10.0, seed=0, order=None, timeout=None, margin=None):
    """One bot through the flood; a dict of the figures above."""
    if order is None:
        order = plan()
    total = len(order)
    group_messages = sum(1 for chat, _ in order if chat < 0)
    ideal = ideal_seconds(speedup, group_messages=group_messages, total=total,
                          private_messages=max(collections.Counter(
                              c for c, _ in order if c > 0).values() or [1]))
    if timeout is None:
        timeout = 3 * ideal + 30
    ctx = multiprocessing.get_context("spawn")
    server_pipe, child = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(speedup, order, seed, child), daemon=True)
    server.start()
    try:
        base_url = server_pipe.recv()
        bot_pipe, child = ctx.Pipe()
        bot = ctx.Process(target=_bot_process,
                          args=(kind, base_url, speedup, margin, total, timeout, child), daemon=True)
        bot.start()
        end = time.monotonic() + timeout + 120
        while not bot_pipe.poll(0.5):
            if not bot.is_alive() or time.monotonic() > end:
                bot.kill()
                raise RuntimeError("the %s bot did not finish (exit code %s)"
                                   % (kind, bot.exitcode))
        result = bot_pipe.recv()
        bot.join(30)
        arrived = _control(base_url, "all_messages")
        stats = _control(base_url, "stats")
        peaks = _control(base_url, "max_in_flight")
    finally:
        server_pipe.send("stop")
        server.join(30)
    by_chat = collections.defaultdict(list)
    for message in arrived:
        by_chat[message["chat_id"]].append(message["text"])
    wanted = collections.Counter((str(chat), "r:" + text) for chat, text in order)
    got = collections.Counter((m["chat_id"], m["text"]) for m in arrived)
    last = max((m["at"] for m in arrived), default=result["t0"])
    group = [m["at"] - result["t0"] for m in arrived if m["chat_id"] == str(GROUP)]
    private = [m["at"] - result["t0"] for m in arrived if m["chat_id"] != str(GROUP)]
    return {
        "kind": kind if margin is None else "%s (margin %g)" % (kind, margin),
        "429s": stats.get("status_429", 0),
        "429s by limit": {limit: stats.get("too_many_" + limit, 0)
                          for limit in ("chat", "group", "global")},
        "lost": sum((wanted - got).values()),
        "duplicates": sum((got - wanted).values()),
        "order violations": sum(_order_violations(by_chat[chat], made)
                                for chat, made in result["made"].items()),
        "most in flight": max(peaks.values(), default=0),
        "wall": last - result["t0"],
        "ideal": ideal,
        "group first, last": (min(group, default=0.0), max(group, default=0.0)),
        "private last": max(private, default=0.0),
        "group arrivals": sorted(group),
        "errors": result["errors"],
    }


def format_row(r):
    return ("%-10s 429s %4d %s  lost %4d  duplicates %3d  order violations %4d  in flight %d  "
            "wall %5.1f s / ideal %4.1f s = %.2fx%s"
            % (r["kind"], r["429s"], "(%s)" % ", ".join(
                "%s %d" % item for item in r["429s by limit"].items()), r["lost"], r["duplicates"], r["order violations"],
               r["most in flight"], r["wall"], r["ideal"], r["wall"] / r["ideal"],
               ("  errors: %s" % dict(r["errors"])) if r["errors"] else "")
            + "  (group %.1f-%.1f s, privates done %.1f s)" % (
                r["group first, last"] + (r["private last"],)))


def main(argv=None):
    """``python -m fastdispatch bench flood``: see the module's docstring."""
    parser = argparse.ArgumentParser(prog="python -m fastdispatch bench flood",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--speedup", type=float, default=10.0,
                        help="Telegram's limits this many times faster (default 10)")
    parser.add_argument("--only", action="append", choices=KINDS,
                        help="run only this bot (repeatable)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each bot")
    parser.add_argument("--margin", type=float, default=None,
                        help="Pacing.telegram(margin=...) of the plug-ins (default: its own)")
    args = parser.parse_args(argv)
    print("python %s on %s; 100 private chats x 30 + a group x 200, Telegram's limits "
          "x%g; about %.0f s a bot" % (platform.python_version(), platform.machine(),
                                       args.speedup, ideal_seconds(args.speedup) + 5))
    for r in range(args.rounds):
        for kind in args.only or KINDS:
            print(format_row(run_flood(kind, args.speedup, seed=r, margin=args.margin)))
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
