"""What the three plug-ins share: which dispatcher chat a Bot API request
belongs to, and how a library's flood error becomes a ``RetryAfter``.

Kept apart from the modules that import a library, so that each of them is
only the translation its library needs (a platform adapter is a thin
layer: the dispatcher owns order, pacing and retries).
"""

import datetime
import math

from .._errors import RetryAfter
from .._netnum import parse_int

__all__ = ["UNPACED_METHODS", "chat_key", "no_chat_key", "retry_after", "seconds_of"]

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
