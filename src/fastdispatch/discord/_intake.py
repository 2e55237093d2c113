"""Interactions in: :func:`interactions_app` (Discord's HTTP interactions
endpoint, a WSGI callable), :func:`interaction_to_event` and
:func:`message_to_event`.

Discord POSTs each interaction (a slash command, a button, a modal) to the
app's endpoint, signed with the application's Ed25519 key, and wants an
answer within 3 seconds.  The app:

1. verifies ``X-Signature-Ed25519`` over ``X-Signature-Timestamp`` + the
   raw body (``401`` when it does not verify, the headers are missing, or
   the timestamp is further than ``max_age`` from now: a replayed request);
2. answers a ``PING`` with ``{"type": 1}``;
3. answers every command or modal at once with type 5
   (``DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE``: "the bot is thinking"), every
   component with type 6 (``DEFERRED_UPDATE_MESSAGE``), autocomplete with no
   choices;
4. and only *after* that answer is written (in the WSGI response's
   ``close()``, which the server calls once the body went out) hands the
   :class:`~fastdispatch.Event` to ``engine.process_event``.  The handlers'
   ``ctx.reply`` calls go through the dispatcher, in the channel's FIFO,
   as follow-up messages (``POST /webhooks/{application.id}/
   {interaction.token}``), which Discord accepts only once the interaction
   was acknowledged: acknowledging first is what makes that safe, and the
   3 s are kept whatever the handlers do (the token lasts 15 minutes).

Why always deferred rather than answering type 4 with the first reply: the
reply would then bypass the dispatcher (its order within the channel, its
pacing and retries), and a handler that is slow once would fail the
interaction.  The cost is one follow-up request per reply.

Why PyNaCl (libsodium) for Ed25519: measured against ``cryptography``
(OpenSSL) on the same 1 KiB body, it verifies in about 50 us against 75-85
(``bench/discord_learned.py --verify-only``; ``docs/discord.md``), and it
is what Discord's own documentation uses.  Either is small next to the
3 s an interaction may take.

Replays.  A signature stays valid for ``max_age``: a captured request sent
again, byte for byte, verifies.  The app remembers the id of every
interaction it handled while its signature can still verify (``2 x
max_age``: a timestamp may be that far either side of now), at most
``remember`` of them (the oldest go first; about 150 bytes each), and
acknowledges a repeated one without running its handlers again.

Threads: ``_lock`` guards ``stats``, ``_seen`` and ``_closed``.  The
handlers run on the server's request thread, after the answer.
"""

import collections
import json
import logging
import threading
import time
from typing import Any, Dict, Optional

from .._netnum import parse_int
from ..platform import Capabilities, ChatInfo, Event, SenderInfo, SendResult
from ._sender import DiscordSender, _SecretHolder

__all__ = ["interactions_app", "InteractionsApp", "interaction_to_event", "message_to_event"]

_log = logging.getLogger("fastdispatch.discord")

PING, APPLICATION_COMMAND, MESSAGE_COMPONENT, AUTOCOMPLETE, MODAL_SUBMIT = 1, 2, 3, 4, 5
_ACK = {APPLICATION_COMMAND: 5, MODAL_SUBMIT: 5, MESSAGE_COMPONENT: 6}
_KINDS = {APPLICATION_COMMAND: "command", MESSAGE_COMPONENT: "component",
          MODAL_SUBMIT: "modal"}
_STATUS = {200: "200 OK", 400: "400 Bad Request", 401: "401 Unauthorized",
           405: "405 Method Not Allowed", 411: "411 Length Required",
           413: "413 Payload Too Large", 500: "500 Internal Server Error",
           503: "503 Service Unavailable"}


def _str(value):
    return value if isinstance(value, str) else ""


def _option_words(options, depth=0):
    """A command's option values, subcommand names first, as words."""
    words = []
    for option in options if isinstance(options, list) and depth < 4 else ():
        if not isinstance(option, dict):
            continue
        if option.get("type") in (1, 2):  # SUB_COMMAND, SUB_COMMAND_GROUP
            words.append(_str(option.get("name")))
            words.extend(_option_words(option.get("options"), depth + 1))
        elif "value" in option and not isinstance(option["value"], (dict, list)):
            words.append(str(option["value"]))
    return [w for w in words if w]


