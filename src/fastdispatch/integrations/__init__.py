"""``fastdispatch.integrations``: the outbound path of bots written with a
Telegram library, plugged into the dispatcher through each library's own
extension point.

- :mod:`fastdispatch.integrations.ptb`: python-telegram-bot >= 20, a
  ``telegram.ext.BaseRateLimiter`` (``DispatcherRateLimiter``); extra
  ``[ptb]``.
- :mod:`fastdispatch.integrations.aiogram`: aiogram 3, a session request
  middleware (``DispatcherMiddleware``); extra ``[aiogram]``.
- :mod:`fastdispatch.integrations.telebot`: pyTelegramBotAPI's threaded
  ``TeleBot``, its ``apihelper.CUSTOM_REQUEST_SENDER`` hook
  (``DispatcherRequestSender``), and ``run_polling`` (a stop on SIGTERM or
  SIGINT that loses no reply); extra ``[telebot]``.

The rules are the same for the three: a request that names a ``chat_id``
is sent through the dispatcher under that chat (in the order the bot made
the requests, one at a time, paced); one that names no chat is paced by the
bot-wide limit only; ``getUpdates`` is never delayed; the library's flood
error becomes a ``RetryAfter`` of that chat only (bot-wide for a request
without a chat) and the request is sent again before the chat's later ones;
what finally fails reaches the bot as the library's own exception.  A
busy chat makes a request wait for room, never fail; a request a task of
the dispatcher makes for its own chat goes out at once; given no
dispatcher, each makes its own (``Pacing.telegram()``, ``RetryPolicy()``)
and drains it, to a deadline, when the bot stops.

This package imports none of the libraries: each module imports its own,
so that ``import fastdispatch.integrations`` costs nothing.  The shared
translation is in ``_common.py``.  Docs:
https://github.com/fastdispatch/fastdispatch/tree/main/docs/asyncio.md
"""
