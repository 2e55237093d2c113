"""pyTelegramBotAPI (the threaded ``TeleBot``): :class:`DispatcherRequestSender`,
a request sender for ``telebot.apihelper.CUSTOM_REQUEST_SENDER`` that sends
every Bot API request through an :class:`~fastdispatch.OutboundDispatcher`.

pyTelegramBotAPI's documented hook on the way out is
``apihelper.CUSTOM_REQUEST_SENDER``: a callable used instead of
``requests.request``, called as ``sender(method, url, params=...,
files=..., timeout=..., proxies=...)``, whose answer (a
``requests.Response``) the library then checks itself, raising its
``ApiTelegramException`` for an error.  Here:

- a request whose ``params`` have a ``chat_id`` is submitted to the
  dispatcher under that chat and the calling thread (a ``TeleBot`` worker
  running a handler) waits for it, as it waits for ``requests``: the
  request is sent on a dispatcher worker, in the chat's order, one at a
  time, paced by the dispatcher's ``Pacing``;
- one without (``getMe``, ``answerCallbackQuery``, ...) goes through the
  dispatcher under a key of its own: only the bot-wide limit applies;
- ``getUpdates`` is sent at once, on the calling thread;
- an answer ``429`` becomes fastdispatch's ``RetryAfter`` of that chat
  (bot-wide for a request without a chat), its ``parameters.retry_after``
  read from the body: the chat waits, others go on, and the request is sent
  again before the chat's later ones, as the dispatcher's ``RetryPolicy``
  allows.  When no attempt is left, the last 429 answer is returned, so the
  bot gets the library's own ``ApiTelegramException`` (``error_code``
  429); every other answer and every error of ``requests`` reach it as
  they would without the sender.

A request never fails because its chat is busy: the calling thread waits
for room in the chat's queue, in the order the requests were made.  A
request made on a dispatcher worker by a task of the dispatcher for that
task's own chat (a handler run with ``dispatcher.submit(chat, task)`` that
calls the Bot API for ``chat``) is that task's own send: it is made at
once on that thread, never queued behind the task that waits for it.
Requests for other chats queue as usual (a task that waits for another
chat's reply while that chat's task waits for its own would wait for
ever: don't).

The hook is process-wide (a module attribute of ``apihelper``): every
``TeleBot`` of the process sends through the one sender.  Each dispatcher
worker keeps its own ``requests.Session`` (a ``Session`` is not meant to be
shared by threads), as ``apihelper`` keeps one per thread.
``DispatcherRequestSender()`` with no dispatcher makes its own
(``Pacing.telegram()``, ``RetryPolicy()``) and :meth:`~DispatcherRequestSender.close`
shuts it down; a dispatcher given to it stays the caller's.

Stopping without losing a reply: :func:`run_polling` runs a ``TeleBot``
until SIGTERM or SIGINT, then lets the updates already fetched finish
(those still in ``TeleBot``'s own worker queue included), sends the
replies they made, tells Telegram which updates were handled, and only
then returns.  ``TeleBot.infinity_polling`` and ``polling`` do not: Ctrl-C
stops them with the worker queue full, and SIGTERM kills the process.

``AsyncTeleBot`` has no request hook (``asyncio_helper`` sends with its
own ``aiohttp`` session and offers nothing like ``CUSTOM_REQUEST_SENDER``),
so no plug-in is offered for it; its bots can send through the dispatcher
with ``await dispatcher.asubmit(chat, lambda sc: bot.send_message(...))``.
"""

import concurrent.futures
import json
import logging
import signal
import threading
import time
from typing import Any, Callable, Optional

from .._errors import Cancelled, RetryAfter
from .._signals import SignalRelay
from ._common import (DEFAULT, UNPACED_METHODS, chat_key, check_dispatcher, check_timeout,
                      is_own_send, make_dispatcher, no_chat_key, retry_after, stop_and_report)

__all__ = ["DispatcherRequestSender", "run_polling"]

logger = logging.getLogger("fastdispatch.integrations.telebot")


