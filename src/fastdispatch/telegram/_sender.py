"""Replies out: :class:`TelegramSender` and the errors it raises.

The sender is a thin translation layer and nothing more: it builds the
request, sends it through one keep-alive connection pool (urllib3, shared by
every dispatcher worker thread), and turns the answer into a result or a
typed error (the table is in the package docstring).  It never retries,
never sleeps and never reorders: the dispatcher owns order, pacing and
retries.
"""

import collections
import json
import logging
import re
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from .._errors import RetryAfter
from .._http import (
    DEFAULT_TIMEOUT, HttpTransportError, JsonHttpClient, PlatformError, PlatformNetworkError,
    check_seconds)
from .._netnum import parse_seconds
from ..platform import Capabilities, SenderInfo, SendResult

__all__ = ["TelegramSender", "PlatformError", "TelegramNetworkError", "MAX_RETRY_AFTER"]

_log = logging.getLogger("fastdispatch.telegram")

#: The longest ``retry_after`` a 429 is taken at (seconds; a day).  A
#: platform's number is outside input: larger (or infinite) becomes this,
#: which ``RetryPolicy.max_retry_after`` then refuses at once.
MAX_RETRY_AFTER = 86400.0
#: What a 429 without a usable ``retry_after`` (missing, negative, NaN, not
#: a number) waits.
DEFAULT_RETRY_AFTER = 1.0
_MAX_DESCRIPTION = 1000  # characters of a server's description kept in an error
_MAX_CHAT_ID = 1 << 63  # Bot API ids fit in 52 bits; anything past int64 is not an id
# What BotFather hands out: "<bot id>:<35 characters of [A-Za-z0-9_-]>" (the
# length is not checked: self-hosted Bot API servers and tests use others).
_TOKEN_SHAPE = re.compile(r"[0-9]{1,20}:[A-Za-z0-9_-]{1,256}", re.ASCII)


class TelegramNetworkError(PlatformNetworkError):
    """The request may not have reached Telegram, or its answer did not
    arrive: a ``5xx``, a refused or reset connection, the call's deadline,
    an answer cut off.  A ``ConnectionError``, so ``RetryPolicy()`` retries
    it.

    ``status`` is the HTTP status for a ``5xx``, else None; ``reason`` says
    what happened (without the token).  A send that failed this way *may*
    have been delivered (the answer was lost), so a retry can duplicate it:
    the one duplicate the dispatcher cannot rule out.
    """


# -- answers: every number in them is outside input ------------------------------

def _whole_int(value):
    return not isinstance(value, bool) and isinstance(value, int)


def retry_after_seconds(value: Any) -> float:
    """A 429's ``parameters.retry_after`` as seconds the dispatcher can wait:
    a finite number in ``[0, MAX_RETRY_AFTER]``.  Larger (a 400-digit
    integer, ``1e308``, infinity) is capped; anything else (missing,
    negative, NaN, a string, a bool) is ``DEFAULT_RETRY_AFTER``."""
    if not isinstance(value, (int, float)):  # the Bot API sends a JSON number
        return DEFAULT_RETRY_AFTER
    return parse_seconds(value, DEFAULT_RETRY_AFTER, cap=MAX_RETRY_AFTER)


def _migrate_target(parameters):
    """``parameters.migrate_to_chat_id`` if it is a supergroup's id, else None."""
    new = (parameters or {}).get("migrate_to_chat_id")
    if _whole_int(new) and -_MAX_CHAT_ID < new < 0:
        return new
    return None


