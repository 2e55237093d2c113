"""aiogram 3: :class:`DispatcherMiddleware`, a session request middleware
that sends every Bot API request through an
:class:`~fastdispatch.OutboundDispatcher`.

aiogram's documented extension point on the way out is the session's
request middleware chain (``bot.session.middleware(m)``; aiogram's own
``RequestLogging`` is one): each middleware is called as ``await m(
make_request, bot, method)`` and calls ``make_request(bot, method)`` to go
on.  Here:

- a method with a ``chat_id`` is ``await dispatcher.asubmit(chat, task)``:
  the task calls ``make_request`` on the bot's event loop (no thread is held
  while the request is in flight), in the chat's order, one at a time,
  paced by the dispatcher's ``Pacing``;
- one without (``getMe``, ``answerCallbackQuery``, ...) goes through the
  dispatcher under a key of its own: only the bot-wide limit applies;
- ``getUpdates`` goes straight on;
- aiogram's ``TelegramRetryAfter`` becomes fastdispatch's ``RetryAfter`` of
  that chat (bot-wide for a request without a chat): the chat waits, others
  go on, and the request is sent again before the chat's later ones, as the
  dispatcher's ``RetryPolicy`` allows.  When no attempt is left, the bot
  gets aiogram's ``TelegramRetryAfter`` of the last attempt; every other
  error reaches it unchanged.

- a request made inside a task of the dispatcher for that task's own
  chat (the bot's code runs in ``dispatcher.asubmit(chat, task)`` and
  calls the Bot API for ``chat``) is that task's own send: it goes out at
  once, never queued behind the task that waits for it.  Requests for
  other chats queue as usual (a task that waits for another chat's reply
  while that chat's task waits for its own would wait for ever: don't).

Middlewares registered after this one run inside each attempt (a logging
middleware registered later sees every retry); those registered before
see one call.

``DispatcherMiddleware()`` with no dispatcher makes its own
(``Pacing.telegram()``, ``RetryPolicy()``, or the ``pacing`` and ``retry``
given), owns it and shuts it down when the last bot session it served
closes (aiogram closes the sessions when polling stops), draining first:
queued requests are sent (up to ``shutdown_timeout`` seconds) before the
session goes, and what was sent and what was left is logged.  A
dispatcher given to it stays the caller's.  ``dp.shutdown.register(
middleware.ashutdown)`` makes a stop lose no reply at all: aiogram does
not wait for the handlers still running when polling stops; this hook
waits for them (their replies included) before the drain.
"""

import asyncio
import logging
import time
from typing import Any, Optional

from aiogram.client.session.middlewares.base import BaseRequestMiddleware
from aiogram.exceptions import TelegramRetryAfter

from .._errors import RetryAfter
from ._common import (DEFAULT, UNPACED_METHODS, astop_and_report, chat_key, check_dispatcher,
                      check_timeout, is_own_send, make_dispatcher, no_chat_key, retry_after)

__all__ = ["DispatcherMiddleware"]

logger = logging.getLogger("fastdispatch.integrations.aiogram")


