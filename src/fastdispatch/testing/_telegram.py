"""``fastdispatch.testing``: a local Telegram Bot API server for tests.

:class:`FakeTelegramServer` is a real HTTP/1.1 server (keep-alive, one
thread per connection) on 127.0.0.1, on a port the OS picks.  It speaks the
part of the Bot API that ``fastdispatch.telegram`` uses, enforces Telegram's
rate limits (per chat, per group, bot-wide; any sizes, so tests can scale
them down) with real ``429`` answers carrying ``parameters.retry_after``,
injects faults on demand (latency, ``5xx``, dropped connections, garbage,
answers cut off mid-body), queues updates for ``getUpdates`` long polling or
delivers them to a webhook (after ``setWebhook``: POSTed with the secret
header, again after a non-2xx or a timeout, in order per chat; see
``_webhooks.py``), and records, per chat, every message that arrived and
when.

It is a product, not a fixture: a bot's own test suite can use it the way
this project's tests and ``python -m fastdispatch demo`` do::

    from fastdispatch.testing import FakeTelegramServer
    from fastdispatch.telegram import TelegramSender

    with FakeTelegramServer() as server:
        sender = TelegramSender("123:abc", base_url=server.base_url)
        ...                                   # run the bot against it
        assert [m.text for m in server.messages("42")] == ["hello", "bye"]

``python -m fastdispatch.testing`` runs one from the command line (for a bot
written in any language, or to measure a client without the server sharing
its process).

What it does NOT emulate (see ``docs/telegram.md``): files, media, keyboards,
``parse_mode`` rendering, message editing, inline mode, payments, channels'
own rules, Telegram's undocumented extra limits and its whole-second
``retry_after`` rounding (the fake answers the exact remaining time, rounded
up to milliseconds, so scaled-down limits stay meaningful).

Threads and locks.  Request handlers run on the server's connection threads.
``_lock`` guards every piece of mutable state below it in ``__init__`` (the
record, the limit windows, the fault plan, the counters, the update queue);
``_updates_changed`` is a Condition on that same lock, which long polls wait
on.  Sleeping (latency, injected delays) happens outside the lock.
"""

import collections
import itertools
import json
import logging
import math
import random
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, NamedTuple, Optional, Set
from urllib.parse import parse_qsl, urlsplit

from ..pacing import RateLimit
from ._webhooks import WebhookDelivery

__all__ = ["FakeTelegramServer", "SentMessage", "telegram_limits"]

_log = logging.getLogger("fastdispatch.testing")

_FAULTS = ("error", "too_many", "drop", "drop_after", "garbage", "truncate", "delay")


def telegram_limits(speedup: float = 1.0) -> Dict[str, RateLimit]:
    """Telegram's limits as keyword arguments, every window divided by
    ``speedup``: ``chat_limit`` 1 per 1 s, ``group_limit`` 20 per 60 s,
    ``global_limit`` 30 per 1 s (at ``speedup=20``: 1 per 50 ms, 20 per 3 s,
    30 per 50 ms).  ``FakeTelegramServer(**telegram_limits(20))``."""
    if isinstance(speedup, bool) or not isinstance(speedup, (int, float)) or not (
            0 < speedup < math.inf):
        raise ValueError("speedup must be a positive finite number, got %r" % (speedup,))
    return {
        "chat_limit": RateLimit(1, per=1.0 / speedup),
        "group_limit": RateLimit(20, per=60.0 / speedup),
        "global_limit": RateLimit(30, per=1.0 / speedup),
    }


class SentMessage(NamedTuple):
    """One message as it arrived at the server (``at``: ``time.monotonic()``)."""

    chat_id: str
    message_id: int
    text: str
    at: float


class _Window:
    """Sliding-window counter: at most ``count`` accepted in any ``per`` s."""

    __slots__ = ("count", "per", "times")

    def __init__(self, limit, tolerance):
        self.count = limit.count
        self.per = max(0.0, limit.per - tolerance)
        self.times = collections.deque()

    def wait_needed(self, now):
        times = self.times
        while times and now - times[0] >= self.per:
            times.popleft()
        if len(times) < self.count:
            return 0.0
        return times[0] + self.per - now


