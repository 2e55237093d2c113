"""``fastdispatch.testing``: a local Discord REST API server for tests.

:class:`FakeDiscordServer` is a real HTTP/1.1 server on 127.0.0.1 (the
machinery is :class:`~._server.LocalServer`, shared with
``FakeTelegramServer``) that speaks the part of Discord's REST API a REST
bot uses (what discord.py's ``Client.login`` and hikari's ``RESTApp`` ask:
the bot's user and application, the gateway endpoints' answers, channels,
messages with attachments, edits, bulk deletes, reactions, typing,
interaction callbacks and follow-ups; the routes are one table,
:data:`_ROUTES`), and rate-limits the way Discord does:

- per-channel buckets (fixed windows, ``channel_limit`` requests per window,
  Discord's message route is 5 per 5 s), announced on *every* answer in
  ``X-RateLimit-Limit``/``-Remaining``/``-Reset``/``-Reset-After``/
  ``-Bucket``; one bucket hash per route, counted per channel (per webhook
  and token for follow-ups), as Discord's top-level resources are;
- the bot-wide global limit (50 requests per second), which no header
  announces until it is crossed;
- 429s shaped as Discord sends them: JSON ``{"message": "You are being rate
  limited.", "retry_after": <float seconds>, "global": <bool>}``, headers
  ``Retry-After`` (whole seconds), ``X-RateLimit-Scope``
  (``user``/``global``/``shared``) and ``X-RateLimit-Global`` for a global one;
- the invalid-request counter (answers ``401``/``403``/``429``, a shared
  ``429`` excepted, in a sliding window) and the temporary ban past it;
- fault injection (``5xx``, ``429``, dropped connections, latency);
- a per-channel record of what arrived and when (``time.monotonic()``);
- the interaction follow-up webhook, and a signer: the server holds an
  Ed25519 test key and :meth:`FakeDiscordServer.post_interaction` signs an
  interaction and POSTs it to an ``interactions_app``, the way Discord does.

What it emulates and what it does not is a table in ``docs/discord.md``.

Threads and locks: ``_lock`` (from the base) guards everything set in
:meth:`FakeDiscordServer._reset_state` (the record, the buckets, the
invalid-request window, the ban, the channel overrides, the interactions
issued, the fault plan, the counters).  Sleeping happens outside it.
"""

import collections
import hashlib
import http.client
import itertools
import json
import math
import re
import secrets
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple
from urllib.parse import unquote, urlsplit

from ..pacing import RateLimit
from ._server import BadParams, LocalServer, Upload, as_limit as _as_limit, parse_params

__all__ = ["FakeDiscordServer", "DiscordMessage", "discord_limits"]

_EPOCH_MS = 1420070400000  # Discord's epoch (2015-01-01), for snowflakes


def discord_limits(speedup: float = 1.0) -> Dict[str, RateLimit]:
    """Discord's limits as keyword arguments, every window divided by
    ``speedup``: ``channel_limit`` 5 per 5 s (the message route's bucket),
    ``global_limit`` 50 per 1 s.  ``FakeDiscordServer(**discord_limits(20))``."""
    if isinstance(speedup, bool) or not isinstance(speedup, (int, float)) or not (
            0 < speedup < math.inf):
        raise ValueError("speedup must be a positive finite number, got %r" % (speedup,))
    return {"channel_limit": RateLimit(5, per=5.0 / speedup),
            "global_limit": RateLimit(50, per=1.0 / speedup)}


class DiscordMessage(NamedTuple):
    """One message as it arrived (``at``: ``time.monotonic()``); ``kind`` is
    ``"message"`` (Create Message) or ``"followup"`` (an interaction's)."""

    channel_id: str
    message_id: str
    content: str
    at: float
    kind: str = "message"


class _Bucket:
    """A fixed window: ``count`` requests, then none until ``reset_at``."""

    __slots__ = ("count", "per", "remaining", "reset_at")

    def __init__(self, limit):
        self.count, self.per = limit.count, limit.per
        self.remaining, self.reset_at = limit.count, 0.0

    def take(self, now):
        """Take one; returns the wait needed (0.0: taken)."""
        if now >= self.reset_at:
            self.remaining, self.reset_at = self.count, now + self.per
        if self.remaining <= 0:
            return self.reset_at - now
        self.remaining -= 1
        return 0.0


def _route_hash(route):
    return hashlib.md5(route.encode()).hexdigest()  # a stable 32-hex-digit bucket id


_MESSAGES_ROUTE = _route_hash("POST /channels/{channel.id}/messages")
_WEBHOOK_ROUTE = _route_hash("POST /webhooks/{webhook.id}/{webhook.token}")
_CHANNEL_ERRORS = {
    403: "Missing Access", 404: "Unknown Channel", 401: "401: Unauthorized",
    400: "Cannot send an empty message"}
