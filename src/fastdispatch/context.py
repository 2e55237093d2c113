"""The per-event Context: what a rule or a handler gets for one event.

A Context is made fresh for every event and never reused, so a handler may
keep it, or hand it to a timer or a callback, as long as it likes.  To stay
cheap despite that, it is lazy inside: the two state stores, the list of
pending rule effects and the parsed message content are created on first use
(an event nobody reads state from allocates none of them).

Threads.  A Context belongs to the thread that is processing its event.  To
hand the event to another thread for independent work, give that thread
``ctx.clone()``: the clone has its own stores and its own cancellation.  The
exceptions are the things that must be safe anyway: ``message_content`` may be
read by any number of threads at once (the content is parsed once), each
single store operation is atomic, and ``reply``/``cancel`` may be called from
anywhere.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Optional, Type, TypeVar

from .platform import (
    Capabilities,
    Event,
    GroupMemberLister,
    MessageAuthorMuter,
    MessageDeleter,
    SenderInfo,
    SendRequest,
    SendResult,
    TextMessage,
    TypingSender,
)

try:  # Tracing is optional: ``pip install fastdispatch[otel]``.
    from opentelemetry import context as _otel_context
    from opentelemetry import trace as _otel_trace
except ImportError:  # pragma: no cover - exercised where otel is absent
    _otel_context = _otel_trace = None  # type: ignore[assignment]

__all__ = ["Context", "Extensions", "ReservedKeyError"]

T = TypeVar("T")

_log = logging.getLogger("fastdispatch")

_RESERVED_KEYS = frozenset(("mw_trace", "retry_attempt"))
_RESERVED_PREFIX = "_fastdispatch_"
_NO_CAPABILITIES = Capabilities()
_UNSET = object()

# Held for a few instructions only, the first time a Context creates one of
# its lazy members, so that two threads doing so at once agree on one of them.
_lazy_lock = threading.Lock()


class ReservedKeyError(ValueError):
    """A string key reserved for the framework was used in the string store.

    Reserved: ``"mw_trace"``, ``"retry_attempt"`` and every key starting with
    ``"_fastdispatch_"``.  Framework state lives in the typed store
    (``ctx.ext``), where no string can reach it; the names are refused so a
    plugin written against their old meaning fails loudly instead of quietly
    reading nothing.
    """


def _check_key(key: Any) -> None:
    """Raise for a key the string store refuses.

    The store methods call this only when their inline test (an exact
    ``str`` that is not reserved) fails, which keeps the common case free of
    a function call; a ``str`` subclass passes here.
    """
    if not isinstance(key, str):
        raise TypeError(f"Context keys must be str, not {type(key).__name__}")
    if key in _RESERVED_KEYS or key.startswith(_RESERVED_PREFIX):
        raise ReservedKeyError(f"{key!r} is reserved for fastdispatch")


def _check_type_key(key: Any) -> None:
    if not isinstance(key, type):
        raise TypeError(f"extension keys must be types, not {key!r}")


def _failed(exc: BaseException) -> "Future[Any]":
    fut: "Future[Any]" = Future()
    fut.set_exception(exc)
    return fut


class _UnqueuedReply(Future):  # type: ignore[type-arg]
    """The already-failed Future of a reply that could not be queued.

    No silent loss: if nobody ever looks at it (``result()``,
    ``exception()`` or ``add_done_callback()``), the reply is logged once,
    with its chat, when the Future is dropped.  A handler that does
    ``ctx.reply_text(...)`` and ignores the result drops it at once, so the
    warning comes when the reply was refused.  Made only on the failure path:
    a reply that was queued costs nothing more.
    """

    def __init__(self, exc: BaseException, chat_id: Any) -> None:
        super().__init__()
        self._chat_id = chat_id
        self._observed = False
        self.set_exception(exc)

    def result(self, timeout: Optional[float] = None) -> Any:
        self._observed = True
        return super().result(timeout)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        self._observed = True
        return super().exception(timeout)

    def add_done_callback(self, fn: Callable[["Future[Any]"], object]) -> None:
        self._observed = True
        super().add_done_callback(fn)

    def __del__(self) -> None:
        if self._observed:
            return
        try:
            exc = super().exception(0)
            _log.warning("reply to chat %r was not sent: %s: %s (nobody looked at its Future)",
                         self._chat_id, type(exc).__name__, exc)
        except Exception:  # noqa: S110 - at interpreter exit logging may be gone
            pass


def _current_span() -> Any:
    """The OpenTelemetry span current in this thread, or None if there is no
    valid one (or OpenTelemetry is not installed)."""
    if _otel_trace is None:
        return None
    span = _otel_trace.get_current_span()
    if span is _otel_trace.INVALID_SPAN or not span.get_span_context().is_valid:
        return None
    return span


def _call_in_span(span: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn(*args)`` with ``span`` as the current OpenTelemetry span.

    The span is only made current, never ended or marked by what ``fn`` does:
    it belongs to whoever started it.  Anything that is not an OpenTelemetry
    span (or no OpenTelemetry at all) means a plain call.
    """
    if _otel_trace is None or not isinstance(span, _otel_trace.Span):
        return fn(*args)
    token = _otel_context.attach(_otel_trace.set_span_in_context(span))
    try:
        return fn(*args)
    finally:
        _otel_context.detach(token)