class DispatcherMiddleware(BaseRequestMiddleware):
    """An aiogram request middleware that sends through a dispatcher.

    ``bot.session.middleware(DispatcherMiddleware())``: a dispatcher of its
    own, paced to Telegram's limits, with retries; or
    ``DispatcherMiddleware(dispatcher)`` to share the one the bot's other
    sends use (``pacing`` and ``retry`` only configure one it makes).  One
    middleware (and one dispatcher) may serve several bots: chats are
    keyed by their id only, so bots that share a dispatcher share its
    per-chat order and pacing.

    A request never fails because its chat is busy: it waits for room in
    the chat's queue (holding no thread), in the order it was made.

    Costs: one ``asubmit`` per request (a dispatcher task, no thread).
    """

    def __init__(self, dispatcher: Any = None, *, pacing: Any = DEFAULT,
                 retry: Any = DEFAULT, shutdown_timeout: Optional[float] = 30.0) -> None:
        self._dispatcher = check_dispatcher(dispatcher, "asubmit", pacing, retry)
        self._owned = dispatcher is None
        self._pacing, self._retry = pacing, retry
        if self._owned:
            self._dispatcher = make_dispatcher(pacing, retry)
        self.shutdown_timeout = check_timeout("shutdown_timeout", shutdown_timeout)
        self._sessions: dict = {}  # id(session) -> session: open sessions this one drains

    @property
    def dispatcher(self) -> Any:
        """The dispatcher requests go through."""
        return self._dispatcher

    def _watch(self, session: Any) -> None:
        # An owned dispatcher is shut down (drained) before the last
        # session it served closes: the queued requests need the session.
        if not self._owned or id(session) in self._sessions:
            return
        self._sessions[id(session)] = session
        close = session.close

        async def close_after_drain() -> None:
            # aiogram also calls close() to reset a connection pool not yet
            # (or no longer) open, from inside a request (then inside a task
            # of the dispatcher, which must not wait for itself): nothing
            # to drain for.
            raw = getattr(session, "_session", session)  # AiohttpSession's
            opened = raw is not None and not getattr(raw, "closed", False)
            try:
                if (opened and self._dispatcher.running_chat() is None
                        and self._sessions.pop(id(session), None) is not None
                        and not self._sessions):
                    await self.ashutdown()
            finally:
                await close()

        session.close = close_after_drain

    async def ashutdown(self, dispatcher: Any = None,
                        timeout: Optional[float] = DEFAULT) -> bool:
        """Wait for aiogram's running handlers (when ``dispatcher``, the
        aiogram ``Dispatcher``, is given: what its shutdown hooks receive),
        then drain and shut down the dispatcher this middleware made, all
        within ``timeout`` seconds (default: ``shutdown_timeout``).  True
        if everything was sent in time.  A dispatcher given to the
        middleware is drained, not shut down.

        ``dp.shutdown.register(middleware.ashutdown)``."""
        if timeout is DEFAULT:
            timeout = self.shutdown_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        handlers = [t for t in getattr(dispatcher, "_handle_update_tasks", ())
                    if t is not asyncio.current_task()]
        if handlers:
            logger.info("waiting for %d running handlers", len(handlers))
            _, pending = await asyncio.wait(handlers, timeout=timeout)
            if pending:
                logger.warning("%d handlers still running after %s s", len(pending), timeout)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if self._owned:
            return await self._dispatcher.ashutdown(left)
        return await astop_and_report(self._dispatcher, left, shut_down=False)

    async def __call__(self, make_request: Any, bot: Any, method: Any) -> Any:
        name = getattr(method, "__api_method__", "") or ""
        if name.lower() in UNPACED_METHODS:
            return await make_request(bot, method)
        dispatcher = self._dispatcher
        if self._owned and dispatcher.closed:  # polling started again after a stop
            dispatcher = self._dispatcher = make_dispatcher(self._pacing, self._retry)
        self._watch(bot.session)
        key = chat_key(getattr(method, "chat_id", None))
        has_chat = key is not None
        if not has_chat:
            key = no_chat_key(name)
        elif is_own_send(dispatcher, key):
            return await make_request(bot, method)
        flood = []  # aiogram's TelegramRetryAfter of the last attempt, if it was one

        async def send(sc):
            try:
                result = await make_request(bot, method)
            except TelegramRetryAfter as exc:
                flood[:] = [exc]
                raise retry_after(exc.retry_after, has_chat) from None
            flood.clear()
            return result

        # Nothing is awaited before asubmit queues the task (or its wait for
        # room): requests are queued in the order the bot made them.
        try:
            return await dispatcher.asubmit(key, send, block=True)
        except RetryAfter:
            if flood:
                raise flood[0] from None
            raise
