"""The web servers the package runs: the Telegram webhook, Discord's
interactions endpoint, ``/healthz`` and ``/metrics``; and what every runner
shares (:class:`Run`: signals, the servers it started, and saying what
happens to a program without logging).

They face the network, where one client must not take a bot down.  The
server is cheroot (CherryPy's threaded WSGI server, the
``fastdispatch[webhook]`` extra) with every limit set (cheroot's own
defaults are unlimited):

- **header size**: ``max_header_bytes`` (16 KiB) for the request line and
  the headers together; beyond it 414/431-style errors, unread;
- **body size**: ``max_body`` (1 MiB); a larger declared body is answered
  413 unread, a chunked one is cut there;
- **a total deadline per request**, ``request_timeout`` (10 s): from the
  moment a thread takes the connection until the request's headers and
  body are in.  cheroot's own timeout is per read: a client that sends one
  header line every 2 s would hold a thread for as long as it likes.  The
  HTTP client's watchdog (``fastdispatch._http``) cuts the connection's
  socket at the deadline; the app then runs on a body already read;
- **threads and connections**: ``threads`` request threads; a new
  connection waits for its first byte in cheroot's selector, not on a
  thread (idle ones are closed after ``request_timeout``); at most 100
  connections with a request begun wait for a thread (Telegram's largest
  ``max_connections``; more are answered 503 and closed); at most
  ``threads`` idle keep-alive
  connections kept; the
  kernel holds up to 128 connections not accepted yet (cheroot's default
  of 5 made clients beyond it wait for SYN retransmissions: 100
  connections took 15 s to open, against 0.0 s with 128).

What a slow client can still do: once it sent a byte, hold one thread for
up to ``request_timeout``; ``threads`` of them, reconnecting, keep the
endpoint busy (a proxy that limits connections per address is the remedy).
Idle connections cost a file descriptor each until they are closed.  A TLS
handshake (``ssl_certfile``) happens on cheroot's accepting thread: behind
a proxy that terminates TLS, it does not.
"""

import io
import json
import logging
import queue
import signal
import socket
import threading
import time
from typing import Any, Callable, Optional

from . import _http
from ._drain import ShutdownReport, drain_engine
from ._netnum import parse_int
from ._signals import SignalRelay

__all__ = ["Server", "Stopper", "NewcomerLogging", "Run", "check_limits", "check_url_path",
           "service_app", "health_server"]

_log = logging.getLogger("fastdispatch")

#: Connections with a request begun that may wait for a thread: Telegram
#: delivers a webhook over up to ``max_connections`` (40 by default, 100 at
#: most) connections at once, and none of them should meet a 503.
MAX_WAITING = 100

_current = threading.local()  # .call: the deadline of the request this thread reads


def check_limits(request_timeout, max_header_bytes):
    """The server limits, checked at the call (``ValueError`` naming them)."""
    request_timeout = _http.check_seconds("request_timeout", request_timeout)
    if isinstance(max_header_bytes, bool) or not isinstance(max_header_bytes, int) or \
            not 1024 <= max_header_bytes <= 1 << 20:
        raise ValueError("max_header_bytes must be an int in [1024, 1 MiB], got %r"
                         % (max_header_bytes,))
    return request_timeout, max_header_bytes


_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
         b"Connection: close\r\n\r\n")


def _refuse(conn):
    sock = conn.socket
    try:
        sock.settimeout(0)  # an answer that does not fit the empty buffer is dropped
        sock.send(_BUSY)
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()


class _Cuttable:
    """What the watchdog cuts: it shuts down ``.sock``."""

    __slots__ = ("sock",)

    def __init__(self, sock):
        self.sock = sock


class _BodyFirst:
    """Reads the whole request body (at most ``max_body`` + 1 bytes) under
    the request's deadline, then disarms it and runs ``app`` on the body
    read: the deadline bounds the client, never the bot's own handlers."""

    def __init__(self, app, max_body, server):
        self.app, self.max_body, self.server = app, max_body, server

    def __call__(self, environ, start_response):
        stream = environ.get("wsgi.input")
        length = environ.get("CONTENT_LENGTH") or ""
        if stream is not None:
            if length.strip():
                n = parse_int(length)
                body = stream.read(min(n, self.max_body + 1)) if n is not None else None
            elif environ.get("wsgi.input_terminated"):
                body = stream.read(self.max_body + 1)
                environ["CONTENT_LENGTH"] = str(len(body))
            else:
                body = b""
            if body is not None:
                environ["wsgi.input"] = io.BytesIO(body)
        call = getattr(_current, "call", None)
        if call is not None:
            _current.call = None
            _http._watchdog.disarm(call)
            if call.fired:  # cut while reading: no request to answer
                self.server.cut += 1
        return self.app(environ, start_response)


