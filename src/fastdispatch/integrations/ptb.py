"""python-telegram-bot (>= 20): :class:`DispatcherRateLimiter`, a
``telegram.ext.BaseRateLimiter`` that sends every request through an
:class:`~fastdispatch.OutboundDispatcher`.

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

A request never fails because its chat is busy: it waits for room in the
chat's queue (holding no thread), in the order it was made.  A request
made inside a task of the dispatcher for that task's own chat is that
task's own send: it goes out at once, never queued behind the task that
waits for it (requests for other chats queue as usual).

Moving from PTB's ``AIORateLimiter``: ``DispatcherRateLimiter`` accepts its
keyword names (``overall_max_rate``, ``overall_time_period``,
``group_max_rate``, ``group_time_period``, ``max_retries``) with the same
meaning, so the change is one word; private chats keep Telegram's limit of
one message a second.  Per-call ``rate_limit_args`` of the form
``{"max_retries": N}`` (what ``AIORateLimiter`` understands) are honoured;
any other key is ignored with one warning.

Life cycle: PTB calls ``initialize()`` when the bot (the application) is
initialized and ``shutdown()`` when it shuts down.  A limiter given a
dispatcher only uses it (the caller owns it, it may serve other bots); one
that made its own (``dispatcher=None``) makes it at ``initialize`` (again
after a ``shutdown``: an application may be initialized again) and shuts it
down at ``shutdown``: queued requests are sent, up to ``shutdown_timeout``
seconds, without blocking the event loop they need, and what was sent and
what was left is logged.
"""

import warnings
from typing import Any, Callable, Coroutine, Dict, Optional

from telegram.error import RetryAfter as PTBRetryAfter
from telegram.ext import BaseRateLimiter

from .._errors import RetryAfter
from ..pacing import _TELEGRAM_MARGIN, Pacing, RateLimit, RetryPolicy
from ._common import (DEFAULT, UNPACED_METHODS, chat_key, check_dispatcher, check_timeout,
                      is_own_send, make_dispatcher, no_chat_key, retry_after)

__all__ = ["DispatcherRateLimiter"]

#: ``AIORateLimiter``'s keyword names and defaults.
_AIORL_DEFAULTS = (("overall_max_rate", 30), ("overall_time_period", 1.0),
                   ("group_max_rate", 20), ("group_time_period", 60.0))


def _retry_after_value(exc):
    # PTB 22.2+ warns on every read of RetryAfter.retry_after that it will
    # become a timedelta (it already is one with PTB_TIMEDELTA=1); both
    # forms are understood here, so the warning says nothing to the bot's
    # author.  No await inside: nothing else runs on this thread meanwhile.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return exc.retry_after


def _rate(name_rate, rate, name_period, period):
    # AIORateLimiter's (max_rate, time_period) as a RateLimit, with the
    # margin of Pacing.telegram()'s windows; a rate of 0 (or a period of 0)
    # means "no limit", as there.
    for name, value in ((name_rate, rate), (name_period, period)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                0 <= value < float("inf")):
            raise ValueError("%s must be a non-negative number, got %r" % (name, value))
    if not rate or not period:
        return None
    if rate == int(rate):
        return RateLimit(int(rate), per=period + _TELEGRAM_MARGIN)
    return RateLimit(1, per=period / rate + _TELEGRAM_MARGIN)


class _Groups:
    """``limit_for`` with AIORateLimiter's group limit: a chat is a group
    as ``Pacing.telegram()`` tells them apart."""

    __slots__ = ("limit", "telegram")

    def __init__(self, limit):
        self.limit = limit
        self.telegram = Pacing.telegram().limit_for

    def __call__(self, chat_id):
        return self.limit if self.telegram(chat_id) is not None else None


def _aiorl_pacing(values):
    limits = dict(_AIORL_DEFAULTS)
    limits.update(values)
    group = _rate("group_max_rate", limits["group_max_rate"],
                  "group_time_period", limits["group_time_period"])
    return Pacing(global_limit=_rate("overall_max_rate", limits["overall_max_rate"],
                                     "overall_time_period", limits["overall_time_period"]),
                  chat_limit=Pacing.telegram().chat_limit,
                  limit_for=None if group is None else _Groups(group))


