"""Calls out to a OneBot v11 implementation: :class:`OneBotSender` over the
HTTP API or one shared forward WebSocket, the ``retcode`` mapping, and
:func:`chat_of`.

The sender is a thin translation layer, like ``TelegramSender``: it builds
the call, sends it, and turns the answer into a result or a typed error.  It
never retries, never sleeps and never reorders: the dispatcher owns order,
pacing (``Pacing.onebot()``) and retries.

Two transports, one answer format:

- **HTTP**: ``POST {url}/{action}`` with the parameters as a JSON body,
  through the shared pooled client (``fastdispatch._http.JsonHttpClient``).
- **Forward WebSocket**: ``{"action", "params", "echo"}`` frames on one
  connection shared by every thread (:class:`_WsLink`); a reader thread
  hands each answer to the call whose ``echo`` it carries and every other
  frame (the implementation's events) to ``on_event``.  A lost connection
  is opened again by the next call.

A call whose answer does not come by its deadline raises
:class:`OutcomeUnknown`: the implementation may have sent the message
(NapCat confirms a send only once QQ did, up to about 10 s later), so the
dispatcher never retries it (it is a ``SendTimeout``, not a
``ConnectionError``).  Only a call that certainly went nowhere (the
connection could not be opened, the frame could not be written) raises
:class:`OneBotNetworkError`, which ``RetryPolicy()`` retries.

Threads: one sender serves every worker.  ``_WsLink._lock`` guards the
link's connection and its table of calls waiting for an answer;
``_WsLink._connect_lock`` makes one thread at a time open a connection.
"""

import itertools
import json as _json
import logging
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple
from urllib.parse import urlsplit

from .._errors import SendTimeout
from .._http import (
    DEFAULT_TIMEOUT, HttpTransportError, JsonHttpClient, PlatformError, PlatformNetworkError,
    check_seconds)
from ..platform import Capabilities, SendResult

__all__ = ["OneBotSender", "OutcomeUnknown", "OneBotNetworkError", "OneBotError", "chat_of",
           "PlatformError"]

_log = logging.getLogger("fastdispatch.onebot")

#: retcodes that say the call itself is wrong (OneBot v11: bad parameters,
#: no such action, unauthorised...): never worth a retry.
REFUSED_RETCODES = frozenset((1400, 1401, 1403, 1404))
_MAX_MESSAGE = 1000


class OutcomeUnknown(SendTimeout):
    """No answer came by the call's deadline, or the connection was lost
    while the call waited for one: the implementation may or may not have
    done it (a message may have gone out).  A ``SendTimeout``, so the
    dispatcher never retries it; ``action`` names the call."""

    def __init__(self, action: str = "", reason: str = "") -> None:
        super().__init__(action, reason)
        self.action = action
        self.reason = reason

    def __str__(self) -> str:
        return "%s: outcome unknown (%s); not retried: it may have been done" % (
            self.action or "OneBot call", self.reason)


class OneBotNetworkError(PlatformNetworkError):
    """The call certainly did not reach the implementation (its connection
    could not be opened or the request could not be written).  A
    ``ConnectionError``, so ``RetryPolicy()`` retries it."""


class OneBotError(PlatformError):
    """The implementation answered with a failure: ``retcode`` (also
    ``status``), ``description`` its ``message``/``wording``.  1400, 1401,
    1403 and 1404 say the call is wrong; 100, 200, 1200 and the others
    that it failed doing it (often its risk control).  Not retried."""

    def __init__(self, status, description, parameters=None, method=""):
        super().__init__(status, description, parameters, method)
        self.retcode = status


# -- which chat a call is made for ---------------------------------------------

