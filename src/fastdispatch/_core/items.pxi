# A task on its way: ``SendContext`` (what the task receives) and its calls.
#
# The compiled twin of _core/items.py, whose docstring explains this room;
# included by _ringbuf.pyx.  What differs here: SendContext is a final
# extension type with a free list; its links for the running list of
# coroutine tasks are C fields.

# Guards the lazy creation of SendContext events (rare: only for wait()).
cdef cython.pymutex _event_lock

@cython.final
@cython.freelist(256)
cdef class SendContext:
    """What a task receives: its chat, its deadline and its cancellation.

    A task should pass it on to blocking calls (``sc.remaining()`` as a
    timeout) and may poll ``sc.cancelled`` or call ``sc.check()``.
    ``SendContext(chat_id, deadline=None)`` can be built by hand to test a
    sender outside a dispatcher.
    """

    cdef readonly object chat_id
    cdef double _deadline
    cdef bint _has_deadline
    cdef long long _cancel      # atomic; written once, by the outcome's owner
    cdef object _event          # created on first wait(); under _event_lock
    cdef object _fn
    cdef object _future
    cdef double _t_queued
    cdef double _t_start
    cdef Py_ssize_t _queue_len
    cdef int _attempt
    cdef object _error          # set when the deadline or force_close() claims it
    # A running coroutine task's links in the running list (thread tasks
    # are in their worker's _Runner); guarded by DispatcherCore._run_lock.
    cdef SendContext _prev
    cdef SendContext _next
    cdef bint _registered
    # A coroutine task (asubmit): the event loop it runs on, the asyncio Task
    # of the awaitable it returned, and its chat while that runs (None once
    # its end was claimed: see DispatcherCore._claim; _run_lock); all None
    # for a thread task.
    cdef object _loop
    cdef object _aio
    cdef ChatQueue _queue
    # The chat queue of the running attempt (set at its start), through
    # which report_limit reaches the limiter; None outside a dispatcher.
    cdef ChatQueue _chatq
    # asubmit: a copy of the caller's contextvars context, which every
    # attempt runs in.
    cdef object _ctx
    # asubmit: its chat starts in its caller's own call (see _start_async).
    cdef bint _inline

    def __init__(self, chat_id, deadline=None):
        self.chat_id = chat_id
        self._attempt = 1
        if deadline is not None:
            self._deadline = float(deadline)
            self._has_deadline = True

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
        return self._t_start if self._t_start != 0.0 else None

    @property
    def deadline(self):
        """``time.monotonic()`` value at which the task must stop, or None."""
        return self._deadline if self._has_deadline else None

    def remaining(self):
        """Seconds left before the deadline (never negative), or None."""
        if not self._has_deadline:
            return None
        return max(0.0, self._deadline - <double>monotonic())

    @property
    def cancelled(self):
        """True once the deadline passed or ``force_close()`` ran."""
        return self._is_cancelled()

    cdef bint _is_cancelled(self) except -1:
        if FD_LOAD(&self._cancel):
            return True
        return self._has_deadline and <double>monotonic() >= self._deadline

    def wait(self, timeout=None):
        """Block until cancelled or ``timeout`` seconds; return ``cancelled``."""
        if self._is_cancelled():
            return True
        remaining = self.remaining()
        if remaining is not None and (timeout is None or remaining < timeout):
            timeout = remaining
        if timeout is not None and timeout > _TIMEOUT_MAX:
            timeout = None  # longer than a lock can wait: until cancelled
        with _event_lock:
            if FD_LOAD(&self._cancel):
                return True
            event = self._event
            if event is None:
                event = self._event = _Event()
        event.wait(timeout)
        return self._is_cancelled()

    def check(self):
        """Raise ``Cancelled`` or ``SendTimeout`` if cancelled; else return."""
        if FD_LOAD(&self._cancel) == _BY_FORCE:
            raise Cancelled("the dispatcher was force-closed")
        if self._is_cancelled():
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
        cdef long long n
        cdef double delay
        cdef bint is_global
        cdef ChatQueue q
        n, delay, bucket, is_global = _checked_report(remaining, reset_after, bucket, scope)
        q = self._chatq
        if q is not None and q._core_ref is not None:
            core = q._core_ref()
            if core is not None:  # held for the call: the limiter reaches it
                (<DispatcherCore>core)._limiter.learn(q, n, delay, bucket, is_global)

    def __repr__(self):
        return "<SendContext chat_id=%s deadline=%r cancelled=%r>" % (
            _safe_repr(self.chat_id), self.deadline, self.cancelled)

    cdef void _cancel_with(self, long long reason):
        # Called once, by whoever claimed the task out of the running registry.
        FD_STORE(&self._cancel, reason)
        with _event_lock:
            event = self._event
        if event is not None:
            event.set()


