"""The HTTP client every platform sender shares: JSON over one pooled
keep-alive connection pool, a *total* deadline per call, and the platform's
secret kept out of logs, reprs and exceptions.

A platform sender (``fastdispatch.telegram.TelegramSender``,
``fastdispatch.discord.DiscordSender``) owns one :class:`JsonHttpClient`
and adds only what is its platform's: the URL of a method, the shape of its
answers, and which answers become which error.  The seams:

- ``JsonHttpClient(base_url, *, pool_size, timeout, connect_timeout,
  secrets=(), headers=None, max_answer_bytes=32 MiB)``: one urllib3 pool
  shared by every worker thread; never retries, never follows a redirect.
- ``client.request(method, path, *, json=None, body=None, headers=None,
  timeout=None) -> HttpAnswer(status, headers, data)``: ``timeout`` (default:
  the client's) is a deadline for the whole call: waiting for a pooled
  connection, connecting, sending, and reading the status line, the headers
  and the *whole* body.  A server that dribbles its answer a byte at a time
  cannot hold the calling thread past it.  No complete answer in time, or
  none at all -> :class:`HttpTransportError` (``reason`` names what
  happened, ``timed_out`` says whether the deadline did it).
- ``client.connect(timeout)`` and ``client.request_on(conn, ...)``: a
  connection of the caller's own, outside the pool (a long poll that
  another thread may cut with ``conn.sock.shutdown``), with the same
  deadline and the same errors.
- ``client.scrub(text)``: the text with every secret replaced by
  ``<token>``; :func:`describe` does it for an exception.
- :class:`PlatformError` and :class:`PlatformNetworkError`: the two errors
  a platform raises for "the platform refused" (not retried) and "the
  answer did not arrive" (a ``ConnectionError``, so ``RetryPolicy()``
  retries it).  Platforms subclass or reuse them.

How the deadline is kept.  urllib3's read timeout applies to each socket
read, not to the call.  A process-wide watchdog thread (:class:`_Watchdog`)
holds the deadline of every call in flight; when one passes, it shuts down
the socket of the connection that call is using, which ends whatever read or
write is blocked on it at once.  The connection is known because the pool's
connection class (:class:`_DeadlineHTTPConnection`) registers itself with
the calling thread's call when the request is sent, and the call reads its
body itself (``preload_content=False``) and disarms the watchdog *before*
the connection goes back to the pool, so the watchdog never touches a
connection another call has taken.  Cost: two lock round trips and a heap
push per call (measured in ``docs/telegram.md``).

Secrets.  The bot token is part of Telegram's URL path, which urllib3's
debug log prints: a filter on urllib3's loggers replaces every live client's
secrets.  Errors are built from scratch (never chained to the HTTP library's
exception, whose message and ``__context__`` carry the URL), with their text
scrubbed.
"""

import collections
import heapq
import http.client
import itertools
import json as _json
import logging
import os
import re
import socket
import threading
import time
import weakref
from typing import Any, Dict, Iterable, Mapping, NamedTuple, Optional
from urllib.parse import quote, urlsplit

try:
    import urllib3
except ImportError:  # pragma: no cover - depends on the installation
    raise ImportError("fastdispatch's platform senders need urllib3: pip install "
                      "'fastdispatch[telegram]'") from None
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import HTTPError as _Urllib3Error

from ._errors import DispatcherError
from ._netnum import parse_int

__all__ = ["JsonHttpClient", "HttpAnswer", "HttpTransportError", "PlatformError",
           "PlatformNetworkError", "describe", "check_seconds"]

DEFAULT_TIMEOUT = 30.0  # seconds, for calls made without a deadline of their own
MAX_ANSWER_BYTES = 32 << 20
_JSON_TYPE = "application/json"


