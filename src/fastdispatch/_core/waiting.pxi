# Waiting for room: ``block=True`` on a full chat (G24, G25).
#
# The compiled twin of _core/waiting.py, whose docstring explains this room;
# included by _ringbuf.pyx.  What differs here: the same protocol; a thread
# waits on a SimpleQueue token (_sleep).

cdef class _WaitingRoom(_ChatMap):
    """Callers waiting for room in a full chat, and the graph of who waits for whom."""

    # How many chats have a running task that waits for room (_wait_lock,
    # which also guards every ChatQueue._blocked_on).
    cdef cython.pymutex _wait_lock
    cdef Py_ssize_t _task_waiting
    cdef object _tls                  # per worker thread: its _Runner (running_chat)

    cdef object _add_waiter_locked(self, ChatQueue q, SendContext item, object loop,
                                   ChatQueue holder):
        # With q._lock held, the chat full: enter the caller in the chat's
        # line of waiters and return its _Waiter, or say why it may not wait.
        # A running task that waits holds a max_inflight slot (and, a thread
        # task, its worker) until room comes: refused when room could then
        # never come (its own chat; every slot held by waiting tasks; a
        # cycle of chats whose running tasks wait for each other), and a
        # thread's wait on a running event loop once coroutine tasks exist.
        cdef _Waiter waiter
        cdef int why
        if holder is q:
            return _NO_ROOM_SELF
        if loop is None and self._async_used and _running_loop() is not None:
            return _NO_ROOM_LOOP  # a thread wait would stall the loop coroutine tasks need
        if FD_ADD(&self._waiting, 1) >= self._max_waiting:
            FD_ADD(&self._waiting, -1)
            return _NO_ROOM_MAX
        if holder is not None:
            why = self._block_on(holder, q)
            if why:
                FD_ADD(&self._waiting, -1)
                return why
        FD_ADD(&self._submitted, -1)  # counted once let in
        waiter = _new_waiter(item, q, loop, holder)
        if q._waiters is None:
            q._waiters = deque()
        q._waiters.append(waiter)
        if FD_LOAD(&self._closed):
            # close() may have swept this chat before we came: turn away now.
            q._waiters.remove(waiter)
            if not q._waiters:
                q._waiters = None
            waiter.state = _W_CLOSED
            self._wake_waiter(waiter)
        return waiter

    cdef int _block_on(self, ChatQueue holder, ChatQueue q) except -1:
        # The chat ``holder``'s running task is about to wait for room in
        # ``q``: record it, or return why that wait could never end.
        cdef ChatQueue other
        cdef set seen
        cdef list todo
        with self._wait_lock:
            if holder._blocked_on is None and self._task_waiting + 1 >= self._max_inflight:
                return _NO_ROOM_SLOTS
            seen = set()
            todo = [q]
            while todo:
                other = <ChatQueue>todo.pop()
                if other is holder:
                    return _NO_ROOM_CYCLE
                if other._blocked_on is not None and id(other) not in seen:
                    seen.add(id(other))
                    todo.extend(other._blocked_on)
            if holder._blocked_on is None:
                holder._blocked_on = [q]
                self._task_waiting += 1
            else:
                holder._blocked_on.append(q)
        return 0

    cdef int _unblock(self, ChatQueue holder, ChatQueue q) except -1:
        with self._wait_lock:
            holder._blocked_on.remove(q)
            if not holder._blocked_on:
                holder._blocked_on = None
                self._task_waiting -= 1
        return 0

    cdef int _wake_waiter(self, _Waiter waiter) except -1:
        # Wake a waiter whose state was decided (under its chat's lock).
        if waiter.loop is None:
            waiter.wake.put(None)
        else:
            _on_loop(waiter.loop, _aio_set, waiter.wake, None, None)
        return 0

    cdef int _wake_admitted(self, ChatQueue q) except -1:
        # After q._lock was released: wake the waiters let in meanwhile.
        cdef list woken
        with q._lock:
            woken = q._woken
            q._woken = None
        if woken:
            FD_ADD(&self._submitted, len(woken))
            FD_ADD(&self._waiting, -len(woken))
            for w in woken:
                self._wake_waiter(<_Waiter>w)
        return 0

    cdef int _close_waiters(self) except -1:
        # close(): every caller waiting for room gets DispatcherClosed.
        cdef ChatQueue q
        cdef object waiters
        chats = []
        for stripe in self._stripes:
            chats.extend(list((<_Stripe>stripe).queues.values()))
        for q in chats:
            with q._lock:
                waiters = q._waiters
                q._waiters = None
                if waiters is not None:
                    for w in waiters:
                        (<_Waiter>w).state = _W_CLOSED
            if waiters is not None:
                for w in waiters:
                    self._wake_waiter(<_Waiter>w)
        return 0

    def _wait_for_room(self, _Waiter waiter, timeout):
        # submit/post with block=True: this thread waits for its turn.
        try:
            woken = _sleep(waiter.wake, timeout)
        except BaseException:
            self._end_wait(waiter, False, None)
            raise
        self._end_wait(waiter, not woken, timeout)

    async def _await_room(self, _Waiter waiter, timeout, future):
        # asubmit with block=True: this coroutine waits for its turn.
        timer = None
        if timeout is not None:
            timer = waiter.loop.call_later(timeout, _aio_set, waiter.wake, _TIMED_OUT, None)
        try:
            timed_out = (await waiter.wake) is _TIMED_OUT
        except BaseException:
            # Cancelled: nothing is left behind (a task let in meanwhile is
            # skipped, as a task cancelled before it started).
            try:
                if self._end_wait(waiter, False, None):
                    future.cancel()
            except DispatcherClosed:
                pass  # closed meanwhile: the cancellation is what the caller sees
            raise
        finally:
            if timer is not None:
                timer.cancel()
        self._end_wait(waiter, timed_out, timeout)

    def _end_wait(self, _Waiter waiter, bint timed_out, timeout):
        # The end of a wait for room.  ``timed_out``: the caller gives up
        # because its timeout passed (QueueFull), else it was woken, or it
        # gives up because it was interrupted.  Returns True if its task was
        # let in, else raises QueueFull or DispatcherClosed (or returns
        # False: interrupted).
        cdef ChatQueue q = waiter.q
        cdef SendContext item = waiter.item
        cdef int state
        with q._lock:
            state = waiter.state
            if state == _W_WAITING:
                q._waiters.remove(waiter)
                if not q._waiters:
                    q._waiters = None
                state = waiter.state = _W_GONE
        if waiter.holder is not None:
            self._unblock(waiter.holder, q)
        if state == _W_ADMITTED:
            if self._on_queued is not None and waiter.queue_len:
                try:
                    self._on_queued(item.chat_id, waiter.queue_len)
                except BaseException as exc:
                    self._hook_failed("on_queued", exc)
            return True
        FD_ADD(&self._waiting, -1)
        if state == _W_GONE and not timed_out:
            FD_ADD(&self._pending, -1)
            self._maybe_drained()
            return False
        chat_id = item.chat_id
        item._fn = item._future = None
        self._reject(chat_id, _wait_ended(chat_id, state == _W_CLOSED, timeout), True)


    def running_chat(self):
        """The chat id of this dispatcher's task that the calling code runs in.

        A thread task: the calling thread is the worker running it; a
        coroutine task: the calling code runs in its call or its awaitable
        (run in the task's own context, and what inherits it).  None anywhere
        else.  A request for that chat made from there would wait for the
        very task making it: plug-ins send it inline instead.
        """
        cdef ChatQueue q = self._holder()
        return None if q is None else q.chat_id

    cdef ChatQueue _holder(self):
        # The chat queue of the running task of this dispatcher that the
        # calling code runs in, or None.
        cdef ChatQueue q
        cdef SendContext item
        runner = getattr(self._tls, "runner", None)
        if runner is not None and (<_Runner>runner).chat is not None:
            return (<_Runner>runner).chat
        found = _current_task.get()
        if found is not None:
            item = <SendContext>found
            q = item._chatq
            if item._fn is not None and q is not None and q._core_ref is self._ref:
                return q
        return None