def _decode(method, status, data):
    """Turn one HTTP answer into the result, or an exception to raise."""
    try:
        answer = json.loads(data)
    except (ValueError, RecursionError):  # not JSON, or an int past the digit limit
        answer = None
    if not isinstance(answer, dict) or "ok" not in answer:
        if status >= 500:
            return None, TelegramNetworkError(method, "HTTP %d (not a Bot API answer)" % status,
                                              status)
        return None, PlatformError(status, "not a Bot API answer (HTTP %d, %d bytes)"
                                   % (status, len(data)), None, method)
    if answer["ok"] is True:
        return answer.get("result"), None
    code = answer.get("error_code", status)
    if not _whole_int(code) or not 100 <= code <= 599:
        code = status
    description = answer.get("description")
    if not isinstance(description, str):
        description = "HTTP %d" % status
    elif len(description) > _MAX_DESCRIPTION:
        description = description[:_MAX_DESCRIPTION] + "..."
    parameters = answer.get("parameters")
    if not isinstance(parameters, dict):
        parameters = None
    if code == 429 or status == 429:
        return None, RetryAfter(retry_after_seconds((parameters or {}).get("retry_after")))
    if status >= 500 or code >= 500:
        return None, TelegramNetworkError(method, "HTTP %d: %s" % (code, description),
                                          code if code >= 500 else status)
    return None, PlatformError(code, description, parameters, method)


def _check_seconds(name, value):
    return check_seconds(name, value)


# Parameters that name a message of the chat: a call holding one is about
# that chat's messages, which stay in the old group when it migrates, so it
# must not be resent to the supergroup (message ids differ there).
_MESSAGE_REFERENCES = ("message_id", "message_ids", "reply_to_message_id", "reply_parameters",
                       "from_chat_id")


