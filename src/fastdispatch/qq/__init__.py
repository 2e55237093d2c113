"""``fastdispatch.qq``: the QQ official bot API as a fastdispatch platform.

:class:`QQSender` replies to group, c2c, guild-channel and guild-DM messages
under QQ's passive-reply rules (a window, 5 replies per message, ``msg_seq``
kept across retries so QQ deduplicates them), with the access token's life
cycle; ``Pacing.qq()`` is the pacing to use.  See ``_sender.py``.
"""

from ._sender import PlatformError, QQNetworkError, QQSender, ReplyWindowExpired

__all__ = ["QQSender", "ReplyWindowExpired", "QQNetworkError", "PlatformError"]
