"""Running a bot as a service: :func:`run_polling`, :func:`run_webhook` and
:func:`drain_engine` (which lives in ``fastdispatch._drain``, shared with the
intakes and the other platforms' runners).

Every deploy stops the bot's process, so stopping is part of running.  Both
helpers block until SIGTERM or SIGINT (or until ``stop``, a
``threading.Event``, is set) and then, in this order:

1. stop the intake: the poller's loop ends (the update in hand finishes), or
   the webhook answers 503 to every new update (Telegram keeps it and
   delivers it again, to the next process);
2. drain: ``engine.shutdown(drain_timeout)`` lets the queued replies go out,
   paced and retried as usual;
3. at the deadline, give up on what is left: the poller first marks the
   updates still waiting for replies as unconfirmed (the next process gets
   them again), then the dispatcher is force-closed;
4. report: one log line with the counts (updates handled, replies sent,
   failed, dropped at the deadline, refused), and an exit status that is
   non-zero if a reply was dropped (1) or the intake failed (2).

A second signal during the drain stops waiting at once (step 3 follows).

The webhook server is cheroot (CherryPy's threaded WSGI server, the
``fastdispatch[webhook]`` extra), chosen by measuring it against waitress
and gunicorn's gthread worker (``bench/webhook_servers.py``, numbers in
``docs/telegram.md``): the same throughput as waitress within the noise, and
it stops cleanly from another thread, which an embedded server must.  Beside
the webhook it serves ``/healthz`` (200 while running, 503 while draining)
and ``/metrics`` (the Prometheus text format); ``run_polling`` serves the
same two on ``health_port`` when given one.  For a server of your own
(gunicorn, waitress), :meth:`WebhookApp.shutdown` is steps 1-4 in one call:
``docs/telegram.md`` shows the hooks.

Threads: the caller's thread waits and drains; the poller and the web server
have their own; a helper thread runs ``engine.shutdown`` so that a second
signal can cut the wait short.
"""

import logging
import secrets
import threading
from time import monotonic
from typing import Any, Callable, List, Optional

from .._drain import ShutdownReport, check_drain_timeout, drain_engine, exit_status
from .._http import scrub_secrets
from .._serve import Run, check_url_path
from ._intake import DEFAULT_MAX_PENDING, TelegramPoller, WebhookApp, webhook_app
from ._sender import TelegramSender

__all__ = ["run_polling", "run_webhook", "drain_engine", "ShutdownReport"]

_log = logging.getLogger("fastdispatch.telegram")


# -- health and metrics --------------------------------------------------------------

def _metrics_text(state, intake, dispatcher):
    lines = []

    def family(name, kind, doc, samples):
        lines.append("# HELP %s %s" % (name, doc))
        lines.append("# TYPE %s %s" % (name, kind))
        for labels, value in samples:
            lines.append("%s%s %s" % (name, labels, value))

    family("fastdispatch_telegram_up", "gauge",
           "1 while the bot takes updates, 0 while it drains.",
           [("", 1 if state["running"] else 0)])
    if isinstance(intake, WebhookApp):
        with intake._lock:
            st = dict(intake.stats)
        family("fastdispatch_telegram_updates_total", "counter",
               "Updates received, by what became of them.",
               [('{outcome="handled"}', st["handled"]), ('{outcome="ignored"}', st["ignored"]),
                ('{outcome="duplicate"}', st["duplicates"]),
                ('{outcome="queue_full"}', st[429]),
                ('{outcome="shutting_down"}', st[503] - st["in_progress"]),
                ('{outcome="in_progress"}', st["in_progress"])])
        lost = st["lost_replies"]
    else:
        family("fastdispatch_telegram_updates_total", "counter",
               "Updates received, by what became of them.",
               [('{outcome="handled"}', intake.handled), ('{outcome="ignored"}', intake.ignored),
                ('{outcome="queue_full"}', intake.busy)])
        family("fastdispatch_telegram_pending_updates", "gauge",
               "Updates handled whose replies are not all sent yet (not confirmed).",
               [("", intake.pending)])
        family("fastdispatch_telegram_poll_errors_total", "counter",
               "getUpdates calls that failed.", [("", intake.errors)])
        lost = intake.lost_replies
    family("fastdispatch_telegram_lost_replies_total", "counter",
           "Replies refused (queue full) for updates answered all the same.", [("", lost)])
    stats = getattr(dispatcher, "stats", None)
    if callable(stats):
        s = stats()
        family("fastdispatch_telegram_replies_total", "counter",
               "Replies ended, by outcome (the dispatcher's stats()).",
               [('{outcome="%s"}' % k, getattr(s, k)) for k in
                ("completed", "failed", "discarded", "cancelled", "timed_out")] +
               [('{outcome="rejected"}', s.rejected)])
        family("fastdispatch_telegram_replies_pending", "gauge",
               "Replies queued or running now.",
               [("", s.submitted - s.completed - s.failed - s.discarded - s.cancelled
                 - s.timed_out)])
    return ("\n".join(lines) + "\n").encode()