_ERROR_CODES = {"Missing Access": 50001, "Unknown Channel": 10003, "401: Unauthorized": 0,
                "Unknown Webhook": 10015, "Unknown Message": 10008,
                "Cannot send an empty message": 50006, "Invalid Form Body": 50035}


class _Reply(Exception):
    """Raised inside a route to answer with an error."""

    def __init__(self, status, body, headers=()):
        super().__init__(status)
        self.status, self.body, self.headers = status, body, list(headers)


def _error(status, message):
    return _Reply(status, {"message": message, "code": _ERROR_CODES.get(message, 0)})


class FakeDiscordServer(LocalServer):
    """A local Discord REST API: learned-limit headers, the global limit,
    the invalid-request ban, faults, follow-ups, a record per channel.

    ``FakeDiscordServer(token=None, *, channel_limit=RateLimit(5, per=5.0),
    global_limit=RateLimit(50, per=1.0), invalid_request_limit=10000,
    invalid_request_window=600.0, ban_seconds=3600.0, latency=0.0, seed=None,
    max_body=1 MiB, control=False)``

    - ``token``: the only bot token accepted (``401`` otherwise); None
      accepts any ``Authorization: Bot <token>``.
    - ``channel_limit``: each channel's bucket on the message route (and
      each interaction's on the follow-up route); ``global_limit``: every
      request of the bot, follow-ups excepted (as Discord exempts
      interaction endpoints).  A ``RateLimit``, ``(count, per)`` or None;
      :func:`discord_limits` gives Discord's, scaled.
    - ``invalid_request_limit``/``_window``/``ban_seconds``: past that many
      ``401``/``403``/``429`` answers in the window, every request is
      refused (``429``, ``code`` 0, "You are being blocked...") for
      ``ban_seconds``.

    Start with :meth:`start` or ``with``; ``DiscordSender(token,
    base_url=server.api_url)``.
    """

    server_name = "FakeDiscord/1"
    thread_name = "fake-discord"
    default_fault_method = "create_message"
    control_actions = LocalServer.control_actions + (
        "set_channel_status", "deleted", "typing", "edits", "reactions", "calls",
        "invalid_requests", "banned",
        "public_key", "make_interaction", "post_interaction")

    def __init__(self, token: Optional[str] = None, *,
                 channel_limit: Any = RateLimit(5, per=5.0),
                 global_limit: Any = RateLimit(50, per=1.0),
                 invalid_request_limit: int = 10000, invalid_request_window: float = 600.0,
                 ban_seconds: float = 3600.0, latency: Any = 0.0, seed: Optional[int] = None,
                 max_body: int = 1 << 20, control: bool = False, host: str = "127.0.0.1",
                 port: int = 0, **server_options: Any) -> None:
        if token is not None and not isinstance(token, str):
            raise TypeError("token must be a str or None")
        if isinstance(invalid_request_limit, bool) or not isinstance(
                invalid_request_limit, int) or invalid_request_limit < 1:
            raise ValueError("invalid_request_limit must be a positive int, got %r"
                             % (invalid_request_limit,))
        for name, value in (("invalid_request_window", invalid_request_window),
                            ("ban_seconds", ban_seconds)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    0 < value < math.inf):
                raise ValueError("%s must be a positive number of seconds, got %r"
                                 % (name, value))
        self.token = token
        self.channel_limit = _as_limit("channel_limit", channel_limit)
        self.global_limit = _as_limit("global_limit", global_limit)
        self.invalid_request_limit = invalid_request_limit
        self.invalid_request_window = float(invalid_request_window)
        self.ban_seconds = float(ban_seconds)
        self._signing_key, self.public_key = _test_key()
        self.application_id = "1100000000000000001"
        self._ids = itertools.count(1)
        super().__init__(latency=latency, seed=seed, max_body=max_body, host=host,
                         port=port, control=control, **server_options)

    def _reset_state(self):
        # Called with _lock held (or before the server runs).
        super()._reset_state()
        self._buckets: Dict[Tuple[str, str], _Bucket] = {}
        self._global: Optional[_Bucket] = None
        self._invalid: "collections.deque[float]" = collections.deque()
        self._banned_until = 0.0
        self._channel_status: Dict[str, int] = {}
        self._interactions: Dict[str, str] = {}  # interaction token -> channel id
        self._interaction_ids: Dict[str, str] = {}  # interaction token -> its id
        self._interaction_meta: Dict[str, Dict[str, Any]] = {}  # token -> metadata
        self._responded: Dict[str, Optional[str]] = {}  # token -> original message id
        self._stored: Dict[str, Dict[str, Dict[str, Any]]] = collections.defaultdict(dict)
        self._reactions: Dict[tuple, List[str]] = {}  # (channel, message) -> the bot's
        self._edits: List[tuple] = []  # (channel, message id, content after the edit)
        self._calls: List[tuple] = []  # (route, path parts, at) of each success
        self._deleted: List[tuple] = []
        self._typing: List[tuple] = []

    @property
    def api_url(self) -> str:
        """``http://127.0.0.1:<port>/api/v10``: what ``DiscordSender(base_url=...)`` takes."""
        return self.base_url + "/api/v10"

    # -- configuration -----------------------------------------------------

    def set_channel_status(self, channel_id: Any, status: Optional[int]) -> None:
        """Answer every request for this channel with ``status`` (403
        "Missing Access", 404 "Unknown Channel", 401, 400) from now on; None
        serves it normally again."""
        if status is not None and status not in _CHANNEL_ERRORS:
            raise ValueError("status must be one of %s or None" % sorted(_CHANNEL_ERRORS))
        with self._lock:
            if status is None:
                self._channel_status.pop(str(channel_id), None)
            else:
                self._channel_status[str(channel_id)] = status

    def inject(self, fault: str, count: int = 1, *, method: Optional[str] = "create_message",
               status: int = 500, retry_after: float = 1.0, seconds: float = 0.0,
               is_global: bool = False) -> None:
        """Answer the next ``count`` calls of ``method`` (``"create_message"``,
        ``"followup"``, ``"delete_message"``, ``"typing"``; None: any) with a
        fault: ``"error"`` (HTTP ``status``, nothing recorded), ``"too_many"``
        (a Discord 429 of ``retry_after`` seconds, ``global`` when
        ``is_global``), ``"drop"`` (closed before processing), ``"drop_after"``
        (recorded, then closed), ``"garbage"``, ``"truncate"``, ``"delay"``
        (held ``seconds``, then served)."""
        self._plan_fault(fault, count, method, status=status, retry_after=retry_after,
                         seconds=seconds, is_global=is_global)

    def set_fault_rates(self, *, method: Optional[str] = "create_message", error: float = 0.0,
                        too_many: float = 0.0, drop: float = 0.0, drop_after: float = 0.0,
                        status: int = 500, retry_after: float = 1.0) -> None:
        """Random faults at these rates (see ``FakeTelegramServer.set_fault_rates``)."""
        self._plan_rates(method, {"error": error, "too_many": too_many, "drop": drop,
                                  "drop_after": drop_after},
                         status=status, retry_after=retry_after)

    def _fault_options(self, **options):
        checked = super()._fault_options(**options)
        if not 0 <= checked["retry_after"] < math.inf:
            raise ValueError("retry_after must be a finite number of seconds >= 0")
        checked["is_global"] = bool(options.get("is_global", False))
        return checked

    # -- what arrived ------------------------------------------------------

    def deleted(self) -> List[tuple]:
        """``(channel_id, message_id)`` of every message deleted, in order."""
        with self._lock:
            return list(self._deleted)

    def typing(self) -> List[tuple]:
        """``(channel_id, at)`` of every typing indicator triggered."""
        with self._lock:
            return list(self._typing)

    def edits(self) -> List[tuple]:
        """``(channel_id, message_id, content)`` of every edit, in order."""
        with self._lock:
            return list(self._edits)

    def reactions(self, channel_id: Any, message_id: Any) -> List[str]:
        """The emojis the bot's reactions on a message show now."""
        with self._lock:
            return list(self._reactions.get((str(channel_id), str(message_id)), []))

    def calls(self) -> List[tuple]:
        """``(route, path parts, at)`` of every successful request, in order
        (routes: ``me``, ``create_message``, ``edit_message``,
        ``bulk_delete``, ``add_reaction``, ``interaction_callback``, ...)."""
        with self._lock:
            return list(self._calls)

    def invalid_requests(self) -> int:
        """Invalid answers (401/403/429, shared 429s excepted) in the window now."""
        with self._lock:
            self._expire_invalid_locked(time.monotonic())
            return len(self._invalid)

    def banned(self) -> bool:
        """Whether the bot is banned now (past the invalid-request limit)."""
        with self._lock:
            return time.monotonic() < self._banned_until

    def stats(self) -> Dict[str, int]:
        """Counters: ``requests``, ``sent``, ``too_many`` (429s for limits;
        ``too_many_channel``, ``too_many_global``), ``invalid`` (every
        invalid answer ever), ``banned_requests``, ``injected_<fault>``,
        ``status_<n>``."""
        return super().stats()

    # -- interactions ------------------------------------------------------

    def make_interaction(self, channel_id: Any, name: str, *, text: str = "",
                         user_id: Any = "2200000000000000002", username: str = "tester",
                         guild_id: Any = "3300000000000000003",
                         interaction_type: int = 2) -> Dict[str, Any]:
        """An interaction payload as Discord sends it: a chat-input command
        ``/name`` with one string option ``text`` (``interaction_type=2``),
        or a PING (``1``).  Its token is registered here, so follow-ups to
        it land in ``channel_id``'s record."""
        token = "aW50ZXJhY3Rpb24" + secrets.token_urlsafe(48)
        channel = str(channel_id)
        interaction_id = self._snowflake()
        user = {"id": str(user_id), "username": username, "discriminator": "0",
                "global_name": username, "avatar": None}
        with self._lock:
            self._interactions[token] = channel
            self._interaction_ids[token] = interaction_id
            self._interaction_meta[token] = {
                "id": interaction_id, "type": interaction_type, "user": user,
                "authorizing_integration_owners": {"0": str(guild_id)}}
        payload: Dict[str, Any] = {
            "id": interaction_id, "application_id": self.application_id,
            "type": interaction_type, "token": token, "version": 1,
            "app_permissions": "2248473465835073", "locale": "en-US",
            "entitlements": [], "authorizing_integration_owners": {"0": str(guild_id)},
            "context": 0, "attachment_size_limit": 10485760,
        }
        if interaction_type == 1:
            return payload
        payload.update(channel_id=channel, channel={"id": channel, "type": 0},
                       guild_id=str(guild_id), guild_locale="en-US",
                       member={"user": user, "roles": [], "nick": None,
                               "joined_at": "2024-01-01T00:00:00.000000+00:00",
                               "permissions": "2248473465835073", "deaf": False,
                               "mute": False, "pending": False, "flags": 0})
        options = [{"name": "text", "type": 3, "value": text}] if text else []
        payload["data"] = {"id": self._snowflake(), "name": name, "type": 1,
                           "options": options}
        return payload

    def sign(self, body: bytes, timestamp: Optional[str] = None) -> Dict[str, str]:
        """The ``X-Signature-Ed25519``/``X-Signature-Timestamp`` headers
        Discord would send with ``body`` (signed with this server's test key)."""
        timestamp = str(int(time.time())) if timestamp is None else timestamp
        signature = self._signing_key.sign(timestamp.encode() + body).signature
        return {"X-Signature-Ed25519": signature.hex(), "X-Signature-Timestamp": timestamp}

    def post_interaction(self, url: str, interaction: Any, *,
                         headers: Optional[Dict[str, str]] = None, timeout: float = 10.0,
                         sign: bool = True) -> Tuple[int, Any]:
        """Sign ``interaction`` (a dict, or the exact bytes) and POST it to
        ``url`` (an ``interactions_app`` being served); returns ``(status,
        JSON answer or the raw bytes)``.  ``headers`` are added last (to
        send a stale timestamp or a wrong signature)."""
        body = interaction if isinstance(interaction, bytes) else json.dumps(
            interaction, separators=(",", ":")).encode()
        sent = {"Content-Type": "application/json", "User-Agent": "Discord-Interactions/1.0"}
        if sign:
            sent.update(self.sign(body))
        sent.update(headers or {})
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        try:
            conn.request("POST", parts.path or "/", body=body, headers=sent)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, data

    # -- request handling ----------------------------------------------------

    def _snowflake(self):
        ms = int(time.time() * 1000) - _EPOCH_MS
        return str((ms << 22) | (next(self._ids) & 0x3FFFFF))

    def _error_body(self, status, description, parameters=None):
        return status, json.dumps({"message": description, "code": 0}).encode()

    def _expire_invalid_locked(self, now):
        cutoff = now - self.invalid_request_window
        while self._invalid and self._invalid[0] <= cutoff:
            self._invalid.popleft()

    def _count_invalid_locked(self, status, headers, now):
        if status not in (401, 403, 429) or ("X-RateLimit-Scope", "shared") in headers:
            return
        self._counts["invalid"] += 1
        self._expire_invalid_locked(now)
        self._invalid.append(now)
        if len(self._invalid) > self.invalid_request_limit and now >= self._banned_until:
            self._banned_until = now + self.ban_seconds
            self._counts["bans"] += 1

    def _send(self, handler, status, data, headers=()):
        # Discord's answers come through Google's front end; discord.py takes
        # a 429 without this header for Cloudflare's ban and does not retry it
        headers = list(headers) + [("Via", "1.1 google")]
        with self._lock:
            self._count_invalid_locked(status, headers, time.monotonic())
        body = b"" if data is None else json.dumps(data, separators=(",", ":")).encode()
        if status == 204:
            head = b"HTTP/1.1 204 No Content\r\n"
            for name, value in headers:
                head += b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1"))
            handler.wfile.write(head + b"\r\n")
            return
        self._reply(handler, status, body, headers=headers)

    def _too_many(self, seconds, scope, bucket_headers=()):
        value = math.ceil(seconds * 1000) / 1000.0
        headers = list(bucket_headers) + [("Retry-After", str(max(1, math.ceil(seconds)))),
                                          ("X-RateLimit-Scope", scope)]
        if scope == "global":
            headers.append(("X-RateLimit-Global", "true"))
        return _Reply(429, {"message": "You are being rate limited.", "retry_after": value,
                            "global": scope == "global"}, headers)

    def _handle_request(self, handler, request):
        path = request.path
        if not path.startswith("/api/v10/"):
            return self._send(handler, 404, {"message": "404: Not Found", "code": 0})
        found = _route(request.command, path[len("/api/v10/"):])
        if found is None:
            return self._send(handler, 404, {"message": "404: Not Found", "code": 0})
        route, parts = found
        try:
            if not route.endswith("followup") and route != "interaction_callback":
                self._check_auth(request)
            fault, options = self._pick_fault(route)
            if fault == "delay":
                time.sleep(options["seconds"])
            if fault == "drop":
                return self._drop(handler)
            if fault == "error":
                status = options["status"]
                phrase = handler.responses.get(status, ("Internal Server Error",))[0]
                raise _Reply(status, {"message": "%d: %s" % (status, phrase), "code": 0})
            if fault == "too_many":
                raise self._too_many(options["retry_after"],
                                     "global" if options["is_global"] else "user")
            status, data, headers = getattr(self, "_route_" + route)(request, parts)
            if status < 300:
                with self._lock:
                    self._calls.append((route, parts, time.monotonic()))
        except _Reply as reply:
            return self._send(handler, reply.status, reply.body, reply.headers)
        self._hold_answer()
        if fault == "drop_after":
            return self._drop(handler)
        if fault == "garbage":
            return self._reply(handler, 200, b"<<not json>>", b"text/plain")
        if fault == "truncate":
            return self._truncate(handler, 200, json.dumps(data).encode())
        return self._send(handler, status, data, headers)

    def _check_auth(self, request):
        now = time.monotonic()
        with self._lock:
            if now < self._banned_until:
                self._counts["banned_requests"] += 1
                left = self._banned_until - now
                raise _Reply(429, {"message": "You are being blocked from accessing our API "
                                   "temporarily due to exceeding our rate limits frequently.",
                                   "code": 0, "retry_after": math.ceil(left), "global": True},
                             [("Retry-After", str(math.ceil(left))),
                              ("X-RateLimit-Scope", "global")])
        auth = request.headers.get("Authorization") or ""
        scheme, _, token = auth.partition(" ")
        if scheme != "Bot" or not token or (self.token is not None and token != self.token):
            raise _error(401, "401: Unauthorized")

    def _take(self, route_hash, resource, limit, use_global):
        """Take from the global limit and the resource's bucket; the bucket's
        headers for the answer, or raise a 429."""
        now = time.monotonic()
        with self._lock:
            if use_global and self.global_limit is not None:
                if self._global is None:
                    self._global = _Bucket(self.global_limit)
                wait = self._global.take(now)
                if wait > 0:
                    self._counts["too_many"] += 1
                    self._counts["too_many_global"] += 1
                    raise self._too_many(wait, "global")
            if limit is None:
                return []
            key = (route_hash, resource)
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(limit)
                if len(self._buckets) > 100000:  # forget buckets long reset
                    self._buckets = {k: b for k, b in self._buckets.items()
                                     if b.reset_at > now}
                    self._buckets[key] = bucket
            wait = bucket.take(now)
            reset_after = max(bucket.reset_at - now, 0.0)
            headers = [("X-RateLimit-Limit", str(bucket.count)),
                       ("X-RateLimit-Remaining", str(bucket.remaining)),
                       ("X-RateLimit-Reset", "%.3f" % (time.time() + reset_after)),
                       ("X-RateLimit-Reset-After", "%.3f" % (math.ceil(reset_after * 1000)
                                                             / 1000.0)),
                       ("X-RateLimit-Bucket", route_hash)]
            if wait > 0:
                self._counts["too_many"] += 1
                self._counts["too_many_channel"] += 1
                raise self._too_many(wait, "user", headers)
            return headers

    def _channel(self, channel):
        with self._lock:
            status = self._channel_status.get(channel)
        if status is not None:
            raise _error(status, _CHANNEL_ERRORS[status])

    def _payload(self, request):
        """The request's JSON body (or a multipart one's ``payload_json``)
        and its files (``files[n]``) as attachments."""
        try:
            params = parse_params("", request.headers.get("Content-Type") or "application/json",
                                  request.body)
        except BadParams:
            raise _Reply(400, {"message": "400: Bad Request", "code": 0}) from None
        data = params
        if "payload_json" in params:
            try:
                data = json.loads(params["payload_json"])
            except (TypeError, ValueError, RecursionError):
                data = None
        if not isinstance(data, dict):
            raise _Reply(400, {"message": "400: Bad Request", "code": 0})
        files = [(name, v) for name, v in params.items() if isinstance(v, Upload)]
        attachments = [{"id": self._snowflake(), "filename": upload.filename,
                        "size": len(upload.data), "content_type": upload.content_type,
                        "url": "%s/attachments/%s" % (self.base_url, upload.filename),
                        "proxy_url": "%s/attachments/%s" % (self.base_url, upload.filename)}
                       for _, upload in files]
        return data, attachments

    def _content(self, data, attachments=(), required=True):
        """The message's ``content`` checked as Discord checks it."""
        content = data.get("content")
        if content is None and not required:
            return None
        if content is None and (attachments or data.get("embeds")):
            return ""
        if not isinstance(content, str) or not content and not (
                attachments or data.get("embeds")):
            raise _error(400, "Cannot send an empty message")
        if len(content) > 2000:
            raise _Reply(400, {"message": "Invalid Form Body", "code": 50035, "errors": {
                "content": {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH",
                                         "message": "Must be 2000 or fewer in length."}]}}})
        return content

    def _bot_user(self):
        return {"id": self.application_id, "username": "fake-bot", "discriminator": "0",
                "global_name": None, "avatar": None, "bot": True, "flags": 0,
                "public_flags": 0}

    def _message(self, channel, content, kind, now, attachments=(), embeds=None):
        message_id = self._snowflake()
        message = {"id": message_id, "channel_id": channel, "type": 0, "content": content,
                   "author": self._bot_user(), "attachments": list(attachments),
                   "embeds": list(embeds or []), "mentions": [], "mention_roles": [],
                   "pinned": False, "mention_everyone": False, "tts": False,
                   "timestamp": _timestamp(), "edited_timestamp": None, "flags": 0,
                   "components": []}
        with self._lock:
            self._record.add(channel, DiscordMessage(channel, message_id, content, now, kind))
            self._stored[channel][message_id] = message
        return dict(message)

    def _stored_message(self, channel, message_id):
        with self._lock:
            message = self._stored.get(channel, {}).get(message_id)
        if message is None:
            raise _error(404, "Unknown Message")
        return message

    def _edit(self, channel, message_id, request):
        """Edit a stored message of the bot: its content, embeds, attachments."""
        data, attachments = self._payload(request)
        content = self._content(data, attachments, required=False)
        with self._lock:
            message = self._stored.get(channel, {}).get(message_id)
            if message is None:
                raise _error(404, "Unknown Message")
            if message["author"]["id"] != self.application_id:
                raise _error(403, "Cannot edit a message authored by another user")
            if content is not None:
                message["content"] = content
            if "embeds" in data:
                message["embeds"] = list(data["embeds"] or [])
            if attachments:
                message["attachments"] = message["attachments"] + attachments
            message["edited_timestamp"] = _timestamp()
            self._edits.append((channel, message_id, message["content"]))
            return dict(message)

    # -- routes: the bot --------------------------------------------------------

    def _route_me(self, request, parts):
        return 200, dict(self._bot_user(), mfa_enabled=False, verified=True, locale="en-US",
                         bio=""), self._take(_route_hash("GET users/@me"), "me", None, True)

    def _route_gateway(self, request, parts):
        return 200, {"url": "wss://gateway.discord.gg"}, []

    def _route_gateway_bot(self, request, parts):
        # What Discord answers; the fake has no gateway to connect to.
        return 200, {"url": "wss://gateway.discord.gg", "shards": 1,
                     "session_start_limit": {"total": 1000, "remaining": 1000,
                                             "reset_after": 0, "max_concurrency": 1}}, []

    def _route_application(self, request, parts):
        return 200, {"id": self.application_id, "name": "fake-bot", "icon": None,
                     "description": "", "summary": "", "bot_public": True,
                     "bot_require_code_grant": False, "verify_key": self.public_key,
                     "flags": 0, "team": None, "owner": dict(self._bot_user(), bot=False),
                     "bot": self._bot_user(), "rpc_origins": []}, []

    # -- routes: channels and messages -----------------------------------------------

    def _route_get_channel(self, request, parts):
        channel = parts[0]
        self._channel(channel)
        return 200, {"id": channel, "type": 0, "guild_id": "3300000000000000003",
                     "name": "channel-%s" % channel, "position": 0,
                     "permission_overwrites": [], "nsfw": False, "parent_id": None,
                     "topic": None, "last_message_id": None, "rate_limit_per_user": 0,
                     "flags": 0}, []

    def _route_create_message(self, request, parts):
        channel = parts[0]
        now = time.monotonic()
        headers = self._take(_MESSAGES_ROUTE, channel, self.channel_limit, True)
        with _announcing(headers):
            self._channel(channel)
            data, attachments = self._payload(request)
            content = self._content(data, attachments)
        return 200, self._message(channel, content, "message", now, attachments,
                                  data.get("embeds")), headers

    def _route_get_message(self, request, parts):
        channel, message_id = parts
        headers = self._take(_route_hash("GET message"), channel, self.channel_limit, True)
        with _announcing(headers):
            self._channel(channel)
            return 200, dict(self._stored_message(channel, message_id)), headers

    def _route_edit_message(self, request, parts):
        channel, message_id = parts
        headers = self._take(_route_hash("PATCH message"), channel, self.channel_limit, True)
        with _announcing(headers):
            self._channel(channel)
            return 200, self._edit(channel, message_id, request), headers

    def _route_delete_message(self, request, parts):
        channel, message_id = parts
        headers = self._take(_route_hash("DELETE message"), channel, self.channel_limit, True)
        with _announcing(headers):
            self._channel(channel)
            with self._lock:
                if message_id not in self._stored.get(channel, ()):
                    raise _error(404, "Unknown Message")
                del self._stored[channel][message_id]
                self._deleted.append((channel, message_id))
        return 204, None, headers

    def _route_bulk_delete(self, request, parts):
        channel = parts[0]
        headers = self._take(_route_hash("POST bulk-delete"), channel, self.channel_limit,
                             True)
        with _announcing(headers):
            self._channel(channel)
            data, _ = self._payload(request)
            ids = data.get("messages")
            if not isinstance(ids, list) or not 2 <= len(ids) <= 100:
                raise _Reply(400, {"message": "Invalid Form Body", "code": 50035, "errors": {
                    "messages": {"_errors": [{"code": "BASE_TYPE_BAD_LENGTH",
                                              "message": "Must be between 2 and 100 in "
                                                         "length."}]}}})
            with self._lock:
                # Discord: ids that do not exist are skipped (and still count)
                for message_id in map(str, ids):
                    if self._stored.get(channel, {}).pop(message_id, None) is not None:
                        self._deleted.append((channel, message_id))
        return 204, None, headers

    def _route_add_reaction(self, request, parts, add=True):
        channel, message_id, emoji = parts
        headers = self._take(_route_hash("reactions"), channel, self.channel_limit, True)
        with _announcing(headers):
            self._channel(channel)
            self._stored_message(channel, message_id)
            emoji = unquote(emoji)
            with self._lock:
                mine = self._reactions.setdefault((channel, message_id), [])
                if add and emoji not in mine:
                    mine.append(emoji)
                elif not add and emoji in mine:
                    mine.remove(emoji)
        return 204, None, headers

    def _route_remove_reaction(self, request, parts):
        return self._route_add_reaction(request, parts, add=False)

    def _route_typing(self, request, parts):
        channel = parts[0]
        headers = self._take(_route_hash("POST typing"), channel, self.channel_limit, True)
        with _announcing(headers):
            self._channel(channel)
        with self._lock:
            self._typing.append((channel, time.monotonic()))
        return 204, None, headers

    # -- routes: interactions ------------------------------------------------------------

    def _interaction(self, token, app=None):
        with self._lock:
            channel = self._interactions.get(token)
        if channel is None or app not in (None, self.application_id):
            raise _error(404, "Unknown Webhook")
        return channel

    def _route_interaction_callback(self, request, parts):
        interaction_id, token = parts
        now = time.monotonic()
        channel = self._interaction(token)
        with self._lock:
            if self._interaction_ids.get(token) != interaction_id:
                raise _error(404, "Unknown Interaction")
        data, attachments = self._payload(request)
        kind = data.get("type")
        if kind not in (1, 4, 5, 6, 7, 9, 10):
            raise _Reply(400, {"message": "Invalid Form Body", "code": 50035})
        with self._lock:
            if token in self._responded:
                raise _error(400, "Interaction has already been acknowledged.")
            self._responded[token] = None
        message = None
        body = data.get("data") or {}
        if kind == 4:
            message = self._message(channel, self._content(body, attachments), "response",
                                    now, attachments, body.get("embeds"))
        elif kind == 5:
            message = dict(self._message(channel, "", "deferred", now), flags=128)
        if message is not None:
            with self._lock:
                message["interaction_metadata"] = dict(self._interaction_meta[token])
                self._stored[channel][message["id"]] = message
                self._responded[token] = message["id"]
        if request.query and "with_response" in request.query and not request.query.endswith(
                ("=0", "=false")):
            answer = {"interaction": {"id": interaction_id, "type": 2,
                                      "response_message_id": message and message["id"],
                                      "response_message_loading": kind == 5,
                                      "response_message_ephemeral": bool(
                                          (body.get("flags") or 0) & 64)},
                      "resource": {"type": kind}}
            if message is not None:
                answer["resource"]["message"] = message
            return 200, answer, []
        return 204, None, []

    def _route_followup(self, request, parts):
        app, token = parts
        now = time.monotonic()
        channel = self._interaction(token, app)
        headers = self._take(_WEBHOOK_ROUTE, token, self.channel_limit, False)
        with _announcing(headers):
            data, attachments = self._payload(request)
            content = self._content(data, attachments)
        return 200, self._message(channel, content, "followup", now, attachments,
                                  data.get("embeds")), headers

    def _followup_id(self, token, mid):
        if mid != "@original":
            return mid
        with self._lock:
            original = self._responded.get(token)
        if original is None:
            raise _error(404, "Unknown Message")
        return original

    def _route_get_followup(self, request, parts):
        app, token, mid = parts
        channel = self._interaction(token, app)
        headers = self._take(_WEBHOOK_ROUTE, token, self.channel_limit, False)
        with _announcing(headers):
            return 200, dict(self._stored_message(channel, self._followup_id(token, mid))), \
                headers

    def _route_edit_followup(self, request, parts):
        app, token, mid = parts
        channel = self._interaction(token, app)
        headers = self._take(_WEBHOOK_ROUTE, token, self.channel_limit, False)
        with _announcing(headers):
            return 200, self._edit(channel, self._followup_id(token, mid), request), headers

    def _route_delete_followup(self, request, parts):
        app, token, mid = parts
        channel = self._interaction(token, app)
        headers = self._take(_WEBHOOK_ROUTE, token, self.channel_limit, False)
        with _announcing(headers):
            message_id = self._followup_id(token, mid)
            with self._lock:
                if self._stored.get(channel, {}).pop(message_id, None) is None:
                    raise _error(404, "Unknown Message")
                self._deleted.append((channel, message_id))
        return 204, None, headers


