# Deadlines and the timer thread (G9).
#
# The compiled twin of _core/deadlines.py, whose docstring explains this
# room; included by _ringbuf.pyx.  What differs here: a worker's running
# task is one field of its own _Runner (no shared list on the hot path);
# coroutine tasks are an intrusive list through SendContext; _timer_by lets
# a start skip the timer's lock.

cdef class _Runner:
    """One worker thread's place in the running registry: the task it runs.

    A worker runs one thread task at a time, so its registry entry is one
    field under a lock of its own.  A start and an end write only here:
    no lock, list or neighbouring task that other workers write.  (With
    one list for all, every start and end would write the previous task's
    links, an object another worker had just written, and take a lock
    every worker takes: on free-threaded CPython, where workers run at the
    same time, they would wait for each other there.)  The timer and
    force_close() take the lock only
    when they look, which is seldom.  Made by its worker, so on
    free-threaded CPython its reference count stays that thread's.
    """

    cdef cython.pymutex lock    # guards item
    cdef SendContext item       # the task its worker runs, or None: whoever
                                # takes it out (to None) owns its outcome
    cdef fd_back *back          # objects its worker gives back, not yet
                                # published (free-threaded builds; its
                                # worker's alone: no lock)
    cdef ChatQueue chat         # the chat its worker runs (its worker's
                                # alone; read by running_chat() there)

    def __dealloc__(self):
        # Its worker publishes the block when it exits; this is a backstop.
        fd_back_drop(self.back)




