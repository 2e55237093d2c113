"""The Bot API methods of :class:`~._telegram.FakeTelegramServer`, as one table.

Each method is a row of :data:`METHODS`: its name, whether it names a chat
(``chat_id`` checked as Telegram checks it), whether it **creates messages**,
the parameters it requires, and a function that validates the call and
builds its result.  What a method counts against follows Telegram, whose
limits are on *messages* (about 1 per second per chat, 20 per minute per
group, 30 per second bot-wide): a request that creates messages (every
``send*``, ``copyMessage(s)``, ``forwardMessage(s)``) counts once against
them, whatever the number of messages it creates; every other call (edits,
deletes, chat actions, answers to queries, pins, getters, moderation) counts
against none.  That rule lives in one place: the server's
``_create_messages_locked``, called for the rows whose ``creates`` is True.

A row's function gets ``(server, params, key)`` (``key``: the chat's key, or
None for a method that names no chat) and either returns the result, or,
for a method that creates messages, a :class:`Contents` (the messages' bodies
and the shape of the result), which the server turns into messages under
its lock after the limits allowed them.  Validation errors raise
:class:`Answer` with Telegram's own description, before anything counts.

Files: the three ways the Bot API takes one (a ``multipart/form-data``
upload, a ``file_id`` the server issued, an ``http(s)`` URL) and
``attach://<name>`` for media groups and ``editMessageMedia``.  Uploaded
files (and files users sent, see ``push_media``) can be downloaded from
``/file/bot<token>/<file_path>`` after ``getFile``; a file given by URL is
not fetched (no network): its download answers 404.

Threads: the functions run on the server's connection threads and take the
server's ``_lock`` for what they read or change of its state.
"""

import json
import re
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ._server import Upload

__all__ = ["METHODS", "Method", "Contents", "Answer", "MEDIA_KINDS"]


class Answer(Exception):
    """Raised inside a method to answer ``ok: false``."""

    def __init__(self, status, description, parameters=None):
        super().__init__(status, description)
        self.status = status
        self.description = description
        self.parameters = parameters


class Contents(NamedTuple):
    """What a message-creating method asks the server to create: the bodies
    (content fields only: the server adds ``message_id``, ``from``, ``chat``,
    ``date``) and the result's shape: ``"message"`` (the one Message),
    ``"messages"`` (the array), ``"message_id"`` (a MessageId) or
    ``"message_ids"`` (an array of MessageId)."""

    bodies: List[Dict[str, Any]]
    shape: str = "message"


class Method(NamedTuple):
    name: str
    call: Callable[..., Any]
    chat: bool  # names a chat: chat_id required and checked
    creates: bool  # creates messages: counts against the message limits
    required: Tuple[str, ...] = ()


# -- parameters -------------------------------------------------------------------

def missing(params, name):
    value = params.get(name)
    return value is None or value == ""


def require(params, names):
    for name in names:
        if missing(params, name):
            raise Answer(400, 'Bad Request: parameter "%s" is required' % name)


def int_param(params, name, default=None, required=False):
    value = params.get(name)
    if value is None or value == "":
        if required:
            raise Answer(400, 'Bad Request: parameter "%s" is required' % name)
        return default
    if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
        raise Answer(400, "Bad Request: invalid %s" % name)
    if isinstance(value, str) and not re.fullmatch(r"-?[0-9]{1,20}", value.strip()):
        raise Answer(400, "Bad Request: invalid %s" % name)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise Answer(400, "Bad Request: invalid %s" % name) from None


def float_param(params, name):
    value = params.get(name)
    if isinstance(value, bool):
        raise Answer(400, "Bad Request: invalid %s" % name)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise Answer(400, "Bad Request: invalid %s" % name) from None
    if number != number or number in (float("inf"), float("-inf")):
        raise Answer(400, "Bad Request: invalid %s" % name)
    return number


def bool_param(params, name):
    value = params.get(name)
    return value is True or str(value).lower() in ("true", "1")


def json_param(params, name, kind=None):
    """An object parameter: a JSON value, or a JSON text (form and multipart
    bodies carry objects as JSON text); ``kind`` (dict or list) checked."""
    value = params.get(name)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise Answer(400, "Bad Request: can't parse %s JSON object" % name) from None
    if kind is not None and value is not None and not isinstance(value, kind):
        raise Answer(400, "Bad Request: field \"%s\" must be of type %s"
                     % (name, "Array" if kind is list else "Object"))
    return value


def str_param(params, name, limit=None, what=None):
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        value = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    if limit is not None and len(value) > limit:
        raise Answer(400, "Bad Request: %s is too long" % (what or name))
    return value


