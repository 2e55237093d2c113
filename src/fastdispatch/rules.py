"""Ready-made rules for :meth:`Engine.on`.

A rule is any ``callable(ctx) -> bool``.  Rules should be pure: the engine
may call them for events no handler ends up handling.  A rule that must
record something when it passes (like :func:`on_cooldown`) registers the
write with ``ctx.defer_rule_effect``; the engine runs it only if every rule of
the matcher passed, so a cooldown is never spent on an event its handler did
not handle.

Each factory checks its arguments when called (``TypeError``/``ValueError``),
so a mistake shows up at registration, not at the first event.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Hashable, NamedTuple, Union

from .context import Context

__all__ = [
    "Command",
    "on_command",
    "on_keyword",
    "is_private",
    "is_group",
    "on_cooldown",
]

Rule = Callable[[Context], bool]


class Command(NamedTuple):
    """What :func:`on_command` found: ``ctx.ext.get(Command)`` in a handler.

    For ``"/echo  hello world "``: ``name == "echo"``, ``args == "hello world"``.
    """

    name: str
    args: str


def on_command(name: str, prefix: str = "/") -> Rule:
    """Match messages whose first word is ``prefix + name``.

    ``/name@<bot_id>`` matches too when the Context has a ``bot_id`` (how
    group chats address one bot among several).  On a match, the parsed
    :class:`Command` is stored in ``ctx.ext``.  Cost: one split of the
    message content (parsed once per Context).
    """
    if not isinstance(name, str) or not isinstance(prefix, str):
        raise TypeError("on_command() name and prefix must be str")
    if not name or name.split() != [name]:
        raise ValueError(f"command name must be one non-empty word, not {name!r}")
    word = prefix + name

    def rule(ctx: Context) -> bool:
        parts = ctx.message_content.split(None, 1)
        if not parts:
            return False
        first = parts[0]
        if first != word:
            bot_id = ctx.bot_id
            if not bot_id or first != f"{word}@{bot_id}":
                return False
        ctx.ext.set(Command(name, parts[1].strip() if len(parts) > 1 else ""))
        return True

    rule.__qualname__ = f"on_command({word!r})"
    return rule


def on_keyword(*words: str) -> Rule:
    """Match messages containing any of ``words`` (case-sensitive substring).
    Cost: one substring search per word."""
    if not words:
        raise ValueError("on_keyword() needs at least one word")
    for word in words:
        if not isinstance(word, str):
            raise TypeError(f"keywords must be str, not {type(word).__name__}")
        if not word:
            raise ValueError("keywords must not be empty")

    def rule(ctx: Context) -> bool:
        content = ctx.message_content
        return any(word in content for word in words)

    rule.__qualname__ = f"on_keyword{words!r}"
    return rule


def _is_private(ctx: Context) -> bool:
    return not ctx.event.chat.is_group


def _is_group(ctx: Context) -> bool:
    return ctx.event.chat.is_group


def is_private() -> Rule:
    """Match events from private (one-to-one) chats."""
    return _is_private


def is_group() -> Rule:
    """Match events from group chats."""
    return _is_group


_COOLDOWN_KEYS: Dict[str, Callable[[Context], Hashable]] = {
    "user": lambda ctx: (ctx.event.platform, ctx.event.sender.id),
    "chat": lambda ctx: (ctx.event.platform, ctx.event.chat.id),
    "global": lambda ctx: None,
}


class _Cooldowns:
    """When each key last spent its cooldown.

    Expired entries are dropped whenever the table has doubled since the last
    sweep, so memory follows the number of keys active within one cooldown
    period and recording stays amortised O(1).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._last: Dict[Hashable, float] = {}
        self._lock = threading.Lock()
        self._sweep_at = 1024

    def ready(self, key: Hashable, now: float) -> bool:
        last = self._last.get(key)
        return last is None or now - last >= self.seconds

    def spend(self, key: Hashable, now: float) -> None:
        with self._lock:
            last = self._last
            previous = last.get(key)
            if previous is None or now > previous:
                last[key] = now
            if len(last) >= self._sweep_at:
                horizon = now - self.seconds
                for k in [k for k, t in last.items() if t <= horizon]:
                    del last[k]
                self._sweep_at = max(1024, 2 * len(last))


def on_cooldown(
    seconds: float,
    key: Union[str, Callable[[Context], Hashable]] = "user",
    *,
    clock: Callable[[], float] = time.monotonic,
) -> Rule:
    """Pass at most once per ``seconds`` for each key.

    ``key`` is ``"user"`` (the event's sender, per platform), ``"chat"``,
    ``"global"``, or a ``callable(ctx) -> hashable``.  The rule records its
    timestamp through ``ctx.defer_rule_effect``: the cooldown is spent only
    when the whole matcher matches.  Two events of one key checked at the
    same instant, before either matcher committed, may both pass.  Each
    ``on_cooldown(...)`` call makes an independent cooldown table.  O(1).
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError("on_cooldown() seconds must be a number")
    if not seconds > 0:
        raise ValueError("on_cooldown() seconds must be > 0")
    if isinstance(key, str):
        try:
            key_of = _COOLDOWN_KEYS[key]
        except KeyError:
            raise ValueError(
                f"on_cooldown() key must be 'user', 'chat', 'global' or a callable, not {key!r}"
            ) from None
    elif callable(key):
        key_of = key
    else:
        raise TypeError("on_cooldown() key must be a str or a callable")
    if not callable(clock):
        raise TypeError("on_cooldown() clock must be callable")
    table = _Cooldowns(float(seconds))

    def rule(ctx: Context) -> bool:
        k: Any = key_of(ctx)
        now = clock()
        if not table.ready(k, now):
            return False
        ctx.defer_rule_effect(lambda: table.spend(k, now))
        return True

    rule.__qualname__ = f"on_cooldown({seconds!r}, {key!r})"
    return rule
