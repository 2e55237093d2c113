"""The frameworks' own kinds of example bots against the stock FakeTelegramServer,
each with fastdispatch's one line (python-telegram-bot's ``rate_limiter``,
aiogram's session middleware, pyTelegramBotAPI's ``CUSTOM_REQUEST_SENDER``).

One bot per library does what those libraries' ``examples/`` do, in the
library's own way: echo, an inline keyboard whose button is answered
(``answerCallbackQuery``) and edits its message, an inline query answered
with an article, a media group and a photo uploaded, a timer (PTB's
JobQueue, an asyncio task, a ``threading.Timer``), and a conversation
(PTB's ``ConversationHandler``, aiogram's FSM, telebot's next-step
handlers).  A user (the server's ``push_*``) does each in turn, waiting for
the bot's answer in the server's record before the next: every update must
be answered, in order, with nothing raised in the bot (each library's error
hook records what would be) and no error answer from the server.
"""

import asyncio
import sys
import threading

import pytest

from fastdispatch import Pacing, RateLimit, RetryPolicy
from fastdispatch.testing import FakeTelegramServer

from helpers import wait_until

TOKEN = "7012345678:AAF-fake_token_for_the_examples_0123"
CHAT = 4242
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8

# what the user sees in the chat, in order: (kind, text or caption)
EXPECTED = [("text", "Choose:"), ("photo", "one"), ("photo", "two"), ("photo", "single"),
            ("text", "Timer set"), ("text", "Beep!"), ("text", "Your name?"),
            ("text", "How old are you?"), ("text", "Ann, 30"), ("text", "echo me")]

LIBRARIES = {"python-telegram-bot": ("telegram", (3, 10)), "aiogram": ("aiogram", (3, 10)),
             "pyTelegramBotAPI": ("telebot", (3, 11))}


def user_session(server):
    """What a user does, one step at a time, each after the bot's answer."""
    record = lambda: server.messages(CHAT)  # noqa: E731

    def say(text, answers):
        before = len(record())
        server.push_message(CHAT, text)
        wait_until(lambda: len(record()) >= before + answers,
                   what="%r: %d answers" % (text, answers))

    say("/start", 1)
    keyboard = record()[0]
    pressed = server.push_callback_query(CHAT, keyboard.message_id, "A")
    wait_until(lambda: server.answer_to(pressed) is not None and server.edits,
               what="the button's answer and edit")
    asked = server.push_inline_query("hello")
    wait_until(lambda: server.answer_to(asked) is not None, what="the inline query's answer")
    say("/album", 3)
    say("/timer", 2)
    say("/survey", 1)
    say("Ann", 1)
    say("30", 1)
    say("echo me", 1)
    return keyboard.message_id, pressed, asked


def check(server, errors, outcome):
    keyboard_id, pressed, asked = outcome
    assert errors == []
    assert [(m.kind, m.text) for m in server.messages(CHAT)] == EXPECTED
    assert server.answer_to(pressed)["text"] == "Chose A"
    assert server.edits == [(str(CHAT), keyboard_id, "You chose A")]
    assert [r["id"] for r in server.answer_to(asked)["results"]] == ["hello-1"]
    stats = server.stats()
    assert not [k for k in stats if k.startswith("status_")], stats


# -- python-telegram-bot -------------------------------------------------------------------