def _user(interaction):
    member = interaction.get("member")
    user = member.get("user") if isinstance(member, dict) else interaction.get("user")
    if not isinstance(user, dict):
        user = interaction.get("author") if isinstance(interaction.get("author"), dict) else {}
    return SenderInfo(_str(user.get("id")),
                      _str(user.get("global_name")) or _str(user.get("username")))


def interaction_to_event(interaction: Any) -> Optional[Event]:
    """An application command, component or modal interaction -> an
    ``Event`` (None for anything else, or a malformed payload).

    - ``chat``: the channel (``is_group`` when the interaction came from a
      guild); ``sender``: the member's user (``user`` in a DM);
    - ``text``: a chat-input command reads as typed, ``/name`` then its
      subcommands and option values (so ``rules.on_command`` works); a
      message command is the target message's content; a component its
      ``custom_id``; a modal its ``custom_id`` and the values entered;
    - ``kind``: ``"command"``, ``"component"`` or ``"modal"``;
      ``message_id`` the interaction's id; ``raw`` the whole interaction.
    """
    if not isinstance(interaction, dict):
        return None
    itype = interaction.get("type")
    data = interaction.get("data")
    channel = _str(interaction.get("channel_id")) or _str(
        (interaction.get("channel") or {}).get("id") if isinstance(
            interaction.get("channel"), dict) else None)
    if itype not in _KINDS or not isinstance(data, dict) or not channel:
        return None
    if itype == APPLICATION_COMMAND:
        name = _str(data.get("name"))
        if data.get("type") == 3:  # MESSAGE command: the message it was used on
            messages = (data.get("resolved") or {}).get("messages") if isinstance(
                data.get("resolved"), dict) else None
            target = messages.get(_str(data.get("target_id"))) if isinstance(
                messages, dict) else None
            text = _str(target.get("content")) if isinstance(target, dict) else ""
        else:
            text = " ".join(["/" + name] + _option_words(data.get("options")))
    elif itype == MESSAGE_COMPONENT:
        text = _str(data.get("custom_id"))
    else:
        values = []
        for row in data.get("components") or ():
            for part in (row.get("components") or ()) if isinstance(row, dict) else ():
                if isinstance(part, dict) and isinstance(part.get("value"), str):
                    values.append(part["value"])
        text = " ".join([_str(data.get("custom_id"))] + values)
    return Event(platform="discord",
                 chat=ChatInfo(channel, is_group=bool(interaction.get("guild_id"))),
                 sender=_user(interaction), text=text, message_id=_str(interaction.get("id")),
                 kind=_KINDS[itype], raw=interaction)


def message_to_event(message: Any) -> Optional[Event]:
    """A Discord message object (a gateway ``MESSAGE_CREATE``'s data, from a
    gateway client of your own) -> an ``Event``; None when malformed."""
    if not isinstance(message, dict) or not _str(message.get("channel_id")) \
            or not isinstance(message.get("content"), str):
        return None
    return Event(platform="discord",
                 chat=ChatInfo(message["channel_id"], is_group=bool(message.get("guild_id"))),
                 sender=_user(message), text=message["content"],
                 message_id=_str(message.get("id")), raw=message)


class _FollowUps:
    """The sender one interaction's Context replies through: ``send`` is a
    follow-up message to that interaction, through the bot's
    :class:`DiscordSender`; the optional protocols are the bot's."""

    __slots__ = ("_sender", "_application_id", "_token", "_holder")

    def __init__(self, sender, application_id, token):
        self._sender = sender
        self._application_id = application_id
        self._token = token
        self._holder = _SecretHolder(token)  # out of urllib3's log while this lives

    def __repr__(self):
        return "<follow-ups of an interaction, through %r>" % (self._sender,)

    def __reduce__(self):
        raise TypeError("follow-ups cannot be pickled (they hold an interaction token)")

    def send(self, sc: Any, request: Any) -> SendResult:
        return self._sender.send_followup(sc, self._application_id, self._token,
                                          request.message.text)

    def delete_message(self, chat_id: str, message_id: str) -> Any:
        return self._sender.delete_message(chat_id, message_id)

    def send_typing(self, chat_id: str) -> Any:
        return self._sender.send_typing(chat_id)

    def capabilities(self) -> Capabilities:
        return self._sender.capabilities()