def check_seconds(name: str, value: Any) -> float:
    """``value`` as a float of seconds > 0 and finite, or ``ValueError``
    naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            0 < value < float("inf")):
        raise ValueError("%s must be a positive number of seconds, got %r" % (name, value))
    if value > threading.TIMEOUT_MAX:
        raise ValueError("%s must be at most threading.TIMEOUT_MAX (%g) seconds, got %r"
                         % (name, threading.TIMEOUT_MAX, value))
    return float(value)


# -- errors ------------------------------------------------------------------

class PlatformError(DispatcherError):
    """The platform answered, and retrying the same request cannot help
    (a ``400 Bad Request``, ``401``, ``403 Forbidden: bot was blocked by the
    user``, ...), or the answer is not one of the platform's at all.

    ``status`` is the platform's error code (for Telegram the
    ``error_code``, i.e. the HTTP status), ``description`` its text,
    ``parameters`` its extra fields (Telegram's ``parameters``, e.g.
    ``migrate_to_chat_id``) or None, ``method`` the API method.  Not retried
    by the dispatcher.
    """

    def __init__(self, status, description, parameters=None, method=""):
        # A server's text may quote the request (a proxy echoing the path
        # holds the bot token): no live secret stays in it.
        description = scrub_secrets(description)
        super().__init__(status, description)
        self.status = status
        self.description = description
        self.parameters = parameters
        self.method = method

    def __str__(self):
        return "%s: answered %s: %s" % (self.method or "API call", self.status,
                                        self.description)

    def __reduce__(self):
        return (type(self), (self.status, self.description, self.parameters, self.method))


class PlatformNetworkError(ConnectionError):
    """The request may not have reached the platform, or its answer did not
    arrive: a ``5xx``, a refused or reset connection, the deadline, an
    answer cut off.  A ``ConnectionError``, so ``RetryPolicy()`` retries it.

    ``status`` is the HTTP status for a ``5xx``, else None; ``reason`` says
    what happened (never with a secret in it).  A send that failed this way
    *may* have been delivered (the answer was lost), so a retry can
    duplicate it.
    """

    def __init__(self, method, reason, status=None):
        reason = scrub_secrets(reason)
        super().__init__(reason)
        self.method = method
        self.reason = reason
        self.status = status

    def __str__(self):
        return "%s: %s" % (self.method, self.reason)

    def __reduce__(self):
        return (type(self), (self.method, self.reason, self.status))


class HttpTransportError(Exception):
    """No complete HTTP answer: raised by :class:`JsonHttpClient`, turned
    by the platform into its own error.  ``reason`` has no secret in it;
    ``timed_out`` is True when the call's deadline ended it."""

    def __init__(self, reason, timed_out=False):
        super().__init__(reason)
        self.reason = reason
        self.timed_out = timed_out


class HttpAnswer(NamedTuple):
    """One complete HTTP answer: ``status``, ``headers`` (case-insensitive
    mapping) and the whole body as ``data``."""

    status: int
    headers: Mapping[str, str]
    data: bytes

    def json(self) -> Any:
        """The body parsed as JSON, or None if it is not JSON (or holds a
        number too long for Python's int conversion limit)."""
        try:
            return _json.loads(self.data)
        except (ValueError, RecursionError):
            return None


def describe(exc: BaseException, secrets: Iterable[str] = ()) -> str:
    """``"TypeName: message"`` of an exception, with every secret replaced
    by ``<token>`` and cut to 200 characters."""
    text = str(exc)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<token>")
    if len(text) > 200:
        text = text[:200] + "..."
    return "%s: %s" % (type(exc).__name__, text) if text else type(exc).__name__


# -- secrets never reach a log -----------------------------------------------

def _spellings(secret):
    """A secret as it may come back in a server's text: as sent, and
    percent-encoded (upper- and lower-case hex), as a proxy may echo a path."""
    quoted = quote(secret, safe="")
    return {secret, quoted, re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quoted)}


def scrub_secrets(text: Any) -> Any:
    """``text`` (when a ``str``) with every live client's secret, in every
    spelling a server may echo it, replaced by ``<token>``."""
    if not isinstance(text, str):
        return text
    for secret in _redact.spellings:
        if secret in text:
            text = text.replace(secret, "<token>")
    return text

