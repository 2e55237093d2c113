"""Running Discord's interactions endpoint as a service: :func:`run_interactions`.

The same shape as ``fastdispatch.telegram.run_webhook``: it serves
:func:`interactions_app` with the package's hardened server
(``fastdispatch._serve``: header and body limits, a total deadline per
request, bounded threads and connections), beside ``/healthz`` and
``/metrics`` (or on a listener of their own), blocks until SIGTERM/SIGINT
(or ``stop``), then stops taking interactions, drains the replies and
reports.  It replaces serving the app with ``wsgiref`` (one thread, no
timeout: one client that never sends its body blocks every interaction,
and Discord disables an endpoint that keeps failing its 3 s).
"""

import logging
import threading
from typing import Any, Callable, Optional

from .._drain import exit_status
from .._serve import Run, check_url_path
from ._intake import interactions_app

__all__ = ["run_interactions"]

_log = logging.getLogger("fastdispatch.discord")


def _metrics_text(state, app, dispatcher):
    lines = ["# HELP fastdispatch_discord_up 1 while the endpoint takes interactions.",
             "# TYPE fastdispatch_discord_up gauge",
             "fastdispatch_discord_up %d" % (1 if state["running"] else 0),
             "# HELP fastdispatch_discord_interactions_total Requests answered, by outcome.",
             "# TYPE fastdispatch_discord_interactions_total counter"]
    with app._lock:
        stats = dict(app.stats)
    for key, value in sorted(stats.items(), key=str):
        lines.append('fastdispatch_discord_interactions_total{outcome="%s"} %d' % (key, value))
    s = dispatcher.stats() if callable(getattr(dispatcher, "stats", None)) else None
    if s is not None:
        lines += ["# HELP fastdispatch_discord_replies_total Replies ended, by outcome.",
                  "# TYPE fastdispatch_discord_replies_total counter"]
        for key in ("completed", "failed", "discarded", "cancelled", "timed_out", "rejected"):
            lines.append('fastdispatch_discord_replies_total{outcome="%s"} %d'
                         % (key, getattr(s, key)))
    return ("\n".join(lines) + "\n").encode()


def run_interactions(engine: Any, sender: Any, *, public_key: str, port: int,
                     listen: str = "127.0.0.1", url_path: str = "/interactions",
                     threads: int = 8, max_body: int = 1 << 20, max_age: float = 300.0,
                     request_timeout: float = 10.0, max_header_bytes: int = 16 << 10,
                     health_path: str = "/healthz", metrics_path: str = "/metrics",
                     health_port: Optional[int] = None, health_listen: str = "127.0.0.1",
                     ssl_certfile: Optional[str] = None, ssl_keyfile: Optional[str] = None,
                     drain_timeout: Optional[float] = 30.0,
                     stop: Optional[threading.Event] = None, handle_signals: bool = True,
                     on_shutdown: Optional[Callable[[Any], Any]] = None) -> int:
    """Serve Discord's Interactions Endpoint URL at ``url_path`` on
    ``listen:port`` until SIGTERM/SIGINT (or ``stop`` is set); return the
    exit status (0: every reply went out or failed for good; 1: some were
    dropped at the ``drain_timeout`` deadline; 2: the server stopped by
    itself).

    ``sys.exit(run_interactions(engine, sender, public_key=KEY,
    listen="0.0.0.0", port=8080))``.  ``listen="0.0.0.0"`` takes requests
    from every network the machine is on: whatever is served on that port
    is public (Discord must reach ``url_path``; keep health and metrics
    private with ``health_port``, served on ``health_listen``, 127.0.0.1 by
    default).  Every request is held to ``max_header_bytes``, ``max_body``
    and ``request_timeout`` seconds in all; ``threads`` request threads run
    the handlers after each acknowledgement (see ``fastdispatch._serve``).
    ``public_key``, ``max_body``, ``max_age``: as for
    :func:`interactions_app`.  On a signal: new interactions are answered
    503, the replies drain for up to ``drain_timeout`` seconds (then what
    is left is cancelled), one line reports the counts (to stderr when no
    logging is configured) and ``on_shutdown(report)`` gets the
    ``ShutdownReport``.
    """
    check_url_path(url_path, health_port, health_path, metrics_path)
    app = interactions_app(engine, sender, public_key=public_key, max_body=max_body,
                           max_age=max_age)
    with Run("interactions", stop, handle_signals, _log) as run:
        server = run.serve(app, lambda: _metrics_text(run.state, app, engine.dispatcher),
                           listen, port, threads, url_path=url_path, health_path=health_path,
                           metrics_path=metrics_path, health_port=health_port,
                           health_listen=health_listen, request_timeout=request_timeout,
                           max_body=max_body, max_header_bytes=max_header_bytes,
                           ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
                           name="fastdispatch-interactions-server")
        _log.info("interactions endpoint on http://%s:%d%s (SIGTERM or SIGINT to stop)",
                  listen, server.port, url_path)
        report = run.drain_web(engine, server, app, drain_timeout)
    return exit_status(report, on_shutdown)