def service_app(state: dict, intake: Callable, url_path: Optional[str],
                health_path: Optional[str], metrics_path: Optional[str],
                metrics_text: Callable[[], bytes]) -> Callable:
    """The WSGI app a runner serves: ``intake`` at ``url_path``; at
    ``health_path`` 200 ``{"status": "ok"}`` while ``state["running"]``,
    else 503 ``draining``; at ``metrics_path`` ``metrics_text()`` (the
    Prometheus text format); 404 elsewhere.  A None path is not served."""

    def app(environ, start_response):
        path = environ.get("PATH_INFO") or "/"
        if url_path is not None and path == url_path:
            return intake(environ, start_response)
        try:
            if path == health_path:
                status = "200 OK" if state["running"] else "503 Service Unavailable"
                body = json.dumps({"status": "ok" if state["running"] else "draining",
                                   "mode": state["mode"]}).encode() + b"\n"
                ctype = "application/json"
            elif path == metrics_path:
                status, ctype = "200 OK", "text/plain; version=0.0.4; charset=utf-8"
                body = metrics_text()
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"404 Not Found\n"
        except Exception:  # never into the server
            _log.exception("health/metrics endpoint failed")
            status, ctype, body = "500 Internal Server Error", "text/plain", b"500\n"
        start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
        return [body]

    return app


def _cheroot_classes(cheroot_server, wsgi, request_timeout, outer):
    """cheroot's connection and server classes with this module's limits:
    a deadline per request (counted in ``outer.cut`` when it fires), the
    writer closed with the connection, and a new connection kept in the
    selector until it is readable.  Made at the call, because cheroot is
    imported only when a server is made (the ``webhook`` extra)."""

    class _DeadlineConnection(cheroot_server.HTTPConnection):
        def communicate(self):
            call = _http._watchdog.arm(time.monotonic() + request_timeout)
            _http._watchdog.attach(call, _Cuttable(self.socket))
            _current.call = call
            try:
                return super().communicate()
            finally:
                if getattr(_current, "call", None) is call:  # the app never ran
                    _current.call = None
                    _http._watchdog.disarm(call)
                    if call.fired:
                        outer.cut += 1

        def close(self):
            # cheroot closes the socket but not the buffered writer: an
            # answer that could not be sent (the client gone, the
            # connection cut at its deadline) stayed in its buffer, and
            # the writer's finalizer flushed it into the closed socket
            # later, raising in whatever thread collected it.  Close it
            # here; what cannot be sent is dropped with the connection.
            wfile = getattr(self, "wfile", None)
            if wfile is not None:
                try:
                    wfile.close()
                except OSError:
                    pass
            super().close()

    class _ReadableFirst(wsgi.Server):
        def process_conn(self, conn):
            # On cheroot's accepting thread.  A new connection waits in
            # the selector until it sends something (idle ones are
            # closed after `timeout` there), not on a request thread.
            if not getattr(conn, "fastdispatch_readable", False):
                conn.fastdispatch_readable = True
                self._connections.put(conn)
                return
            try:
                self.requests.put(conn)
            except queue.Full:
                # Every thread busy and the queue full: 503 and close it
                # now (cheroot's own 503 leaves the socket open until its
                # file objects are collected: the client goes on sending).
                _refuse(conn)

    return _DeadlineConnection, _ReadableFirst


