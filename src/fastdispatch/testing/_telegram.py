"""``fastdispatch.testing``: a local Telegram Bot API server for tests.

:class:`FakeTelegramServer` is a real HTTP/1.1 server (keep-alive, one
thread per connection; the machinery is :class:`~._server.LocalServer`) on
127.0.0.1, on a port the OS picks.  It speaks the part of the Bot API a bot
that sends text uses, answers as Telegram does (the objects carry the fields
the Bot API marks required; errors have Telegram's descriptions and
``parameters``), enforces Telegram's rate limits (per chat, per group,
bot-wide; any sizes, so tests can scale them down) with real ``429``
answers, injects faults on demand (latency, ``5xx``, dropped connections,
garbage, answers cut off mid-body), queues updates for ``getUpdates`` long
polling or delivers them to a webhook (after ``setWebhook``: POSTed with the
secret header, again after a non-2xx or a timeout, in order per chat; see
``_webhooks.py``), migrates a group to a supergroup on demand, and records,
per chat, every message that arrived and when, and how many requests
naming each chat it was handling at once (``max_in_flight``: a client that
sends one chat's requests one at a time never shows more than 1).

It is a product, not a fixture: a bot's own test suite can use it the way
this project's tests and ``python -m fastdispatch demo`` do, with
fastdispatch or with python-telegram-bot, aiogram or pyTelegramBotAPI
(``tests/test_fake_server_clients.py`` runs all three against it)::

    from fastdispatch.testing import FakeTelegramServer
    from fastdispatch.telegram import TelegramSender

    with FakeTelegramServer() as server:
        sender = TelegramSender("123:abc", base_url=server.base_url)
        ...                                   # run the bot against it
        assert [m.text for m in server.messages("42")] == ["hello", "bye"]

``python -m fastdispatch.testing`` runs one from the command line, with the
control endpoint on (push updates, inject faults, read the record over
HTTP), for a bot written in any language.

What it emulates and what it does not is a table in ``docs/telegram.md``.
The main simplifications: any chat id is a chat (no "chat not found"), text
only (no files, media, keyboards' effects, ``parse_mode`` rendering), no
inline mode, payments or channels' own rules.

Chats are typed by their id, as Telegram's are: positive ids are private
chats, ids from ``-1000000000000`` down are supergroups, other negative ids
basic groups (the kind that can migrate), ``@username`` a channel.

Threads and locks: ``_lock`` (from the base) guards every piece of mutable
state set in :meth:`FakeTelegramServer._reset_state` (the record, the stored
messages, the limit windows, the fault plan, the counters, the update queue,
the migrations); ``_changed`` (alias ``_updates_changed``) is a Condition on
it that long polls wait on.  Sleeping happens outside the lock.
"""

import collections
import itertools
import json
import math
import threading
import time
from typing import Any, Dict, List, NamedTuple, Optional
from urllib.parse import urlsplit

from ..pacing import RateLimit
from ._server import BadParams, LocalServer, as_limit as _as_limit, parse_params
from ._webhooks import WebhookDelivery

__all__ = ["FakeTelegramServer", "SentMessage", "telegram_limits"]


def telegram_limits(speedup: float = 1.0) -> Dict[str, RateLimit]:
    """Telegram's limits as keyword arguments, every window divided by
    ``speedup``: ``chat_limit`` 1 per 1 s, ``group_limit`` 20 per 60 s,
    ``global_limit`` 30 per 1 s (at ``speedup=20``: 1 per 50 ms, 20 per 3 s,
    30 per 50 ms).  ``FakeTelegramServer(**telegram_limits(20))``."""
    if isinstance(speedup, bool) or not isinstance(speedup, (int, float)) or not (
            0 < speedup < math.inf):
        raise ValueError("speedup must be a positive finite number, got %r" % (speedup,))
    return {
        "chat_limit": RateLimit(1, per=1.0 / speedup),
        "group_limit": RateLimit(20, per=60.0 / speedup),
        "global_limit": RateLimit(30, per=1.0 / speedup),
    }


class SentMessage(NamedTuple):
    """One message as it arrived at the server (``at``: ``time.monotonic()``)."""

    chat_id: str
    message_id: int
    text: str
    at: float


class _Window:
    """Sliding-window counter: at most ``count`` accepted in any ``per`` s."""

    __slots__ = ("count", "per", "times")

    def __init__(self, limit, tolerance):
        self.count = limit.count
        self.per = max(0.0, limit.per - tolerance)
        self.times = collections.deque()

    def wait_needed(self, now):
        times = self.times
        while times and now - times[0] >= self.per:
            times.popleft()
        if len(times) < self.count:
            return 0.0
        return times[0] + self.per - now


