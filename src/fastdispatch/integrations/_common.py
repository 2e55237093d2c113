"""What the three plug-ins share: which dispatcher chat a Bot API request
belongs to, how a library's flood error becomes a ``RetryAfter``, the
dispatcher a plug-in makes when it is given none, and the re-entrant rule
(a request a task makes for its own chat is that task's own send).

Kept apart from the modules that import a library, so that each of them is
only the translation its library needs (a platform adapter is a thin
layer: the dispatcher owns order, pacing and retries).
"""

import datetime
import logging
import math

from .._errors import RetryAfter
from .._netnum import parse_int

__all__ = ["DEFAULT", "UNPACED_METHODS", "astop_and_report", "chat_key", "check_dispatcher",
           "check_timeout", "is_own_send", "make_dispatcher", "no_chat_key", "retry_after",
           "seconds_of", "stop_and_report"]

logger = logging.getLogger("fastdispatch.integrations")

#: "Not given": ``pacing``/``retry`` of a plug-in that makes its dispatcher.
DEFAULT = type("_Default", (), {"__repr__": lambda self: "<default>"})()

#: Methods that are never delayed: a long poll must not wait behind sends
#: (it is how the bot hears about the chats it must answer).
UNPACED_METHODS = frozenset(("getupdates",))

#: A 429 with no usable ``retry_after`` waits this long (seconds).
DEFAULT_RETRY_AFTER = 1.0


class _NoChat:
    """The dispatcher key of one request that names no chat.

    A fresh one per request: the request is its "chat"'s only task, so no
    chat limit ever delays it (a fresh window has room) and only the
    bot-wide limit applies; requests without a chat are not ordered among
    themselves (they were not made for one conversation).  ``is_group`` is
    False for ``Pacing.telegram()``'s group rule.
    """

    __slots__ = ("method",)
    is_group = False

    def __init__(self, method):
        self.method = method

    def __repr__(self):
        return "<no chat: %s>" % (self.method,)


def chat_key(chat_id):
    """The dispatcher chat of a request's ``chat_id`` (None: it names none).

    The same chat is one key however the library spelled it: an int, or the
    string of one (pyTelegramBotAPI sends ``"123"``), is the int; a
    ``@username`` stays a string.
    """
    if chat_id is None or chat_id == "" or isinstance(chat_id, bool):
        return None
    if isinstance(chat_id, int):
        return int(chat_id)
    if isinstance(chat_id, str):
        text = chat_id.strip()
        number = parse_int(text, signed=True)  # ASCII digits only: "²" stays a name
        return text if number is None else number
    return chat_id


def no_chat_key(method):
    """A fresh key for one request that names no chat (see :class:`_NoChat`)."""
    return _NoChat(method)


def seconds_of(value):
    """A library's ``retry_after`` as seconds: an int, a float or a
    ``datetime.timedelta`` (python-telegram-bot 22.2+); anything unusable
    (None, negative, NaN, not a number) is ``DEFAULT_RETRY_AFTER``."""
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return DEFAULT_RETRY_AFTER
    value = float(value)
    if not 0 <= value < math.inf:
        return DEFAULT_RETRY_AFTER
    return value


def retry_after(value, has_chat):
    """The ``RetryAfter`` a library's flood error becomes: a wait of the
    request's chat, or of the bot-wide budget for a request without one."""
    return RetryAfter(seconds_of(value), scope="chat" if has_chat else "global")


def check_dispatcher(dispatcher, method, pacing=DEFAULT, retry=DEFAULT):
    """The dispatcher a plug-in was given, checked (None: it makes its own).

    ``pacing`` and ``retry`` configure the dispatcher a plug-in makes; with
    a given one they are an error (it keeps its own configuration)."""
    if dispatcher is None:
        return None
    if pacing is not DEFAULT or retry is not DEFAULT:
        raise TypeError("pacing and retry configure the dispatcher the plug-in makes; "
                        "a given dispatcher keeps its own")
    if not callable(getattr(dispatcher, method, None)):
        raise TypeError("dispatcher must be an OutboundDispatcher, got %r"
                        % (type(dispatcher).__name__,))
    return dispatcher


def check_timeout(name, value):
    """A plug-in's ``shutdown_timeout``: seconds >= 0, or None (no limit)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0 <= value < math.inf):
        raise ValueError("%s must be a non-negative number of seconds or None, got %r"
                         % (name, value))
    return value


def make_dispatcher(pacing=DEFAULT, retry=DEFAULT):
    """The dispatcher of a plug-in given none: Telegram's limits
    (``Pacing.telegram()``) and retries (``RetryPolicy()``) unless told
    otherwise."""
    from .. import OutboundDispatcher
    from ..pacing import Pacing, RetryPolicy

    return OutboundDispatcher(pacing=Pacing.telegram() if pacing is DEFAULT else pacing,
                              retry=RetryPolicy() if retry is DEFAULT else retry)


def is_own_send(dispatcher, key):
    """True when the code making this request runs inside a task of
    ``dispatcher`` for the chat ``key``: the request is that task's own
    send, made at once (queued behind the task, it would wait for the task
    that waits for it)."""
    running = dispatcher.running_chat()
    return running is not None and type(running) is type(key) and running == key


def _ended(stats):
    return (stats.completed + stats.failed + stats.discarded + stats.cancelled
            + stats.timed_out)


def stop_and_report(dispatcher, timeout, shut_down):
    """Drain ``dispatcher`` (and shut it down when ``shut_down``) for up
    to ``timeout`` seconds, from a thread; log what was sent (INFO) and,
    if the time ran out, what was left (WARNING).  True if nothing was."""
    before = dispatcher.stats()
    done = dispatcher.shutdown(timeout) if shut_down else dispatcher.drain(timeout)
    after = dispatcher.stats()
    sent, left = _ended(after) - _ended(before), after.submitted - _ended(after)
    if done:
        logger.info("drained: %d requests sent while stopping, none left", sent)
    else:
        logger.warning("stopped after %s s: %d requests sent while stopping, %d left",
                       timeout, sent, left)
    return done


async def astop_and_report(dispatcher, timeout, shut_down):
    """:func:`stop_and_report` from a coroutine: the waiting is done on a
    thread, so the event loop the queued coroutine sends need goes on."""
    import asyncio

    return await asyncio.get_running_loop().run_in_executor(
        None, stop_and_report, dispatcher, timeout, shut_down)
