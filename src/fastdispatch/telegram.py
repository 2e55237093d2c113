"""``fastdispatch.telegram``: the Telegram Bot API as a fastdispatch platform.

Replies out: :class:`TelegramSender` implements ``Sender`` (``sendMessage``)
and the optional protocols Telegram offers (``deleteMessage``,
``sendChatAction``, ``getChatAdministrators``, ``restrictChatMember``).
Updates in: :class:`TelegramPoller` (``getUpdates`` long polling on its own
thread) or :func:`webhook_app` (a WSGI callable); both turn updates into
``Event``s with :func:`update_to_event` and hand them to
``Engine.process_event``.

The sender is a thin translation layer and nothing more: it builds the
request, sends it through one keep-alive connection pool (urllib3, shared by
every dispatcher worker thread), and turns the answer into a result or a
typed error:

- ``429``                        -> ``fastdispatch.RetryAfter(parameters.retry_after)``
- ``5xx``, connection errors,
  timeouts, answers cut short     -> :class:`TelegramNetworkError` (a ``ConnectionError``)
- any other ``ok: false``        -> :class:`PlatformError` (status, description)

It never retries, never sleeps and never reorders: the dispatcher owns
order, pacing (``Pacing.telegram()``) and retries (``RetryPolicy()``, whose
default ``retry_on=(ConnectionError,)`` retries exactly the network errors
above).  Each request's timeout is the task's ``sc.remaining()``.

Why urllib3: measured against httpx and requests on the same local server
(``bench/http_clients.py``; numbers in ``docs/telegram.md``), urllib3 used
about half the client CPU per request of httpx and 40 % of requests'.

The bot token is a password.  It is kept in one private attribute and the
request path; it never appears in a repr, an exception message or chain
(errors are built from scratch, outside the ``except`` block that caught the
client's error), or urllib3's debug log (a filter on its logger redacts it).
"""

import collections
import hmac
import re
import json
import logging
import random
import socket
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

from ._errors import DispatcherError, RetryAfter
from .platform import Capabilities, ChatInfo, Event, SenderInfo, SendResult

__all__ = [
    "TelegramSender",
    "TelegramPoller",
    "webhook_app",
    "update_to_event",
    "PlatformError",
    "TelegramNetworkError",
]

_log = logging.getLogger("fastdispatch.telegram")

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


# -- updates in ----------------------------------------------------------------

def update_to_event(update: Any) -> Optional[Event]:
    """A ``message`` update with text -> an ``Event``; anything else
    (other update kinds, messages without text, malformed dicts) -> None.

    ``chat.id``, ``from.id`` and ``message_id`` become strings; a chat is a
    group when its type is ``group`` or ``supergroup``; ``raw`` is the whole
    update.
    """
    if not isinstance(update, dict):
        return None
    message = update.get("message")
    if not isinstance(message, dict):
        return None
    text, chat = message.get("text"), message.get("chat")
    if not isinstance(text, str) or not isinstance(chat, dict):
        return None
    chat_id = chat.get("id")
    if isinstance(chat_id, bool) or not isinstance(chat_id, (int, str)) or chat_id == "":
        return None
    chat_type = chat.get("type")
    title = chat.get("title")
    name = title if isinstance(title, str) and title else _display_name(chat)
    user: Dict[str, Any] = {}
    for key in ("from", "sender_chat"):
        if isinstance(message.get(key), dict):
            user = message[key]
            break
    user_id = user.get("id")
    user_title = user.get("title")
    sender = SenderInfo("" if isinstance(user_id, bool) or not isinstance(user_id, (int, str))
                        else str(user_id),
                        _display_name(user) or (user_title if isinstance(user_title, str) else ""))
    message_id = message.get("message_id")
    return Event(platform="telegram",
                 chat=ChatInfo(str(chat_id), is_group=chat_type in ("group", "supergroup"),
                               name=name),
                 sender=sender, text=text,
                 message_id="" if isinstance(message_id, bool) or not isinstance(
                     message_id, (int, str)) else str(message_id),
                 raw=update)


