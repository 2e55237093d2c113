"""``FakeQQServer``: the QQ official bot API's side on 127.0.0.1, for tests
of a QQ bot's replies.

Built on :class:`~fastdispatch.testing._server.LocalServer`:

- **The token endpoint** ``POST /app/getAppAccessToken`` (``appId``,
  ``clientSecret``): a fresh token valid ``token_ttl`` seconds; a call with
  an unknown or expired token is answered 401, code 11244.
- **The send endpoints**: ``POST /v2/groups/{group_openid}/messages``,
  ``/v2/users/{openid}/messages``, ``/channels/{channel_id}/messages``,
  ``/dms/{guild_id}/messages``.  A reply names ``msg_id``, a message the
  server pushed (:meth:`FakeQQServer.push_group_message`,
  :meth:`~FakeQQServer.push_c2c_message`); the server checks its window
  (group 5 min, c2c 60 min, scalable with ``window_scale``), at most 5
  replies to it, and deduplicates ``msg_id`` + ``msg_seq``: a repeat is
  answered code ``40054005`` and not recorded again.
- **The record**: each reply a :class:`QQMessage`, per chat
  (``.messages(("group", openid))``).
- **Faults** (``inject(fault, count, chat=None, ...)``): ``"too_many"``
  (code ``22009``, sending too fast), ``"error"`` (HTTP ``status`` with
  ``code``), ``"delay"`` (processed and recorded at once, answered
  ``seconds`` late: a client that gave up before may retry).

Threads and locks: ``LocalServer._lock`` guards every mutable field here
too (tokens, messages pushed, replies counted, ``msg_seq`` seen).
"""

import itertools
import json
import re
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ._server import LocalServer

__all__ = ["FakeQQServer", "QQMessage"]

_ROUTES = ((re.compile(r"^/v2/groups/([^/]+)/messages$"), "group"),
           (re.compile(r"^/v2/users/([^/]+)/messages$"), "c2c"),
           (re.compile(r"^/channels/([^/]+)/messages$"), "channel"),
           (re.compile(r"^/dms/([^/]+)/messages$"), "dms"))
WINDOWS = {"group": 300.0, "c2c": 3600.0}
#: The fake's own code for a reply past its window or its 5 replies.
REPLY_REFUSED = 40034024


class QQMessage(NamedTuple):
    """One reply as the server recorded it on arrival."""

    chat: Tuple[str, str]
    text: str
    msg_id: str
    msg_seq: Optional[int]
    id: str
    at: float  # time.monotonic() on arrival


