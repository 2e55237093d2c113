# Moving a task's ``concurrent.futures.Future`` through its states.
#
# The compiled twin of _core/futures.py, whose docstring explains this room;
# included by _ringbuf.pyx.  What differs here: the same operations as
# futures.py, made from C under the Future's own lock when the Future's
# layout is the one checked at import, and through the public methods
# otherwise.

cdef object _PENDING = _futures_base.PENDING
cdef object _RUNNING = _futures_base.RUNNING
cdef object _FINISHED = _futures_base.FINISHED
cdef object _CANCELLED = _futures_base.CANCELLED
cdef object _CANCELLED_AND_NOTIFIED = _futures_base.CANCELLED_AND_NOTIFIED
cdef object _Condition = threading.Condition
cdef object _RLock = threading.RLock


def _future_layout_is_known():
    future = Future()
    condition = future._condition
    return (list(vars(future)) == ["_condition", "_state", "_result", "_exception",
                                   "_waiters", "_done_callbacks"]
            and type(condition) is _Condition
            and list(vars(condition)) == ["_lock", "acquire", "release", "_release_save",
                                          "_acquire_restore", "_is_owned", "_waiters"]
            and type(condition._lock) is type(_RLock())
            and type(condition._waiters) is deque
            and future._state is _PENDING)


cdef bint _fast_futures = _future_layout_is_known()


class _LeanCondition(_Condition):
    """A ``threading.Condition`` over an RLock, minus five cached bound methods.

    ``Condition.__init__`` stores ``acquire``, ``release`` and three private
    helpers of its lock as bound methods on the instance: five more objects
    for the cyclic GC to track, per Future.  With thousands of Futures alive
    (a caller collecting results), the collector's work, not ours, becomes
    the largest cost of a submit.  These methods delegate instead; the
    behaviour is the same.
    """

    def acquire(self, *args, **kwargs):
        return self._lock.acquire(*args, **kwargs)

    def release(self):
        self._lock.release()

    def _release_save(self):
        return self._lock._release_save()

    def _acquire_restore(self, state):
        self._lock._acquire_restore(state)

    def _is_owned(self):
        return self._lock._is_owned()


cdef object _new_future():
    """``Future()``, with a lean Condition, built field by field."""
    if not _fast_futures:
        return Future()
    condition = _LeanCondition.__new__(_LeanCondition)
    condition._lock = _RLock()
    condition._waiters = deque()
    future = Future.__new__(Future)
    future._condition = condition
    future._state = _PENDING
    future._result = None
    future._exception = None
    future._waiters = []
    future._done_callbacks = []
    return future


cdef bint _future_start(object future) except -1:
    """``future.set_running_or_notify_cancel()``: False if it was cancelled.

    The caller holds the Future too and may have moved it on itself
    (``set_running_or_notify_cancel()``, ``set_result()``): only a
    cancellation skips the task; anything else leaves it to run (whatever
    it returns is then dropped).
    """
    cdef bint started = False
    if _fast_futures:
        lock = future._condition._lock
        lock.acquire()
        if future._state is _PENDING:
            future._state = _RUNNING
            started = True
        lock.release()
        if started:
            return True
    state = future._state
    if state is _CANCELLED_AND_NOTIFIED:
        return False
    if state is _PENDING or state is _CANCELLED:
        try:
            return future.set_running_or_notify_cancel()
        except RuntimeError:  # moved on by the caller meanwhile
            return not future.cancelled()
    return True


cdef int _future_finish(object future, object result, object error) except -1:
    """``set_result(result)`` or, if ``error`` is not None, ``set_exception(error)``.

    A Future the caller already resolved (or cancelled) keeps what it has:
    the worker, the timer thread and the chat go on.
    """
    cdef bint done = False
    if _fast_futures:
        condition = future._condition
        lock = condition._lock
        lock.acquire()
        # Nobody blocked in result()/wait(): no one to notify.
        if future._state is _RUNNING and not condition._waiters and not future._waiters:
            if error is None:
                future._result = result
            else:
                future._exception = error
            future._state = _FINISHED
            done = True
        lock.release()
        if done:
            if future._done_callbacks:
                future._invoke_callbacks()
            return 0
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except Exception:  # InvalidStateError
        pass
    return 0


cdef object _stdlib_result = _futures_base.Future.result


def _future_result(self, timeout=None):
    # Future.result (installed below): a Future finished with a result
    # hands it over from C, under its lock as the stdlib's method takes it;
    # anything else (not finished yet, an exception to raise, a cancelled
    # Future, a layout of its own) is the stdlib's method.  The stdlib's
    # result() is Python code, which free-threaded CPython does not
    # specialize: there it is a large part of a submit + wait, and from C a
    # small one.
    cdef bint done = False
    lock = self._condition._lock
    lock.acquire()
    try:
        if self._state is _FINISHED and self._exception is None:
            result = self._result
            done = True
    finally:
        lock.release()
    if done:
        return result
    return _stdlib_result(self, timeout)


if _fast_futures:
    _future_result.__name__ = "result"
    _future_result.__qualname__ = Future.__qualname__ + ".result"
    _future_result.__doc__ = _stdlib_result.__doc__
    Future.result = _future_result


cdef bint _settle(object future, object exc) except -1:
    """Resolve a not-started task's Future with ``exc``.

    Return False when the caller had already cancelled it (then it counts as
    cancelled, not as whatever ``exc`` says).
    """
    if future is None:
        return True
    if isinstance(exc, Cancelled):
        future.cancel()
        _notify_cancelled(future)
        return False
    try:
        future.set_exception(exc)
    except Exception:  # InvalidStateError: cancelled by the caller meanwhile
        _notify_cancelled(future)
        return False
    return True



cdef int _notify_cancelled(object future) except -1:
    # concurrent.futures.wait() and as_completed() see a cancelled Future
    # only once set_running_or_notify_cancel() has moved it on to
    # CANCELLED_AND_NOTIFIED, as an executor does for each one it drops.
    # The worker does that for a task it pops; this is for the others.
    if future._state is _CANCELLED:
        future.set_running_or_notify_cancel()
    return 0
