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
import threading
import time
import weakref
from typing import Any, Dict, List, Optional
from urllib.parse import urlsplit

try:
    import urllib3
except ImportError:  # pragma: no cover - depends on the installation
    raise ImportError("fastdispatch.telegram needs urllib3: pip install "
                      "'fastdispatch[telegram]'") from None
from urllib3.exceptions import HTTPError as _Urllib3Error

from .._errors import DispatcherError, RetryAfter
from ..platform import Capabilities, SenderInfo, SendResult

__all__ = ["TelegramSender", "PlatformError", "TelegramNetworkError"]

DEFAULT_TIMEOUT = 30.0  # seconds, for calls made without a SendContext
_JSON_HEADERS = {"Content-Type": "application/json", "Connection": "keep-alive"}


class PlatformError(DispatcherError):
    """Telegram answered ``ok: false`` with a status that retrying cannot fix
    (``400 Bad Request``, ``401``, ``403 Forbidden: bot was blocked by the
    user``, ...), or an answer that is not a Bot API answer at all.

    ``status`` is the ``error_code`` (the HTTP status), ``description`` the
    server's text, ``parameters`` its ``parameters`` object (e.g.
    ``migrate_to_chat_id``) or None, ``method`` the Bot API method.
    Not retried by the dispatcher.
    """

    def __init__(self, status, description, parameters=None, method=""):
        super().__init__(status, description)
        self.status = status
        self.description = description
        self.parameters = parameters
        self.method = method

    def __str__(self):
        return "%s: Telegram answered %s: %s" % (self.method or "Bot API", self.status,
                                                 self.description)

    def __reduce__(self):
        return (type(self), (self.status, self.description, self.parameters, self.method))


class TelegramNetworkError(ConnectionError):
    """The request may not have reached Telegram, or its answer did not
    arrive: a ``5xx``, a refused or reset connection, a timeout, an answer
    cut off.  A ``ConnectionError``, so ``RetryPolicy()`` retries it.

    ``status`` is the HTTP status for a ``5xx``, else None; ``reason`` says
    what happened (without the token).  A send that failed this way *may*
    have been delivered (the answer was lost), so a retry can duplicate it:
    the one duplicate the dispatcher cannot rule out.
    """

    def __init__(self, method, reason, status=None):
        super().__init__(reason)
        self.method = method
        self.reason = reason
        self.status = status

    def __str__(self):
        return "%s: %s" % (self.method, self.reason)

    def __reduce__(self):
        return (type(self), (self.method, self.reason, self.status))


# -- the token never reaches a log -------------------------------------------

class _RedactTokens(logging.Filter):
    """On urllib3's logger: replace every live sender's token by ``<token>``."""

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()  # guards tokens
        self.tokens = collections.Counter()  # token -> live senders holding it

    def remember(self, sender, token):
        with self._lock:
            self.tokens[token] += 1
        weakref.finalize(sender, self._forget, token)

    def _forget(self, token):
        with self._lock:
            self.tokens[token] -= 1
            if self.tokens[token] <= 0:
                del self.tokens[token]

    def filter(self, record):
        with self._lock:
            tokens = list(self.tokens)
        if not tokens:
            return True
        try:
            msg = record.getMessage()
        except Exception:  # a broken record is not ours to fix
            return True
        if any(t in msg for t in tokens):
            for t in tokens:
                msg = msg.replace(t, "<token>")
            record.msg, record.args = msg, None
        return True


_redact = _RedactTokens()
logging.getLogger("urllib3.connectionpool").addFilter(_redact)
logging.getLogger("urllib3.connection").addFilter(_redact)


# -- answers -----------------------------------------------------------------

def _decode(method, status, data):
    """Turn one HTTP answer into the result, or an exception to raise."""
    try:
        answer = json.loads(data)
    except ValueError:
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
    if isinstance(code, bool) or not isinstance(code, int):
        code = status
    description = answer.get("description")
    if not isinstance(description, str):
        description = "HTTP %d" % status
    parameters = answer.get("parameters")
    if not isinstance(parameters, dict):
        parameters = None
    if code == 429 or status == 429:
        seconds = (parameters or {}).get("retry_after")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
                0 <= seconds < float("inf")):
            seconds = 1.0
        return None, RetryAfter(seconds)
    if status >= 500 or code >= 500:
        return None, TelegramNetworkError(method, "HTTP %d: %s" % (code, description),
                                          code if code >= 500 else status)
    return None, PlatformError(code, description, parameters, method)


def _reason(exc, secret):
    text = str(exc)
    if secret:
        text = text.replace(secret, "<token>")
    if len(text) > 200:
        text = text[:200] + "..."
    return "%s: %s" % (type(exc).__name__, text) if text else type(exc).__name__


def _check_seconds(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            0 < value < float("inf")):
        raise ValueError("%s must be a positive number of seconds, got %r" % (name, value))
    return float(value)