class Extensions:
    """The typed store: framework state keyed by type, not by string.

    ``ext.set(ParsedCommand(...))`` stores under ``ParsedCommand``;
    ``ext.get(ParsedCommand)`` returns it.  Keys must be types and a value is
    always an instance of its key, so what ``get`` returns has the type asked
    for (or is the default).  No string key of ``ctx.set`` can reach this
    store.  Every operation is one dict operation: O(1) and atomic.  Values
    are shared with clones, so store immutable ones.
    """

    __slots__ = ("_entries",)

    def __init__(self, entries: Optional[Dict[type, Any]] = None) -> None:
        self._entries: Dict[type, Any] = {} if entries is None else entries

    def set(self, value: Any, key: Optional[type] = None) -> None:
        """Store ``value`` under ``key`` (default: ``type(value)``).

        Raises ``TypeError`` if ``key`` is not a type or ``value`` is not an
        instance of it.
        """
        if key is None:
            key = type(value)
        else:
            _check_type_key(key)
            if not isinstance(value, key):
                raise TypeError(f"{value!r} is not an instance of {key.__name__}")
        self._entries[key] = value

    def get(self, key: Type[T], default: Any = None) -> Optional[T]:
        """Return the value stored under the type ``key``, or ``default``."""
        if not isinstance(key, type):
            _check_type_key(key)
        return self._entries.get(key, default)

    def get_or_init(self, key: Type[T], factory: Callable[[], T]) -> T:
        """Return the value under ``key``; if there is none, store and return
        ``factory()``.

        If two threads race on an empty key, both factories may run but both
        callers get the same value (the first one stored).
        """
        _check_type_key(key)
        value = self._entries.get(key, _UNSET)
        if value is _UNSET:
            value = factory()
            if not isinstance(value, key):
                raise TypeError(f"factory returned {value!r}, not a {key.__name__}")
            value = self._entries.setdefault(key, value)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        names = ", ".join(k.__name__ for k in self._entries)
        return f"<Extensions [{names}]>"


