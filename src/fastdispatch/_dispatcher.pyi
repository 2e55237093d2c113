"""Typing stub for ``_dispatcher.py``: the ``OutboundDispatcher`` that checkers see.

At run time ``OutboundDispatcher`` is one of two classes, one per core
(``_dispatcher_cython.py``, ``_dispatcher_python.py``), picked by
:func:`build_dispatcher_class` on the core chosen at import, which no checker
can follow.  This stub declares the class once, on the core's stub
(``_ringbuf.pyi``), so that mypy and pyright see its real signatures.
``tests/test_typing.py`` checks that it matches both classes.
"""

from concurrent.futures import Future
from types import ModuleType, TracebackType
from typing import Awaitable, overload, Callable, Hashable, Optional, Type, TypeVar

from ._ringbuf import DispatcherCore, SendContext
from ._types import DispatcherHooks, DispatcherStats
from .pacing import Pacing, RetryPolicy

__all__ = ["build_dispatcher_class"]

_T = TypeVar("_T")
_D = TypeVar("_D", bound="OutboundDispatcher")

class OutboundDispatcher(DispatcherCore):
    """Per-chat outbound dispatcher: FIFO within a chat, parallel across chats."""

    def __init__(
        self,
        *,
        max_inflight: int = 512,
        queue_size: int = 64,
        send_timeout: Optional[float] = 30.0,
        recover: Optional[Callable[[BaseException], object]] = None,
        hooks: Optional[DispatcherHooks] = None,
        idle_timeout: float = 5.0,
        pacing: Optional[Pacing] = None,
        retry: Optional[RetryPolicy] = None,
        max_waiting: int = 100_000,
    ) -> None: ...
    def submit(self, chat_id: Hashable, task: Callable[[SendContext], _T], *,
               block: bool = False, timeout: Optional[float] = None) -> Future[_T]: ...
    def post(self, chat_id: Hashable, task: Callable[[SendContext], object], *,
             block: bool = False, timeout: Optional[float] = None) -> None: ...
    @overload
    async def asubmit(self, chat_id: Hashable,
                      task: Callable[[SendContext], Awaitable[_T]], *,
                      block: bool = False, timeout: Optional[float] = None) -> _T: ...
    @overload
    async def asubmit(self, chat_id: Hashable, task: Callable[[SendContext], _T], *,
                      block: bool = False, timeout: Optional[float] = None) -> _T: ...
    def close(self) -> None: ...
    def drain(self, timeout: Optional[float] = None) -> bool: ...
    def shutdown(self, timeout: Optional[float] = None) -> bool: ...
    async def ashutdown(self, timeout: Optional[float] = None) -> bool: ...
    def force_close(self) -> None: ...
    def stats(self) -> DispatcherStats: ...
    def __enter__(self: _D) -> _D: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None: ...

def build_dispatcher_class(core: ModuleType) -> Type[OutboundDispatcher]: ...