def _as_limit(name, value):
    if value is None or isinstance(value, RateLimit):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return RateLimit(value[0], per=value[1])
    raise TypeError("%s must be a RateLimit, a (count, per) tuple or None, got %r"
                    % (name, value))


def _check_latency(latency):
    def seconds(x):
        return not isinstance(x, bool) and isinstance(x, (int, float)) and 0 <= x < math.inf
    if isinstance(latency, tuple) and len(latency) == 2 and all(map(seconds, latency)) \
            and latency[0] <= latency[1]:
        return (float(latency[0]), float(latency[1]))
    if seconds(latency):
        return float(latency)
    raise ValueError("latency must be seconds >= 0 or a (low, high) tuple of them, got %r"
                     % (latency,))


def _is_group(chat_key):
    return chat_key[:1] == "-"


class _Answer(Exception):
    """Raised inside a method to answer ``ok: false``."""

    def __init__(self, status, description, parameters=None):
        super().__init__(status, description)
        self.status = status
        self.description = description
        self.parameters = parameters


def _chat_key(params):
    chat_id = params.get("chat_id")
    if chat_id is None or chat_id == "":
        raise _Answer(400, "Bad Request: chat_id is empty")
    if isinstance(chat_id, bool) or not isinstance(chat_id, (int, str)):
        raise _Answer(400, "Bad Request: chat not found")
    key = str(chat_id)
    if not (key.lstrip("-").isdigit() or key.startswith("@")):
        raise _Answer(400, "Bad Request: chat not found")
    return key


def _int_param(params, name, default=None, required=False):
    value = params.get(name)
    if value is None or value == "":
        if required:
            raise _Answer(400, "Bad Request: %s is empty" % name)
        return default
    if isinstance(value, bool):
        raise _Answer(400, "Bad Request: invalid %s" % name)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _Answer(400, "Bad Request: invalid %s" % name) from None


def _chat_json(key):
    try:
        chat_id = int(key)
    except ValueError:
        return {"id": -1000000000000 - (hash(key) % 1000000), "type": "channel", "title": key}
    if chat_id < 0:
        return {"id": chat_id, "type": "supergroup", "title": "Group %s" % key}
    return {"id": chat_id, "type": "private", "first_name": "User %s" % key}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeTelegram/1"

    def setup(self):
        super().setup()
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # pragma: no cover - not a TCP socket
            pass
        self.server.fake._connection_opened(self.connection)

    def finish(self):
        try:
            super().finish()
        finally:
            self.server.fake._connection_closed(self.connection)

    def log_message(self, format, *args):  # quiet: tests read the record instead
        pass

    def do_GET(self):
        self.server.fake._handle(self)

    do_POST = do_GET

    def _write(self, status, body, content_type=b"application/json", declared=None):
        reason = self.responses.get(status, ("Unknown",))[0].encode("latin-1")
        length = len(body) if declared is None else declared
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
            status, reason, content_type, length)
        if self.close_connection:
            head += b"Connection: close\r\n"
        self.wfile.write(head + b"\r\n" + body)


class _Server(ThreadingHTTPServer):
    fake: Any = None  # the FakeTelegramServer it serves
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def handle_error(self, request, client_address):
        # A client that goes away mid-request (a timeout, a test that
        # closes its connection) is normal here, not worth a traceback.
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            return
        _log.exception("FakeTelegramServer: error while serving %s", client_address)


