"""A task on its way: ``SendContext`` (what the task receives) and its calls.

One object per accepted task carries its chat, its function, its Future,
its deadline and its attempt, and is what the task's code sees
(``sc.cancelled``, ``sc.report_limit``...).  The helpers here call the task
in its caller's context and carry a coroutine task's result to its event
loop (``_aio_set``, ``_on_loop``, ``_cancel_aio``).
"""

import inspect
import sys
import threading
from time import monotonic

from .._errors import Cancelled, _safe_repr, SendTimeout
from ..pacing import _checked_report

from . import constants
from .constants import _BY_FORCE, _current_task, _NOT_CANCELLED


# Guards the lazy creation of SendContext events (rare: only for wait()).
_event_lock = threading.Lock()


class SendContext:
    """What a task receives: its chat, its deadline and its cancellation.

    A task should pass it on to blocking calls (``sc.remaining()`` as a
    timeout) and may poll ``sc.cancelled`` or call ``sc.check()``.
    ``SendContext(chat_id, deadline=None)`` can be built by hand to test a
    sender outside a dispatcher.
    """

    __slots__ = (
        "chat_id", "_deadline", "_cancel", "_event",
        "_fn", "_future", "_t_queued", "_t_start", "_queue_len", "_attempt",
        "_error", "_loop", "_aio", "_queue", "_chatq", "_ctx", "_inline",
    )

    def __init__(self, chat_id, deadline=None):
        self.chat_id = chat_id
        self._deadline = None if deadline is None else float(deadline)
        self._cancel = _NOT_CANCELLED
        self._event = None
        self._fn = self._future = None
        self._t_queued = self._t_start = 0.0
        self._queue_len = 0
        self._attempt = 1
        self._error = None  # set when the deadline or force_close() claims it
        # A coroutine task (asubmit): the event loop it runs on, the asyncio
        # Task of the awaitable it returned, and its chat while that runs
        # (None once its end was claimed: see DispatcherCore._claim); all
        # None for a thread task.
        self._loop = self._aio = self._queue = self._ctx = None
        # The chat queue of the running attempt (set at its start), through
        # which report_limit reaches the limiter; None outside a dispatcher.
        self._chatq = None
        # asubmit: its chat starts in its caller's own call (see _start_async).
        self._inline = False

    @property
    def attempt(self):
        """Which attempt of the task this is: 1 for the first run."""
        return self._attempt

    @property
    def started(self):
        """``time.monotonic()`` value at which this attempt was called, or None.

        Taken right before the call, after ``on_start``: with pacing, it is
        the very stamp the rate-limit windows hold.  None when the
        dispatcher has no pacing, no ``send_timeout`` and no ``on_done`` hook
        (it then reads no clock per task), or outside a dispatcher.
        """
        return self._t_start or None

    @property
    def deadline(self):
        """``time.monotonic()`` value at which the task must stop, or None."""
        return self._deadline

    def remaining(self):
        """Seconds left before the deadline (never negative), or None."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - monotonic())

    @property
    def cancelled(self):
        """True once the deadline passed or ``force_close()`` ran."""
        if self._cancel:
            return True
        return self._deadline is not None and monotonic() >= self._deadline

    def wait(self, timeout=None):
        """Block until cancelled or ``timeout`` seconds; return ``cancelled``."""
        if self.cancelled:
            return True
        remaining = self.remaining()
        if remaining is not None and (timeout is None or remaining < timeout):
            timeout = remaining
        if timeout is not None and timeout > threading.TIMEOUT_MAX:
            timeout = None  # longer than a lock can wait: until cancelled
        with _event_lock:
            if self._cancel:
                return True
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        event.wait(timeout)
        return self.cancelled

    def check(self):
        """Raise ``Cancelled`` or ``SendTimeout`` if cancelled; else return."""
        if self._cancel == _BY_FORCE:
            raise Cancelled("the dispatcher was force-closed")
        if self.cancelled:
            raise SendTimeout("the send deadline passed")

    def report_limit(self, remaining, reset_after, *, bucket=None, scope="chat"):
        """Tell the dispatcher what the platform announced in its answer.

        After this attempt at most ``remaining`` more starts are allowed
        before ``reset_after`` seconds from now: for this chat
        (``scope="chat"``), for every chat (``scope="global"``), or for every
        chat that reports the same ``bucket`` string (``bucket`` wins over
        ``scope``).  A later report replaces an earlier one for the same
        bucket.  Bad values raise ``TypeError``/``ValueError`` here, in the
        task.  Outside a dispatcher the values are checked, then dropped.
        Cost: O(1) (one lock, a few dict operations).
        """
        remaining, reset_after, bucket, is_global = _checked_report(
            remaining, reset_after, bucket, scope)
        q = self._chatq
        if q is not None and q.core_ref is not None:
            core = q.core_ref()
            if core is not None:
                core._limiter.learn(q, remaining, reset_after, bucket, is_global)

    def __repr__(self):
        return "<SendContext chat_id=%s deadline=%r cancelled=%r>" % (
            _safe_repr(self.chat_id), self._deadline, self.cancelled)

    def _cancel_with(self, reason):
        # Called once, by whoever claimed the task out of the running registry.
        self._cancel = reason
        with _event_lock:
            event = self._event
        if event is not None:
            event.set()


def _new_item(chat_id, fn, future, t_queued, loop=None, ctx=None):
    item = SendContext.__new__(SendContext)
    item.chat_id = chat_id
    item._deadline = None
    item._cancel = _NOT_CANCELLED
    item._event = None
    item._fn = fn
    item._future = future
    item._t_queued = t_queued
    item._t_start = 0.0
    item._queue_len = 0
    item._attempt = 1
    item._error = None
    item._loop = loop
    item._ctx = ctx
    item._aio = item._queue = item._chatq = None
    item._inline = False
    return item


def _call_in_context(item):
    # In the task's own context (see _start_async): mark it as the running
    # task there, then call it.
    _current_task.set(item)
    return item._fn(item)


def _awaitable_error(item, result):
    # A thread task that returned a coroutine (or another awaitable) did not
    # do its work: nothing awaits it on a worker thread.  Close a coroutine
    # (no "never awaited" warning) and fail the task saying what to use.
    close = getattr(result, "close", None)
    if inspect.iscoroutine(result) and close is not None:
        try:
            close()
        except BaseException:
            pass
    return TypeError(
        "the task for chat %s returned %s, which a worker thread cannot await: "
        "give coroutine tasks to `await dispatcher.asubmit(chat_id, task)`, which "
        "runs them on the caller's event loop" % (
            _safe_repr(item.chat_id), _safe_repr(type(result).__name__)))


def _caller_loop():
    # The calling thread's running event loop, or None (asyncio is imported
    # on first use: a dispatcher that never sees a coroutine task does not
    # pay for it).
    if constants._asyncio is None:
        import asyncio as _asyncio_module
        constants._asyncio = _asyncio_module
    return constants._asyncio._get_running_loop()


def _aio_set(future, result, error):
    # On the future's own loop: resolve it, unless it is already done (the
    # caller cancelled its await).
    if not future.done():
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


def _on_loop(loop, fn, *args):
    """Run ``fn(*args)`` on ``loop``: now when this is its thread, else at
    its next turn.  False when the loop is closed (nothing can run there)."""
    if constants._asyncio._get_running_loop() is loop:
        fn(*args)
        return True
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed
        return False
    return True


def _cancel_aio(item):
    # On the loop: cancel the awaitable a coroutine task is running, if any.
    aio = item._aio
    if aio is not None:
        aio.cancel()


# Whether a coroutine task is driven by its caller (_Driven): only where a
# Task can say whether its own cancellation stands (``Task.cancelling``,
# 3.11); before, each attempt gets an asyncio Task of its own.
_DRIVES = sys.version_info >= (3, 11)


class _Driven:
    """A coroutine task's attempt, driven by its own caller (G17, G26).

    ``asubmit``'s caller waits on a Future; when its task's attempt starts
    (``_start_async``), that Future gets this object: ``out``, the Future
    that now holds the outcome, and ``coro``, the coroutine the attempt
    returned (None if it returned something else, whose end ``out`` will
    hear).  The caller then awaits this object: the coroutine runs in the
    caller's own asyncio Task, each step in the task's context (a copy of
    the caller's, taken at ``asubmit``), as a per-chat ``asyncio.Lock``'s
    holder runs its code, with no Task, Future or done-callback of its
    own.  ``cancel()`` (a deadline, ``force_close()``) cancels what the
    coroutine awaits, as ``Task.cancel()`` does; the caller's own
    cancellation reaches the coroutine through its Task.  When the
    coroutine ends, ``result``, ``error``, ``cancelled`` and ``suspended``
    (whether it ever waited) say how.
    """

    __slots__ = ("out", "coro", "ctx", "waiting_on", "must_cancel", "cancelling",
                 "driven", "cancels_before", "result", "error", "cancelled", "suspended")

    def __init__(self, out, ctx):
        self.out = out
        self.ctx = ctx
        self.coro = self.waiting_on = self.result = self.error = None
        self.must_cancel = self.cancelling = self.driven = False
        self.cancelled = self.suspended = False
        self.cancels_before = -1

    def cancel(self):
        self.cancelling = True
        waiting_on = self.waiting_on
        if waiting_on is not None and waiting_on.cancel():
            return
        self.must_cancel = True

    def __await__(self):
        # When the coroutine ends, its outcome is kept in result, error,
        # cancelled and suspended.
        self.driven = True
        coro = self.coro
        run = self.ctx.run
        value = exc = None
        while True:
            if self.must_cancel:
                self.must_cancel = False
                exc = constants._asyncio.CancelledError()
            try:
                if exc is None:
                    yielded = run(coro.send, value)
                else:
                    yielded = run(coro.throw, exc)
            except StopIteration as stop:
                self.result = stop.value
                return
            except constants._asyncio.CancelledError:
                self.cancelled = True
                return
            except BaseException as error:
                self.error = error
                return
            self.suspended = True
            self.waiting_on = yielded
            exc = None
            try:
                value = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as thrown:
                exc = thrown
                if type(thrown) is constants._asyncio.CancelledError:
                    if self.cancelling:
                        self.cancelling = False
                    elif self.cancels_before < 0:
                        # Not ours: the caller's Task was asked to cancel
                        # (or code inside the coroutine cancels its own
                        # Task and takes that back: see _caller_cancelled).
                        self.cancels_before = constants._asyncio.current_task().cancelling() - 1
            self.waiting_on = None


def _started_here(item, future):
    # The attempt that asubmit's own call started, when it is a coroutine
    # for that caller to drive (its ``out`` is the call's Future: see
    # _start_async); else None.
    aio = item._aio
    if type(aio) is _Driven and aio.out is future:
        return aio
    return None


def _caller_cancelled(driven):
    # After a driven coroutine ended: whether a cancellation of its caller's
    # Task reached it and still stands (one that code inside took back with
    # ``uncancel()``, as anyio's cancel scopes do, does not count).
    return (driven.cancels_before >= 0
            and constants._asyncio.current_task().cancelling() > driven.cancels_before)
