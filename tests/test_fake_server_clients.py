"""FakeTelegramServer as the real clients see it: python-telegram-bot, aiogram
and pyTelegramBotAPI (from the ``test`` extra), each pointed at the fake's
``base_url``, run every operation a bot meets, and each must parse every
answer and every error as it parses Telegram's: results as the library's own
objects, a flood as the library's own flood error with an integer
``retry_after``, a 502 and a dropped connection as its own errors.

The client x operation table in ``docs/telegram.md`` is this suite's result:
each test records what the library returned or raised, and the last test
fails when the table in the docs is not what this run produced.  To rewrite
the table after a change:

    FASTDISPATCH_WRITE_CLIENT_TABLE=1 bash tools/dev.sh test tests/test_fake_server_clients.py

A library that cannot be installed on this Python (the ``test`` extra's
markers: aiogram and python-telegram-bot need 3.10+, pyTelegramBotAPI 3.11+)
is skipped; one that should be installed and is not fails.
"""

import asyncio
import os
import re
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from fastdispatch.testing import FakeTelegramServer

TOKEN = "7012345678:AAF-fake_token_for_the_suite_0123456789"
BOT_ID = 7012345678
PRIVATE = 4242
SUPERGROUP = -1001234567890
GROUP = -4123  # a basic group: the kind that migrates
DOCS = Path(__file__).resolve().parent.parent / "docs" / "telegram.md"
START, END = "<!-- client-table:start -->", "<!-- client-table:end -->"

# name -> (module, the Pythons the test extra installs it on: [low, high))
CLIENTS = {
    "python-telegram-bot": ("telegram", (3, 10), (4, 0)),
    "aiogram": ("aiogram", (3, 10), (3, 15)),
    "pyTelegramBotAPI": ("telebot", (3, 11), (4, 0)),
}

OPERATIONS = [
    ("get_me", "getMe (id from the token)"),
    ("send_private", "sendMessage, private chat"),
    ("send_group", "sendMessage, supergroup"),
    ("chat_action", "sendChatAction"),
    ("edit", "editMessageText"),
    ("delete_own", "deleteMessage, the bot's own"),
    ("delete_incoming", "deleteMessage, an incoming one"),
    ("get_chat", "getChat"),
    ("admins", "getChatAdministrators"),
    ("long_poll", "getUpdates, update pushed mid-poll"),
    ("upload_photo", "sendPhoto, an upload (multipart)"),
    ("callback", "inline keyboard, callback query, answerCallbackQuery"),
    ("flood", "flood: 429 from the chat limit"),
    ("migrated", "a group that became a supergroup"),
    ("error_502", "injected 502 (Telegram's JSON)"),
    ("error_502_html", "injected 502 (a proxy's HTML page)"),
    ("drop", "connection dropped before the answer"),
]

OUTCOMES = {}  # (operation, client) -> what the library returned or raised, for the docs


def library(name):
    module, low, high = CLIENTS[name]
    if not low <= sys.version_info[:2] < high:
        pytest.skip("%s is not installed on Python %d.%d by the test extra"
                    % (name, *sys.version_info[:2]))
    __import__(module)  # should be there: an ImportError fails the test


# -- one adapter per library: the same operations, each in its library's way ------------

class AsyncClient:
    """What PTB and aiogram share: coroutines run on a loop of the test's own,
    the same method names."""

    loop: asyncio.AbstractEventLoop
    bot: Any

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def get_me(self):
        return self.run(self.bot.get_me())

    def send(self, chat, text):
        return self.run(self.bot.send_message(chat, text))

    def action(self, chat):
        return self.run(self.bot.send_chat_action(chat, "typing"))

    def delete(self, chat, message_id):
        return self.run(self.bot.delete_message(chat, message_id))

    def get_chat(self, chat):
        return self.run(self.bot.get_chat(chat))

    def admins(self, chat):
        return self.run(self.bot.get_chat_administrators(chat))