def _timestamp():
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000+00:00", time.gmtime())


class _announcing:
    """``with _announcing(headers):`` an error answer raised inside carries
    the bucket's headers too (Discord announces them on every answer)."""

    def __init__(self, headers):
        self.headers = headers

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, _Reply):
            exc.headers = list(self.headers) + exc.headers
        return False


#: Discord's routes the fake serves: (HTTP method, path pattern, route name).
#: ``{id}`` is a snowflake, ``{token}`` an interaction token, ``{emoji}`` a
#: URL-encoded emoji, ``{mid}`` a message id or ``@original``.
_ROUTES = [
    ("GET", "users/@me", "me"),
    ("GET", "gateway", "gateway"),
    ("GET", "gateway/bot", "gateway_bot"),
    ("GET", "oauth2/applications/@me", "application"),
    ("GET", "applications/@me", "application"),
    ("GET", "channels/{id}", "get_channel"),
    ("POST", "channels/{id}/messages", "create_message"),
    ("GET", "channels/{id}/messages/{id}", "get_message"),
    ("PATCH", "channels/{id}/messages/{id}", "edit_message"),
    ("DELETE", "channels/{id}/messages/{id}", "delete_message"),
    ("POST", "channels/{id}/messages/bulk-delete", "bulk_delete"),
    ("POST", "channels/{id}/messages/bulk_delete", "bulk_delete"),
    ("PUT", "channels/{id}/messages/{id}/reactions/{emoji}/@me", "add_reaction"),
    ("DELETE", "channels/{id}/messages/{id}/reactions/{emoji}/@me", "remove_reaction"),
    ("POST", "channels/{id}/typing", "typing"),
    ("POST", "interactions/{id}/{token}/callback", "interaction_callback"),
    ("POST", "webhooks/{id}/{token}", "followup"),
    ("GET", "webhooks/{id}/{token}/messages/{mid}", "get_followup"),
    ("PATCH", "webhooks/{id}/{token}/messages/{mid}", "edit_followup"),
    ("DELETE", "webhooks/{id}/{token}/messages/{mid}", "delete_followup"),
]
_PIECES = {"{id}": r"[0-9]{1,20}", "{token}": r"[A-Za-z0-9_\-.]{1,200}",
           "{emoji}": r"[^/]{1,200}", "{mid}": r"(?:[0-9]{1,20}|@original)"}
_ROUTE_PATTERNS = [(method, re.compile("/".join(
    "(%s)" % _PIECES[piece] if piece in _PIECES else re.escape(piece)
    for piece in pattern.split("/"))), name) for method, pattern, name in _ROUTES]


def _route(command, path):
    """(route name, the path's variable parts) or None."""
    for method, pattern, name in _ROUTE_PATTERNS:
        if method == command:
            match = pattern.fullmatch(path)
            if match:
                return name, match.groups()
    return None


def _test_key():
    """A fresh Ed25519 test key pair: (signing key, public key hex)."""
    try:
        from nacl.signing import SigningKey
    except ImportError:  # pragma: no cover - depends on the installation
        raise ImportError("FakeDiscordServer signs interactions with PyNaCl: "
                          "pip install 'fastdispatch[discord]'") from None
    key = SigningKey.generate()
    return key, bytes(key.verify_key).hex()
