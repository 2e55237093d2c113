"""Replies out: :class:`DiscordSender`, the invalid-request guard, and the
errors they raise.

The sender is a thin translation layer, like ``TelegramSender``: it builds
the request, sends it through the shared JSON-over-HTTP client
(``fastdispatch._http.JsonHttpClient``, one keep-alive pool for every
worker thread), hands the limits each answer announces to the dispatcher
(``sc.report_limit``), and turns the answer into a result or a typed error.
It never retries, never sleeps and never reorders.

Two things are Discord's own:

- **Learned limits.**  Every answer carries ``X-RateLimit-Remaining``,
  ``X-RateLimit-Reset-After`` and ``X-RateLimit-Bucket``.  A bucket's budget
  is per *top-level resource* (the channel of ``/channels/{id}/messages``,
  the webhook and token of a follow-up), while the bucket hash is the same
  for every channel, so the bucket reported to the dispatcher is
  ``"<hash>:<resource>"``: chats that share one really share it.
- **The invalid-request budget.**  10,000 answers ``401``/``403``/``429``
  in 10 minutes (a ``429`` with ``X-RateLimit-Scope: shared`` excepted) and
  Discord bans the IP for about an hour.  :class:`InvalidRequestGuard`
  counts them in a sliding window and, once a margin short of the limit,
  fails every further call at once (:class:`InvalidRequestBudgetExhausted`)
  until old ones leave the window.

Threads: one sender serves every worker.  ``InvalidRequestGuard._lock``
guards its window; nothing else in the sender changes after construction.
"""

import base64
import collections
import hashlib
import logging
import math
import threading
import time
from urllib.parse import quote
from typing import Any, Dict, Optional

from .._errors import RetryAfter
from .._http import (
    DEFAULT_TIMEOUT, HttpTransportError, JsonHttpClient, PlatformError, PlatformNetworkError,
    _redact)
from .._netnum import parse_int, parse_seconds
from ..platform import Capabilities, SendResult

__all__ = ["DiscordSender", "DiscordNetworkError", "InvalidRequestBudgetExhausted",
           "InvalidRequestGuard", "PlatformError"]

_log = logging.getLogger("fastdispatch.discord")

#: The longest wait a 429 or a header is taken at (seconds; a day).
MAX_RETRY_AFTER = 86400.0
DEFAULT_RETRY_AFTER = 1.0
_MAX_DESCRIPTION = 1000
_MAX_BUCKET = 64  # characters of a bucket hash kept (Discord's are 32 hex digits)
_INVALID_STATUSES = (401, 403, 429)


class DiscordNetworkError(PlatformNetworkError):
    """The request may not have reached Discord, or its answer did not
    arrive: a ``5xx``, a refused or reset connection, the deadline, an
    answer cut off.  A ``ConnectionError``, so ``RetryPolicy()`` retries it
    (a send that failed this way *may* have been delivered)."""


class InvalidRequestBudgetExhausted(PlatformError):
    """Refused before sending: this process has had so many ``401``/``403``
    /``429`` answers in Discord's window that one more risks the IP ban.
    Not retried by the dispatcher; ``retry_in`` says when the oldest
    counted answer leaves the window."""

    def __init__(self, count, limit, window, retry_in, method=""):
        description = (
            "Discord's invalid-request budget is spent: %d answers 401/403/429 in the last "
            "%g s (Discord bans the IP for about an hour at %d); calls fail at once for "
            "%.1f s more, until old answers leave the window. Fix what is answering "
            "401/403 (a revoked token, a channel the bot may not post in)"
            % (count, window, limit, retry_in))
        super().__init__(429, description, {"retry_in": retry_in}, method)
        self.count = count
        self.limit = limit
        self.window = window
        self.retry_in = retry_in

    def __str__(self):
        return "%s: not sent: %s" % (self.method or "API call", self.description)

    def __reduce__(self):
        return (type(self), (self.count, self.limit, self.window, self.retry_in, self.method))


