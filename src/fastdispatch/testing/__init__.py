"""``fastdispatch.testing``: local platform API servers for tests.

:class:`FakeDiscordServer` (``_discord.py``) does the same for Discord's
REST API: the rate-limit headers of every answer, the global limit, the
invalid-request ban, follow-ups, and a signer for interactions
(``docs/discord.md``).

:class:`FakeTelegramServer` (``_telegram.py``) is a real HTTP server on
127.0.0.1 that speaks enough of the Telegram Bot API for a bot's own tests,
with python-telegram-bot, aiogram, pyTelegramBotAPI or fastdispatch; what it
emulates and what it does not is a table in ``docs/telegram.md``.  It is
built on :class:`~fastdispatch.testing._server.LocalServer` (``_server.py``),
the threaded server, fault plan, record and control endpoint that a fake of
another platform shares.  ``python -m fastdispatch.testing`` runs one from
the command line, controllable over HTTP.
"""

from ._discord import DiscordMessage, FakeDiscordServer, discord_limits
from ._onebot import FakeOneBotServer, OneBotMessage
from ._qq import FakeQQServer, QQMessage
from ._telegram import FakeTelegramServer, SentMessage, telegram_limits

__all__ = ["FakeTelegramServer", "SentMessage", "telegram_limits", "FakeDiscordServer",
           "DiscordMessage", "discord_limits", "FakeOneBotServer", "OneBotMessage",
           "FakeQQServer", "QQMessage"]