class Context:
    """Everything a rule or handler needs about one event, and the way to reply.

    ``Context(event, *, sender=None, dispatcher=None, capabilities=None,
    deadline=None, span=None, bot_id="")``.  ``deadline`` is a
    ``time.monotonic()`` value or None.  ``span`` is the trace span the event
    belongs to; when it is None and OpenTelemetry is installed, the span
    current in the creating thread is taken.

    Creating a Context costs a handful of attribute stores (plus one span
    lookup with OpenTelemetry installed); everything else is created when
    first used.
    """

    __slots__ = (
        "_event",
        "_sender",
        "_dispatcher",
        "_capabilities",
        "_deadline",
        "_span",
        "_bot_id",
        "_cancelled",
        "_values",
        "_ext",
        "_effects",
        "_content",
        "_content_lock",
        "_tracker",
    )

    def __init__(
        self,
        event: Event,
        *,
        sender: Any = None,
        dispatcher: Any = None,
        capabilities: Optional[Capabilities] = None,
        deadline: Optional[float] = None,
        span: Any = None,
        bot_id: str = "",
    ) -> None:
        if not isinstance(event, Event):
            raise TypeError(f"event must be an Event, not {type(event).__name__}")
        if sender is not None and not callable(getattr(sender, "send", None)):
            raise TypeError("sender must have a send(sc, request) method")
        if dispatcher is not None and not callable(getattr(dispatcher, "submit", None)):
            raise TypeError("dispatcher must have a submit(chat_id, task) method")
        if capabilities is not None and not isinstance(capabilities, Capabilities):
            raise TypeError("capabilities must be a Capabilities or None")
        if deadline is not None and (
            isinstance(deadline, bool) or not isinstance(deadline, (int, float))
        ):
            raise TypeError("deadline must be a time.monotonic() value or None")
        if not isinstance(bot_id, str):
            raise TypeError("bot_id must be a str")
        self._event = event
        self._sender = sender
        self._dispatcher = dispatcher
        self._capabilities = capabilities
        self._deadline = deadline
        self._span = _current_span() if span is None else span
        self._bot_id = bot_id
        self._cancelled = False
        self._values: Optional[Dict[str, Any]] = None
        self._ext: Optional[Extensions] = None
        self._effects: Optional[List[Callable[[], Any]]] = None
        self._content: Any = _UNSET
        self._content_lock: Optional[threading.Lock] = None
        # The engine's record of the event's replies (Engine.handle_event),
        # shared with clones; None when nobody tracks them.
        self._tracker: Any = None

    def __repr__(self) -> str:
        e = self._event
        return f"<Context {e.platform} chat={e.chat.id!r} sender={e.sender.id!r}>"

    # -- what the Context was made with -------------------------------------

    @property
    def event(self) -> Event:
        return self._event

    @property
    def sender(self) -> Any:
        """The platform sender, or None."""
        return self._sender

    @property
    def dispatcher(self) -> Any:
        """The dispatcher replies go through, or None."""
        return self._dispatcher

    @property
    def bot_id(self) -> str:
        return self._bot_id

    @property
    def span(self) -> Any:
        """The trace span this event belongs to, or None."""
        return self._span

    @property
    def deadline(self) -> Optional[float]:
        """The ``time.monotonic()`` time by which work on the event should be
        done, or None."""
        return self._deadline

    def get_platform_capabilities(self) -> Capabilities:
        """The :class:`Capabilities` the engine gave (all False if none)."""
        caps = self._capabilities
        return _NO_CAPABILITIES if caps is None else caps

    # -- cancellation ---------------------------------------------------------

    def cancel(self) -> None:
        """Mark this Context cancelled.  Clones are not affected.  O(1)."""
        self._cancelled = True

    @property
    def cancelled(self) -> bool:
        """True once ``cancel()`` was called or the deadline has passed."""
        if self._cancelled:
            return True
        deadline = self._deadline
        return deadline is not None and time.monotonic() >= deadline

    def remaining(self) -> Optional[float]:
        """Seconds left until the deadline (never negative), or None."""
        deadline = self._deadline
        if deadline is None:
            return None
        return max(0.0, deadline - time.monotonic())

    # -- the message ----------------------------------------------------------

    @property
    def message_content(self) -> str:
        """``event.content()``, computed at most once per Context.

        The first reader parses; readers arriving meanwhile wait for that
        result instead of parsing again.  Once parsed, a read is one attribute
        load, no lock.  If ``content()`` raises, the error propagates and the
        next read tries again.
        """
        content = self._content
        if content is _UNSET:
            content = self._parse_content()
        return content

    def _parse_content(self) -> str:
        with _lazy_lock:
            lock = self._content_lock
            if lock is None:
                lock = self._content_lock = threading.Lock()
        with lock:
            if self._content is _UNSET:
                self._content = self._event.content()
            return self._content

    # -- the string store (plugins and handlers) -----------------------------

    def set(self, key: str, value: Any) -> None:
        """Store ``value`` under the string ``key``.  O(1).

        Raises ``TypeError`` for a non-str key and :class:`ReservedKeyError`
        for a reserved one.  Never touches the typed store (``ctx.ext``).
        """
        if type(key) is not str or key in _RESERVED_KEYS or key.startswith(_RESERVED_PREFIX):
            _check_key(key)
        values = self._values
        if values is None:
            with _lazy_lock:
                values = self._values
                if values is None:
                    values = self._values = {}
        values[key] = value

    def get(self, key: str, default: Any = None) -> Any:
        """Return the value under ``key``, or ``default``.  O(1); same key
        checks as :meth:`set`."""
        if type(key) is not str or key in _RESERVED_KEYS or key.startswith(_RESERVED_PREFIX):
            _check_key(key)
        values = self._values
        if values is None:
            return default
        return values.get(key, default)

    def delete(self, key: str) -> None:
        """Remove ``key`` if present.  O(1); same key checks as :meth:`set`."""
        if type(key) is not str or key in _RESERVED_KEYS or key.startswith(_RESERVED_PREFIX):
            _check_key(key)
        values = self._values
        if values is not None:
            values.pop(key, None)

    def all(self) -> Dict[str, Any]:
        """A copy of the string store, as a new dict.  O(n)."""
        values = self._values
        return {} if values is None else values.copy()

    # -- the typed store (framework components) ------------------------------

    @property
    def ext(self) -> Extensions:
        """The typed store (see :class:`Extensions`), created on first use."""
        ext = self._ext
        if ext is None:
            with _lazy_lock:
                ext = self._ext
                if ext is None:
                    ext = self._ext = Extensions()
        return ext

    # -- handing the event to another thread ----------------------------------

    def clone(self) -> "Context":
        """A Context for the same event, for independent work elsewhere.

        The clone keeps the event, sender, dispatcher, capabilities, bot id,
        deadline, trace span and parsed content.  It does not inherit
        cancellation: each has its own ``cancel()``.  The string store is
        copied into a new dict and the typed store entry by entry (values are
        shared, not copied).  Pending rule effects are not carried over.
        O(number of stored entries).
        """
        clone = object.__new__(type(self))
        clone._event = self._event
        clone._sender = self._sender
        clone._dispatcher = self._dispatcher
        clone._capabilities = self._capabilities
        clone._deadline = self._deadline
        clone._span = self._span
        clone._bot_id = self._bot_id
        clone._cancelled = False
        values = self._values
        clone._values = None if values is None else values.copy()
        ext = self._ext
        clone._ext = None if ext is None else Extensions(ext._entries.copy())
        clone._effects = None
        clone._content = self._content
        clone._content_lock = None
        clone._tracker = self._tracker
        return clone

    # -- deferred rule effects -------------------------------------------------

    def defer_rule_effect(self, effect: Callable[[], Any]) -> None:
        """Register ``effect()`` to run only if the current matcher matches.

        For rules that must record something (a cooldown's timestamp): the
        engine commits the effects once every rule of the matcher passed and
        discards them otherwise.  A rule called outside the engine therefore
        never has its effects run.
        """
        if not callable(effect):
            raise TypeError("a rule effect must be callable")
        effects = self._effects
        if effects is None:
            self._effects = [effect]
        else:
            effects.append(effect)

    def commit_pending_rule_effects(self) -> None:
        """Run the pending effects in registration order, then forget them.

        An effect that raises is logged on the ``fastdispatch`` logger and the
        others still run.
        """
        effects = self._effects
        if not effects:
            return
        self._effects = None
        for effect in effects:
            try:
                effect()
            except Exception:
                _log.exception("rule effect %r raised", effect)

    def discard_pending_rule_effects(self) -> None:
        """Forget the pending effects without running them."""
        self._effects = None

    # -- replies ---------------------------------------------------------------

    def reply(self, message: TextMessage) -> "Future[SendResult]":
        """Queue ``message`` for the event's chat; return its Future at once.

        The send runs on a dispatcher worker, in order with every other reply
        to the same chat, and goes on after the handler returns.  This method
        never raises: a missing sender or dispatcher, a full chat queue
        (``QueueFull``), a closed dispatcher (``DispatcherClosed``) or a bad
        argument all come back as an already-failed Future; if nobody looks
        at that Future, the refused reply is logged (a warning on the
        ``fastdispatch`` logger, with the chat) when it is dropped.  The
        submit happens with the event's span (``ctx.span``) current, so a
        traced dispatcher makes each send attempt a child of the event.

        Under :meth:`Engine.handle_event` the engine's :class:`EventOutcome`
        records each reply instead (the intake that asked for it reports the
        refused ones, or has the event delivered again).
        """
        chat = self._event.chat
        try:
            if not isinstance(message, TextMessage):
                raise TypeError(
                    f"reply() takes a TextMessage, not {type(message).__name__}"
                    " (use reply_text() for a str)"
                )
            sender = self._sender
            if sender is None:
                raise RuntimeError("cannot reply: this Context has no sender")
            dispatcher = self._dispatcher
            if dispatcher is None:
                raise RuntimeError("cannot reply: this Context has no dispatcher")
            request = SendRequest(target=chat, message=message)
            send = sender.send
            span = self._span
            if span is None:
                fut = dispatcher.submit(chat.id, lambda sc: send(sc, request))
            else:
                # Submit with the event's span current, so that whatever traces
                # the send (fastdispatch.metrics.TracedDispatcher) parents it there.
                fut = _call_in_span(span, dispatcher.submit, chat.id,
                                    lambda sc: send(sc, request))
        except Exception as exc:
            tracker = self._tracker
            if tracker is not None and tracker._refused(exc):
                return _failed(exc)
            return _UnqueuedReply(exc, chat.id)
        tracker = self._tracker
        if tracker is not None:
            tracker._track(fut)
        return fut

    def reply_text(self, text: str) -> "Future[SendResult]":
        """``reply(TextMessage(text))``; a non-str comes back as a failed Future."""
        if not isinstance(text, str):
            return _failed(TypeError(f"text must be a str, not {type(text).__name__}"))
        return self.reply(TextMessage(text))

    def reply_error(self, text: str) -> "Future[SendResult]":
        """Reply ``"❌ " + text``."""
        if not isinstance(text, str):
            return self.reply_text(text)
        return self.reply(TextMessage("❌ " + text))

    def reply_success(self, text: str) -> "Future[SendResult]":
        """Reply ``"✅ " + text``."""
        if not isinstance(text, str):
            return self.reply_text(text)
        return self.reply(TextMessage("✅ " + text))

    # -- optional platform abilities --------------------------------------------
    #
    # Each calls the sender directly, in the calling thread, when the sender
    # implements the protocol, and returns what it returns (or raises what it
    # raises); otherwise it returns None and does nothing.

    def try_delete_message(self, message_id: str) -> Any:
        """Delete a message of this chat, if the platform can."""
        sender = self._sender
        if isinstance(sender, MessageDeleter):
            return sender.delete_message(self._event.chat.id, message_id)
        return None

    def try_send_typing(self) -> Any:
        """Show "typing..." in this chat, if the platform can."""
        sender = self._sender
        if isinstance(sender, TypingSender):
            return sender.send_typing(self._event.chat.id)
        return None

    def try_get_group_members(self) -> Optional[List[SenderInfo]]:
        """The members of this chat, if the platform can list them."""
        sender = self._sender
        if isinstance(sender, GroupMemberLister):
            return sender.get_group_members(self._event.chat.id)
        return None

    def try_mute_message_author(self, seconds: float) -> Any:
        """Mute the event's sender in this chat for ``seconds``, if the
        platform can."""
        sender = self._sender
        if isinstance(sender, MessageAuthorMuter):
            event = self._event
            return sender.mute(event.chat.id, event.sender.id, seconds)
        return None