def text_param(params):
    text = params.get("text")
    if not isinstance(text, str) or not text.strip():
        raise Answer(400, "Bad Request: message text is empty")
    if len(text) > 4096:
        raise Answer(400, "Bad Request: message is too long")
    return text


_PARSE_MODES = ("", "markdown", "markdownv2", "html")


def formatted(params, text_field, body):
    """The text's options as the message shows them (``parse_mode`` checked,
    not rendered: the text is kept as sent)."""
    mode = params.get("parse_mode")
    if mode is not None and str(mode).lower() not in _PARSE_MODES:
        raise Answer(400, "Bad Request: unsupported parse_mode")
    entities = json_param(params, "entities" if text_field == "text" else "caption_entities",
                          list)
    if entities:
        body["entities" if text_field == "text" else "caption_entities"] = entities
    return body


def caption(params, body):
    text = str_param(params, "caption")
    if text:
        if len(text) > 1024:
            raise Answer(400, "Bad Request: message caption is too long")
        body["caption"] = text
        formatted(params, "caption", body)
    if bool_param(params, "has_spoiler"):
        body["has_media_spoiler"] = True
    return body


def reply_markup(params, body):
    """``reply_markup`` checked; an inline keyboard is shown on the message
    (Telegram shows no other kind there)."""
    markup = json_param(params, "reply_markup", dict)
    if not markup:
        return body
    keyboard = markup.get("inline_keyboard")
    if keyboard is None:
        if not any(k in markup for k in ("keyboard", "remove_keyboard", "force_reply")):
            raise Answer(400, "Bad Request: object expected as reply markup")
        return body
    if not isinstance(keyboard, list) or not all(isinstance(row, list) for row in keyboard):
        raise Answer(400, "Bad Request: can't parse inline keyboard: field \"inline_keyboard\" "
                          "must be an Array of Arrays")
    for row in keyboard:
        for button in row:
            if not isinstance(button, dict) or not isinstance(button.get("text"), str):
                raise Answer(400, "Bad Request: can't parse inline keyboard button: Field "
                                  "\"text\" must be of type String")
            actions = [k for k in button if k != "text"]
            if not actions:
                raise Answer(400, "Bad Request: can't parse inline keyboard button: Text "
                                  "buttons are unallowed in the inline keyboard")
            data = button.get("callback_data")
            if data is not None and not (isinstance(data, str)
                                         and 1 <= len(data.encode()) <= 64):
                raise Answer(400, "Bad Request: BUTTON_DATA_INVALID")
    body["reply_markup"] = {"inline_keyboard": keyboard}
    return body


def reply_to(server, params, key, body):
    """``reply_parameters`` / ``reply_to_message_id``: the message replied
    to must exist in the chat (unless ``allow_sending_without_reply``)."""
    reply = json_param(params, "reply_parameters", dict) or {}
    message_id = reply.get("message_id", params.get("reply_to_message_id"))
    if message_id in (None, ""):
        return body
    message_id = int_param({"message_id": message_id}, "message_id")
    with server._lock:
        stored = server._stored.get(key, {}).get(message_id)
    if stored is None:
        if reply.get("allow_sending_without_reply") or bool_param(
                params, "allow_sending_without_reply"):
            return body
        raise Answer(400, "Bad Request: message to be replied not found")
    replied = dict(stored.message)
    replied.pop("reply_to_message", None)
    body["reply_to_message"] = replied
    return body


# -- files ------------------------------------------------------------------------

#: Media kinds: the field of the message, and how its object looks.
MEDIA_KINDS = ("photo", "audio", "document", "video", "animation", "voice", "video_note",
               "sticker")


def media_object(kind, file, params=None):
    """The message field for a file of this kind (``photo`` is an array)."""
    params = params or {}
    base = {"file_id": file["file_id"], "file_unique_id": file["file_unique_id"]}
    if file.get("file_size") is not None:
        base["file_size"] = file["file_size"]
    duration = int_param(params, "duration", default=0)
    if kind == "photo":
        return [dict(base, width=320, height=320)]
    if kind in ("video", "animation"):
        base.update(width=int_param(params, "width", default=320),
                    height=int_param(params, "height", default=320), duration=duration)
    elif kind in ("audio", "voice"):
        base["duration"] = duration
        for name in ("performer", "title"):
            if params.get(name):
                base[name] = str(params[name])
    elif kind == "video_note":
        base.update(length=int_param(params, "length", default=240), duration=duration)
    elif kind == "sticker":
        base.update(type="regular", width=512, height=512, is_animated=False, is_video=False)
    if kind in ("audio", "document", "video", "animation") and file.get("file_name"):
        base["file_name"] = file["file_name"]
    if kind in ("audio", "document", "video", "animation", "voice") and file.get("mime_type"):
        base["mime_type"] = file["mime_type"]
    return base


