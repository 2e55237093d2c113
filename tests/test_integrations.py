"""The plug-ins of ``fastdispatch.integrations`` with the real
libraries (python-telegram-bot, aiogram, pyTelegramBotAPI, from the
``test`` extra) pointed at ``FakeTelegramServer`` on 127.0.0.1.

Every check reads what the server recorded, never the wall clock: the
order in which each chat's messages arrived (``messages``), how many
requests of one chat it was handling at once (``max_in_flight``), and the
arrival times against the moment the dispatcher decided a chat must wait
(a lower bound, which a loaded machine cannot break).  The server holds
each request a random time before processing it (``arrival_jitter``), so
sends that were not kept apart would be recorded shuffled and overlapping
(``test_without_a_plugin_the_server_sees_a_chats_sends_overlap`` shows the
check catching it).

The bots are real ones where order matters: the library's own polling and
concurrent handlers (PTB ``concurrent_updates(True)``, aiogram's handlers
as tasks, the threaded ``TeleBot``'s worker pool), replying to updates
pushed to the server.  The order "the bot made" the requests in is recorded
where they enter the plug-in, which is where it must be kept.  Tests that
give the plug-in a dispatcher run on both cores (the ``make_dispatcher``
fixture).

A library that the test extra does not install on this Python is skipped;
one that should be installed and is not fails.
"""

import asyncio
import collections
import concurrent.futures
import datetime
import os
import threading
import time
import warnings

import pytest

from fastdispatch import DispatcherHooks, Pacing, RateLimit, RetryAfter, RetryPolicy
from fastdispatch.testing import FakeTelegramServer

from helpers import LIBRARIES, library, wait_until

TOKEN = "7012345678:AAF-fake_token_for_the_suite_0123456789"

# The ordering test: 500 replies from concurrent handlers (sized for CI on two
# cores); FASTDISPATCH_SOAK=1 runs it at 300 chats x 10 replies.
CHATS, REPLIES = (300, 10) if os.environ.get("FASTDISPATCH_SOAK", "") not in ("", "0") \
    else (100, 5)
WAIT = 3                     # the retry_after of the one chat told to wait


def wait_for_all(count, target, stall=120.0, what="the work"):
    """Wait until ``count()`` reaches ``target``; fail once it has not grown
    for ``stall`` seconds.  A guard against a hang that a slow machine does
    not trip: a run that keeps moving is waited for however long it takes.
    """
    seen, moved = count(), time.monotonic()
    while seen < target:
        time.sleep(0.05)
        now = count()
        if now != seen:
            seen, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall:
            raise AssertionError("%s: %d of %d, none more in %g s"
                                 % (what, seen, target, stall))


class LoopThread:
    """An event loop on a thread of its own, for the asyncio libraries."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def submit(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro, timeout=30):
        return self.submit(coro).result(timeout)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


# -- one client per library: a bot object with the plug-in installed --------------

class _LoopClient:
    """What the two asyncio clients share: their bot (``self.bot``) runs on ``self.lt``."""

    def get_me_later(self):
        return self.lt.submit(self.bot.get_me())

    def get_me(self):
        return self.get_me_later().result(30)

    def get_updates(self):
        return self.lt.run(self.bot.get_updates(timeout=0))


class PTBClient(_LoopClient):
    name = "ptb"

    def __init__(self, server, dispatcher=None, limiter=None):
        from telegram.ext import ExtBot
        from telegram.request import HTTPXRequest

        from fastdispatch.integrations.ptb import DispatcherRateLimiter

        import telegram.error

        self.errors = telegram.error
        self.limiter = limiter or DispatcherRateLimiter(dispatcher)
        self.lt = LoopThread()
        self.bot = ExtBot(TOKEN, base_url=server.base_url + "/bot",
                          request=HTTPXRequest(connection_pool_size=128),
                          get_updates_request=HTTPXRequest(), rate_limiter=self.limiter)
        self.lt.run(self.bot.initialize())

    def close(self):
        try:
            self.lt.run(self.bot.shutdown())
        finally:
            self.lt.close()

    def send_later(self, chat, text):
        return self.lt.submit(self.bot.send_message(chat, text))

    def flood_error(self):
        return self.errors.RetryAfter

    def bad_request(self):
        return self.errors.BadRequest


class AiogramClient(_LoopClient):
    name = "aiogram"

    def __init__(self, server, dispatcher):
        import aiogram
        import aiogram.exceptions
        from aiogram.client.session.aiohttp import AiohttpSession
        from aiogram.client.telegram import TelegramAPIServer

        from fastdispatch.integrations.aiogram import DispatcherMiddleware

        self.errors = aiogram.exceptions
        self.lt = LoopThread()

        async def make():
            bot = aiogram.Bot(TOKEN, session=AiohttpSession(
                api=TelegramAPIServer.from_base(server.base_url)))
            bot.session.middleware(DispatcherMiddleware(dispatcher))
            return bot
        self.bot = self.lt.run(make())

    def close(self):
        try:
            self.lt.run(self.bot.session.close())
        finally:
            self.lt.close()

    def send_later(self, chat, text):
        return self.lt.submit(self.bot.send_message(chat_id=chat, text=text))

    def flood_error(self):
        return self.errors.TelegramRetryAfter

    def bad_request(self):
        return self.errors.TelegramBadRequest


class TelebotClient:
    name = "telebot"

    def __init__(self, server, dispatcher, sender=None):
        import telebot
        from telebot import apihelper

        from fastdispatch.integrations.telebot import DispatcherRequestSender

        self.apihelper = apihelper
        self.saved = apihelper.API_URL, apihelper.CUSTOM_REQUEST_SENDER
        apihelper.API_URL = server.base_url + "/bot{0}/{1}"
        apihelper.CUSTOM_REQUEST_SENDER = sender or DispatcherRequestSender(dispatcher)
        self.bot = telebot.TeleBot(TOKEN, threaded=False)
        self.pool = concurrent.futures.ThreadPoolExecutor(4)

    def close(self):
        self.pool.shutdown()
        self.apihelper.API_URL, self.apihelper.CUSTOM_REQUEST_SENDER = self.saved

    def send_later(self, chat, text):
        return self.pool.submit(self.bot.send_message, chat, text)

    def get_me_later(self):
        return self.pool.submit(self.bot.get_me)

    def get_me(self):
        return self.get_me_later().result(30)

    def get_updates(self):
        return self.bot.get_updates(timeout=5, long_polling_timeout=0)

    def flood_error(self):
        return self.apihelper.ApiTelegramException

    def bad_request(self):
        return self.apihelper.ApiTelegramException


CLIENTS = {c.name: c for c in (PTBClient, AiogramClient, TelebotClient)}


@pytest.fixture(params=list(LIBRARIES))
def lib(request):
    library(request.param)
    return request.param


@pytest.fixture
def client(lib):
    """``client(server, dispatcher)``: the library's bot with the plug-in, closed after."""
    made = []

    def make(server, dispatcher):
        c = CLIENTS[lib](server, dispatcher)
        made.append(c)
        return c

    yield make
    for c in reversed(made):     # the last one restores what the first one found
        c.close()


