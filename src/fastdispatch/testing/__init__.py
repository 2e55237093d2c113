"""``fastdispatch.testing``: local platform API servers for tests.

:class:`FakeTelegramServer` (``_telegram.py``) is a real HTTP server on
127.0.0.1 that speaks enough of the Telegram Bot API for a bot's own tests;
its module docstring says what it emulates and what it does not.
``python -m fastdispatch.testing`` runs one from the command line.
"""

from ._telegram import FakeTelegramServer, SentMessage, telegram_limits

__all__ = ["FakeTelegramServer", "SentMessage", "telegram_limits"]