def _id(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit() and len(value) < 24:
        return int(value)
    return None


_GROUP_PREFIXES = ("send_group_", "upload_group_", "set_group_")
_PRIVATE_PREFIXES = ("send_private_", "upload_private_")


def chat_of(action: str, params: Any) -> Optional[Tuple[str, int]]:
    """The chat a OneBot call is made for: ``("group", group_id)``,
    ``("private", user_id)``, or None for a call that names no chat.

    ``send_msg`` (and ``send_forward_msg``) is decided by its
    ``message_type`` first (a group ``send_msg`` carries a ``user_id``
    too), then by which id it holds; ``send_group_*``, ``upload_group_*``
    and ``set_group_*`` by ``group_id``; ``send_private_*`` and
    ``upload_private_*`` by ``user_id``.  Ids given as digit strings are
    the same chat as the int.  Queries (``get_*``) name no chat.
    """
    if not isinstance(action, str) or not isinstance(params, dict):
        return None
    if action.endswith("_async"):
        action = action[:-6]
    elif action.endswith("_rate_limited"):
        action = action[:-13]
    group = _id(params.get("group_id"))
    user = _id(params.get("user_id"))
    if action in ("send_msg", "send_forward_msg"):
        kind = params.get("message_type")
        if kind == "group" or (kind != "private" and group is not None):
            return None if group is None else ("group", group)
        return None if user is None else ("private", user)
    if action.startswith(_GROUP_PREFIXES):
        return None if group is None else ("group", group)
    if action.startswith(_PRIVATE_PREFIXES):
        return None if user is None else ("private", user)
    return None


# -- answers ---------------------------------------------------------------------

def _text(value):
    if not isinstance(value, str):
        return ""
    return value if len(value) <= _MAX_MESSAGE else value[:_MAX_MESSAGE] + "..."


def decode_answer(action: str, answer: Any) -> Any:
    """An answer's ``data``, None for ``retcode`` 1 (queued), or the error."""
    if not isinstance(answer, dict):
        raise OneBotError(-1, "not a OneBot answer", None, action)
    retcode = answer.get("retcode")
    if isinstance(retcode, bool) or not isinstance(retcode, int):
        raise OneBotError(-1, "not a OneBot answer (no retcode)", None, action)
    if retcode == 0:
        return answer.get("data")
    if retcode == 1:
        return None
    description = _text(answer.get("wording")) or _text(answer.get("message")) \
        or _text(answer.get("msg")) or "retcode %d" % retcode
    raise OneBotError(retcode, description, None, action)


# -- the forward WebSocket ---------------------------------------------------------

class _Slot:
    """One call waiting for its answer on a connection."""

    __slots__ = ("event", "answer", "lost", "conn")

    def __init__(self, conn):
        self.event = threading.Event()
        self.answer = None
        self.lost = False
        self.conn = conn


class _WsLink:
    """One forward WebSocket shared by every thread (see the module docstring)."""

    def __init__(self, url, token, connect_timeout, on_event, max_size):
        try:
            from websockets.sync.client import connect
        except ImportError:  # pragma: no cover - depends on the installation
            raise ImportError("OneBotSender over a WebSocket needs websockets: pip install "
                              "'fastdispatch[onebot]'") from None
        self._connect_fn = connect
        self._url = url
        self._headers = {"Authorization": "Bearer " + token} if token else {}
        self._connect_timeout = connect_timeout
        self._on_event = on_event
        self._max_size = max_size
        self._lock = threading.Lock()  # guards _conn, _waiting, _closed
        self._connect_lock = threading.Lock()  # one connect at a time
        self._conn = None
        self._waiting: Dict[str, _Slot] = {}
        self._closed = False
        self._echo = itertools.count(1)
        self.connects = 0

    def _connection(self, action, deadline):
        with self._lock:
            if self._conn is not None:
                return self._conn
        left = deadline - time.monotonic()
        if not self._connect_lock.acquire(timeout=max(left, 0.001)):
            raise OneBotNetworkError(action, "no connection within the call's deadline "
                                     "(nothing was sent)")
        try:
            with self._lock:
                if self._closed:
                    raise OneBotNetworkError(action, "the sender is closed")
                if self._conn is not None:
                    return self._conn
            timeout = min(self._connect_timeout, max(deadline - time.monotonic(), 0.001))
            err = None
            try:
                conn = self._connect_fn(self._url, additional_headers=self._headers,
                                        open_timeout=timeout, compression=None,
                                        max_size=self._max_size, ping_interval=None)
                conn.__enter__()  # the connection lives until it is lost or closed
            except Exception as exc:  # refused, bad handshake, timeout: nothing was sent
                err = OneBotNetworkError(action, "could not open the WebSocket: %s"
                                         % (type(exc).__name__,))
            if err is not None:
                raise err
            with self._lock:
                self._conn = conn
                self.connects += 1
            threading.Thread(target=self._read, args=(conn,), name="onebot-ws-reader",
                             daemon=True).start()
            return conn
        finally:
            self._connect_lock.release()

    def call(self, action, params, timeout):
        deadline = time.monotonic() + timeout
        conn = self._connection(action, deadline)
        echo = "fd%d" % next(self._echo)
        slot = _Slot(conn)
        frame = _json.dumps({"action": action, "params": params, "echo": echo},
                            separators=(",", ":"), ensure_ascii=False)
        with self._lock:
            self._waiting[echo] = slot
        try:
            try:
                conn.send(frame)
            except Exception as exc:  # closed before the frame went: not sent
                self._lost(conn)
                raise OneBotNetworkError(action, "the WebSocket was closed before the call "
                                         "was sent (%s)" % (type(exc).__name__,)) from None
            if not slot.event.wait(max(deadline - time.monotonic(), 0.0)):
                raise OutcomeUnknown(action, "no answer within the call's %.3g s deadline"
                                     % timeout)
            if slot.lost:
                raise OutcomeUnknown(action, "the WebSocket was lost before the answer came")
            return slot.answer
        finally:
            with self._lock:
                self._waiting.pop(echo, None)

    def _read(self, conn):
        try:
            for frame in conn:
                try:
                    data = _json.loads(frame)
                except ValueError:
                    continue
                if not isinstance(data, dict):
                    continue
                echo = data.get("echo")
                if isinstance(echo, str):
                    with self._lock:
                        slot = self._waiting.get(echo)
                    if slot is not None:
                        slot.answer = data
                        slot.event.set()
                    continue
                if "post_type" in data and self._on_event is not None:
                    try:
                        self._on_event(data)
                    except Exception:
                        _log.exception("OneBotSender: on_event failed")
        except Exception:
            pass  # the connection ended; every call waiting on it is told below
        finally:
            self._lost(conn)

    def _lost(self, conn):
        with self._lock:
            if self._conn is conn:
                self._conn = None
            lost = [s for s in self._waiting.values() if s.conn is conn]
        for slot in lost:
            slot.lost = True
            slot.event.set()
        try:
            conn.close()
        except Exception:
            pass

    def close(self):
        with self._lock:
            self._closed = True
            conn = self._conn
        if conn is not None:
            self._lost(conn)


class OneBotSender:
    """Calls a OneBot v11 implementation (NapCat, Lagrange.OneBot, LLOneBot,
    go-cqhttp); a fastdispatch ``Sender``.

    ``OneBotSender(url, access_token=None, *, timeout=30.0,
    connect_timeout=10.0, pool_size=100, on_event=None)``

    - ``url``: ``http://`` or ``https://`` for the HTTP API, ``ws://`` or
      ``wss://`` for the forward WebSocket.
    - ``access_token``: sent as ``Authorization: Bearer <token>``.
    - ``timeout``: the deadline of a call made without one.
    - ``on_event``: WebSocket only; called on the reader thread with each
      event (a dict) the implementation pushes.

    Thread-safe; use it with ``Pacing.onebot()``.
    """

    def __init__(self, url: str, access_token: Optional[str] = None, *,
                 timeout: float = DEFAULT_TIMEOUT, connect_timeout: float = 10.0,
                 pool_size: int = 100,
                 on_event: Optional[Callable[[Dict[str, Any]], Any]] = None,
                 max_answer_bytes: int = 32 << 20) -> None:
        if not isinstance(url, str):
            raise TypeError("url must be a str")
        if access_token is not None and (not isinstance(access_token, str) or any(
                c in access_token for c in "\r\n")):
            raise ValueError("access_token must be a str without line breaks, or None")
        if on_event is not None and not callable(on_event):
            raise TypeError("on_event must be callable or None")
        self.timeout = check_seconds("timeout", timeout)
        scheme = urlsplit(url).scheme
        self.url = url.rstrip("/")
        self._http = self._ws = None
        if scheme in ("http", "https"):
            headers = {"Authorization": "Bearer " + access_token} if access_token else {}
            self._http = JsonHttpClient(url, pool_size=pool_size, timeout=timeout,
                                        connect_timeout=connect_timeout,
                                        secrets=(access_token,) if access_token else (),
                                        headers=headers, max_answer_bytes=max_answer_bytes)
        elif scheme in ("ws", "wss"):
            self._ws = _WsLink(url, access_token, check_seconds("connect_timeout",
                                                                connect_timeout),
                               on_event, max_answer_bytes)
        else:
            raise ValueError("url must be http(s):// (the HTTP API) or ws(s):// (a forward "
                             "WebSocket), got %r" % (url,))
        self.transport = "http" if self._http is not None else "websocket"

    def __repr__(self) -> str:
        return "OneBotSender(%r)" % (self.url,)

    def __reduce__(self):
        raise TypeError("a OneBotSender cannot be pickled (it may hold the access token)")

    def close(self) -> None:
        """Close the connections.  Final."""
        if self._http is not None:
            self._http.close()
        else:
            self._ws.close()

    def __enter__(self) -> "OneBotSender":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def call(self, action: str, params: Optional[Dict[str, Any]] = None, *,
             timeout: Optional[float] = None) -> Any:
        """One API call; returns the answer's ``data`` (None when the
        implementation queued it: ``retcode`` 1), or raises
        :class:`OneBotError` / :class:`OutcomeUnknown` /
        :class:`OneBotNetworkError`.  ``timeout``: seconds for the whole
        call (``sc.remaining()`` in a task)."""
        if not isinstance(action, str) or not action or not all(
                c.isalnum() or c in "_." for c in action):
            raise ValueError("action must be a OneBot action name, got %r" % (action,))
        params = {} if params is None else params
        if not isinstance(params, dict):
            raise TypeError("params must be a dict, got %r" % (type(params).__name__,))
        t = self.timeout if timeout is None else timeout
        if t <= 0:  # nothing sent: a plain SendTimeout
            raise SendTimeout("%s: the deadline had passed before the call" % (action,))
        if self._ws is not None:
            return decode_answer(action, self._ws.call(action, params, t))
        err = None
        try:
            answer = self._http.request("POST", "/" + action, json=params, timeout=t)
        except HttpTransportError as exc:
            # A connection that could not be opened carried nothing (urllib3
            # counts a refusal as a connect timeout); anything later may
            # have been done.
            if "NewConnectionError" in exc.reason or "refused" in exc.reason.lower():
                err = OneBotNetworkError(action, exc.reason)
            else:
                err = OutcomeUnknown(action, exc.reason)
        if err is not None:
            raise err
        if answer.status >= 300:  # 401/403 token, 404 action, 5xx: never retried
            body = answer.json()
            if isinstance(body, dict) and body.get("retcode") not in (None, 0, 1):
                decode_answer(action, body)
            raise OneBotError(answer.status, "HTTP %d" % answer.status, None, action)
        return decode_answer(action, answer.json())

    # -- Sender ------------------------------------------------------------

    def send(self, sc: Any, request: Any) -> SendResult:
        """``send_group_msg`` / ``send_private_msg`` to ``request.target.id``
        (``("group", id)`` or ``("private", id)``), within ``sc.remaining()``."""
        remaining = sc.remaining()
        if remaining is not None and remaining <= 0:
            sc.check()
        target = request.target.id
        if not (isinstance(target, tuple) and len(target) == 2
                and target[0] in ("group", "private") and _id(target[1]) is not None):
            raise ValueError('a OneBot chat is ("group", group_id) or ("private", user_id), '
                             "got %r" % (target,))
        kind, number = target[0], _id(target[1])
        if kind == "group":
            data = self.call("send_group_msg", {"group_id": number,
                                                "message": request.message.text},
                             timeout=remaining)
        else:
            data = self.call("send_private_msg", {"user_id": number,
                                                  "message": request.message.text},
                             timeout=remaining)
        message_id = data.get("message_id") if isinstance(data, dict) else None
        return SendResult(message_id="" if message_id is None else str(message_id), raw=data)

    def capabilities(self) -> Capabilities:
        """Delete (``delete_msg``); OneBot messages are plain text or CQ codes."""
        return Capabilities(delete_message=True)

    def delete_message(self, chat_id: Any, message_id: Any) -> bool:
        """``delete_msg`` (recall); True when it was done."""
        self.call("delete_msg", {"message_id": _id(message_id) if _id(message_id) is not None
                                 else message_id})
        return True