def file_param(server, params, field, kind, value=None):
    """The file a call gives for ``field`` (an upload, ``attach://name``, a
    ``file_id`` or a URL): the server's file record (a dict)."""
    value = params.get(field) if value is None else value
    if value is None or value == "":
        raise Answer(400, "Bad Request: there is no %s in the request" % kind.replace("_", " "))
    if isinstance(value, str) and value.startswith("attach://"):
        value = params.get(value[len("attach://"):])
        if not isinstance(value, Upload):
            raise Answer(400, "Bad Request: wrong file identifier/HTTP URL specified")
    if isinstance(value, Upload):
        return server._add_file(kind, value.data, value.filename, value.content_type)
    if not isinstance(value, str):
        raise Answer(400, "Bad Request: wrong file identifier/HTTP URL specified")
    if re.match(r"https?://[^\s/]+", value):
        return server._add_file(kind, None, value.rsplit("/", 1)[-1] or "file", None,
                                url=value)
    with server._lock:
        file = server._files.get(value)
    if file is None:
        raise Answer(400, "Bad Request: wrong file identifier/HTTP URL specified")
    return file


# -- message-creating methods --------------------------------------------------------

def send_message(server, params, key):
    body = formatted(params, "text", {"text": text_param(params)})
    return Contents([reply_to(server, params, key, reply_markup(params, body))])


def send_media(kind):
    def call(server, params, key):
        file = file_param(server, params, kind, kind)
        body = {kind: media_object(kind, file, params)}
        if kind == "animation":  # Telegram shows an animation as a document too
            body["document"] = media_object("document", file, params)
        if kind not in ("sticker", "video_note"):
            caption(params, body)
        return Contents([reply_to(server, params, key, reply_markup(params, body))])
    call.__name__ = "send_" + kind
    return call


_GROUPABLE = {"photo", "video", "document", "audio"}


def send_media_group(server, params, key):
    media = json_param(params, "media", list)
    if not media or not 2 <= len(media) <= 10:
        raise Answer(400, "Bad Request: wrong number of media in the group: from 2 to 10 "
                          "media are allowed")
    kinds = set()
    bodies = []
    group_id = str(server._next_id("media_group"))
    for item in media:
        kind = item.get("type") if isinstance(item, dict) else None
        if not isinstance(kind, str) or kind not in _GROUPABLE:
            raise Answer(400, "Bad Request: wrong media type in the group")
        kinds.add(kind)
        file = file_param(server, params, "media", kind, item.get("media"))
        body = caption(item, {kind: media_object(kind, file, item),
                              "media_group_id": group_id})
        bodies.append(body)
    if len(kinds) > 1 and kinds & {"document", "audio"}:
        raise Answer(400, "Bad Request: documents and audio can't be mixed with other "
                          "media types")
    if bodies:
        reply_to(server, params, key, bodies[0])
    return Contents(bodies, "messages")


def send_location(server, params, key):
    body = {"location": location(params)}
    return Contents([reply_to(server, params, key, reply_markup(params, body))])


def location(params):
    latitude, longitude = float_param(params, "latitude"), float_param(params, "longitude")
    if not (-90 <= latitude <= 90 and -180 <= longitude <= 180):
        raise Answer(400, "Bad Request: wrong coordinates")
    point = {"latitude": latitude, "longitude": longitude}
    period = int_param(params, "live_period")
    if period:
        point["live_period"] = period
    return point


def send_venue(server, params, key):
    point = location(params)
    venue = {"location": point, "title": str(params["title"]),
             "address": str(params["address"])}
    body = {"venue": venue, "location": point}
    return Contents([reply_to(server, params, key, reply_markup(params, body))])


def send_contact(server, params, key):
    contact = {"phone_number": str(params["phone_number"]),
               "first_name": str(params["first_name"])}
    if params.get("last_name"):
        contact["last_name"] = str(params["last_name"])
    body = {"contact": contact}
    return Contents([reply_to(server, params, key, reply_markup(params, body))])