# -- real bots: the library's polling and concurrent handlers ---------------------

class Made:
    """The order the bot made its sendMessage requests in, per chat, as
    they entered the plug-in."""

    def __init__(self):
        self.lock = threading.Lock()  # guards texts (telebot's handler threads)
        self.texts = collections.defaultdict(list)

    def add(self, chat, text):
        with self.lock:
            self.texts[str(chat)].append(text)


def ptb_bot(server, dispatcher, made, stop):
    """Run a PTB Application (concurrent handlers) until ``stop`` is set."""
    from telegram.ext import ApplicationBuilder, MessageHandler, filters

    from fastdispatch.integrations.ptb import DispatcherRateLimiter

    class Recording(DispatcherRateLimiter):
        async def process_request(self, callback, args, kwargs, endpoint, data,
                                  rate_limit_args):
            if endpoint == "sendMessage":
                made.add(data["chat_id"], data["text"])
            return await super().process_request(callback, args, kwargs, endpoint, data,
                                                 rate_limit_args)

    limiter = Recording(dispatcher) if dispatcher is not None else None

    async def reply(update, context):
        await context.bot.send_message(update.effective_chat.id, "r:" + update.message.text)

    async def main():
        # The timeouts: a reply waiting for one of the 64 connections is
        # dropped by PTB after 1 s by default, and one whose answer takes 5 s
        # fails, which a loaded machine reaches (bounds on a hang here, not
        # speeds).
        builder = (ApplicationBuilder().token(TOKEN).base_url(server.base_url + "/bot")
                   .concurrent_updates(True).connection_pool_size(64).pool_timeout(60)
                   .connect_timeout(60).read_timeout(60).write_timeout(60))
        if limiter is not None:
            builder = builder.rate_limiter(limiter)
        app = builder.build()
        app.add_handler(MessageHandler(filters.TEXT, reply))
        async with app:
            await app.start()
            await app.updater.start_polling(poll_interval=0.0, timeout=1)
            while not stop.is_set():
                await asyncio.sleep(0.02)
            await app.updater.stop()
            await app.stop()

    asyncio.run(main())


