"""The threaded local HTTP server every fake platform server is built on.

:class:`LocalServer` is what ``FakeTelegramServer`` (``_telegram.py``) and
``FakeDiscordServer`` (``_discord.py``) are made of, and what a fake of
another platform is meant to be made of: everything here is about HTTP and
tests, nothing about a platform.

- **HTTP/1.1, keep-alive, one thread per connection** (the standard
  library's ``ThreadingHTTPServer``), on 127.0.0.1 and a port the OS picks;
  ``start()``/``stop()`` or ``with``; ``stop()`` ends long polls and closes
  every open connection.
- **Bounded, whatever the client does**: at most ``max_connections``
  connections (so threads) at once: one more takes the place of a
  connection idle between requests, or is answered 503 when all are busy; a
  connection idle for ``idle_timeout`` is closed; a request's head (request
  line and headers, at most ``max_header`` bytes: 431 beyond) and body must
  all arrive within ``request_timeout`` of its first byte (one deadline for
  the whole request, not per read: 408 past it), and an answer must be taken
  within ``request_timeout`` too.
- **Requests**: :meth:`LocalServer._serve` reads the body, framed by
  ``Content-Length`` or ``Transfer-Encoding: chunked`` (at most ``max_body``
  bytes either way: 413 beyond, and the connection is closed), answers
  ``/control/...`` itself when the control endpoint is on, and hands
  everything else to the platform's :meth:`LocalServer._handle_request` as a
  :class:`Request`.
  :func:`parse_params` reads parameters from the query string and from
  ``application/json``, ``application/x-www-form-urlencoded`` and
  ``multipart/form-data`` bodies.
- **Answers**: :meth:`_reply` writes one (``Content-Length`` always set),
  :meth:`_drop` closes the connection without one, :meth:`_truncate` sends
  half of it and closes.
- **Faults**: :class:`FaultPlan`: faults planned one by one per method
  (``inject``), random ones at configured rates (``set_fault_rates``),
  seeded.  The plan knows fault *names*; what an ``"error"`` or a
  ``"too_many"`` answer looks like is the platform's (``_fault_answer``).
- **Latency**: every answer held back ``latency`` seconds (or uniform in a
  ``(low, high)`` range), after the request was processed and recorded.
  ``arrival_jitter`` (the same forms) holds each request *before* it is
  processed, like network paths of different lengths: requests sent at
  once are then processed, and recorded, in a shuffled order.
- **The record**: :class:`Record`, what arrived, per chat (channel) and in
  arrival order.
- **Control from outside the process** (``control=True``): ``POST
  /control/<action>`` with a JSON object of keyword arguments calls the
  server's method of that name among :attr:`LocalServer.control_actions`
  and answers ``{"ok": true, "result": ...}`` (400 ``{"ok": false,
  "error": ...}`` for bad arguments, 404 for an unknown action).  A
  platform adds its own actions to the tuple.  Only a request a browser
  cannot forge is obeyed: ``Content-Type: application/json`` (415
  otherwise), ``Host`` this server's address and port, and no foreign
  ``Origin`` (403 otherwise): a web page cannot drive it, by a cross-site
  request or by DNS rebinding.

Threads and locks.  Request handlers run on the server's connection threads.
``_lock`` guards all mutable state of the server and of its subclass (the
record, the fault plan, the counters, and whatever the platform keeps);
``_changed`` is a Condition on that same lock, for long polls.  Sleeping
(latency, injected delays) happens outside the lock.
"""

import collections
import io
import json
import logging
import math
import random
import socket
import sys
import threading
import time
from email import policy as _email_policy
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Set, Tuple
from urllib.parse import parse_qsl

from ..pacing import RateLimit

__all__ = ["LocalServer", "Request", "FaultPlan", "Record", "Upload", "BadParams",
           "parse_params", "parse_length", "check_latency", "as_limit"]

_log = logging.getLogger("fastdispatch.testing")

FAULTS = ("error", "too_many", "drop", "drop_after", "garbage", "truncate", "delay")


class BadParams(Exception):
    """The request's parameters cannot be read; ``str()`` says why."""


class Upload(NamedTuple):
    """A file part of a ``multipart/form-data`` body."""

    filename: str
    content_type: str
    data: bytes