def send_poll(server, params, key):
    question = str_param(params, "question", 300, "poll question")
    options = json_param(params, "options", list) or []
    texts = [o.get("text") if isinstance(o, dict) else o for o in options]
    if len(texts) < 2:
        raise Answer(400, "Bad Request: poll must have at least 2 option")
    if len(texts) > 12:
        raise Answer(400, "Bad Request: poll can't have more than 12 options")
    if not all(isinstance(t, str) and 1 <= len(t) <= 100 for t in texts):
        raise Answer(400, "Bad Request: poll options length must not exceed 100")
    kind = params.get("type") or "regular"
    if kind not in ("regular", "quiz"):
        raise Answer(400, "Bad Request: wrong poll type specified")
    poll = {"id": str(server._next_id("poll")), "question": question,
            "options": [{"text": t, "voter_count": 0, "persistent_id": str(i)}
                        for i, t in enumerate(texts)],
            "allows_revoting": True, "members_only": False,
            "total_voter_count": 0, "is_closed": bool_param(params, "is_closed"),
            "is_anonymous": params.get("is_anonymous") in (None, "") or bool_param(
                params, "is_anonymous"),
            "type": kind, "allows_multiple_answers": bool_param(params,
                                                                "allows_multiple_answers")}
    if kind == "quiz":
        correct = int_param(params, "correct_option_id")
        if correct is None or not 0 <= correct < len(texts):
            raise Answer(400, "Bad Request: wrong correct option ID specified")
        poll["correct_option_id"] = correct
    body = {"poll": poll}
    return Contents([reply_to(server, params, key, reply_markup(params, body))])


_DICE = {"🎲": 6, "🎯": 6, "🎳": 6, "🏀": 5, "⚽": 5, "🎰": 64}


def send_dice(server, params, key):
    emoji = params.get("emoji") or "🎲"
    if not isinstance(emoji, str) or emoji not in _DICE:
        raise Answer(400, "Bad Request: invalid dice emoji specified")
    with server._lock:
        value = server._rng.randint(1, _DICE[emoji])
    body = {"dice": {"emoji": emoji, "value": value}}
    return Contents([reply_to(server, params, key, reply_markup(params, body))])


#: The fields of a message that are its content (what a copy keeps).
_CONTENT = ("text", "entities", "caption", "caption_entities", "has_media_spoiler",
            "location", "venue", "contact", "poll", "dice") + MEDIA_KINDS


def _sources(server, params, single, what):
    """The messages named by ``from_chat_id`` and ``message_id(s)``."""
    source = server._chat(params, "from_chat_id")
    if single:
        ids = [int_param(params, "message_id", required=True)]
    else:
        ids = json_param(params, "message_ids", list)
        if not ids or len(ids) > 100:
            raise Answer(400, "Bad Request: message identifiers are not specified")
        ids = [int_param({"message_id": i}, "message_id") for i in ids]
        if ids != sorted(set(ids)):
            raise Answer(400, "Bad Request: message identifiers must be in a strictly "
                              "increasing order")
    with server._lock:
        found = [server._stored.get(source, {}).get(i) for i in ids]
    found = [stored.message for stored in found if stored is not None]
    if not found:
        raise Answer(400, "Bad Request: message to %s not found" % what)
    return found


def _content_of(message):
    return {k: v for k, v in message.items() if k in _CONTENT}


def copy_messages(single):
    def call(server, params, key):
        bodies = []
        for message in _sources(server, params, single, "copy"):
            body = _content_of(message)
            if single and "caption" in params:
                body.pop("caption", None)
                body.pop("caption_entities", None)
                caption(params, body)
            if single:
                reply_markup(params, body)
            bodies.append(body)
        return Contents(bodies, "message_id" if single else "message_ids")
    call.__name__ = "copy_message" if single else "copy_messages"
    return call


def forward_messages(single):
    def call(server, params, key):
        bodies = []
        for message in _sources(server, params, single, "forward"):
            origin = message.get("forward_origin") or {
                "type": "user", "sender_user": message.get("from"), "date": message["date"]}
            bodies.append(dict(_content_of(message), forward_origin=origin))
        return Contents(bodies, "message" if single else "message_ids")
    call.__name__ = "forward_message" if single else "forward_messages"
    return call


# -- edits ------------------------------------------------------------------------------

_NOT_MODIFIED = ("Bad Request: message is not modified: specified new message content and "
                 "reply markup are exactly the same as a current content and reply markup of "
                 "the message")


def edit(change, prepare=None):
    """An ``editMessage*`` method: the message (by ``chat_id`` and
    ``message_id``, or ``inline_message_id``), changed by ``change(params,
    message, prepared) -> new message`` under the lock; ``prepare(server,
    params)`` runs first, outside it (it may add a file)."""
    def call(server, params, key):
        prepared = prepare(server, params) if prepare else None
        inline = params.get("inline_message_id")
        if inline not in (None, ""):
            with server._lock:
                if str(inline) not in server._inline_messages:
                    raise Answer(400, "Bad Request: MESSAGE_ID_INVALID")
            change(params, {"inline": True}, prepared)  # validates the arguments
            with server._lock:
                server._edits.append((None, str(inline), call.__name__,
                                      params.get("text") or params.get("caption")))
            return True
        key = server._chat(params)
        message_id = int_param(params, "message_id", required=True)
        with server._lock:
            stored = server._stored.get(key, {}).get(message_id)
            if stored is None:
                raise Answer(400, "Bad Request: message to edit not found")
            if not stored.outgoing:
                raise Answer(400, "Bad Request: message can't be edited")
            new = change(params, dict(stored.message), prepared)
            new.pop("edit_date", None)
            old = dict(stored.message)
            old.pop("edit_date", None)
            if new == old:
                raise Answer(400, _NOT_MODIFIED)
            new["edit_date"] = int(time.time())
            stored.message = new
            server._edits.append((key, message_id, call.__name__,
                                  new.get("text", new.get("caption"))))
            return dict(new)
    call.__name__ = change.__name__
    return call


