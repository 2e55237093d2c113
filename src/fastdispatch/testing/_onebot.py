"""``FakeOneBotServer``: the implementation's side of OneBot v11 (what NapCat,
Lagrange.OneBot or LLOneBot serve) on 127.0.0.1, for a bot's own tests.

- **The HTTP API** (``.http_url``): ``POST /<action>`` with JSON, form or
  query parameters, built on :class:`~fastdispatch.testing._server.LocalServer`.
- **A forward WebSocket** (``.ws_url``, a port of its own): on connect it
  sends the ``lifecycle``/``connect`` meta event (NoneBot's adapter waits
  for it), then carries ``{"action", "params", "echo"}`` calls and their
  answers both ways with the events the server pushes
  (:meth:`FakeOneBotServer.push_group_message`,
  :meth:`~FakeOneBotServer.push_private_message`).  Served by
  ``websockets``' threaded server (the library the sender uses: one
  dependency for both ends).
- **The record**: every send (``send_msg``, ``send_group_msg``,
  ``send_private_msg``, the forward sends) as a :class:`OneBotMessage`
  with its text and arrival time, per chat: ``.messages(("group", gid))``.
  Sends of one chat that were in flight at once are counted
  (``stats()["concurrent"]``).
- **Limits, enforced on arrival**: per chat and bot-wide sliding windows,
  by default those of ``Pacing.onebot()``; a send over one is refused with
  ``retcode`` 100 (what a risk-control refusal looks like) and counted
  (``stats()["limit_refusals"]``), not recorded.
- **Faults** (``inject(fault, count, action=None, chat=None, ...)``):
  ``"error"`` (``retcode``, default 100: risk control), ``"delay"`` (the
  answer held ``seconds``), ``"drop"`` (not done, never answered) and
  ``"drop_after"`` (done and recorded, never answered: NapCat's late
  confirmation).  A call never answered on HTTP is held until the server
  stops.

Threads and locks: ``LocalServer._lock`` guards every mutable field here
too (the windows, the in-flight counts, the WebSocket clients, the message
ids).  Nothing waits or sends while holding it.
"""

import collections
import itertools
import json
import math
import threading
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ..pacing import RateLimit
from ._server import BadParams, LocalServer, as_limit, parse_params
from ._telegram import _Window

__all__ = ["FakeOneBotServer", "OneBotMessage"]

_SEND_ACTIONS = frozenset(("send_msg", "send_group_msg", "send_private_msg",
                           "send_group_forward_msg", "send_private_forward_msg",
                           "send_forward_msg"))


class OneBotMessage(NamedTuple):
    """One send as the server recorded it on arrival."""

    chat: Tuple[str, int]  # ("group", group_id) or ("private", user_id)
    text: str  # the message's text (other segments as CQ codes)
    action: str
    message_id: int
    at: float  # time.monotonic() on arrival
    transport: str  # "http" or "websocket"


def message_text(message: Any) -> str:
    """The text of a OneBot message: a string as it is, an array of
    segments with text segments' text and others as CQ codes."""
    if isinstance(message, str):
        return message
    if isinstance(message, dict):
        message = [message]
    if not isinstance(message, list):
        return ""
    parts = []
    for seg in message:
        if not isinstance(seg, dict):
            continue
        data = seg.get("data") if isinstance(seg.get("data"), dict) else {}
        if seg.get("type") == "text":
            parts.append(str(data.get("text", "")))
        elif seg.get("type") == "node":
            parts.append(message_text(data.get("content", "")))
        else:
            parts.append("[CQ:%s%s]" % (seg.get("type"), "".join(
                ",%s=%s" % (k, v) for k, v in data.items())))
    return "".join(parts)


def _chat_key(chat: Any) -> str:
    if isinstance(chat, (tuple, list)) and len(chat) == 2:
        return "%s:%s" % (chat[0], chat[1])
    return str(chat)


class _Answer(Exception):
    def __init__(self, retcode, wording):
        super().__init__(retcode, wording)
        self.retcode = retcode
        self.wording = wording


