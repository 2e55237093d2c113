"""Exceptions raised by the dispatcher.

Every exception the dispatcher raises or puts into a Future derives from
:class:`DispatcherError`, so ``except DispatcherError`` catches all of them.
Two of them also derive from the standard exception a caller would already
catch for the same situation: :class:`SendTimeout` is a ``TimeoutError`` and
:class:`Cancelled` is a ``concurrent.futures.CancelledError``.
"""

from concurrent.futures import CancelledError as _FutureCancelledError

__all__ = [
    "DispatcherError",
    "QueueFull",
    "DispatcherClosed",
    "SendTimeout",
    "TaskDiscarded",
    "Cancelled",
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
