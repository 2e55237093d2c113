"""The Engine: the match path that turns an event into handler calls.

For each event the engine makes one fresh :class:`Context` and walks its
matchers in priority order.  A matcher whose rules all pass has its deferred
rule effects committed and its handler run; one whose rules do not all pass
has them discarded.  Rules and handlers run in the thread that called
``process_event``, except pooled handlers, which run on the engine's bounded
handler pool with a clone of the Context (the calling thread goes on with the
next matcher and the next event, so the two must not share one Context).

Threads.  ``process_event`` may be called from any number of threads at once.
The matcher list is an immutable tuple replaced whole by ``on()``, so the
match path reads it without a lock.  The handler pool is created on the
first pooled match.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from time import monotonic
from typing import Any, Callable, List, NamedTuple, Optional, Set, Tuple

from .context import Context, _call_in_span
from .platform import Capabilities, Event

__all__ = ["Engine"]

_log = logging.getLogger("fastdispatch")

Rule = Callable[[Context], Any]
Handler = Callable[[Context], Any]


class _Matcher(NamedTuple):
    priority: int
    seq: int  # registration order, to keep ties stable
    rules: Tuple[Rule, ...]
    handler: Handler
    block: bool
    pooled: bool


def _matches(matcher: _Matcher, ctx: Context) -> bool:
    """Run the matcher's rules, stopping at the first that fails; a rule that
    raises counts as failed (and is logged)."""
    for rule in matcher.rules:
        try:
            if not rule(ctx):
                return False
        except Exception:
            _log.exception("rule %r raised; %r does not match", rule, matcher.handler)
            return False
    return True


def _run_handler(handler: Handler, ctx: Context) -> None:
    try:
        handler(ctx)
    except Exception:
        _log.exception("handler %r raised", handler)


def _run_pooled(handler: Handler, ctx: Context) -> None:
    # The event's trace span is current in the pool thread, as it was in the
    # thread that received the event.
    _call_in_span(ctx.span, _run_handler, handler, ctx)


class Engine:
    """Rules and handlers, matched in priority order; replies via a dispatcher.

    ``Engine(dispatcher=None, *, pool_size=None)``: without a dispatcher the
    engine makes its own ``OutboundDispatcher()``; either way
    :meth:`shutdown` shuts it down.  ``pool_size`` caps the threads running
    pooled handlers (default: ``ThreadPoolExecutor``'s,
    ``min(32, cpu_count + 4)``).
    """

    def __init__(self, dispatcher: Any = None, *, pool_size: Optional[int] = None) -> None:
        if pool_size is not None and (
            isinstance(pool_size, bool) or not isinstance(pool_size, int)
        ):
            raise TypeError("pool_size must be an int or None")
        if pool_size is not None and pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        if dispatcher is None:
            from . import OutboundDispatcher  # here: the package imports us first

            dispatcher = OutboundDispatcher()
        elif not callable(getattr(dispatcher, "submit", None)):
            raise TypeError("dispatcher must have a submit(chat_id, task) method")
        self._dispatcher = dispatcher
        self._pool_size = pool_size
        self._matchers: Tuple[_Matcher, ...] = ()
        self._lock = threading.Lock()  # guards everything below
        self._seq = 0
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pooled: Set[Any] = set()  # Futures of pooled handlers not yet done
        self._closed = False

    @property
    def dispatcher(self) -> Any:
        return self._dispatcher

    def on(
        self, *rules: Rule, priority: int = 0, block: bool = False, pooled: bool = False
    ) -> Callable[[Handler], Handler]:
        """Register a matcher: ``@engine.on(rule, ..., priority=0, block=False,
        pooled=False)`` above a handler.

        The handler runs when every rule passes.  Lower ``priority`` runs
        first; equal priorities keep registration order.  ``block`` stops the
        walk after this handler; ``pooled`` runs the handler on the handler
        pool with ``ctx.clone()``.  Returns the handler unchanged.
        Registration is O(number of matchers); the match path is not slowed.
        """
        for rule in rules:
            if not callable(rule):
                raise TypeError(f"rules must be callable, not {rule!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError("priority must be an int")

        def register(handler: Handler) -> Handler:
            if not callable(handler):
                raise TypeError(f"a handler must be callable, not {handler!r}")
            with self._lock:
                self._seq += 1
                matcher = _Matcher(priority, self._seq, rules, handler, bool(block), bool(pooled))
                self._matchers = tuple(sorted(self._matchers + (matcher,)))
            return handler

        return register

    def process_event(
        self, event: Event, sender: Any, capabilities: Optional[Capabilities] = None
    ) -> List[Handler]:
        """Match ``event`` against every matcher; return the handlers run.

        Makes a fresh Context and walks the matchers in order: all rules pass
        -> commit the rule effects, run the handler (inline, or pooled on a
        clone), stop if ``block``; otherwise discard the effects.  A handler
        or rule that raises is logged on the ``fastdispatch`` logger and does
        not stop the walk.  Returns the handlers that ran or were handed to
        the pool, in order.  Raises ``RuntimeError`` after :meth:`shutdown`.
        """
        if self._closed:
            raise RuntimeError("cannot process events after shutdown()")
        ctx = Context(event, sender=sender, dispatcher=self._dispatcher,
                      capabilities=capabilities)
        handled = []
        for matcher in self._matchers:
            if not _matches(matcher, ctx):
                ctx.discard_pending_rule_effects()
                continue
            ctx.commit_pending_rule_effects()
            if not matcher.pooled:
                _run_handler(matcher.handler, ctx)
            elif not self._hand_over(matcher.handler, ctx.clone()):
                continue
            handled.append(matcher.handler)
            if matcher.block:
                break
        return handled

    def _hand_over(self, handler: Handler, ctx: Context) -> bool:
        with self._lock:
            if self._closed:
                _log.error("engine shut down; pooled handler %r not run", handler)
                return False
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self._pool_size, thread_name_prefix="fastdispatch-handler")
            fut = self._pool.submit(_run_pooled, handler, ctx)
            self._pooled.add(fut)
        fut.add_done_callback(self._pooled_done)
        return True

    def _pooled_done(self, fut: Any) -> None:
        with self._lock:
            self._pooled.discard(fut)

    def shutdown(self, timeout: Optional[float] = None) -> bool:
        """Stop taking events, let pooled handlers finish, shut the
        dispatcher down (its queued replies are sent first).

        Pooled handlers are waited for before the dispatcher closes, so their
        replies still go out.  Returns True when all of it finished within
        ``timeout`` seconds (None: wait as long as it takes), else False (the
        work goes on in the background).  Not to be called from a pooled
        handler, which would wait for itself.
        """
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError("timeout must be a number of seconds or None")
            if timeout < 0:
                raise ValueError("timeout must not be negative")
        deadline = None if timeout is None else monotonic() + timeout
        with self._lock:
            self._closed = True
            pool, pending = self._pool, list(self._pooled)
        if pool is not None:
            pool.shutdown(wait=False)
        if wait(pending, timeout).not_done:
            return False
        if deadline is None:
            return bool(self._dispatcher.shutdown())
        # Out of time already: shutdown(0) still closes, and reports False.
        return bool(self._dispatcher.shutdown(max(0.0, deadline - monotonic())))

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown()