def aiogram_bot(server, dispatcher, made, stop):
    """Run an aiogram Dispatcher (handlers as tasks) until ``stop`` is set."""
    import aiogram
    from aiogram.client.session.aiohttp import AiohttpSession
    from aiogram.client.telegram import TelegramAPIServer

    from fastdispatch.integrations.aiogram import DispatcherMiddleware

    async def recording(make_request, bot, method):
        if method.__api_method__ == "sendMessage":
            made.add(method.chat_id, method.text)
        return await make_request(bot, method)

    async def main():
        bot = aiogram.Bot(TOKEN, session=AiohttpSession(
            api=TelegramAPIServer.from_base(server.base_url)))
        bot.session.middleware(recording)   # before: sees each request once
        bot.session.middleware(DispatcherMiddleware(dispatcher))
        dp = aiogram.Dispatcher()

        @dp.message()
        async def reply(message):
            await message.answer("r:" + message.text)

        async def stopper():
            while not stop.is_set():
                await asyncio.sleep(0.02)
            await dp.stop_polling()

        stopping = asyncio.ensure_future(stopper())
        try:
            await dp.start_polling(bot, handle_signals=False, polling_timeout=1,
                                   close_bot_session=True)
        finally:
            await stopping

    asyncio.run(main())


def telebot_bot(server, dispatcher, made, stop):
    """Run a threaded TeleBot (a pool of handler threads) until ``stop`` is set."""
    import telebot
    from telebot import apihelper

    from fastdispatch.integrations.telebot import DispatcherRequestSender

    sender = DispatcherRequestSender(dispatcher)
    order = threading.Lock()  # makes "entered the plug-in" and "queued" one step

    def recording(method, url, **kwargs):
        params = kwargs.get("params") or {}
        if url.endswith("/getUpdates"):           # a long poll: not under the lock
            return sender(method, url, **kwargs)
        with order:
            if url.endswith("/sendMessage"):
                made.add(params["chat_id"], params["text"])
            future = sender.submit(method, url, **kwargs)
        return future.result()

    saved = apihelper.API_URL, apihelper.CUSTOM_REQUEST_SENDER
    apihelper.API_URL = server.base_url + "/bot{0}/{1}"
    apihelper.CUSTOM_REQUEST_SENDER = recording
    try:
        bot = telebot.TeleBot(TOKEN, threaded=True, num_threads=16)

        @bot.message_handler(func=lambda m: True)
        def reply(message):
            bot.send_message(message.chat.id, "r:" + message.text)

        poller = threading.Thread(target=bot.infinity_polling, kwargs=dict(
            timeout=10, long_polling_timeout=1, interval=0), daemon=True)
        poller.start()
        stop.wait()
        bot.stop_bot()
        poller.join(15)
    finally:
        apihelper.API_URL, apihelper.CUSTOM_REQUEST_SENDER = saved


BOTS = {"ptb": ptb_bot, "aiogram": aiogram_bot, "telebot": telebot_bot}


class RunningBot:
    """A bot of the library on a thread of its own, polling the server."""

    def __init__(self, lib, server, dispatcher):
        self.dispatcher = dispatcher
        self.made = Made()
        self.stop = threading.Event()
        self.error = []

        def run():
            try:
                BOTS[lib](server, dispatcher, self.made, self.stop)
            except BaseException as exc:  # reported by the test, not lost
                self.error.append(exc)
        self.thread = threading.Thread(target=run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc_info):
        # The server has recorded the last reply; its answer may still be on
        # its way to the bot: stop once the dispatcher has nothing running
        # (stopping closes the library's connections).
        d = self.dispatcher
        if d is not None and exc_info[0] is None:
            wait_until(lambda: d.stats().inflight == 0 and d.stats().active_chats == 0, 120,
                       "the last answers to reach the bot")
        self.stop.set()
        self.thread.join(120)
        assert not self.thread.is_alive(), "the bot did not stop"
        if self.error:
            raise self.error[0]


def texts_of(server, chat):
    return [m.text for m in server.messages(chat)]


# -- order and one at a time -------------------------------------------------------

@pytest.mark.stress
def test_each_chats_replies_arrive_in_the_order_made_and_never_two_at_once(
        lib, make_dispatcher):
    # No fixed bound on time: with every chat's reply in flight at once, a
    # send's time includes its wait for one of the library's connections,
    # and a loaded machine stretches the whole run past any such bound
    # (free-threaded 3.13 most: bench/notes/freethreading.md, "on a loaded machine").
    # No send_timeout, and the wait for the replies fails only when they
    # stop coming: a send that never ends still fails the test.
    library(lib)
    d = make_dispatcher(pacing=Pacing(chat_limit=RateLimit(1, per=0.01)),
                        retry=RetryPolicy(max_attempts=5), send_timeout=None)
    chats = [1000 + i for i in range(CHATS)]
    with FakeTelegramServer(latency=(0.0, 0.02), arrival_jitter=(0.0, 0.02),
                            seed=21) as server:
        with RunningBot(lib, server, d) as bot:
            for n in range(REPLIES):      # each chat's messages, chats interleaved
                for chat in chats:
                    server.push_message(chat, "m%d" % n)
            wait_for_all(lambda: server.stats()["sent"], CHATS * REPLIES, what="replies")
        for chat in chats:
            assert sorted(texts_of(server, chat)) == ["r:m%d" % n for n in range(REPLIES)]
            assert texts_of(server, chat) == bot.made.texts[str(chat)], chat
        peaks = server.max_in_flight()
        assert {peaks[str(chat)] for chat in chats} == {1}
        assert server.stats().get("too_many", 0) == 0