cdef inline SendContext _new_item(object chat_id, object fn, object future, double t_queued,
                                  object loop, object ctx):
    cdef SendContext item = SendContext.__new__(SendContext)
    item.chat_id = chat_id
    item._fn = fn
    item._future = future
    item._t_queued = t_queued
    item._attempt = 1
    item._loop = loop
    item._ctx = ctx
    return item


cdef object _call_in_context(SendContext item):
    # In the task's own context (see _start_async): mark it as the running
    # task there, then call it.  (Entered here in C: ctx.run would cost two
    # Python-level calls per attempt.)
    PyContext_Enter(item._ctx)
    try:
        PyContextVar_Set(_current_task, item)
        return item._fn(item)
    finally:
        PyContext_Exit(item._ctx)


cdef inline bint _is_awaitable(object o) except -1:
    cdef int kind = fd_awaitable_kind(o)
    if kind < 0:
        return inspect.isawaitable(o)
    return kind


cdef object _awaitable_error(SendContext item, object result):
    # A thread task that returned a coroutine (or another awaitable) did not
    # do its work: nothing awaits it on a worker thread.  Close a coroutine
    # (no "never awaited" warning) and fail the task saying what to use.
    if inspect.iscoroutine(result):
        try:
            result.close()
        except BaseException:
            pass
    return TypeError(
        "the task for chat %s returned %s, which a worker thread cannot await: "
        "give coroutine tasks to `await dispatcher.asubmit(chat_id, task)`, which "
        "runs them on the caller's event loop" % (
            _safe_repr(item.chat_id), _safe_repr(type(result).__name__)))


cdef object _caller_loop():
    # The calling thread's running event loop, or None (asyncio is imported
    # on first use: a dispatcher that never sees a coroutine task does not
    # pay for it).
    global _asyncio, _running_loop, _AioFuture, _base_create_future
    if _asyncio is None:
        import asyncio as _asyncio_module
        _running_loop = _asyncio_module._get_running_loop
        _AioFuture = _asyncio_module.Future
        _base_create_future = _asyncio_module.BaseEventLoop.create_future
        _asyncio = _asyncio_module
    return _running_loop()


cdef inline object _new_aio_future(object loop):
    # loop.create_future(), without its Python frame where the loop keeps
    # asyncio's own.
    if type(loop).create_future is _base_create_future:
        return _AioFuture(loop=loop)
    return loop.create_future()


cpdef _aio_set(future, result, error):
    # On the future's own loop: resolve it, unless it is already done (the
    # caller cancelled its await).
    if not future.done():
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


cdef bint _on_loop(object loop, object fn, object a, object b, object c) except -1:
    """Run ``fn(a, b, c)`` on ``loop``: now when this is its thread, else at
    its next turn.  False when the loop is closed (nothing can run there)."""
    if _running_loop() is loop:
        if fn is _aio_set:
            _aio_set(a, b, c)  # (what every caller passes: a C call)
        else:
            fn(a, b, c)
        return True
    try:
        loop.call_soon_threadsafe(fn, a, b, c)
    except RuntimeError:  # the loop is closed
        return False
    return True


def _cancel_aio(SendContext item):
    # On the loop: cancel the awaitable a coroutine task is running, if any.
    aio = item._aio
    if aio is not None:
        aio.cancel()