class FakeTelegramServer:
    """A local Bot API server: limits, faults, updates and a record per chat.

    ``FakeTelegramServer(token=None, *, chat_limit=None, group_limit=None,
    global_limit=None, tolerance=0.0, latency=0.0, seed=None, max_body=1 MiB)``

    - ``token``: the only bot token accepted (``401 Unauthorized`` for any
      other); None accepts every token.
    - ``chat_limit``, ``group_limit``, ``global_limit``: a
      :class:`~fastdispatch.RateLimit` (or ``(count, per)``) or None (no
      limit).  ``sendMessage`` to a group (a negative chat id) counts
      against ``group_limit`` (``chat_limit`` when there is none), to any
      other chat against ``chat_limit``; every accepted ``sendMessage``
      counts against ``global_limit``.  Over a limit, the answer is ``429``
      with ``parameters.retry_after`` = the seconds until the window has
      room.  Refused sends do not count.  :func:`telegram_limits` gives
      Telegram's, scaled.
    - ``tolerance``: seconds shaved off every window, for the jitter between
      a client starting a request and the server seeing it (with
      millisecond windows that jitter is a real fraction of the window).
    - ``latency``: seconds every answer is held back (or ``(low, high)``:
      uniform random), like a network round trip; settable later.  A
      request is processed (and a message recorded) when it arrives; the
      latency delays the answer.
    - ``seed``: for the random latency and the random fault rates.

    The server is started by :meth:`start` or ``with``; :attr:`base_url` is
    what ``TelegramSender(base_url=...)`` takes.  Costs: the record keeps
    every message (a few hundred bytes each); call :meth:`reset` between
    phases of a long test.
    """

    def __init__(self, token: Optional[str] = None, *, chat_limit: Any = None,
                 group_limit: Any = None, global_limit: Any = None, tolerance: float = 0.0,
                 latency: Any = 0.0, seed: Optional[int] = None,
                 max_body: int = 1 << 20, host: str = "127.0.0.1", port: int = 0) -> None:
        if token is not None and not isinstance(token, str):
            raise TypeError("token must be a str or None")
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not (
                0 <= tolerance < math.inf):
            raise ValueError("tolerance must be a non-negative number of seconds")
        if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
            raise ValueError("max_body must be a positive int")
        self.token = token
        self.chat_limit = _as_limit("chat_limit", chat_limit)
        self.group_limit = _as_limit("group_limit", group_limit)
        self.global_limit = _as_limit("global_limit", global_limit)
        self.tolerance = float(tolerance)
        self.latency = latency
        self.max_body = max_body
        self._host, self._port = host, port
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()  # guards everything below
        self._updates_changed = threading.Condition(self._lock)
        self._rng = random.Random(seed)
        self._connections: Set[socket.socket] = set()
        self._poll_generation = 0
        self._stopping = False
        self.webhooks = WebhookDelivery(self)  # POSTs updates once setWebhook is called
        self._reset_state()

    def _reset_state(self):
        # Called with _lock held (or before the server runs).
        self._record = collections.defaultdict(list)  # chat key -> [SentMessage]
        self._order = []  # every SentMessage, in arrival order
        self._next_message_id = collections.defaultdict(lambda: 0)
        self._windows = {}
        self._global_window = None
        self._planned = collections.deque()  # (fault, method, options)
        self._rates = {}
        self._rate_method = "sendMessage"
        self._counts = collections.Counter()
        self._updates = collections.deque()
        self._update_ids = itertools.count(1000)
        self._deleted = []
        self._actions = []
        self._restrictions = []
        self._admins = {}
        self._webhook = None
        self._webhook_options = {}
        self.webhooks.forget()

    @property
    def latency(self) -> Any:
        """Seconds each answer is held back, or ``(low, high)``; settable."""
        return self._latency

    @latency.setter
    def latency(self, value: Any) -> None:
        self._latency = _check_latency(value)

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> "FakeTelegramServer":
        """Bind 127.0.0.1 on a free port and serve on a background thread."""
        if self._server is not None:
            raise RuntimeError("the server is already started")
        server = _Server((self._host, self._port), _Handler)
        server.fake = self
        self._server = server
        self._stopping = False
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                  name="fake-telegram", daemon=True)
        self._thread = thread
        thread.start()
        self.webhooks.start()
        return self

    def stop(self) -> None:
        """Stop serving, end long polls, close every connection.  Idempotent."""
        server = self._server
        if server is None:
            return
        with self._lock:
            self._stopping = True
            self._updates_changed.notify_all()
            connections = list(self._connections)
        self.webhooks.stop()
        server.shutdown()
        server.server_close()
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(5)
        self._server = None

    def __enter__(self) -> "FakeTelegramServer":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the server is not started")
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``: pass it as ``TelegramSender(base_url=...)``."""
        return "http://127.0.0.1:%d" % self.port

    def _connection_opened(self, conn):
        with self._lock:
            self._connections.add(conn)
            self._counts["connections"] += 1

    def _connection_closed(self, conn):
        with self._lock:
            self._connections.discard(conn)

    # -- faults ------------------------------------------------------------

    def inject(self, fault: str, count: int = 1, *, method: Optional[str] = "sendMessage",
               status: int = 500, retry_after: float = 1.0, seconds: float = 0.0) -> None:
        """Answer the next ``count`` calls of ``method`` (None: any method)
        with a fault, in order, before the random rates are consulted:

        - ``"error"``: HTTP ``status`` (default 500; 502/503/504 come with an
          HTML body, as from a proxy), nothing recorded;
        - ``"too_many"``: 429 with ``parameters.retry_after``, nothing recorded;
        - ``"drop"``: the connection is closed before the call is processed;
        - ``"drop_after"``: the call is processed (the message IS recorded),
          then the connection is closed without an answer;
        - ``"garbage"``: processed, then ``200`` with a body that is not JSON;
        - ``"truncate"``: processed, then an answer cut off mid-body;
        - ``"delay"``: held ``seconds`` before it is processed normally.
        """
        if fault not in _FAULTS:
            raise ValueError("fault must be one of %s, got %r" % (", ".join(_FAULTS), fault))
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError("count must be a non-negative int")
        options = {"status": int(status), "retry_after": float(retry_after),
                   "seconds": float(seconds)}
        with self._lock:
            self._planned.extend([(fault, method, options)] * count)

    def set_fault_rates(self, *, method: Optional[str] = "sendMessage", error: float = 0.0,
                        too_many: float = 0.0, drop: float = 0.0, drop_after: float = 0.0,
                        status: int = 500, retry_after: float = 1.0) -> None:
        """Random faults: each call of ``method`` (None: any) independently
        gets a 5xx with probability ``error``, a 429 with ``too_many``, a
        dropped connection with ``drop`` (nothing recorded) or
        ``drop_after`` (recorded, then dropped).  All zero: none."""
        rates = {"error": error, "too_many": too_many, "drop": drop, "drop_after": drop_after}
        for name, rate in rates.items():
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
                raise ValueError("%s must be a probability between 0 and 1" % name)
        if sum(rates.values()) > 1:
            raise ValueError("the fault rates must add up to at most 1")
        with self._lock:
            self._rates = {k: float(v) for k, v in rates.items() if v}
            self._rate_method = method
            self._rate_options = {"status": int(status), "retry_after": float(retry_after),
                                  "seconds": 0.0}

    def _pick_fault(self, method):
        # Called with _lock held.
        planned = self._planned
        for i, (fault, fmethod, options) in enumerate(planned):
            if fmethod is None or fmethod == method:
                del planned[i]
                return fault, options
        if self._rates and (self._rate_method is None or self._rate_method == method):
            roll = self._rng.random()
            for fault, rate in self._rates.items():
                if roll < rate:
                    return fault, self._rate_options
                roll -= rate
        return None, None

    # -- updates -----------------------------------------------------------

    def push_update(self, update: Dict[str, Any]) -> int:
        """Queue a raw update for ``getUpdates``; returns its ``update_id``
        (assigned here, increasing)."""
        if not isinstance(update, dict):
            raise TypeError("update must be a dict")
        with self._lock:
            update = dict(update, update_id=next(self._update_ids))
            self._updates.append(update)
            self._updates_changed.notify_all()
        return update["update_id"]

    def push_message(self, chat_id: Any, text: str, *, user_id: Any = None,
                     first_name: str = "Test", username: Optional[str] = None,
                     chat_title: Optional[str] = None) -> int:
        """Queue a text-message update from a user in a chat (a negative
        ``chat_id`` is a supergroup); returns its ``update_id``."""
        chat_id = int(chat_id)
        user_id = int(chat_id if user_id is None and chat_id > 0 else (user_id or 1))
        user = {"id": user_id, "is_bot": False, "first_name": first_name}
        if username:
            user["username"] = username
        if chat_id < 0:
            chat = {"id": chat_id, "type": "supergroup",
                    "title": chat_title or "Group %d" % chat_id}
        else:
            chat = {"id": chat_id, "type": "private", "first_name": first_name}
            if username:
                chat["username"] = username
        with self._lock:
            self._next_message_id[str(chat_id)] += 1
            message_id = self._next_message_id[str(chat_id)]
        return self.push_update({"message": {
            "message_id": message_id, "from": user, "chat": chat,
            "date": int(time.time()), "text": text}})

    def pending_updates(self) -> int:
        """Updates queued and not yet confirmed by a ``getUpdates`` offset."""
        with self._lock:
            return len(self._updates)

    # -- the record --------------------------------------------------------

    def messages(self, chat_id: Any) -> List[SentMessage]:
        """What arrived in one chat (``sendMessage``), in arrival order."""
        with self._lock:
            return list(self._record.get(str(chat_id), ()))

    def chats(self) -> List[str]:
        """Every chat that received at least one message."""
        with self._lock:
            return list(self._record)

    def all_messages(self) -> List[SentMessage]:
        """Every message that arrived, in arrival order."""
        with self._lock:
            return list(self._order)

    @property
    def deleted(self) -> List[tuple]:
        """``(chat_id, message_id)`` of each successful ``deleteMessage``."""
        with self._lock:
            return list(self._deleted)

    @property
    def chat_actions(self) -> List[tuple]:
        """``(chat_id, action)`` of each ``sendChatAction``."""
        with self._lock:
            return list(self._actions)

    @property
    def restrictions(self) -> List[tuple]:
        """``(chat_id, user_id, until_date, permissions)`` of each
        ``restrictChatMember``."""
        with self._lock:
            return list(self._restrictions)

    def set_chat_administrators(self, chat_id: Any, users: List[Dict[str, Any]]) -> None:
        """What ``getChatAdministrators`` answers for a group: a list of
        Telegram ``User`` dicts (default: one creator, user id 1)."""
        with self._lock:
            self._admins[str(chat_id)] = [dict(u) for u in users]

    def stats(self) -> Dict[str, int]:
        """Counters: ``requests``, ``connections`` (opened), ``sent`` (messages
        recorded), ``too_many`` (429s for limits; by limit: ``too_many_chat``,
        ``too_many_group``, ``too_many_global``), ``injected_<fault>``,
        ``status_<n>``."""
        with self._lock:
            counts = dict(self._counts)
            counts["sent"] = len(self._order)
            return counts

    def reset(self) -> None:
        """Forget the record, the limit windows, the faults, the counters and
        the update queue (the server keeps running)."""
        with self._lock:
            self._reset_state()
            self._updates_changed.notify_all()

    # -- request handling --------------------------------------------------

    def _handle(self, handler):
        counts = self._counts
        path, _, query = handler.path.partition("?")
        try:
            length = int(handler.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > self.max_body:
            handler.close_connection = True
            return self._answer(handler, _Answer(413, "Request Entity Too Large"))
        body = handler.rfile.read(length) if length else b""
        parts = path.split("/")
        if len(parts) != 3 or parts[0] != "" or not parts[1].startswith("bot"):
            return self._answer(handler, _Answer(404, "Not Found"))
        token, method = parts[1][3:], parts[2]
        if self.token is not None and token != self.token:
            return self._answer(handler, _Answer(401, "Unauthorized"))
        call = _METHODS.get(method.lower())
        if call is None:
            return self._answer(handler, _Answer(404, "Not Found: method not found"))
        method = call.__name__[1:]
        try:
            params = self._params(handler, query, body)
        except _Answer as answer:
            return self._answer(handler, answer)

        with self._lock:
            counts["requests"] += 1
            fault, options = self._pick_fault(method)
            if fault is not None:
                counts["injected_" + fault] += 1
        if fault == "delay":
            time.sleep(options["seconds"])
        if fault == "drop":
            return self._drop(handler)
        if fault == "error":
            status = options["status"]
            if status in (502, 503, 504):
                return self._finish(handler, status,
                                    b"<html><body><h1>%d</h1></body></html>" % status,
                                    b"text/html")
            return self._answer(handler, _Answer(status, "Internal Server Error"))
        if fault == "too_many":
            seconds = options["retry_after"]
            return self._answer(handler, _Answer(
                429, "Too Many Requests: retry after %g" % seconds,
                {"retry_after": seconds}))
        try:
            result = call(self, params)
        except _Answer as answer:
            return self._answer(handler, answer)
        except Exception as exc:  # a bug here must not kill the connection thread
            return self._answer(handler, _Answer(500, "Internal Server Error: %r" % (exc,)))
        # The latency is the answer's way back: what arrived is recorded at
        # once, so the record's times are when requests reached the server.
        delay = self._delay()
        if delay:
            time.sleep(delay)
        if fault == "drop_after":
            return self._drop(handler)
        if fault == "garbage":
            return self._finish(handler, 200, b"<<not json>>", b"text/plain")
        payload = json.dumps({"ok": True, "result": result}, separators=(",", ":")).encode()
        if fault == "truncate":
            handler.close_connection = True
            handler._write(200, payload[: len(payload) // 2], declared=len(payload))
            return self._drop(handler)
        return self._finish(handler, 200, payload)

    def _delay(self):
        latency = self._latency
        if isinstance(latency, tuple):
            with self._lock:
                return self._rng.uniform(*latency)
        return latency or 0.0

    def _params(self, handler, query, body):
        params = dict(parse_qsl(query)) if query else {}
        if body:
            ctype = (handler.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if ctype == "application/json":
                try:
                    data = json.loads(body)
                except ValueError:
                    raise _Answer(400, "Bad Request: can't parse JSON") from None
                if not isinstance(data, dict):
                    raise _Answer(400, "Bad Request: JSON object expected")
                params.update(data)
            elif ctype == "application/x-www-form-urlencoded":
                try:
                    params.update(parse_qsl(body.decode("utf-8")))
                except UnicodeDecodeError:
                    raise _Answer(400, "Bad Request: invalid form") from None
            else:
                raise _Answer(400, "Bad Request: unsupported Content-Type %r" % ctype)
        return params

    def _answer(self, handler, answer):
        with self._lock:
            self._counts["status_%d" % answer.status] += 1
        data = {"ok": False, "error_code": answer.status, "description": answer.description}
        if answer.parameters:
            data["parameters"] = answer.parameters
        return handler._write(answer.status, json.dumps(data).encode())

    def _finish(self, handler, status, body, content_type=b"application/json"):
        if status != 200:
            with self._lock:
                self._counts["status_%d" % status] += 1
        return handler._write(status, body, content_type)

    def _drop(self, handler):
        handler.close_connection = True
        try:
            handler.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # -- Bot API methods (called outside the lock, except where they take it) --

    def _getMe(self, params):
        return {"id": 123456, "is_bot": True, "first_name": "Fake", "username": "fake_bot"}

    def _sendMessage(self, params):
        key = _chat_key(params)
        text = params.get("text")
        if not isinstance(text, str) or not text.strip():
            raise _Answer(400, "Bad Request: message text is empty")
        if len(text) > 4096:
            raise _Answer(400, "Bad Request: message is too long")
        now = time.monotonic()
        with self._lock:
            wait = 0.0
            if self.global_limit is not None:
                if self._global_window is None:
                    self._global_window = _Window(self.global_limit, self.tolerance)
                wait = self._global_window.wait_needed(now)
                if wait > 0:
                    self._counts["too_many_global"] += 1
            group = _is_group(key) and self.group_limit is not None
            limit = self.group_limit if group else self.chat_limit
            window = None
            if limit is not None:
                window = self._windows.get(key)
                if window is None:
                    window = self._windows[key] = _Window(limit, self.tolerance)
                chat_wait = window.wait_needed(now)
                if chat_wait > 0:
                    self._counts["too_many_group" if group else "too_many_chat"] += 1
                    wait = max(wait, chat_wait)
            if wait > 0:
                self._counts["too_many"] += 1
                seconds = math.ceil(wait * 1000) / 1000.0
                raise _Answer(429, "Too Many Requests: retry after %g" % seconds,
                              {"retry_after": seconds})
            if window is not None:
                window.times.append(now)
            if self._global_window is not None:
                self._global_window.times.append(now)
            self._next_message_id[key] += 1
            message = SentMessage(key, self._next_message_id[key], text, now)
            self._record[key].append(message)
            self._order.append(message)
        return {"message_id": message.message_id, "date": int(time.time()),
                "chat": _chat_json(key), "text": text}

    def _deleteMessage(self, params):
        key = _chat_key(params)
        message_id = _int_param(params, "message_id", required=True)
        with self._lock:
            exists = any(m.message_id == message_id for m in self._record.get(key, ()))
            if not exists or (key, message_id) in self._deleted:
                raise _Answer(400, "Bad Request: message to delete not found")
            self._deleted.append((key, message_id))
        return True

    def _sendChatAction(self, params):
        key = _chat_key(params)
        action = params.get("action")
        if action not in ("typing", "upload_photo", "record_video", "upload_video",
                          "record_voice", "upload_voice", "upload_document",
                          "choose_sticker", "find_location", "record_video_note",
                          "upload_video_note"):
            raise _Answer(400, "Bad Request: wrong parameter action in request")
        with self._lock:
            self._actions.append((key, action))
        return True

    def _getChatAdministrators(self, params):
        key = _chat_key(params)
        if not _is_group(key):
            raise _Answer(400, "Bad Request: there are no administrators in the private chat")
        with self._lock:
            users = self._admins.get(key)
        if users is None:
            users = [{"id": 1, "is_bot": False, "first_name": "Owner"}]
        return [{"status": "creator" if i == 0 else "administrator", "user": user}
                for i, user in enumerate(users)]

    def _restrictChatMember(self, params):
        key = _chat_key(params)
        if not _is_group(key):
            raise _Answer(400, "Bad Request: method is available only for supergroups")
        user_id = _int_param(params, "user_id", required=True)
        until = _int_param(params, "until_date", default=0)
        permissions = params.get("permissions")
        if isinstance(permissions, str):
            try:
                permissions = json.loads(permissions)
            except ValueError:
                permissions = None
        if not isinstance(permissions, dict):
            raise _Answer(400, "Bad Request: invalid permissions")
        with self._lock:
            self._restrictions.append((key, user_id, until, permissions))
        return True

    def _setWebhook(self, params):
        # Delivery to the URL: _webhooks.py (self.webhooks).
        url = params.get("url")
        if url and urlsplit(str(url)).scheme not in ("http", "https"):
            raise _Answer(400, "Bad Request: bad webhook: invalid URL")
        options = {"secret_token": params.get("secret_token") or None,
                   "max_connections": min(100, max(1, _int_param(
                       params, "max_connections", default=40))),
                   "allowed_updates": params.get("allowed_updates")}
        with self._lock:
            self._webhook = url or None
            self._webhook_options = options if url else {}
            if str(params.get("drop_pending_updates", "")).lower() in ("true", "1"):
                self._updates.clear()
            self._updates_changed.notify_all()
        return True

    def _deleteWebhook(self, params):
        with self._lock:
            self._webhook = None
            self._webhook_options = {}
            if str(params.get("drop_pending_updates", "")).lower() in ("true", "1"):
                self._updates.clear()
            self._updates_changed.notify_all()
        return True

    def _getWebhookInfo(self, params):
        with self._lock:
            return self.webhooks.info()

    def _getUpdates(self, params):
        offset = _int_param(params, "offset", default=0)
        limit = min(100, max(1, _int_param(params, "limit", default=100)))
        timeout = max(0, _int_param(params, "timeout", default=0))
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._webhook is not None:
                raise _Answer(409, "Conflict: can't use getUpdates method while webhook is "
                                   "active; use deleteWebhook to delete the webhook first")
            self._poll_generation += 1
            generation = self._poll_generation
            while True:
                updates = self._updates
                if offset < 0:
                    while len(updates) > -offset:
                        updates.popleft()
                else:
                    while updates and updates[0]["update_id"] < offset:
                        updates.popleft()
                if updates:
                    return list(itertools.islice(updates, limit))
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping:
                    return []
                self._updates_changed.wait(left)
                if generation != self._poll_generation:
                    raise _Answer(409, "Conflict: terminated by other getUpdates request; "
                                       "make sure that only one bot instance is running")


_METHODS = {name[1:].lower(): fn for name, fn in vars(FakeTelegramServer).items()
            if name[:1] == "_" and name[1:2].islower() and name[1:] in (
                "getMe", "sendMessage", "deleteMessage", "sendChatAction",
                "getChatAdministrators", "restrictChatMember", "setWebhook",
                "deleteWebhook", "getWebhookInfo", "getUpdates")}
