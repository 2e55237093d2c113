"""``OutboundDispatcher``: configuration, threads and lifecycle.

The hot path (submit, the worker loop, the deadline loop) lives in the core
class, compiled (``_ringbuf.pyx``) or pure Python (``_core_py.py``).  This
module holds what runs once per dispatcher or once per thread, identically
for both cores: :class:`_Lifecycle`, mixed into the core class.  The class
itself is defined twice, once per core, in ``_dispatcher_cython.py`` and
``_dispatcher_python.py`` (two lines each: the compiled one cannot be
imported where the extension is not built); :func:`build_dispatcher_class`
picks one, and ``fastdispatch/__init__.py`` exports the one on the core it
chose.

Threads.  Workers are daemon threads, started on demand (never more than
``max_inflight``) and ended after ``idle_timeout`` idle seconds; so is the
deadline thread, and none holds the dispatcher once it has ended, so a
dispatcher dropped without ``shutdown()`` is collected.  They are
daemons so that a program that forgets ``shutdown()`` still exits: Python
cannot interrupt a thread, so a non-daemon worker blocked in a send would hold
the interpreter open.  ``shutdown()`` is the orderly path: it waits for the
work, wakes the idle workers so that they exit at once, and joins every thread
it started, the deadline thread included.
"""

import difflib
import inspect
import itertools
import logging
import math
import numbers
import sys
import threading
from time import monotonic

from ._types import DispatcherHooks, DispatcherStats
from .pacing import Pacing, RetryPolicy

__all__ = ["build_dispatcher_class"]

logger = logging.getLogger("fastdispatch")

_HOOK_NAMES = ("on_queued", "on_start", "on_done", "on_rejected", "on_retry")


