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

Intakes that must not lose an event (``fastdispatch.telegram``'s poller and
webhook) call :meth:`Engine.handle_event` instead: it returns an
:class:`EventOutcome` that follows every reply the event's handlers queued
until each was sent or failed for good, so the intake confirms the event to
its platform only then (at-least-once), and can tell "every reply was
refused" (the chat's queue is full, the dispatcher is closing: have the
platform deliver the event again later) from "queued".

A chat over its queue.  A dispatcher chat queue holds ``queue_size``
waiting replies; one more is refused at once (``QueueFull``), never blocks a
handler and is never silently dropped: ``ctx.reply`` hands back a failed
Future, which is logged with the chat if nobody looks at it, and under
``handle_event`` the outcome counts it, so an intake can push back (the
Telegram webhook answers 429 and Telegram delivers the update again later;
the poller waits for room and runs the update again).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from time import monotonic
from typing import Any, Callable, List, NamedTuple, Optional, Set, Tuple

from ._errors import Cancelled, DispatcherClosed, QueueFull
from .context import Context, _call_in_span
from .platform import Capabilities, Event

__all__ = ["Engine", "EventOutcome"]

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


class EventOutcome:
    """What became of one event given to :meth:`Engine.handle_event`.

    It follows the event until it is *settled*: every handler has returned
    (pooled ones too) and every reply they queued meanwhile has an outcome.
    Replies queued later (from a thread the handler started, after it
    returned) are not followed.  Readable at any time (counts so far):

    - ``handlers``: the handlers run or handed to the pool, in order;
    - ``queued``: replies accepted by the dispatcher; of those, ``sent``,
      ``failed`` (for good: an error, retries used up) and ``cancelled``
      (cancelled before they went, e.g. by ``force_close()`` at a shutdown
      deadline);
    - ``refused``: replies the dispatcher refused at once, by reason:
      ``{"queue_full": n, "closed": n, "error": n}`` (``error``: any other
      failure of ``ctx.reply``, such as a missing sender);
    - ``settled``; :meth:`wait`; :meth:`add_done_callback`;
    - ``delivered``: settled, and no reply was refused or cancelled: every
      reply was sent or failed for good, so the event need not come again.

    Cost: one lock and one Future callback per reply, only on this path
    (``process_event`` does none of it).
    """

    __slots__ = ("event", "handlers", "queued", "sent", "failed", "cancelled", "refused",
                 "_lock", "_open", "_pending", "_callbacks", "_settled")

    def __init__(self, event: Event) -> None:
        self.event = event
        self.handlers: List[Handler] = []
        self.queued = self.sent = self.failed = self.cancelled = 0
        self.refused = {"queue_full": 0, "closed": 0, "error": 0}
        self._lock = threading.Lock()  # guards the counts, _open, _pending, _callbacks
        self._open = 1  # the match walk itself, plus each pooled handler still to return
        self._pending = 0  # queued replies without an outcome yet
        self._callbacks: List[Callable[["EventOutcome"], Any]] = []
        self._settled = threading.Event()

    def __repr__(self) -> str:
        return ("<EventOutcome chat=%r %s queued=%d sent=%d failed=%d cancelled=%d "
                "refused=%r>" % (self.event.chat.id, "settled" if self.settled else "open",
                                 self.queued, self.sent, self.failed, self.cancelled,
                                 self.refused))

    @property
    def settled(self) -> bool:
        return self._settled.is_set()

    @property
    def refused_total(self) -> int:
        refused = self.refused
        return refused["queue_full"] + refused["closed"] + refused["error"]

    @property
    def delivered(self) -> bool:
        return self.settled and self.cancelled == 0 and self.refused_total == 0

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until settled; False if ``timeout`` seconds passed first."""
        return self._settled.wait(timeout)

    def add_done_callback(self, fn: Callable[["EventOutcome"], Any]) -> None:
        """Call ``fn(outcome)`` once settled (at once if it is), in the thread
        that settles it (a dispatcher worker, usually).  An exception from
        ``fn`` is logged."""
        with self._lock:
            if not self._settled.is_set():
                self._callbacks.append(fn)
                return
        self._call(fn)

    def _call(self, fn: Callable[["EventOutcome"], Any]) -> None:
        try:
            fn(self)
        except Exception:
            _log.exception("EventOutcome callback %r raised", fn)

    # -- fed by Context.reply and the engine --------------------------------

    def _track(self, fut: Any) -> None:
        with self._lock:
            if self._open == 0:
                return  # queued after the event settled: not followed
            self.queued += 1
            self._pending += 1
        fut.add_done_callback(self._reply_done)

    def _refused(self, exc: BaseException) -> bool:
        """Count a reply ``ctx.reply`` could not queue; False (not counted)
        once the event has settled."""
        reason = ("queue_full" if isinstance(exc, QueueFull) else
                  "closed" if isinstance(exc, DispatcherClosed) else "error")
        with self._lock:
            if self._open == 0:
                return False
            self.refused[reason] += 1
        return True

    def _reply_done(self, fut: Any) -> None:
        if fut.cancelled():
            kind = "cancelled"
        else:
            exc = fut.exception()
            kind = ("sent" if exc is None else
                    "cancelled" if isinstance(exc, Cancelled) else "failed")
        with self._lock:
            setattr(self, kind, getattr(self, kind) + 1)
            self._pending -= 1
            done = self._pending == 0 and self._open == 0
        if done:
            self._settle()

    def _hold(self) -> None:
        with self._lock:
            self._open += 1

    def _release(self, _fut: Any = None) -> None:
        with self._lock:
            self._open -= 1
            done = self._pending == 0 and self._open == 0
        if done:
            self._settle()

    def _settle(self) -> None:
        with self._lock:
            if self._settled.is_set():
                return
            self._settled.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            self._call(fn)


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

    @property
    def closed(self) -> bool:
        """True once :meth:`shutdown` was called (events are refused)."""
        return self._closed

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
        return self._walk(ctx, None)

    def handle_event(
        self, event: Event, sender: Any, capabilities: Optional[Capabilities] = None
    ) -> EventOutcome:
        """Like :meth:`process_event`, but return an :class:`EventOutcome`
        that follows the replies the handlers queue, until each was sent or
        failed for good.

        For intakes that confirm an event to the platform only once it was
        really answered (``fastdispatch.telegram``).  Refused replies are
        counted on the outcome instead of logged one by one: the caller
        decides (deliver the event again, or report the loss).  Raises
        ``RuntimeError`` after :meth:`shutdown`.
        """
        if self._closed:
            raise RuntimeError("cannot process events after shutdown()")
        outcome = EventOutcome(event)
        ctx = Context(event, sender=sender, dispatcher=self._dispatcher,
                      capabilities=capabilities)
        ctx._tracker = outcome
        try:
            outcome.handlers = self._walk(ctx, outcome)
        finally:
            outcome._release()  # the walk's own hold: settles once the replies have
        return outcome

    def _walk(self, ctx: Context, outcome: Optional[EventOutcome]) -> List[Handler]:
        handled = []
        for matcher in self._matchers:
            if not _matches(matcher, ctx):
                ctx.discard_pending_rule_effects()
                continue
            ctx.commit_pending_rule_effects()
            if not matcher.pooled:
                _run_handler(matcher.handler, ctx)
            elif not self._hand_over(matcher.handler, ctx.clone(), outcome):
                continue
            handled.append(matcher.handler)
            if matcher.block:
                break
        return handled

    def _hand_over(self, handler: Handler, ctx: Context,
                   outcome: Optional[EventOutcome] = None) -> bool:
        with self._lock:
            if self._closed:
                _log.error("engine shut down; pooled handler %r not run", handler)
                return False
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self._pool_size, thread_name_prefix="fastdispatch-handler")
            if outcome is not None:
                outcome._hold()
            try:
                fut = self._pool.submit(_run_pooled, handler, ctx)
            except BaseException:
                if outcome is not None:
                    outcome._release()
                raise
            self._pooled.add(fut)
        fut.add_done_callback(self._pooled_done)
        if outcome is not None:
            fut.add_done_callback(outcome._release)
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