@pytest.mark.filterwarnings("ignore:Deprecated since version v22.2")
def test_under_the_servers_limits_every_429_is_retried_in_order(
        lib, make_dispatcher, record_property):
    # The server enforces the limits the dispatcher paces for (scaled down,
    # with a tolerance for the jitter it adds); what still meets a 429 (a
    # request that reached the server later than it was started) is sent
    # again, in order.  aiogram reads retry_after as Telegram types it, a
    # whole second; the others take the exact time.
    library(lib)
    d = make_dispatcher(pacing=Pacing(chat_limit=RateLimit(1, per=0.05),
                                      global_limit=RateLimit(60, per=0.1)),
                        retry=RetryPolicy(max_attempts=10))
    chats = [3000 + i for i in range(50)]
    with FakeTelegramServer(chat_limit=(1, 0.05), global_limit=(60, 0.1), tolerance=0.01,
                            exact_retry_after=lib != "aiogram", latency=(0.0, 0.01),
                            arrival_jitter=(0.0, 0.005), seed=8) as server:
        with RunningBot(lib, server, d) as bot:
            for n in range(4):
                for chat in chats:
                    server.push_message(chat, "m%d" % n)
            wait_until(lambda: server.stats()["sent"] >= 4 * len(chats), 60, "every reply")
        for chat in chats:
            assert texts_of(server, chat) == bot.made.texts[str(chat)]
            assert sorted(texts_of(server, chat)) == ["r:m%d" % n for n in range(4)]
        assert set(server.max_in_flight().values()) == {1}
        met = server.stats().get("too_many", 0)
        assert d.stats().retried == met and d.stats().failed == 0
        record_property("429s met, of 200 replies", met)
        record_property("by limit", "chat %d, global %d" % (
            server.stats().get("too_many_chat", 0), server.stats().get("too_many_global", 0)))


def test_without_a_plugin_the_server_sees_a_chats_sends_overlap():
    # What the test above would catch: PTB's concurrent handlers with no
    # rate limiter send one chat's replies at once, and the server says so.
    library("ptb")
    with FakeTelegramServer(latency=(0.02, 0.05), arrival_jitter=(0.0, 0.02),
                            seed=3) as server:
        with RunningBot("ptb", server, None):
            for n in range(REPLIES):
                for chat in range(1, 21):
                    server.push_message(chat, "m%d" % n)
            wait_until(lambda: server.stats()["sent"] >= 20 * REPLIES, 60, "every reply")
        assert max(server.max_in_flight().values()) > 1


@pytest.mark.parametrize("name", ["ptb", "aiogram"])
def test_sends_in_flight_through_an_asyncio_plugin_hold_no_thread(name, make_dispatcher):
    # 100 chats' sends awaiting slow answers at once: running tasks of the
    # dispatcher (most of them at the same moment, unless the machine is so
    # loaded that the first answers are back before the last sends leave),
    # none of them on a thread of its own, at any moment.
    library(name)
    d = make_dispatcher(max_inflight=256)
    with FakeTelegramServer(latency=1.0) as server:
        c = CLIENTS[name](server, d)
        try:
            sends = [c.send_later(chat, "x") for chat in range(1, 101)]
            seen = []

            def sample():
                seen.append(d.stats())
                return all(f.done() for f in sends)
            wait_until(sample, 60, "every send to be answered")
            assert [f.result(30).text for f in sends] == ["x"] * 100
        finally:
            c.close()
    assert max(s.threads for s in seen) == 0
    assert max(s.inflight for s in seen) >= 20


# -- one chat told to wait ------------------------------------------------------------

# PTB's RetryAfter reads its own deprecated attribute when it is made.
@pytest.mark.filterwarnings("ignore:Deprecated since version v22.2")
def test_a_429_pauses_only_its_chat_which_resumes_in_order_after_the_wait(
        lib, make_dispatcher):
    library(lib)
    retries = []
    waiting = 4242
    d = make_dispatcher(
        pacing=Pacing(chat_limit=RateLimit(1, per=0.01)),
        hooks=DispatcherHooks(on_retry=lambda chat, attempt, delay, exc: retries.append(
            (time.monotonic(), chat, delay, exc))))
    others = [2000 + i for i in range(30)]
    with FakeTelegramServer(latency=(0.0, 0.01), arrival_jitter=(0.0, 0.01),
                            seed=4) as server:
        server.inject("too_many", chat_id=waiting, retry_after=WAIT)
        with RunningBot(lib, server, d) as bot:
            for n in range(3):
                server.push_message(waiting, "m%d" % n)
            wait_until(lambda: retries, 30, "the 429")
            for n in range(3):
                for chat in others:
                    server.push_message(chat, "m%d" % n)
            wait_until(lambda: server.stats()["sent"] >= 3 + 3 * len(others), 60,
                       "every reply")
    told_at, chat, delay, exc = retries[0]
    assert len(retries) == 1 and chat == waiting and delay == WAIT
    assert isinstance(exc, RetryAfter) and exc.scope == "chat"
    resumed = server.messages(waiting)
    # In the order the bot made them (a threaded TeleBot handles one chat's
    # updates on several threads: that order is its own, not m0, m1, m2).
    assert [m.text for m in resumed] == bot.made.texts[str(waiting)]
    assert sorted(m.text for m in resumed) == ["r:m0", "r:m1", "r:m2"]
    # The dispatcher decided the wait before it called the hook: its end is
    # at most the hook's clock + WAIT (a margin for the two clock reads).
    assert resumed[0].at >= told_at + WAIT - 0.05
    during = [m for chat in others for m in server.messages(chat)
              if told_at < m.at < resumed[0].at]
    assert during, "no other chat's reply arrived while the chat waited"
    for chat in others:
        assert texts_of(server, chat) == bot.made.texts[str(chat)]
        assert sorted(texts_of(server, chat)) == ["r:m0", "r:m1", "r:m2"]
    assert set(server.max_in_flight().values()) == {1}