cdef class _Deadlines(_WaitingRoom):
    """The running registry and the timer thread."""

    # Running tasks, where the timer (deadlines) and force_close() find
    # them: a thread task in its worker's _Runner (_runners: _pool_lock),
    # a coroutine task in the running list, oldest first (the deadline
    # schedule of coroutine tasks); the list and the timer's state are
    # guarded by _run_lock.
    cdef list _runners
    cdef cython.pymutex _run_lock
    cdef SendContext _run_head
    cdef SendContext _run_tail
    cdef object _timer_wake
    cdef int _timer_state
    cdef bint _timer_started
    cdef bint _timer_stop
    cdef double _timer_until          # when the sleeping timer wakes by itself
    # Atomic, written with _timer_until: that time in nanoseconds while
    # the timer sleeps until it, else 0.  A worker's start whose deadline
    # is no earlier needs nothing from the timer: it looks at every
    # runner when it wakes (see _register).
    cdef long long _timer_by
    # The earliest need that arrived while the timer was awake (it looks at
    # the limiter outside _run_lock): seen when it decides to sleep.
    cdef double _timer_next
    cdef long long _forced            # atomic; force_close() began: nothing starts
    cdef dict _handoffs               # ChatQueue -> (loop, when): handed to a loop; _run_lock
    cdef dict _loop_items             # loop -> set of its running coroutine tasks; _run_lock

    cdef bint _register(self, SendContext item, _Runner runner) except -1:
        # Enter a starting task in the running registry (its worker's
        # runner, or for a coroutine task the running list); False,
        # registering nothing, once force_close() has begun (then the task
        # must not start).
        if runner is not None:
            with runner.lock:
                # force_close() stores _forced, then looks at every runner
                # under its lock: it finds this task, or this finds _forced.
                if FD_LOAD(&self._forced):
                    return False
                runner.item = item
            # The timer looks at every runner each time it wakes, and it
            # stores _timer_by (0) before it looks: if it still promises to
            # wake by this deadline, it will see this task by then.
            if item._has_deadline and not (
                    0 < FD_LOAD(&self._timer_by) <= _ns(item._deadline)):
                self._timer_needed(item._deadline)
            return True
        with self._run_lock:
            if FD_LOAD(&self._forced):
                return False
            item._prev = self._run_tail
            item._next = None
            if self._run_tail is None:
                self._run_head = item
            else:
                self._run_tail._next = item
            self._run_tail = item
            item._registered = True
            if item._has_deadline:
                self._timer_needed_locked(item._deadline)
        return True

    cdef int _timer_needed(self, double when) except -1:
        with self._run_lock:
            self._timer_needed_locked(when)
        return 0

    cdef int _timer_needed_locked(self, double when) except -1:
        # With _run_lock held: make sure the timer looks at its schedules no
        # later than ``when`` (starting it on first use, waking it if it
        # sleeps past that, or telling it before it decides to sleep).
        if not self._timer_started:
            self._timer_started = True
            try:
                self._start_timer()
            except BaseException:
                # The OS refused a thread: the next caller tries again.
                self._timer_started = False
                logger.exception("could not start the timer thread")
        elif self._timer_state == _AWAKE:
            if when < self._timer_next:
                self._timer_next = when
        elif when < self._timer_until:
            self._wake_timer_locked()
        return 0

    def _refuse_new_starts(self):
        # force_close(), before it cancels what runs: from now on _register
        # refuses, so no task starts after force_close() returned.
        with self._run_lock:
            FD_STORE(&self._forced, 1)

    cdef inline void _unlink_locked(self, SendContext item):
        if item._prev is None:
            self._run_head = item._next
        else:
            item._prev._next = item._next
        if item._next is None:
            self._run_tail = item._prev
        else:
            item._next._prev = item._prev
        item._prev = item._next = None
        item._registered = False

    cdef bint _unregister(self, SendContext item, _Runner runner):
        # True if this call took the task out (its outcome is ours).
        cdef bint ours
        if runner is not None:
            with runner.lock:
                ours = runner.item is item
                if ours:
                    runner.item = None
            return ours
        with self._run_lock:
            ours = item._registered
            if ours:
                self._unlink_locked(item)
        return ours

    cdef inline void _set_timer_until_locked(self, double until):
        # With _run_lock held: when the timer wakes by itself (_INF: it is
        # awake, or sleeps with nothing to wait for).
        self._timer_until = until
        FD_STORE(&self._timer_by, _ns(until) if until != _INF else 0)

    cdef int _wake_timer_locked(self) except -1:
        # Wake the timer once per sleep (with _run_lock held):
        # the state flag makes sure it never gets two tokens.
        if self._timer_state != _AWAKE:
            self._timer_state = _AWAKE
            self._set_timer_until_locked(_INF)
            self._timer_wake.put(None)
        return 0

    cdef object _timeout_error(self, SendContext item):
        # A task's SendTimeout, its message made before anyone else sees
        # it, outside any lock: the chat id's repr is user code.
        return SendTimeout("chat %s: the task ran past its %ss send_timeout"
                           % (_safe_repr(item.chat_id), self._send_timeout))

    cdef double _take_from_runners(self, double now, bint forced, list taken) except? -1.0:
        # Take the workers' tasks out of their runners, into ``taken`` as
        # (task, error) pairs: those past their deadline (the timer), or
        # all of them (``forced``: force_close()).  Returns the earliest
        # deadline of those left.  Each error is made first, outside the
        # runner's lock (user code: the chat id's repr; a finalizer that an
        # allocation may run), and set on its task as it is taken: its
        # worker, once it finds the task taken, reads it from there; the
        # taker uses its own reference and never reads the field again.
        cdef double until = _INF
        cdef _Runner runner
        cdef SendContext item
        cdef bint took
        with self._pool_lock:
            runners = list(self._runners)
        for r in runners:
            runner = <_Runner>r
            with runner.lock:
                item = runner.item
                if item is not None and not forced and item._deadline > now:
                    if item._deadline < until:
                        until = item._deadline
                    item = None
            if item is None:
                continue
            pair = (item, Cancelled("the dispatcher was force-closed") if forced
                    else self._timeout_error(item))
            with runner.lock:
                took = runner.item is item  # (else it ended meanwhile)
                if took:
                    runner.item = None
                    item._error = (<tuple>pair)[1]
            if took:
                taken.append(pair)
        return until

    cdef int _claim_overdue(self, list overdue, list expired) except -1:
        # The timer: take the coroutine tasks ``overdue`` (past their deadline
        # when it looked) out of the running list, into ``expired`` as
        # (task, error) pairs, unless they ended since; as in
        # _take_from_runners, each error is made first, outside the lock.
        cdef SendContext item
        pairs = [(item, self._timeout_error(item)) for item in overdue]
        with self._run_lock:
            for pair in pairs:
                item = <SendContext>(<tuple>pair)[0]
                if item._registered:
                    self._unlink_locked(item)
                    item._error = (<tuple>pair)[1]
                    expired.append(pair)
        return 0

    def _timer_main(self):
        """Body of the timer thread: deadlines, parked chats, the global line.

        Deadlines: every task gets the same send_timeout.  A worker's task
        is in its runner: the timer looks at each one.  The list of running
        coroutine tasks is ordered by start time, so also by deadline: the
        timer only ever looks at its head.  Pacing (parked chats, the global line,
        windows to forget) is the limiter's ``tick``, run outside _run_lock.
        A need that arrives meanwhile (a deadline registered, a chat parked,
        a start made) is kept in _timer_next, which the timer reads when it
        decides to sleep: it never sleeps past something due.  It sleeps
        until the earliest of these, or until woken by something earlier;
        after idle_timeout seconds with nothing to watch, it ends (the next
        need starts a new one), so that a dispatcher dropped without
        shutdown() is not kept alive by it.
        """
        cdef double until
        while True:
            until = self._timer_round()
            if until == _TIMER_STOP:
                return
            if until != _TIMER_AGAIN and not self._timer_sleep(until):
                return

    cdef double _timer_round(self) except? -3.0:
        # One look at everything the timer watches, acting on what is due.
        # Returns when to look next (_INF: nothing to watch), _TIMER_AGAIN
        # when it acted (which may have made more due), or _TIMER_STOP.
        cdef list overdue = []
        cdef list expired = []
        cdef list ready = []
        cdef list revoked = []
        cdef list dead = []
        cdef SendContext item
        cdef double now, until
        with self._run_lock:
            if self._timer_stop:
                return _TIMER_STOP
            self._timer_next = _INF
            now = monotonic()
            until = _INF
            if self._has_timeout:
                item = self._run_head
                while item is not None and item._deadline <= now:
                    overdue.append(item)
                    item = item._next
                if item is not None:
                    until = item._deadline
            if self._handoffs or self._loop_items:
                until = min(until, (<DispatcherCore>self)._check_loops_locked(now, revoked, dead))
        if overdue:
            self._claim_overdue(overdue, expired)
        if self._has_timeout:
            until = min(until, self._take_from_runners(now, False, expired))
        if not expired:
            until = min(until, self._limiter.tick(now, ready))
        for pair in expired:
            self._expire(<SendContext>(<tuple>pair)[0], _BY_TIMEOUT, (<tuple>pair)[1])
        for q in ready:
            (<DispatcherCore>self)._dispatch(<ChatQueue>q)
        for q in revoked:
            (<DispatcherCore>self)._schedule(<ChatQueue>q)  # a worker drops the task its loop never started
        for item in dead:
            (<DispatcherCore>self)._end_on_closed_loop(item)
        if expired or ready or revoked or dead:
            return _TIMER_AGAIN
        return until

    cdef bint _timer_sleep(self, double until) except -1:
        # Sleep until ``until`` or a wake-up.  False: the thread ends (the
        # dispatcher stopped it, or it had nothing to watch for idle_timeout).
        cdef double now, delay
        with self._run_lock:
            if self._timer_stop:
                return False
            if self._timer_next < until:
                until = self._timer_next
            now = monotonic()
            if until <= now:
                return True  # something became due while we looked
            # About to sleep (only then: a waker gives one token per sleep,
            # as the state says).
            self._set_timer_until_locked(until)
            self._timer_state = _IDLE if until == _INF else _UNTIL_DEADLINE
        # A wait longer than TIMEOUT_MAX raises: wake up earlier and look
        # again (every wait is bounded at its source too).
        delay = self._idle_timeout if until == _INF else min(until - now, _TIMEOUT_MAX_D)
        if _sleep(self._timer_wake, delay):
            return True
        with self._run_lock:
            if self._timer_state == _IDLE:
                # Nothing to watch for idle_timeout seconds: end, as an
                # idle worker does (the next task with a deadline starts
                # a new thread), so that a dispatcher dropped without
                # shutdown() is not kept alive by this thread.
                self._timer_state = _AWAKE
                self._timer_started = False
                return False
            if self._timer_state != _AWAKE:
                self._timer_state = _AWAKE
                self._set_timer_until_locked(_INF)
                return True
        # Woken just after the timeout: consume that token.
        _sleep(self._timer_wake, None)
        return True

    def _stop_timer(self):
        with self._run_lock:
            self._timer_stop = True
            self._wake_timer_locked()

    cdef int _expire(self, SendContext item, long long reason, object error) except -1:
        # The task is still running (Python cannot stop a thread); we release
        # its Future now (with ``error``, the one set on the task when it
        # was taken) and drop whatever it returns later.
        cdef int outcome = C_TIMED_OUT if reason == _BY_TIMEOUT else C_CANCELLED
        item._cancel_with(reason)
        future = item._future
        item._future = None
        FD_ADD(&self._counts[outcome], 1)
        if item._loop is not None:
            # A coroutine task: its caller hears it on its loop, and its
            # awaitable is cancelled there (its end goes on with the chat).
            _on_loop(item._loop, _aio_set, future, None, error)
            (<DispatcherCore>self)._cancel_async(item)
        elif future is not None:
            _future_finish(future, None, error)
        # on_done is called by the task's worker once the task returns (see
        # _run): a slow hook here would hold every other deadline, or
        # force_close().
        return 0
