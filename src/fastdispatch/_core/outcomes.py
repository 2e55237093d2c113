"""A task's run and its outcome: run, end, retry, panic (G7, G10, G13).

``_run`` calls a thread task; ``_begin`` and ``_end`` bracket every start
(hooks, the registry, the Future).  ``_end`` decides: a result, an error,
a retry (``_retry_later`` asks ``pacing._retry_plan``, then puts
the task back at its chat's head, parked until its delay), or a panic
(``_panic``: the chat's waiting tasks are discarded, ``recover`` is
called, the chat is closed).  Every accepted task's Future is resolved
exactly once, here or by the path that took its outcome.
"""

import inspect
from time import monotonic

from .._errors import Cancelled, _safe_repr, _task_call_error, TaskDiscarded
from ..pacing import _retry_plan

from .chats import _admit_locked, _peek_head, _take_head_locked
from .constants import (
    _BY_TIMEOUT, _DONE, _FORCED, _PANICKED, _REFUSED, _RETRYING, C_CANCELLED,
    C_COMPLETED, C_DISCARDED, C_FAILED, logger)
from .deadlines import _Deadlines
from .futures import _future_finish, _future_start, _settle
from .items import _aio_set, _awaitable_error, _on_loop


class _Outcomes(_Deadlines):
    """Running a task and deciding its outcome: result, error, retry or panic."""

    __slots__ = ("_on_start", "_on_retry", "_retry", "_max_attempts")

    def _drop_dead_head(self, q, loop):
        # The loop the chat's next task belongs to is closed, or stopped
        # before it could start it: that task never runs.  It fails with
        # Cancelled, and the chat goes on.
        with q.lock:
            head = _peek_head(q)
            item = _take_head_locked(q) if head is not None and head._loop is loop else None
        if q.woken is not None:
            self._wake_admitted(q)
        if item is None:
            return
        error = Cancelled("the event loop of this coroutine task is closed or stopped "
                          "before the task could start")
        if item._attempt > 1:
            self._settle_started(item, error, C_CANCELLED)
        else:
            self._finish(item, error, C_CANCELLED)
            self._maybe_drained()

    def _refuse_head(self, q, exc):
        # The limiter could not judge this chat (limit_for or the chat id's
        # __hash__/__eq__ failed): its next task fails with that error, the
        # chat goes on with the one after.
        with q.lock:
            item = _take_head_locked(q)
        if q.woken is not None:
            self._wake_admitted(q)
        if item is None:
            return False
        logger.error("chat %s: cannot apply pacing", _safe_repr(q.chat_id), exc_info=exc)
        if not isinstance(exc, Exception):
            exc = TypeError("pacing failed: %r" % (exc,))
        if item._attempt > 1:
            self._settle_started(item, exc, C_FAILED)
        else:
            self._finish(item, exc, C_FAILED)
            self._maybe_drained()
        return True

    def _run(self, item, q):
        """Run one attempt of a thread task: _DONE, _PANICKED or _RETRYING."""
        future = item._future
        if self._forced:
            # Popped just before force_close() cleared the queue: dropped as
            # a waiting task is (its Future cancelled).  _register re-checks.
            if q.reserved:
                self._limiter.release(q)
            if item._attempt == 1:
                self._finish(item, Cancelled("the dispatcher was force-closed"), C_CANCELLED)
                self._maybe_drained()
            else:
                self._settle_started(item, Cancelled("the dispatcher was force-closed"),
                                     C_CANCELLED)
            return _DONE
        if item._attempt == 1 and future is not None and not _future_start(future):
            if q.reserved:
                self._limiter.release(q)
            self._finish(item, Cancelled("cancelled before it started"), C_CANCELLED)
            return _DONE
        if not self._begin(item, q):
            return _DONE
        result = panic = None
        try:
            result = item._fn(item)
            error = None
        except Exception as exc:
            error = exc if type(exc) is not TypeError else _task_call_error(item.chat_id, exc)
        except BaseException as exc:
            error = panic = exc
        if error is None and result is not None and inspect.isawaitable(result):
            error = _awaitable_error(item, result)
        return self._end(item, q, result, error, panic, posted=future is None)

    def _begin(self, item, q):
        # The start of an attempt, right before its call (on its worker, or
        # on its loop for a coroutine task): on_start, the start counted
        # (after on_start, so a slow hook cannot squeeze two calls closer
        # than a window allows), the deadline, the running registry.  False
        # when force_close() came first (the task was settled, never runs).
        if self._on_start is not None:
            try:
                self._on_start(item.chat_id)
            except BaseException as exc:
                self._hook_failed("on_start", exc)
        item._chatq = q
        if q.reserved:
            item._t_start = self._limiter.commit(q)
        elif self._send_timeout is not None or self._on_done is not None:
            item._t_start = monotonic()
        if self._send_timeout is not None:
            item._deadline = item._t_start + self._send_timeout
        if not self._register(item):
            # force_close() ran since this task left its queue: it never starts.
            self._settle_started(item, Cancelled("the dispatcher was force-closed"),
                                 C_CANCELLED)
            return False
        return True

    def _end(self, item, q, result, error, panic, cancelled=False, posted=False):
        # The end of an attempt: its outcome (unless the deadline or
        # force_close() claimed it first), a retry, or a panic of its chat.
        # ``cancelled``: a coroutine task's awaitable was cancelled;
        # ``posted``: a task given to post() (no Future).
        waiting = None
        window = q.stamped
        if window is not None and window.count > 1:
            self._limiter.answered(q)  # a burst window counts from the answer
        if panic is not None:
            # The chat is closed before its panicked task's Future is
            # resolved: a task submitted by whoever saw that result goes to a
            # new queue and runs, it is not discarded with the waiting ones.
            waiting = self._close_panicked(q)
        # Whoever takes the task out of the running registry owns its
        # outcome: us, or the timer (deadline) or force_close().
        if self._unregister(item):
            if cancelled:
                self._resolve(item, None, Cancelled("the coroutine task was cancelled"),
                              C_CANCELLED)
            elif panic is not None:
                discarded = TaskDiscarded("the task panicked: %s" % (_safe_repr(panic),))
                discarded.__cause__ = panic
                self._resolve(item, None, discarded, C_FAILED)
            elif error is not None:
                verdict = self._retry_later(item, q, error)
                if verdict == _RETRYING:
                    return _RETRYING
                if verdict == _FORCED:
                    self._resolve(item, None, Cancelled("the dispatcher was force-closed"),
                                  C_CANCELLED)
                elif verdict == _REFUSED:
                    # The retry decision itself failed (a hostile RetryAfter
                    # or retry_on class): the task fails with that error.
                    error = item._error
                    item._error = None
                    self._resolve(item, None, error, C_FAILED)
                else:
                    self._resolve(item, None, error, C_FAILED)
            else:
                self._resolve(item, result, None, C_COMPLETED)
        else:
            # Timed out or force-closed meanwhile: its outcome is settled;
            # report it now that it has returned, from this thread.
            error = self._expired_error(item, item._error)
            if self._on_done is not None:
                self._report(item, error, monotonic() - item._t_start)
            elif posted and item._cancel == _BY_TIMEOUT:
                self._log_unobserved(item, error)
            item._error = None
        if panic is not None:
            self._panic(q, panic, waiting)
        # The task's context holds the task (the running-task variable that
        # re-entrant sends read): dropped with the call, else each ended task
        # would be a reference cycle that only the cyclic collector frees.
        item._fn = item._ctx = None
        with self._count_lock:
            self._pending -= 1
        self._maybe_drained()
        return _PANICKED if panic is not None else _DONE

    def _retry_later(self, item, q, error):
        # A RetryAfter, or a retry_on error, runs the same task again ahead
        # of every later task of its chat.  Return _RETRYING, _DONE when it
        # is not retried (it fails with ``error``), _FORCED when
        # force_close() came first, or _REFUSED when deciding failed (the
        # error to fail with is then in item._error).
        try:
            plan = _retry_plan(error, item._attempt, self._retry)
        except BaseException as exc:
            logger.error("chat %s: cannot retry the task's %s", _safe_repr(q.chat_id),
                         _safe_repr(type(error)), exc_info=exc)
            if not isinstance(exc, Exception):
                exc = TypeError("retry decision failed: %s" % (_safe_repr(exc),))
            exc.__cause__ = error
            item._error = exc
            return _REFUSED
        if plan is None:
            return _DONE
        delay, is_global, refused = plan
        attempt = item._attempt
        if attempt >= self._max_attempts:
            return _DONE
        until = monotonic() + delay
        with q.lock:
            # Checked under the queue's lock: force_close() clears the
            # queues under it after setting _forced, so either it sees this
            # retry item or we see _forced.
            if self._forced:
                return _FORCED
            item._attempt = attempt + 1
            item._deadline = None
            q.retry_item = item
        self._limiter.retry_at(q, until, is_global, refused)
        with self._count_lock:
            self._retried += 1
        if self._on_retry is not None:
            try:
                self._on_retry(item.chat_id, attempt, delay, error)
            except BaseException as exc:
                self._hook_failed("on_retry", exc)
        return _RETRYING

    def _settle_started(self, item, error, outcome):
        # Resolve a task whose Future is already RUNNING but that will not
        # run (again): force_close() came first.
        self._resolve(item, None, error, outcome)
        item._fn = item._ctx = None
        with self._count_lock:
            self._pending -= 1
        self._maybe_drained()

    def _resolve(self, item, result, error, outcome):
        # Only the owner of the outcome touches (and then drops) the Future.
        # Counted first: whoever sees the Future done sees it counted.
        future = item._future
        item._future = None
        self._count(outcome)
        if item._loop is not None:
            _on_loop(item._loop, _aio_set, future, result, error)
        elif future is not None:
            _future_finish(future, result, error)
        elif error is not None and outcome == C_FAILED and self._on_done is None:
            self._log_unobserved(item, error)
        if self._on_done is not None:
            self._report(item, error, monotonic() - item._t_start)

    def _finish(self, item, error, outcome):
        # Settle a task that never started (cancelled, discarded, dropped).
        if item._loop is not None:
            # asubmit's Future: its caller may have cancelled it; else it
            # gets the error on its loop (a Cancelled too: an exception, not
            # a cancellation of the caller's own await).
            if item._future.cancelled():
                outcome = C_CANCELLED
            else:
                _on_loop(item._loop, _aio_set, item._future, None, error)
        elif not _settle(item._future, error):
            outcome = C_CANCELLED
        self._count(outcome)
        if self._on_done is not None:
            self._report(item, error, 0.0)
        item._fn = item._future = item._ctx = None
        with self._count_lock:
            self._pending -= 1

    def _close_panicked(self, q):
        # G7 (docs/guarantees.md), first step: the chat's waiting tasks are taken out and
        # its queue is removed (returns those tasks, for _panic).
        with q.lock:
            waiting = q.clear()
            # Callers waiting for room in it are let in, to be discarded
            # with the chat's waiting tasks (woken by _panic).
            while q.waiters is not None:
                _admit_locked(q)
                waiting.append(q._items.pop())
                q.woken[-1].queue_len = 0
            q.running = False
            self._remove_locked(q)
        return waiting

    def _panic(self, q, exc, waiting):
        # G7: the worker survives; the chat's waiting tasks (taken out
        # by _close_panicked) are discarded, each Future resolved, never
        # left pending; then recover(exc) runs.
        chat = _safe_repr(q.chat_id)
        for item in waiting:
            error = TaskDiscarded("a previous task of chat %s panicked" % (chat,))
            error.__cause__ = exc
            self._finish(item, error, C_DISCARDED)
        if q.woken is not None:
            self._wake_admitted(q)
        logger.error("task of chat %s panicked; %d waiting task(s) discarded",
                     chat, len(waiting), exc_info=exc)
        self._call_recover(exc)