def ptb_bot(server, dispatcher, errors, stop, started):
    from telegram import (InlineKeyboardButton, InlineKeyboardMarkup, InlineQueryResultArticle,
                          InputMediaPhoto, InputTextMessageContent)
    from telegram.ext import (ApplicationBuilder, CallbackQueryHandler, CommandHandler,
                              ConversationHandler, InlineQueryHandler, MessageHandler, filters)

    from fastdispatch.integrations.ptb import DispatcherRateLimiter

    async def start(update, context):
        await update.message.reply_text("Choose:", reply_markup=InlineKeyboardMarkup(
            [[InlineKeyboardButton("A", callback_data="A"),
              InlineKeyboardButton("B", callback_data="B")]]))

    async def button(update, context):
        query = update.callback_query
        await query.answer("Chose " + query.data)
        await query.edit_message_text("You chose " + query.data)

    async def inline(update, context):
        text = update.inline_query.query
        await update.inline_query.answer([InlineQueryResultArticle(
            text + "-1", text.upper(), InputTextMessageContent(text.upper()))])

    async def album(update, context):
        await update.message.reply_media_group([InputMediaPhoto(PNG, caption="one"),
                                                InputMediaPhoto(PNG, caption="two")])
        await update.message.reply_photo(PNG, caption="single")

    async def beep(context):
        await context.bot.send_message(context.job.chat_id, "Beep!")

    async def timer(update, context):
        context.job_queue.run_once(beep, 0.1, chat_id=update.effective_chat.id)
        await update.message.reply_text("Timer set")

    async def survey(update, context):
        await update.message.reply_text("Your name?")
        return 0

    async def name(update, context):
        context.user_data["name"] = update.message.text
        await update.message.reply_text("How old are you?")
        return 1

    async def age(update, context):
        await update.message.reply_text("%s, %s" % (context.user_data["name"],
                                                    update.message.text))
        return ConversationHandler.END

    async def echo(update, context):
        await update.message.reply_text(update.message.text)

    async def on_error(update, context):
        errors.append(context.error)

    async def main():
        app = (ApplicationBuilder().token(TOKEN).base_url(server.base_url + "/bot")
               .rate_limiter(DispatcherRateLimiter(dispatcher))           # the one line
               .build())
        text = filters.TEXT & ~filters.COMMAND
        app.add_handler(CommandHandler("start", start))
        app.add_handler(CallbackQueryHandler(button))
        app.add_handler(InlineQueryHandler(inline))
        app.add_handler(CommandHandler("album", album))
        app.add_handler(CommandHandler("timer", timer))
        app.add_handler(ConversationHandler(
            entry_points=[CommandHandler("survey", survey)],
            states={0: [MessageHandler(text, name)], 1: [MessageHandler(text, age)]},
            fallbacks=[]))
        app.add_handler(MessageHandler(text, echo))
        app.add_error_handler(on_error)
        async with app:
            await app.start()
            await app.updater.start_polling(poll_interval=0.0, timeout=1)
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.01)
            await app.updater.stop()
            await app.stop()

    asyncio.run(main())


# -- aiogram -------------------------------------------------------------------------------------

def aiogram_bot(server, dispatcher, errors, stop, started):
    import aiogram
    from aiogram import F
    from aiogram.client.session.aiohttp import AiohttpSession
    from aiogram.client.telegram import TelegramAPIServer
    from aiogram.filters import Command, CommandStart
    from aiogram.fsm.state import State, StatesGroup
    from aiogram.types import (BufferedInputFile, InlineKeyboardButton, InlineKeyboardMarkup,
                               InlineQueryResultArticle, InputMediaPhoto,
                               InputTextMessageContent)

    from fastdispatch.integrations.aiogram import DispatcherMiddleware

    class Survey(StatesGroup):
        name = State()
        age = State()

    dp = aiogram.Dispatcher()
    timers = set()

    @dp.message(CommandStart())
    async def start(message):
        await message.answer("Choose:", reply_markup=InlineKeyboardMarkup(inline_keyboard=[[
            InlineKeyboardButton(text="A", callback_data="A"),
            InlineKeyboardButton(text="B", callback_data="B")]]))

    @dp.callback_query()
    async def button(query):
        await query.answer("Chose " + query.data)
        await query.message.edit_text("You chose " + query.data)

    @dp.inline_query()
    async def inline(query):
        await query.answer([InlineQueryResultArticle(
            id=query.query + "-1", title=query.query.upper(),
            input_message_content=InputTextMessageContent(message_text=query.query.upper()))])

    @dp.message(Command("album"))
    async def album(message):
        await message.answer_media_group([
            InputMediaPhoto(media=BufferedInputFile(PNG, "1.png"), caption="one"),
            InputMediaPhoto(media=BufferedInputFile(PNG, "2.png"), caption="two")])
        await message.answer_photo(BufferedInputFile(PNG, "3.png"), caption="single")

    @dp.message(Command("timer"))
    async def timer(message, bot):
        async def beep():
            await asyncio.sleep(0.1)
            await bot.send_message(message.chat.id, "Beep!")
        await message.answer("Timer set")
        task = asyncio.ensure_future(beep())
        timers.add(task)
        task.add_done_callback(timers.discard)

    @dp.message(Command("survey"))
    async def survey(message, state):
        await state.set_state(Survey.name)
        await message.answer("Your name?")

    @dp.message(Survey.name)
    async def name(message, state):
        await state.update_data(name=message.text)
        await state.set_state(Survey.age)
        await message.answer("How old are you?")

    @dp.message(Survey.age)
    async def age(message, state):
        data = await state.get_data()
        await state.clear()
        await message.answer("%s, %s" % (data["name"], message.text))

    @dp.message(F.text)
    async def echo(message):
        await message.answer(message.text)

    @dp.errors()
    async def on_error(event):
        errors.append(event.exception)

    async def main():
        bot = aiogram.Bot(TOKEN, session=AiohttpSession(
            api=TelegramAPIServer.from_base(server.base_url)))
        bot.session.middleware(DispatcherMiddleware(dispatcher))         # the one line

        async def stopper():
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.01)
            await dp.stop_polling()

        stopping = asyncio.ensure_future(stopper())
        try:
            await dp.start_polling(bot, handle_signals=False, polling_timeout=1,
                                   close_bot_session=True)
        finally:
            await stopping

    asyncio.run(main())