class _RedactSecrets(logging.Filter):
    """On urllib3's loggers: replace every live client's secrets by ``<token>``.

    A client's secrets are forgotten by a ``weakref.finalize`` callback, which
    the garbage collector may run in any thread at any allocation, also in a
    thread that holds ``_lock`` (a collection started inside ``remember``),
    so the callback never waits for the lock: it queues the secrets in
    ``_dead`` and takes the lock only if it is free, and whoever takes the
    lock next forgets them.  ``filter`` takes no lock: it reads ``secrets``,
    a tuple replaced whole under ``_lock``.  A dead client's secret may be
    redacted a little longer than it lives, never a live one's less.
    """

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()  # guards _owners and the replacing of secrets
        self._owners = collections.Counter()  # secret -> live owners holding it
        self._dead = collections.deque()  # secrets of dead owners, not yet forgotten
        self.secrets = ()  # the secrets of live owners, as one tuple
        self.spellings = ()  # those secrets and their percent-encodings, longest first

    def remember(self, owner, secrets):
        secrets = tuple(s for s in secrets if s)
        with self._lock:
            for s in secrets:
                self._owners[s] += 1
            self._update_locked()
        weakref.finalize(owner, self._forget, secrets)

    def _forget(self, secrets):
        self._dead.append(secrets)  # atomic: no lock for a finalizer to wait on
        if self._lock.acquire(blocking=False):
            try:
                self._update_locked()
            finally:
                self._lock.release()

    def _update_locked(self):
        owners, dead = self._owners, self._dead
        while dead:
            for s in dead.popleft():
                owners[s] -= 1
                if owners[s] <= 0:
                    del owners[s]
        self.secrets = tuple(owners)
        self.spellings = tuple(sorted({s for secret in owners for s in _spellings(secret)},
                                      key=len, reverse=True))

    def filter(self, record):
        secrets = self.spellings
        if not secrets:
            return True
        try:
            msg = record.getMessage()
        except Exception:  # a broken record is not ours to fix
            return True
        if any(s in msg for s in secrets):
            for s in secrets:
                msg = msg.replace(s, "<token>")
            record.msg, record.args = msg, None
        return True


_redact = _RedactSecrets()
for _name in ("urllib3.connectionpool", "urllib3.connection", "urllib3.response"):
    logging.getLogger(_name).addFilter(_redact)


# -- the deadline watchdog ---------------------------------------------------

class _Call:
    """One call in flight: its deadline and the connection it uses."""

    __slots__ = ("deadline", "conn", "fired", "done")

    def __init__(self, deadline):
        self.deadline = deadline
        self.conn = None  # the connection sending this call, once known
        self.fired = False  # the deadline passed while the call was in flight
        self.done = False  # disarmed: the watchdog must not touch it any more


def _cut(conn):
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed or never connected
            pass


