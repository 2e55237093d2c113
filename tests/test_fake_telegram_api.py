"""FakeTelegramServer's Bot API over plain HTTP: the methods a bot calls, each
validated the way the Bot API validates it (required fields, Telegram's
descriptions, message ids per chat); which requests count against the message
limits; files given the three ways and downloaded; and what users do, pushed
as updates (commands with their entities, callback and inline queries and the
bot's answers to them, edited messages, media, members joining).

One server for the module (reset before each test): no test here depends on
timing.
"""

import http.client
import json
import re
import uuid
from pathlib import Path

import pytest

from fastdispatch.testing import FakeTelegramServer
from fastdispatch.testing._telegram import METHODS

PRIVATE, SUPERGROUP, GROUP = 42, -1001234567890, -4123


@pytest.fixture(scope="module")
def server():
    with FakeTelegramServer() as s:
        yield s


@pytest.fixture(autouse=True)
def fresh(server):
    server.reset()


def call(server, method, params=None, files=None, token="7:x"):
    """(status, answer) of one Bot API call: JSON, or multipart with ``files``."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        if files:
            boundary = uuid.uuid4().hex
            body = b""
            for name, value in (params or {}).items():
                value = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
                body += (b"--%s\r\nContent-Disposition: form-data; name=\"%s\"\r\n\r\n%s\r\n"
                         % (boundary.encode(), name.encode(), value.encode()))
            for name, (filename, data) in files.items():
                body += (b"--%s\r\nContent-Disposition: form-data; name=\"%s\"; "
                         b"filename=\"%s\"\r\nContent-Type: image/png\r\n\r\n%s\r\n"
                         % (boundary.encode(), name.encode(), filename.encode(), data))
            body += b"--%s--\r\n" % boundary.encode()
            headers = {"Content-Type": "multipart/form-data; boundary=" + boundary}
        else:
            body = json.dumps(params or {}).encode()
            headers = {"Content-Type": "application/json"}
        conn.request("POST", "/bot%s/%s" % (token, method), body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def ok(server, method, params=None, files=None):
    status, answer = call(server, method, params, files)
    assert status == 200 and answer["ok"], answer
    return answer["result"]


def error(server, method, params=None, files=None):
    status, answer = call(server, method, params, files)
    assert status >= 400 and not answer["ok"], answer
    return answer["description"]


KEYBOARD = {"inline_keyboard": [[{"text": "Yes", "callback_data": "yes"},
                                 {"text": "Docs", "url": "https://core.telegram.org"}]]}


# -- validation ----------------------------------------------------------------------

@pytest.mark.parametrize("method, params, description", [
    ("sendPhoto", {"chat_id": PRIVATE}, "Bad Request: there is no photo in the request"),
    ("sendDocument", {"chat_id": PRIVATE, "document": "nonsense"},
     "Bad Request: wrong file identifier/HTTP URL specified"),
    ("sendLocation", {"chat_id": PRIVATE, "latitude": 1},
     'Bad Request: parameter "longitude" is required'),
    ("sendLocation", {"chat_id": PRIVATE, "latitude": 91, "longitude": 0},
     "Bad Request: wrong coordinates"),
    ("sendPoll", {"chat_id": PRIVATE, "question": "?", "options": ["one"]},
     "Bad Request: poll must have at least 2 option"),
    ("sendDice", {"chat_id": PRIVATE, "emoji": "x"}, "Bad Request: invalid dice emoji specified"),
    ("sendMediaGroup", {"chat_id": PRIVATE, "media": [{"type": "photo", "media": "x"}]},
     "Bad Request: wrong number of media in the group: from 2 to 10 media are allowed"),
    ("sendMessage", {"chat_id": PRIVATE, "text": "x", "reply_markup": {"inline_keyboard": [
        [{"text": "only text"}]]}},
     "Bad Request: can't parse inline keyboard button: Text buttons are unallowed in the "
     "inline keyboard"),
    ("sendMessage", {"chat_id": PRIVATE, "text": "x", "reply_markup": {"inline_keyboard": [
        [{"text": "t", "callback_data": "x" * 65}]]}}, "Bad Request: BUTTON_DATA_INVALID"),
    ("sendMessage", {"chat_id": PRIVATE, "text": "x", "parse_mode": "rtf"},
     "Bad Request: unsupported parse_mode"),
    ("sendMessage", {"chat_id": PRIVATE, "text": "x", "reply_parameters": {"message_id": 99}},
     "Bad Request: message to be replied not found"),
    ("copyMessage", {"chat_id": PRIVATE, "from_chat_id": PRIVATE, "message_id": 99},
     "Bad Request: message to copy not found"),
    ("forwardMessage", {"chat_id": PRIVATE, "from_chat_id": 7, "message_id": 1},
     "Bad Request: message to forward not found"),
    ("editMessageCaption", {"chat_id": PRIVATE, "message_id": 1, "caption": "c"},
     "Bad Request: message to edit not found"),
    ("editMessageText", {"inline_message_id": "nope", "text": "t"},
     "Bad Request: MESSAGE_ID_INVALID"),
    ("answerCallbackQuery", {"callback_query_id": "123"},
     "Bad Request: query is too old and response timeout expired or query ID is invalid"),
    ("answerCallbackQuery", {}, 'Bad Request: parameter "callback_query_id" is required'),
    ("setMyCommands", {"commands": [{"command": "Bad Command!", "description": "d"}]},
     "Bad Request: BOT_COMMAND_INVALID"),
    ("getFile", {"file_id": "nope"}, "Bad Request: invalid file_id"),
    ("pinChatMessage", {"chat_id": PRIVATE, "message_id": 5},
     "Bad Request: message to pin not found"),
    ("banChatMember", {"chat_id": PRIVATE, "user_id": 5},
     "Bad Request: can't ban members in private chats"),
])
def test_bad_calls_are_answered_with_telegrams_descriptions(server, method, params,
                                                            description):
    assert error(server, method, params) == description
    assert server.all_messages() == []  # nothing was created


def test_message_ids_count_per_chat_across_every_kind_of_message(server):
    a = ok(server, "sendMessage", {"chat_id": PRIVATE, "text": "a"})
    server.push_message(PRIVATE, "hi")
    b = ok(server, "sendDice", {"chat_id": PRIVATE})
    c = ok(server, "sendMessage", {"chat_id": 43, "text": "other chat"})
    assert (a["message_id"], b["message_id"], c["message_id"]) == (1, 3, 1)
    assert b["dice"]["emoji"] == "🎲" and 1 <= b["dice"]["value"] <= 6
    assert [m.kind for m in server.messages(PRIVATE)] == ["text", "dice"]


# -- which requests count against the limits ----------------------------------------------

def test_requests_that_create_messages_count_once_and_others_do_not():
    with FakeTelegramServer(group_limit=(1, 60.0)) as server:
        requests_that_create_messages_count_once_and_others_do_not(server)


def requests_that_create_messages_count_once_and_others_do_not(server):
    group = ok(server, "sendMediaGroup", {"chat_id": SUPERGROUP, "media": [
        {"type": "photo", "media": "https://example.org/a.jpg"},
        {"type": "photo", "media": "https://example.org/b.jpg", "caption": "two"}]})
    assert [m["message_id"] for m in group] == [1, 2]  # two messages, one request
    assert group[0]["media_group_id"] == group[1]["media_group_id"]
    # edits, actions, pins, getters, deletes: no limit
    ok(server, "editMessageCaption", {"chat_id": SUPERGROUP, "message_id": 2, "caption": "2"})
    ok(server, "sendChatAction", {"chat_id": SUPERGROUP, "action": "typing"})
    ok(server, "pinChatMessage", {"chat_id": SUPERGROUP, "message_id": 1})
    ok(server, "getChatMember", {"chat_id": SUPERGROUP, "user_id": 5})
    ok(server, "deleteMessage", {"chat_id": SUPERGROUP, "message_id": 2})
    # another message does count: the group's minute is used up
    status, answer = call(server, "sendMessage", {"chat_id": SUPERGROUP, "text": "more"})
    assert status == 429 and answer["parameters"]["retry_after"] >= 59
    status, _ = call(server, "copyMessage", {"chat_id": SUPERGROUP,
                                             "from_chat_id": SUPERGROUP, "message_id": 1})
    assert status == 429
    assert server.stats()["too_many_group"] == 2
    assert server.pinned(SUPERGROUP) == [1]


# -- files -------------------------------------------------------------------------------------

def test_a_file_given_three_ways_and_downloaded_after_get_file(server):
    uploaded = ok(server, "sendPhoto", {"chat_id": PRIVATE, "caption": "up"},
                  files={"photo": ("cat.png", b"\x89PNG cat")})
    file_id = uploaded["photo"][-1]["file_id"]
    assert uploaded["caption"] == "up" and uploaded["photo"][-1]["file_size"] == 8
    again = ok(server, "sendPhoto", {"chat_id": PRIVATE, "photo": file_id})
    assert again["photo"][-1]["file_id"] == file_id
    by_url = ok(server, "sendDocument", {"chat_id": PRIVATE,
                                         "document": "https://example.org/r.pdf"})
    assert by_url["document"]["file_name"] == "r.pdf"
    file = ok(server, "getFile", {"file_id": file_id})
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/file/bot7%3Ax/" + file["file_path"])  # clients quote the ':'
    assert conn.getresponse().read() == b"\x89PNG cat"
    url_file = ok(server, "getFile", {"file_id": by_url["document"]["file_id"]})
    conn.request("GET", "/file/bot7:x/" + url_file["file_path"])
    assert conn.getresponse().status == 404  # the fake fetches no URL
    conn.close()


def test_a_media_group_takes_uploads_by_attach_name(server):
    result = ok(server, "sendMediaGroup", {"chat_id": PRIVATE, "media": [
        {"type": "document", "media": "attach://one"},
        {"type": "document", "media": "attach://two", "caption": "second"}]},
        files={"one": ("1.txt", b"1"), "two": ("2.txt", b"22")})
    assert [m["document"]["file_size"] for m in result] == [1, 2]
    assert server.file_data(result[1]["document"]["file_id"]) == b"22"
    assert error(server, "sendMediaGroup", {"chat_id": 43, "media": [
        {"type": "document", "media": "attach://one"},
        {"type": "photo", "media": "attach://two"}]},
        files={"one": ("1.txt", b"1"), "two": ("2.txt", b"22")}) == (
        "Bad Request: documents and audio can't be mixed with other media types")


# -- copies, forwards, edits, deletes ------------------------------------------------------------

def test_copy_and_forward_keep_the_content_and_say_where_it_came_from(server):
    update = server.push_message(PRIVATE, "original words")
    message_id = server.update(update)["message"]["message_id"]
    copied = ok(server, "copyMessage", {"chat_id": 43, "from_chat_id": PRIVATE,
                                        "message_id": message_id})
    assert copied == {"message_id": 1}
    forwarded = ok(server, "forwardMessage", {"chat_id": 44, "from_chat_id": PRIVATE,
                                              "message_id": message_id})
    assert forwarded["text"] == "original words"
    assert forwarded["forward_origin"]["sender_user"]["id"] == PRIVATE
    assert [m.text for m in server.messages(43)] == ["original words"]


def test_every_edit_changes_the_message_and_an_unchanged_one_is_refused(server):
    sent = ok(server, "sendMessage", {"chat_id": PRIVATE, "text": "v1", "reply_markup": KEYBOARD})
    assert sent["reply_markup"] == KEYBOARD
    mid = sent["message_id"]
    edited = ok(server, "editMessageText", {"chat_id": PRIVATE, "message_id": mid, "text": "v2"})
    assert edited["text"] == "v2" and "reply_markup" not in edited  # Telegram drops it
    assert error(server, "editMessageText", {"chat_id": PRIVATE, "message_id": mid,
                                             "text": "v2"}).startswith(
        "Bad Request: message is not modified")
    marked = ok(server, "editMessageReplyMarkup", {"chat_id": PRIVATE, "message_id": mid,
                                                   "reply_markup": KEYBOARD})
    assert marked["reply_markup"] == KEYBOARD
    assert error(server, "editMessageCaption", {"chat_id": PRIVATE, "message_id": mid,
                                                "caption": "c"}) == (
        "Bad Request: there is no caption in the message to edit")
    server.reset()
    photo = ok(server, "sendPhoto", {"chat_id": PRIVATE, "photo": "https://e.org/p.jpg"})
    media = ok(server, "editMessageMedia", {"chat_id": PRIVATE,
                                            "message_id": photo["message_id"],
                                            "media": {"type": "document",
                                                      "media": "https://e.org/d.pdf",
                                                      "caption": "now a document"}})
    assert "photo" not in media and media["caption"] == "now a document"
    server.reset()
    live = ok(server, "sendLocation", {"chat_id": PRIVATE, "latitude": 1, "longitude": 2,
                                       "live_period": 60})
    moved = ok(server, "editMessageLiveLocation", {"chat_id": PRIVATE, "latitude": 3,
                                                   "longitude": 4,
                                                   "message_id": live["message_id"]})
    assert moved["location"]["latitude"] == 3
    stopped = ok(server, "stopMessageLiveLocation", {"chat_id": PRIVATE,
                                                     "message_id": live["message_id"]})
    assert "live_period" not in stopped["location"]
    server.reset()
    poll = ok(server, "sendPoll", {"chat_id": PRIVATE, "question": "?", "options": ["a", "b"]})
    assert ok(server, "stopPoll", {"chat_id": PRIVATE,
                                   "message_id": poll["message_id"]})["is_closed"] is True


def test_delete_messages_skips_what_it_cannot_find(server):
    for _ in range(3):
        ok(server, "sendDice", {"chat_id": PRIVATE})
    assert ok(server, "deleteMessages", {"chat_id": PRIVATE, "message_ids": [1, 3, 99]})
    assert server.deleted == [(str(PRIVATE), 1), (str(PRIVATE), 3)]


# -- members, pins, commands -----------------------------------------------------------------------

def test_moderation_changes_what_get_chat_member_answers(server):
    def status(user):
        return ok(server, "getChatMember", {"chat_id": SUPERGROUP, "user_id": user})["status"]

    server.push_member_joined(SUPERGROUP, 77, first_name="Joe")
    assert status(77) == "member" and status(7) == "administrator"  # 7: the bot (its token)
    assert ok(server, "getChatMemberCount", {"chat_id": SUPERGROUP}) == 2
    ok(server, "restrictChatMember", {"chat_id": SUPERGROUP, "user_id": 77,
                                      "permissions": {"can_send_messages": False}})
    assert status(77) == "restricted"
    ok(server, "banChatMember", {"chat_id": SUPERGROUP, "user_id": 77})
    assert status(77) == "kicked"
    ok(server, "unbanChatMember", {"chat_id": SUPERGROUP, "user_id": 77})
    assert status(77) == "member"
    ok(server, "promoteChatMember", {"chat_id": SUPERGROUP, "user_id": 77})
    assert status(77) == "administrator"


def test_commands_are_kept_per_scope_and_language(server):
    commands = [{"command": "start", "description": "Start"}]
    assert ok(server, "setMyCommands", {"commands": commands}) is True
    ok(server, "setMyCommands", {"commands": [{"command": "hilfe", "description": "Hilfe"}],
                                 "language_code": "de"})
    assert ok(server, "getMyCommands") == commands == server.commands()
    assert ok(server, "getMyCommands", {"language_code": "de"})[0]["command"] == "hilfe"
    ok(server, "deleteMyCommands")
    assert ok(server, "getMyCommands") == []


def test_an_unknown_method_is_still_404_not_found(server):
    assert call(server, "sendInvoice", {"chat_id": PRIVATE}) == (
        404, {"ok": False, "error_code": 404, "description": "Not Found"})


# -- what users do ------------------------------------------------------------------------------------

def test_a_pushed_command_carries_its_bot_command_entity(server):
    update = server.update(server.push_message(PRIVATE, "/start@fake_7_bot deep-link"))
    assert update["message"]["entities"] == [{"type": "bot_command", "offset": 0,
                                              "length": 17}]
    plain = server.update(server.push_message(PRIVATE, "no /command here"))
    assert "entities" not in plain["message"]


def test_a_callback_query_comes_from_a_button_the_bot_sent_and_is_answered_once(server):
    sent = ok(server, "sendMessage", {"chat_id": PRIVATE, "text": "Sure?",
                                      "reply_markup": KEYBOARD})
    with pytest.raises(ValueError, match="no button"):
        server.push_callback_query(PRIVATE, sent["message_id"], "no")
    update_id = server.push_callback_query(PRIVATE, sent["message_id"], "yes")
    query = server.update(update_id)["callback_query"]
    assert query["message"]["message_id"] == sent["message_id"] and query["data"] == "yes"
    assert server.answer_to(update_id) is None
    ok(server, "answerCallbackQuery", {"callback_query_id": query["id"], "text": "Done"})
    assert server.answer_to(update_id)["text"] == "Done"
    assert error(server, "answerCallbackQuery", {"callback_query_id": query["id"]}).startswith(
        "Bad Request: query is too old")


def test_an_inline_query_and_the_chosen_result(server):
    update_id = server.push_inline_query("cats")
    query = server.update(update_id)["inline_query"]
    result = {"type": "article", "id": "r1", "title": "Cats",
              "input_message_content": {"message_text": "cats!"}}
    assert error(server, "answerInlineQuery", {"inline_query_id": query["id"],
                                               "results": [result, result]}) == (
        "Bad Request: RESULT_ID_DUPLICATE")
    ok(server, "answerInlineQuery", {"inline_query_id": query["id"], "results": [result]})
    assert server.answer_to(update_id)["results"] == [result]
    chosen = server.update(server.push_chosen_inline_result("r1", "cats"))
    inline_id = chosen["chosen_inline_result"]["inline_message_id"]
    assert ok(server, "editMessageText", {"inline_message_id": inline_id, "text": "more"}) is True
    assert server.edits == [(None, inline_id, "more")]


def test_edited_messages_media_and_members_joining_are_pushed(server):
    first = server.update(server.push_message(PRIVATE, "typo"))["message"]
    edited = server.update(server.push_edited_message(PRIVATE, first["message_id"], "fixed"))
    assert edited["edited_message"]["text"] == "fixed"
    assert edited["edited_message"]["message_id"] == first["message_id"]
    photo = server.update(server.push_media(PRIVATE, "photo", b"img", caption="look"))
    file_id = photo["message"]["photo"][-1]["file_id"]
    assert photo["message"]["caption"] == "look"
    path = ok(server, "getFile", {"file_id": file_id})["file_path"]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/file/bot7:x/" + path)
    assert conn.getresponse().read() == b"img"
    conn.close()
    # the bot can send the user's file on by its id
    assert ok(server, "sendPhoto", {"chat_id": 43, "photo": file_id})["photo"][-1][
        "file_id"] == file_id
    joined = server.update(server.push_member_joined(SUPERGROUP, 99, first_name="Ann"))
    assert joined["message"]["new_chat_members"][0]["id"] == 99
    with pytest.raises(ValueError):
        server.push_member_joined(PRIVATE, 99)


def test_calls_lists_what_the_bot_did(server):
    ok(server, "sendChatAction", {"chat_id": PRIVATE, "action": "typing"})
    ok(server, "sendMessage", {"chat_id": PRIVATE, "text": "hi"})
    assert [(c["method"], c["chat_id"]) for c in server.calls()] == [
        ("sendChatAction", str(PRIVATE)), ("sendMessage", str(PRIVATE))]
    assert server.calls("SENDMESSAGE")[0]["params"]["text"] == "hi"


def test_the_docs_methods_table_names_every_method_implemented():
    text = (Path(__file__).resolve().parent.parent / "docs" / "telegram.md").read_text(
        encoding="utf-8")
    table = text.split("<!-- methods-table:start -->")[1].split("<!-- methods-table:end -->")[0]
    named = set()
    for line in table.splitlines()[2:]:
        named.update(re.findall(r"`([a-zA-Z]+)`", line.split("|")[1]))
    assert named == set(METHODS)


HOSTILE = [None, "", "x", "-1", -1, 0, "9" * 40, 10 ** 30, 1e308, True, [], {}, [1, "a"],
           {"a": [{}]}, "attach://nothing", "https://", "²"]


def test_no_value_in_any_parameter_of_any_method_makes_the_server_fail(server):
    # every method, every parameter it reads, every hostile value: Telegram's
    # 4xx or a result, never a 500 (an exception in the server)
    names = ["chat_id", "from_chat_id", "message_id", "message_ids", "text", "caption",
             "photo", "document", "media", "latitude", "longitude", "options", "question",
             "reply_markup", "reply_parameters", "results", "callback_query_id",
             "inline_query_id", "user_id", "permissions", "commands", "scope", "file_id",
             "action", "emoji", "inline_message_id", "type", "correct_option_id",
             "parse_mode", "entities", "live_period", "duration", "title", "address",
             "phone_number", "first_name", "until_date", "language_code", "offset", "timeout"]
    sent = ok(server, "sendMessage", {"chat_id": PRIVATE, "text": "target",
                                      "reply_markup": KEYBOARD})
    for method in METHODS:
        if method in ("getUpdates", "setWebhook", "close", "logOut"):
            continue  # a long poll, a webhook delivery: their own tests
        for value in HOSTILE:
            params = {name: value for name in names}
            params.update(chat_id=PRIVATE, message_id=sent["message_id"])
            status, _ = call(server, method, params)
            assert status in (200, 400), (method, value, status)
            status, _ = call(server, method, {name: value for name in names})
            assert status in (200, 400), (method, value, status)
    assert server.stats().get("status_500", 0) == 0