class _Answer:
    """A WSGI body whose ``close()`` (called by the server once the body
    was written) runs ``after``: the handlers run once Discord has its
    acknowledgement."""

    def __init__(self, body, after):
        self._body, self._after = body, after

    def __iter__(self):
        yield self._body

    def close(self):
        after, self._after = self._after, None
        if after is not None:
            try:
                after()
            except Exception:  # never into the server
                _log.exception("interactions: a handler run failed")


class InteractionsApp:
    """The WSGI callable made by :func:`interactions_app`.  ``.stats`` counts
    answers by status and ``pings``, ``handled``, ``ignored``, ``bad_signature``."""

    def __init__(self, engine, sender, verify, max_body, max_age, remember=100_000):
        self.engine = engine
        self.remember = remember
        self._seen: "collections.OrderedDict[str, float]" = collections.OrderedDict()
        self.sender = sender
        self._verify = verify
        self.max_body = max_body
        self.max_age = max_age
        self._capabilities = sender.capabilities() if hasattr(sender, "capabilities") else None
        self._lock = threading.Lock()  # guards stats and _closed
        self.stats: Dict[Any, int] = {200: 0, 400: 0, 401: 0, 405: 0, 411: 0, 413: 0, 500: 0,
                                      503: 0, "pings": 0, "handled": 0, "ignored": 0,
                                      "bad_signature": 0, "replayed": 0}
        self._closed = False

    def close(self) -> None:
        """From now on, answer every request 503 without reading it (a
        shutdown: Discord shows the user that the command failed)."""
        with self._lock:
            self._closed = True

    def __repr__(self):
        return "<fastdispatch.discord interactions app>"

    def _count(self, *keys):
        with self._lock:
            for key in keys:
                self.stats[key] = self.stats.get(key, 0) + 1

    def __call__(self, environ, start_response):
        after = None
        try:
            status, answer, after = self._handle(environ)
        except Exception:  # never into the server
            _log.exception("interactions: unexpected error")
            status, answer, after = 500, None, None
        self._count(status)
        if answer is not None:
            body, ctype = json.dumps(answer, separators=(",", ":")).encode(), "application/json"
        else:
            body, ctype = _STATUS[status].encode() + b"\n", "text/plain"
        headers = [("Content-Type", ctype), ("Content-Length", str(len(body)))]
        if status == 405:
            headers.append(("Allow", "POST"))
        start_response(_STATUS[status], headers)
        return _Answer(body, after)

    def _read(self, environ):
        length = environ.get("CONTENT_LENGTH") or ""
        stream = environ.get("wsgi.input")
        if stream is None:
            return 400, None
        if length.strip():
            length = parse_int(length)
            if length is None:
                return 400, None
            if length > self.max_body:
                return 413, None
            return 200, stream.read(length)
        if environ.get("wsgi.input_terminated"):
            body = stream.read(self.max_body + 1)
            return (413, None) if len(body) > self.max_body else (200, body)
        return 411, None

    def _first_time(self, interaction_id):
        """True the first time ``interaction_id`` is seen while a signature
        over it can still verify; False for a replay."""
        now = time.monotonic()
        with self._lock:
            seen, horizon = self._seen, now - 2 * self.max_age
            while seen:
                oldest, at = next(iter(seen.items()))
                if at > horizon and len(seen) < self.remember:
                    break
                del seen[oldest]
            if interaction_id in seen:
                self.stats["replayed"] += 1
                return False
            seen[interaction_id] = now
            return True

    def _signed(self, environ, body):
        signature = environ.get("HTTP_X_SIGNATURE_ED25519")
        timestamp = environ.get("HTTP_X_SIGNATURE_TIMESTAMP")
        seconds = parse_int(timestamp, max_digits=12) if isinstance(timestamp, str) else None
        if not isinstance(signature, str) or len(signature) != 128 or seconds is None \
                or timestamp != timestamp.strip():
            return False
        if abs(time.time() - seconds) > self.max_age:
            return False
        try:
            raw = bytes.fromhex(signature)
        except ValueError:
            return False
        return self._verify(raw, timestamp.encode("ascii") + body)

    def _handle(self, environ):
        if environ.get("REQUEST_METHOD") != "POST":
            return 405, None, None
        if self._closed:
            return 503, None, None
        status, body = self._read(environ)
        if body is None:
            return status, None, None
        if not self._signed(environ, body):
            self._count("bad_signature")
            return 401, None, None
        try:
            interaction = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return 400, None, None
        if not isinstance(interaction, dict):
            return 400, None, None
        itype = interaction.get("type")
        if itype == PING:
            self._count("pings")
            return 200, {"type": 1}, None
        if itype == AUTOCOMPLETE:
            return 200, {"type": 8, "data": {"choices": []}}, None
        if itype not in _ACK:
            return 400, None, None
        event = interaction_to_event(interaction)
        token = interaction.get("token")
        app = interaction.get("application_id")
        if event is None or not isinstance(token, str) or not token or \
                not token.isascii() or any(c in token for c in "/?#% \t\r\n") \
                or not isinstance(app, str) or parse_int(app, max_digits=20) is None \
                or app != app.strip():
            self._count("ignored")
            return 200, {"type": _ACK[itype]}, None
        interaction_id = interaction.get("id")
        if not isinstance(interaction_id, str) or not interaction_id:
            interaction_id = "sig:" + environ.get("HTTP_X_SIGNATURE_ED25519", "")
        if not self._first_time(interaction_id):
            _log.warning("interactions: interaction %r came again (a replayed request); "
                         "acknowledged, not handled again", interaction_id[:40])
            return 200, {"type": _ACK[itype]}, None
        replies = _FollowUps(self.sender, app, token)
        self._count("handled")

        def run():
            self.engine.process_event(event, replies, self._capabilities)
        return 200, {"type": _ACK[itype]}, run


