"""NoneBot2: :func:`use_fastdispatch`, one line after the adapters are
registered, and every API call a bot makes goes through a fastdispatch
dispatcher.

NoneBot has no per-chat order, no send pacing, and cancels running handlers
on shutdown (their queued replies are lost).  Its one seam that sees every
call and its outcome is the adapter's ``_call_api(bot, api, **data)``
(``Bot.call_api`` runs the calling/called hooks around it; a calling hook
cannot report a failure without the call being made).  Here, for each
registered adapter:

- its ``_call_api`` is replaced on the adapter object by one that does
  ``await dispatcher.asubmit((bot.self_id, chat), task)``, the task calling
  the adapter's own ``_call_api`` on the bot's event loop (no thread is
  held while the call is in flight).  The chat is read from the call's
  parameters by adapter (OneBot: :func:`fastdispatch.onebot.chat_of`; QQ:
  ``group_openid``/``openid``/``channel_id``/``guild_id``; others:
  ``chat_id`` or ``channel_id``); a call that names none goes under a key
  of its own, so only the bot-wide limit applies to it;
- one dispatcher per adapter, paced for its platform
  (``Pacing.onebot()``, ``qq()``, ``telegram()``, ``discord()``), retrying
  nothing but a rate-limit answer (QQ ``22009`` and ``429``, any adapter's
  exception with a ``retry_after``): that chat waits and the call is made
  again before the chat's later ones; other chats go on;
- every other error reaches the caller as the adapter raised it
  (``ActionFailed``, ``NetworkError``...); a rate-limit answer with no
  attempt left reaches it as the adapter's own exception too;
- a shutdown hook (registered last, so NoneBot runs it first, while the
  adapters are still connected and the handlers still running) waits until
  no call is queued or in flight and no matcher is running, up to
  ``drain_timeout``, then logs what was sent and left
  (:attr:`FastDispatch.report`).  The adapters close after it.

Threads: none of its own; everything runs on NoneBot's event loop.  The
dispatchers' threads only hand tasks to that loop.
"""

import asyncio
import time
import weakref
from typing import Any, Dict, NamedTuple, Optional

from .. import OutboundDispatcher
from .._errors import RetryAfter
from ..onebot._sender import chat_of as _onebot_chat_of
from ..pacing import Pacing, RetryPolicy
from ._common import chat_key, no_chat_key

__all__ = ["use_fastdispatch", "FastDispatch", "DrainReport"]

_WRAPPED = "_fastdispatch_call_api"
_QQ_TARGETS = (("group_openid", "group"), ("openid", "c2c"), ("channel_id", "channel"),
               ("guild_id", "dms"))
#: QQ's "sending too fast" code, and the wait it becomes when the answer
#: names none (seconds).
_QQ_TOO_FAST = 22009
DEFAULT_RETRY_AFTER = 1.0


class DrainReport(NamedTuple):
    """What the shutdown drain did: ``sent`` calls finished during it,
    ``left`` still queued or in flight at its deadline (0: nothing lost),
    ``seconds`` it took."""

    sent: int
    left: int
    seconds: float


def default_pacing(adapter_name: str) -> Optional[Pacing]:
    """The pacing of an adapter's dispatcher, by the adapter's name."""
    name = adapter_name.lower()
    if "onebot" in name:
        return Pacing.onebot()
    if name == "qq" or name.startswith("qq"):
        return Pacing.qq()
    if "telegram" in name:
        return Pacing.telegram()
    if "discord" in name:
        return Pacing.discord()
    return None


def call_chat(adapter_name: str, api: str, data: Dict[str, Any]) -> Any:
    """The chat an adapter's API call is made for, or None."""
    name = adapter_name.lower()
    if "onebot" in name:
        return _onebot_chat_of(api, data)
    if name.startswith("qq"):
        if not api.startswith("post_") or not api.endswith(("_messages", "_files")):
            return None
        for param, kind in _QQ_TARGETS:
            value = data.get(param)
            if isinstance(value, str) and value:
                return (kind, value)
        return None
    for param in ("chat_id", "channel_id"):
        key = chat_key(data.get(param))
        if key is not None:
            return key
    return None


def _rate_limit_wait(exc: BaseException) -> Optional[float]:
    """Seconds to wait if ``exc`` is a rate-limit answer, else None."""
    name = type(exc).__name__
    code = getattr(exc, "code", None)
    if name == "RateLimitException" or (code == _QQ_TOO_FAST and not isinstance(code, bool)):
        return DEFAULT_RETRY_AFTER
    value = getattr(exc, "retry_after", None)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 86400:
        return float(value)
    return None


