# The worker pool: threads, slots and the ready list (G3, G6).
#
# The compiled twin of _core/pool.py, whose docstring explains this room;
# included by _ringbuf.pyx.  What differs here: the ready list is intrusive
# (ChatQueue._next_ready); a worker sleeps on a SimpleQueue token; it calls
# the loop hand-off, the room above, through DispatcherCore.

cdef class _Pool(_Outcomes):
    """Workers, slots and the ready list: the global cap."""

    # All guarded by _pool_lock (declared with the counters: the running
    # registry of thread tasks, _Deadlines._runners, is under it too).
    cdef ChatQueue _ready_head
    cdef ChatQueue _ready_tail
    cdef long long _ready_len         # atomic, so workers may peek without the lock
    cdef list _idle                   # the wakes of idle workers (a stack)
    cdef bint _searching              # a worker is on its way to the ready list
    cdef bint _stopping
    # Every start takes one of max_inflight slots (_inflight), held until
    # the task ends: a coroutine task in flight holds one but no thread.
    # With thread tasks only, a worker always finds one (there are at most
    # max_inflight workers); a chat that finds none waits in _slot_waiters
    # until an end hands it one.
    cdef object _slot_waiters         # deque of ChatQueue
    cdef long long _slot_waiting      # atomic: its length, peeked unlocked

    cdef int _schedule(self, ChatQueue q) except -1:
        # Put a chat that just got work (and has no worker) on the ready list.
        # When all max_inflight workers are busy the chat simply waits there:
        # it holds no thread (G6, docs/guarantees.md).
        cdef object searcher
        with self._pool_lock:
            self._ready_append(q)
            searcher = self._call_searcher_locked()
        self._send_searcher(searcher)
        return 0

    cdef object _call_searcher_locked(self):
        # With _pool_lock held: if no worker is already on its way to the
        # ready list, send one (an idle one, else a new one under the cap).
        # One at a time: a searcher that finds work calls the next one, so
        # workers are woken as fast as they actually start, not once per
        # chat (with the GIL, a burst of wake-ups is a burst of thread
        # switches that buys nothing).  Returns the idle worker's wake to
        # give a token, _SPAWN to start a new worker, or None.
        if self._searching:
            return None
        if self._idle:
            self._searching = True
            return self._idle.pop()
        if self._threads < self._max_inflight:
            self._searching = True
            self._threads += 1
            return _SPAWN
        return None

    cdef int _send_searcher(self, object searcher) except -1:
        if searcher is None:
            return 0
        if searcher is not _SPAWN:
            searcher.put(None)
        else:
            try:
                self._spawn_worker()
            except BaseException:
                with self._pool_lock:
                    self._threads -= 1
                    self._searching = False
                logger.exception("could not start a worker thread")
        return 0

    cdef inline void _ready_append(self, ChatQueue q):
        # With _pool_lock held.
        q._next_ready = None
        if self._ready_tail is None:
            self._ready_head = q
        else:
            self._ready_tail._next_ready = q
        self._ready_tail = q
        FD_ADD(&self._ready_len, 1)

    cdef inline ChatQueue _ready_popleft(self):
        # With _pool_lock held; the list is not empty.
        cdef ChatQueue q = self._ready_head
        self._ready_head = q._next_ready
        if self._ready_head is None:
            self._ready_tail = None
        q._next_ready = None
        FD_ADD(&self._ready_len, -1)
        return q

    def _worker_main(self):
        """Body of one worker thread: take a ready chat, drain it, repeat."""
        cdef ChatQueue q
        cdef bint searching = True  # a new worker was started as the searcher
        cdef _Runner runner = _Runner()
        wake = _Wake()
        with self._pool_lock:
            self._runners.append(runner)
        self._tls.runner = runner
        try:
            while True:
                q = self._next_chat(wake, searching, runner)
                if q is None:
                    return
                runner.chat = q  # what running_chat() says in this thread meanwhile
                self._drain_chat(q, None, runner)
                runner.chat = q = None  # an idle worker keeps nothing of the chats it ran
                searching = False
        finally:
            with self._pool_lock:
                self._runners.remove(runner)
            if FD_HANDBACK:
                self._flush(runner)

    cdef ChatQueue _next_chat(self, object wake, bint searching, _Runner runner):
        # Return the next ready chat, or None when this worker should exit
        # (idle for idle_timeout, or the dispatcher is stopping).
        # ``searching``: this worker was woken (or started) as the searcher.
        cdef ChatQueue q
        cdef object searcher
        cdef bint found
        while True:
            searcher = None
            q = None
            with self._pool_lock:
                if searching:
                    self._searching = searching = False
                    if FD_LOAD(&self._ready_len) > 1:
                        # More work than this worker: pass the baton on.
                        searcher = self._call_searcher_locked()
                if self._ready_head is not None:
                    q = self._ready_popleft()
                elif self._stopping:
                    self._threads -= 1
                    return None
                else:
                    self._idle.append(wake)
            if q is not None:
                self._send_searcher(searcher)
                return q
            if FD_HANDBACK:
                self._flush(runner)
            if _sleep(wake, self._idle_timeout):
                searching = True
                continue
            with self._pool_lock:
                found = wake in self._idle
                if found:
                    self._idle.remove(wake)
                    self._threads -= 1
            if found:
                return None
            # A waker popped us just as we timed out; take its token.
            _sleep(wake, None)
            searching = True

    cdef int _drain_chat(self, ChatQueue q, object here, _Runner runner) except -1:
        # Run the chat's tasks that belong here (on a worker, ``here`` None
        # and ``runner`` its own: thread tasks; on an event loop, ``runner``
        # None: that loop's coroutine tasks) until
        # the chat is empty, parked, handed to where its next task runs, or
        # left to a coroutine task whose end will go on with it.
        cdef SendContext item
        cdef bint rotate
        cdef int ran
        while True:
            if q._slot_held:
                q._slot_held = False
            elif not self._take_slot(q):
                return 0  # waits for a slot: a task's end hands it one
            if (self._limited or q._not_before != 0.0
                    or self._limiter._pause_until != 0.0):
                found = self._next_paced(q, here)
            else:
                with q._lock:
                    found = self._take_head_here_locked(q, here)
                    if found is None:
                        # G5 (docs/guarantees.md): the empty queue leaves the map while
                        # its lock is held, so a submitter's re-check cannot
                        # miss it.
                        q._running = False
                        if FD_HANDBACK and runner is not None:
                            # Before the map drops them: the queue and its key.
                            self._keep(runner, q)
                            self._keep(runner, q._key)
                        self._remove_locked(q)
            if q._woken is not None:
                self._wake_admitted(q)  # its task took the place of one that left
            if found is None or found is _PARKED_CHAT or found is _AGAIN or found is _ELSEWHERE:
                self._release_slot()
                if found is None:
                    break
                if found is _PARKED_CHAT:
                    return 0
                if found is _ELSEWHERE:
                    target = q._elsewhere
                    q._elsewhere = None
                    if target is _WORKERS:
                        self._schedule(q)
                        return 0
                    if (<DispatcherCore>self)._hand_to_loop(q, target):
                        return 0
                    self._drop_dead_head(q, target)
                continue
            item = <SendContext>found
            if here is None:
                ran = self._run(item, q, runner)
                if FD_HANDBACK and ran != _RETRYING:
                    self._keep(runner, item)
            else:
                ran = (<DispatcherCore>self)._start_async(item, q, here)
                if ran == _ASYNC:
                    return 0  # its awaitable's end goes on with the chat (slot kept)
            self._release_slot()
            if ran == _PANICKED:
                return 0  # the task panicked; its chat is gone
            if ran == _DONE and here is None and FD_LOAD(&self._ready_len):
                # Other chats wait for a worker: go to the back of the line
                # so that a busy chat cannot starve quiet ones.
                with q._lock:
                    rotate = q._count != 0
                if rotate:
                    with self._pool_lock:
                        self._ready_append(q)
                    return 0
        if q._granted:
            self._limiter.return_grant(q)
        self._maybe_drained()
        return 0

    cdef int _dispatch(self, ChatQueue q) except -1:
        # An owned chat that no thread or loop is running: give it to
        # whoever runs its next task (the workers, or that task's loop).
        cdef SendContext head = None
        if self._async_used:
            with q._lock:
                head = _peek_head(q)
            if head is not None and head._loop is not None and (<DispatcherCore>self)._hand_to_loop(q, head._loop):
                return 0
        self._schedule(q)
        return 0


    cdef bint _take_slot(self, ChatQueue q) except -1:
        # One of the max_inflight slots for the chat's next start, or False
        # (the chat then waits in _slot_waiters, which a task's end serves).
        if FD_ADD(&self._inflight, 1) < self._max_inflight:
            return True
        FD_ADD(&self._inflight, -1)
        with self._pool_lock:
            self._slot_waiters.append(q)
            FD_ADD(&self._slot_waiting, 1)
        # A slot freed between our look and our wait must not be missed.
        if FD_LOAD(&self._inflight) < self._max_inflight:
            self._wake_slot_waiter()
        return False

    cdef inline int _release_slot(self) except -1:
        # The last slot given back may be what a drain() waits for (a
        # worker holds one from before it takes a task until after it has
        # ended it and, for the chat's last one, removed the emptied queue).
        if FD_ADD(&self._inflight, -1) == 1 and FD_LOAD(&self._drain_waiters):
            self._maybe_drained()
        if FD_LOAD(&self._slot_waiting):
            self._wake_slot_waiter()
        return 0

    cdef int _wake_slot_waiter(self) except -1:
        cdef ChatQueue q = None
        with self._pool_lock:
            if self._slot_waiters:
                q = self._slot_waiters.popleft()
                FD_ADD(&self._slot_waiting, -1)
        if q is not None:
            self._dispatch(q)
        return 0

    cdef object _next_paced(self, ChatQueue q, object here):
        # The chat's next task if pacing lets it start now; _PARKED_CHAT if
        # the chat was parked (the timer will hand it back: no worker
        # sleeps for a limit); _AGAIN to look again; _ELSEWHERE if it runs
        # on another thread or loop than ``here``; None once the chat is
        # empty and removed.
        cdef _Limiter limiter = self._limiter
        cdef _Window window = q._window
        cdef bint failed = False
        cdef int admitted
        cdef SendContext head
        if limiter._chat_limits and (window is None or window.dead):
            try:
                window = q._window = limiter.window_for(q)
            except BaseException as exc:
                # limit_for, or the chat id's __hash__/__eq__, failed: the
                # task it was asked for fails with that error.
                if self._refuse_head(q, exc):
                    return _AGAIN
                window = None
                failed = True
        with q._lock:
            if q._retry_item is None and q._count == 0:
                q._running = False
                self._remove_locked(q)
                return None
            if failed:
                return _AGAIN  # a task arrived meanwhile: judge it again
            if self._async_used:
                head = _peek_head(q)
                if head._loop is not here:
                    q._elsewhere = head._loop if head._loop is not None else _WORKERS
                    return _ELSEWHERE
            admitted = limiter.admit(q, window)
            if admitted != _START:
                return _AGAIN if admitted == _REFETCH else _PARKED_CHAT
            return _take_head_locked(q)

    def _stop_workers(self):
        """Wake every idle worker so that it exits; stop the timer."""
        with self._pool_lock:
            self._stopping = True
            idle = self._idle
            self._idle = []
        for wake in idle:
            wake.put(None)
        self._stop_timer()