def _new_markup(params, message):
    message.pop("reply_markup", None)
    return reply_markup(params, message)


def edit_text(params, message, prepared):
    text = text_param(params)
    if "inline" in message:
        return message
    if "text" not in message:
        raise Answer(400, "Bad Request: there is no text in the message to edit")
    message.pop("entities", None)
    message["text"] = text
    return _new_markup(params, formatted(params, "text", message))


def edit_caption(params, message, prepared):
    if "inline" in message:
        return message
    if not any(k in message for k in MEDIA_KINDS):
        raise Answer(400, "Bad Request: there is no caption in the message to edit")
    message.pop("caption", None)
    message.pop("caption_entities", None)
    return _new_markup(params, caption(params, message))


def media_to_edit(server, params):
    media = json_param(params, "media", dict)
    kind = media.get("type") if media else None
    if kind not in ("photo", "video", "animation", "audio", "document"):
        raise Answer(400, "Bad Request: wrong media type")
    return media, kind, file_param(server, params, "media", kind, media.get("media"))


def edit_media(params, message, prepared):
    media, kind, file = prepared
    if "inline" in message:
        return message
    if not any(k in message for k in MEDIA_KINDS):
        raise Answer(400, "Bad Request: there is no media in the message to edit")
    for name in MEDIA_KINDS + ("caption", "caption_entities", "has_media_spoiler"):
        message.pop(name, None)
    message[kind] = media_object(kind, file, media)
    return _new_markup(params, caption(media, message))


def edit_reply_markup(params, message, prepared):
    return message if "inline" in message else _new_markup(params, message)


def edit_live_location(params, message, prepared):
    point = location(params)
    if "inline" in message:
        return message
    old = message.get("location")
    if not old or not old.get("live_period"):
        raise Answer(400, "Bad Request: message can't be edited")
    message["location"] = dict(old, latitude=point["latitude"], longitude=point["longitude"])
    return _new_markup(params, message)


def stop_live_location(params, message, prepared):
    if "inline" in message:
        return message
    old = message.get("location")
    if not old or not old.get("live_period"):
        raise Answer(400, "Bad Request: message can't be edited")
    message["location"] = {k: v for k, v in old.items() if k != "live_period"}
    return _new_markup(params, message)


def stop_poll(server, params, key):
    message_id = int_param(params, "message_id", required=True)
    with server._lock:
        stored = server._stored.get(key, {}).get(message_id)
        if stored is None or "poll" not in stored.message:
            raise Answer(400, "Bad Request: message with poll to stop not found")
        if not stored.outgoing:
            raise Answer(400, "Bad Request: poll can't be stopped")
        poll = stored.message["poll"]
        if poll["is_closed"]:
            raise Answer(400, "Bad Request: poll has already been closed")
        poll = dict(poll, is_closed=True)
        stored.message = _new_markup(params, dict(stored.message, poll=poll))
        return dict(poll)


# -- deletes ------------------------------------------------------------------------------

def _delete_locked(server, key, message_id):
    """Delete one message if the bot may; whether it did (under the lock)."""
    from ._telegram import chat_type
    stored = server._stored.get(key, {}).get(message_id)
    if stored is None:
        return None
    # The Bot API: a bot deletes its own messages anywhere, incoming ones
    # in private chats, and any message of a group it administers.
    kind = chat_type(key)
    if not stored.outgoing and kind != "private" and not (
            server.bot_is_admin and kind in ("group", "supergroup")):
        return False
    del server._stored[key][message_id]
    server._deleted.append((key, message_id))
    return True


def delete_message(server, params, key):
    message_id = int_param(params, "message_id", required=True)
    with server._lock:
        done = _delete_locked(server, key, message_id)
    if done is None:
        raise Answer(400, "Bad Request: message to delete not found")
    if not done:
        raise Answer(400, "Bad Request: message can't be deleted")
    return True


