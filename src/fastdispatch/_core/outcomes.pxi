# A task's run and its outcome: run, end, retry, panic (G7, G10, G13).
#
# The compiled twin of _core/outcomes.py, whose docstring explains this
# room; included by _ringbuf.pyx.  What differs here: the same paths; an
# outcome is counted in one atomic array (_counts).

cdef class _Outcomes(_Deadlines):
    """Running a task and deciding its outcome: result, error, retry or panic."""

    # Configuration, written once before any task (_configure).
    cdef object _on_start, _on_retry
    cdef object _retry
    cdef int _max_attempts

    cdef int _drop_dead_head(self, ChatQueue q, object loop) except -1:
        # The loop the chat's next task belongs to is closed, or stopped
        # before it could start it: that task never runs.  It fails with
        # Cancelled, and the chat goes on.
        cdef SendContext head
        cdef SendContext item = None
        with q._lock:
            head = _peek_head(q)
            if head is not None and head._loop is loop:
                item = _take_head_locked(q)
        if q._woken is not None:
            self._wake_admitted(q)
        if item is None:
            return 0
        error = Cancelled("the event loop of this coroutine task is closed or stopped "
                          "before the task could start")
        if item._attempt > 1:
            self._settle_started(item, error, C_CANCELLED)
        else:
            self._finish(item, error, C_CANCELLED)
            self._maybe_drained()
        return 0

    cdef bint _refuse_head(self, ChatQueue q, object exc) except -1:
        # The limiter could not judge this chat (limit_for or the chat id's
        # __hash__/__eq__ failed): its next task fails with that error, the
        # chat goes on with the one after.
        cdef SendContext item
        with q._lock:
            item = _take_head_locked(q)
        if q._woken is not None:
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

    cdef int _run(self, SendContext item, ChatQueue q, _Runner runner) except -1:
        """Run one attempt of a thread task on ``runner``'s worker: _DONE,
        _PANICKED or _RETRYING."""
        cdef object future = item._future
        cdef object result = None
        cdef object error = None
        cdef object panic = None
        if FD_LOAD(&self._forced):
            # Popped just before force_close() cleared the queue: dropped as
            # a waiting task is (its Future cancelled).  _register re-checks.
            if q._reserved:
                self._limiter.release(q)
            if item._attempt == 1:
                self._finish(item, Cancelled("the dispatcher was force-closed"), C_CANCELLED)
                self._maybe_drained()
            else:
                self._settle_started(item, Cancelled("the dispatcher was force-closed"),
                                     C_CANCELLED)
            return _DONE
        if item._attempt == 1 and future is not None and not _future_start(future):
            if q._reserved:
                self._limiter.release(q)
            self._finish(item, Cancelled("cancelled before it started"), C_CANCELLED)
            return _DONE
        if not self._begin(item, q, runner):
            return _DONE
        try:
            result = item._fn(item)
        except Exception as exc:
            error = exc if type(exc) is not TypeError else _task_call_error(item.chat_id, exc)
        except BaseException as exc:
            error = panic = exc
        if error is None and result is not None and _is_awaitable(result):
            error = _awaitable_error(item, result)
        return self._end(item, q, result, error, panic, False, future is None, runner)

    cdef bint _begin(self, SendContext item, ChatQueue q, _Runner runner) except -1:
        # The start of an attempt, right before its call (on its worker,
        # ``runner`` its own, or on its loop for a coroutine task, ``runner``
        # None): on_start, the start counted
        # (after on_start, so a slow hook cannot squeeze two calls closer
        # than a window allows), the deadline, the running registry.  False
        # when force_close() came first (the task was settled, never runs).
        if self._on_start is not None:
            try:
                self._on_start(item.chat_id)
            except BaseException as exc:
                self._hook_failed("on_start", exc)
        item._chatq = q
        if q._reserved:
            item._t_start = self._limiter.commit(q)
        elif self._has_timeout or self._on_done is not None:
            item._t_start = monotonic()
        if self._has_timeout:
            item._deadline = item._t_start + self._send_timeout
            item._has_deadline = True
        if not self._register(item, runner):
            # force_close() ran since this task left its queue: it never starts.
            self._settle_started(item, Cancelled("the dispatcher was force-closed"),
                                 C_CANCELLED)
            return False
        return True

    cdef int _end(self, SendContext item, ChatQueue q, object result, object error,
                  object panic, bint cancelled, bint posted, _Runner runner) except -1:
        # The end of an attempt: its outcome (unless the deadline or
        # force_close() claimed it first), a retry, or a panic of its chat.
        # ``cancelled``: a coroutine task's awaitable was cancelled;
        # ``posted``: a task given to post() (no Future); ``runner``: as
        # given to _begin.
        cdef int verdict
        cdef list waiting = None
        cdef _Window window = q._stamped
        if window is not None and window.count > 1:
            self._limiter.answered(q)  # a burst window counts from the answer
        if panic is not None:
            # The chat is closed before its panicked task's Future is
            # resolved: a task submitted by whoever saw that result goes to a
            # new queue and runs, it is not discarded with the waiting ones.
            waiting = self._close_panicked(q)
        # Whoever takes the task out of the running registry owns its
        # outcome: us, or the timer (deadline) or force_close().
        if self._unregister(item, runner):
            if FD_HANDBACK and runner is not None:
                self._keep(runner, item._future)
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
            # report it now that it has returned, from this thread.  Its
            # error was complete before it was set (see _take_from_runners)
            # and whoever claimed it no longer reads the field.
            error = item._error
            if self._on_done is not None:
                self._report(item, error, <double>monotonic() - item._t_start)
            elif posted and FD_LOAD(&item._cancel) == _BY_TIMEOUT:
                self._log_unobserved(item, error)
            item._error = None
        if panic is not None:
            self._panic(q, panic, waiting)
        # The task's context holds the task (the running-task variable that
        # re-entrant sends read): dropped with the call, else each ended task
        # would be a reference cycle that only the cyclic collector frees.
        item._fn = item._ctx = None
        FD_ADD(&self._pending, -1)
        self._maybe_drained()
        return _PANICKED if panic is not None else _DONE

    cdef int _retry_later(self, SendContext item, ChatQueue q, object error) except -1:
        # A RetryAfter, or a retry_on error, runs the same task again ahead
        # of every later task of its chat.  Return _RETRYING, _DONE when it
        # is not retried (it fails with ``error``), _FORCED when
        # force_close() came first, or _REFUSED when deciding failed (the
        # error to fail with is then in item._error).
        cdef double delay, until
        cdef int attempt = item._attempt
        cdef bint is_global, refused
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
        if attempt >= self._max_attempts:
            return _DONE
        until = <double>monotonic() + delay
        with q._lock:
            # Checked under the queue's lock: force_close() clears the
            # queues under it after setting _forced, so either it sees this
            # retry item or we see _forced.
            if FD_LOAD(&self._forced):
                return _FORCED
            item._attempt = attempt + 1
            item._has_deadline = False
            q._retry_item = item
        self._limiter.retry_at(q, until, is_global, refused)
        FD_ADD(&self._retried, 1)
        if self._on_retry is not None:
            try:
                self._on_retry(item.chat_id, attempt, delay, error)
            except BaseException as exc:
                self._hook_failed("on_retry", exc)
        return _RETRYING

    cdef int _settle_started(self, SendContext item, object error, int outcome) except -1:
        # Resolve a task whose Future is already RUNNING but that will not
        # run (again): force_close() came first, or pacing failed.
        self._resolve(item, None, error, outcome)
        item._fn = item._ctx = None
        FD_ADD(&self._pending, -1)
        self._maybe_drained()
        return 0

    cdef int _resolve(self, SendContext item, object result, object error,
                      int outcome) except -1:
        # Only the owner of the outcome touches (and then drops) the Future.
        # Counted first: whoever sees the Future done sees it counted.
        cdef object future = item._future
        item._future = None
        FD_ADD(&self._counts[outcome], 1)
        if item._loop is not None:
            _on_loop(item._loop, _aio_set, future, result, error)
        elif future is not None:
            _future_finish(future, result, error)
        elif error is not None and outcome == C_FAILED and self._on_done is None:
            self._log_unobserved(item, error)
        if self._on_done is not None:
            self._report(item, error, <double>monotonic() - item._t_start)
        return 0

    cdef int _finish(self, SendContext item, object error, int outcome) except -1:
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
        FD_ADD(&self._counts[outcome], 1)
        if self._on_done is not None:
            self._report(item, error, 0.0)
        item._fn = item._future = item._ctx = None
        FD_ADD(&self._pending, -1)
        return 0

    cdef list _close_panicked(self, ChatQueue q):
        # G7 (docs/guarantees.md), first step: the chat's waiting tasks are taken out and
        # its queue is removed (returns those tasks, for _panic).
        cdef list waiting
        with q._lock:
            waiting = q._clear()
            # Callers waiting for room in it are let in, to be discarded
            # with the chat's waiting tasks (woken by _panic).
            while q._waiters is not None:
                _admit_locked(q)
                waiting.append(q._pop())
                (<_Waiter>q._woken[len(q._woken) - 1]).queue_len = 0  # (no wraparound here)
            q._running = False
            self._remove_locked(q)
        return waiting

    cdef int _panic(self, ChatQueue q, object exc, list waiting) except -1:
        # G7: the worker survives; the chat's waiting tasks (taken out
        # by _close_panicked) are discarded, each Future resolved, never
        # left pending; then recover(exc) runs.
        chat = _safe_repr(q.chat_id)
        for item in waiting:
            error = TaskDiscarded("a previous task of chat %s panicked" % (chat,))
            error.__cause__ = exc
            self._finish(<SendContext>item, error, C_DISCARDED)
        if q._woken is not None:
            self._wake_admitted(q)
        logger.error("task of chat %s panicked; %d waiting task(s) discarded",
                     chat, len(waiting), exc_info=exc)
        self._call_recover(exc)
        return 0