def _metrics_source(state, intake, dispatcher, metrics=None):
    """What ``/metrics`` serves: the counts of ``intake`` and ``dispatcher``,
    and the text of ``metrics`` (a prometheus_client registry) after them."""

    def metrics_text():
        body = _metrics_text(state, intake, dispatcher)
        if metrics is not None:
            from prometheus_client import generate_latest
            body += generate_latest(metrics)
        return body

    return metrics_text


def _call_bot_api(sender, method, params):
    try:
        return sender.call(method, params)
    except Exception as exc:
        _log.error("%s failed: %s", method, exc)
        raise


def _check_parts(engine, sender):
    if not isinstance(sender, TelegramSender):
        raise TypeError("sender must be a TelegramSender")
    if not callable(getattr(engine, "process_event", None)):
        raise TypeError("engine must have a process_event(event, sender, capabilities) method")


def _stored_first(outbox, sender):
    """``sender``, or with an ``outbox`` one that stores each reply in it
    first (``fastdispatch.outbox._telegram``)."""
    if outbox is None:
        return sender
    from ..outbox._telegram import durable_sender
    return durable_sender(outbox, sender)


def _set_webhook(sender, webhook_url, secret_token, drop_pending_updates, allowed_updates,
                 max_connections):
    params = {"url": webhook_url, "secret_token": secret_token,
              "drop_pending_updates": bool(drop_pending_updates)}
    if allowed_updates is not None:
        params["allowed_updates"] = list(allowed_updates)
    if max_connections is not None:
        params["max_connections"] = max_connections
    _call_bot_api(sender, "setWebhook", params)


def _delete_webhook(sender, drop_pending_updates):
    try:
        _call_bot_api(sender, "deleteWebhook",
                      {"drop_pending_updates": bool(drop_pending_updates)})
    except Exception:
        pass  # logged; polling meets the 409 if a webhook is really still set


# -- the helpers -----------------------------------------------------------------

def run_polling(engine: Any, sender: TelegramSender, *, poll_timeout: float = 30,
                limit: int = 100, allowed_updates: Optional[List[str]] = None,
                delete_webhook: bool = True, drop_pending_updates: bool = False,
                on_conflict: str = "stop", drain_timeout: Optional[float] = 30.0,
                health_port: Optional[int] = None, health_listen: str = "127.0.0.1",
                metrics: Any = None, request_timeout: float = 10.0,
                max_pending: Optional[int] = DEFAULT_MAX_PENDING,
                stop: Optional[threading.Event] = None, handle_signals: bool = True,
                on_shutdown: Optional[Callable[[ShutdownReport], Any]] = None,
                outbox: Any = None) -> int:
    """Run a bot on ``getUpdates`` long polling until SIGTERM/SIGINT (or
    ``stop`` is set, or the poller stops by itself); return the exit status.

    ``sys.exit(run_polling(engine, sender))``.  At start, ``deleteWebhook``
    (``delete_webhook=True``; with ``drop_pending_updates`` Telegram also
    forgets the updates waiting for the bot).  The poller is a
    :class:`TelegramPoller` (at least once: an update is confirmed only once
    its replies went out; its options are passed through; with
    ``max_pending`` replies queued or running across all chats it holds
    its offset and Telegram keeps the rest).  On a signal:
    the poller stops, replies drain for up to ``drain_timeout`` seconds,
    the settled updates are confirmed, and what was left is reported (see
    :func:`drain_engine`).  ``health_port``: serve ``/healthz`` and
    ``/metrics`` there (``metrics``: a prometheus_client registry or
    collector whose text is appended; each request held to
    ``request_timeout`` seconds in all, see ``fastdispatch._serve``).
    ``on_shutdown(report)`` gets the :class:`ShutdownReport`.  Signal
    handlers are installed only when called from the main thread
    (``handle_signals=False``: none).  Without any logging configured,
    the address and the report go to stderr.  ``outbox``: a
    :class:`fastdispatch.outbox.Outbox`; the replies are stored in it
    first, and an update is confirmed only once its replies are on disk
    (a crash loses none of them: the next run sends them).
    """
    _check_parts(engine, sender)
    drain_timeout = check_drain_timeout(drain_timeout)
    sender = _stored_first(outbox, sender)
    poller = TelegramPoller(sender, engine, poll_timeout, limit=limit,
                            allowed_updates=allowed_updates, on_conflict=on_conflict,
                            max_pending=max_pending)
    with Run("polling", stop, handle_signals, _log) as run:
        if health_port is not None:
            run.serve_health(_metrics_source(run.state, poller, engine.dispatcher, metrics),
                             health_listen, health_port, request_timeout)
        if delete_webhook or drop_pending_updates:
            _delete_webhook(sender, drop_pending_updates)
        poller.start()
        _log.info("polling for updates (SIGTERM or SIGINT to stop)")
        run.wait(lambda: poller.running)
        started = monotonic()
        poller.stop(drain_timeout)  # the update in hand finishes first
        if drain_timeout is not None:
            drain_timeout = max(0.0, drain_timeout - (monotonic() - started))
        error = None if poller.error is None else str(poller.error)
        report = drain_engine(engine, drain_timeout, intake=poller, on_deadline=poller.freeze,
                              force=run.stopper.force, error=error)
        poller.confirm()
    return exit_status(report, on_shutdown)