class DispatcherRateLimiter(BaseRateLimiter[Dict[str, Any]]):
    """A PTB rate limiter that sends through a fastdispatch dispatcher.

    ``DispatcherRateLimiter(dispatcher=None, *, pacing=Pacing.telegram(),
    retry=RetryPolicy(), shutdown_timeout=30.0)``: give it the dispatcher
    the bot's other sends use, or let it make one with ``pacing`` and
    ``retry`` (these two only when it makes its own: a given dispatcher
    keeps its configuration).  ``AIORateLimiter``'s keywords
    (``overall_max_rate=30, overall_time_period=1, group_max_rate=20,
    group_time_period=60, max_retries=0``) may stand for ``pacing`` and
    ``retry`` (``max_retries=N``: ``RetryPolicy(max_attempts=N + 1)``).

    ``ApplicationBuilder().token(TOKEN).rate_limiter(DispatcherRateLimiter())``.

    Costs: one ``asubmit`` per request (a dispatcher task, no thread).
    """

    __slots__ = ("_dispatcher", "_owned", "_pacing", "_retry", "_warned", "shutdown_timeout")

    def __init__(self, dispatcher: Any = None, *, pacing: Any = DEFAULT,
                 retry: Any = DEFAULT, shutdown_timeout: Optional[float] = 30.0,
                 overall_max_rate: Any = DEFAULT, overall_time_period: Any = DEFAULT,
                 group_max_rate: Any = DEFAULT, group_time_period: Any = DEFAULT,
                 max_retries: Any = DEFAULT) -> None:
        aiorl = {name: value for name, value in (
            ("overall_max_rate", overall_max_rate), ("overall_time_period", overall_time_period),
            ("group_max_rate", group_max_rate), ("group_time_period", group_time_period))
            if value is not DEFAULT}
        if aiorl:
            if pacing is not DEFAULT:
                raise TypeError("give pacing or %s, not both" % ", ".join(sorted(aiorl)))
            pacing = _aiorl_pacing(aiorl)
        if max_retries is not DEFAULT:
            if retry is not DEFAULT:
                raise TypeError("give retry or max_retries, not both")
            if isinstance(max_retries, bool) or not isinstance(max_retries, int) or (
                    max_retries < 0):
                raise ValueError("max_retries must be an int >= 0, got %r" % (max_retries,))
            retry = RetryPolicy(max_attempts=max_retries + 1)
        shutdown_timeout = check_timeout("shutdown_timeout", shutdown_timeout)
        self._dispatcher = check_dispatcher(dispatcher, "asubmit", pacing, retry)
        self._owned = dispatcher is None
        self._pacing, self._retry = pacing, retry
        self._warned = set()  # rate_limit_args keys already said to be ignored
        self.shutdown_timeout = shutdown_timeout

    @property
    def dispatcher(self) -> Any:
        """The dispatcher requests go through (None before ``initialize``
        when the limiter makes its own)."""
        return self._dispatcher

    def _live_dispatcher(self):
        # A request before initialize() makes the dispatcher; one during
        # shutdown() meets the closing one (DispatcherClosed), not a new one.
        d = self._dispatcher
        if d is None:
            d = self._dispatcher = make_dispatcher(self._pacing, self._retry)
        return d

    async def initialize(self) -> None:
        """Make the limiter's own dispatcher (nothing for a given one)."""
        if self._owned and self._dispatcher is not None and self._dispatcher.closed:
            self._dispatcher = None
        if self._owned:
            self._live_dispatcher()

    async def shutdown(self) -> None:
        """Shut down the dispatcher the limiter made, after its sends (up to
        ``shutdown_timeout`` seconds; never a given one)."""
        d = self._dispatcher
        if not self._owned or d is None:
            return
        await d.ashutdown(self.shutdown_timeout)
        if self._dispatcher is d:
            self._dispatcher = None

    def _max_retries(self, rate_limit_args):
        # AIORateLimiter's per-call {"max_retries": N}; other keys are said once.
        if not rate_limit_args:
            return None
        if not isinstance(rate_limit_args, dict):
            self._warn("rate_limit_args %r" % (type(rate_limit_args).__name__,))
            return None
        for key in rate_limit_args:
            if key != "max_retries":
                self._warn("rate_limit_args key %r" % (key,))
        value = rate_limit_args.get("max_retries")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            if "max_retries" in rate_limit_args:
                self._warn("rate_limit_args max_retries=%r" % (value,))
            return None
        return value

    def _warn(self, what):
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn("DispatcherRateLimiter ignores %s (it understands "
                          "{'max_retries': N}, an int >= 0)" % (what,), RuntimeWarning,
                          stacklevel=4)

    async def process_request(
        self,
        callback: Callable[..., Coroutine[Any, Any, Any]],
        args: Any,
        kwargs: Dict[str, Any],
        endpoint: str,
        data: Dict[str, Any],
        rate_limit_args: Optional[Dict[str, Any]],
    ) -> Any:
        """Send one request through the dispatcher (see the module's docstring)."""
        if endpoint.lower() in UNPACED_METHODS:
            return await callback(*args, **kwargs)
        dispatcher = self._live_dispatcher()
        key = chat_key(data.get("chat_id"))
        has_chat = key is not None
        if not has_chat:
            key = no_chat_key(endpoint)
        elif is_own_send(dispatcher, key):
            return await callback(*args, **kwargs)
        max_retries = self._max_retries(rate_limit_args)
        flood = []  # PTB's RetryAfter of the last attempt, if it was one

        async def send(sc):
            try:
                result = await callback(*args, **kwargs)
            except PTBRetryAfter as exc:
                if max_retries is not None and sc.attempt > max_retries:
                    raise  # this call's own retries are spent: PTB's error, as is
                flood[:] = [exc]
                raise retry_after(_retry_after_value(exc), has_chat) from None
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
