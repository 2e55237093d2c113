"""Small value types shared by both implementations of the core."""

import concurrent.futures
import logging
import math
import numbers
import threading
from typing import Any, Callable, NamedTuple, Optional

__all__ = ["DispatchInfo", "DispatcherHooks", "DispatcherStats"]

_futures_logger = logging.getLogger("concurrent.futures")
_logger = logging.getLogger("fastdispatch")


class Future(concurrent.futures.Future):
    """What ``submit`` returns: a ``concurrent.futures.Future`` in every respect,
    except that its done-callbacks cannot break the thread that resolves it.

    ``concurrent.futures`` runs the callbacks in the thread that sets the
    result and catches only ``Exception``: a callback raising ``SystemExit``
    or ``KeyboardInterrupt`` would unwind a worker, the deadline thread or
    ``force_close()`` half-way, and skip the callbacks after it (those of
    ``asyncio.wrap_future`` among them).  Here every callback runs; one that
    raises an ``Exception`` is logged as ``concurrent.futures`` logs it, and
    any other ``BaseException`` is logged on the ``fastdispatch`` logger.

    The compiled core, once imported, gives the class a ``result()`` that
    hands over a finished Future's result from C and is the stdlib's method
    in every other case (see ``_future_result`` in ``_ringbuf.pyx``).
    """

    def _invoke_callbacks(self):
        for callback in self._done_callbacks:
            try:
                callback(self)
            except Exception:
                _futures_logger.exception("exception calling callback for %r", self)
            except BaseException:
                _logger.exception("done-callback of %r raised; ignored", self)


class DispatchInfo(NamedTuple):
    """What ``on_done`` learns about one finished task (immutable).

    ``queue_len`` is the number of tasks of the same chat that were still
    waiting when this one started; ``queue_latency`` is the time from
    ``submit`` to start and ``run_latency`` the time from start to the end
    (both in seconds, 0.0 for a task that never started); ``error`` is the
    exception the task ended with, or ``None``.
    """

    chat_id: Any
    queue_len: int
    queue_latency: float
    run_latency: float
    error: Optional[BaseException]


class DispatcherHooks(NamedTuple):
    """Observation points, each optional; all are called synchronously.

    - ``on_queued(chat_id, queue_len)``: after a task was queued (``queue_len``
      counts it), in the submitting thread.
    - ``on_start(chat_id)``: in the worker thread, just before a task runs.
    - ``on_done(info)``: after each task ends, whatever the outcome, with a
      :class:`DispatchInfo`.
    - ``on_rejected(chat_id, exc)``: when ``submit``/``post`` refuses a task
      with ``QueueFull`` or ``DispatcherClosed``.
    - ``on_retry(chat_id, attempt, delay, exc)``: in the worker thread, when
      a task that raised ``exc`` (a ``RetryAfter`` or a ``retry_on`` error)
      will run again after ``delay`` seconds; ``attempt`` is the attempt that
      just failed (1 for the first).

    A hook that raises is logged on the ``fastdispatch`` logger and handed to
    the dispatcher's ``recover`` callable; it never stops a worker or loses a
    task.
    """

    on_queued: Optional[Callable[[Any, int], Any]] = None
    on_start: Optional[Callable[[Any], Any]] = None
    on_done: Optional[Callable[[DispatchInfo], Any]] = None
    on_rejected: Optional[Callable[[Any, BaseException], Any]] = None
    on_retry: Optional[Callable[[Any, int, float, BaseException], Any]] = None


class DispatcherStats(NamedTuple):
    """A snapshot of the dispatcher's counters (``d.stats()``).

    ``submitted`` counts accepted tasks only.  Every accepted task ends in
    exactly one of ``completed`` (returned), ``failed`` (raised, or panicked),
    ``discarded`` (dropped after a panic of its chat), ``cancelled`` (cancelled
    before it started, or by ``force_close()``) or ``timed_out``; so once the
    dispatcher is drained ``submitted == completed + failed + discarded +
    cancelled + timed_out``; a retried task still ends in exactly one of
    them.  ``retried`` counts the retries scheduled and ``paced`` the starts
    that had to wait for a rate limit.  ``active_chats``, ``inflight``,
    ``threads``, ``parked`` (chats waiting out a rate limit or a
    ``RetryAfter``) and ``waiting`` (callers of ``submit``/``post``/``asubmit``
    with ``block=True`` waiting for room in a full chat; a caller counts in
    ``submitted`` once its task is let in) are gauges read at the same moment.

    Fields are readable by name (``s.completed``) or by key
    (``s["completed"]``).
    """

    submitted: int
    completed: int
    failed: int
    rejected: int
    discarded: int
    cancelled: int
    timed_out: int
    active_chats: int
    inflight: int
    threads: int
    retried: int = 0
    paced: int = 0
    parked: int = 0
    waiting: int = 0

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, str):
            if key not in self._fields:
                raise KeyError(key)
            return getattr(self, key)
        return tuple.__getitem__(self, key)


def _checked_wait(timeout):
    """The ``timeout`` of a ``block=True`` call, checked: None or seconds >= 0.

    Shared by both cores; only a call that may wait runs it (the
    non-blocking call's path does not).
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError("timeout must be a number of seconds or None, got %r"
                        % (type(timeout).__name__,))
    try:
        value = float(timeout)
    except OverflowError:
        value = math.inf
    if value != value or value < 0:
        raise ValueError("timeout must be a non-negative number of seconds, got %r"
                         % (timeout,))
    if value > threading.TIMEOUT_MAX:
        return None  # longer than any wait can be: no limit
    return value
