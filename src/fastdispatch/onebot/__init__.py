"""``fastdispatch.onebot``: OneBot v11 (NapCat, Lagrange.OneBot, LLOneBot,
go-cqhttp) as a fastdispatch platform.

:class:`OneBotSender` calls the implementation over its HTTP API or one
shared forward WebSocket (``pip install 'fastdispatch[onebot]'`` for the
WebSocket client, ``websockets``); :func:`chat_of` says which chat a call is
made for, the key to give the dispatcher; ``Pacing.onebot()`` is the pacing
to use.  What each answer becomes:

- ``retcode`` 0: the answer's ``data``;
- ``retcode`` 1 (queued): None;
- any other ``retcode``, HTTP 4xx/5xx: :class:`OneBotError` (a
  ``PlatformError`` with ``.retcode``; never retried);
- no answer by the deadline, or the connection lost while waiting:
  :class:`OutcomeUnknown` (a ``SendTimeout``: never retried, the message
  may have gone out);
- the connection could not be opened: :class:`OneBotNetworkError` (a
  ``ConnectionError``: retried).

Why ``websockets`` (its threaded client, ``websockets.sync``): a call and
its answer cost the client less than half of what they cost with
websocket-client (the repository's ``bench/onebot_ws_clients.py
--instructions`` counts both), and its sends are safe from many threads at
once, which one shared connection needs (websocket-client's need a lock of
the caller's).
"""

from ._sender import (
    OneBotError, OneBotNetworkError, OneBotSender, OutcomeUnknown, PlatformError, chat_of)

__all__ = ["OneBotSender", "OutcomeUnknown", "OneBotError", "OneBotNetworkError",
           "PlatformError", "chat_of"]