class FastDispatch:
    """What :func:`use_fastdispatch` installed: ``dispatchers`` (adapter
    name -> dispatcher) and, after the driver's shutdown, ``report``."""

    def __init__(self, drain_timeout: float) -> None:
        self.drain_timeout = drain_timeout
        self.dispatchers: Dict[str, Any] = {}
        self.report: Optional[DrainReport] = None
        self._matchers: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def _wrap(self, adapter, pacing, queue_size):
        name = adapter.get_name()
        d = OutboundDispatcher(pacing=pacing, retry=RetryPolicy(retry_on=()),
                               send_timeout=None, queue_size=queue_size)
        self.dispatchers[name] = d
        original = adapter._call_api

        async def _call_api(bot, api, **data):
            chat = call_chat(name, api, data)
            key = no_chat_key(api) if chat is None else (bot.self_id, chat)
            flood = []  # the adapter's rate-limit exception of the last attempt

            async def task(sc):
                try:
                    result = await original(bot, api, **data)
                except Exception as exc:
                    wait = _rate_limit_wait(exc)
                    if wait is None:
                        raise
                    flood[:] = [exc]
                    raise RetryAfter(wait, scope="global" if chat is None else "chat") \
                        from None
                flood.clear()
                return result

            if d.running_chat() == key:
                # Made by a call of this chat that is running (an adapter's
                # API that calls another): queued, it would wait for itself.
                return await original(bot, api, **data)
            # Nothing is awaited before asubmit queues the call: calls are
            # queued in the order the bot made them.  block=True: a chat
            # with queue_size calls waiting makes the handler wait for room,
            # never raises QueueFull into the bot.
            try:
                return await d.asubmit(key, task, block=True)
            except RetryAfter:
                if flood:
                    raise flood[0] from None
                raise

        setattr(_call_api, _WRAPPED, True)
        adapter._call_api = _call_api

    def _left(self):
        left = 0
        for d in self.dispatchers.values():
            s = d.stats()
            left += s.submitted - s.completed - s.failed - s.discarded - s.cancelled \
                - s.timed_out
        return left

    def _finished(self):
        return sum(s.completed + s.failed for s in (d.stats() for d in
                                                    self.dispatchers.values()))

    async def drain(self) -> DrainReport:
        """Wait until no call is queued or in flight and no matcher runs
        (twice in a row, 20 ms apart), up to ``drain_timeout``."""
        start = time.monotonic()
        deadline = start + self.drain_timeout
        finished = self._finished()
        quiet = 0
        while time.monotonic() < deadline:
            if self._left() or len(self._matchers):
                quiet = 0
            else:
                quiet += 1
                if quiet >= 2:
                    break
            await asyncio.sleep(0.02)
        report = DrainReport(self._finished() - finished, self._left(),
                             time.monotonic() - start)
        self.report = report
        from nonebot.log import logger
        if report.left:
            logger.warning("fastdispatch: shutdown drain sent %d calls in %.1f s; %d still "
                           "queued at the %g s deadline are dropped" % (
                               report.sent, report.seconds, report.left,
                               self.drain_timeout))
        else:
            logger.info("fastdispatch: shutdown drain sent %d calls in %.1f s; none left"
                        % (report.sent, report.seconds))
        return report


def use_fastdispatch(*, drain_timeout: float = 30.0,
                     pacing: Optional[Dict[str, Optional[Pacing]]] = None,
                     queue_size: int = 64) -> FastDispatch:
    """Send every API call of every registered adapter through fastdispatch
    (see the module docstring).  Call it once, after
    ``driver.register_adapter(...)``; calling it again wraps only adapters
    registered since.

    - ``drain_timeout``: seconds the driver's shutdown waits for queued
      calls (and handlers still running) before the adapters close.
    - ``pacing``: adapter name -> ``Pacing`` (or None: order only), over
      the defaults by platform.
    - ``queue_size``: calls one chat may have waiting; a handler making
      one more waits for room (it is never refused).
    """
    if isinstance(drain_timeout, bool) or not isinstance(drain_timeout, (int, float)) or \
            not 0 <= drain_timeout < float("inf"):
        raise ValueError("drain_timeout must be a finite number of seconds >= 0, got %r"
                         % (drain_timeout,))
    if pacing is not None and not isinstance(pacing, dict):
        raise TypeError("pacing must be a dict of adapter name -> Pacing, got %r"
                        % (type(pacing).__name__,))
    import nonebot
    from nonebot.message import run_postprocessor, run_preprocessor
    try:
        driver = nonebot.get_driver()
    except ValueError:
        raise RuntimeError("use_fastdispatch() must be called after nonebot.init() and "
                           "driver.register_adapter(...)") from None
    adapters = nonebot.get_adapters()
    if not adapters:
        raise RuntimeError("use_fastdispatch() found no adapter: call it after "
                           "driver.register_adapter(...), so that it can wrap them and "
                           "drain their sends before they close at shutdown")
    plugin = FastDispatch(float(drain_timeout))
    pacing = dict(pacing or {})
    for name, adapter in adapters.items():
        if getattr(adapter._call_api, _WRAPPED, False):
            continue
        plugin._wrap(adapter, pacing[name] if name in pacing else default_pacing(name),
                     queue_size)
    if not plugin.dispatchers:
        return plugin

    @run_preprocessor
    async def _running(matcher: nonebot.matcher.Matcher) -> None:
        plugin._matchers.add(matcher)

    @run_postprocessor
    async def _ran(matcher: nonebot.matcher.Matcher) -> None:
        plugin._matchers.discard(matcher)

    @driver.on_shutdown
    async def _drain() -> None:
        await plugin.drain()
        for d in plugin.dispatchers.values():
            d.close()

    return plugin