class TelegramSender:
    """Sends to the Telegram Bot API; a fastdispatch ``Sender``.

    ``TelegramSender(token, base_url="https://api.telegram.org", *,
    pool_size=100, timeout=30.0, connect_timeout=10.0, on_migrate=None,
    max_migrations=10000)``

    - ``pool_size``: keep-alive connections in the one pool all threads
      share; a thread that finds them all busy waits for one (within its
      deadline).  Make it at least the dispatcher's ``max_inflight``.
    - ``timeout``: the deadline, in seconds, of calls made without one of
      their own (the optional protocols, ``call``, and sends whose
      ``sc.remaining()`` is None).  Every call's deadline is total:
      connecting, sending and reading the whole answer.
    - ``connect_timeout``: at most this long to open a connection.
    - ``on_migrate(old_chat_id, new_chat_id)``: called (with ids as strings,
      on the worker thread that met it, once per group) when a group turned
      out to have become a supergroup; None logs a warning instead.  An
      exception in it is logged and ignored.
    - ``max_migrations``: how many old -> new chat ids are remembered (the
      oldest learned are forgotten first).

    Migration: Telegram answers ``400`` with ``parameters.migrate_to_chat_id``
    to a send to a group that became a supergroup.  The sender then sends
    the same request to the new id (within the same deadline), remembers the
    mapping, and sends every later call for the old id to the new one at
    once.  Calls that name a message of the old group (``deleteMessage``,
    ``editMessageText``, replies) are not resent: message ids differ in the
    supergroup; they raise the ``PlatformError`` (and the mapping is still
    learned).

    Thread-safe; one instance serves a whole bot.  :meth:`close` (or
    ``with``) closes the idle connections.
    """

    def __init__(self, token: str, base_url: str = "https://api.telegram.org", *,
                 pool_size: int = 100, timeout: float = DEFAULT_TIMEOUT,
                 connect_timeout: float = 10.0,
                 on_migrate: Optional[Callable[[str, str], Any]] = None,
                 max_migrations: int = 10000) -> None:
        if not isinstance(token, str):
            raise TypeError("token must be a str")
        if not _TOKEN_SHAPE.fullmatch(token):
            # Never the token itself in the message: it may be a real one, mistyped.
            raise ValueError("token is not a bot token: BotFather's tokens are the bot's "
                             "numeric id, a colon and letters, digits, '_' or '-' (like "
                             "'123456789:AAH...'); got %d characters that are not that"
                             % len(token))
        if on_migrate is not None and not callable(on_migrate):
            raise TypeError("on_migrate must be callable or None")
        if isinstance(max_migrations, bool) or not isinstance(max_migrations, int) \
                or max_migrations < 1:
            raise ValueError("max_migrations must be a positive int, got %r"
                             % (max_migrations,))
        self._token = token
        self._http = JsonHttpClient(base_url, pool_size=pool_size, timeout=timeout,
                                    connect_timeout=connect_timeout, secrets=(token,))
        self.base_url = self._http.base_url
        self.timeout = self._http.timeout
        self.connect_timeout = self._http.connect_timeout
        # The part before ":" is the bot's public user id; nothing else of
        # the token is ever shown.
        self.bot_id = token.partition(":")[0]
        self._prefix = "/bot%s/" % token
        self.on_migrate = on_migrate
        self.max_migrations = max_migrations
        self._migrations_lock = threading.Lock()  # guards _migrations
        self._migrations: "collections.OrderedDict[str, int]" = collections.OrderedDict()

    def __repr__(self) -> str:
        return "TelegramSender(base_url=%r, bot_id=%r)" % (self.base_url, self.bot_id)

    def __reduce__(self):
        raise TypeError("a TelegramSender cannot be pickled (it holds the bot token)")

    def close(self) -> None:
        """Close the pool's connections.  Final: later calls raise
        :class:`TelegramNetworkError`."""
        self._http.close()

    def __enter__(self) -> "TelegramSender":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- migrations ----------------------------------------------------------

    def migrated_chat_id(self, chat_id: Any) -> str:
        """Where calls for ``chat_id`` go: the supergroup it became, if this
        sender learned so, else ``chat_id`` itself (as a string)."""
        key = str(chat_id)
        with self._migrations_lock:
            new = self._migrations.get(key)
        return key if new is None else str(new)

    def migrations(self) -> Dict[str, str]:
        """Every remembered ``old -> new`` chat id (strings), oldest first."""
        with self._migrations_lock:
            return {old: str(new) for old, new in self._migrations.items()}

    def _learn_migration(self, old, new):
        with self._migrations_lock:
            known = self._migrations.get(old)
            self._migrations[old] = new
            self._migrations.move_to_end(old)
            while len(self._migrations) > self.max_migrations:
                self._migrations.popitem(last=False)
        if known == new:
            return
        hook = self.on_migrate
        if hook is None:
            _log.warning("chat %s became the supergroup %s: later messages to it go there",
                         old, new)
            return
        try:
            hook(old, str(new))
        except Exception:  # user code: logged, never into the send
            _log.exception("on_migrate(%r, %r) raised", old, str(new))

    # -- the one way out ---------------------------------------------------

    def call(self, method: str, params: Optional[Dict[str, Any]] = None, *,
             timeout: Optional[float] = None) -> Any:
        """Call any Bot API method with JSON ``params``; return its
        ``result``, or raise ``RetryAfter`` / :class:`TelegramNetworkError` /
        :class:`PlatformError` as described in the package docstring.  The
        whole call, a resend after a migration included, ends within
        ``timeout`` seconds (default: the sender's ``timeout``)."""
        t = self.timeout if timeout is None else check_seconds("timeout", timeout)
        deadline = time.monotonic() + t
        params = dict(params or {})
        follows = "chat_id" in params and not any(k in params for k in _MESSAGE_REFERENCES)
        if "chat_id" in params:
            with self._migrations_lock:
                new = self._migrations.get(str(params["chat_id"]))
            if new is not None and follows:
                params["chat_id"] = new
        for _ in range(3):  # a migration is followed at most twice
            result, err = self._call_once(method, params, deadline - time.monotonic())
            if err is None:
                return result
            new = _migrate_target(err.parameters) if isinstance(err, PlatformError) else None
            if new is None or "chat_id" not in params or str(new) == str(params["chat_id"]):
                raise err
            self._learn_migration(str(params["chat_id"]), new)
            if not follows:
                raise err
            params["chat_id"] = new
            if deadline - time.monotonic() <= 0:
                raise TelegramNetworkError(method, "the deadline passed before the resend to "
                                           "the supergroup %s" % new)
        raise err

    def _call_once(self, method, params, timeout):
        err = None
        try:
            answer = self._http.request("POST", self._prefix + method, json=params,
                                        timeout=timeout)
        except HttpTransportError as exc:
            err = TelegramNetworkError(method, exc.reason)
        if err is not None:
            return None, err
        return _decode(method, answer.status, answer.data)

    # -- Sender ------------------------------------------------------------

    def send(self, sc: Any, request: Any) -> SendResult:
        """``sendMessage`` to ``request.target.id``, all within
        ``sc.remaining()``.  Returns ``SendResult(message_id, raw=result)``."""
        remaining = sc.remaining()
        if remaining is not None and remaining <= 0:
            sc.check()
        result = self.call("sendMessage", {"chat_id": request.target.id,
                                           "text": request.message.text},
                           timeout=remaining)
        message_id = result.get("message_id") if isinstance(result, dict) else None
        return SendResult(message_id=str(message_id) if _whole_int(message_id) else "",
                          raw=result)

    # -- the optional protocols ---------------------------------------------

    def capabilities(self) -> Capabilities:
        """What this sender can do beyond ``send``: delete, typing, group
        members (administrators), mute.  Messages go out as plain text."""
        return Capabilities(delete_message=True, typing=True, group_members=True,
                            mute=True, markdown=False, embeds=False)

    def delete_message(self, chat_id: str, message_id: str) -> bool:
        """``deleteMessage``; True on success."""
        return bool(self.call("deleteMessage", {"chat_id": chat_id,
                                                "message_id": int(message_id)}))

    def send_typing(self, chat_id: str) -> bool:
        """``sendChatAction`` with ``action="typing"`` (shown for ~5 s)."""
        return bool(self.call("sendChatAction", {"chat_id": chat_id, "action": "typing"}))

    def get_group_members(self, chat_id: str) -> List[SenderInfo]:
        """The group's administrators (``getChatAdministrators``): the Bot
        API cannot list every member of a group."""
        result = self.call("getChatAdministrators", {"chat_id": chat_id})
        members = []
        for entry in result if isinstance(result, list) else ():
            user = entry.get("user") if isinstance(entry, dict) else None
            if isinstance(user, dict) and "id" in user:
                members.append(SenderInfo(str(user["id"]), _display_name(user)))
        return members

    def mute(self, chat_id: str, user_id: str, seconds: float) -> bool:
        """``restrictChatMember``: the user may send nothing for ``seconds``.
        Telegram treats less than 30 s as "forever", so shorter mutes are
        made 30 s long; more than 366 days is forever."""
        seconds = _check_seconds("seconds", seconds)
        until = int(time.time() + max(30.0, seconds)) + 1
        permissions = {name: False for name in (
            "can_send_messages", "can_send_audios", "can_send_documents",
            "can_send_photos", "can_send_videos", "can_send_video_notes",
            "can_send_voice_notes", "can_send_polls", "can_send_other_messages",
            "can_add_web_page_previews")}
        return bool(self.call("restrictChatMember", {
            "chat_id": chat_id, "user_id": int(user_id), "until_date": until,
            "permissions": permissions}))

    def get_me(self) -> Dict[str, Any]:
        """``getMe``: the bot's own user (a cheap check of the token)."""
        return self.call("getMe")

    # -- for TelegramPoller: a connection of its own, which stop() can cut --

    def _connect(self, timeout):
        return self._http.connect(timeout)

    def _call_on(self, conn, method, params, timeout):
        """Like :meth:`call`, on a connection of the caller's (not the pool),
        all within ``timeout``."""
        err = None
        try:
            answer = self._http.request_on(conn, "POST", self._prefix + method, json=params,
                                           timeout=timeout)
        except HttpTransportError as exc:
            err = TelegramNetworkError(method, exc.reason)
        if err is not None:
            raise err
        result, err = _decode(method, answer.status, answer.data)
        if err is not None:
            raise err
        return result


def _display_name(user):
    name = " ".join(str(user[k]) for k in ("first_name", "last_name")
                    if isinstance(user.get(k), str) and user[k])
    return name or (user.get("username") if isinstance(user.get("username"), str) else "") or ""