class _Watchdog:
    """One daemon thread for the process: ends calls whose deadline passed
    by shutting down their connection's socket.

    ``_lock`` guards ``_heap``, ``_live``, ``_thread`` and every armed
    ``_Call``'s ``conn``/``fired``/``done``: a call's connection is cut only
    under it, and a call disarmed under it is never cut afterwards.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._heap = []  # (deadline, seq, _Call); disarmed calls are dropped lazily
        self._live = 0  # armed calls in the heap
        self._seq = itertools.count()
        self._thread = None
        self._pid = os.getpid()

    def arm(self, deadline):
        call = _Call(deadline)
        with self._lock:
            if self._thread is None or self._pid != os.getpid():
                self._start_locked()
            entry = (deadline, next(self._seq), call)
            heapq.heappush(self._heap, entry)
            self._live += 1
            if self._heap[0] is entry:
                self._changed.notify()
        return call

    def attach(self, call, conn):
        """``conn`` now carries ``call``; cut at once if it is already late."""
        with self._lock:
            call.conn = conn
            if call.fired:
                _cut(conn)

    def disarm(self, call):
        with self._lock:
            call.done = True
            call.conn = None
            self._live -= 1
            heap = self._heap
            if len(heap) > 64 and len(heap) > 2 * self._live:
                self._heap = [e for e in heap if not e[2].done]
                heapq.heapify(self._heap)

    def _start_locked(self):
        self._pid = os.getpid()
        self._heap, self._live = [], 0
        self._thread = threading.Thread(target=self._run, name="fastdispatch-http-deadlines",
                                        daemon=True)
        self._thread.start()

    def _run(self):
        with self._lock:
            while True:
                heap = self._heap
                while heap and heap[0][2].done:
                    heapq.heappop(heap)
                if not heap:
                    self._changed.wait()
                    continue
                wait = heap[0][0] - time.monotonic()
                if wait > 0:
                    self._changed.wait(min(wait, threading.TIMEOUT_MAX))
                    continue
                call = heapq.heappop(heap)[2]
                call.fired = True
                if call.conn is not None:
                    _cut(call.conn)


_watchdog = _Watchdog()
if hasattr(os, "register_at_fork"):
    def _after_fork():  # the child has no watchdog thread, and maybe a held lock
        global _watchdog
        _watchdog = _Watchdog()
    os.register_at_fork(after_in_child=_after_fork)

_current = threading.local()  # .call: the _Call this thread is making


class _DeadlineMixin:
    """On a pooled connection: tell the watchdog which connection carries
    the calling thread's call, just before it is sent."""

    def request(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        call = getattr(_current, "call", None)
        if call is not None:
            _watchdog.attach(call, self)
        return super().request(*args, **kwargs)  # type: ignore[misc]


class _DeadlineHTTPConnection(_DeadlineMixin, HTTPConnection):
    pass


class _DeadlineHTTPSConnection(_DeadlineMixin, HTTPSConnection):
    pass


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _DeadlineHTTPConnection


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _DeadlineHTTPSConnection


# -- the client --------------------------------------------------------------

class JsonHttpClient:
    """JSON over HTTP for a platform sender: one keep-alive pool shared by
    every thread, a total deadline per call, secrets redacted.  See the
    module docstring for the contract; thread-safe."""

    def __init__(self, base_url: str, *, pool_size: int = 100,
                 timeout: float = DEFAULT_TIMEOUT, connect_timeout: float = 10.0,
                 secrets: Iterable[str] = (), headers: Optional[Mapping[str, str]] = None,
                 max_answer_bytes: int = MAX_ANSWER_BYTES) -> None:
        if not isinstance(base_url, str):
            raise TypeError("base_url must be a str")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url must be an http:// or https:// URL, got %r" % (base_url,))
        try:
            port = parts.port
        except ValueError:
            raise ValueError("base_url has an invalid port: %r" % (base_url,)) from None
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError("pool_size must be a positive int, got %r" % (pool_size,))
        if isinstance(max_answer_bytes, bool) or not isinstance(max_answer_bytes, int) \
                or max_answer_bytes < 1:
            raise ValueError("max_answer_bytes must be a positive int")
        self.base_url = base_url.rstrip("/")
        self.path = parts.path.rstrip("/")
        self.timeout = check_seconds("timeout", timeout)
        self.connect_timeout = check_seconds("connect_timeout", connect_timeout)
        self.max_answer_bytes = max_answer_bytes
        self._secrets = tuple(s for s in secrets if s)
        self._headers = {"Connection": "keep-alive", **dict(headers or {})}
        self._json_headers = {**self._headers, "Content-Type": _JSON_TYPE}
        self._host, self._port, self._scheme = parts.hostname, port, parts.scheme
        pool_cls = _HTTPSPool if parts.scheme == "https" else _HTTPPool
        # block=True: a thread that finds every connection busy waits for
        # one (up to its deadline); retries=False: never retry here.
        self._pool = pool_cls(self._host, port, maxsize=pool_size, block=True,
                              retries=False)
        _redact.remember(self, self._secrets)

    def __repr__(self) -> str:
        return "JsonHttpClient(%r)" % (self.scrub(self.base_url),)

    def __reduce__(self):
        raise TypeError("a JsonHttpClient cannot be pickled (it may hold a secret)")

    def scrub(self, text: str) -> str:
        """``text`` with every secret of this client replaced by ``<token>``."""
        for secret in self._secrets:
            text = text.replace(secret, "<token>")
        return text

    def close(self) -> None:
        """Close the pool's connections.  Final: later calls fail."""
        self._pool.close()

    def _body(self, json, body, headers):
        if json is not None:
            data = _json.dumps(json, separators=(",", ":"), ensure_ascii=False).encode()
            return data, (self._json_headers if headers is None
                          else {**self._json_headers, **headers})
        return body, (self._headers if headers is None else {**self._headers, **headers})

    def request(self, method: str, path: str, *, json: Any = None,
                body: Optional[bytes] = None, headers: Optional[Dict[str, str]] = None,
                timeout: Optional[float] = None) -> HttpAnswer:
        """One call through the pool, all of it within ``timeout`` seconds."""
        data, headers = self._body(json, body, headers)
        t = max(self.timeout if timeout is None else timeout, 0.001)
        response, answer, err = self._exchange(t, lambda: self._pool.urlopen(
            method, self.path + path, body=data, headers=headers,
            retries=False, redirect=False, assert_same_host=False,
            timeout=urllib3.Timeout(connect=min(t, self.connect_timeout), read=t),
            # urllib3 annotates int, but hands it to queue.get(timeout=): a float works
            pool_timeout=t,  # type: ignore[arg-type]
            preload_content=False, release_conn=False))
        if err is not None:
            if response is not None:
                conn = response.connection
                if conn is not None:
                    conn.close()  # a half-read answer: not reusable
                response.release_conn()
            raise err
        response.release_conn()  # only now: the watchdog is done with its connection
        return answer

    def _exchange(self, t, send):
        """``send()`` (which sends the request and returns the response) and
        the reading of the whole answer, under a deadline of ``t`` seconds.
        Returns ``(response or None, answer or None, error or None)``; the
        error is built here and raised by the caller, outside any ``except``
        block, so it has no ``__context__`` that could carry the URL."""
        call = _watchdog.arm(time.monotonic() + t)
        response = answer = err = None
        _current.call = call
        try:
            response = send()
            answer = self._read(response)
        except (_Urllib3Error, OSError, http.client.HTTPException, HttpTransportError) as exc:
            err = exc
        finally:
            _current.call = None
            _watchdog.disarm(call)
        if err is not None:
            err = self._transport_error(err, call, t)
        return response, answer, err

    def _read(self, response):
        limit = self.max_answer_bytes
        declared = parse_int(response.headers.get("Content-Length"))
        if declared is not None and declared > limit:
            raise HttpTransportError("the answer is %d bytes, over the %d-byte limit"
                                     % (declared, limit))
        data = response.read(limit + 1)
        if len(data) > limit:
            raise HttpTransportError("the answer is over the %d-byte limit" % limit)
        return HttpAnswer(response.status, response.headers, data)

    def _transport_error(self, exc, call, t):
        if isinstance(exc, HttpTransportError) and not call.fired:
            return exc
        timed_out = isinstance(exc, (socket.timeout, urllib3.exceptions.TimeoutError))
        # The deadline ended the call if the watchdog cut it, or if a socket
        # timeout (none is longer than the call's) fired once the deadline
        # had passed: on a loaded machine the watchdog's thread may not have
        # run yet, and the error must not depend on which came first.
        if call.fired or (timed_out and time.monotonic() >= call.deadline):
            return HttpTransportError("timed out: no complete answer within the call's "
                                      "%.3g s deadline" % t, timed_out=True)
        return HttpTransportError(describe(exc, self._secrets), timed_out=timed_out)

    # -- a connection of the caller's own -------------------------------------

    def connect(self, timeout: float) -> HTTPConnection:
        """A new connection outside the pool (opened on first use); the
        caller closes it, and may cut it from another thread with
        ``conn.sock.shutdown(socket.SHUT_RDWR)``."""
        cls = _DeadlineHTTPSConnection if self._scheme == "https" else _DeadlineHTTPConnection
        return cls(self._host, self._port, timeout=timeout)

    def request_on(self, conn: HTTPConnection, method: str, path: str, *, json: Any = None,
                   body: Optional[bytes] = None, headers: Optional[Dict[str, str]] = None,
                   timeout: Optional[float] = None) -> HttpAnswer:
        """Like :meth:`request`, on ``conn``; the whole call within ``timeout``."""
        data, headers = self._body(json, body, headers)
        t = max(self.timeout if timeout is None else timeout, 0.001)

        def send():
            conn.timeout = t
            if conn.sock is not None:
                conn.sock.settimeout(t)
            conn.request(method, self.path + path, body=data, headers=headers,
                         preload_content=False)
            return conn.getresponse()
        _, answer, err = self._exchange(t, send)
        if err is not None:
            raise err
        return answer