class PTB(AsyncClient):
    name = "python-telegram-bot"

    def __init__(self, base_url):
        import telegram
        import telegram.error
        from telegram.request import HTTPXRequest

        self.telegram, self.errors = telegram, telegram.error
        self.loop = asyncio.new_event_loop()
        self.bot = telegram.Bot(TOKEN, base_url=base_url + "/bot",
                                request=HTTPXRequest(connection_pool_size=4),
                                get_updates_request=HTTPXRequest(read_timeout=15))
        self.run(self.bot.initialize())

    def close(self):
        try:
            self.run(self.bot.shutdown())
        finally:
            self.loop.close()

    def edit(self, chat, message_id, text):
        return self.run(self.bot.edit_message_text(text, chat_id=chat, message_id=message_id))

    def updates(self, timeout):
        return self.run(self.bot.get_updates(timeout=timeout))

    def photo(self, chat, data):
        return self.run(self.bot.send_photo(chat, photo=data, caption="a photo"))

    def keyboard(self, chat, text, data):
        from telegram import InlineKeyboardButton, InlineKeyboardMarkup
        return self.run(self.bot.send_message(chat, text, reply_markup=InlineKeyboardMarkup(
            [[InlineKeyboardButton("Yes", callback_data=data)]])))

    def answer(self, query_id, text):
        return self.run(self.bot.answer_callback_query(query_id, text=text))

    def flood_seconds(self, exc):
        assert isinstance(exc, self.errors.RetryAfter)
        with warnings.catch_warnings():  # PTB 22.2+: "will become a timedelta"
            warnings.simplefilter("ignore")
            seconds = exc.retry_after
        return seconds if isinstance(seconds, int) else seconds.total_seconds()

    def migrated_to(self, exc):
        assert isinstance(exc, self.errors.ChatMigrated)
        return exc.new_chat_id

    def network_error(self, exc):
        return isinstance(exc, self.errors.NetworkError)


class Aiogram(AsyncClient):
    name = "aiogram"

    def __init__(self, base_url):
        import aiogram
        import aiogram.exceptions
        from aiogram.client.session.aiohttp import AiohttpSession
        from aiogram.client.telegram import TelegramAPIServer

        self.errors = aiogram.exceptions
        self.loop = asyncio.new_event_loop()

        async def make():
            return aiogram.Bot(TOKEN, session=AiohttpSession(
                api=TelegramAPIServer.from_base(base_url)))
        self.bot = self.run(make())

    def close(self):
        try:
            self.run(self.bot.session.close())
        finally:
            self.loop.close()

    def edit(self, chat, message_id, text):
        return self.run(self.bot.edit_message_text(text=text, chat_id=chat,
                                                   message_id=message_id))

    def updates(self, timeout):
        return self.run(self.bot.get_updates(timeout=timeout, request_timeout=timeout + 10))

    def photo(self, chat, data):
        from aiogram.types import BufferedInputFile
        return self.run(self.bot.send_photo(chat, BufferedInputFile(data, "photo.png"),
                                            caption="a photo"))

    def keyboard(self, chat, text, data):
        from aiogram.types import InlineKeyboardButton, InlineKeyboardMarkup
        return self.run(self.bot.send_message(chat, text, reply_markup=InlineKeyboardMarkup(
            inline_keyboard=[[InlineKeyboardButton(text="Yes", callback_data=data)]])))

    def answer(self, query_id, text):
        return self.run(self.bot.answer_callback_query(query_id, text=text))

    def flood_seconds(self, exc):
        assert isinstance(exc, self.errors.TelegramRetryAfter)
        return exc.retry_after

    def migrated_to(self, exc):
        assert isinstance(exc, self.errors.TelegramMigrateToChat)
        return exc.migrate_to_chat_id

    def network_error(self, exc):
        return isinstance(exc, (self.errors.TelegramNetworkError,
                                self.errors.TelegramServerError))


class TeleBot:
    name = "pyTelegramBotAPI"

    def __init__(self, base_url):
        import telebot
        from telebot import apihelper

        self.apihelper = apihelper
        self.saved = apihelper.API_URL
        apihelper.API_URL = base_url + "/bot{0}/{1}"  # the library's documented knob
        self.bot = telebot.TeleBot(TOKEN, threaded=False)

    def close(self):
        self.apihelper.API_URL = self.saved

    def get_me(self):
        return self.bot.get_me()

    def send(self, chat, text):
        return self.bot.send_message(chat, text)

    def action(self, chat):
        return self.bot.send_chat_action(chat, "typing")

    def edit(self, chat, message_id, text):
        return self.bot.edit_message_text(text, chat_id=chat, message_id=message_id)

    def delete(self, chat, message_id):
        return self.bot.delete_message(chat, message_id)

    def get_chat(self, chat):
        return self.bot.get_chat(chat)

    def admins(self, chat):
        return self.bot.get_chat_administrators(chat)

    def updates(self, timeout):
        return self.bot.get_updates(timeout=timeout + 10, long_polling_timeout=timeout)

    def photo(self, chat, data):
        return self.bot.send_photo(chat, data, caption="a photo")

    def keyboard(self, chat, text, data):
        from telebot import types
        markup = types.InlineKeyboardMarkup()
        markup.add(types.InlineKeyboardButton("Yes", callback_data=data))
        return self.bot.send_message(chat, text, reply_markup=markup)

    def answer(self, query_id, text):
        return self.bot.answer_callback_query(query_id, text=text)

    def flood_seconds(self, exc):
        assert isinstance(exc, self.apihelper.ApiTelegramException) and exc.error_code == 429
        return exc.result_json["parameters"]["retry_after"]

    def migrated_to(self, exc):
        assert isinstance(exc, self.apihelper.ApiTelegramException) and exc.error_code == 400
        return exc.result_json["parameters"]["migrate_to_chat_id"]

    def network_error(self, exc):
        import requests

        return isinstance(exc, (requests.exceptions.ConnectionError,
                                self.apihelper.ApiHTTPException,
                                self.apihelper.ApiTelegramException))


