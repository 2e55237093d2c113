"""``fastdispatch.discord``: Discord's REST API and HTTP interactions as a
fastdispatch platform.

Replies out: :class:`DiscordSender` implements ``Sender`` (Create Message)
and the optional protocols Discord offers (delete a message, the typing
indicator).  It reports the limits every answer announces
(``X-RateLimit-*``) to the dispatcher through ``sc.report_limit``, so the
dispatcher learns each channel's budget instead of having it hard-coded;
use it with ``Pacing.discord()`` (the bot-wide 50 requests/s).

- ``429``: ``fastdispatch.RetryAfter`` (``scope="global"`` if the body
  says global, else ``"chat"``);
- ``5xx``, connection errors, the deadline, answers cut off:
  :class:`DiscordNetworkError` (a ``ConnectionError``);
- any other ``4xx``: :class:`PlatformError` (status, message, ``code``);
- near Discord's invalid-request limit (10,000 401/403/429 in 10 minutes
  bans the IP): :class:`InvalidRequestBudgetExhausted`, at once, without
  sending.

Interactions in: :func:`interactions_app` (WSGI) verifies Discord's Ed25519
signature, answers ``PING``, acknowledges commands at once and hands them to
the ``Engine`` as ``Event`` objects; replies go back through the dispatcher as
follow-up messages.  :func:`run_interactions` serves it (with health and
metrics) until SIGTERM, then drains the replies.

The bot token is a password: it is kept in a private attribute and the
``Authorization`` header, never in a repr, an exception or a log (errors
name routes as templates, ``/channels/{channel.id}/messages``).

Everything is in ``docs/discord.md``; ``fastdispatch.testing.FakeDiscordServer``
is a local Discord to test against.
"""

from .._http import PlatformError
from ._intake import InteractionsApp, interaction_to_event, interactions_app, message_to_event
from ._run import run_interactions
from ._sender import (
    DiscordNetworkError, DiscordSender, InvalidRequestBudgetExhausted, InvalidRequestGuard)

__all__ = [
    "DiscordSender",
    "interactions_app",
    "run_interactions",
    "InteractionsApp",
    "interaction_to_event",
    "message_to_event",
    "DiscordNetworkError",
    "InvalidRequestBudgetExhausted",
    "InvalidRequestGuard",
    "PlatformError",
]