def _verifier(public_key):
    if not isinstance(public_key, str):
        raise TypeError("public_key must be a str (the application's public key, hex)")
    try:
        raw = bytes.fromhex(public_key)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ValueError("public_key must be 64 hex digits (the application's Ed25519 public "
                         "key from the developer portal)")
    try:
        from nacl.exceptions import BadSignatureError
        from nacl.signing import VerifyKey
    except ImportError:  # pragma: no cover - depends on the installation
        raise ImportError("interactions_app verifies signatures with PyNaCl: "
                          "pip install 'fastdispatch[discord]'") from None
    key = VerifyKey(raw)

    def verify(signature, message):
        try:
            key.verify(message, signature)
        except (BadSignatureError, ValueError, TypeError):
            return False
        return True
    return verify


def interactions_app(engine: Any, sender: DiscordSender, *, public_key: str,
                     max_body: int = 1 << 20, max_age: float = 300.0,
                     remember: int = 100_000) -> InteractionsApp:
    """A WSGI application for Discord's Interactions Endpoint URL.

    - ``engine``: has ``process_event(event, sender, capabilities)``;
    - ``sender``: the bot's :class:`DiscordSender` (replies go out through
      it, as follow-ups);
    - ``public_key``: the application's public key (hex, from the developer
      portal);
    - ``max_body``: larger requests are answered 413 unread;
    - ``max_age``: a signature whose timestamp is further than this many
      seconds from now is refused (401), so a captured request cannot be
      replayed later;
    - ``remember``: how many interaction ids are kept to acknowledge a
      replay within that window without running it again (see the module
      docstring).

    Not POST -> 405; a missing, malformed or failing signature -> 401;
    not JSON -> 400; PING -> ``{"type": 1}``; commands, components, modals
    -> acknowledged at once (see the module docstring), then handled.  It
    never raises into the server.
    """
    if not callable(getattr(engine, "process_event", None)):
        raise TypeError("engine must have a process_event(event, sender, capabilities) method")
    if not callable(getattr(sender, "send_followup", None)):
        raise TypeError("sender must be a DiscordSender (it sends the follow-ups)")
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
        raise ValueError("max_body must be a positive int, got %r" % (max_body,))
    if isinstance(max_age, bool) or not isinstance(max_age, (int, float)) or \
            not 0 < max_age < float("inf"):
        raise ValueError("max_age must be a positive number of seconds, got %r" % (max_age,))
    if isinstance(remember, bool) or not isinstance(remember, int) or remember < 1:
        raise ValueError("remember must be a positive int, got %r" % (remember,))
    return InteractionsApp(engine, sender, _verifier(public_key), max_body, float(max_age),
                           remember)
