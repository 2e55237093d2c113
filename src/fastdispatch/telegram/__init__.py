"""``fastdispatch.telegram``: the Telegram Bot API as a fastdispatch platform.

Replies out: :class:`TelegramSender` implements ``Sender`` (``sendMessage``)
and the optional protocols Telegram offers (``deleteMessage``,
``sendChatAction``, ``getChatAdministrators``, ``restrictChatMember``).
Updates in: :class:`TelegramPoller` (``getUpdates`` long polling on its own
thread) or :func:`webhook_app` (a WSGI callable); both turn updates into
``Event``s with :func:`update_to_event` and hand them to
``Engine.process_event``.

The sender is a thin translation layer and nothing more: it builds the
request, sends it through the shared JSON-over-HTTP client
(``fastdispatch._http.JsonHttpClient``: one keep-alive urllib3 pool shared by
every dispatcher worker thread), and turns the answer into a result or a
typed error:

- ``429``                        -> ``fastdispatch.RetryAfter(parameters.retry_after)``
                                    (bounded: at most a day)
- ``400`` with ``parameters.migrate_to_chat_id`` -> sent again to the
                                    supergroup, and every later call too
- ``5xx``, connection errors,
  the deadline, answers cut short -> :class:`TelegramNetworkError` (a ``ConnectionError``)
- any other ``ok: false``        -> :class:`PlatformError` (status, description)

It never retries (but for a migration), never sleeps and never reorders:
the dispatcher owns order, pacing (``Pacing.telegram()``) and retries
(``RetryPolicy()``, whose default ``retry_on=(ConnectionError,)`` retries
exactly the network errors above).  Each call's deadline is total (connect,
send, the whole answer): ``sc.remaining()`` for a send.

Why urllib3: measured against httpx and requests on the same local server
(``bench/http_clients.py``; numbers in ``docs/telegram.md``), urllib3 used
about half the client CPU per request of httpx and 40 % of requests'.

The bot token is a password.  It is kept in one private attribute and the
request path; it never appears in a repr, an exception message or chain
(errors are built from scratch, outside the ``except`` block that caught the
client's error), or urllib3's debug log (a filter on its loggers redacts it).
"""

from ._intake import TelegramPoller, WebhookApp, update_to_event, webhook_app
from ._sender import PlatformError, TelegramNetworkError, TelegramSender

__all__ = [
    "TelegramSender",
    "TelegramPoller",
    "webhook_app",
    "WebhookApp",
    "update_to_event",
    "PlatformError",
    "TelegramNetworkError",
]
