"""Replies out to the QQ official bot API: :class:`QQSender`, the
access-token life cycle and the passive-reply rules.

Since 2025-04-21 a QQ bot may only *reply*: within 5 minutes of a group
message (60 of a c2c one), at most 5 replies to one message, each with its
own ``msg_seq``.  The sender enforces the window and the count before any
request (:class:`ReplyWindowExpired`), and assigns ``msg_seq`` when the
reply is first made, keeping it for every later attempt of the same task
(the dispatcher hands a task the same ``sc`` on each attempt): QQ then
deduplicates a retry, and answers ``40054005``, which means the reply was
already delivered, so it is a success.  That makes a retry after a timeout
safe, so a lost answer is a :class:`QQNetworkError` (a ``ConnectionError``,
retried by ``RetryPolicy()``).

- ``22009`` (sending too fast) and HTTP 429 -> ``RetryAfter`` of that chat;
- an expired token (HTTP 401, code 11244) -> refreshed, the call made once more;
- any other refusal -> ``PlatformError`` (its ``status`` is QQ's ``code``).

The access token (``getAppAccessToken``) is fetched on first use, refreshed
a minute before it expires, one refresh at a time, and never logged: it
travels only in a header (never in a URL, which urllib3 logs) and appears
in no repr or error.

Threads: one sender serves every worker.  ``_token_lock`` guards the token
and makes one thread at a time fetch it; ``_lock`` guards the reply
bookkeeping (``_replies``, ``_seqs``).
"""

import collections
import threading
import time
from typing import Any, Dict, Optional, Tuple
from urllib.parse import quote

from .._errors import RetryAfter
from .._http import (
    DEFAULT_TIMEOUT, HttpTransportError, JsonHttpClient, PlatformError, PlatformNetworkError)
from ..platform import SendResult

__all__ = ["QQSender", "ReplyWindowExpired", "QQNetworkError", "PlatformError"]

API_URL = "https://api.sgroup.qq.com"
TOKEN_URL = "https://bots.qq.com/app/getAppAccessToken"
#: How long after a message it may be replied to (seconds), by target kind.
REPLY_WINDOWS = {"group": 300.0, "c2c": 3600.0}
MAX_REPLIES = 5
TOO_FAST = 22009
DEDUPLICATED = 40054005
TOKEN_EXPIRED = 11244
_REFRESH_BEFORE = 60.0
_MEMO = 10000  # replies whose msg_seq is remembered for retries
_PATHS = {"group": "/v2/groups/%s/messages", "c2c": "/v2/users/%s/messages",
          "channel": "/channels/%s/messages", "dms": "/dms/%s/messages"}


class ReplyWindowExpired(PlatformError):
    """The reply cannot be made: its message is older than the reply window
    (group 5 min, c2c 60 min) or already has 5 replies.  Raised before any
    request; never retried."""

    def __init__(self, description, method=""):
        super().__init__(0, description, None, method)

    def __reduce__(self):
        return (type(self), (self.description, self.method))


class QQNetworkError(PlatformNetworkError):
    """No answer (a timeout, a reset, a ``5xx``): retried by
    ``RetryPolicy()``; a reply's retry carries the same ``msg_seq``, so QQ
    delivers it at most once."""


