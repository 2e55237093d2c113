"""gunicorn settings that stop a fastdispatch webhook bot without losing a reply.

    gunicorn -c examples/gunicorn.conf.py --chdir examples telegram_webhook_bot:application

The application must be a ``fastdispatch.telegram.webhook_app(...)``.  On
SIGTERM (or SIGINT) gunicorn stops accepting connections (Telegram's
deliveries then fail, and Telegram delivers them again to the next process)
and lets the requests in progress finish; then ``worker_exit`` below drains
the bot's queued replies for up to ``DRAIN_TIMEOUT`` seconds and logs what
was left, and the master exits 1 if any worker dropped a reply.  Without
the hook, gunicorn exits 0 and the queued replies die with the worker.

Settings that matter:

- ``worker_class = "gthread"``: handlers run in the worker's request
  threads; replies go out on the dispatcher's threads, in the same process.
- ``workers = 1``: one dispatcher per bot token.  Several processes would
  each pace to Telegram's limits on their own and together exceed them (for
  more than one process, see fastdispatch.cluster).
- ``graceful_timeout`` must exceed ``DRAIN_TIMEOUT``: the master kills a
  worker that takes longer (SIGKILL: nothing is drained then).
"""

import multiprocessing
import os
import sys

bind = os.environ.get("BIND", "127.0.0.1:8080")
worker_class = "gthread"
workers = 1
threads = int(os.environ.get("THREADS", "8"))
DRAIN_TIMEOUT = float(os.environ.get("DRAIN_TIMEOUT", "30"))
graceful_timeout = int(DRAIN_TIMEOUT) + 10

# Made in the master before it forks; a worker that dropped a reply sets it.
_dropped = multiprocessing.Value("i", 0)


def worker_exit(server, worker):
    """In the worker, after its last request: drain the replies and report."""
    app = getattr(worker, "wsgi", None)  # None in the master (worker already gone)
    shutdown = getattr(app, "shutdown", None)
    if callable(shutdown):
        report = shutdown(DRAIN_TIMEOUT)   # logs one line with the counts
        if report.exit_code:
            with _dropped.get_lock():
                _dropped.value += 1


def on_exit(server):
    """In the master, last: exit non-zero if a worker dropped replies."""
    if _dropped.value:
        server.log.error("%d worker(s) dropped replies at shutdown", _dropped.value)
        sys.exit(1)