# -- requests without a chat, getUpdates, what finally fails -------------------------

@pytest.mark.filterwarnings("ignore:Deprecated since version v22.2")
def test_a_request_without_a_chat_is_paced_bot_wide_only(client, make_dispatcher):
    # A chat limit of one send an hour: requests without a chat would wait
    # behind each other if they shared a key; they go through the
    # dispatcher (counted) and none waits.
    d = make_dispatcher(pacing=Pacing(chat_limit=RateLimit(1, per=3600.0)))
    with FakeTelegramServer() as server:
        c = client(server, d)
        before = d.stats().submitted             # PTB's initialize() calls getMe
        assert [c.get_me().id for _ in range(3)] == [7012345678] * 3
        assert d.stats().submitted == before + 3 and d.stats().paced == 0
        # A 429 on it pauses the bot-wide budget, and it is sent again.
        retries = []
        d2 = make_dispatcher(hooks=DispatcherHooks(
            on_retry=lambda chat, attempt, delay, exc: retries.append(exc)))
        c2 = client(server, d2)
        server.inject("too_many", method="getMe", retry_after=1)
        assert c2.get_me().id == 7012345678
        assert [(e.scope, e.seconds) for e in retries] == [("global", 1.0)]


@pytest.mark.filterwarnings("ignore:Deprecated since version v22.2")
def test_get_updates_is_not_delayed_while_every_send_waits(client, make_dispatcher):
    d = make_dispatcher(retry=RetryPolicy(max_retry_after=7200.0))
    with FakeTelegramServer() as server:
        c = client(server, d)
        # A 429 of an hour on a request without a chat: the bot-wide budget
        # pauses, every chat's sends wait.
        server.inject("too_many", method="getMe", retry_after=3600)
        paused = c.get_me_later()
        wait_until(lambda: d.stats().retried == 1, 30, "the 429")
        parked = c.send_later(1, "waits")
        wait_until(lambda: d.stats().parked == 2, 30, "the send to wait")
        server.push_message(5, "hello")
        updates = c.get_updates()
        assert [u.message.text for u in updates] == ["hello"]
        assert texts_of(server, 1) == [] and not parked.done() and not paused.done()
        d.force_close()                          # the waiting requests are cancelled
        for waiting in (paused, parked):
            with pytest.raises(concurrent.futures.CancelledError):   # Cancelled is one
                waiting.result(30)


@pytest.mark.filterwarnings("ignore:Deprecated since version v22.2")
def test_what_finally_fails_reaches_the_bot_as_the_librarys_own_error(
        client, make_dispatcher):
    d = make_dispatcher(retry=RetryPolicy(max_attempts=2))
    with FakeTelegramServer() as server:
        c = client(server, d)
        server.inject("too_many", 2, chat_id=7, retry_after=1)
        with pytest.raises(c.flood_error()) as info:
            c.send_later(7, "x").result(30)
        if c.name == "telebot":
            assert info.value.error_code == 429
        assert d.stats().retried == 1 and texts_of(server, 7) == []
        # Any other error is not retried and reaches the bot unchanged.
        server.inject("error", status=400, chat_id=7)
        with pytest.raises(c.bad_request()):
            c.send_later(7, "y").result(30)
        assert d.stats().retried == 1
        assert c.send_later(7, "z").result(30).text == "z"
        assert texts_of(server, 7) == ["z"]


@pytest.mark.filterwarnings("ignore:Deprecated since version v22.2")
def test_a_429_longer_than_the_policy_allows_fails_at_once_as_the_librarys_error(
        client, make_dispatcher):
    d = make_dispatcher(retry=RetryPolicy(max_retry_after=2.0))
    with FakeTelegramServer() as server:
        c = client(server, d)
        server.inject("too_many", chat_id=8, retry_after=30)
        with pytest.raises(c.flood_error()):
            c.send_later(8, "x").result(30)
        assert d.stats().retried == 0