def delete_messages(server, params, key):
    ids = json_param(params, "message_ids", list)
    if not ids or len(ids) > 100:
        raise Answer(400, "Bad Request: message identifiers are not specified")
    ids = [int_param({"message_id": i}, "message_id") for i in ids]
    with server._lock:
        for message_id in ids:  # the ones not found or not deletable are skipped
            _delete_locked(server, key, message_id)
    return True


# -- queries ------------------------------------------------------------------------------

_QUERY_INVALID = "Bad Request: query is too old and response timeout expired or query ID is invalid"


def answer_query(kind):
    """``answerCallbackQuery``/``answerInlineQuery``: the query must have been
    pushed and not yet answered; the answer is kept for ``answer_to``."""
    def call(server, params, key):
        query_id = str(params.get("callback_query_id" if kind == "callback" else
                                  "inline_query_id"))
        answer = {k: v for k, v in params.items()}
        if kind == "callback":
            text = str_param(params, "text")
            if text is not None and len(text) > 200:
                raise Answer(400, "Bad Request: MESSAGE_TOO_LONG")
        else:
            results = json_param(params, "results", list)
            if results is None:
                raise Answer(400, 'Bad Request: parameter "results" is required')
            if len(results) > 50:
                raise Answer(400, "Bad Request: RESULTS_TOO_MUCH")
            ids = [r.get("id") if isinstance(r, dict) else None for r in results]
            for result, result_id in zip(results, ids):
                if not isinstance(result_id, str) or not 1 <= len(result_id.encode()) <= 64:
                    raise Answer(400, "Bad Request: RESULT_ID_INVALID")
                if not isinstance(result.get("type"), str):
                    raise Answer(400, "Bad Request: can't parse inline query result: Field "
                                      "\"type\" must be of type String")
            if len(set(ids)) != len(ids):
                raise Answer(400, "Bad Request: RESULT_ID_DUPLICATE")
            answer["results"] = results
        with server._lock:
            pending = server._queries.get(query_id)
            if pending is None or pending[0] != kind or pending[1] is not None:
                raise Answer(400, _QUERY_INVALID)
            server._queries[query_id] = (kind, answer)
        return True
    call.__name__ = "answer_%s_query" % kind
    return call


# -- chats and members ------------------------------------------------------------------------

def pin(server, params, key):
    message_id = int_param(params, "message_id", required=True)
    _need_rights(server, key, "manage pinned messages")
    with server._lock:
        if message_id not in server._stored.get(key, {}):
            raise Answer(400, "Bad Request: message to pin not found")
        pinned = server._pinned.setdefault(key, [])
        if message_id in pinned:
            pinned.remove(message_id)
        pinned.append(message_id)
    return True


def unpin(server, params, key):
    message_id = int_param(params, "message_id")
    _need_rights(server, key, "manage pinned messages")
    with server._lock:
        pinned = server._pinned.get(key, [])
        if message_id is None:
            if pinned:
                pinned.pop()
        elif message_id in pinned:
            pinned.remove(message_id)
        else:
            raise Answer(400, "Bad Request: message to unpin not found")
    return True


def unpin_all(server, params, key):
    _need_rights(server, key, "manage pinned messages")
    with server._lock:
        server._pinned.pop(key, None)
    return True


def _need_rights(server, key, what):
    from ._telegram import chat_type
    if chat_type(key) != "private" and not server.bot_is_admin:
        raise Answer(400, "Bad Request: not enough rights to %s in the chat" % what)


def _group_only(key, what):
    from ._telegram import chat_type
    if chat_type(key) == "private":
        raise Answer(400, "Bad Request: can't %s in private chats" % what)


def get_chat_member(server, params, key):
    user_id = int_param(params, "user_id", required=True)
    return server._member(key, user_id)


def get_chat_member_count(server, params, key):
    from ._telegram import chat_type
    with server._lock:
        members = len(server._members.get(key, {}))
    return 2 if chat_type(key) == "private" else members + 1  # and the bot


def moderate(action):
    """ban/unban/restrict/promote: the bot must be an administrator; the
    member's status changes for ``getChatMember``; recorded."""
    def call(server, params, key):
        from ._telegram import chat_type
        user_id = int_param(params, "user_id", required=True)
        if action == "restrict" and chat_type(key) != "supergroup":
            raise Answer(400, "Bad Request: method is available only for supergroups")
        _group_only(key, "%s members" % action)
        if not server.bot_is_admin:
            raise Answer(400, "Bad Request: not enough rights to %s chat member" % action)
        if user_id == server._bot()["id"]:
            raise Answer(400, "Bad Request: can't %s self" % action)
        until = int_param(params, "until_date", default=0)
        permissions = json_param(params, "permissions", dict)
        if action == "restrict" and not permissions:
            raise Answer(400, "Bad Request: invalid permissions")
        with server._lock:
            status = server._statuses.setdefault(key, {})
            if action == "ban":
                status[user_id] = ("kicked", until)
                server._members.get(key, {}).pop(user_id, None)
            elif action == "unban":
                if status.get(user_id, ("",))[0] == "kicked" or not bool_param(
                        params, "only_if_banned"):
                    status.pop(user_id, None)
            elif action == "restrict":
                status[user_id] = ("restricted", until, permissions)
                server._restrictions.append((key, user_id, until, permissions))
            else:
                status[user_id] = ("administrator", 0)
        return True
    call.__name__ = action + "_chat_member"
    return call