class FakeQQServer(LocalServer):
    """The QQ official bot API on 127.0.0.1 (see the module docstring).

    ``FakeQQServer(app_id="1024", client_secret="secret", *, token_ttl=7200,
    window_scale=1.0, latency=0.0, seed=None, port=0, control=False)``;
    ``base_url`` is what ``QQSender(..., base_url=)`` takes.
    """

    server_name = "FakeQQ/1"
    thread_name = "fake-qq"
    control_actions = LocalServer.control_actions + (
        "push_group_message", "push_c2c_message", "expire_tokens")

    def __init__(self, app_id: str = "1024", client_secret: str = "secret", *,
                 token_ttl: float = 7200.0, window_scale: float = 1.0, latency: Any = 0.0,
                 seed: Optional[int] = None, port: int = 0, control: bool = False) -> None:
        self.app_id = str(app_id)
        self.client_secret = client_secret
        if not 0 < token_ttl < 10 ** 7:
            raise ValueError("token_ttl must be a positive number of seconds")
        if not 0 < window_scale <= 1000:
            raise ValueError("window_scale must be a positive number")
        self.token_ttl = float(token_ttl)
        self.window_scale = float(window_scale)
        super().__init__(latency=latency, seed=seed, port=port, control=control)

    def _reset_state(self) -> None:
        super()._reset_state()
        self._tokens: Dict[str, float] = {}  # token -> expiry (monotonic)
        self._pushed: Dict[str, Tuple[str, float]] = {}  # msg_id -> (kind, time pushed)
        self._replied: Dict[str, int] = {}
        self._seen_seq: set = set()
        self._ids = itertools.count(1)

    # -- events ---------------------------------------------------------------

    def _push(self, kind, back):
        with self._lock:
            msg_id = "%s-msg-%d" % (kind, next(self._ids))
            self._pushed[msg_id] = (kind, time.monotonic() - back)
        return msg_id

    def push_group_message(self, group_openid: str, text: str = "", *,
                           age: float = 0.0) -> str:
        """A group message the bot may reply to; returns its ``msg_id``.
        ``age``: seconds it is already old."""
        return self._push("group", age)

    def push_c2c_message(self, openid: str, text: str = "", *, age: float = 0.0) -> str:
        """A c2c message the bot may reply to; returns its ``msg_id``."""
        return self._push("c2c", age)

    def expire_tokens(self) -> int:
        """Make every token issued so far expired; returns how many."""
        with self._lock:
            n = len(self._tokens)
            self._tokens = {t: 0.0 for t in self._tokens}
        return n

    def inject(self, fault: str, count: int = 1, *, chat: Any = None, status: int = 500,
               code: int = 0, seconds: float = 0.0) -> None:
        """The next ``count`` sends to ``chat`` (None: any) meet ``fault``:
        ``"too_many"`` (``22009``), ``"error"`` (HTTP ``status``, ``code``)
        or ``"delay"`` (recorded now, answered ``seconds`` late)."""
        if fault not in ("too_many", "error", "delay"):
            raise ValueError('fault must be "too_many", "error" or "delay", got %r' % (fault,))
        target = None if chat is None else "%s:%s" % tuple(chat)
        self._plan_fault(fault, count, "send", target, status=status, seconds=seconds,
                         code=code)

    def _fault_options(self, **options):
        checked = super()._fault_options(**options)
        checked["code"] = int(options.get("code", 0))
        return checked

    def messages(self, chat_id: Any) -> List[QQMessage]:
        """The replies recorded for ``(kind, id)``, in arrival order."""
        if isinstance(chat_id, (tuple, list)):
            chat_id = "%s:%s" % tuple(chat_id)
        return super().messages(chat_id)

    def stats(self) -> Dict[str, int]:
        """LocalServer's counters and ``tokens`` (issued), ``deduplicated``,
        ``too_fast``, ``refused`` (past a window or 5 replies)."""
        counts = super().stats()
        for name in ("tokens", "deduplicated", "too_fast", "refused", "unauthorized"):
            counts.setdefault(name, 0)
        return counts

    # -- serving -----------------------------------------------------------------

    def _answer(self, handler, status, body):
        self._hold_answer()
        try:
            self._reply(handler, status, json.dumps(body).encode())
        except OSError:
            pass  # the client gave up waiting (a timeout test)

    def _handle_request(self, handler, request):
        try:
            params = json.loads(request.body or b"{}")
        except ValueError:
            params = None
        if not isinstance(params, dict):
            return self._answer(handler, 400, {"code": 40000, "message": "bad JSON"})
        if request.path == "/app/getAppAccessToken":
            if params.get("appId") != self.app_id or \
                    params.get("clientSecret") != self.client_secret:
                return self._answer(handler, 401, {"code": 100016, "message": "invalid appid "
                                                   "or secret"})
            with self._lock:
                token = "fake-token-%d" % next(self._ids)
                self._tokens[token] = time.monotonic() + self.token_ttl
                self._counts["tokens"] += 1
            return self._answer(handler, 200, {"access_token": token,
                                               "expires_in": "%d" % self.token_ttl})
        for pattern, kind in _ROUTES:
            match = pattern.match(request.path)
            if match:
                return self._send(handler, request, kind, match.group(1), params)
        return self._answer(handler, 404, {"code": 404, "message": "no such route"})

    def _send(self, handler, request, kind, ident, params):
        auth = request.headers.get("Authorization") or ""
        token = auth[6:] if auth.startswith("QQBot ") else ""
        now = time.monotonic()
        with self._lock:
            valid = self._tokens.get(token, 0.0) > now
            if not valid:
                self._counts["unauthorized"] += 1
        if not valid:
            return self._answer(handler, 401, {"code": 11244, "message": "token not exist or "
                                               "expire"})
        key = "%s:%s" % (kind, ident)
        fault, options = self._pick_fault("send", key)
        if fault == "too_many":
            with self._lock:
                self._counts["too_fast"] += 1
            return self._answer(handler, 400, {"code": 22009, "message": "msg limit exceed"})
        if fault == "error":
            return self._answer(handler, options["status"], {"code": options["code"],
                                                             "message": "injected"})
        msg_id = params.get("msg_id")
        seq = params.get("msg_seq")
        seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else None
        text = str(params.get("content", ""))
        with self._lock:
            answer = self._check_reply_locked(kind, msg_id, seq, now)
            if answer is None:
                if kind in WINDOWS:
                    self._seen_seq.add((msg_id, seq))
                    self._replied[msg_id] = self._replied.get(msg_id, 0) + 1
                mid = "reply-%d" % next(self._ids)
                self._record.add(key, QQMessage((kind, ident), text, msg_id or "", seq, mid,
                                                now))
                if kind in WINDOWS:
                    answer = (200, {"id": mid, "timestamp": int(time.time())})
                else:  # a guild message object, as the guild endpoints answer
                    answer = (200, {
                        "id": mid, "content": text,
                        "channel_id": ident if kind == "channel" else "dm-" + ident,
                        "guild_id": "guild-" + ident if kind == "channel" else ident,
                        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                        "author": {"id": self.app_id, "username": "fake-bot", "bot": True}})
        if fault == "delay":
            self._sleep(options["seconds"])
        return self._answer(handler, *answer)

    def _check_reply_locked(self, kind, msg_id, seq, now):
        if kind not in WINDOWS:
            return None
        pushed = self._pushed.get(msg_id)
        if pushed is None or pushed[0] != kind:
            self._counts["refused"] += 1
            return 400, {"code": REPLY_REFUSED, "message": "msg_id is not a message to reply to"}
        if (msg_id, seq) in self._seen_seq:
            self._counts["deduplicated"] += 1
            return 200, {"code": 40054005, "message": "duplicate msg_seq: deduplicated"}
        if now - pushed[1] > WINDOWS[kind] * self.window_scale or \
                self._replied.get(msg_id, 0) >= 5:
            self._counts["refused"] += 1
            return 400, {"code": REPLY_REFUSED, "message": "passive reply window passed or "
                         "5 replies made"}
        return None
