# The room every other room stands on: configuration, counters, hooks.
#
# The compiled twin of _core/bookkeeping.py, whose docstring explains this
# room; included by _ringbuf.pyx.  What differs here: the counters are
# atomic integers (no lock); on free-threaded builds this room also keeps
# the objects workers hand back to their creating threads (_keep, _flush,
# _take_back, in blocks: see fd_back).

cdef class _Bookkeeping:
    """Configuration, counters and hooks: what every room reads."""

    # Configuration, written once before any task (_configure).
    cdef Py_ssize_t _max_inflight
    cdef Py_ssize_t _queue_size
    cdef double _send_timeout
    cdef bint _has_timeout
    cdef double _idle_timeout
    cdef object _on_queued, _on_done, _on_rejected, _recover
    cdef LatencyHistogram _histogram  # on_done, when it is one: recorded from C
    cdef _Limiter _limiter            # pacing (its own lock; see the class)
    cdef object __weakref__
    cdef object _ref                  # a weak reference to itself, for its chat queues
    cdef bint _limited                # every start asks the limiter
    cdef bint _async_used             # an asubmit() was made: coroutine tasks exist
    cdef long long _closed            # atomic
    # Counters, all atomic.
    cdef long long _pending
    cdef long long _drain_waiters
    cdef long long _inflight          # slots taken (see _Pool): tasks in flight
    cdef long long _submitted
    cdef long long _rejected
    cdef long long _retried
    cdef long long _counts[5]
    cdef long long _chats             # chats in the chat map (see _ChatMap)
    cdef long long _waiting           # callers waiting for room (see _WaitingRoom)
    cdef Py_ssize_t _max_waiting
    cdef Py_ssize_t _threads          # worker threads (_pool_lock, see _Pool)
    cdef cython.pymutex _pool_lock
    # Objects the workers give back to their creating threads, in blocks
    # (free-threaded builds, see fd_back): a lock-free stack, pushed by a
    # worker per full block, taken whole by submit and post.
    cdef fd_back *_back

    cdef int _reject(self, object chat_id, object exc, bint waited) except -1:
        # ``waited``: a caller that waited for room (not counted as submitted).
        if not waited:
            FD_ADD(&self._submitted, -1)
        FD_ADD(&self._pending, -1)
        FD_ADD(&self._rejected, 1)
        self._maybe_drained()
        if self._on_rejected is not None:
            try:
                self._on_rejected(chat_id, exc)
            except BaseException as hook_exc:
                self._hook_failed("on_rejected", hook_exc)
        raise exc


    def _counters(self):
        cdef Py_ssize_t threads
        with self._pool_lock:
            threads = self._threads
        paced, parked = self._limiter.counters()
        return (FD_LOAD(&self._submitted), FD_LOAD(&self._counts[C_COMPLETED]),
                FD_LOAD(&self._counts[C_FAILED]), FD_LOAD(&self._rejected),
                FD_LOAD(&self._counts[C_DISCARDED]), FD_LOAD(&self._counts[C_CANCELLED]),
                FD_LOAD(&self._counts[C_TIMED_OUT]), FD_LOAD(&self._chats),
                FD_LOAD(&self._inflight), threads, FD_LOAD(&self._retried), paced, parked,
                FD_LOAD(&self._waiting))

    def _pending_count(self):
        return FD_LOAD(&self._pending)

    def _add_drain_waiter(self, long long n):
        FD_ADD(&self._drain_waiters, n)

    cdef int _maybe_drained(self) except -1:
        if (FD_LOAD(&self._drain_waiters) and not FD_LOAD(&self._pending)
                and not FD_LOAD(&self._chats) and not FD_LOAD(&self._inflight)):
            if FD_HANDBACK:
                self._take_back()
            self._notify_drained()
        return 0


    cdef int _log_unobserved(self, SendContext item, object error) except -1:
        # A post()ed task that failed, with no on_done hook to see it: as
        # Python reports an exception that ends a thread, once, with its
        # traceback.
        logger.error("task posted for chat %s failed", _safe_repr(item.chat_id),
                     exc_info=(type(error), error, error.__traceback__))
        return 0

    cdef int _report(self, SendContext item, object error, double run_latency) except -1:
        cdef double start = item._t_start if item._t_start else <double>monotonic()
        if self._histogram is not None:
            if run_latency != 0.0 or error is None:   # a task that started
                self._histogram._record(max(0.0, start - item._t_queued), run_latency)
            return 0
        # tuple.__new__ straight from C: DispatchInfo's own __new__ is a
        # Python function, a third of the cost of reporting a task.
        info = tuple.__new__(DispatchInfo, (item.chat_id, item._queue_len,
                                            max(0.0, start - item._t_queued), run_latency,
                                            error))
        try:
            self._on_done(info)
        except BaseException as exc:
            self._hook_failed("on_done", exc)
        return 0

    def _hook_failed(self, name, exc):
        logger.error("dispatcher hook %s raised", name, exc_info=exc)
        self._call_recover(exc)

    def _call_recover(self, exc):
        if self._recover is None:
            return
        try:
            self._recover(exc)
        except BaseException:
            logger.exception("recover callable raised")

    def __dealloc__(self):
        fd_back_drop(fd_back_take(&self._back))

    cdef inline int _keep(self, _Runner runner, object o) except -1:
        # On ``runner``'s worker, before it drops its last reference to
        # ``o``: keep one to give back to ``o``'s creating thread.
        if o is not None and fd_back_keep(&runner.back, o) == 2:
            fd_back_publish(&self._back, runner.back)
            runner.back = NULL
        return 0

    cdef int _flush(self, _Runner runner) except -1:
        # The worker goes idle (or exits): publish its partial block.  Nothing
        # pending: no submit may come to take the stack, so take it here
        # (dropping those objects queues them to their creators, as without
        # the hand-back; one publishing after this sees the count too).
        if runner.back != NULL:
            fd_back_publish(&self._back, runner.back)
            runner.back = NULL
        if not FD_LOAD(&self._pending):
            self._take_back()
        return 0

    cdef inline int _take_back(self) except -1:
        # Drop everything given back (on a producer: as the objects' owner).
        if fd_back_waiting(&self._back):
            fd_back_drop(fd_back_take(&self._back))
        return 0