# Whether a coroutine task is driven by its caller (_Driven): only where a
# Task can say whether its own cancellation stands (``Task.cancelling``,
# 3.11); before, each attempt gets an asyncio Task of its own.
cdef bint _DRIVES = sys.version_info >= (3, 11)


@cython.final
cdef class _Driven:
    """A coroutine task's attempt, driven by its own caller (G17, G26).

    See _core/items.py: ``out`` holds the outcome from the start of the
    attempt on; ``coro`` (if the attempt returned a coroutine) is run by
    the caller's own Task, each step in the task's context; when it ends,
    ``result``, ``error``, ``cancelled`` and ``suspended`` say how.  Here
    the object is its own iterator (``__await__`` returns it), so that
    driving a task allocates no generator.
    """

    cdef object out
    cdef object coro
    cdef object ctx
    cdef object waiting_on
    cdef bint must_cancel
    cdef bint cancelling
    cdef bint driven
    cdef Py_ssize_t cancels_before
    cdef object result
    cdef object error
    cdef bint cancelled
    cdef bint suspended

    def __init__(self, out, ctx):
        self.out = out
        self.ctx = ctx
        self.cancels_before = -1

    def cancel(self):
        self.cancelling = True
        waiting_on = self.waiting_on
        if waiting_on is not None and waiting_on.cancel():
            return
        self.must_cancel = True

    def __await__(self):
        self.driven = True
        return self

    def __next__(self):
        self.waiting_on = None
        return self._step(None, None)

    def send(self, value):
        self.waiting_on = None
        return self._step(value, None)

    def throw(self, typ, val=None, tb=None):
        # The caller's Task throws into its await (a cancellation, or
        # whatever asyncio or a caller's close() sends): on into the
        # coroutine, in the task's context.
        if isinstance(typ, BaseException):
            thrown = typ
        elif val is None:
            thrown = typ()
        elif isinstance(val, typ):
            thrown = val
        else:
            thrown = typ(val)
        if isinstance(thrown, GeneratorExit):
            self.close()
            raise thrown
        if type(thrown) is _asyncio.CancelledError:
            if self.cancelling:
                self.cancelling = False
            elif self.cancels_before < 0:
                # Not ours: the caller's Task was asked to cancel (or code
                # inside the coroutine cancels its own Task and takes that
                # back: see _caller_cancelled).
                self.cancels_before = _asyncio.current_task().cancelling() - 1
        self.waiting_on = None
        return self._step(None, thrown)

    def close(self):
        self.coro.close()

    cdef object _step(self, object value, object exc):
        # One step of the coroutine: what it yields goes on to the caller's
        # Task; when it ends, its outcome is kept and the await ends.
        cdef int returned = 0
        if self.must_cancel:
            self.must_cancel = False
            exc = _asyncio.CancelledError()
        try:
            if exc is None:
                yielded = fd_drive_send(self.ctx, self.coro, value, &returned)
            else:
                yielded = self.ctx.run(self.coro.throw, exc)
        except StopIteration as stop:
            self.result = stop.value
            raise StopIteration
        except _asyncio.CancelledError:
            self.cancelled = True
            raise StopIteration
        except BaseException as error:
            self.error = error
            raise StopIteration
        if returned:
            self.result = yielded
            raise StopIteration
        self.suspended = True
        self.waiting_on = yielded
        return yielded


cdef inline object _started_here(SendContext item, object future):
    # The attempt that asubmit's own call started, when it is a coroutine
    # for that caller to drive (its ``out`` is the call's Future: see
    # _start_async); else None.
    aio = item._aio
    if type(aio) is _Driven and (<_Driven>aio).out is future:
        return aio
    return None


cdef inline bint _caller_cancelled(_Driven driven) except -1:
    # After a driven coroutine ended: whether a cancellation of its caller's
    # Task reached it and still stands (one that code inside took back with
    # ``uncancel()``, as anyio's cancel scopes do, does not count).
    return (driven.cancels_before >= 0
            and _asyncio.current_task().cancelling() > driven.cancels_before)