def get_chat_administrators(server, params, key):
    from ._telegram import _ADMIN_RIGHTS, chat_type
    if chat_type(key) == "private":
        raise Answer(400, "Bad Request: there are no administrators in the private chat")
    with server._lock:
        users = server._admins.get(key)
    if users is None:
        users = [{"id": 1, "is_bot": False, "first_name": "Owner"}]
    members = [{"status": "creator", "user": users[0], "is_anonymous": False}] + [
        dict(_ADMIN_RIGHTS, status="administrator", user=user) for user in users[1:]]
    if server.bot_is_admin and chat_type(key) != "channel":
        members.append(dict(_ADMIN_RIGHTS, status="administrator", user=server._bot()))
    return members


def send_chat_action(server, params, key):
    from ._telegram import _CHAT_ACTIONS
    action = params.get("action")
    if not isinstance(action, str) or action not in _CHAT_ACTIONS:
        raise Answer(400, "Bad Request: wrong parameter action in request")
    with server._lock:
        server._actions.append((key, action))
    return True


def set_reaction(server, params, key):
    message_id = int_param(params, "message_id", required=True)
    json_param(params, "reaction", list)
    with server._lock:
        if message_id not in server._stored.get(key, {}):
            raise Answer(400, "Bad Request: message to react not found")
    return True


def chat_setting(field, limit):
    def call(server, params, key):
        value = str_param(params, field, limit, "chat " + field)
        if field == "title" and not value:
            raise Answer(400, "Bad Request: chat title is empty")
        _group_only(key, "change chat %s" % field)
        _need_rights(server, key, "change chat " + field)
        return True
    call.__name__ = "set_chat_" + field
    return call


def export_invite_link(server, params, key):
    _group_only(key, "export invite links")
    _need_rights(server, key, "invite users")
    return "https://t.me/+fake%s" % str(server._next_id("invite")).rjust(16, "0")


def leave_chat(server, params, key):
    return True


def get_user_profile_photos(server, params, key):
    int_param(params, "user_id", required=True)
    return {"total_count": 0, "photos": []}


# -- the bot ------------------------------------------------------------------------------

_COMMAND = re.compile(r"[a-z0-9_]{1,32}")


def _scope_key(params):
    scope = json_param(params, "scope", dict) or {"type": "default"}
    return json.dumps(scope, sort_keys=True), str(params.get("language_code") or "")


def set_my_commands(server, params, key):
    commands = json_param(params, "commands", list)
    if commands is None:
        raise Answer(400, 'Bad Request: parameter "commands" is required')
    if len(commands) > 100:
        raise Answer(400, "Bad Request: too many commands specified")
    checked = []
    for command in commands:
        if not isinstance(command, dict) or not _COMMAND.fullmatch(
                str(command.get("command", "")).lower()):
            raise Answer(400, "Bad Request: BOT_COMMAND_INVALID")
        description = command.get("description")
        if not isinstance(description, str) or not 1 <= len(description) <= 256:
            raise Answer(400, "Bad Request: BOT_COMMAND_DESCRIPTION_INVALID")
        checked.append({"command": str(command["command"]).lower(),
                        "description": description})
    with server._lock:
        server._commands[_scope_key(params)] = checked
    return True


def get_my_commands(server, params, key):
    with server._lock:
        return list(server._commands.get(_scope_key(params), []))


def delete_my_commands(server, params, key):
    with server._lock:
        server._commands.pop(_scope_key(params), None)
    return True


def bot_setting(field, limit, setting):
    """``setMyName``/``getMyName`` and the like: one text per language."""
    def call(server, params, key):
        lang = str(params.get("language_code") or "")
        if setting:
            value = str_param(params, field, limit) or ""
            with server._lock:
                server._bot_settings[field, lang] = value
            return True
        with server._lock:
            value = server._bot_settings.get((field, lang), "Fake Bot" if field == "name"
                                             else "")
        return {field: value}
    call.__name__ = ("set_" if setting else "get_") + field
    return call


def get_file(server, params, key):
    with server._lock:
        file = server._files.get(str(params.get("file_id")))
    if file is None:
        raise Answer(400, "Bad Request: invalid file_id")
    return {k: v for k, v in file.items() if k in ("file_id", "file_unique_id", "file_size",
                                                   "file_path")}