# -- pyTelegramBotAPI ------------------------------------------------------------------------------

def telebot_bot(server, dispatcher, errors, stop, started):
    import telebot
    from telebot import apihelper, types

    from fastdispatch.integrations.telebot import DispatcherRequestSender

    class Errors(telebot.ExceptionHandler):
        def handle(self, exception):
            errors.append(exception)
            return True

    apihelper.API_URL = server.base_url + "/bot{0}/{1}"
    apihelper.CUSTOM_REQUEST_SENDER = DispatcherRequestSender(dispatcher)  # the one line
    bot = telebot.TeleBot(TOKEN, threaded=True, exception_handler=Errors())
    names = {}

    @bot.message_handler(commands=["start"])
    def start(message):
        markup = types.InlineKeyboardMarkup()
        markup.row(types.InlineKeyboardButton("A", callback_data="A"),
                   types.InlineKeyboardButton("B", callback_data="B"))
        bot.send_message(message.chat.id, "Choose:", reply_markup=markup)

    @bot.callback_query_handler(func=lambda query: True)
    def button(query):
        bot.answer_callback_query(query.id, "Chose " + query.data)
        bot.edit_message_text("You chose " + query.data, query.message.chat.id,
                              query.message.message_id)

    @bot.inline_handler(func=lambda query: True)
    def inline(query):
        bot.answer_inline_query(query.id, [types.InlineQueryResultArticle(
            query.query + "-1", query.query.upper(),
            types.InputTextMessageContent(query.query.upper()))])

    @bot.message_handler(commands=["album"])
    def album(message):
        bot.send_media_group(message.chat.id, [types.InputMediaPhoto(PNG, caption="one"),
                                               types.InputMediaPhoto(PNG, caption="two")])
        bot.send_photo(message.chat.id, PNG, caption="single")

    @bot.message_handler(commands=["timer"])
    def timer(message):
        bot.send_message(message.chat.id, "Timer set")
        threading.Timer(0.1, bot.send_message, args=(message.chat.id, "Beep!")).start()

    @bot.message_handler(commands=["survey"])
    def survey(message):
        # registered before the question goes out: the answer may come at once
        bot.register_next_step_handler_by_chat_id(message.chat.id, name)
        bot.send_message(message.chat.id, "Your name?")

    def name(message):
        names[message.chat.id] = message.text
        bot.register_next_step_handler_by_chat_id(message.chat.id, age)
        bot.send_message(message.chat.id, "How old are you?")

    def age(message):
        bot.send_message(message.chat.id, "%s, %s" % (names[message.chat.id], message.text))

    @bot.message_handler(func=lambda message: True)
    def echo(message):
        bot.send_message(message.chat.id, message.text)

    poller = threading.Thread(target=bot.infinity_polling, kwargs=dict(
        timeout=10, long_polling_timeout=1, interval=0), daemon=True)
    poller.start()
    started.set()
    stop.wait()
    bot.stop_bot()
    poller.join(15)


BOTS = {"python-telegram-bot": ptb_bot, "aiogram": aiogram_bot,
        "pyTelegramBotAPI": telebot_bot}


@pytest.mark.filterwarnings("ignore::UserWarning")  # PTB's ConversationHandler advice
@pytest.mark.parametrize("name", list(LIBRARIES))
def test_the_librarys_example_bots_answer_every_update_in_order(name, make_dispatcher,
                                                                monkeypatch):
    module, low = LIBRARIES[name]
    if sys.version_info[:2] < low:
        pytest.skip("%s is not installed on Python %d.%d by the test extra"
                    % (name, *sys.version_info[:2]))
    __import__(module)
    if name == "pyTelegramBotAPI":
        from telebot import apihelper
        monkeypatch.setattr(apihelper, "API_URL", apihelper.API_URL)
        monkeypatch.setattr(apihelper, "CUSTOM_REQUEST_SENDER", apihelper.CUSTOM_REQUEST_SENDER)
    # Telegram's per-chat and bot-wide limits, 50 times faster (the test's time)
    dispatcher = make_dispatcher(pacing=Pacing(chat_limit=RateLimit(1, per=0.02),
                                               global_limit=RateLimit(30, per=0.02)),
                                 retry=RetryPolicy())
    errors, stop, started = [], threading.Event(), threading.Event()
    with FakeTelegramServer() as server:
        bot = threading.Thread(target=BOTS[name], args=(server, dispatcher, errors, stop,
                                                        started))
        bot.start()
        try:
            started.wait(30)
            outcome = user_session(server)
        finally:
            stop.set()
            bot.join(30)
        assert not bot.is_alive()
        check(server, errors, outcome)