class Request(NamedTuple):
    """One HTTP request as the platform's handler sees it."""

    command: str  # GET, POST, ...
    path: str  # without the query string
    query: str
    headers: Any  # http.client.HTTPMessage: case-insensitive .get()
    body: bytes


def as_limit(name: str, value: Any) -> Any:
    """A fake server's limit argument: a ``RateLimit``, a ``(count, per)`` tuple, or None."""
    if value is None or isinstance(value, RateLimit):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return RateLimit(value[0], per=value[1])
    raise TypeError("%s must be a RateLimit, a (count, per) tuple or None, got %r"
                    % (name, value))


def parse_params(query: str, content_type: str, body: bytes) -> Dict[str, Any]:
    """Parameters from the query string, then from the body: a JSON object,
    a form (``application/x-www-form-urlencoded``) or ``multipart/form-data``
    (text parts become ``str``, file parts :class:`Upload`).  Raises
    :class:`BadParams`."""
    params: Dict[str, Any] = dict(parse_qsl(query)) if query else {}
    if not body:
        return params
    ctype = (content_type or "").split(";")[0].strip().lower()
    if ctype == "application/json":
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            raise BadParams("can't parse JSON") from None
        if not isinstance(data, dict):
            raise BadParams("JSON object expected")
        params.update(data)
    elif ctype == "application/x-www-form-urlencoded":
        try:
            params.update(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
        except UnicodeDecodeError:
            raise BadParams("invalid form") from None
    elif ctype == "multipart/form-data":
        params.update(_parse_multipart(content_type, body))
    else:
        raise BadParams("unsupported Content-Type %r" % ctype)
    return params


def _parse_multipart(content_type, body):
    # The standard library's MIME parser (what cgi.FieldStorage used),
    # given the request's Content-Type as the message's header.
    head = b"Content-Type: " + content_type.encode("latin-1", "replace") + b"\r\n\r\n"
    try:
        message = BytesParser(policy=_email_policy.HTTP).parsebytes(head + body)
    except Exception:  # the parser's errors are not one family
        raise BadParams("invalid multipart/form-data body") from None
    if not message.is_multipart() or message.defects:
        raise BadParams("invalid multipart/form-data body")
    params = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str) or not name:
            raise BadParams("a multipart/form-data part without a name")
        data = part.get_payload(decode=True) or b""
        filename = part.get_filename()
        if filename is not None:
            params[name] = Upload(filename, part.get_content_type(), data)
            continue
        charset = part.get_content_charset() or "utf-8"
        try:
            params[name] = data.decode(charset)
        except (LookupError, UnicodeDecodeError):
            raise BadParams("a multipart/form-data part is not %s text" % charset) from None
    return params


def parse_length(text: str, base: int = 10) -> Optional[int]:
    """A byte count from the network (``Content-Length``, a chunk size): ASCII
    digits only (hexadecimal ones for ``base=16``), at most 15 of them; None
    otherwise (``int()`` would take "+1", " 1", "1_0" or "\u00b2"-like digits)."""
    allowed = "0123456789abcdefABCDEF" if base == 16 else "0123456789"
    if not text or len(text) > 15 or text.strip(allowed):
        return None
    return int(text, base)


def check_latency(latency: Any) -> Any:
    """``latency`` (seconds >= 0, or a ``(low, high)`` tuple of them) as
    floats, or ``ValueError``."""
    def seconds(x):
        return not isinstance(x, bool) and isinstance(x, (int, float)) and 0 <= x < math.inf
    if isinstance(latency, tuple) and len(latency) == 2 and all(map(seconds, latency)) \
            and latency[0] <= latency[1]:
        return (float(latency[0]), float(latency[1]))
    if seconds(latency):
        return float(latency)
    raise ValueError("latency must be seconds >= 0 or a (low, high) tuple of them, got %r"
                     % (latency,))