# -- python-telegram-bot specifics ----------------------------------------------------

@pytest.mark.parametrize("as_timedelta", [False, True], ids=["int", "timedelta"])
def test_ptb_retry_after_as_an_int_or_a_timedelta_is_a_wait_of_the_chat(
        as_timedelta, monkeypatch, make_dispatcher):
    library("ptb")
    import telegram.error

    from fastdispatch.integrations.ptb import DispatcherRateLimiter

    if as_timedelta:
        monkeypatch.setenv("PTB_TIMEDELTA", "1")
    else:
        monkeypatch.delenv("PTB_TIMEDELTA", raising=False)
    retries = []
    d = make_dispatcher(hooks=DispatcherHooks(
        on_retry=lambda chat, attempt, delay, exc: retries.append((chat, delay))))
    limiter = DispatcherRateLimiter(d)
    calls = []
    with warnings.catch_warnings():            # PTB's own read of it, when it is made
        warnings.simplefilter("ignore")
        flood = telegram.error.RetryAfter(datetime.timedelta(seconds=0.25)
                                          if as_timedelta else 1)

    async def callback(value):
        calls.append(value)
        if len(calls) == 1:
            raise flood
        return {"ok": value}

    async def main():
        with warnings.catch_warnings():
            warnings.simplefilter("error")       # the limiter reads it without a warning
            return await limiter.process_request(callback, ("v",), {}, "sendMessage",
                                                 {"chat_id": "-100123", "text": "t"}, None)

    assert asyncio.run(main()) == {"ok": "v"}
    assert calls == ["v", "v"]
    assert retries == [(-100123, 0.25 if as_timedelta else 1.0)]


def test_ptb_limiter_made_dispatcher_follows_the_application_life_cycle():
    library("ptb")
    from fastdispatch.integrations.ptb import DispatcherRateLimiter

    with FakeTelegramServer() as server:
        limiter = DispatcherRateLimiter(pacing=Pacing(chat_limit=RateLimit(1, per=0.01)),
                                        retry=RetryPolicy(max_attempts=3))
        assert limiter.dispatcher is None
        c = PTBClient(server, limiter=limiter)   # ExtBot.initialize -> limiter.initialize
        try:
            first = limiter.dispatcher
            assert first is not None and not first.closed
            assert c.send_later(3, "a").result(30).text == "a"
            assert first.stats().completed == 2     # initialize()'s getMe, then the send
        finally:
            c.close()                            # ExtBot.shutdown -> limiter.shutdown
        assert first.closed and limiter.dispatcher is None
        c = PTBClient(server, limiter=limiter)   # initialized again: a new dispatcher
        try:
            assert limiter.dispatcher is not first and not limiter.dispatcher.closed
            assert c.send_later(3, "b").result(30).text == "b"
        finally:
            c.close()
        assert texts_of(server, 3) == ["a", "b"]


def test_ptb_limiter_never_shuts_down_a_dispatcher_it_was_given(make_dispatcher):
    library("ptb")
    d = make_dispatcher()
    with FakeTelegramServer() as server:
        c = PTBClient(server, d)
        assert c.send_later(3, "a").result(30).text == "a"
        c.close()
        assert not d.closed
        assert d.submit(3, lambda sc: "still open").result(10) == "still open"
    with pytest.raises(TypeError):
        from fastdispatch.integrations.ptb import DispatcherRateLimiter
        DispatcherRateLimiter(d, pacing=Pacing.telegram())


# -- the shared translation --------------------------------------------------------------

def test_chat_ids_spelled_differently_are_one_chat():
    from fastdispatch.integrations._common import chat_key, no_chat_key, seconds_of

    assert chat_key(42) == chat_key("42") == 42
    assert chat_key("-100123") == -100123 and chat_key("@channel") == "@channel"
    assert chat_key(None) is None and chat_key("") is None and chat_key(True) is None
    assert no_chat_key("getMe") != no_chat_key("getMe")
    assert seconds_of(3) == 3.0 and seconds_of(datetime.timedelta(milliseconds=1500)) == 1.5
    assert seconds_of(None) == seconds_of(-1) == seconds_of(float("nan")) == 1.0