class QQSender:
    """Sends replies to the QQ official bot API; a fastdispatch ``Sender``.

    ``QQSender(app_id, client_secret, *, base_url=API_URL, token_url=None,
    timeout=30.0, pool_size=100)``; with ``base_url`` of a local server and
    no ``token_url``, the token comes from ``base_url +
    "/app/getAppAccessToken"``.  Use it with ``Pacing.qq()``.  Thread-safe.
    """

    def __init__(self, app_id: str, client_secret: str, *, base_url: str = API_URL,
                 token_url: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT,
                 connect_timeout: float = 10.0, pool_size: int = 100) -> None:
        app_id = str(app_id)
        if not app_id.isdigit():
            raise ValueError("app_id must be the bot's AppID (digits), got %r" % (app_id,))
        if not isinstance(client_secret, str) or not client_secret:
            raise ValueError("client_secret must be a non-empty str")
        self.app_id = app_id
        self._secret = client_secret
        if token_url is None:
            token_url = TOKEN_URL if base_url == API_URL else base_url.rstrip("/") + \
                "/app/getAppAccessToken"
        self._api = JsonHttpClient(base_url, pool_size=pool_size, timeout=timeout,
                                   connect_timeout=connect_timeout, secrets=(client_secret,))
        self._auth = JsonHttpClient(token_url, pool_size=2, timeout=timeout,
                                    connect_timeout=connect_timeout, secrets=(client_secret,))
        self.base_url = self._api.base_url
        self._token_lock = threading.Lock()  # guards _token/_expires; one fetch at a time
        self._token: Optional[str] = None
        self._expires = 0.0
        self.token_fetches = 0
        self._lock = threading.Lock()  # guards _replies and _seqs
        self._replies: Dict[str, Tuple[float, int]] = {}  # msg_id -> (first seen, seqs given)
        self._seqs: "collections.OrderedDict[Any, int]" = collections.OrderedDict()

    def __repr__(self) -> str:
        return "QQSender(app_id=%r, base_url=%r)" % (self.app_id, self.base_url)

    def __reduce__(self):
        raise TypeError("a QQSender cannot be pickled (it holds the client secret)")

    def close(self) -> None:
        """Close the connections.  Final."""
        self._api.close()
        self._auth.close()

    def __enter__(self) -> "QQSender":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- the access token ----------------------------------------------------

    def _access_token(self, stale: Optional[str] = None) -> str:
        with self._token_lock:
            if self._token is not None and self._token != stale and \
                    time.monotonic() < self._expires - _REFRESH_BEFORE:
                return self._token
            err = None
            try:
                answer = self._auth.request("POST", "", json={
                    "appId": self.app_id, "clientSecret": self._secret})
            except HttpTransportError as exc:
                err = QQNetworkError("getAppAccessToken", exc.reason)
            if err is not None:
                raise err
            body = answer.json()
            token = body.get("access_token") if isinstance(body, dict) else None
            try:
                ttl = float(body.get("expires_in"))
            except (TypeError, ValueError, AttributeError):
                ttl = -1.0
            if answer.status != 200 or not isinstance(token, str) or not token or \
                    not 0 < ttl < 10 ** 7:
                raise PlatformError(answer.status, "getAppAccessToken gave no token",
                                    None, "getAppAccessToken")
            self._token, self._expires = token, time.monotonic() + ttl
            self.token_fetches += 1
            return token

    # -- replies -------------------------------------------------------------

    def _seq_for(self, sc, kind, msg_id, text, msg_time):
        """The reply's msg_seq: the one given to this task's earlier attempt,
        or the next of ``msg_id`` after checking the window and the count."""
        memo = (id(sc), msg_id, text)
        now = time.time()
        with self._lock:
            seq = self._seqs.get(memo)
            if seq is not None:
                return seq, memo
            first, given = self._replies.get(msg_id, (now if msg_time is None
                                                      else float(msg_time), 0))
            window = REPLY_WINDOWS.get(kind)
            if window is not None and now - first > window:
                raise ReplyWindowExpired("the message %s is %.0f s old: past the %s reply "
                                         "window of %.0f s" % (msg_id, now - first, kind,
                                                               window), "reply")
            if given >= MAX_REPLIES:
                raise ReplyWindowExpired("the message %s already has %d replies" % (
                    msg_id, MAX_REPLIES), "reply")
            seq = given + 1
            self._replies[msg_id] = (first, seq)
            self._seqs[memo] = seq
            while len(self._seqs) > _MEMO:
                self._seqs.popitem(last=False)
            return seq, memo

    def reply(self, sc: Any, target: Tuple[str, str], text: str, *, msg_id: str,
              msg_time: Optional[float] = None) -> SendResult:
        """Reply ``text`` to the message ``msg_id`` at ``target``
        (``("group", group_openid)``, ``("c2c", openid)``, ``("channel",
        channel_id)``, ``("dms", guild_id)``), within ``sc.remaining()``.
        ``msg_time``: the message's time (epoch seconds; default: when the
        sender first saw ``msg_id``)."""
        if not (isinstance(target, tuple) and len(target) == 2 and target[0] in _PATHS
                and isinstance(target[1], str) and target[1]):
            raise ValueError('target must be ("group" | "c2c" | "channel" | "dms", id), '
                             "got %r" % (target,))
        if not isinstance(msg_id, str) or not msg_id:
            raise ValueError("msg_id must be the id of the message replied to")
        kind, ident = target
        remaining = sc.remaining() if sc is not None else None
        if remaining is not None and remaining <= 0:
            sc.check()
        body: Dict[str, Any] = {"content": text, "msg_type": 0, "msg_id": msg_id}
        memo = None
        if kind in ("group", "c2c"):
            body["msg_seq"], memo = self._seq_for(sc, kind, msg_id, text, msg_time)
        path = _PATHS[kind] % quote(ident, safe="")
        result = self._post(path, body, remaining, "POST " + _PATHS[kind] % "{id}")
        if memo is not None:
            with self._lock:
                self._seqs.pop(memo, None)
        message_id = result.get("id") if isinstance(result, dict) else None
        return SendResult(message_id=message_id if isinstance(message_id, str) else "",
                          raw=result)

    def send(self, sc: Any, request: Any) -> SendResult:
        """``Sender.send``: a reply to ``request.message.reply_to`` (a msg_id)."""
        msg_id = getattr(request.message, "reply_to", None)
        return self.reply(sc, request.target.id, request.message.text, msg_id=msg_id)

    def _post(self, path, body, timeout, route):
        token = self._access_token()
        for attempt in (1, 2):
            err = None
            try:
                answer = self._api.request("POST", path, json=body, timeout=timeout, headers={
                    "Authorization": "QQBot " + token, "X-Union-Appid": self.app_id})
            except HttpTransportError as exc:
                err = QQNetworkError(route, exc.reason)
            if err is not None:
                raise err
            data = answer.json()
            code = data.get("code") if isinstance(data, dict) else None
            if 200 <= answer.status < 300 and not code:
                return data
            if code == DEDUPLICATED:
                return data  # an earlier attempt was delivered
            if code == TOO_FAST or answer.status == 429:
                raise RetryAfter(1.0, scope="chat")
            if (answer.status == 401 or code == TOKEN_EXPIRED) and attempt == 1:
                token = self._access_token(stale=token)
                continue
            if answer.status >= 500:
                raise QQNetworkError(route, "HTTP %d" % answer.status, answer.status)
            message = data.get("message") if isinstance(data, dict) else None
            raise PlatformError(code if isinstance(code, int) else answer.status,
                                message if isinstance(message, str) else
                                "HTTP %d" % answer.status, None, route)
        raise AssertionError("unreachable")  # pragma: no cover