class FaultPlan:
    """The faults the next calls meet: planned ones first (in order, each
    for one method or any, and for one target (a chat) or any), then random
    ones at configured rates.  Not locked itself: the server's ``_lock``
    guards it."""

    def __init__(self, rng: random.Random, default_method: Optional[str]) -> None:
        self._rng = rng
        self._planned: List[Tuple[str, Optional[str], Dict[str, Any], Optional[str]]] = []
        self._rates: Dict[str, float] = {}
        self._rate_method = default_method
        self._rate_options: Dict[str, Any] = {}

    def plan(self, fault: str, count: int, method: Optional[str], options: Dict[str, Any],
             target: Optional[str] = None):
        if fault not in FAULTS:
            raise ValueError("fault must be one of %s, got %r" % (", ".join(FAULTS), fault))
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError("count must be a non-negative int")
        self._planned.extend([(fault, method, options, target)] * count)

    def set_rates(self, method: Optional[str], rates: Dict[str, float],
                  options: Dict[str, Any]) -> None:
        for name, rate in rates.items():
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
                raise ValueError("%s must be a probability between 0 and 1" % name)
        if sum(rates.values()) > 1:
            raise ValueError("the fault rates must add up to at most 1")
        self._rates = {k: float(v) for k, v in rates.items() if v}
        self._rate_method = method
        self._rate_options = options

    def pick(self, method: str, target: Optional[str] = None
             ) -> Tuple[Optional[str], Optional[Dict[str, Any]]]:
        """The fault for this call of ``method`` (naming ``target``, or
        nothing) and its options, or (None, None)."""
        planned = self._planned
        for i, (fault, fmethod, options, ftarget) in enumerate(planned):
            if (fmethod is None or fmethod == method) and (ftarget is None
                                                            or ftarget == target):
                del planned[i]
                return fault, options
        if self._rates and (self._rate_method is None or self._rate_method == method):
            roll = self._rng.random()
            for fault, rate in self._rates.items():
                if roll < rate:
                    return fault, self._rate_options
                roll -= rate
        return None, None


class Record:
    """What arrived, per chat and in arrival order.  Not locked itself: the
    server's ``_lock`` guards it."""

    def __init__(self) -> None:
        self._by_chat: Dict[str, list] = collections.defaultdict(list)
        self._order: list = []

    def add(self, chat_key: str, item: Any) -> None:
        self._by_chat[chat_key].append(item)
        self._order.append(item)

    def chat(self, chat_key: str) -> list:
        return list(self._by_chat.get(chat_key, ()))

    def count(self, chat_key: str) -> int:
        return len(self._by_chat.get(chat_key, ()))

    def chats(self) -> List[str]:
        return list(self._by_chat)

    def all(self) -> list:
        return list(self._order)

    def __len__(self) -> int:
        return len(self._order)


class _DeadlineSocketReader(io.RawIOBase):
    """The connection's bytes, each read bounded by the current deadline:
    a request's reads share one deadline (a client that drips a header line
    every few seconds is cut off when the request's time is up, not when
    one read is slow)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.deadline = math.inf

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("the request's deadline has passed")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _TooLarge(Exception):
    """A request's head or body is over its limit (``status``: 431 or 413)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _BadBody(Exception):
    """A request's framing cannot be read (a bad ``Content-Length`` or chunk)."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    @property
    def server_version(self):  # type: ignore[override]
        return self.server.fake.server_name

    def setup(self):
        # Not the base's setup: the reads go through the deadline reader.
        self.connection = self.request
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # pragma: no cover - not a TCP socket
            pass
        self._reader = _DeadlineSocketReader(self.connection)
        self.rfile = io.BufferedReader(self._reader, 16384)
        self.wfile = _SocketWriter(self.connection)

    def finish(self):
        self.server.fake._connection_closed(self.connection)

    def log_message(self, format, *args):  # quiet: tests read the record instead
        pass

    def handle_one_request(self):
        """One request: wait for its first byte up to ``idle_timeout``, then
        read its head (at most ``max_header`` bytes) and, in ``_serve``, its
        body (at most ``max_body``), all before ``request_timeout`` has
        passed since that first byte."""
        fake = self.server.fake
        self.close_connection = True
        reader = self._reader
        reader.deadline = time.monotonic() + fake.idle_timeout
        fake._connection_idle(self.connection, True)
        try:
            first = self.rfile.peek(1)
        except (socket.timeout, OSError):
            return
        finally:
            fake._connection_idle(self.connection, False)
        if not first:
            return
        reader.deadline = time.monotonic() + fake.request_timeout
        try:
            head = self._read_head(fake.max_header)
        except socket.timeout:
            return self._refuse(408, "Request Timeout")
        except _TooLarge:
            return self._refuse(431, "Request Header Fields Too Large")
        if head is None:
            return
        requestline, header_block = head
        self.raw_requestline = requestline
        rfile, self.rfile = self.rfile, io.BytesIO(header_block)
        try:
            parsed = self.parse_request()
        finally:
            self.rfile = rfile
        if not parsed:  # the base answered (400, 505, ...)
            self.close_connection = True
            return
        self.wfile.timeout = fake.request_timeout
        if self.command not in ("GET", "POST", "PUT", "PATCH", "DELETE"):
            return self._refuse(501, "Not Implemented")
        try:
            fake._serve(self)
        except socket.timeout:
            self.close_connection = True
        self.wfile.flush()

    def _read_head(self, budget):
        """(request line, header lines) within ``budget`` bytes; None when
        the client closed."""
        lines = []
        while True:
            line = self.rfile.readline(budget + 1)
            if len(line) > budget:
                raise _TooLarge(431)
            budget -= len(line)
            if not line:
                return None
            if not lines and line in (b"\r\n", b"\n"):
                continue  # a stray CRLF before a request (RFC 9112 2.2)
            lines.append(line)
            if len(lines) > 1 and line in (b"\r\n", b"\n"):
                return lines[0], b"".join(lines[1:])
            if len(lines) > 101:
                raise _TooLarge(431)

    def _refuse(self, status, reason):
        self.close_connection = True
        self.server.fake._count_status(status)
        body = json.dumps({"error": reason}).encode()
        try:
            self.wfile.timeout = 1.0
            self.wfile.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                             % (status, reason.encode(), len(body), body))
        except OSError:
            pass


class _SocketWriter:
    """The connection's write side: each answer is sent whole within
    ``timeout`` seconds (``sendall`` counts the total), so a client that
    never reads cannot hold a thread."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.timeout = 10.0

    def write(self, data: bytes) -> int:
        self._sock.settimeout(self.timeout)
        self._sock.sendall(data)
        return len(data)

    def flush(self) -> None:
        pass