class _Answer(Exception):
    """Raised inside a method to answer ``ok: false``."""

    def __init__(self, status, description, parameters=None):
        super().__init__(status, description)
        self.status = status
        self.description = description
        self.parameters = parameters


_SUPERGROUP_BELOW = -1000000000000  # supergroup and channel ids: -100 then the channel's id


def chat_type(key: str) -> str:
    """The type of the chat with this id, by Telegram's numbering."""
    if key.startswith("@"):
        return "channel"
    chat_id = int(key)
    if chat_id > 0:
        return "private"
    return "supergroup" if chat_id <= _SUPERGROUP_BELOW else "group"


def _chat_key_of(chat_id):
    """A chat id as the record keys it (``"42"``, ``"-100123"``, ``"@name"``)."""
    key = str(chat_id).strip()
    if key.lstrip("-").isdigit():
        return str(int(key))
    return key


def _is_group(key):
    return key[:1] == "-"


def _chat_id_value(key):
    return int(key) if key.lstrip("-").isdigit() else key


def _chat_json(key):
    """The ``Chat`` object for a chat key (required: ``id``, ``type``)."""
    kind = chat_type(key)
    if kind == "channel":
        return {"id": _SUPERGROUP_BELOW - (sum(map(ord, key)) * 7919) % 10 ** 9,
                "type": "channel", "title": key[1:], "username": key[1:]}
    chat_id = int(key)
    if kind == "private":
        return {"id": chat_id, "type": "private", "first_name": "User %d" % chat_id}
    return {"id": chat_id, "type": kind, "title": "Group %d" % chat_id}


def _int_param(params, name, default=None, required=False):
    value = params.get(name)
    if value is None or value == "":
        if required:
            raise _Answer(400, "Bad Request: %s is empty" % name)
        return default
    if isinstance(value, bool):
        raise _Answer(400, "Bad Request: invalid %s" % name)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _Answer(400, "Bad Request: invalid %s" % name) from None


def _bool_param(params, name):
    value = params.get(name)
    return value is True or str(value).lower() in ("true", "1")


def _json_param(params, name):
    """An object parameter: a JSON value, or a JSON text (form and multipart
    bodies carry objects as JSON text)."""
    value = params.get(name)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _text_param(params):
    text = params.get("text")
    if not isinstance(text, str) or not text.strip():
        raise _Answer(400, "Bad Request: message text is empty")
    if len(text) > 4096:
        raise _Answer(400, "Bad Request: message is too long")
    return text


class _Stored:
    """A message that exists in a chat (the bot's own or an incoming one)."""

    __slots__ = ("message", "outgoing")

    def __init__(self, message, outgoing):
        self.message = message  # the Message object as the API shows it
        self.outgoing = outgoing  # sent by the bot


#: What ``getChatAdministrators`` shows of an administrator's rights: every
#: field the Bot API marks required on ``ChatMemberAdministrator``.
_ADMIN_RIGHTS = {
    "can_be_edited": False, "is_anonymous": False, "can_manage_chat": True,
    "can_delete_messages": True, "can_manage_video_chats": True,
    "can_restrict_members": True, "can_promote_members": False, "can_change_info": True,
    "can_invite_users": True, "can_post_stories": False, "can_edit_stories": False,
    "can_delete_stories": False, "can_send_welcome_messages": False,
    "can_pin_messages": True, "can_manage_topics": False,
}

_CHAT_ACTIONS = frozenset((
    "typing", "upload_photo", "record_video", "upload_video", "record_voice", "upload_voice",
    "upload_document", "choose_sticker", "find_location", "record_video_note",
    "upload_video_note"))


