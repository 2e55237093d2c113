"""python-telegram-bot (>= 20): :class:`DispatcherRateLimiter`, a
``telegram.ext.BaseRateLimiter`` that sends every request through an
:class:`~fastdispatch.OutboundDispatcher` (SPEC §8.1).

PTB's documented extension point for "when is a request sent" is the rate
limiter: ``ExtBot._do_post`` hands every request but ``getUpdates`` to
``rate_limiter.process_request(callback, args, kwargs, endpoint, data,
rate_limit_args)``, which must call ``callback`` and return its result, and
may call it again after a ``telegram.error.RetryAfter``.  Here:

- a request whose ``data`` has a ``chat_id`` is ``await
  dispatcher.asubmit(chat, task)``: the task calls ``callback`` on the
  bot's event loop (no thread is held while the request is in flight), in
  the chat's order, one at a time, paced by the dispatcher's ``Pacing``;
- one without a ``chat_id`` (``getMe``, ``answerCallbackQuery``, ...) goes
  through the dispatcher under a key of its own: only the bot-wide limit
  applies;
- ``getUpdates`` is called at once (PTB never passes it here; the check is
  kept for a caller that does);
- PTB's ``RetryAfter`` raised by ``callback`` becomes fastdispatch's
  ``RetryAfter`` of that chat (bot-wide for a request without a chat): the
  chat waits, others go on, and the request is sent again before the
  chat's later ones, as the dispatcher's ``RetryPolicy`` allows.  When no
  attempt is left, the bot gets PTB's own ``RetryAfter`` from the last
  attempt; every other error of ``callback`` reaches it unchanged.

Life cycle: PTB calls ``initialize()`` when the bot (the application) is
initialized and ``shutdown()`` when it shuts down.  A limiter given a
dispatcher only uses it (the caller owns it, it may serve other bots); one
that made its own (``dispatcher=None``) makes it at ``initialize`` (again
after a ``shutdown``: an application may be initialized again) and shuts it
down at ``shutdown``, waiting for its sends on a thread so that the loop
they need keeps running.
"""

import asyncio
import warnings
from typing import Any, Callable, Coroutine, Dict, Optional

from telegram.error import RetryAfter as PTBRetryAfter
from telegram.ext import BaseRateLimiter

from .. import OutboundDispatcher
from .._errors import RetryAfter
from ..pacing import Pacing, RetryPolicy
from ._common import UNPACED_METHODS, chat_key, no_chat_key, retry_after

__all__ = ["DispatcherRateLimiter"]

_DEFAULT: Any = object()  # "not given": the dispatcher's own defaults below


def _retry_after_value(exc):
    # PTB 22.2+ warns on every read of RetryAfter.retry_after that it will
    # become a timedelta (it already is one with PTB_TIMEDELTA=1); both
    # forms are understood here, so the warning says nothing to the bot's
    # author.  No await inside: nothing else runs on this thread meanwhile.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return exc.retry_after


class DispatcherRateLimiter(BaseRateLimiter[Any]):
    """A PTB rate limiter that sends through a fastdispatch dispatcher.

    ``DispatcherRateLimiter(dispatcher=None, *, pacing=Pacing.telegram(),
    retry=RetryPolicy())``: give it the dispatcher the bot's other sends
    use, or let it make one with ``pacing`` and ``retry`` (these two only
    when it makes its own: a given dispatcher keeps its configuration).

    ``ApplicationBuilder().token(TOKEN).rate_limiter(DispatcherRateLimiter())``.
    ``rate_limit_args`` of PTB's methods are accepted and ignored.

    Costs: one ``asubmit`` per request (a dispatcher task, no thread).
    """

    __slots__ = ("_dispatcher", "_owned", "_pacing", "_retry")

    def __init__(self, dispatcher: Optional[OutboundDispatcher] = None, *,
                 pacing: Optional[Pacing] = _DEFAULT,
                 retry: Optional[RetryPolicy] = _DEFAULT) -> None:
        if dispatcher is not None and (pacing is not _DEFAULT or retry is not _DEFAULT):
            raise TypeError("pacing and retry configure the dispatcher the limiter makes; "
                            "a given dispatcher keeps its own")
        if dispatcher is not None and not callable(getattr(dispatcher, "asubmit", None)):
            raise TypeError("dispatcher must be an OutboundDispatcher, got %r"
                            % (type(dispatcher).__name__,))
        self._dispatcher = dispatcher
        self._owned = dispatcher is None
        self._pacing = Pacing.telegram() if pacing is _DEFAULT else pacing
        self._retry = RetryPolicy() if retry is _DEFAULT else retry

    @property
    def dispatcher(self) -> Optional[OutboundDispatcher]:
        """The dispatcher requests go through (None before ``initialize``
        when the limiter makes its own)."""
        return self._dispatcher

    def _live_dispatcher(self):
        # A request before initialize() makes the dispatcher; one during
        # shutdown() meets the closing one (DispatcherClosed), not a new one.
        d = self._dispatcher
        if d is None:
            d = self._dispatcher = OutboundDispatcher(pacing=self._pacing, retry=self._retry)
        return d

    async def initialize(self) -> None:
        """Make the limiter's own dispatcher (nothing for a given one)."""
        if self._owned and self._dispatcher is not None and self._dispatcher.closed:
            self._dispatcher = None
        if self._owned:
            self._live_dispatcher()

    async def shutdown(self) -> None:
        """Shut down the dispatcher the limiter made, after its sends (never
        a given one)."""
        d = self._dispatcher
        if not self._owned or d is None:
            return
        # shutdown() waits for the queued sends, which run on this loop: it
        # must wait on another thread while the loop goes on.
        await asyncio.get_running_loop().run_in_executor(None, d.shutdown)
        if self._dispatcher is d:
            self._dispatcher = None

    async def process_request(
        self,
        callback: Callable[..., Coroutine[Any, Any, Any]],
        args: Any,
        kwargs: Dict[str, Any],
        endpoint: str,
        data: Dict[str, Any],
        rate_limit_args: Any,
    ) -> Any:
        """Send one request through the dispatcher (see the module's docstring)."""
        if endpoint.lower() in UNPACED_METHODS:
            return await callback(*args, **kwargs)
        key = chat_key(data.get("chat_id"))
        has_chat = key is not None
        if not has_chat:
            key = no_chat_key(endpoint)
        flood = []  # PTB's RetryAfter of the last attempt, if it was one

        async def send(sc):
            try:
                result = await callback(*args, **kwargs)
            except PTBRetryAfter as exc:
                flood[:] = [exc]
                raise retry_after(_retry_after_value(exc), has_chat) from None
            flood.clear()
            return result

        # Nothing is awaited before asubmit queues the task: requests are
        # queued in the order the bot made them.
        try:
            return await self._live_dispatcher().asubmit(key, send)
        except RetryAfter:
            if flood:
                raise flood[0] from None
            raise
