"""Exceptions raised by the dispatcher.

Every exception the dispatcher raises or puts into a Future derives from
:class:`DispatcherError`, so ``except DispatcherError`` catches all of them.
Two of them also derive from the standard exception a caller would already
catch for the same situation: :class:`SendTimeout` is a ``TimeoutError`` and
:class:`Cancelled` is a ``concurrent.futures.CancelledError``.
"""

import reprlib
from concurrent.futures import CancelledError as _FutureCancelledError
from typing import Literal

__all__ = [
    "DispatcherError",
    "QueueFull",
    "DispatcherClosed",
    "SendTimeout",
    "TaskDiscarded",
    "Cancelled",
    "RetryAfter",
]


class DispatcherError(Exception):
    """Base class of every error raised by fastdispatch's dispatcher."""


class QueueFull(DispatcherError):
    """The chat's waiting queue already holds ``queue_size`` tasks.

    Raised synchronously by ``submit``/``post``; the task was not queued and
    will never run.  This is backpressure: the caller decides whether to drop,
    retry later or tell the user.
    """


class DispatcherClosed(DispatcherError):
    """The dispatcher was closed; it accepts no new tasks."""


class SendTimeout(DispatcherError, TimeoutError):
    """The task ran past its deadline (``send_timeout`` seconds after it started)."""


class TaskDiscarded(DispatcherError):
    """The task was dropped because a task of the same chat panicked.

    The panicking task's own Future gets this error too, with ``__cause__``
    set to the ``BaseException`` it raised.
    """


class Cancelled(DispatcherError, _FutureCancelledError):
    """The running task was cancelled by ``force_close()``."""


class RetryAfter(DispatcherError):
    """Raised by a task to be run again, no earlier than ``seconds`` from now.

    ``scope="chat"`` (the default) pauses only the task's own chat: the same
    task runs again before any later task of that chat, while other chats go
    on.  ``scope="global"`` pauses every chat's starts until then (running
    tasks go on).  This is what a platform's HTTP 429 with ``retry_after``
    becomes.  A ``RetryAfter`` longer than the dispatcher's
    ``RetryPolicy.max_retry_after`` fails the task's Future with it at once.
    """

    def __init__(self, seconds: float, scope: Literal["chat", "global"] = "chat") -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError("seconds must be a number, got %r" % (type(seconds).__name__,))
        seconds = float(seconds)
        if seconds != seconds or seconds < 0:
            raise ValueError("seconds must be >= 0, got %r" % (seconds,))
        if scope not in ("chat", "global"):
            raise ValueError('scope must be "chat" or "global", got %r' % (scope,))
        super().__init__(seconds, scope)
        self.seconds = seconds
        self.scope = scope

    def __str__(self) -> str:
        return "retry after %gs (%s)" % (self.seconds, self.scope)


class _BoundedRepr(reprlib.Repr):
    """``reprlib.Repr`` that also cuts ``bytes`` before formatting them."""

    def __init__(self):
        super().__init__()
        self.maxstring = self.maxother = self.maxlong = 80
        self.maxlevel = 3

    def repr_bytes(self, x, level):
        if len(x) <= self.maxstring:
            return repr(x)
        return repr(x[:self.maxstring // 2]) + "..." + repr(x[-(self.maxstring // 2):])

    repr_bytearray = repr_bytes


_bounded_repr = _BoundedRepr().repr


def _safe_repr(obj):
    """A short ``repr(obj)`` for an error message; never raises.

    A chat id or a task's exception is user code, and its ``__repr__`` runs
    in a worker, the deadline thread or the middle of ``submit``: if it
    raises, the message names the type instead.  The result is cut to about
    80 characters (strings and bytes before they are formatted, so that a
    100 MB chat id costs no more than a short one; an object's own
    ``__repr__`` is cut after it returns).
    """
    try:
        return _bounded_repr(obj)
    except BaseException:
        try:
            name = type(obj).__name__
        except BaseException:
            name = "object"
        return "<%s object (repr() failed)>" % (name,)


# The modules that call tasks (the compiled core; the twin's rooms that
# start tasks): a traceback that ends in one of them ends
# before the task's own code.
_CORES = ("fastdispatch._ringbuf", "fastdispatch._core.outcomes", "fastdispatch._core.items")


def _task_call_error(chat_id, exc):
    """The error a task fails with when calling it raised ``exc`` (a TypeError).

    A TypeError raised by the call itself, before any of the task's own
    code ran (``task()`` written without a parameter, or a callable that
    takes no argument), is a mistake about what a task receives: say so,
    with the original error as the cause.  One raised inside the task is
    left as it is.  Only a failed call runs this.
    """
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None and tb.tb_frame.f_globals.get("__name__") not in _CORES:
        return exc  # raised by the task's own code (or code it called)
    error = TypeError(
        "the task for chat %s could not be called as task(sc): a task receives one "
        "argument, the SendContext of its send (e.g. lambda sc: ..., or def task(sc): ...)"
        "; calling it raised: %s" % (_safe_repr(chat_id), exc))
    error.__cause__ = exc
    return error


# Why a caller that asked to wait for room may not (the cores' _NO_ROOM_*
# codes, the same in both).
NO_ROOM_MAX, NO_ROOM_SELF, NO_ROOM_SLOTS, NO_ROOM_CYCLE, NO_ROOM_LOOP = 1, 2, 3, 4, 5


def _no_room(chat_id, capacity, why, max_waiting):
    """The QueueFull of a caller that asked to wait for room and may not."""
    chat = _safe_repr(chat_id)
    if why == NO_ROOM_SELF:
        return QueueFull(
            "chat %s is full and this call comes from inside its own running task: "
            "waiting for room would wait for itself (room is made only when that "
            "task ends)" % (chat,))
    if why == NO_ROOM_SLOTS:
        return QueueFull(
            "chat %s is full, and waiting for room from inside a running task would "
            "leave every max_inflight slot held by a task that waits: nothing could "
            "start to make room" % (chat,))
    if why == NO_ROOM_LOOP:
        return QueueFull(
            "chat %s is full, and waiting for room here would block this thread's "
            "running event loop, which the dispatcher's coroutine tasks need: "
            "use `await dispatcher.asubmit(chat_id, task, block=True)`" % (chat,))
    if why == NO_ROOM_CYCLE:
        return QueueFull(
            "chat %s is full, and its running task waits (directly or through other "
            "chats) for room in the chat of the task making this call: waiting would "
            "never end" % (chat,))
    return QueueFull("chat %s already has %d waiting tasks and %d callers wait for room "
                     "(max_waiting)" % (chat, capacity, max_waiting))


def _wait_ended(chat_id, closed, timeout):
    """What a caller that waited for room and was not let in gets."""
    if closed:
        return DispatcherClosed("the dispatcher was closed while this call waited for "
                                "room in chat %s" % (_safe_repr(chat_id),))
    return QueueFull("chat %s had no room within the %gs timeout"
                     % (_safe_repr(chat_id), timeout))