class _Flood429(RetryAfter):
    """A 429 answer, as the dispatcher's ``RetryAfter``, keeping the answer
    to hand back when no attempt is left."""

    def __init__(self, seconds, scope, response):
        super().__init__(seconds, scope)
        self.response = response


def _retry_after_of(response):
    try:
        body = json.loads(response.text)
        return (body.get("parameters") or {}).get("retry_after")
    except (ValueError, AttributeError, TypeError):
        return None


class DispatcherRequestSender:
    """``apihelper.CUSTOM_REQUEST_SENDER = DispatcherRequestSender()``.

    ``dispatcher``: the one the bot's other sends use, or None to make one
    (with ``pacing`` and ``retry``, by default ``Pacing.telegram()`` and
    ``RetryPolicy()``; these two only configure one it makes).

    ``send`` (default: ``requests``, one ``Session`` per thread) is what
    makes the HTTP request: ``send(method, url, **kwargs) ->
    requests.Response``, the signature of ``requests.request``.

    Costs: one dispatcher task per request; the calling thread waits for it
    (the threaded ``TeleBot``'s model), the request runs on a worker.
    """

    def __init__(self, dispatcher: Any = None,
                 send: Optional[Callable[..., Any]] = None, *, pacing: Any = DEFAULT,
                 retry: Any = DEFAULT) -> None:
        check_dispatcher(dispatcher, "submit", pacing, retry)
        if send is not None and not callable(send):
            raise TypeError("send must be callable")
        self._owned = dispatcher is None
        self.dispatcher = make_dispatcher(pacing, retry) if self._owned else dispatcher
        self._send = send if send is not None else self._requests_send
        self._local = threading.local()  # .session: this thread's requests.Session

    def _requests_send(self, method, url, **kwargs):
        session = getattr(self._local, "session", None)
        if session is None:
            import requests

            session = self._local.session = requests.Session()
        return session.request(method, url, **kwargs)

    def submit(self, method: str, url: str, **kwargs: Any) -> "concurrent.futures.Future[Any]":
        """Queue the request; the Future holds the answer (after the last
        429, that 429) or the error of ``send``.  ``getUpdates`` is sent
        here and now."""
        name = url.rsplit("/", 1)[-1]
        if name.lower() in UNPACED_METHODS:
            return self._now(method, url, **kwargs)
        params = kwargs.get("params") or {}
        key = chat_key(params.get("chat_id") if isinstance(params, dict) else None)
        has_chat = key is not None
        if not has_chat:
            key = no_chat_key(name)
        elif is_own_send(self.dispatcher, key):
            return self._now(method, url, **kwargs)
        send = self._send

        def task(sc):
            response = send(method, url, **kwargs)
            if getattr(response, "status_code", None) == 429:
                wait = retry_after(_retry_after_of(response), has_chat)
                raise _Flood429(wait.seconds, wait.scope, response)
            return response

        inner = self.dispatcher.submit(key, task, block=True)
        outer: "concurrent.futures.Future[Any]" = concurrent.futures.Future()

        def settle(fut):
            if fut.cancelled():  # force_close() before it was sent
                outer.set_exception(Cancelled("the request was cancelled before it was sent"))
                return
            exc = fut.exception()
            if exc is None:
                outer.set_result(fut.result())
            elif isinstance(exc, _Flood429):
                outer.set_result(exc.response)  # the library raises its own 429 error
            else:
                outer.set_exception(exc)

        inner.add_done_callback(settle)
        return outer

    def _now(self, method, url, **kwargs):
        # A request made here and now, on the calling thread.
        done: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
        try:
            done.set_result(self._send(method, url, **kwargs))
        except BaseException as exc:
            done.set_exception(exc)
        return done

    def __call__(self, method: str, url: str, **kwargs: Any) -> Any:
        """What ``apihelper`` calls instead of ``requests.request``."""
        return self.submit(method, url, **kwargs).result()

    def close(self, timeout: Optional[float] = 30.0) -> bool:
        """Send what is queued (up to ``timeout`` seconds; None: no limit),
        then shut down the dispatcher this sender made (a given one is only
        drained); logs what was sent and what was left.  True if everything
        was sent in time."""
        timeout = check_timeout("timeout", timeout)
        return stop_and_report(self.dispatcher, timeout, shut_down=self._owned)