class FakeTelegramServer(LocalServer):
    """A local Bot API server: limits, faults, updates and a record per chat.

    ``FakeTelegramServer(token=None, *, chat_limit=None, group_limit=None,
    global_limit=None, tolerance=0.0, exact_retry_after=False, latency=0.0,
    arrival_jitter=0.0, seed=None, max_body=1 MiB, bot_is_admin=True,
    control=False)``

    - ``token``: the only bot token accepted (``401 Unauthorized`` for any
      other); None accepts every token of the form ``<digits>:<secret>``.
      The bot's user id (``getMe``, ``from`` of its messages) is the
      token's numeric part, as with Telegram.
    - ``chat_limit``, ``group_limit``, ``global_limit``: a
      :class:`~fastdispatch.RateLimit` (or ``(count, per)``) or None (no
      limit).  ``sendMessage`` to a group (a negative chat id) counts
      against ``group_limit`` (``chat_limit`` when there is none), to any
      other chat against ``chat_limit``; every accepted ``sendMessage``
      counts against ``global_limit``.  Over a limit, the answer is ``429``
      with ``parameters.retry_after``.  Refused sends do not count.
      :func:`telegram_limits` gives Telegram's, scaled.
    - ``exact_retry_after``: by default ``retry_after`` is what the Bot API
      documents, an Integer: the seconds until the window has room, rounded
      up to a whole second (so a 50 ms window answers 1).  True answers
      the exact remaining time, rounded up to the millisecond, as a float:
      for limits scaled down to milliseconds, where a whole second would
      dwarf the window.  Clients that read the field as Telegram types it
      (aiogram) reject a float, so use it only with clients that accept one
      (fastdispatch's ``TelegramSender`` does).
    - ``tolerance``: seconds shaved off every window, for the jitter between
      a client starting a request and the server seeing it (with
      millisecond windows that jitter is a real fraction of the window).
    - ``latency``: seconds every answer is held back (or ``(low, high)``:
      uniform random), like a network round trip; settable later.  A
      request is processed (and a message recorded) when it arrives; the
      latency delays the answer.
    - ``arrival_jitter``: seconds every request is held *before* it is
      processed and recorded (or ``(low, high)``: uniform random), like
      network paths of different lengths: requests a client sent at once
      are recorded in a shuffled order, so a test sees whether its client
      kept them apart.  Settable later.
    - ``seed``: for the random latency and jitter and the random fault rates.
    - ``bot_is_admin``: the bot is an administrator of every group (it may
      delete other users' messages there, and ``getChatAdministrators``
      lists it); False: it is a plain member.
    - ``control``: serve ``/control/<action>`` (see
      :data:`control_actions` and ``docs/telegram.md``).

    The server is started by :meth:`start` or ``with``; :attr:`base_url` is
    what ``TelegramSender(base_url=...)`` takes.  Costs: the record keeps
    every message (a few hundred bytes each); call :meth:`reset` between
    phases of a long test.
    """

    server_name = "FakeTelegram/2"
    thread_name = "fake-telegram"
    default_fault_method = "sendMessage"
    control_actions = LocalServer.control_actions + (
        "push_update", "push_message", "update", "pending_updates", "migrate_chat",
        "set_chat_administrators", "deleted", "chat_actions", "restrictions", "edits",
        "migrations", "max_in_flight")

    def __init__(self, token: Optional[str] = None, *, chat_limit: Any = None,
                 group_limit: Any = None, global_limit: Any = None, tolerance: float = 0.0,
                 exact_retry_after: bool = False, latency: Any = 0.0,
                 arrival_jitter: Any = 0.0,
                 seed: Optional[int] = None, max_body: int = 1 << 20,
                 bot_is_admin: bool = True, control: bool = False,
                 host: str = "127.0.0.1", port: int = 0, **server_options: Any) -> None:
        if token is not None and not isinstance(token, str):
            raise TypeError("token must be a str or None")
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not (
                0 <= tolerance < math.inf):
            raise ValueError("tolerance must be a non-negative number of seconds")
        self.token = token
        self.chat_limit = _as_limit("chat_limit", chat_limit)
        self.group_limit = _as_limit("group_limit", group_limit)
        self.global_limit = _as_limit("global_limit", global_limit)
        self.tolerance = float(tolerance)
        self.exact_retry_after = bool(exact_retry_after)
        self.bot_is_admin = bool(bot_is_admin)
        # .bot: the User of the bot making this request; .busy_chat: the chat
        # key this connection thread's request counts in _busy until answered
        self._tls = threading.local()
        self.webhooks = WebhookDelivery(self)  # POSTs updates once setWebhook is called
        super().__init__(latency=latency, seed=seed, max_body=max_body, host=host,
                         port=port, control=control, arrival_jitter=arrival_jitter,
                         **server_options)
        self._updates_changed = self._changed  # long polls wait on it
        self._poll_generation = 0

    def start(self) -> "FakeTelegramServer":
        super().start()
        self.webhooks.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self.webhooks.stop()
        super().stop()

    def _reset_state(self):
        # Called with _lock held (or before the server runs).
        super()._reset_state()
        self._next_message_id = collections.defaultdict(int)  # chat key -> last id
        self._stored: Dict[str, Dict[int, _Stored]] = collections.defaultdict(dict)
        self._windows = {}
        self._global_window = None
        self._updates = collections.deque()
        self._pushed: Dict[int, Dict[str, Any]] = {}  # update_id -> update, as queued
        self._update_ids = itertools.count(1000)
        self._deleted = []
        self._actions = []
        self._restrictions = []
        self._edits = []
        self._admins = {}
        self._migrated: Dict[str, int] = {}  # old group key -> supergroup id
        self._migrate_after: Dict[str, tuple] = {}  # key -> (messages left, new id)
        self._webhook = None
        self._webhook_options: Dict[str, Any] = {}
        self._busy: Dict[str, int] = collections.Counter()  # chat key -> requests being handled
        self._peaks: Dict[str, int] = {}  # chat key -> most of them at once
        self.webhooks.forget()

    # -- faults ------------------------------------------------------------

    def inject(self, fault: str, count: int = 1, *, method: Optional[str] = "sendMessage",
               status: int = 500, retry_after: float = 1.0, seconds: float = 0.0,
               html: Optional[bool] = None, chat_id: Any = None) -> None:
        """Answer the next ``count`` calls of ``method`` (None: any method)
        with a fault, in order, before the random rates are consulted.
        ``chat_id``: only calls naming that chat (e.g. a 429 for one chat
        while the others go on); None: any call.  The faults:

        - ``"error"``: HTTP ``status`` (default 500) with Telegram's JSON
          error (``{"ok": false, "error_code": 502, "description": "Bad
          Gateway"}``), nothing recorded; ``html=True`` sends a proxy's HTML
          page instead (the default for 502/503/504 is JSON unless
          ``html``);
        - ``"too_many"``: 429 with ``parameters.retry_after`` (whole seconds,
          rounded up, unless ``exact_retry_after``), nothing recorded;
        - ``"drop"``: the connection is closed before the call is processed;
        - ``"drop_after"``: the call is processed (the message IS recorded),
          then the connection is closed without an answer;
        - ``"garbage"``: processed, then ``200`` with a body that is not JSON;
        - ``"truncate"``: processed, then an answer cut off mid-body;
        - ``"delay"``: held ``seconds`` before it is processed normally.
        """
        target = None if chat_id is None else _chat_key_of(chat_id)
        self._plan_fault(fault, count, method, target, status=status,
                         retry_after=retry_after, seconds=seconds, html=html)

    def set_fault_rates(self, *, method: Optional[str] = "sendMessage", error: float = 0.0,
                        too_many: float = 0.0, drop: float = 0.0, drop_after: float = 0.0,
                        status: int = 500, retry_after: float = 1.0) -> None:
        """Random faults: each call of ``method`` (None: any) independently
        gets a 5xx with probability ``error``, a 429 with ``too_many``, a
        dropped connection with ``drop`` (nothing recorded) or
        ``drop_after`` (recorded, then dropped).  All zero: none."""
        self._plan_rates(method, {"error": error, "too_many": too_many, "drop": drop,
                                  "drop_after": drop_after},
                         status=status, retry_after=retry_after)

    def _fault_options(self, **options):
        checked = super()._fault_options(**options)
        seconds = checked["retry_after"]
        if not 0 <= seconds < math.inf:
            raise ValueError("retry_after must be a finite number of seconds >= 0")
        checked["html"] = options.get("html")
        return checked

    def _retry_after(self, seconds):
        """The ``retry_after`` field for a wait of ``seconds``."""
        if self.exact_retry_after:
            return math.ceil(seconds * 1000) / 1000.0
        return int(math.ceil(seconds))

    def _too_many(self, seconds):
        value = self._retry_after(seconds)
        return _Answer(429, "Too Many Requests: retry after %s" % value,
                       {"retry_after": value})

    # -- updates -----------------------------------------------------------

    def push_update(self, update: Dict[str, Any]) -> int:
        """Queue a raw update for ``getUpdates``; returns its ``update_id``
        (assigned here, increasing)."""
        if not isinstance(update, dict):
            raise TypeError("update must be a dict")
        with self._lock:
            return self._push_update_locked(update)

    def _push_update_locked(self, update):
        update = dict(update, update_id=next(self._update_ids))
        self._updates.append(update)
        self._pushed[update["update_id"]] = update
        self._changed.notify_all()
        return update["update_id"]

    def update(self, update_id: int) -> Optional[Dict[str, Any]]:
        """The update queued with this id (until :meth:`reset`), or None."""
        with self._lock:
            update = self._pushed.get(int(update_id))
            return None if update is None else json.loads(json.dumps(update))

    def push_message(self, chat_id: Any, text: str, *, user_id: Any = None,
                     first_name: str = "Test", username: Optional[str] = None,
                     chat_title: Optional[str] = None) -> int:
        """Queue a text-message update from a user in a chat (by its id: a
        positive one is a private chat with that user); returns its
        ``update_id``.  The message exists in the chat from now on (the bot
        may delete it); its id is ``server.update(update_id)["message"]
        ["message_id"]``."""
        chat_id = int(chat_id)
        key = str(chat_id)
        user_id = int(chat_id if user_id is None and chat_id > 0 else (user_id or 1))
        user = {"id": user_id, "is_bot": False, "first_name": first_name}
        if username:
            user["username"] = username
        chat = _chat_json(key)
        if chat_id < 0:
            chat["title"] = chat_title or chat["title"]
        else:
            chat["first_name"] = first_name
            if username:
                chat["username"] = username
        with self._lock:
            self._check_not_migrated_locked(key, ValueError)
            self._next_message_id[key] += 1
            message = {"message_id": self._next_message_id[key], "from": user, "chat": chat,
                       "date": int(time.time()), "text": text}
            self._stored[key][message["message_id"]] = _Stored(message, outgoing=False)
            return self._push_update_locked({"message": message})

    def pending_updates(self) -> int:
        """Updates queued and not yet confirmed by a ``getUpdates`` offset."""
        with self._lock:
            return len(self._updates)

    # -- groups that become supergroups ----------------------------------------

    def migrate_chat(self, chat_id: Any, new_chat_id: Any = None, *, after: int = 0) -> int:
        """Upgrade the basic group ``chat_id`` to a supergroup, as Telegram
        does when a group grows or gets a public link; returns the
        supergroup's id (default: ``-100`` followed by the group's id on ten
        digits).  ``after=N``: not now, but right after the next ``N``
        messages sent to the group have been accepted (so a test can migrate
        mid-stream).

        From then on every call naming the old id answers ``400 Bad
        Request: group chat was upgraded to a supergroup chat`` with
        ``parameters.migrate_to_chat_id``, and the two service messages
        Telegram sends (``migrate_to_chat_id`` in the old chat,
        ``migrate_from_chat_id`` in the new) are queued as updates."""
        key = str(int(chat_id))
        if chat_type(key) != "group":
            raise ValueError("chat %s is not a basic group (ids from -1 to -999999999999); "
                             "only those migrate" % key)
        if new_chat_id is None:
            new = int("-100" + key[1:].rjust(10, "0"))
        else:
            new = int(new_chat_id)
        if chat_type(str(new)) != "supergroup":
            raise ValueError("new_chat_id must be a supergroup id (-1000000000000 or below)")
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ValueError("after must be a non-negative int")
        with self._lock:
            self._check_not_migrated_locked(key, ValueError)
            if after:
                self._migrate_after[key] = (after, new)
            else:
                self._migrate_locked(key, new)
        return new

    def migrations(self) -> Dict[str, str]:
        """Every group migrated so far: ``old id -> supergroup id`` (strings)."""
        with self._lock:
            return {old: str(new) for old, new in self._migrated.items()}

    def _migrate_locked(self, key, new):
        self._migrate_after.pop(key, None)
        self._migrated[key] = new
        now = int(time.time())
        owner = {"id": 1, "is_bot": False, "first_name": "Owner"}
        self._next_message_id[key] += 1
        self._push_update_locked({"message": {
            "message_id": self._next_message_id[key], "from": owner, "chat": _chat_json(key),
            "date": now, "migrate_to_chat_id": new}})
        new_key = str(new)
        self._next_message_id[new_key] += 1
        self._push_update_locked({"message": {
            "message_id": self._next_message_id[new_key], "from": owner,
            "sender_chat": _chat_json(new_key), "chat": _chat_json(new_key), "date": now,
            "migrate_from_chat_id": int(key)}})

    def _check_not_migrated_locked(self, key, error=_Answer):
        new = self._migrated.get(key)
        if new is None:
            return
        if error is _Answer:
            raise _Answer(400, "Bad Request: group chat was upgraded to a supergroup chat",
                          {"migrate_to_chat_id": new})
        raise error("chat %s was migrated to the supergroup %d" % (key, new))

    # -- the record --------------------------------------------------------

    @property
    def deleted(self) -> List[tuple]:
        """``(chat_id, message_id)`` of each successful ``deleteMessage``."""
        with self._lock:
            return list(self._deleted)

    @property
    def chat_actions(self) -> List[tuple]:
        """``(chat_id, action)`` of each ``sendChatAction``."""
        with self._lock:
            return list(self._actions)

    @property
    def restrictions(self) -> List[tuple]:
        """``(chat_id, user_id, until_date, permissions)`` of each
        ``restrictChatMember``."""
        with self._lock:
            return list(self._restrictions)

    @property
    def edits(self) -> List[tuple]:
        """``(chat_id, message_id, text)`` of each successful ``editMessageText``."""
        with self._lock:
            return list(self._edits)

    def set_chat_administrators(self, chat_id: Any, users: List[Dict[str, Any]]) -> None:
        """The group's human administrators for ``getChatAdministrators``:
        Telegram ``User`` dicts, the first one the creator (default: one
        creator, user id 1).  The bot is listed after them when
        ``bot_is_admin``."""
        users = [dict(u) for u in users]
        for user in users:
            if not isinstance(user.get("id"), int) or not isinstance(
                    user.get("first_name"), str):
                raise ValueError("each user needs an int id and a str first_name")
            user.setdefault("is_bot", False)
        with self._lock:
            self._admins[str(chat_id)] = users

    def max_in_flight(self) -> Dict[str, int]:
        """Per chat (its key, a string), the most requests naming it that
        the server was handling at once, from the moment one was read to the
        moment its answer (or dropped connection) went out, whatever the
        method or the outcome.  A client that sends a chat's requests one at
        a time shows 1 for every chat."""
        with self._lock:
            return dict(self._peaks)

    def stats(self) -> Dict[str, int]:
        """Counters: ``requests``, ``connections`` (opened), ``sent`` (messages
        recorded), ``too_many`` (429s for limits; by limit: ``too_many_chat``,
        ``too_many_group``, ``too_many_global``), ``injected_<fault>``,
        ``status_<n>``."""
        return super().stats()

    def reset(self) -> None:
        """Forget the record, the stored messages, the limit windows, the
        faults, the counters, the migrations, the in-flight peaks and the
        update queue (the server keeps running)."""
        super().reset()

    # -- request handling --------------------------------------------------

    def _error_body(self, status, description, parameters=None):
        data = {"ok": False, "error_code": status, "description": description}
        if parameters:
            data["parameters"] = parameters
        return status, json.dumps(data).encode()

    def _answer(self, handler, answer):
        status, body = self._error_body(answer.status, answer.description, answer.parameters)
        return self._reply(handler, status, body)

    def _bot(self):
        """The ``User`` of the bot whose token made the current request."""
        return self._tls.bot

    def _handle_request(self, handler, request):
        parts = request.path.split("/")
        if len(parts) != 3 or parts[0] != "" or not parts[1].startswith("bot"):
            return self._answer(handler, _Answer(404, "Not Found"))
        token, method = parts[1][3:], parts[2]
        bot_id, colon, secret = token.partition(":")
        if (self.token is not None and token != self.token) or not (
                colon and bot_id.isdigit() and secret and len(bot_id) < 16):
            return self._answer(handler, _Answer(401, "Unauthorized"))
        call = _METHODS.get(method.lower())
        if call is None:
            return self._answer(handler, _Answer(404, "Not Found"))
        method = call.__name__[1:]
        try:
            params = parse_params(request.query, request.headers.get("Content-Type"),
                                  request.body)
        except BadParams as exc:
            return self._answer(handler, _Answer(400, "Bad Request: %s" % exc))
        chat = params.get("chat_id")
        busy = None if chat is None or chat == "" or isinstance(chat, bool) else (
            _chat_key_of(chat))
        if busy is None:
            return self._handle_call(handler, method, call, bot_id, params, None)
        with self._lock:
            self._busy[busy] += 1
            if self._busy[busy] > self._peaks.get(busy, 0):
                self._peaks[busy] = self._busy[busy]
        self._tls.busy_chat = busy
        try:
            return self._handle_call(handler, method, call, bot_id, params, busy)
        finally:
            self._not_busy()  # if no answer went out (an exception)

    def _not_busy(self):
        # The request of this connection thread is answered: it no longer
        # counts for its chat.  Called before the answer is written, since
        # a client may send the chat's next request the moment it reads it.
        busy = getattr(self._tls, "busy_chat", None)
        if busy is not None:
            self._tls.busy_chat = None
            with self._lock:
                self._busy[busy] -= 1

    def _reply(self, handler, *args, **kwargs):
        self._not_busy()
        return super()._reply(handler, *args, **kwargs)

    def _drop(self, handler):
        self._not_busy()
        return super()._drop(handler)

    def _handle_call(self, handler, method, call, bot_id, params, target):
        self._hold_arrival()
        fault, options = self._pick_fault(method, target)
        if fault == "delay":
            time.sleep(options["seconds"])
        if fault == "drop":
            return self._drop(handler)
        if fault == "error":
            status = options["status"]
            if options.get("html"):
                return self._reply(handler, status,
                                   b"<html><body><h1>%d</h1></body></html>" % status,
                                   b"text/html")
            phrase = handler.responses.get(status, ("Internal Server Error",))[0]
            return self._answer(handler, _Answer(status, phrase))
        if fault == "too_many":
            with self._lock:
                answer = self._too_many(options["retry_after"])
            return self._answer(handler, answer)
        self._tls.bot = {"id": int(bot_id), "is_bot": True, "first_name": "Fake Bot",
                         "username": "fake_%s_bot" % bot_id}
        try:
            result = call(self, params)
        except _Answer as answer:
            return self._answer(handler, answer)
        finally:
            self._tls.bot = None
        # The latency is the answer's way back: what arrived is recorded at
        # once, so the record's times are when requests reached the server.
        self._hold_answer()
        if fault == "drop_after":
            return self._drop(handler)
        if fault == "garbage":
            return self._reply(handler, 200, b"<<not json>>", b"text/plain")
        payload = json.dumps({"ok": True, "result": result}, separators=(",", ":")).encode()
        if fault == "truncate":
            return self._truncate(handler, 200, payload)
        return self._reply(handler, 200, payload)

    def _chat(self, params):
        """The chat a call names (its key), checked as Telegram checks it."""
        chat_id = params.get("chat_id")
        if chat_id is None or chat_id == "":
            raise _Answer(400, "Bad Request: chat_id is empty")
        if isinstance(chat_id, bool) or not isinstance(chat_id, (int, str)):
            raise _Answer(400, "Bad Request: chat not found")
        key = str(chat_id)
        if key.lstrip("-").isdigit():
            key = str(int(key))
        elif not (key.startswith("@") and len(key) > 1):
            raise _Answer(400, "Bad Request: chat not found")
        with self._lock:
            self._check_not_migrated_locked(key)
        return key

    # -- Bot API methods (called outside the lock, except where they take it) --

    def _getMe(self, params):
        return dict(self._bot(), can_join_groups=True, can_read_all_group_messages=False,
                    supports_inline_queries=False, can_connect_to_business=False,
                    has_main_web_app=False)

    def _sendMessage(self, params):
        key = self._chat(params)
        text = _text_param(params)
        now = time.monotonic()
        with self._lock:
            self._check_not_migrated_locked(key)
            wait = 0.0
            if self.global_limit is not None:
                if self._global_window is None:
                    self._global_window = _Window(self.global_limit, self.tolerance)
                wait = self._global_window.wait_needed(now)
                if wait > 0:
                    self._counts["too_many_global"] += 1
            group = _is_group(key) and self.group_limit is not None
            limit = self.group_limit if group else self.chat_limit
            window = None
            if limit is not None:
                window = self._windows.get(key)
                if window is None:
                    window = self._windows[key] = _Window(limit, self.tolerance)
                chat_wait = window.wait_needed(now)
                if chat_wait > 0:
                    self._counts["too_many_group" if group else "too_many_chat"] += 1
                    wait = max(wait, chat_wait)
            if wait > 0:
                self._counts["too_many"] += 1
                raise self._too_many(wait)
            if window is not None:
                window.times.append(now)
            if self._global_window is not None:
                self._global_window.times.append(now)
            self._next_message_id[key] += 1
            message_id = self._next_message_id[key]
            self._record.add(key, SentMessage(key, message_id, text, now))
            message = {"message_id": message_id, "from": self._bot(), "chat": _chat_json(key),
                       "date": int(time.time()), "text": text}
            self._stored[key][message_id] = _Stored(message, outgoing=True)
            planned = self._migrate_after.get(key)
            if planned is not None:
                left, new = planned
                if left <= 1:
                    self._migrate_locked(key, new)
                else:
                    self._migrate_after[key] = (left - 1, new)
            return dict(message)

    def _editMessageText(self, params):
        if params.get("inline_message_id") not in (None, ""):
            raise _Answer(400, "Bad Request: MESSAGE_ID_INVALID")
        key = self._chat(params)
        message_id = _int_param(params, "message_id", required=True)
        text = _text_param(params)
        with self._lock:
            stored = self._stored.get(key, {}).get(message_id)
            if stored is None:
                raise _Answer(400, "Bad Request: message to edit not found")
            if not stored.outgoing or "text" not in stored.message:
                raise _Answer(400, "Bad Request: message can't be edited")
            if stored.message["text"] == text:
                raise _Answer(400, "Bad Request: message is not modified: specified new "
                                   "message content and reply markup are exactly the same "
                                   "as a current content and reply markup of the message")
            stored.message = dict(stored.message, text=text, edit_date=int(time.time()))
            self._edits.append((key, message_id, text))
            return dict(stored.message)

    def _deleteMessage(self, params):
        key = self._chat(params)
        message_id = _int_param(params, "message_id", required=True)
        with self._lock:
            stored = self._stored.get(key, {}).get(message_id)
            if stored is None:
                raise _Answer(400, "Bad Request: message to delete not found")
            # The Bot API: a bot deletes its own messages anywhere, incoming
            # ones in private chats, and any message of a group it administers.
            kind = chat_type(key)
            if not stored.outgoing and kind != "private" and not (
                    self.bot_is_admin and kind in ("group", "supergroup")):
                raise _Answer(400, "Bad Request: message can't be deleted")
            del self._stored[key][message_id]
            self._deleted.append((key, message_id))
        return True

    def _sendChatAction(self, params):
        key = self._chat(params)
        action = params.get("action")
        if action not in _CHAT_ACTIONS:
            raise _Answer(400, "Bad Request: wrong parameter action in request")
        with self._lock:
            self._actions.append((key, action))
        return True

    def _getChat(self, params):
        key = self._chat(params)
        chat = dict(_chat_json(key), accent_color_id=0, max_reaction_count=11,
                    accepted_gift_types={"unlimited_gifts": False, "limited_gifts": False,
                                         "unique_gifts": False, "premium_subscription": False,
                                         "gifts_from_channels": False})
        with self._lock:
            for old, new in self._migrated.items():
                if str(new) == key:
                    chat["migrate_from_chat_id"] = int(old)
        return chat

    def _getChatAdministrators(self, params):
        key = self._chat(params)
        if chat_type(key) == "private":
            raise _Answer(400, "Bad Request: there are no administrators in the private chat")
        with self._lock:
            users = self._admins.get(key)
        if users is None:
            users = [{"id": 1, "is_bot": False, "first_name": "Owner"}]
        members = [{"status": "creator", "user": users[0], "is_anonymous": False}] + [
            dict(_ADMIN_RIGHTS, status="administrator", user=user) for user in users[1:]]
        if self.bot_is_admin and chat_type(key) != "channel":
            members.append(dict(_ADMIN_RIGHTS, status="administrator", user=self._bot()))
        return members

    def _restrictChatMember(self, params):
        key = self._chat(params)
        if chat_type(key) != "supergroup":
            raise _Answer(400, "Bad Request: method is available only for supergroups")
        user_id = _int_param(params, "user_id", required=True)
        until = _int_param(params, "until_date", default=0)
        permissions = _json_param(params, "permissions")
        if not isinstance(permissions, dict):
            raise _Answer(400, "Bad Request: invalid permissions")
        with self._lock:
            self._restrictions.append((key, user_id, until, permissions))
        return True

    def _setWebhook(self, params):
        # Delivery to the URL: _webhooks.py (self.webhooks).
        url = params.get("url")
        if url and urlsplit(str(url)).scheme not in ("http", "https"):
            raise _Answer(400, "Bad Request: bad webhook: invalid URL")
        options = {"secret_token": params.get("secret_token") or None,
                   "max_connections": min(100, max(1, _int_param(
                       params, "max_connections", default=40))),
                   "allowed_updates": params.get("allowed_updates")}
        with self._lock:
            self._webhook = url or None
            self._webhook_options = options if url else {}
            if _bool_param(params, "drop_pending_updates"):
                self._updates.clear()
            self._updates_changed.notify_all()
        return True

    def _deleteWebhook(self, params):
        with self._lock:
            self._webhook = None
            self._webhook_options = {}
            if _bool_param(params, "drop_pending_updates"):
                self._updates.clear()
            self._updates_changed.notify_all()
        return True

    def _getWebhookInfo(self, params):
        with self._lock:
            return self.webhooks.info()

    def _getUpdates(self, params):
        offset = _int_param(params, "offset", default=0)
        limit = min(100, max(1, _int_param(params, "limit", default=100)))
        timeout = max(0, _int_param(params, "timeout", default=0))
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._webhook is not None:
                raise _Answer(409, "Conflict: can't use getUpdates method while webhook is "
                                   "active; use deleteWebhook to delete the webhook first")
            self._poll_generation += 1
            generation = self._poll_generation
            while True:
                updates = self._updates
                if offset < 0:
                    while len(updates) > -offset:
                        updates.popleft()
                else:
                    while updates and updates[0]["update_id"] < offset:
                        updates.popleft()
                if updates:
                    return list(itertools.islice(updates, limit))
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping:
                    return []
                self._updates_changed.wait(left)
                if generation != self._poll_generation:
                    raise _Answer(409, "Conflict: terminated by other getUpdates request; "
                                       "make sure that only one bot instance is running")


#: The Bot API methods the fake implements (matched case-insensitively).
METHODS = ("getMe", "sendMessage", "editMessageText", "deleteMessage", "sendChatAction",
           "getChat", "getChatAdministrators", "restrictChatMember", "setWebhook",
           "deleteWebhook", "getWebhookInfo", "getUpdates")

_METHODS = {name.lower(): getattr(FakeTelegramServer, "_" + name) for name in METHODS}