def run_webhook(engine: Any, sender: TelegramSender, *, listen: str = "127.0.0.1",
                port: int, url_path: str = "/telegram", webhook_url: Optional[str] = None,
                secret_token: Optional[str] = None, drop_pending_updates: bool = False,
                allowed_updates: Optional[List[str]] = None,
                max_connections: Optional[int] = None, delete_webhook_on_exit: bool = False,
                drain_timeout: Optional[float] = 30.0, threads: int = 8,
                health_path: str = "/healthz", metrics_path: str = "/metrics",
                health_port: Optional[int] = None, health_listen: str = "127.0.0.1",
                metrics: Any = None, ssl_certfile: Optional[str] = None,
                ssl_keyfile: Optional[str] = None, remember: int = 100_000,
                remember_seconds: float = 600.0, max_body: int = 1 << 20,
                request_timeout: float = 10.0, max_header_bytes: int = 16 << 10,
                max_pending: Optional[int] = DEFAULT_MAX_PENDING,
                stop: Optional[threading.Event] = None, handle_signals: bool = True,
                on_shutdown: Optional[Callable[[ShutdownReport], Any]] = None,
                outbox: Any = None) -> int:
    """Serve Telegram's webhook until SIGTERM/SIGINT (or ``stop`` is set);
    return the exit status.

    ``sys.exit(run_webhook(engine, sender, listen="0.0.0.0", port=8443,
    webhook_url="https://bot.example.com/telegram"))``.  Serves
    :func:`webhook_app` at ``url_path`` on ``listen:port`` with cheroot,
    ``threads`` request threads (TLS with ``ssl_certfile``/``ssl_keyfile``,
    or behind a proxy that terminates it).  ``listen="0.0.0.0"`` takes
    requests from every network the machine is on: whatever is served on
    that port is public.  ``/healthz`` and ``/metrics`` are served beside
    the webhook, or, with ``health_port``, only on ``health_listen:
    health_port`` (by default 127.0.0.1: private).  Every request is held
    to ``max_header_bytes`` of headers, ``max_body`` bytes of body and
    ``request_timeout`` seconds in all to arrive (see
    ``fastdispatch._serve``).  With ``webhook_url``, registers it
    (``setWebhook`` with ``secret_token``, ``drop_pending_updates``,
    ``allowed_updates``, ``max_connections``); without ``secret_token`` a
    random one is made for it.  With ``max_pending`` replies queued or
    running across all chats, new updates are answered 429 (Telegram
    delivers them again later).  On a signal: new updates are answered 503
    (Telegram delivers them again, to the next process), replies drain for
    up to ``drain_timeout`` seconds, what was left is reported
    (:func:`drain_engine`), the server stops; ``deleteWebhook`` only with
    ``delete_webhook_on_exit`` (a restart should keep receiving).  Without
    any logging configured, the address and the report go to stderr.
    ``outbox``: a :class:`fastdispatch.outbox.Outbox`; the replies are
    stored in it first, and an update is answered 200 only once its
    replies are on disk (a crash loses none of them: the next run sends
    them).
    """
    _check_parts(engine, sender)
    drain_timeout = check_drain_timeout(drain_timeout)
    check_url_path(url_path, health_port, health_path, metrics_path)
    sender = _stored_first(outbox, sender)
    if secret_token is None and webhook_url is not None:
        secret_token = secrets.token_urlsafe(32)  # only [A-Za-z0-9_-]: what Telegram takes
    app = webhook_app(engine, sender, secret_token, max_body=max_body, remember=remember,
                      remember_seconds=remember_seconds, max_pending=max_pending)
    with Run("webhook", stop, handle_signals, _log) as run:
        server = run.serve(app, _metrics_source(run.state, app, engine.dispatcher, metrics),
                           listen, port, threads, url_path=url_path, health_path=health_path,
                           metrics_path=metrics_path, health_port=health_port,
                           health_listen=health_listen, request_timeout=request_timeout,
                           max_body=max_body, max_header_bytes=max_header_bytes,
                           ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
                           name="fastdispatch-webhook-server")
        if webhook_url is not None:
            _set_webhook(sender, webhook_url, secret_token, drop_pending_updates,
                         allowed_updates, max_connections)
        _log.info("webhook on http://%s:%d%s (SIGTERM or SIGINT to stop)", listen, server.port,
                  scrub_secrets(url_path))  # a path may be made of the token
        report = run.drain_web(engine, server, app, drain_timeout, intake=app)
        if delete_webhook_on_exit:
            _delete_webhook(sender, False)
    return exit_status(report, on_shutdown)