# -- the examples -------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:Deprecated since version v22.2")
@pytest.mark.parametrize("name", ["ptb_bot", "aiogram_bot", "telebot_bot"])
def test_the_example_bot_runs_against_the_fake_server_with_no_token(name, monkeypatch):
    # In this process (the library is imported already): its run_local(),
    # what ``python examples/<name>.py`` runs without TELEGRAM_BOT_TOKEN.
    import importlib.util
    import pathlib

    library({"ptb_bot": "ptb", "aiogram_bot": "aiogram", "telebot_bot": "telebot"}[name])
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / (name + ".py")
    if not path.exists():
        pytest.skip("examples/ is not part of this copy of the tests")
    if name == "telebot_bot":                    # it sets the library's process-wide hooks
        from telebot import apihelper
        monkeypatch.setattr(apihelper, "API_URL", apihelper.API_URL)
        monkeypatch.setattr(apihelper, "CUSTOM_REQUEST_SENDER", apihelper.CUSTOM_REQUEST_SENDER)
    spec = importlib.util.spec_from_file_location("example_" + name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.run_local() == 0


# -- what real bots need of the plug-ins --------------------------------------------------

@pytest.mark.filterwarnings("ignore:Deprecated since version v22.2")
def test_a_busy_chat_makes_requests_wait_for_room_never_fail(client, make_dispatcher):
    # A chat queue of 2 and 20 requests for the chat at once: before, the
    # third one raised QueueFull into the bot.
    d = make_dispatcher(queue_size=2, pacing=Pacing(chat_limit=RateLimit(1, per=0.01)))
    with FakeTelegramServer() as server:
        c = client(server, d)
        sends = [c.send_later(5, "m%d" % i) for i in range(20)]
        for f in sends:
            f.result(60)
        assert sorted(texts_of(server, 5)) == sorted("m%d" % i for i in range(20))
        assert server.max_in_flight() == {"5": 1}
        assert d.stats().rejected == 0


def _own_send_task(c, chat, text):
    # A dispatcher task that makes the bot send to its own chat.
    if c.name == "telebot":
        return lambda sc: c.bot.send_message(chat, text).text

    async def task(sc):
        if c.name == "ptb":
            return (await c.bot.send_message(chat, text)).text
        return (await c.bot.send_message(chat_id=chat, text=text)).text
    return task


@pytest.mark.filterwarnings("ignore:Deprecated since version v22.2")
def test_a_request_a_task_makes_for_its_own_chat_goes_out_at_once(client, make_dispatcher):
    # No send_timeout: before, the request waited behind the task waiting
    # for it, for ever (the guard below is what failed).
    d = make_dispatcher(send_timeout=None, pacing=Pacing(chat_limit=RateLimit(1, per=0.01)))
    with FakeTelegramServer() as server:
        c = client(server, d)
        task = _own_send_task(c, 8, "inside")
        if c.name == "telebot":
            result = d.submit(8, task).result(30)
        else:
            result = c.lt.run(d.asubmit(8, task), timeout=30)
        assert result == "inside"
        # Another chat's request from inside a task queues as usual.
        assert c.send_later(9, "other").result(30) is not None
        assert texts_of(server, 8) == ["inside"] and texts_of(server, 9) == ["other"]


def test_ptb_limiter_takes_aioratelimiters_keywords():
    library("ptb")
    from fastdispatch.integrations.ptb import DispatcherRateLimiter

    limiter = DispatcherRateLimiter(overall_max_rate=10, overall_time_period=2,
                                    group_max_rate=5, group_time_period=30, max_retries=2)
    margin = Pacing.telegram().chat_limit.per - 1.0
    assert limiter._pacing.global_limit == RateLimit(10, per=2 + margin)
    assert limiter._pacing.limit_for(-100) == RateLimit(5, per=30 + margin)
    assert limiter._pacing.limit_for(100) is None
    assert limiter._pacing.chat_limit == Pacing.telegram().chat_limit
    assert limiter._retry.max_attempts == 3
    off = DispatcherRateLimiter(overall_max_rate=0, group_max_rate=0)
    assert off._pacing.global_limit is None and off._pacing.limit_for is None
    assert DispatcherRateLimiter(overall_max_rate=0.5)._pacing.global_limit == RateLimit(
        1, per=2 + margin)
    with pytest.raises(TypeError, match="pacing"):
        DispatcherRateLimiter(pacing=Pacing.telegram(), overall_max_rate=30)
    with pytest.raises(TypeError, match="max_retries"):
        DispatcherRateLimiter(retry=RetryPolicy(), max_retries=1)
    with pytest.raises(ValueError, match="max_retries"):
        DispatcherRateLimiter(max_retries=-1)
    with pytest.raises(ValueError, match="group_time_period"):
        DispatcherRateLimiter(group_time_period="60")


@pytest.mark.filterwarnings("ignore:Deprecated since version v22.2")
def test_ptb_rate_limit_args_max_retries_is_honoured_and_other_keys_said_once(
        make_dispatcher):
    library("ptb")
    import telegram.error

    d = make_dispatcher(retry=RetryPolicy(max_attempts=5))
    with FakeTelegramServer(exact_retry_after=True) as server:
        c = PTBClient(server, d)
        try:
            server.inject("too_many", count=10, chat_id=4, retry_after=0.01)
            with pytest.raises(telegram.error.RetryAfter):
                c.lt.run(c.bot.send_message(4, "x", rate_limit_args={"max_retries": 1}))
            assert server.stats()["injected_too_many"] == 2     # the call and one retry
            server.reset()
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                for text in ("a", "b"):
                    c.lt.run(c.bot.send_message(4, text, rate_limit_args={"priority": 1}))
            said = [w for w in seen if issubclass(w.category, RuntimeWarning)]
            assert len(said) == 1 and "'priority'" in str(said[0].message)
            assert texts_of(server, 4) == ["a", "b"]
        finally:
            c.close()


@pytest.mark.filterwarnings("ignore:Deprecated since version v22.2")
def test_ptb_limiter_shutdown_drains_to_a_deadline_and_says_what_was_left(caplog):
    library("ptb")
    from fastdispatch.integrations.ptb import DispatcherRateLimiter

    caplog.set_level("INFO", logger="fastdispatch")
    with FakeTelegramServer() as server:
        limiter = DispatcherRateLimiter(pacing=Pacing(chat_limit=RateLimit(1, per=0.02)))
        c = PTBClient(server, limiter=limiter)
        sends = [c.send_later(6, "m%d" % i) for i in range(5)]
        c.close()                               # drains: every queued send goes out
        assert [f.result(10).text for f in sends] == ["m%d" % i for i in range(5)]
        assert "WARNING" not in caplog.text and "task(s) sent" in caplog.text
        caplog.clear()
        limiter = DispatcherRateLimiter(pacing=Pacing(chat_limit=RateLimit(1, per=60)),
                                        shutdown_timeout=0.2)
        c = PTBClient(server, limiter=limiter)
        sends = [c.send_later(7, "n%d" % i) for i in range(3)]
        d = limiter.dispatcher
        wait_until(lambda: d.stats().submitted >= 4, what="3 sends queued")
        c.close()                               # 0.2 s: one is sent, two are left, and said
        assert "with 2 task(s) not done" in caplog.text
        assert texts_of(server, 7) == ["n0"]
        d.force_close()


def test_aiogram_middleware_without_a_dispatcher_owns_one_and_drains_it_with_the_session(
        caplog):
    library("aiogram")
    import aiogram
    from aiogram.client.session.aiohttp import AiohttpSession
    from aiogram.client.telegram import TelegramAPIServer

    from fastdispatch.integrations.aiogram import DispatcherMiddleware

    caplog.set_level("INFO", logger="fastdispatch")
    lt = LoopThread()
    try:
        with FakeTelegramServer() as server:
            middleware = DispatcherMiddleware(pacing=Pacing(chat_limit=RateLimit(1, per=0.02)))
            d = middleware.dispatcher

            async def run():
                bot = aiogram.Bot(TOKEN, session=AiohttpSession(
                    api=TelegramAPIServer.from_base(server.base_url)))
                bot.session.middleware(middleware)
                await bot.get_me()
                sends = [asyncio.ensure_future(bot.send_message(chat_id=11, text="m%d" % i))
                         for i in range(6)]
                await asyncio.sleep(0)
                await bot.session.close()        # drains first, then closes
                return [s.result().text for s in sends]

            assert lt.run(run(), timeout=60) == ["m%d" % i for i in range(6)]
            assert texts_of(server, 11) == ["m%d" % i for i in range(6)]
            assert d.closed and "task(s) sent" in caplog.text
    finally:
        lt.close()
    with pytest.raises(TypeError, match="pacing"):
        DispatcherMiddleware(object(), pacing=Pacing.telegram())


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_telebot_run_polling_stops_on_a_signal_without_losing_a_reply(signum, monkeypatch,
                                                                     caplog):
    # TeleBot's two workers and a slow chat: when the signal comes, most
    # updates are still in TeleBot's own worker queue or the dispatcher.
    library("telebot")
    import signal

    import telebot
    from telebot import apihelper

    from fastdispatch.integrations.telebot import DispatcherRequestSender, run_polling

    caplog.set_level("INFO", logger="fastdispatch.integrations")
    with FakeTelegramServer() as server:
        monkeypatch.setattr(apihelper, "API_URL", server.base_url + "/bot{0}/{1}")
        sender = DispatcherRequestSender(pacing=Pacing(chat_limit=RateLimit(1, per=0.05)))
        monkeypatch.setattr(apihelper, "CUSTOM_REQUEST_SENDER", sender)
        bot = telebot.TeleBot(TOKEN, num_threads=2)

        @bot.message_handler(func=lambda message: True)
        def reply(message):
            bot.send_message(message.chat.id, "r:" + message.text)

        for n in range(8):
            for chat in (21, 22, 23):
                server.push_message(chat, "m%d" % n)

        def signal_after_the_first_reply():
            wait_until(lambda: server.stats().get("sent", 0) >= 1, what="a first reply")
            os.kill(os.getpid(), getattr(signal, signum))

        killer = threading.Thread(target=signal_after_the_first_reply)
        killer.start()
        assert run_polling(bot, timeout=1, long_polling_timeout=1, interval=0) is True
        killer.join(10)
        for chat in (21, 22, 23):
            assert sorted(texts_of(server, chat)) == sorted("r:m%d" % n for n in range(8))
        assert server.pending_updates() == 0          # confirmed: a restart gets none again
        assert sender.dispatcher.closed and "none left" in caplog.text