class InvalidRequestGuard:
    """Counts answers ``401``/``403``/``429`` in a sliding window and refuses
    calls once ``limit - margin`` of them are in it.

    The margin covers calls already in flight when the stop point is
    reached (each may still come back invalid): keep it above the number
    of concurrent calls (the pool size).  Cost: a lock round trip per call;
    memory: one float per counted answer (at most ``limit - margin`` plus
    what is in flight).
    """

    def __init__(self, limit: int = 10000, window: float = 600.0, margin: int = 1000) -> None:
        for name, value in (("invalid_request_limit", limit),
                            ("invalid_request_margin", margin)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError("%s must be an int >= 0, got %r" % (name, value))
        if not limit > margin:
            raise ValueError("invalid_request_margin (%r) must be below invalid_request_limit "
                             "(%r)" % (margin, limit))
        if isinstance(window, bool) or not isinstance(window, (int, float)) or not (
                0 < window < math.inf):
            raise ValueError("invalid_request_window must be a positive number of seconds, "
                             "got %r" % (window,))
        self.limit = limit
        self.window = float(window)
        self.margin = margin
        self.stop_at = limit - margin
        self._lock = threading.Lock()  # guards _times
        self._times: "collections.deque[float]" = collections.deque()

    def _expire_locked(self, now):
        times, cutoff = self._times, now - self.window
        while times and times[0] <= cutoff:
            times.popleft()

    def check(self, method: str = "") -> None:
        """Raise :class:`InvalidRequestBudgetExhausted` if no call may go now."""
        now = time.monotonic()
        with self._lock:
            self._expire_locked(now)
            count = len(self._times)
            if count < self.stop_at:
                return
            retry_in = self._times[count - self.stop_at] + self.window - now
        raise InvalidRequestBudgetExhausted(count, self.limit, self.window, max(retry_in, 0.0),
                                            method)

    def count(self) -> int:
        """Invalid answers in the window now."""
        with self._lock:
            self._expire_locked(time.monotonic())
            return len(self._times)

    def record(self) -> None:
        """One more invalid answer, now."""
        now = time.monotonic()
        with self._lock:
            self._expire_locked(now)
            self._times.append(now)


# -- answers: every number in them is outside input -----------------------------

def seconds_value(value: Any, default: Optional[float] = DEFAULT_RETRY_AFTER) -> Optional[float]:
    """A number of seconds from an answer (a JSON number or a header string
    of ASCII digits, see ``fastdispatch._netnum``) as a float in
    ``[0, MAX_RETRY_AFTER]``; ``default`` when it is not one."""
    return parse_seconds(value, default, cap=MAX_RETRY_AFTER)


def _remaining_value(text):
    return parse_int(text, max_digits=9) if isinstance(text, str) else None


def _bucket_value(text):
    if not isinstance(text, str) or not text or len(text) > _MAX_BUCKET \
            or not text.isprintable():
        return None
    return text


def report_headers(sc: Any, headers: Any, resource: str) -> None:
    """Hand one answer's ``X-RateLimit-*`` headers to ``sc.report_limit``
    (when both ``Remaining`` and ``Reset-After`` are there and sane)."""
    report = getattr(sc, "report_limit", None)
    if report is None:
        return
    remaining = _remaining_value(headers.get("X-RateLimit-Remaining"))
    reset_after = seconds_value(headers.get("X-RateLimit-Reset-After"), None)
    if remaining is None or reset_after is None or reset_after >= MAX_RETRY_AFTER:
        return  # absent, garbled, or a reset a day away or more: not a bucket's
    if headers.get("X-RateLimit-Scope") == "global":
        report(remaining, reset_after, scope="global")
        return
    bucket = _bucket_value(headers.get("X-RateLimit-Bucket"))
    report(remaining, reset_after, bucket=None if bucket is None else "%s:%s" % (bucket, resource))


def _decode(method, answer, secret=None):
    """The answer's JSON (None for an empty ``204``), or an exception to raise."""
    status = answer.status
    if 200 <= status < 300:
        if not answer.data:
            return None, None
        data = answer.json()
        if data is None:
            return None, PlatformError(status, "not a Discord API answer (HTTP %d, %d bytes)"
                                       % (status, len(answer.data)), None, method)
        return data, None
    body = answer.json()
    body = body if isinstance(body, dict) else {}
    if status == 429:
        seconds = seconds_value(body.get("retry_after"), None)
        if seconds is None:
            seconds = seconds_value(answer.headers.get("Retry-After"))
        is_global = body.get("global") is True or \
            answer.headers.get("X-RateLimit-Scope") == "global"
        return None, RetryAfter(seconds, scope="global" if is_global else "chat")
    message = body.get("message")
    if not isinstance(message, str):
        message = "HTTP %d" % status
    elif len(message) > _MAX_DESCRIPTION:
        message = message[:_MAX_DESCRIPTION] + "..."
    if secret:  # the errors scrub every live client's token; this one is the call's
        message = message.replace(secret, "<token>").replace(quote(secret, safe=""), "<token>")
    if status >= 500:
        return None, DiscordNetworkError(method, "HTTP %d: %s" % (status, message), status)
    code = body.get("code")
    parameters = {"code": code} if isinstance(code, int) and not isinstance(code, bool) \
        else None
    return None, PlatformError(status, message, parameters, method)


def _bot_id(token):
    """The bot's user id: the token's first part is it, base64-encoded."""
    first = token.partition(".")[0]
    try:
        text = base64.b64decode(first + "=" * (-len(first) % 4), validate=True).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        return "?"
    return text if parse_int(text) is not None else "?"


def _digest(secret):
    """A short stand-in for a secret in a bucket key (never the secret itself)."""
    return hashlib.sha256(secret.encode("utf-8", "replace")).hexdigest()[:16]


def _snowflake(name, value):
    text = str(value)
    if parse_int(text, max_digits=20) is None or text != text.strip():
        raise ValueError("%s must be a Discord id (a snowflake: digits), got %r" % (name, value))
    return text


class DiscordSender:
    """Sends to Discord's REST API; a fastdispatch ``Sender``.

    ``DiscordSender(token, base_url="https://discord.com/api/v10", *,
    pool_size=100, timeout=30.0, connect_timeout=10.0,
    invalid_request_limit=10000, invalid_request_window=600.0,
    invalid_request_margin=1000)``

    - ``token``: the bot token (sent as ``Authorization: Bot <token>``).
    - ``pool_size``: keep-alive connections shared by every thread; at
      least the dispatcher's ``max_inflight``.
    - ``timeout``, ``connect_timeout``: as for ``TelegramSender``; a send's
      deadline is ``sc.remaining()`` when the task has one.
    - ``invalid_request_*``: Discord's invalid-request limit (answers
      ``401``/``403``/``429`` in a window) and how far short of it every
      further call is refused (see :class:`InvalidRequestGuard`).

    Use it with ``Pacing.discord()`` (the bot-wide 50/s); the per-channel
    limits are learned from the answers.  Thread-safe.
    """

    def __init__(self, token: str, base_url: str = "https://discord.com/api/v10", *,
                 pool_size: int = 100, timeout: float = DEFAULT_TIMEOUT,
                 connect_timeout: float = 10.0, invalid_request_limit: int = 10000,
                 invalid_request_window: float = 600.0,
                 invalid_request_margin: int = 1000) -> None:
        if not isinstance(token, str):
            raise TypeError("token must be a str")
        if not token or not token.isprintable() or any(c in token for c in " \t\r\n"):
            raise ValueError("token is not a bot token (it is empty or holds characters "
                             "that cannot be part of one)")
        self.guard = InvalidRequestGuard(invalid_request_limit, invalid_request_window,
                                         invalid_request_margin)
        self._token = token
        self._http = JsonHttpClient(base_url, pool_size=pool_size, timeout=timeout,
                                    connect_timeout=connect_timeout, secrets=(token,),
                                    headers={"Authorization": "Bot " + token,
                                             "User-Agent": "DiscordBot (fastdispatch, 0.1)"})
        self.base_url = self._http.base_url
        self.timeout = self._http.timeout
        self.bot_id = _bot_id(token)

    def __repr__(self) -> str:
        return "DiscordSender(base_url=%r, bot_id=%r)" % (self.base_url, self.bot_id)

    def __reduce__(self):
        raise TypeError("a DiscordSender cannot be pickled (it holds the bot token)")

    def close(self) -> None:
        """Close the pool's connections.  Final."""
        self._http.close()

    def __enter__(self) -> "DiscordSender":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- the one way out ---------------------------------------------------

    def request(self, method: str, path: str, *, json: Any = None, sc: Any = None,
                resource: str = "", route: str = "", headers: Optional[Dict[str, str]] = None,
                timeout: Optional[float] = None, secret: Optional[str] = None) -> Any:
        """One REST call: ``method path`` with a JSON body; returns the
        answer's JSON (None for ``204``) or raises ``RetryAfter`` /
        :class:`DiscordNetworkError` / :class:`PlatformError`.  With ``sc``,
        the answer's limits are reported for ``resource``.  ``route`` names
        the call in errors (the path may hold a secret); ``secret`` (an
        interaction token in the path) is kept out of the errors' text."""
        route = route or "%s %s" % (method, path)
        self.guard.check(route)
        err = None
        try:
            answer = self._http.request(method, path, json=json, headers=headers,
                                        timeout=timeout)
        except HttpTransportError as exc:
            err = DiscordNetworkError(route, exc.reason)
        if err is not None:
            raise err
        status = answer.status
        if status in _INVALID_STATUSES and not (
                status == 429 and answer.headers.get("X-RateLimit-Scope") == "shared"):
            self.guard.record()
        if sc is not None:
            report_headers(sc, answer.headers, resource)
        result, err = _decode(route, answer, secret)
        if err is not None:
            raise err
        return result

    # -- Sender ------------------------------------------------------------

    def send(self, sc: Any, request: Any) -> SendResult:
        """Create Message in the channel ``request.target.id``, all within
        ``sc.remaining()``.  Returns ``SendResult(message_id, raw=message)``."""
        remaining = sc.remaining()
        if remaining is not None and remaining <= 0:
            sc.check()
        channel = _snowflake("channel id", request.target.id)
        result = self.request("POST", "/channels/%s/messages" % channel,
                              json={"content": request.message.text}, sc=sc,
                              resource=channel, route="POST /channels/{channel.id}/messages",
                              timeout=remaining)
        message_id = result.get("id") if isinstance(result, dict) else None
        return SendResult(message_id=message_id if isinstance(message_id, str) else "",
                          raw=result)

    def send_followup(self, sc: Any, application_id: str, interaction_token: str,
                      text: str) -> SendResult:
        """Create Followup Message (``POST /webhooks/{application.id}/
        {interaction.token}``) for an interaction acknowledged before."""
        remaining = None if sc is None else sc.remaining()
        if remaining is not None and remaining <= 0:
            sc.check()
        app = _snowflake("application_id", application_id)
        if not isinstance(interaction_token, str) or not interaction_token or \
                not interaction_token.isascii() or not interaction_token.isprintable() or \
                any(c in interaction_token for c in "/?#% "):
            raise ValueError("interaction_token is not an interaction token")
        result = self.request("POST", "/webhooks/%s/%s" % (app, interaction_token),
                              json={"content": text}, sc=sc,
                              resource="%s/%s" % (app, _digest(interaction_token)),
                              route="POST /webhooks/{application.id}/{interaction.token}",
                              timeout=remaining, secret=interaction_token)
        message_id = result.get("id") if isinstance(result, dict) else None
        return SendResult(message_id=message_id if isinstance(message_id, str) else "",
                          raw=result)

    # -- the optional protocols ---------------------------------------------

    def capabilities(self) -> Capabilities:
        """Delete and typing; Discord renders markdown in ``content``."""
        return Capabilities(delete_message=True, typing=True, markdown=True)

    def delete_message(self, chat_id: str, message_id: str) -> bool:
        """Delete Message (``DELETE /channels/{id}/messages/{id}``); True on ``204``."""
        channel = _snowflake("chat_id", chat_id)
        message = _snowflake("message_id", message_id)
        self.request("DELETE", "/channels/%s/messages/%s" % (channel, message),
                     route="DELETE /channels/{channel.id}/messages/{message.id}")
        return True

    def send_typing(self, chat_id: str) -> bool:
        """Trigger Typing Indicator (``POST /channels/{id}/typing``; shown
        for about 10 s); True on ``204``."""
        channel = _snowflake("chat_id", chat_id)
        self.request("POST", "/channels/%s/typing" % channel,
                     route="POST /channels/{channel.id}/typing")
        return True


class _SecretHolder:
    """Keeps a short-lived secret (an interaction token) in urllib3's log
    filter for as long as the holder lives."""

    __slots__ = ("__weakref__",)

    def __init__(self, secret):
        _redact.remember(self, (secret,))