class _Server(ThreadingHTTPServer):
    fake: Any = None  # the LocalServer it serves
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def process_request(self, request, client_address):
        # At most max_connections connections (so threads) at once: a new one
        # beyond takes the place of one that waits idle between requests,
        # or is answered 503 at once when every one is busy.
        if not self.fake._admit(request):
            try:
                request.setblocking(False)
                try:  # what arrived already: closing over unread bytes resets
                    request.recv(65536)
                except OSError:
                    pass
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                b"Connection: close\r\nRetry-After: 1\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:  # no thread could start
            self.fake._connection_closed(request)
            self.shutdown_request(request)
            raise

    def handle_error(self, request, client_address):
        # A client that goes away mid-request (a timeout, a test that
        # closes its connection) is normal here, not worth a traceback.
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            return
        _log.exception("%s: error while serving %s", type(self.fake).__name__, client_address)


class LocalServer:
    """A local HTTP server for tests; a platform's fake subclasses it.

    Subclasses implement :meth:`_handle_request` (and :meth:`_fault_answer`
    for the ``error``/``too_many`` faults), call ``_faults.pick`` and the
    answer helpers, keep their state under ``_lock`` and reset it in
    :meth:`_reset_state`.
    """

    server_name = "FakeServer/1"
    thread_name = "fake-server"
    default_fault_method: Optional[str] = None
    #: The methods ``POST /control/<name>`` may call (with JSON keyword arguments).
    control_actions: Tuple[str, ...] = ("inject", "set_fault_rates", "reset", "stats",
                                        "set_latency", "messages", "chats", "all_messages")

    def __init__(self, *, latency: Any = 0.0, seed: Optional[int] = None,
                 max_body: int = 1 << 20, host: str = "127.0.0.1", port: int = 0,
                 control: bool = False, arrival_jitter: Any = 0.0, max_header: int = 65536,
                 request_timeout: float = 10.0, idle_timeout: float = 60.0,
                 max_connections: int = 128) -> None:
        for name, value in (("max_body", max_body), ("max_header", max_header),
                            ("max_connections", max_connections)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError("%s must be a positive int, got %r" % (name, value))
        for name, value in (("request_timeout", request_timeout),
                            ("idle_timeout", idle_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    0 < value < math.inf):
                raise ValueError("%s must be a positive number of seconds, got %r"
                                 % (name, value))
        self.latency = latency
        self.arrival_jitter = arrival_jitter
        self.max_body = max_body
        self.max_header = max_header
        self.request_timeout = float(request_timeout)
        self.idle_timeout = float(idle_timeout)
        self.max_connections = max_connections
        self.control = bool(control)
        self._host, self._port = host, port
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()  # guards everything mutable, the subclass's too
        self._changed = threading.Condition(self._lock)
        self._rng = random.Random(seed)
        self._connections: Dict[socket.socket, bool] = {}  # open connection -> idle now
        self._stopping = False
        with self._lock:
            self._reset_state()

    def _reset_state(self) -> None:
        """Forget the record, the faults and the counters (called with
        ``_lock`` held; a subclass extends it)."""
        self._record = Record()
        self._faults = FaultPlan(self._rng, self.default_fault_method)
        self._counts: collections.Counter = collections.Counter()

    # -- configuration -------------------------------------------------------

    @property
    def latency(self) -> Any:
        """Seconds each answer is held back, or ``(low, high)``; settable."""
        return self._latency

    @latency.setter
    def latency(self, value: Any) -> None:
        self._latency = check_latency(value)

    def set_latency(self, latency: Any) -> None:
        """``server.latency = latency`` (for the control endpoint)."""
        self.latency = tuple(latency) if isinstance(latency, list) else latency

    @property
    def arrival_jitter(self) -> Any:
        """Seconds each request is held before it is processed (and
        recorded), or ``(low, high)`` for a uniform random time; settable.
        A random one reorders requests that were sent at once."""
        return self._arrival_jitter

    @arrival_jitter.setter
    def arrival_jitter(self, value: Any) -> None:
        self._arrival_jitter = check_latency(value)

    # -- lifecycle -----------------------------------------------------------

    def start(self):
        """Bind the host on a free port and serve on a background thread."""
        if self._server is not None:
            raise RuntimeError("the server is already started")
        server = _Server((self._host, self._port), _Handler)
        server.fake = self
        self._server = server
        self._stopping = False
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                  name=self.thread_name, daemon=True)
        self._thread = thread
        thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end long polls, close every connection.  Idempotent."""
        server = self._server
        if server is None:
            return
        with self._lock:
            self._stopping = True
            self._changed.notify_all()
            connections = list(self._connections)
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

    def __enter__(self):
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
        """``http://127.0.0.1:<port>``."""
        return "http://%s:%d" % (self._host, self.port)

    @property
    def control_url(self) -> str:
        """``http://127.0.0.1:<port>/control`` (when started with ``control=True``)."""
        if not self.control:
            raise RuntimeError("the control endpoint is off (control=False)")
        return self.base_url + "/control"

    def _admit(self, conn) -> bool:
        """Whether a new connection may be served (it is then counted): below
        ``max_connections``, or in the place of one idle between requests
        (closed here; its thread ends at once)."""
        with self._lock:
            if len(self._connections) >= self.max_connections:
                idle = next((c for c, is_idle in self._connections.items() if is_idle), None)
                if idle is None:
                    self._counts["refused_connections"] += 1
                    return False
                del self._connections[idle]
                self._counts["evicted_connections"] += 1
                try:
                    idle.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._connections[conn] = False
            self._counts["connections"] += 1
            return True

    def _connection_idle(self, conn, idle):
        with self._lock:
            if conn in self._connections:
                self._connections[conn] = idle

    def _connection_closed(self, conn):
        with self._lock:
            self._connections.pop(conn, None)

    def _count_status(self, status):
        with self._lock:
            self._counts["status_%d" % status] += 1

    # -- faults --------------------------------------------------------------

    def _fault_options(self, **options: Any) -> Dict[str, Any]:
        """Check and normalise a fault's options (a platform extends it)."""
        return {"status": int(options.get("status", 500)),
                "retry_after": float(options.get("retry_after", 1.0)),
                "seconds": float(options.get("seconds", 0.0))}

    def _plan_fault(self, fault, count, method, target=None, **options):
        options = self._fault_options(**options)
        with self._lock:
            self._faults.plan(fault, count, method, options, target)

    def _plan_rates(self, method, rates, **options):
        options = self._fault_options(**options)
        with self._lock:
            self._faults.set_rates(method, rates, options)

    def _pick_fault(self, method, target=None):
        with self._lock:
            self._counts["requests"] += 1
            fault, options = self._faults.pick(method, target)
            if fault is not None:
                self._counts["injected_" + fault] += 1
        return fault, options

    # -- the record and counters ----------------------------------------------

    def messages(self, chat_id: Any) -> list:
        """What arrived in one chat, in arrival order."""
        with self._lock:
            return self._record.chat(str(chat_id))

    def chats(self) -> List[str]:
        """Every chat that received at least one message."""
        with self._lock:
            return self._record.chats()

    def all_messages(self) -> list:
        """Every message that arrived, in arrival order."""
        with self._lock:
            return self._record.all()

    def stats(self) -> Dict[str, int]:
        """Counters: ``requests``, ``connections`` (opened), ``sent``
        (messages recorded), ``injected_<fault>``, ``status_<n>``, and the
        platform's own."""
        with self._lock:
            counts = dict(self._counts)
            counts["sent"] = len(self._record)
            return counts

    def reset(self) -> None:
        """Forget the record, the faults, the counters and the platform's
        state (the server keeps running)."""
        with self._lock:
            self._reset_state()
            self._changed.notify_all()

    # -- serving ---------------------------------------------------------------

    def _serve(self, handler):
        path, _, query = handler.path.partition("?")
        try:
            body = self._read_body(handler)
        except _TooLarge:
            handler.close_connection = True  # the rest of the body is not read
            status, answer = self._error_body(413, "Request Entity Too Large")
            return self._reply(handler, status, answer)
        except _BadBody as exc:
            handler.close_connection = True
            status, answer = self._error_body(400, "Bad Request: %s" % exc)
            return self._reply(handler, status, answer)
        request = Request(handler.command, path, query, handler.headers, body)
        if self.control and path.startswith("/control/"):
            return self._serve_control(handler, request)
        try:
            return self._handle_request(handler, request)
        except Exception as exc:  # a bug here must not kill the connection thread
            _log.exception("%s: error handling %s", type(self).__name__, path)
            status, answer = self._error_body(500, "Internal Server Error: %r" % (exc,))
            return self._reply(handler, status, answer)

    def _read_body(self, handler) -> bytes:
        """The request's body, framed by ``Content-Length`` or ``Transfer-Encoding:
        chunked`` (both at most ``max_body`` bytes), within the request's
        deadline (a ``socket.timeout`` past it)."""
        headers = handler.headers
        coding = headers.get_all("Transfer-Encoding")
        lengths = headers.get_all("Content-Length")
        if coding:
            if lengths:  # both: a request smuggling attempt, RFC 9112 6.1
                raise _BadBody("both Content-Length and Transfer-Encoding")
            if [c.strip().lower() for c in ",".join(coding).split(",")] != ["chunked"]:
                raise _BadBody("unsupported Transfer-Encoding")
            return self._read_chunked(handler.rfile)
        if not lengths:
            return b""
        if len(set(lengths)) != 1:
            raise _BadBody("conflicting Content-Length")
        length = parse_length(lengths[0])
        if length is None:
            raise _BadBody("invalid Content-Length")
        if length > self.max_body:
            raise _TooLarge(413)
        body = handler.rfile.read(length) if length else b""
        if len(body) != length:
            raise socket.timeout("the client closed before the end of the body")
        return body

    def _read_chunked(self, rfile) -> bytes:
        parts, total = [], 0
        while True:
            line = rfile.readline(1026)
            if not line.endswith(b"\n"):
                raise _BadBody("invalid chunk size line")
            size = parse_length(line.split(b";", 1)[0].strip().decode("latin-1"), 16)
            if size is None:
                raise _BadBody("invalid chunk size")
            total += size
            if total > self.max_body:
                raise _TooLarge(413)
            if size == 0:
                break
            data = rfile.read(size)
            if len(data) != size:
                raise socket.timeout("the client closed inside a chunk")
            parts.append(data)
            if rfile.readline(3) not in (b"\r\n", b"\n"):
                raise _BadBody("a chunk not followed by CRLF")
        budget = self.max_header  # trailer fields, read and ignored
        while True:
            line = rfile.readline(budget + 1)
            budget -= len(line)
            if budget < 0:
                raise _TooLarge(413)
            if line in (b"\r\n", b"\n"):
                return b"".join(parts)
            if not line:
                raise socket.timeout("the client closed inside the trailer")

    def _handle_request(self, handler, request: Request) -> None:  # pragma: no cover
        raise NotImplementedError

    def _error_body(self, status: int, description: str) -> Tuple[int, bytes]:
        """An error answer in the platform's shape (a platform overrides it)."""
        return status, json.dumps({"error": description}).encode()

    def _hold_answer(self):
        """Sleep the configured latency (outside the lock)."""
        self._sleep(self._latency)

    def _hold_arrival(self):
        """Sleep the configured arrival jitter (outside the lock)."""
        self._sleep(self._arrival_jitter)

    def _sleep(self, seconds):
        if isinstance(seconds, tuple):
            with self._lock:
                seconds = self._rng.uniform(*seconds)
        if seconds:
            threading.Event().wait(seconds)

    def _reply(self, handler, status, body, content_type=b"application/json", declared=None,
               headers=()):
        if status >= 300:
            self._count_status(status)
        reason = handler.responses.get(status, ("Unknown",))[0].encode("latin-1")
        length = len(body) if declared is None else declared
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
            status, reason, content_type, length)
        for name, value in headers:
            head += b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1"))
        if handler.close_connection:
            head += b"Connection: close\r\n"
        handler.wfile.write(head + b"\r\n" + body)

    def _drop(self, handler):
        handler.close_connection = True
        try:
            handler.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _truncate(self, handler, status, body, content_type=b"application/json"):
        handler.close_connection = True
        self._reply(handler, status, body[: len(body) // 2], content_type, declared=len(body))
        self._drop(handler)

    # -- the control endpoint ---------------------------------------------------

    def _serve_control(self, handler, request):
        refused = self._control_refusal(request)
        if refused:
            return self._control_reply(handler, refused[0], {"ok": False, "error": refused[1]})
        name = request.path[len("/control/"):]
        if name not in self.control_actions:
            return self._control_reply(handler, 404, {"ok": False, "error": "no such action: %r; "
                                                      "actions: %s" % (
                                                          name, ", ".join(self.control_actions))})
        try:
            args = json.loads(request.body) if request.body.strip() else {}
        except (ValueError, RecursionError):
            args = None
        if not isinstance(args, dict):
            return self._control_reply(handler, 400, {"ok": False,
                                                      "error": "a JSON object expected"})
        try:
            attr = getattr(self, name)
            result = attr(**args) if callable(attr) else attr
        except (TypeError, ValueError, KeyError) as exc:
            return self._control_reply(handler, 400, {"ok": False, "error": "%s: %s" % (
                type(exc).__name__, exc)})
        return self._control_reply(handler, 200, {"ok": True, "result": _jsonable(result)})

    def _control_refusal(self, request) -> Optional[Tuple[int, str]]:
        """Why a control request is refused, or None.  A web page open in a
        browser on this machine must not drive the server: a cross-site
        request is refused by its ``Origin`` (or ``Sec-Fetch-Site``), a
        "simple" one (no CORS preflight) by its Content-Type, which must be
        ``application/json``, and DNS rebinding (a foreign name resolving to
        127.0.0.1) by its ``Host``, which must be this server's address and
        port (or ``localhost:<port>``)."""
        headers = request.headers
        if request.command != "POST":
            return 405, "control actions are POST requests"
        port = self.port
        hosts = {"%s:%d" % (self._host, port), "localhost:%d" % port}
        if ":" in self._host:
            hosts.add("[%s]:%d" % (self._host, port))
        host = headers.get_all("Host") or []
        if len(host) != 1 or host[0].strip().lower() not in hosts:
            return 403, "the Host header must be one of %s" % ", ".join(sorted(hosts))
        origin = headers.get("Origin")
        if origin is not None and origin.strip().lower() not in {"http://" + h for h in hosts}:
            return 403, "cross-origin control requests are refused"
        if (headers.get("Sec-Fetch-Site") or "same-origin").strip().lower() not in (
                "same-origin", "none"):
            return 403, "cross-site control requests are refused"
        ctype = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "application/json":
            return 415, "control requests must have Content-Type: application/json"
        return None

    def _control_reply(self, handler, status, data):
        self._reply(handler, status, json.dumps(data).encode())


def _jsonable(value):
    if hasattr(value, "_asdict"):
        return {k: _jsonable(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value