class TelegramSender:
    """Sends to the Telegram Bot API; a fastdispatch ``Sender``.

    ``TelegramSender(token, base_url="https://api.telegram.org", *,
    pool_size=100, timeout=30.0, connect_timeout=10.0)``

    - ``pool_size``: keep-alive connections in the one pool all threads
      share; a thread that finds them all busy waits for one (up to its
      timeout).  Make it at least the dispatcher's ``max_inflight``.
    - ``timeout``: seconds for calls made without a deadline (the optional
      protocols, ``call``, and sends whose ``sc.remaining()`` is None).
    - ``connect_timeout``: at most this long to open a connection.

    Thread-safe; one instance serves a whole bot.  :meth:`close` (or
    ``with``) closes the idle connections.
    """

    def __init__(self, token: str, base_url: str = "https://api.telegram.org", *,
                 pool_size: int = 100, timeout: float = DEFAULT_TIMEOUT,
                 connect_timeout: float = 10.0) -> None:
        if not isinstance(token, str):
            raise TypeError("token must be a str")
        if not token or any(c in token for c in "/?#% \t\r\n"):
            raise ValueError("token is not a bot token (it is empty or holds characters "
                             "that cannot be part of one)")
        if not isinstance(base_url, str):
            raise TypeError("base_url must be a str")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url must be an http:// or https:// URL, got %r" % (base_url,))
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError("pool_size must be a positive int, got %r" % (pool_size,))
        self._token = token
        self.base_url = base_url.rstrip("/")
        self.timeout = _check_seconds("timeout", timeout)
        self.connect_timeout = _check_seconds("connect_timeout", connect_timeout)
        prefix, colon, _ = token.partition(":")
        # The part before ":" is the bot's public user id; nothing else of
        # the token is ever shown.
        self.bot_id = prefix if colon and prefix.isdigit() else "?"
        self._prefix = "%s/bot%s/" % (parts.path.rstrip("/"), token)
        self._host, self._port, self._scheme = parts.hostname, parts.port, parts.scheme
        # One pool for every worker thread; retries=False: never retry here.
        self._pool = urllib3.connection_from_url(
            self.base_url, maxsize=pool_size, block=True, retries=False)
        _redact.remember(self, token)

    def __repr__(self) -> str:
        return "TelegramSender(base_url=%r, bot_id=%r)" % (self.base_url, self.bot_id)

    def __reduce__(self):
        raise TypeError("a TelegramSender cannot be pickled (it holds the bot token)")

    def close(self) -> None:
        """Close the pool's connections.  Final: later calls raise
        :class:`TelegramNetworkError`."""
        self._pool.close()

    def __enter__(self) -> "TelegramSender":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- the one way out ---------------------------------------------------

    def call(self, method: str, params: Optional[Dict[str, Any]] = None, *,
             timeout: Optional[float] = None) -> Any:
        """Call any Bot API method with JSON ``params``; return its
        ``result``, or raise ``RetryAfter`` / :class:`TelegramNetworkError` /
        :class:`PlatformError` as described in the module docstring."""
        if timeout is None:
            timeout = self.timeout
        body = json.dumps(params or {}, separators=(",", ":")).encode()
        t = timeout if timeout > 0.001 else 0.001
        err = None
        try:
            response = self._pool.urlopen(
                "POST", self._prefix + method, body=body, headers=_JSON_HEADERS,
                retries=False, redirect=False, assert_same_host=False,
                timeout=urllib3.Timeout(connect=min(t, self.connect_timeout), read=t),
                # urllib3 annotates int, but hands it to queue.get(timeout=): a float works
                pool_timeout=t)  # type: ignore[arg-type]
            status, data = response.status, response.data
        except (_Urllib3Error, OSError) as exc:
            # Built here, raised below: outside this block, the new error has
            # no __context__ that could carry the URL (and the token).
            err = TelegramNetworkError(method, _reason(exc, self._token))
        if err is not None:
            raise err
        result, err = _decode(method, status, data)
        if err is not None:
            raise err
        return result

    # -- Sender ------------------------------------------------------------

    def send(self, sc: Any, request: Any) -> SendResult:
        """``sendMessage`` to ``request.target.id``; the timeout is
        ``sc.remaining()``.  Returns ``SendResult(message_id, raw=result)``."""
        remaining = sc.remaining()
        if remaining is not None and remaining <= 0:
            sc.check()
        result = self.call("sendMessage", {"chat_id": request.target.id,
                                           "text": request.message.text},
                           timeout=remaining)
        message_id = result.get("message_id", "") if isinstance(result, dict) else ""
        return SendResult(message_id=str(message_id), raw=result)

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
        cls = (urllib3.connection.HTTPSConnection if self._scheme == "https"
               else urllib3.connection.HTTPConnection)
        return cls(self._host, self._port, timeout=timeout)

    def _call_on(self, conn, method, params, timeout):
        """Like :meth:`call`, on a connection of the caller's (not the pool)."""
        body = json.dumps(params, separators=(",", ":")).encode()
        err = None
        try:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            conn.request("POST", self._prefix + method, body=body, headers=_JSON_HEADERS)
            response = conn.getresponse()
            status, data = response.status, response.data
        except (_Urllib3Error, OSError) as exc:
            err = TelegramNetworkError(method, _reason(exc, self._token))
        if err is not None:
            raise err
        result, err = _decode(method, status, data)
        if err is not None:
            raise err
        return result


def _display_name(user):
    name = " ".join(str(user[k]) for k in ("first_name", "last_name")
                    if isinstance(user.get(k), str) and user[k])
    return name or (user.get("username") if isinstance(user.get("username"), str) else "") or ""