def just_true(server, params, key):
    return True


def get_menu_button(server, params, key):
    return {"type": "default"}


# -- the table ----------------------------------------------------------------------------------

def _rows():
    yield Method("sendMessage", send_message, True, True)
    for kind in MEDIA_KINDS:
        yield Method("send" + "".join(p.title() for p in kind.split("_")), send_media(kind),
                     True, True)
    yield Method("sendMediaGroup", send_media_group, True, True, ("media",))
    yield Method("sendLocation", send_location, True, True, ("latitude", "longitude"))
    yield Method("sendVenue", send_venue, True, True,
                 ("latitude", "longitude", "title", "address"))
    yield Method("sendContact", send_contact, True, True, ("phone_number", "first_name"))
    yield Method("sendPoll", send_poll, True, True, ("question", "options"))
    yield Method("sendDice", send_dice, True, True)
    yield Method("copyMessage", copy_messages(True), True, True,
                 ("from_chat_id", "message_id"))
    yield Method("copyMessages", copy_messages(False), True, True,
                 ("from_chat_id", "message_ids"))
    yield Method("forwardMessage", forward_messages(True), True, True,
                 ("from_chat_id", "message_id"))
    yield Method("forwardMessages", forward_messages(False), True, True,
                 ("from_chat_id", "message_ids"))
    # edits name their chat themselves (or an inline message)
    yield Method("editMessageText", edit(edit_text), False, False, ("text",))
    yield Method("editMessageCaption", edit(edit_caption), False, False)
    yield Method("editMessageMedia", edit(edit_media, media_to_edit), False, False, ("media",))
    yield Method("editMessageReplyMarkup", edit(edit_reply_markup), False, False)
    yield Method("editMessageLiveLocation", edit(edit_live_location), False, False,
                 ("latitude", "longitude"))
    yield Method("stopMessageLiveLocation", edit(stop_live_location), False, False)
    yield Method("stopPoll", stop_poll, True, False, ("message_id",))
    yield Method("deleteMessage", delete_message, True, False, ("message_id",))
    yield Method("deleteMessages", delete_messages, True, False, ("message_ids",))
    yield Method("answerCallbackQuery", answer_query("callback"), False, False,
                 ("callback_query_id",))
    yield Method("answerInlineQuery", answer_query("inline"), False, False,
                 ("inline_query_id", "results"))
    yield Method("sendChatAction", send_chat_action, True, False, ("action",))
    yield Method("getChatAdministrators", get_chat_administrators, True, False)
    yield Method("getChatMember", get_chat_member, True, False, ("user_id",))
    yield Method("getChatMemberCount", get_chat_member_count, True, False)
    for action in ("ban", "unban", "restrict", "promote"):
        yield Method(action + "ChatMember", moderate(action), True, False, ("user_id",))
    yield Method("pinChatMessage", pin, True, False, ("message_id",))
    yield Method("unpinChatMessage", unpin, True, False)
    yield Method("unpinAllChatMessages", unpin_all, True, False)
    yield Method("setMessageReaction", set_reaction, True, False, ("message_id",))
    yield Method("setChatTitle", chat_setting("title", 128), True, False, ("title",))
    yield Method("setChatDescription", chat_setting("description", 255), True, False)
    yield Method("setChatPermissions", chat_setting("permissions", None), True, False,
                 ("permissions",))
    yield Method("exportChatInviteLink", export_invite_link, True, False)
    yield Method("leaveChat", leave_chat, True, False)
    yield Method("getUserProfilePhotos", get_user_profile_photos, False, False, ("user_id",))
    yield Method("setMyCommands", set_my_commands, False, False, ("commands",))
    yield Method("getMyCommands", get_my_commands, False, False)
    yield Method("deleteMyCommands", delete_my_commands, False, False)
    for field, limit in (("name", 64), ("description", 512), ("short_description", 120)):
        title = "".join(p.title() for p in field.split("_"))
        yield Method("setMy" + title, bot_setting(field, limit, True), False, False)
        yield Method("getMy" + title, bot_setting(field, limit, False), False, False)
    yield Method("setChatMenuButton", just_true, False, False)
    yield Method("getChatMenuButton", get_menu_button, False, False)
    yield Method("getFile", get_file, False, False, ("file_id",))
    yield Method("logOut", just_true, False, False)
    yield Method("close", just_true, False, False)


#: Every Bot API method the server implements beyond its own (``getMe``,
#: ``getChat``, ``getUpdates``, the webhook's), by lower-cased name.
METHODS: Dict[str, Method] = {row.name.lower(): row for row in _rows()}
