"""fastdispatch: a per-chat outbound dispatcher for bot servers.

Within one chat, sends run strictly in order and one at a time; across chats
they run in parallel under a global cap.  ``Context`` is the per-event object
that handlers use to reply through it.

Documentation: https://github.com/fastdispatch/fastdispatch/tree/main/docs
"""

import os
from types import ModuleType
from typing import TYPE_CHECKING, Tuple

from . import _core_py
from ._dispatcher import build_dispatcher_class
from ._errors import (
    Cancelled,
    DispatcherClosed,
    DispatcherError,
    QueueFull,
    RetryAfter,
    SendTimeout,
    TaskDiscarded,
)
from ._types import DispatcherHooks, DispatcherStats, DispatchInfo
from .pacing import Pacing, RateLimit, RetryPolicy


def _select_core() -> Tuple[ModuleType, str]:
    if os.environ.get("FASTDISPATCH_NO_EXTENSIONS", "") not in ("", "0"):
        return _core_py, "python"
    try:
        from . import _ringbuf
    except ImportError:
        return _core_py, "python"
    return _ringbuf, "cython"


IMPLEMENTATION: str
if TYPE_CHECKING:
    # Checkers see the classes declared in the stubs (_dispatcher.pyi,
    # _ringbuf.pyi); at run time they come from the core chosen here.
    from ._dispatcher import OutboundDispatcher as OutboundDispatcher
    from ._ringbuf import SendContext as SendContext
else:
    _core, IMPLEMENTATION = _select_core()
    OutboundDispatcher = build_dispatcher_class(_core)
    SendContext = _core.SendContext
    del _core   # not part of the API (pydoc would list it)

# The per-event layer, built on the names above.
from . import rules  # noqa: E402
from .context import Context, Extensions, ReservedKeyError  # noqa: E402
from .engine import Engine  # noqa: E402
from .platform import (  # noqa: E402
    Capabilities,
    ChatInfo,
    Event,
    GroupMemberLister,
    MessageAuthorMuter,
    MessageDeleter,
    Sender,
    SenderInfo,
    SendRequest,
    SendResult,
    TextMessage,
    TypingSender,
)

__version__ = "0.1.0"

__all__ = [
    "IMPLEMENTATION",
    "OutboundDispatcher",
    "SendContext",
    "DispatcherHooks",
    "DispatchInfo",
    "DispatcherStats",
    "DispatcherError",
    "QueueFull",
    "DispatcherClosed",
    "SendTimeout",
    "TaskDiscarded",
    "Cancelled",
    "RetryAfter",
    "RateLimit",
    "Pacing",
    "RetryPolicy",
    "Context",
    "Extensions",
    "ReservedKeyError",
    "Engine",
    "rules",
    "ChatInfo",
    "SenderInfo",
    "Event",
    "TextMessage",
    "SendRequest",
    "SendResult",
    "Capabilities",
    "Sender",
    "MessageDeleter",
    "TypingSender",
    "GroupMemberLister",
    "MessageAuthorMuter",
]
