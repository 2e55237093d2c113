"""aiogram 3: :class:`DispatcherMiddleware`, a session request middleware
that sends every Bot API request through an
:class:`~fastdispatch.OutboundDispatcher` (SPEC §8.1).

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

Middlewares registered after this one run inside each attempt (a logging
middleware registered later sees every retry); those registered before
see one call.  The middleware owns nothing: the dispatcher is the
caller's, who shuts it down (from a thread: ``await
loop.run_in_executor(None, dispatcher.shutdown)``).
"""

from typing import Any

from aiogram.client.session.middlewares.base import BaseRequestMiddleware
from aiogram.exceptions import TelegramRetryAfter

from .._errors import RetryAfter
from ._common import UNPACED_METHODS, chat_key, no_chat_key, retry_after

__all__ = ["DispatcherMiddleware"]


class DispatcherMiddleware(BaseRequestMiddleware):
    """An aiogram request middleware that sends through a dispatcher.

    ``bot.session.middleware(DispatcherMiddleware(dispatcher))``.  One
    middleware (and one dispatcher) may serve several bots: chats are
    keyed by their id only, so bots that share a dispatcher share its
    per-chat order and pacing.

    Costs: one ``asubmit`` per request (a dispatcher task, no thread).
    """

    def __init__(self, dispatcher: Any) -> None:
        if not callable(getattr(dispatcher, "asubmit", None)):
            raise TypeError("dispatcher must be an OutboundDispatcher, got %r"
                            % (type(dispatcher).__name__,))
        self.dispatcher = dispatcher

    async def __call__(self, make_request: Any, bot: Any, method: Any) -> Any:
        name = getattr(method, "__api_method__", "") or ""
        if name.lower() in UNPACED_METHODS:
            return await make_request(bot, method)
        key = chat_key(getattr(method, "chat_id", None))
        has_chat = key is not None
        if not has_chat:
            key = no_chat_key(name)
        flood = []  # aiogram's TelegramRetryAfter of the last attempt, if it was one

        async def send(sc):
            try:
                result = await make_request(bot, method)
            except TelegramRetryAfter as exc:
                flood[:] = [exc]
                raise retry_after(exc.retry_after, has_chat) from None
            flood.clear()
            return result

        # Nothing is awaited before asubmit queues the task: requests are
        # queued in the order the bot made them.
        try:
            return await self.dispatcher.asubmit(key, send)
        except RetryAfter:
            if flood:
                raise flood[0] from None
            raise