def _drain_workers(bot, deadline):
    """Wait until every task in ``TeleBot``'s worker queue (the handlers of
    the updates already fetched) has run; False if ``deadline`` came first.

    Each worker is handed one marker behind the queued tasks and holds on
    it until all have arrived (so none takes two): when every worker holds
    one, everything queued before them has run.  A worker stopped by a
    handler's error waits for the polling loop to let it go on; the loop
    has stopped, so it is let go here."""
    pool = getattr(bot, "worker_pool", None)
    if not getattr(bot, "threaded", False) or pool is None:
        return True
    arrived, release = threading.Semaphore(0), threading.Event()

    def marker():
        arrived.release()
        release.wait(max(0.0, deadline - time.monotonic()) + 1.0)

    for _ in pool.workers:
        pool.put(marker)
    waiting = len(pool.workers)
    try:
        while waiting:
            if arrived.acquire(timeout=0.05):
                waiting -= 1
                continue
            if time.monotonic() >= deadline:
                return False
            for worker in pool.workers:
                if worker.exception_event.is_set():
                    worker.clear_exceptions()
        return True
    finally:
        release.set()


def run_polling(bot: Any, sender: Optional[DispatcherRequestSender] = None, *,
                shutdown_timeout: Optional[float] = 30.0, **polling: Any) -> bool:
    """Run ``bot.polling(**polling)`` (``non_stop=True`` unless told)
    until SIGTERM or SIGINT, then stop without losing a reply.

    On the signal: polling stops (after the long poll in flight, up to
    ``long_polling_timeout`` seconds), the updates already fetched are
    handled (``TeleBot``'s worker queue drained), the replies are sent
    (``sender.close``, by default the ``DispatcherRequestSender`` in
    ``apihelper.CUSTOM_REQUEST_SENDER``), and the handled updates are
    confirmed to Telegram (so a restart does not get them again); all of
    it within ``shutdown_timeout`` seconds of the signal (None: no limit).
    What was left, if anything, is logged.  True if nothing was.  Call it
    from the main thread (signal handlers are installed there only).
    """
    shutdown_timeout = check_timeout("shutdown_timeout", shutdown_timeout)
    if sender is None:
        from telebot import apihelper

        sender = apihelper.CUSTOM_REQUEST_SENDER
    if not isinstance(sender, DispatcherRequestSender):
        raise TypeError("sender must be a DispatcherRequestSender (or installed as "
                        "apihelper.CUSTOM_REQUEST_SENDER), got %r" % (type(sender).__name__,))
    stopping = []  # when the signal came

    def stop(signum):
        if not stopping:
            logger.info("signal %d: stopping polling", signum)
            stopping.append(time.monotonic())
        bot.stop_polling()

    relay = SignalRelay(stop, (signal.SIGTERM, signal.SIGINT))
    relay.install()
    polling.setdefault("non_stop", True)
    try:
        bot.polling(**polling)
    finally:
        relay.restore()
        start = stopping[0] if stopping else time.monotonic()
        deadline = float("inf") if shutdown_timeout is None else start + shutdown_timeout
        handled = _drain_workers(bot, deadline)
        if not handled:
            logger.warning("TeleBot's handlers did not finish within %s s", shutdown_timeout)
        left = None if shutdown_timeout is None else max(0.0, deadline - time.monotonic())
        sent = sender.close(left)
        if handled:
            _confirm_updates(bot)
    return handled and sent


def _confirm_updates(bot):
    # Telegram forgets updates below the offset of a getUpdates: without
    # it, a restart would be handed the last batch again and answer twice.
    # (pyTelegramBotAPI drops a long poll of 0 for its default of 20 s: 1 s
    # is the shortest it sends; a request timeout of 5 s covers it.)
    try:
        bot.get_updates(offset=bot.last_update_id + 1, limit=1, timeout=5,
                        long_polling_timeout=1)
    except Exception as exc:  # noqa: BLE001 - the bot stops anyway; said
        logger.warning("could not confirm the handled updates: %r", exc)