class Server:
    """cheroot serving a WSGI ``app`` on a thread of its own, with the
    limits of the module docstring.  ``.port`` is the bound port; ``.cut``
    counts requests cut at their deadline."""

    def __init__(self, app: Callable, listen: str, port: int, threads: int, *,
                 max_body: int = 1 << 20, request_timeout: float = 10.0,
                 max_header_bytes: int = 16 << 10, ssl_certfile: Optional[str] = None,
                 ssl_keyfile: Optional[str] = None, name: str = "fastdispatch-web") -> None:
        try:
            from cheroot import server as cheroot_server
            from cheroot import wsgi
        except ImportError:
            raise ImportError("the web server needs cheroot: pip install "
                              "'fastdispatch[webhook]'") from None
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError("port must be an int in 0..65535, got %r" % (port,))
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024:
            raise ValueError("threads must be an int in [1, 1024], got %r" % (threads,))
        request_timeout, max_header_bytes = check_limits(request_timeout, max_header_bytes)
        self.cut = 0  # written by request threads; a count for tests and metrics
        connection_class, server_class = _cheroot_classes(cheroot_server, wsgi, request_timeout,
                                                          self)
        server = server_class((listen, port), _BodyFirst(app, max_body, self),
                              numthreads=threads, max=threads, server_name="fastdispatch",
                              timeout=max(1, int(request_timeout)),
                              accepted_queue_size=max(threads, MAX_WAITING),
                              accepted_queue_timeout=0,
                              request_queue_size=128)
        server.ConnectionClass = connection_class
        server.max_request_header_size = max_header_bytes
        server.max_request_body_size = max_body
        server.keep_alive_conn_limit = threads
        server.shutdown_timeout = 5
        if ssl_certfile is not None:
            from cheroot.ssl.builtin import BuiltinSSLAdapter
            server.ssl_adapter = BuiltinSSLAdapter(ssl_certfile, ssl_keyfile)
        server.prepare()  # binds now: a port in use fails here, not later
        self._server = server
        self.port = server.bind_addr[1]
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self):
        try:
            self._server.serve()
        except BaseException:  # noqa: B902 - logged, and the runner notices the thread ended
            _log.exception("the web server stopped")

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._server.stop()
        self._thread.join(10)


def health_server(app: Callable, listen: str, port: int, request_timeout: float,
                  log: logging.Logger, paths: str = "/healthz and /metrics") -> Server:
    """A listener of its own for health and metrics (2 threads, no bodies),
    announced on ``log``."""
    server = Server(app, listen, port, 2, max_body=4096, request_timeout=request_timeout,
                    name="fastdispatch-health")
    log.info("health and metrics on http://%s:%d: %s", listen, server.port, paths)
    return server


class Stopper:
    """SIGTERM/SIGINT -> ``stop``; a second one -> ``force`` (installed only
    in the main thread, where Python delivers signals; restored after).
    The events are set from a :class:`SignalRelay`'s thread, never from the
    handler: the main thread may hold ``stop``'s own lock when the signal
    comes (it waits on ``stop``)."""

    def __init__(self, stop, handle_signals, log=_log):
        if stop is not None and not isinstance(stop, threading.Event):
            raise TypeError("stop must be a threading.Event or None")
        self.stop = stop if stop is not None else threading.Event()
        self.force = threading.Event()
        self.signum = None
        self._log = log
        self._relay = SignalRelay(self._on_signal, name="fastdispatch-signals")
        if handle_signals:
            self._relay.install()

    def _on_signal(self, signum):
        if self.stop.is_set():
            self.force.set()
        else:
            self.signum = signum
            self.stop.set()

    def wait(self, alive: Callable[[], bool]) -> None:
        """Block until stopped, or until ``alive()`` turns False."""
        try:
            while not self.stop.wait(0.2):
                if not alive():
                    break
        except KeyboardInterrupt:  # handle_signals=False and Ctrl-C
            self.stop.set()
        if self.signum is not None:
            self._log.info("%s: stopping intake and draining replies (again to stop waiting)",
                           signal.Signals(self.signum).name)

    def restore(self) -> None:
        self._relay.restore()


