"""Typing stub for ``pacing.py`` (its values are checked at run time; see there)."""

from typing import Callable, Hashable, Optional, Tuple, Type, Union

__all__ = ["RateLimit", "Pacing", "RetryPolicy"]

class RateLimit:
    """At most ``count`` task starts in any window of ``per`` seconds."""

    @property
    def count(self) -> int: ...
    @property
    def per(self) -> float: ...
    def __init__(self, count: int, per: float = 1.0) -> None: ...

class Pacing:
    """How fast the dispatcher may start tasks."""

    @property
    def global_limit(self) -> Optional[RateLimit]: ...
    @property
    def chat_limit(self) -> Optional[RateLimit]: ...
    @property
    def limit_for(self) -> Optional[Callable[[Hashable], Optional[RateLimit]]]: ...
    def __init__(
        self,
        global_limit: Optional[RateLimit] = None,
        chat_limit: Optional[RateLimit] = None,
        limit_for: Optional[Callable[[Hashable], Optional[RateLimit]]] = None,
    ) -> None: ...
    @classmethod
    def telegram(cls, broadcast: Optional[int] = None, *, speedup: float = 1.0,
                 margin: float = 0.05) -> "Pacing": ...
    @classmethod
    def discord(cls) -> "Pacing": ...
    @classmethod
    def onebot(cls) -> "Pacing": ...
    @classmethod
    def qq(cls) -> "Pacing": ...

class RetryPolicy:
    """Which failed tasks run again, how often and after how long."""

    @property
    def max_attempts(self) -> int: ...
    @property
    def backoff(self) -> float: ...
    @property
    def max_backoff(self) -> float: ...
    @property
    def max_retry_after(self) -> float: ...
    @property
    def retry_on(self) -> Tuple[Type[BaseException], ...]: ...
    def __init__(
        self,
        max_attempts: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_retry_after: float = 120.0,
        retry_on: Union[Type[BaseException], Tuple[Type[BaseException], ...]] = ...,
    ) -> None: ...
    def backoff_delay(self, attempt: int, _random: Callable[[], float] = ...) -> float: ...
