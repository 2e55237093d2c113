"""Pacing and retry configuration: ``RateLimit``, ``Pacing``, ``RetryPolicy``.

These are plain, immutable values checked when they are made; the work they
describe is done inside the dispatcher core (``_ringbuf.pyx`` and its twin),
where a chat that may not start yet is parked on the timer thread's wake-up
schedule instead of holding a worker.
https://github.com/fastdispatch/fastdispatch/blob/main/docs/pacing.md explains the
choices: why a sliding window and not a token bucket, and how a
``RetryAfter`` pauses one chat (or, with ``scope="global"``, all of them)
without reordering anything.
"""

import math
import numbers
import random
import threading

from ._errors import RetryAfter

__all__ = ["RateLimit", "Pacing", "RetryPolicy"]


def _positive_seconds(name, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("%s must be a number of seconds, got %r" % (name, type(value).__name__))
    value = float(value)
    if math.isnan(value) or math.isinf(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError("%s must be a %s finite number of seconds, got %r"
                         % (name, "non-negative" if allow_zero else "positive", value))
    if value > threading.TIMEOUT_MAX:
        # Every wait the dispatcher computes from it must fit a lock's wait.
        raise ValueError("%s must be at most threading.TIMEOUT_MAX (%g) seconds, got %r"
                         % (name, threading.TIMEOUT_MAX, value))
    return value


class RateLimit:
    """At most ``count`` task starts in any window of ``per`` seconds.

    A sliding window, the strictest reading: ``RateLimit(20, per=60)`` never
    lets 21 starts fall within one minute, however they are spread.  Every
    attempt of a task counts as a start.  ``count`` is an int >= 1 and
    ``per`` a finite number of seconds > 0.
    """

    __slots__ = ("count", "per")

    def __init__(self, count, per=1.0):
        if isinstance(count, bool) or not isinstance(count, numbers.Integral):
            raise TypeError("count must be an int, got %r" % (type(count).__name__,))
        if count < 1:
            raise ValueError("count must be at least 1, got %r" % (count,))
        if count > 1_000_000:
            raise ValueError("count must be at most 1000000, got %r" % (count,))
        object.__setattr__(self, "count", int(count))
        object.__setattr__(self, "per", _positive_seconds("per", per))

    def __setattr__(self, name, value):
        raise AttributeError("RateLimit is immutable")

    def __eq__(self, other):
        if not isinstance(other, RateLimit):
            return NotImplemented
        return self.count == other.count and self.per == other.per

    def __hash__(self):
        return hash((RateLimit, self.count, self.per))

    def __repr__(self):
        return "RateLimit(%d, per=%r)" % (self.count, self.per)

    def __reduce__(self):
        return (RateLimit, (self.count, self.per))


def _check_limit(name, value):
    if value is not None and not isinstance(value, RateLimit):
        raise TypeError("%s must be a RateLimit or None, got %r" % (name, type(value).__name__))
    return value


def _telegram_is_group(chat_id):
    # Telegram's group and supergroup ids are negative; a ChatInfo says so
    # itself.
    if isinstance(chat_id, bool):
        return False
    if isinstance(chat_id, int):
        return chat_id < 0
    if isinstance(chat_id, str):
        return chat_id[:1] == "-" and chat_id[1:].isdigit()
    return getattr(chat_id, "is_group", False) is True


#: Seconds added to each of ``Pacing.telegram()``'s windows (see there).
_TELEGRAM_MARGIN = 0.05


class _TelegramGroups:
    """``limit_for`` of ``Pacing.telegram()``: groups get their own limit."""

    __slots__ = ("group_limit",)

    def __init__(self, group_limit):
        self.group_limit = group_limit

    def __call__(self, chat_id):
        return self.group_limit if _telegram_is_group(chat_id) else None

    def __repr__(self):
        return "<telegram groups: %r>" % (self.group_limit,)


class Pacing:
    """How fast the dispatcher may start tasks.

    - ``global_limit``: a :class:`RateLimit` over all chats together
      (a bot-wide limit), or None.
    - ``chat_limit``: the default :class:`RateLimit` of each chat, or None.
    - ``limit_for``: ``callable(chat_id) -> RateLimit | None``, a chat's own
      limit (None: ``chat_limit``).  It is called once when a chat starts
      sending after a quiet spell, outside every dispatcher lock; if it
      raises or returns something else than a RateLimit or None, that
      chat's task fails with a ``TypeError`` saying so, and the dispatcher
      goes on.

    When the global limit is the bottleneck, ready chats take turns: a chat
    with one message is not stuck behind a chat with a thousand.
    """

    __slots__ = ("global_limit", "chat_limit", "limit_for")

    def __init__(self, global_limit=None, chat_limit=None, limit_for=None):
        object.__setattr__(self, "global_limit", _check_limit("global_limit", global_limit))
        object.__setattr__(self, "chat_limit", _check_limit("chat_limit", chat_limit))
        if limit_for is not None and not callable(limit_for):
            raise TypeError("limit_for must be callable or None, got %r"
                            % (type(limit_for).__name__,))
        object.__setattr__(self, "limit_for", limit_for)

    def __setattr__(self, name, value):
        raise AttributeError("Pacing is immutable")

    @classmethod
    def telegram(cls, broadcast=None, *, speedup=1.0, margin=_TELEGRAM_MARGIN):
        """Telegram's limits: private chats 1/s, groups 20/min, bot-wide 30/s.

        A chat is a group when its id is a negative int, the string of one,
        or a ``ChatInfo`` with ``is_group=True``.  ``broadcast=N`` raises the
        bot-wide limit to N/s (Telegram's paid broadcasts, up to 1000/s).
        ``speedup=N`` makes every window N times shorter (the limits of
        ``fastdispatch.testing.telegram_limits(N)``, for a local server).

        ``margin`` (seconds, default 0.05) is added to every window:
        Telegram counts a message when it arrives, the dispatcher when it
        starts, and the time between the two varies from one request to the
        next (the network, the connection pool, the bot's own busy event
        loop); a window exactly as long as Telegram's lets a request that
        left late be followed by one that left on time and arrives too
        early (a 429, which costs its chat a whole second).  The margin is
        not scaled by ``speedup``: the jitter it covers is the same whatever
        the limits.  It costs 5 % of a private chat's rate, 0.1 % of a
        group's, and 9 % of the bot-wide rate: that limit is kept as 15
        messages per half second (plus the margin) rather than 30 per
        second, so that no burst of 30 leaves at once.  A group's window
        (room for a burst of 20) counts each start from its answer instead,
        when Telegram has surely counted it: a loaded bot can take longer
        than any margin to put a request on the wire.
        """
        if broadcast is not None and (isinstance(broadcast, bool) or not isinstance(
                broadcast, numbers.Integral)):
            raise TypeError("broadcast must be an int (messages per second) or None, got %r"
                            % (type(broadcast).__name__,))
        if broadcast is not None and not 1 <= broadcast <= 1_000_000:
            raise ValueError("broadcast must be between 1 and 1000000 messages per second, "
                             "got %r" % (broadcast,))
        if isinstance(speedup, bool) or not isinstance(speedup, numbers.Real) or not (
                0 < speedup < math.inf):
            raise (TypeError if isinstance(speedup, bool) or not isinstance(
                speedup, numbers.Real) else ValueError)(
                "speedup must be a positive finite number, got %r" % (speedup,))
        margin = _positive_seconds("margin", margin, allow_zero=True)
        speedup = float(speedup)

        def window(count, seconds):
            return RateLimit(count, per=seconds / speedup + margin)

        # Bot-wide: Telegram's 30 per second as 15 per half second (never
        # more than 30 in any second): a burst of 30 requests started at
        # once leaves a busy event loop over tens of milliseconds, enough
        # for the next burst to overtake its tail at the server.
        bot_wide = window(15, 0.5) if broadcast is None else window(int(broadcast), 1.0)
        return cls(global_limit=bot_wide,
                   chat_limit=window(1, 1.0),
                   limit_for=_TelegramGroups(window(20, 60.0)))

    @classmethod
    def discord(cls):
        """Discord's limits: bot-wide 50 requests/s; nothing per channel.

        Discord does not publish its per-route limits ("rate limits should
        not be hard coded into your app"): it announces each bucket's
        budget on every answer, which the sender hands to the dispatcher
        with ``sc.report_limit`` (see
        https://github.com/fastdispatch/fastdispatch/blob/main/docs/pacing.md).
        """
        return cls(global_limit=RateLimit(50, per=1.0))

    @classmethod
    def onebot(cls):
        """OneBot v11 (NapCat, Lagrange.OneBot, LLOneBot, go-cqhttp):
        1 message/s per chat, 2/s bot-wide.

        QQ publishes no limit for these accounts; its risk control mutes or
        bans one that sends too fast.  The numbers are go-cqhttp's own
        limiter: its ``rate-limit`` default of one token a second with a
        bucket of one, and the 500 ms queue of its ``_rate_limited``
        actions (the sources are listed in https://github.com/fastdispatch/fastdispatch/blob/main/docs/onebot.md).
        """
        return cls(global_limit=RateLimit(2, per=1.0), chat_limit=RateLimit(1, per=1.0))

    @classmethod
    def qq(cls):
        """The QQ official bot API: 5 messages/s per chat (the published
        limit of a guild channel); nothing bot-wide, where QQ answers
        ``22009`` instead (the sender makes it a wait of that chat).  The
        passive-reply rules (a window, 5 replies per message) are the
        sender's, not pacing's.
        """
        return cls(chat_limit=RateLimit(5, per=1.0))

    def __repr__(self):
        return "Pacing(global_limit=%r, chat_limit=%r, limit_for=%r)" % (
            self.global_limit, self.chat_limit, self.limit_for)


class RetryPolicy:
    """Which failed tasks run again, how often and after how long.

    - ``max_attempts``: attempts of one task in all (the first included),
      whatever made it retry (``RetryAfter`` or ``retry_on``).
    - ``backoff``, ``max_backoff``: a ``retry_on`` error waits a random time
      in ``[0, min(max_backoff, backoff * 2 ** (attempt - 1))]`` ("full
      jitter") before the next attempt.
    - ``max_retry_after``: a ``RetryAfter`` asking for longer fails the task
      at once with that ``RetryAfter`` (a bot is not frozen for hours).
    - ``retry_on``: the exception classes retried with backoff (a tuple).

    A retried task runs again before any later task of its chat.
    """

    __slots__ = ("max_attempts", "backoff", "max_backoff", "max_retry_after", "retry_on")

    def __init__(self, max_attempts=5, backoff=0.5, max_backoff=30.0,
                 max_retry_after=120.0, retry_on=(ConnectionError,)):
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, numbers.Integral):
            raise TypeError("max_attempts must be an int, got %r"
                            % (type(max_attempts).__name__,))
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1, got %r" % (max_attempts,))
        backoff = _positive_seconds("backoff", backoff, allow_zero=True)
        max_backoff = _positive_seconds("max_backoff", max_backoff, allow_zero=True)
        max_retry_after = _positive_seconds("max_retry_after", max_retry_after, allow_zero=True)
        if isinstance(retry_on, type):
            retry_on = (retry_on,)
        if not isinstance(retry_on, (tuple, list)) or not all(
                isinstance(c, type) and issubclass(c, BaseException) for c in retry_on):
            raise TypeError("retry_on must be a tuple of exception classes, got %r"
                            % (retry_on,))
        object.__setattr__(self, "max_attempts", int(max_attempts))
        object.__setattr__(self, "backoff", backoff)
        object.__setattr__(self, "max_backoff", max_backoff)
        object.__setattr__(self, "max_retry_after", max_retry_after)
        object.__setattr__(self, "retry_on", tuple(retry_on))

    def __setattr__(self, name, value):
        raise AttributeError("RetryPolicy is immutable")

    def backoff_delay(self, attempt, _random=random.random):
        """The wait before attempt ``attempt + 1`` after a ``retry_on`` error."""
        cap = self.backoff * (2.0 ** min(attempt - 1, 60))
        if cap > self.max_backoff:
            cap = self.max_backoff
        return _random() * cap

    def __repr__(self):
        return ("RetryPolicy(max_attempts=%d, backoff=%r, max_backoff=%r, "
                "max_retry_after=%r, retry_on=%r)" % (
                    self.max_attempts, self.backoff, self.max_backoff,
                    self.max_retry_after, self.retry_on))


def _retry_plan(error, attempt, retry):
    """After ``error``, when may its task run again (G13, docs/guarantees.md).

    The one place where a retry is decided, for both cores: returns
    ``(delay, is_global, refused)``, or None when the task is not retried.
    ``is_global``: a ``RetryAfter(scope="global")``, every chat waits;
    ``refused``: the platform turned the attempt away (a ``RetryAfter``), so
    its start does not count against the chat's window.  ``retry`` is the
    dispatcher's ``RetryPolicy`` or None (then only a ``RetryAfter`` of 0
    seconds is retried).  ``error`` is user code (a ``RetryAfter`` subclass
    may carry anything in ``seconds``, a ``retry_on`` class may have a
    hostile ``__instancecheck__``): what this raises fails the task, never
    the worker that asked.
    """
    if isinstance(error, RetryAfter):
        seconds = error.seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError("RetryAfter.seconds must be a number, got %r"
                            % (type(seconds).__name__,))
        try:
            delay = float(seconds)
        except OverflowError:
            delay = math.inf  # an int too large for a float: longer than any cap
        if delay != delay or delay < 0:
            raise ValueError("RetryAfter.seconds must be >= 0, got %r" % (delay,))
        if delay > (retry.max_retry_after if retry is not None else 0.0):
            return None
        scope = error.scope
        return delay, type(scope) is str and scope == "global", True
    if retry is not None and retry.retry_on and isinstance(error, retry.retry_on):
        return retry.backoff_delay(attempt), False, False
    return None


# The largest learned budget kept: more than any platform announces.
_MAX_REMAINING = 1 << 62


def _checked_report(remaining, reset_after, bucket, scope):
    # The values of a report_limit call, checked and made plain, for both
    # cores    # (an int or float subclass is read as the exact int or float it holds,
    # a str subclass as its exact str: nothing user-defined runs past this
    # point, nor in the limiter's lock or on the timer).  Raises in the task.
    if type(remaining) is not int:
        if isinstance(remaining, bool) or not isinstance(remaining, int):
            raise TypeError("report_limit: remaining must be an int, got %s"
                            % (type(remaining).__name__,))
        remaining = int.__int__(remaining)
    if remaining < 0:
        raise ValueError("report_limit: remaining must be >= 0, got %d" % (remaining,))
    if remaining > _MAX_REMAINING:
        remaining = _MAX_REMAINING  # the compiled core keeps a C integer
    if type(reset_after) is float:
        delay = reset_after
    elif type(reset_after) is int or (isinstance(reset_after, int)
                                      and not isinstance(reset_after, bool)):
        try:
            delay = int.__float__(reset_after)
        except OverflowError:
            delay = math.inf
    elif isinstance(reset_after, float):
        delay = float.__float__(reset_after)
    else:
        raise TypeError("report_limit: reset_after must be a number of seconds, got %s"
                        % (type(reset_after).__name__,))
    if delay != delay or delay < 0 or delay > threading.TIMEOUT_MAX:
        raise ValueError("report_limit: reset_after must be >= 0 and at most "
                         "threading.TIMEOUT_MAX (%r), got %r" % (threading.TIMEOUT_MAX, delay))
    if bucket is not None:
        if type(bucket) is not str:
            if not isinstance(bucket, str):
                raise TypeError("report_limit: bucket must be a str or None, got %s"
                                % (type(bucket).__name__,))
            bucket = str.__str__(bucket)
        if not bucket:
            raise ValueError("report_limit: bucket must not be empty")
    if type(scope) is not str:
        if not isinstance(scope, str):
            raise TypeError("report_limit: scope must be 'chat' or 'global', got %s"
                            % (type(scope).__name__,))
        scope = str.__str__(scope)
    if scope == "chat":
        is_global = False
    elif scope == "global":
        is_global = True
    else:
        raise ValueError("report_limit: scope must be 'chat' or 'global', got %r" % (scope,))
    return remaining, delay, bucket, is_global