ADAPTERS = {a.name: a for a in (PTB, Aiogram, TeleBot)}


# -- what the result or error was, for the table -----------------------------------

def shown(value):
    """A library's result, as the table shows it: its type (and what matters)."""
    if isinstance(value, (list, tuple)):
        return "[%s]" % ", ".join(shown(v) for v in value)
    if value is True or value is False:
        return repr(value)
    return type(value).__name__


def raised(exc, **details):
    text = "raises %s" % type(exc).__name__
    if details:
        text += " (%s)" % ", ".join("%s=%s" % kv for kv in details.items())
    return text


def failure(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - any library error is what is checked
        return exc
    raise AssertionError("no exception")


def check_message(message, chat, text, chat_type):
    assert message.message_id >= 1 and message.text == text
    assert message.chat.id == chat and message.chat.type == chat_type
    assert message.from_user.id == BOT_ID and message.from_user.is_bot


# -- the operations -----------------------------------------------------------------

def op_get_me(client, server):
    me = client.get_me()
    assert me.id == BOT_ID and me.is_bot and me.username
    return "%s (id: the token's)" % shown(me)


def op_send_private(client, server):
    message = client.send(PRIVATE, "hello")
    check_message(message, PRIVATE, "hello", "private")
    assert [m.text for m in server.messages(PRIVATE)] == ["hello"]
    return shown(message)


def op_send_group(client, server):
    message = client.send(SUPERGROUP, "hello group")
    check_message(message, SUPERGROUP, "hello group", "supergroup")
    return shown(message)


def op_chat_action(client, server):
    result = client.action(PRIVATE)
    assert result is True and server.chat_actions == [(str(PRIVATE), "typing")]
    return shown(result)


def op_edit(client, server):
    sent = client.send(PRIVATE, "draft")
    edited = client.edit(PRIVATE, sent.message_id, "final")
    check_message(edited, PRIVATE, "final", "private")
    assert edited.message_id == sent.message_id and edited.edit_date
    assert server.edits == [(str(PRIVATE), sent.message_id, "final")]
    return shown(edited)


def op_delete_own(client, server):
    sent = client.send(SUPERGROUP, "oops")
    assert client.delete(SUPERGROUP, sent.message_id) is True
    assert server.deleted == [(str(SUPERGROUP), sent.message_id)]
    return "True"


def op_delete_incoming(client, server):
    update = server.update(server.push_message(PRIVATE, "spam"))
    message_id = update["message"]["message_id"]
    assert client.delete(PRIVATE, message_id) is True
    assert server.deleted == [(str(PRIVATE), message_id)]
    return "True"


def op_get_chat(client, server):
    chat = client.get_chat(SUPERGROUP)
    assert chat.id == SUPERGROUP and chat.type == "supergroup"
    return shown(chat)


def op_admins(client, server):
    server.set_chat_administrators(SUPERGROUP, [{"id": 10, "first_name": "Owner"},
                                                {"id": 11, "first_name": "Admin"}])
    members = client.admins(SUPERGROUP)
    assert [m.user.id for m in members] == [10, 11, BOT_ID]
    assert [m.status for m in members] == ["creator", "administrator", "administrator"]
    assert members[1].can_delete_messages is True and members[0].is_anonymous is False
    return shown(members)


def op_long_poll(client, server):
    pusher = threading.Timer(0.5, server.push_message, args=(PRIVATE, "late"))
    pusher.start()
    t0 = time.monotonic()
    try:
        updates = client.updates(10)
    finally:
        pusher.join()
    took = time.monotonic() - t0
    assert len(updates) == 1 and updates[0].message.text == "late"
    assert updates[0].message.chat.id == PRIVATE
    assert 0.4 <= took < 8, took  # it waited for the update, not for the timeout
    return "%s, returned when the update came" % shown(updates)


def op_upload_photo(client, server):
    data = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40  # 10 KiB, every byte value
    message = client.photo(PRIVATE, data)
    assert message.caption == "a photo" and message.from_user.id == BOT_ID
    assert message.photo[-1].file_size == len(data)
    assert server.file_data(message.photo[-1].file_id) == data  # arrived whole
    assert [m.kind for m in server.messages(PRIVATE)] == ["photo"]
    client.send(PRIVATE, "after")  # the keep-alive connection is still good
    return shown(message)


def op_callback(client, server):
    sent = client.keyboard(PRIVATE, "Sure?", "yes")
    update_id = server.push_callback_query(PRIVATE, sent.message_id, "yes")
    updates = client.updates(1)
    query = updates[-1].callback_query
    assert query.data == "yes" and query.message.message_id == sent.message_id
    assert query.from_user.id == PRIVATE
    result = client.answer(query.id, "Done")
    assert result is True and server.answer_to(update_id)["text"] == "Done"
    return shown(result)


def op_flood(client, server):
    server.chat_limit = None
    with FakeTelegramServer(chat_limit=(1, 30.0)) as limited:
        limited_client = ADAPTERS[client.name](limited.base_url)
        try:
            limited_client.send(PRIVATE, "one")
            exc = failure(limited_client.send, PRIVATE, "two")
        finally:
            limited_client.close()
    seconds = limited_client.flood_seconds(exc)
    assert seconds == 30 and isinstance(seconds, int), seconds
    return raised(exc, retry_after=seconds)


def op_migrated(client, server):
    new = server.migrate_chat(GROUP)
    exc = failure(client.send, GROUP, "hi")
    assert client.migrated_to(exc) == new
    return raised(exc, migrate_to_chat_id="the supergroup")


def op_error_502(client, server):
    server.inject("error", status=502)
    exc = failure(client.send, PRIVATE, "x")
    assert client.network_error(exc), exc
    assert server.messages(PRIVATE) == []
    return raised(exc)


def op_error_502_html(client, server):
    server.inject("error", status=502, html=True)
    exc = failure(client.send, PRIVATE, "x")
    return raised(exc)


def op_drop(client, server):
    server.inject("drop")
    exc = failure(client.send, PRIVATE, "x")
    assert client.network_error(exc), exc
    assert server.messages(PRIVATE) == []
    return raised(exc)


# PTB 22.2+ warns that RetryAfter.retry_after will become a timedelta.
@pytest.mark.filterwarnings("ignore:Deprecated since version v22.2")
@pytest.mark.parametrize("op", [op for op, _ in OPERATIONS])
@pytest.mark.parametrize("name", list(CLIENTS))
def test_the_real_client_runs_the_operation_against_the_fake(name, op):
    library(name)
    with FakeTelegramServer() as server:
        client = ADAPTERS[name](server.base_url)
        try:
            outcome = globals()["op_" + op](client, server)
        finally:
            client.close()
        assert server.stats().get("status_500", 0) == 0  # no error of the fake's own
    OUTCOMES[op, name] = outcome


# -- the table in docs/telegram.md ----------------------------------------------------

def render_table(outcomes):
    names = list(CLIENTS)
    lines = ["| operation | %s |" % " | ".join(names), "|---|%s" % ("---|" * len(names))]
    for op, title in OPERATIONS:
        cells = [outcomes[op, name].replace("|", "\\|") for name in names]
        lines.append("| %s | %s |" % (title, " | ".join("`%s`" % c if not c.startswith(
            "raises ") else "raises `%s`" % c[len("raises "):] for c in cells)))
    return "\n".join(lines)


def test_the_docs_table_is_this_suites_result():
    wanted = {(op, name) for op, _ in OPERATIONS for name in CLIENTS}
    if set(OUTCOMES) != wanted:
        pytest.skip("not every client x operation ran in this session (%d of %d)"
                    % (len(OUTCOMES), len(wanted)))
    table = render_table(OUTCOMES)
    text = DOCS.read_text(encoding="utf-8")
    match = re.search(re.escape(START) + r"\n(.*?)" + re.escape(END), text, re.S)
    assert match, "docs/telegram.md has no %s ... %s block" % (START, END)
    table += "\n"
    if os.environ.get("FASTDISPATCH_WRITE_CLIENT_TABLE") == "1":
        DOCS.write_text(text[:match.start(1)] + table + text[match.end(1):], encoding="utf-8")
        return
    assert match.group(1) == table, (
        "docs/telegram.md's client table is stale; rewrite it with "
        "FASTDISPATCH_WRITE_CLIENT_TABLE=1 pytest tests/test_fake_server_clients.py")
