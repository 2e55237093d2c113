"""``fastdispatch.testing``: a local Telegram Bot API server for tests.

:class:`FakeTelegramServer` is a real HTTP/1.1 server (keep-alive, one
thread per connection; the machinery is :class:`~._server.LocalServer`) on
127.0.0.1, on a port the OS picks.  It speaks the part of the Bot API bots
use (messages of every kind, files, keyboards and queries, edits, members),
answers as Telegram does (the objects carry the fields the Bot API marks
required; errors have Telegram's descriptions and
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

The Bot API methods are one table (``_telegram_api.py``).  What it
emulates and what it does not is a table in ``docs/telegram.md``.  The
main simplifications: any chat id is a chat (no "chat not found"), files
are kept but not read (a photo has no real dimensions, a URL is not
fetched), no ``parse_mode`` rendering, no payments, games or channels' own
rules.

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
import re
import threading
import time
from typing import Any, Dict, List, NamedTuple, Optional
from urllib.parse import unquote, urlsplit

from ..pacing import RateLimit
from ._server import BadParams, LocalServer, as_limit as _as_limit, parse_params
from . import _telegram_api as _api
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
    """One message as it arrived at the server (``at``: ``time.monotonic()``):
    ``text`` is its text or caption (``""`` for none), ``kind`` what it is
    (``"text"``, ``"photo"``, ``"document"``, ``"poll"``, ``"location"``...:
    the message's field)."""

    chat_id: str
    message_id: int
    text: str
    at: float
    kind: str = "text"


#: A message's kind: the first of these fields it has (else "text").
_MESSAGE_KINDS = ("photo", "audio", "document", "video", "animation", "voice", "video_note",
                  "sticker", "venue", "location", "contact", "poll", "dice")


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


_Answer = _api.Answer


_SUPERGROUP_BELOW = -1000000000000  # supergroup and channel ids: -100 then the channel's id


def chat_type(key: str) -> str:
    """The type of the chat with this id, by Telegram's numbering."""
    if key.startswith("@"):
        return "channel"
    chat_id = int(key)
    if chat_id > 0:
        return "private"
    return "supergroup" if chat_id <= _SUPERGROUP_BELOW else "group"


_NUMERIC_ID = re.compile(r"-?[0-9]{1,20}")  # ASCII digits only: int() takes more


def _chat_key_of(chat_id):
    """A chat id as the record keys it (``"42"``, ``"-100123"``, ``"@name"``)."""
    key = str(chat_id).strip()
    if _NUMERIC_ID.fullmatch(key):
        return str(int(key))
    return key


def _user(user_id, first_name, username):
    user = {"id": user_id, "is_bot": False, "first_name": first_name}
    if username:
        user["username"] = username
    return user


def _command_entities(text):
    """The ``bot_command`` entity of a text that starts with a command
    (Telegram marks ``/cmd`` and ``/cmd@botname``); offsets in UTF-16 units."""
    match = re.match(r"/[A-Za-z0-9_]{1,32}(@[A-Za-z0-9_]{3,32})?(?=\s|$)", text)
    if not match:
        return []
    return [{"type": "bot_command", "offset": 0,
             "length": len(match.group(0).encode("utf-16-le")) // 2}]


def _is_group(key):
    return key[:1] == "-"


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


_int_param = _api.int_param
_bool_param = _api.bool_param


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

#: ``ChatMemberRestricted``'s required fields (what is allowed), all False
#: unless the restriction's permissions say otherwise.
_RESTRICTED = {name: False for name in (
    "can_send_messages", "can_send_audios", "can_send_documents", "can_send_photos",
    "can_send_videos", "can_send_video_notes", "can_send_voice_notes", "can_send_polls",
    "can_send_other_messages", "can_add_web_page_previews", "can_change_info",
    "can_invite_users", "can_pin_messages", "can_manage_topics")}

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
      limit).  Telegram's limits are on messages: a request that creates
      messages (``send*``, ``copyMessage(s)``, ``forwardMessage(s)``)
      counts once, to a group (a negative chat id) against ``group_limit``
      (``chat_limit`` when there is none), to any other chat against
      ``chat_limit``, and against ``global_limit``; other calls count
      against none.  Over a limit, the answer is ``429``
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
      :data:`control_actions` and ``docs/telegram.md``); only JSON
      requests with this server's ``Host`` and no foreign ``Origin``.
    - ``max_body`` (1 MiB), ``max_header`` (64 KiB), ``request_timeout``
      (10 s for a whole request, from its first byte), ``idle_timeout``
      (60 s), ``max_connections`` (128): the bounds of
      :class:`~._server.LocalServer`, whatever a client does.

    The server is started by :meth:`start` or ``with``; :attr:`base_url` is
    what ``TelegramSender(base_url=...)`` takes.  Costs: the record keeps
    every message (a few hundred bytes each); call :meth:`reset` between
    phases of a long test.
    """

    server_name = "FakeTelegram/2"
    thread_name = "fake-telegram"
    default_fault_method = "sendMessage"
    control_actions = LocalServer.control_actions + (
        "push_update", "push_message", "push_media", "push_edited_message",
        "push_callback_query", "push_inline_query", "push_chosen_inline_result",
        "push_member_joined", "answer_to", "calls", "pinned", "commands", "update", "pending_updates", "migrate_chat",
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
        self._calls: List[tuple] = []  # (method, chat key, params, at) of each success
        self._id_counters: collections.Counter = collections.Counter()
        self._files: Dict[str, Dict[str, Any]] = {}  # file_id -> its record
        self._file_data: Dict[str, bytes] = {}  # file_path -> bytes (for downloads)
        self._queries: Dict[str, tuple] = {}  # query id -> (kind, answer or None)
        self._query_of_update: Dict[int, str] = {}  # update_id -> query id
        self._inline_messages: Dict[str, Dict[str, Any]] = {}  # inline_message_id -> result
        self._pinned: Dict[str, List[int]] = {}  # chat key -> pinned ids, latest last
        self._members: Dict[str, Dict[int, Dict[str, Any]]] = collections.defaultdict(dict)
        self._statuses: Dict[str, Dict[int, tuple]] = {}  # chat key -> user -> (status, ...)
        self._commands: Dict[tuple, list] = {}  # (scope JSON, language) -> commands
        self._bot_settings: Dict[tuple, str] = {}  # (field, language) -> text
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
                     chat_title: Optional[str] = None,
                     reply_to_message_id: Optional[int] = None) -> int:
        """Queue a text-message update from a user in a chat (by its id: a
        positive one is a private chat with that user); returns its
        ``update_id``.  A command (``/start``, ``/help@fake_1_bot arg``)
        carries its ``bot_command`` entity, as Telegram's do, so the
        frameworks' command handlers see it.  The message exists in the chat
        from now on (the bot may reply to it, delete it); its id is
        ``server.update(update_id)["message"]["message_id"]``."""
        if not isinstance(text, str) or not text:
            raise ValueError("text must be a non-empty str")
        content: Dict[str, Any] = {"text": text}
        entities = _command_entities(text)
        if entities:
            content["entities"] = entities
        return self._push_incoming(chat_id, content, user_id=user_id, first_name=first_name,
                                   username=username, chat_title=chat_title,
                                   reply_to_message_id=reply_to_message_id)

    def push_media(self, chat_id: Any, kind: str, data: bytes = b"fake file", *,
                   filename: Optional[str] = None, mime_type: Optional[str] = None,
                   caption: Optional[str] = None, user_id: Any = None,
                   first_name: str = "Test", username: Optional[str] = None) -> int:
        """Queue a message from a user carrying a file: ``kind`` is
        ``"photo"``, ``"document"``, ``"audio"``, ``"video"``, ``"animation"``,
        ``"voice"``, ``"video_note"`` or ``"sticker"``; ``data`` its bytes,
        which the bot can fetch with ``getFile`` and the download path
        (``file_data(file_id)`` reads them too).  Returns the ``update_id``."""
        if kind not in _api.MEDIA_KINDS:
            raise ValueError("kind must be one of %s" % ", ".join(_api.MEDIA_KINDS))
        if isinstance(data, str):  # from the control endpoint's JSON
            data = data.encode()
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError("data must be bytes")
        file = self._add_file(kind, bytes(data), filename, mime_type)
        content: Dict[str, Any] = {kind: _api.media_object(kind, file)}
        if caption:
            content["caption"] = caption
        return self._push_incoming(chat_id, content, user_id=user_id, first_name=first_name,
                                   username=username)

    def push_edited_message(self, chat_id: Any, message_id: int, text: str) -> int:
        """Queue an ``edited_message`` update: the user edited their earlier
        message (it must exist and be theirs) to ``text``.  Returns the
        ``update_id``."""
        key = _chat_key_of(chat_id)
        with self._lock:
            stored = self._stored.get(key, {}).get(int(message_id))
            if stored is None or stored.outgoing:
                raise ValueError("no message %r of a user in chat %s" % (message_id, key))
            if "text" not in stored.message:
                raise ValueError("message %r has no text to edit" % (message_id,))
            message = dict(stored.message, text=text, edit_date=int(time.time()))
            message.pop("entities", None)
            entities = _command_entities(text)
            if entities:
                message["entities"] = entities
            stored.message = message
            return self._push_update_locked({"edited_message": dict(message)})

    def push_callback_query(self, chat_id: Any, message_id: int, data: str, *,
                            user_id: Any = None, first_name: str = "Test",
                            username: Optional[str] = None) -> int:
        """Queue a ``callback_query``: a user pressed the button with
        ``callback_data == data`` on the bot's message ``message_id`` in the
        chat (the message must exist and carry that button, as only a real
        button can be pressed).  Returns the ``update_id``;
        :meth:`answer_to` is the bot's ``answerCallbackQuery`` for it."""
        key = _chat_key_of(chat_id)
        user = _user(self._default_user(key, user_id), first_name, username)
        with self._lock:
            stored = self._stored.get(key, {}).get(int(message_id))
            if stored is None or not stored.outgoing:
                raise ValueError("no message %r of the bot in chat %s" % (message_id, key))
            buttons = [b for row in stored.message.get("reply_markup", {}).get(
                "inline_keyboard", []) for b in row]
            if not any(b.get("callback_data") == data for b in buttons):
                raise ValueError("message %r has no button with callback_data %r; it has %r"
                                 % (message_id, data, [b.get("callback_data")
                                                       for b in buttons]))
            query_id = str(self._id_counters["query"] + 4000000000000000001)
            self._id_counters["query"] += 1
            self._queries[query_id] = ("callback", None)
            update_id = self._push_update_locked({"callback_query": {
                "id": query_id, "from": user, "message": dict(stored.message),
                "chat_instance": str(abs(hash(key)) % 10 ** 18), "data": data}})
            self._query_of_update[update_id] = query_id
            return update_id

    def push_inline_query(self, query: str, *, user_id: int = 1, first_name: str = "Test",
                          username: Optional[str] = None, offset: str = "",
                          chat_type: Optional[str] = "private") -> int:
        """Queue an ``inline_query`` (a user typing ``@bot query``).  Returns
        the ``update_id``; :meth:`answer_to` is the bot's
        ``answerInlineQuery`` for it (its ``results`` parsed)."""
        user = _user(int(user_id), first_name, username)
        with self._lock:
            query_id = str(self._id_counters["query"] + 4000000000000000001)
            self._id_counters["query"] += 1
            self._queries[query_id] = ("inline", None)
            inline = {"id": query_id, "from": user, "query": str(query), "offset": offset}
            if chat_type:
                inline["chat_type"] = chat_type
            update_id = self._push_update_locked({"inline_query": inline})
            self._query_of_update[update_id] = query_id
            return update_id

    def push_chosen_inline_result(self, result_id: str, query: str = "", *,
                                  user_id: int = 1, first_name: str = "Test") -> int:
        """Queue a ``chosen_inline_result``: the user picked the result
        ``result_id``; the message it became gets an ``inline_message_id``
        (in the update) that ``editMessage*`` accept.  Returns the
        ``update_id``."""
        with self._lock:
            self._id_counters["inline_message"] += 1
            inline_id = "AgAAAFake%012d" % self._id_counters["inline_message"]
            self._inline_messages[inline_id] = {"result_id": str(result_id)}
            return self._push_update_locked({"chosen_inline_result": {
                "result_id": str(result_id), "from": _user(int(user_id), first_name, None),
                "query": str(query), "inline_message_id": inline_id}})

    def push_member_joined(self, chat_id: Any, user_id: int, *, first_name: str = "New",
                           username: Optional[str] = None) -> int:
        """Queue the service message of a user joining a group
        (``new_chat_members``).  Returns the ``update_id``."""
        key = _chat_key_of(chat_id)
        if chat_type(key) == "private":
            raise ValueError("members join groups, not private chats")
        user = _user(int(user_id), first_name, username)
        return self._push_incoming(chat_id, {"new_chat_members": [user]}, user_id=user_id,
                                   first_name=first_name, username=username)

    def _default_user(self, key, user_id):
        if user_id is not None:
            return int(user_id)
        return int(key) if chat_type(key) == "private" else 1

    def _push_incoming(self, chat_id, content, *, user_id=None, first_name="Test",
                       username=None, chat_title=None, reply_to_message_id=None):
        """Queue a user's message with this content; its ``update_id``."""
        chat_id = int(chat_id)
        key = str(chat_id)
        user = _user(self._default_user(key, user_id), first_name, username)
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
            message = dict({"message_id": self._next_message_id[key], "from": user,
                            "chat": chat, "date": int(time.time())}, **content)
            if reply_to_message_id is not None:
                replied = self._stored.get(key, {}).get(int(reply_to_message_id))
                if replied is None:
                    raise ValueError("no message %r in chat %s to reply to"
                                     % (reply_to_message_id, key))
                message["reply_to_message"] = {k: v for k, v in replied.message.items()
                                               if k != "reply_to_message"}
            self._stored[key][message["message_id"]] = _Stored(message, outgoing=False)
            for member in [user] + content.get("new_chat_members", []):
                self._members[key][member["id"]] = member
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
        """``(chat_id, message_id, text)`` of each successful ``editMessage*``
        (``text``: the message's text or caption after the edit; for an
        inline message ``chat_id`` is None and ``message_id`` its
        ``inline_message_id``)."""
        with self._lock:
            return [(chat, message_id, text) for chat, message_id, _, text in self._edits]

    def calls(self, method: Optional[str] = None) -> List[Dict[str, Any]]:
        """Every successful Bot API call that is not an update getter, in
        order (``method``: only those of that method, case-insensitive):
        ``{"method", "chat_id" (the chat's key or None), "params", "at"}``,
        ``params`` as the server read them (uploads as
        ``Upload(filename, content_type, data)``)."""
        wanted = None if method is None else method.lower()
        with self._lock:
            return [{"method": m, "chat_id": key, "params": dict(params), "at": at}
                    for m, key, params, at in self._calls
                    if wanted is None or m.lower() == wanted]

    def answer_to(self, update_id: int) -> Optional[Dict[str, Any]]:
        """The bot's ``answerCallbackQuery``/``answerInlineQuery`` parameters
        for the query of this update (pushed by :meth:`push_callback_query`
        or :meth:`push_inline_query`), or None while unanswered.  An inline
        query's ``results`` are parsed (a list of dicts)."""
        with self._lock:
            query = self._query_of_update.get(int(update_id))
            if query is None:
                raise ValueError("update %r carries no query" % (update_id,))
            answer = self._queries[query][1]
            return None if answer is None else json.loads(json.dumps(answer, default=repr))

    def pinned(self, chat_id: Any) -> List[int]:
        """The ids of the chat's pinned messages, the latest pinned last."""
        with self._lock:
            return list(self._pinned.get(_chat_key_of(chat_id), []))

    def commands(self, scope: Optional[Dict[str, Any]] = None,
                 language_code: str = "") -> List[Dict[str, str]]:
        """The bot's commands set for this scope (default: the default
        scope) and language, as ``setMyCommands`` left them."""
        key = _api._scope_key({"scope": scope, "language_code": language_code})
        with self._lock:
            return list(self._commands.get(key, []))

    def file_data(self, file_id: str) -> Optional[bytes]:
        """The bytes of a file the bot uploaded (or a user sent), by its
        ``file_id``; None for a file given by URL (the fake fetches nothing)."""
        with self._lock:
            file = self._files.get(file_id)
            return None if file is None else self._file_data.get(file["file_path"])

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
        if len(parts) > 3 and parts[:2] == ["", "file"] and parts[2].startswith("bot"):
            # clients percent-encode the path (PTB: the token's ':' as %3A)
            return self._download(handler, unquote(parts[2][3:]), unquote("/".join(parts[3:])))
        if len(parts) != 3 or parts[0] != "" or not parts[1].startswith("bot"):
            return self._answer(handler, _Answer(404, "Not Found"))
        token, method = parts[1][3:], parts[2]
        bot_id = self._bot_id(token)
        if bot_id is None:
            return self._answer(handler, _Answer(401, "Unauthorized"))
        call = _METHODS.get(method.lower())
        if call is None:
            return self._answer(handler, _Answer(404, "Not Found"))
        method = call.name
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

    def _bot_id(self, token):
        """The bot's id from a token the server accepts, or None."""
        bot_id, colon, secret = token.partition(":")
        if (self.token is not None and token != self.token) or not (
                colon and _NUMERIC_ID.fullmatch(bot_id) and bot_id[0] != "-" and secret
                and len(bot_id) < 16):
            return None
        return bot_id

    def _download(self, handler, token, path):
        """``GET /file/bot<token>/<file_path>``: a file's bytes, as Telegram
        serves them after ``getFile``."""
        if self._bot_id(token) is None:
            return self._answer(handler, _Answer(401, "Unauthorized"))
        with self._lock:
            data = self._file_data.get(path)
        if data is None:
            return self._answer(handler, _Answer(404, "Not Found"))
        return self._reply(handler, 200, data, b"application/octet-stream")

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
            result = self._call(call, params)
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

    def _call(self, method, params):
        """Run one row of the method table: the chat checked, the required
        parameters there, then the method; a method that creates messages
        creates them here, after the limits allowed them."""
        key = self._chat(params) if method.chat else None
        _api.require(params, method.required)
        result = method.call(self, params, key)
        if not method.creates:
            if method.name != "getUpdates":  # polls: as many as the bot likes
                with self._lock:
                    self._calls.append((method.name, key, params, time.monotonic()))
            return result
        now = time.monotonic()
        with self._lock:
            messages = self._create_messages_locked(key, result.bodies, now)
            self._calls.append((method.name, key, params, now))
        if result.shape == "message":
            return messages[0]
        if result.shape == "messages":
            return messages
        ids = [{"message_id": m["message_id"]} for m in messages]
        return ids[0] if result.shape == "message_id" else ids

    def _create_messages_locked(self, key, bodies, now):
        """The one place where the limits are counted: a request that creates
        messages counts once against the chat's (or group's) limit and the
        bot-wide one, whatever the number of messages it creates; over a
        limit it is refused with a 429 and creates nothing.  Then the bot's
        messages are made, stored and recorded (ids per chat, in order)."""
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
        messages = []
        for body in bodies:
            self._next_message_id[key] += 1
            message_id = self._next_message_id[key]
            message = dict({"message_id": message_id, "from": self._bot(),
                            "chat": _chat_json(key), "date": int(time.time())}, **body)
            kind = next((k for k in _MESSAGE_KINDS if k in body), "text")
            self._record.add(key, SentMessage(key, message_id,
                                              body.get("text", body.get("caption", "")),
                                              now, kind))
            self._stored[key][message_id] = _Stored(message, outgoing=True)
            messages.append(dict(message))
        planned = self._migrate_after.get(key)
        if planned is not None:
            left, new = planned
            if left <= 1:
                self._migrate_locked(key, new)
            else:
                self._migrate_after[key] = (left - 1, new)
        return messages

    def _next_id(self, kind):
        with self._lock:
            self._id_counters[kind] += 1
            return self._id_counters[kind]

    def _add_file(self, kind, data, filename, content_type, url=None):
        """A new file (uploaded, by URL, or sent by a user): its record."""
        number = self._next_id("file")
        suffix = (filename or "").rpartition(".")[2] if "." in (filename or "") else ""
        suffix = suffix.lower() if suffix.isalnum() and len(suffix) <= 5 else "bin"
        path = "%ss/file_%d.%s" % (kind, number, suffix)
        file = {"file_id": "FAKE%s%08d" % (kind.upper().replace("_", ""), number),
                "file_unique_id": "U%08d" % number, "file_path": path, "kind": kind,
                "file_name": filename or None, "mime_type": content_type or None,
                "file_size": None if data is None else len(data), "url": url}
        with self._lock:
            self._files[file["file_id"]] = file
            if data is not None:
                self._file_data[path] = bytes(data)
        return file

    def _member(self, key, user_id):
        """The ``ChatMember`` of a user in a chat, as far as the fake knows it."""
        bot = self._bot()
        if user_id == bot["id"]:
            if self.bot_is_admin and chat_type(key) not in ("private", "channel"):
                return dict(_ADMIN_RIGHTS, status="administrator", user=bot)
            return {"status": "member", "user": bot}
        with self._lock:
            user = self._members.get(key, {}).get(user_id) or {
                "id": user_id, "is_bot": False, "first_name": "User %d" % user_id}
            status = self._statuses.get(key, {}).get(user_id)
            admins = self._admins.get(key) or [{"id": 1, "is_bot": False,
                                                 "first_name": "Owner"}]
        if admins[0]["id"] == user_id and chat_type(key) != "private":
            return {"status": "creator", "user": admins[0], "is_anonymous": False}
        if any(a["id"] == user_id for a in admins[1:]) or (status and status[0] ==
                                                             "administrator"):
            return dict(_ADMIN_RIGHTS, status="administrator", user=user)
        if status and status[0] == "kicked":
            return {"status": "kicked", "user": user, "until_date": status[1]}
        if status and status[0] == "restricted":
            return dict(_RESTRICTED, **dict(status[2], status="restricted", user=user,
                                             until_date=status[1], is_member=True))
        return {"status": "member", "user": user}

    def _chat(self, params, name="chat_id"):
        """The chat a call names (its key), checked as Telegram checks it."""
        chat_id = params.get(name)
        if chat_id is None or chat_id == "":
            raise _Answer(400, "Bad Request: %s is empty" % name)
        if isinstance(chat_id, bool) or not isinstance(chat_id, (int, str)):
            raise _Answer(400, "Bad Request: chat not found")
        key = str(chat_id)
        if _NUMERIC_ID.fullmatch(key):
            key = str(int(key))
        elif not (key.startswith("@") and len(key) > 1):
            raise _Answer(400, "Bad Request: chat not found")
        with self._lock:
            self._check_not_migrated_locked(key)
        return key

    # -- the server's own Bot API methods (the rest: _telegram_api.py) ------

    def _getMe(self, params, key):
        return dict(self._bot(), can_join_groups=True, can_read_all_group_messages=False,
                    supports_inline_queries=True, can_connect_to_business=False,
                    has_main_web_app=False)

    def _getChat(self, params, key):
        chat = dict(_chat_json(key), accent_color_id=0, max_reaction_count=11,
                    accepted_gift_types={"unlimited_gifts": False, "limited_gifts": False,
                                         "unique_gifts": False, "premium_subscription": False,
                                         "gifts_from_channels": False})
        with self._lock:
            for old, new in self._migrated.items():
                if str(new) == key:
                    chat["migrate_from_chat_id"] = int(old)
            pinned = self._pinned.get(key)
            if pinned and pinned[-1] in self._stored.get(key, {}):
                chat["pinned_message"] = dict(self._stored[key][pinned[-1]].message)
        return chat

    def _setWebhook(self, params, key):
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

    def _deleteWebhook(self, params, key):
        with self._lock:
            self._webhook = None
            self._webhook_options = {}
            if _bool_param(params, "drop_pending_updates"):
                self._updates.clear()
            self._updates_changed.notify_all()
        return True

    def _getWebhookInfo(self, params, key):
        with self._lock:
            return self.webhooks.info()

    def _getUpdates(self, params, key):
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


def _own(name, chat=False):
    def call(server, params, key):
        return getattr(server, "_" + name)(params, key)
    call.__name__ = name
    return _api.Method(name, call, chat, False)


#: Every Bot API method the fake implements, by lower-cased name (Telegram
#: matches method names case-insensitively): the table of _telegram_api.py
#: and the server's own.
_METHODS = dict(_api.METHODS)
_METHODS.update((row.name.lower(), row) for row in (
    _own("getMe"), _own("getChat", chat=True), _own("setWebhook"), _own("deleteWebhook"),
    _own("getWebhookInfo"), _own("getUpdates")))
METHODS = tuple(sorted(row.name for row in _METHODS.values()))