def _process(engine, sender, capabilities, update):
    """Hand one update to the engine; never raises (a hostile handler may
    raise anything, even a BaseException, and the intake goes on)."""
    event = update_to_event(update)
    if event is None:
        return False
    try:
        engine.process_event(event, sender, capabilities)
    except BaseException:  # noqa: B902 - an intake thread must survive its handlers
        _log.exception("processing update %r failed", update.get("update_id"))
    return True


class TelegramPoller:
    """``getUpdates`` long polling on a thread of its own.

    ``TelegramPoller(sender, engine, poll_timeout=30, *, limit=100,
    offset=None, allowed_updates=None, backoff=0.5, max_backoff=30.0)``

    Offsets: after an update is handled, :attr:`offset` becomes its
    ``update_id + 1``; the next ``getUpdates`` sends it, which tells Telegram
    to forget every update before it.  An update is handed to the engine
    once; none is skipped: an error in ``getUpdates`` retries with the same
    offset, and :meth:`stop` confirms what was handled with one short
    ``getUpdates(offset, timeout=0)`` so that a restarted poller (this one
    or a new process) does not see it again.  If the process dies between
    handling an update and confirming it, that update comes again: at least
    once, as with Telegram itself.  Pass ``offset=`` to resume from a stored
    value.

    Errors: network errors, 5xx and other failures back off exponentially
    (``backoff`` x 2^n, capped at ``max_backoff``, with jitter); a 429 waits
    its ``retry_after``; a handler that raises is logged and the loop goes on.
    """

    def __init__(self, sender: TelegramSender, engine: Any, poll_timeout: float = 30, *,
                 limit: int = 100, offset: Optional[int] = None,
                 allowed_updates: Optional[List[str]] = None,
                 backoff: float = 0.5, max_backoff: float = 30.0) -> None:
        if not isinstance(sender, TelegramSender):
            raise TypeError("sender must be a TelegramSender")
        if not callable(getattr(engine, "process_event", None)):
            raise TypeError("engine must have a process_event(event, sender, capabilities) "
                            "method")
        if isinstance(poll_timeout, bool) or not isinstance(poll_timeout, (int, float)) or not (
                0 <= poll_timeout <= 3600):
            raise ValueError("poll_timeout must be a number of seconds in [0, 3600]")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100:
            raise ValueError("limit must be an int in [1, 100]")
        if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int)):
            raise TypeError("offset must be an int or None")
        self.sender = sender
        self.engine = engine
        self.poll_timeout = int(poll_timeout)
        self.limit = limit
        self.allowed_updates = list(allowed_updates) if allowed_updates is not None else None
        self.backoff = _check_seconds("backoff", backoff)
        self.max_backoff = _check_seconds("max_backoff", max_backoff)
        self.offset = offset  # next update_id wanted; written only by the loop thread
        self._confirmed = offset
        self._capabilities = sender.capabilities()
        self._lock = threading.Lock()  # guards _conn and _thread
        self._conn: Any = None
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self.handled = 0  # updates given to the engine
        self.ignored = 0  # updates that were not text messages
        self.errors = 0  # failed getUpdates calls

    def __repr__(self) -> str:
        return "TelegramPoller(%r, offset=%r, running=%r)" % (
            self.sender, self.offset, self.running)

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def start(self) -> "TelegramPoller":
        """Start polling on a daemon thread (again after :meth:`stop`)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise RuntimeError("the poller is already running")
            self._stop.clear()
            thread = threading.Thread(target=self._run, name="fastdispatch-telegram-poller",
                                      daemon=True)
            self._thread = thread
            thread.start()
        return self

    def stop(self, timeout: Optional[float] = None) -> bool:
        """End the loop: the long poll in progress is cut (its connection is
        shut down), the update being handled finishes, the handled ones are
        confirmed.  Returns True once the loop has ended, False if it was
        still running after ``timeout`` seconds (a handler still busy), or
        at once when called from a handler (the poller's own thread): the
        loop then ends after that update."""
        self._stop.set()
        with self._lock:
            conn, thread = self._conn, self._thread
        if thread is threading.current_thread():
            return False  # called by a handler: the loop ends after this update
        if conn is not None:
            sock = getattr(conn, "sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def __enter__(self) -> "TelegramPoller":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def _wait(self, seconds):
        return self._stop.wait(seconds)

    def _fetch(self):
        params = {"timeout": self.poll_timeout, "limit": self.limit}
        if self.offset is not None:
            params["offset"] = self.offset
        if self.allowed_updates is not None:
            params["allowed_updates"] = self.allowed_updates
        with self._lock:
            conn = self._conn
            if conn is None:
                conn = self._conn = self.sender._connect(self.sender.connect_timeout)
        try:
            result = self.sender._call_on(conn, "getUpdates", params,
                                          self.poll_timeout + self.sender.connect_timeout)
        except BaseException:
            self._drop_connection()
            raise
        if not isinstance(result, list):
            raise PlatformError(200, "getUpdates answered %s, not a list"
                                % type(result).__name__, None, "getUpdates")
        return result

    def _drop_connection(self):
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken
                pass

    def _run(self):
        failures = 0
        try:
            while not self._stop.is_set():
                try:
                    updates = self._fetch()
                except RetryAfter as exc:
                    self.errors += 1
                    _log.warning("getUpdates: %s", exc)
                    self._wait(exc.seconds)
                    continue
                except Exception as exc:
                    if self._stop.is_set():
                        break
                    self.errors += 1
                    failures += 1
                    delay = min(self.max_backoff, self.backoff * 2 ** min(failures - 1, 30))
                    delay *= random.uniform(0.5, 1.0)
                    _log.warning("getUpdates failed (%s); retrying in %.1f s", exc, delay)
                    self._wait(delay)
                    continue
                failures = 0
                for update in updates:
                    if self._stop.is_set():
                        break  # not handled: not confirmed, so it comes again
                    update_id = update.get("update_id") if isinstance(update, dict) else None
                    if isinstance(update_id, bool) or not isinstance(update_id, int):
                        _log.warning("getUpdates returned an update without update_id; "
                                     "ignored")
                        continue
                    if self.offset is not None and update_id < self.offset:
                        continue  # seen already
                    if _process(self.engine, self.sender, self._capabilities, update):
                        self.handled += 1
                    else:
                        self.ignored += 1
                    self.offset = update_id + 1
        finally:
            self._drop_connection()
            self._confirm()

    def _confirm(self):
        """Tell Telegram which updates were handled (a getUpdates that fetches
        at most one more, without waiting; that one is not confirmed)."""
        if self.offset is None or self.offset == self._confirmed:
            return
        conn = None
        try:
            conn = self.sender._connect(2.0)
            self.sender._call_on(conn, "getUpdates",
                                 {"offset": self.offset, "limit": 1, "timeout": 0}, 2.0)
            self._confirmed = self.offset
        except Exception as exc:
            _log.warning("could not confirm handled updates up to %d (%s); they may be "
                         "delivered again", self.offset - 1, exc)
        finally:
            if conn is not None:
                conn.close()


# -- webhook ---------------------------------------------------------------------

_STATUS = {200: "200 OK", 400: "400 Bad Request", 403: "403 Forbidden",
           405: "405 Method Not Allowed", 411: "411 Length Required",
           413: "413 Payload Too Large", 500: "500 Internal Server Error"}


class WebhookApp:
    """The WSGI callable made by :func:`webhook_app`; ``.stats`` counts
    answers by status (and ``duplicates``)."""

    def __init__(self, engine, sender, secret_token, max_body, remember):
        self.engine = engine
        self.sender = sender
        self._secret = None if secret_token is None else secret_token.encode("ascii")
        self.max_body = max_body
        self._capabilities = sender.capabilities() if hasattr(sender, "capabilities") else None
        self._lock = threading.Lock()  # guards stats and the recent update ids
        self.stats = {200: 0, 400: 0, 403: 0, 405: 0, 411: 0, 413: 0, 500: 0, "duplicates": 0}
        self._remember = remember
        self._recent = set()
        self._recent_order = collections.deque()

    def __repr__(self):
        return "<fastdispatch.telegram webhook app, secret %s>" % (
            "set" if self._secret is not None else "NOT set")

    def __call__(self, environ, start_response):
        try:
            status = self._handle(environ)
        except Exception:  # never into the server
            _log.exception("webhook: unexpected error")
            status = 500
        with self._lock:
            self.stats[status] = self.stats.get(status, 0) + 1
        body = b"" if status == 200 else _STATUS[status].encode() + b"\n"
        headers = [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))]
        if status == 405:
            headers.append(("Allow", "POST"))
        start_response(_STATUS[status], headers)
        return [body]

    def _handle(self, environ):
        if environ.get("REQUEST_METHOD") != "POST":
            return 405
        if self._secret is not None:
            given = environ.get("HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN", "")
            if not isinstance(given, str) or not hmac.compare_digest(
                    given.encode("latin-1", "replace"), self._secret):
                return 403
        length = environ.get("CONTENT_LENGTH") or ""
        stream = environ.get("wsgi.input")
        if stream is None:
            return 400
        if length.strip():
            try:
                length = int(length)
            except ValueError:
                return 400
            if length < 0:
                return 400
            if length > self.max_body:
                return 413
            body = stream.read(length)
        elif environ.get("wsgi.input_terminated"):
            body = stream.read(self.max_body + 1)
            if len(body) > self.max_body:
                return 413
        else:
            return 411
        try:
            update = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return 400
        if not isinstance(update, dict):
            return 400
        update_id = update.get("update_id")
        if isinstance(update_id, int) and not isinstance(update_id, bool):
            with self._lock:
                if update_id in self._recent:
                    self.stats["duplicates"] += 1
                    return 200  # Telegram re-sent one we already handled
                self._recent.add(update_id)
                self._recent_order.append(update_id)
                if len(self._recent_order) > self._remember:
                    self._recent.discard(self._recent_order.popleft())
        _process(self.engine, self.sender, self._capabilities, update)
        return 200


def webhook_app(engine: Any, sender: Any, secret_token: Optional[str] = None, *,
                max_body: int = 1 << 20, remember: int = 1024) -> WebhookApp:
    """A WSGI application that receives Telegram's webhook POSTs.

    - not POST -> 405; a ``secret_token`` was given and the
      ``X-Telegram-Bot-Api-Secret-Token`` header differs (compared in
      constant time) or is missing -> 403, before the body is read;
    - no length -> 411; more than ``max_body`` bytes -> 413, unread;
      not a JSON object -> 400;
    - otherwise 200, and the update went to ``engine.process_event`` (run in
      the server's request thread; replies are queued on the dispatcher, so
      this is quick).  Update kinds that are not text messages are answered
      200 and ignored (Telegram would resend anything else).  The last
      ``remember`` update ids are kept, so an update Telegram delivers twice
      is handled once.

    It never raises into the server; nothing it keeps grows with the number
    of requests (the counters in ``.stats`` and the bounded id memory).
    Set the same ``secret_token`` in ``setWebhook``.
    """
    if secret_token is not None:
        if not isinstance(secret_token, str):
            raise TypeError("secret_token must be a str or None")
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", secret_token):
            raise ValueError("secret_token must be 1-256 characters A-Z, a-z, 0-9, _ and - "
                             "(what Telegram's setWebhook accepts)")
    if not callable(getattr(engine, "process_event", None)):
        raise TypeError("engine must have a process_event(event, sender, capabilities) method")
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
        raise ValueError("max_body must be a positive int")
    if isinstance(remember, bool) or not isinstance(remember, int) or remember < 0:
        raise ValueError("remember must be a non-negative int")
    return WebhookApp(engine, sender, secret_token, max_body, remember)