def _check_size(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError("%s must be an int, got %r" % (name, type(value).__name__))
    if value < 1:
        raise ValueError("%s must be at least 1, got %r" % (name, value))
    if value > sys.maxsize:
        # The compiled core keeps sizes in a C ssize_t: one limit for both.
        raise ValueError("%s must be at most sys.maxsize (%d), got %r"
                         % (name, sys.maxsize, value))
    return int(value)


def _check_seconds(name, value, allow_none, allow_zero=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("%s must be a number of seconds%s, got %r" % (
            name, " or None" if allow_none else "", type(value).__name__))
    value = float(value)
    if math.isnan(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError("%s must be a positive number of seconds, got %r" % (name, value))
    if math.isinf(value):
        if allow_none:
            return None
        raise ValueError("%s must be finite, got %r" % (name, value))
    if value > threading.TIMEOUT_MAX:
        # A lock or condition wait longer than this raises OverflowError:
        # refuse it here rather than in a worker or the deadline thread.
        raise ValueError("%s must be at most threading.TIMEOUT_MAX (%g) seconds, got %r"
                         % (name, threading.TIMEOUT_MAX, value))
    return value


def _check_hooks(hooks):
    if hooks is None:
        return DispatcherHooks()
    if not isinstance(hooks, DispatcherHooks):
        raise TypeError("hooks must be a DispatcherHooks, got %r" % (type(hooks).__name__,))
    for name in _HOOK_NAMES:
        fn = getattr(hooks, name)
        if fn is not None and not callable(fn):
            raise TypeError("hooks.%s must be callable or None, got %r"
                            % (name, type(fn).__name__))
    return hooks


# retry=None: RetryAfter is still honoured with RetryPolicy()'s limits, but
# no other exception is retried (code that raises ConnectionError keeps
# getting it in its Future).
_RETRY_AFTER_ONLY = RetryPolicy(retry_on=())


class _Lifecycle:
    """The part of OutboundDispatcher that both cores share."""

    def __new__(cls, *args, **kwargs):
        # Python's own TypeError for OutboundDispatcher(8) or a misspelt
        # keyword names the method that defines the parameters
        # (_Lifecycle.__init__), an internal class: say it of the class the
        # caller named, and of the argument, before the instance is made.
        if cls.__init__ is _Lifecycle.__init__ and (
                args or not _INIT_PARAMETERS.issuperset(kwargs)):
            _refuse_arguments(cls.__name__, args, kwargs)
        return super().__new__(cls)

    def __init__(self, *, max_inflight=512, queue_size=64, send_timeout=30.0,
                 recover=None, hooks=None, idle_timeout=5.0, pacing=None, retry=None,
                 max_waiting=100_000):
        max_inflight = _check_size("max_inflight", max_inflight)
        queue_size = _check_size("queue_size", queue_size)
        max_waiting = _check_size("max_waiting", max_waiting)
        send_timeout = _check_seconds("send_timeout", send_timeout, allow_none=True)
        idle_timeout = _check_seconds("idle_timeout", idle_timeout, allow_none=False)
        if recover is not None and not callable(recover):
            raise TypeError("recover must be callable or None, got %r"
                            % (type(recover).__name__,))
        hooks = _check_hooks(hooks)
        if pacing is not None and not isinstance(pacing, Pacing):
            raise TypeError("pacing must be a Pacing or None, got %r" % (type(pacing).__name__,))
        if retry is None:
            retry = _RETRY_AFTER_ONLY
        elif not isinstance(retry, RetryPolicy):
            raise TypeError("retry must be a RetryPolicy or None, got %r" % (type(retry).__name__,))
        super().__init__()
        self._configure(max_inflight, queue_size, send_timeout, idle_timeout,
                        hooks, recover, pacing, retry, max_waiting)
        self._workers = set()
        self._worker_seq = itertools.count(1)
        self._timer_thread = None
        self._drained = threading.Condition(threading.Lock())
        # ashutdown()'s waits: (loop, Future) pairs, woken with the drain
        # waiters (under _drained's lock).
        self._async_drained = []

    # Called by the core -------------------------------------------------------

    def _spawn_worker(self):
        thread = threading.Thread(
            target=self._worker_thread,
            name="fastdispatch-worker-%d" % next(self._worker_seq),
            daemon=True,
        )
        self._workers.add(thread)
        try:
            thread.start()
        except BaseException:
            # Never started: shutdown() must not try to join it.  The core
            # logs the error and gives the thread slot back.
            self._workers.discard(thread)
            raise

    def _worker_thread(self):
        try:
            self._worker_main()
        finally:
            self._workers.discard(threading.current_thread())

    def _start_timer(self):
        thread = threading.Thread(target=self._timer_main,
                                  name="fastdispatch-deadlines", daemon=True)
        previous, self._timer_thread = self._timer_thread, thread
        try:
            thread.start()
        except BaseException:
            # Never started: shutdown() must not try to join it.  The core
            # (which calls this with its timer lock held) logs the error and
            # lets the next need of the timer try again; the task at hand
            # runs all the same.
            self._timer_thread = previous
            raise

    def _notify_drained(self):
        with self._drained:
            self._drained.notify_all()
            woken, self._async_drained = self._async_drained, []
        for loop, future in woken:
            try:
                loop.call_soon_threadsafe(_set_drained, future)
            except RuntimeError:
                pass  # its loop is closed: nobody awaits it any more

    # Public lifecycle ---------------------------------------------------------

    def close(self):
        """Refuse new tasks (``DispatcherClosed``); queued and running ones go on."""
        self._close()

    def drain(self, timeout=None):
        """Wait until no chat has waiting or running work.

        New tasks are still accepted meanwhile.  Return False if ``timeout``
        seconds passed first.  Must not be called from inside a task.
        """
        self._refuse_from_worker("drain")
        timeout = _check_seconds("timeout", timeout, allow_none=True, allow_zero=True)
        self._add_drain_waiter(1)
        try:
            with self._drained:
                return self._drained.wait_for(self._is_idle, timeout)
        finally:
            self._add_drain_waiter(-1)

    def _is_idle(self):
        # Nothing pending, no chat, no slot held: stats() read after a
        # drain() shows every task settled and inflight 0.
        return self._pending_count() == 0 and self.active_chats == 0 and self.inflight == 0

    def shutdown(self, timeout=None):
        """``close()``, then ``drain(timeout)``, then end every thread.

        Return True once the work is done and no thread of this dispatcher
        is left; False if ``timeout`` seconds passed first (the dispatcher
        stays closed and the remaining work goes on).
        """
        self._refuse_from_worker("shutdown")
        timeout = _check_seconds("timeout", timeout, allow_none=True, allow_zero=True)
        deadline = None if timeout is None else monotonic() + timeout
        self.close()
        if not self.drain(timeout):
            return False
        self._stop_workers()
        threads = list(self._workers)
        if self._timer_thread is not None:
            threads.append(self._timer_thread)
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - monotonic()))
            if thread.is_alive():
                return False
        return True

    async def ashutdown(self, timeout=None):
        """``shutdown()`` for asyncio code: never blocks the event loop.

        ``close()``, then wait (awaiting, so that this loop goes on running
        the dispatcher's coroutine tasks meanwhile) until the work is done,
        then end every thread.  Logs at INFO what was sent and what failed
        since it began, and at WARNING what was left if ``timeout`` seconds
        passed first.  Returns True once the work is done and no thread of
        this dispatcher is left, else False (the dispatcher stays closed and
        the remaining work goes on).  Must not be awaited from inside a task
        of the same dispatcher.
        """
        import asyncio

        self._refuse_from_worker("ashutdown", on_loop_ok=True)
        if self.running_chat() is not None:
            raise RuntimeError("ashutdown() awaited from inside a task of the same "
                               "dispatcher would wait for itself")
        timeout = _check_seconds("timeout", timeout, allow_none=True, allow_zero=True)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else monotonic() + timeout
        before = self.stats()
        self.close()
        done = await self._await_drained(loop, deadline)
        if done:
            self._stop_workers()
            threads = list(self._workers)
            if self._timer_thread is not None:
                threads.append(self._timer_thread)
            for thread in threads:
                # Idle threads end within a moment of being woken: look
                # again between turns of the loop instead of joining.
                while thread.is_alive() and (deadline is None or monotonic() < deadline):
                    await asyncio.sleep(0.001)
                if thread.is_alive():
                    done = False
                    break
        self._log_shutdown(before, done, timeout)
        return done

    async def _await_drained(self, loop, deadline):
        import asyncio

        mine = set()
        self._add_drain_waiter(1)
        try:
            while True:
                future = loop.create_future()
                mine.add(future)
                with self._drained:
                    self._async_drained.append((loop, future))
                if self._is_idle():
                    return True
                remaining = None if deadline is None else deadline - monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                try:
                    await asyncio.wait_for(future, remaining)
                except asyncio.TimeoutError:
                    return self._is_idle()
        finally:
            with self._drained:
                self._async_drained = [p for p in self._async_drained if p[1] not in mine]
            self._add_drain_waiter(-1)

    def _log_shutdown(self, before, done, timeout):
        after = self.stats()
        sent = after.completed - before.completed
        failed = ((after.failed - before.failed) + (after.timed_out - before.timed_out)
                  + (after.discarded - before.discarded) + (after.cancelled - before.cancelled))
        logger.info("ashutdown: %d task(s) sent and %d failed, timed out, discarded or "
                    "cancelled since it began", sent, failed)
        if not done:
            left = after.submitted - (after.completed + after.failed + after.discarded
                                      + after.cancelled + after.timed_out)
            logger.warning("ashutdown: %gs passed with %d task(s) not done (%d running, in "
                           "%d chat(s)) and %d caller(s) waiting for room; they go on",
                           timeout, left, after.inflight, after.active_chats, after.waiting)

    def force_close(self):
        """Close; cancel every running and waiting task; return at once.

        Running tasks see ``sc.cancelled`` and their Futures fail with
        ``Cancelled``; waiting tasks' Futures are cancelled
        (``fut.cancelled()``).  Threads still blocked in a send end when the
        send returns.  No task starts once this has returned.
        """
        self._refuse_new_starts()
        self._cancel_everything()
        # Nothing can start any more: let the workers end as soon as their
        # current task returns, and end the deadline thread now.
        self._stop_workers()

    def stats(self):
        """A :class:`DispatcherStats` snapshot of the counters."""
        return DispatcherStats(*self._counters())

    def _refuse_from_worker(self, what, on_loop_ok=False):
        if threading.current_thread() in self._workers:
            raise RuntimeError("%s() called from inside a task of the same "
                               "dispatcher would wait for itself" % what)
        if not on_loop_ok and self._uses_loops():
            asyncio = sys.modules.get("asyncio")
            if asyncio is not None and asyncio._get_running_loop() is not None:
                raise RuntimeError(
                    "%s() called on a running event loop would block the loop that "
                    "coroutine tasks run on: await dispatcher.ashutdown(timeout) "
                    "instead, or call it from another thread" % (what,))

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.shutdown()

    def __repr__(self):
        return "<%s %s active_chats=%d inflight=%d>" % (
            type(self).__name__, "closed" if self.closed else "open",
            self.active_chats, self.inflight)


def _set_drained(future):
    if not future.done():
        future.set_result(True)


_INIT_PARAMETERS = frozenset(
    name for name in inspect.signature(_Lifecycle.__init__).parameters if name != "self")


def _refuse_arguments(name, args, kwargs):
    if args:
        raise TypeError(
            "%s() takes keyword arguments only, got %d positional argument%s (%s); "
            "e.g. %s(max_inflight=%s)" % (
                name, len(args), "" if len(args) == 1 else "s",
                ", ".join(_safe_arg(a) for a in args), name, _safe_arg(args[0])))
    for key in kwargs:
        if key not in _INIT_PARAMETERS:
            close = difflib.get_close_matches(key, sorted(_INIT_PARAMETERS), 1)
            raise TypeError("%s() got an unexpected keyword argument %r%s" % (
                name, key, "; did you mean %r?" % close[0] if close else
                " (it takes %s)" % ", ".join(sorted(_INIT_PARAMETERS))))


def _safe_arg(value):
    from ._errors import _safe_repr
    return _safe_repr(value)


# What Cython adds to an extension type for its own use; help() and dir()
# of the compiled core's dispatcher class leave it out.
_CYTHON_NAMES = frozenset(("__pyx_vtable__", "__reduce_cython__", "__setstate_cython__"))


class _HideCythonNames(type):
    """The compiled core's dispatcher class's metaclass: its ``__dir__``
    leaves out what Cython adds to an extension type for its own use, so
    that ``help()`` (pydoc lists what ``dir(cls)`` returns) shows the API.
    Instances are untouched: attribute lookups and calls on a dispatcher do
    not go through the metaclass."""

    def __dir__(cls):
        names = []
        for name in type.__dir__(cls):
            if name in _CYTHON_NAMES:
                continue
            value = getattr(cls, name, None)
            if name in ("__reduce__", "__setstate__") and "cython" in getattr(value, "__name__", ""):
                continue   # __reduce__ = __reduce_cython__: Cython's pickling refusal
            names.append(name)
        return names


_DOCSTRING = """Per-chat outbound dispatcher: FIFO within a chat, parallel across chats.

    ``OutboundDispatcher(*, max_inflight=512, queue_size=64,
    send_timeout=30.0, recover=None, hooks=None, idle_timeout=5.0,
    pacing=None, retry=None, max_waiting=100_000)``

    - ``max_inflight``: most tasks running at once, across all chats
      (the worker-thread cap).
    - ``queue_size``: how many tasks one chat may have waiting.
    - ``send_timeout``: seconds each task may run (None: no limit).
    - ``recover``: ``callable(exc)`` called after a panic or a hook failure.
    - ``hooks``: a :class:`DispatcherHooks`.
    - ``idle_timeout``: seconds an idle worker thread lingers.
    - ``pacing``: a :class:`Pacing` (rate limits per chat and bot-wide),
      or None to pace nothing.
    - ``retry``: a :class:`RetryPolicy`; None still honours
      ``RetryAfter`` (with ``RetryPolicy()``'s limits) and retries
      nothing else.
    - ``max_waiting``: most callers waiting for room at once, bot-wide
      (``submit``/``post``/``asubmit`` with ``block=True`` on a full
      chat); past it such a call raises ``QueueFull`` at once.

    Guarantees and design:
    https://github.com/fastdispatch/fastdispatch/blob/main/docs/dispatcher.md
    """


def build_dispatcher_class(core):
    """Return the ``OutboundDispatcher`` class on ``core``: the compiled core
    module (``fastdispatch._ringbuf``) or the pure-Python one
    (``fastdispatch._core_py``)."""
    if core.__name__ == __package__ + "._ringbuf":
        from ._dispatcher_cython import OutboundDispatcher
    elif core.__name__ == __package__ + "._core_py":
        from ._dispatcher_python import OutboundDispatcher
    else:
        raise ValueError("no OutboundDispatcher for %r: the cores are %s._ringbuf and "
                         "%s._core_py" % (core.__name__, __package__, __package__))
    return OutboundDispatcher