class NewcomerLogging:
    """While a runner runs: if the program configured no logging at all (no
    handler on ``log``'s path to the root), print ``log``'s lines from INFO
    up (the address, the shutdown report) to stderr as ``fastdispatch:
    ...``.  Without it Python shows warnings only, and a bot that works
    says nothing.  A program that configured logging gets nothing more."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._handler: Any = None
        if log.hasHandlers():
            return
        self._handler = logging.StreamHandler()  # sys.stderr, looked up at each line
        self._handler.setFormatter(logging.Formatter("fastdispatch: %(message)s"))
        self._level = log.level
        log.addHandler(self._handler)
        if log.getEffectiveLevel() > logging.INFO:
            log.setLevel(logging.INFO)

    def restore(self) -> None:
        if self._handler is not None:
            self._log.removeHandler(self._handler)
            self._log.setLevel(self._level)
            self._handler = None


def check_url_path(url_path: Any, health_port: Optional[int], health_path: str,
                   metrics_path: str) -> None:
    """An endpoint's ``url_path``: a path, and not health's or metrics' when
    they are served beside it (``ValueError`` naming it)."""
    if not isinstance(url_path, str) or not url_path.startswith("/"):
        raise ValueError("url_path must be a path starting with '/', got %r" % (url_path,))
    if health_port is None and url_path in (health_path, metrics_path):
        raise ValueError("url_path must differ from health_path and metrics_path")


class Run:
    """One run of a runner (Telegram's ``run_polling`` and ``run_webhook``,
    Discord's ``run_interactions``) from start to report: the signals
    (:class:`Stopper`), what ``/healthz`` says (``state``), the log lines
    of a program that configured no logging (:class:`NewcomerLogging`),
    and the servers it started.  ``with Run(...) as run:`` stops the
    servers and puts the rest back on the way out, whatever happened."""

    def __init__(self, mode: str, stop: Optional[threading.Event], handle_signals: bool,
                 log: logging.Logger) -> None:
        self.log = log
        self.stopper = Stopper(stop, handle_signals, log)
        self.newcomer = NewcomerLogging(logging.getLogger("fastdispatch"))
        self.state = {"running": True, "mode": mode}
        self._servers: list = []

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.state["running"] = False
        self.stopper.restore()
        for server in self._servers:
            server.stop()
        self.newcomer.restore()

    def serve(self, intake: Callable, metrics_text: Callable[[], bytes], listen: str,
              port: int, threads: int, *, url_path: str, health_path: str,
              metrics_path: str, health_port: Optional[int], health_listen: str,
              request_timeout: float, max_body: int, max_header_bytes: int,
              ssl_certfile: Optional[str], ssl_keyfile: Optional[str], name: str) -> Server:
        """Serve the WSGI app ``intake`` at ``url_path`` on ``listen:port``,
        with health and metrics beside it, or, with ``health_port``, on a
        listener of their own (:meth:`serve_health`)."""
        beside = (None, None) if health_port is not None else (health_path, metrics_path)
        server = self._started(Server(
            service_app(self.state, intake, url_path, *beside, metrics_text),
            listen, port, threads, max_body=max_body, request_timeout=request_timeout,
            max_header_bytes=max_header_bytes, ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile, name=name))
        if health_port is not None:
            self.serve_health(metrics_text, health_listen, health_port, request_timeout,
                              health_path, metrics_path)
        return server

    def serve_health(self, metrics_text: Callable[[], bytes], listen: str, port: int,
                     request_timeout: float, health_path: str = "/healthz",
                     metrics_path: str = "/metrics") -> Server:
        """Health and metrics on a listener of their own (:func:`health_server`)."""
        app = service_app(self.state, None, None, health_path, metrics_path, metrics_text)
        return self._started(health_server(app, listen, port, request_timeout, self.log,
                                           "%s and %s" % (health_path, metrics_path)))

    def _started(self, server: Server) -> Server:
        self._servers.append(server)
        return server

    def wait(self, alive: Callable[[], bool]) -> None:
        """Block until a signal or ``stop`` (or until ``alive()`` turns
        False); from then on ``/healthz`` answers 503 ``draining``."""
        self.stopper.wait(alive)
        self.state["running"] = False

    def drain_web(self, engine: Any, server: Server, app: Any, drain_timeout: Optional[float],
                  intake: Any = None) -> ShutdownReport:
        """A web endpoint's end: wait until stopped (or until ``server``
        stops by itself), close ``app`` (503 to what comes from now on),
        then drain ``engine`` (``intake``'s counts in the report)."""
        self.wait(lambda: server.alive)
        error = None if server.alive else "the web server stopped"
        app.close()
        return drain_engine(engine, drain_timeout, intake=intake, force=self.stopper.force,
                            error=error, log=self.log)
