"""Updates in: :func:`update_to_event`, :class:`TelegramPoller` (``getUpdates``
long polling on its own thread) and :func:`webhook_app` (a WSGI callable).

Both intakes turn updates into ``Event``s and hand them to
``Engine.process_event``; neither lets a handler's exception end it.
"""

import collections
import hmac
import json
import logging
import random
import re
import socket
import threading
from typing import Any, Dict, List, Optional

from .._errors import RetryAfter
from ..platform import ChatInfo, Event, SenderInfo
from ._sender import PlatformError, TelegramSender, _check_seconds, _display_name

__all__ = ["update_to_event", "TelegramPoller", "WebhookApp", "webhook_app"]

_log = logging.getLogger("fastdispatch.telegram")


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