class FakeOneBotServer(LocalServer):
    """A OneBot v11 implementation on 127.0.0.1 (see the module docstring).

    ``FakeOneBotServer(*, self_id=10001, access_token=None,
    chat_limit=RateLimit(1, per=1.0), global_limit=RateLimit(2, per=1.0),
    tolerance=0.1, limit_retcode=100, latency=0.0, seed=None, port=0,
    ws_port=0, control=False)``

    ``chat_limit``/``global_limit``: RateLimit, ``(count, per)`` or None;
    ``tolerance``: seconds shaved off each window for the time between a
    paced start and the arrival (the network, a busy event loop); a limit
    scaled down to milliseconds needs a smaller one.
    """

    server_name = "FakeOneBot/1"
    thread_name = "fake-onebot"
    control_actions = LocalServer.control_actions + (
        "push_group_message", "push_private_message", "http_url", "ws_url")

    def __init__(self, *, self_id: int = 10001, access_token: Optional[str] = None,
                 chat_limit: Any = RateLimit(1, per=1.0),
                 global_limit: Any = RateLimit(2, per=1.0), tolerance: float = 0.1,
                 limit_retcode: int = 100, latency: Any = 0.0, seed: Optional[int] = None,
                 port: int = 0, ws_port: int = 0, control: bool = False) -> None:
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not (
                0 <= tolerance < math.inf):
            raise ValueError("tolerance must be a non-negative number of seconds")
        if isinstance(self_id, bool) or not isinstance(self_id, int) or self_id <= 0:
            raise ValueError("self_id must be a positive int")
        self.self_id = self_id
        self.access_token = access_token
        self.chat_limit = as_limit("chat_limit", chat_limit)
        self.global_limit = as_limit("global_limit", global_limit)
        self.tolerance = float(tolerance)
        self.limit_retcode = int(limit_retcode)
        self._ws_port = ws_port
        self._ws_server: Any = None
        self._ws_thread: Optional[threading.Thread] = None
        super().__init__(latency=latency, seed=seed, port=port, control=control)

    def _reset_state(self) -> None:
        super()._reset_state()
        self._windows: Dict[str, _Window] = {}
        self._global_window = None
        self._inflight: collections.Counter = collections.Counter()
        self._ids = itertools.count(1)
        if not hasattr(self, "_clients"):
            self._clients: set = set()

    # -- life cycle ------------------------------------------------------------

    def start(self):
        """Serve the HTTP API and the forward WebSocket on two free ports."""
        try:
            from websockets.sync.server import serve
        except ImportError:  # pragma: no cover - depends on the installation
            raise ImportError("FakeOneBotServer needs websockets: pip install "
                              "'fastdispatch[onebot]'") from None
        super().start()
        try:
            self._ws_server = serve(self._ws_serve_client, self._host, self._ws_port,
                                    process_request=self._ws_handshake, compression=None,
                                    ping_interval=None, max_size=self.max_body)
        except BaseException:
            super().stop()
            raise
        self._ws_thread = threading.Thread(target=self._ws_server.serve_forever,
                                           name=self.thread_name + "-ws", daemon=True)
        self._ws_thread.start()
        return self

    def stop(self) -> None:
        """Stop both servers and close every connection.  Idempotent."""
        ws_server, self._ws_server = self._ws_server, None
        super().stop()  # sets _stopping: calls held forever end
        if ws_server is not None:
            ws_server.shutdown()
            self.drop_connections()
            if self._ws_thread is not None:
                self._ws_thread.join(5)

    @property
    def http_url(self) -> str:
        """The HTTP API's root: ``http://127.0.0.1:<port>``."""
        return self.base_url

    @property
    def ws_url(self) -> str:
        """The forward WebSocket: ``ws://127.0.0.1:<port>``."""
        if self._ws_server is None:
            raise RuntimeError("the server is not started")
        return "ws://%s:%d" % (self._host, self._ws_server.socket.getsockname()[1])

    # -- events --------------------------------------------------------------

    def _push(self, event):
        with self._lock:
            clients = list(self._clients)
            self._counts["events"] += 1
        frame = json.dumps(event, ensure_ascii=False)
        for ws in clients:
            try:
                ws.send(frame)
            except Exception:
                pass  # that connection is going; its reader ends it
        return len(clients)

    def _message_event(self, kind, user_id, text, group_id=None):
        with self._lock:
            message_id = next(self._ids)
        event = {"time": int(time.time()), "self_id": self.self_id, "post_type": "message",
                 "message_type": kind, "sub_type": "normal" if kind == "group" else "friend",
                 "message_id": message_id, "user_id": int(user_id),
                 "message": [{"type": "text", "data": {"text": str(text)}}],
                 "raw_message": str(text), "font": 0,
                 "sender": {"user_id": int(user_id), "nickname": "user%d" % int(user_id),
                            "sex": "unknown", "age": 0}}
        if group_id is not None:
            event["group_id"] = int(group_id)
            event["anonymous"] = None
            event["sender"].update(card="", role="member")
        return event

    def push_group_message(self, group_id: int, user_id: int, text: str) -> int:
        """Push a group message event to every forward WebSocket client;
        returns its ``message_id``."""
        event = self._message_event("group", user_id, text, group_id)
        self._push(event)
        return event["message_id"]

    def push_private_message(self, user_id: int, text: str) -> int:
        """Push a private message event; returns its ``message_id``."""
        event = self._message_event("private", user_id, text)
        self._push(event)
        return event["message_id"]

    def drop_connections(self) -> int:
        """Close every forward WebSocket connection (as an implementation
        that restarts does); returns how many were closed."""
        with self._lock:
            clients = list(self._clients)
        for ws in clients:
            try:
                ws.close()
            except Exception:
                pass
        return len(clients)

    def clients(self) -> int:
        """Forward WebSocket clients connected now."""
        with self._lock:
            return len(self._clients)

    # -- the record ---------------------------------------------------------------

    def messages(self, chat_id: Any) -> List[OneBotMessage]:
        """What arrived in one chat (``("group", gid)`` or ``("private",
        uid)``), in arrival order."""
        return super().messages(_chat_key(chat_id))

    def stats(self) -> Dict[str, int]:
        """LocalServer's counters and ``limit_refusals``, ``concurrent``
        (sends that arrived while one of the same chat was in flight),
        ``events`` (pushed), ``ws_connections``."""
        counts = super().stats()
        for name in ("limit_refusals", "concurrent", "events", "ws_connections"):
            counts.setdefault(name, 0)
        return counts

    def inject(self, fault: str, count: int = 1, *, action: Optional[str] = None,
               chat: Any = None, retcode: int = 100, seconds: float = 0.0,
               wording: str = "risk control: sending is restricted") -> None:
        """The next ``count`` calls of ``action`` (None: any) for ``chat``
        (None: any) meet ``fault``: ``"error"`` (``retcode`` with
        ``wording``), ``"delay"`` (answered ``seconds`` late), ``"drop"``
        (never done nor answered) or ``"drop_after"`` (done, never
        answered)."""
        if fault not in ("error", "delay", "drop", "drop_after"):
            raise ValueError('fault must be "error", "delay", "drop" or "drop_after", got %r'
                             % (fault,))
        self._plan_fault(fault, count, action, None if chat is None else _chat_key(chat),
                         retcode=retcode, seconds=seconds, wording=wording)

    def _fault_options(self, **options):
        checked = super()._fault_options(**options)
        checked["retcode"] = int(options.get("retcode", 100))
        checked["wording"] = str(options.get("wording", ""))
        return checked

    # -- calls -------------------------------------------------------------------

    def _over_limit_locked(self, key, now):
        if self.global_limit is not None:
            if self._global_window is None:
                self._global_window = _Window(self.global_limit, self.tolerance)
            if self._global_window.wait_needed(now) > 0:
                return "bot-wide"
        if self.chat_limit is not None:
            window = self._windows.get(key)
            if window is None:
                window = self._windows[key] = _Window(self.chat_limit, self.tolerance)
            if window.wait_needed(now) > 0:
                return "per chat"
        return None

    def _process(self, action, params, transport):
        """Do one call on arrival.  Returns ``(answer or None, hold, key)``:
        the answer (None: never answered), seconds to hold it, and the chat
        it keeps in flight until it is written (or None)."""
        from ..onebot._sender import chat_of  # the same reading as the sender's
        chat = chat_of(action, params) if action in _SEND_ACTIONS else None
        key = None if chat is None else _chat_key(chat)
        fault, options = self._pick_fault(action, key)
        if fault == "drop":
            return None, 0.0, None
        if fault == "error":
            return _failed(options["retcode"], options["wording"]), 0.0, None
        hold = options["seconds"] if fault == "delay" else 0.0
        try:
            data = self._do(action, params, chat, key, transport)
        except _Answer as exc:
            return _failed(exc.retcode, exc.wording), hold, None
        if fault == "drop_after":
            with self._lock:
                if key is not None:
                    self._inflight[key] -= 1
            return None, 0.0, None
        return {"status": "ok", "retcode": 0, "data": data, "message": "", "wording": ""}, \
            hold, key

    def _do(self, action, params, chat, key, transport):
        if action in _SEND_ACTIONS:
            if chat is None:
                raise _Answer(1400, "no group_id or user_id")
            text = message_text(params.get("message", params.get("messages")))
            now = time.monotonic()
            with self._lock:
                over = self._over_limit_locked(key, now)
                if over is not None:
                    self._counts["limit_refusals"] += 1
                else:
                    if self._inflight[key] > 0:
                        self._counts["concurrent"] += 1
                    self._inflight[key] += 1
                    if self.global_limit is not None:
                        self._global_window.times.append(now)
                    if self.chat_limit is not None:
                        self._windows[key].times.append(now)
                    message_id = next(self._ids)
                    self._record.add(key, OneBotMessage(chat, text, action, message_id, now,
                                                        transport))
            if over is not None:
                raise _Answer(self.limit_retcode, "risk control: sent too fast (%s limit)"
                              % over)
            return {"message_id": message_id}
        if action == "get_login_info":
            return {"user_id": self.self_id, "nickname": "fastdispatch-fake"}
        if action == "get_status":
            return {"online": True, "good": True}
        if action == "get_version_info":
            return {"app_name": "FakeOneBot", "app_version": "1", "protocol_version": "v11"}
        if action == "delete_msg":
            return None
        raise _Answer(1404, "no such action: %s" % (action,))

    def _answered(self, key):
        if key is not None:
            with self._lock:
                self._inflight[key] -= 1

    # -- HTTP ------------------------------------------------------------------

    def _authorized(self, headers, query):
        """None if the call may go, else the HTTP status to refuse it with."""
        if not self.access_token:
            return None
        given = headers.get("Authorization") or ""
        if given.startswith(("Bearer ", "Token ")):
            given = given.split(" ", 1)[1]
        elif "access_token=" in query:
            given = dict(p.partition("=")[::2] for p in query.split("&")).get("access_token", "")
        if not given:
            return 401
        return None if given == self.access_token else 403

    def _handle_request(self, handler, request):
        action = request.path.strip("/")
        status = self._authorized(request.headers, request.query)
        if status is not None:
            return self._reply(handler, status, b"")
        try:
            params = parse_params(request.query, request.headers.get("Content-Type", ""),
                                  request.body)
        except BadParams as exc:
            return self._reply(handler, 200, json.dumps(_failed(1400, str(exc))).encode())
        params.pop("access_token", None)
        answer, hold, key = self._process(action, params, "http")
        if answer is None:
            with self._lock:
                while not self._stopping:
                    self._changed.wait(1.0)
            return self._drop(handler)
        self._sleep(hold)
        self._hold_answer()
        self._answered(key)
        if answer.get("retcode") == 1404:
            return self._reply(handler, 404, json.dumps(answer).encode())
        self._reply(handler, 200, json.dumps(answer, ensure_ascii=False).encode())

    # -- the forward WebSocket ----------------------------------------------------

    def _ws_handshake(self, connection, request):
        status = self._authorized(request.headers, request.path.partition("?")[2])
        if status is not None:
            return connection.respond(status, "unauthorized\n")
        return None

    def _ws_serve_client(self, ws):
        with self._lock:
            self._clients.add(ws)
            self._counts["ws_connections"] += 1
        try:
            ws.send(json.dumps({"time": int(time.time()), "self_id": self.self_id,
                                "post_type": "meta_event", "meta_event_type": "lifecycle",
                                "sub_type": "connect"}))
            for frame in ws:
                try:
                    call = json.loads(frame)
                except ValueError:
                    continue
                if not isinstance(call, dict):
                    continue
                action = call.get("action")
                params = call.get("params") if isinstance(call.get("params"), dict) else {}
                if not isinstance(action, str):
                    continue
                answer, hold, key = self._process(action, params, "websocket")
                if answer is None:
                    continue
                if "echo" in call:
                    answer["echo"] = call["echo"]
                hold += self._latency if not isinstance(self._latency, tuple) else \
                    self._latency[1]
                if hold > 0:
                    timer = threading.Timer(hold, self._ws_answer, (ws, answer, key))
                    timer.daemon = True
                    timer.start()
                else:
                    self._ws_answer(ws, answer, key)
        except Exception:
            pass  # the client went away
        finally:
            with self._lock:
                self._clients.discard(ws)

    def _ws_answer(self, ws, answer, key):
        self._answered(key)
        try:
            ws.send(json.dumps(answer, ensure_ascii=False))
        except Exception:
            pass


def _failed(retcode, wording):
    return {"status": "failed", "retcode": retcode, "data": None, "message": wording,
            "wording": wording}
