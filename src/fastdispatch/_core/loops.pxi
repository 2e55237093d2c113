# Coroutine tasks: a chat handed to its event loop (G17, G26).
#
# The compiled twin of _core/loops.py, whose docstring explains this room;
# included by _ringbuf.pyx.  What differs here: the same hand-off.

cdef class _LoopHandoff(_Pool):
    """Chats handed to an event loop, for their coroutine tasks."""

    def _uses_loops(self):
        """Whether coroutine tasks (asubmit) were ever queued."""
        return self._async_used

    cdef bint _hand_to_loop(self, ChatQueue q, object loop) except -1:
        # Give an owned chat whose next task is ``loop``'s to that loop.
        # False when the loop is closed or not running: that task can never
        # start there.  A loop that stops before it takes the chat loses it
        # again to the timer (see _check_loops_locked).
        cdef double now
        cdef bint taken
        if loop.is_closed() or not loop.is_running():
            return False
        now = monotonic()
        with self._run_lock:
            self._handoffs[q] = (loop, now)
            self._timer_needed_locked(now + _HANDOFF_CHECK)
        try:
            if _running_loop() is loop:
                loop.call_soon(self._loop_step, q)
            else:
                loop.call_soon_threadsafe(self._loop_step, q)
        except RuntimeError:  # closed meanwhile
            with self._run_lock:
                taken = self._handoffs.pop(q, None) is not None
            return not taken  # else the timer took it back and handed it on
        return True

    def _loop_step(self, ChatQueue q):
        # On the loop a chat was handed to: take it (unless the timer took it
        # back meanwhile) and run its tasks that are this loop's.
        cdef bint mine
        with self._run_lock:
            mine = self._handoffs.pop(q, None) is not None
        if mine:
            self._drain_chat(q, _running_loop(), None)

    cdef int _start_async(self, SendContext item, ChatQueue q, object loop) except -1:
        # On ``loop``'s thread: start one attempt of a coroutine task.
        # _ASYNC when its awaitable runs on now (driven by the task's
        # caller, or a Task of its own: its end goes on with the chat); else
        # it ended at once, and this returns what _run does.
        cdef object go = item._future
        cdef bint forced = FD_LOAD(&self._forced) != 0
        cdef int ran
        if forced or go.cancelled():
            if q._reserved:
                self._limiter.release(q)
            error = (Cancelled("the dispatcher was force-closed") if forced
                     else Cancelled("cancelled before it started"))
            if item._attempt == 1:
                self._finish(item, error, C_CANCELLED)
                self._maybe_drained()
            else:
                self._settle_started(item, error, C_CANCELLED)
            return _DONE
        # The caller waits on ``go``; from now on the outcome goes to
        # ``out`` (set before the task is registered as running, so that
        # whoever settles it finds ``out``), and ``go`` tells the caller
        # that, and what to drive (see _Driven).  Started in its caller's
        # own call, ``go`` itself goes on as ``out``: that caller finds
        # what to drive on the task (``_aio``), with nothing to wake.
        cdef _Driven driven
        if item._inline:
            driven = _Driven(go, item._ctx)
        else:
            driven = _Driven(_new_aio_future(loop), item._ctx)
        item._future = driven.out
        ran = self._start_driven(item, q, loop, driven)
        if driven.out is not go and not go.done():
            go.set_result(driven)
        return ran

    cdef int _start_driven(self, SendContext item, ChatQueue q, object loop,
                           _Driven driven) except -1:
        cdef object result = None
        cdef object error = None
        cdef object panic = None
        cdef object aio = None
        if not self._begin(item, q, None):
            return _DONE
        ctx = driven.ctx
        try:
            # In the caller's context (copied at asubmit), never in the
            # context of whoever started the chat's run.
            result = _call_in_context(item)
        except Exception as exc:
            error = exc if type(exc) is not TypeError else _task_call_error(item.chat_id, exc)
        except BaseException as exc:
            error = panic = exc
        if error is None and _is_awaitable(result):
            if _DRIVES and PyCoro_CheckExact(result):
                # Its caller runs it (it awaits ``go``): no Task of its own.
                driven.coro = result
                aio = driven
            else:
                try:
                    if PyCoro_CheckExact(result):
                        aio = ctx.run(loop.create_task, result)
                    else:
                        aio = ctx.run(_asyncio.ensure_future, result, loop=loop)
                except Exception as exc:
                    error = exc
                    aio = None
                else:
                    aio.add_done_callback(functools.partial(self._aio_done, item))
            if aio is not None:
                item._aio = aio
                with self._run_lock:
                    item._queue = q
                    items = self._loop_items.get(loop)
                    if items is None:
                        items = self._loop_items[loop] = set()
                        self._timer_needed_locked(<double>monotonic() + _LOOP_CHECK)
                    items.add(item)
                return _ASYNC
        return self._end(item, q, result, error, panic, False, False, None)

    cdef ChatQueue _claim(self, SendContext item):
        # The end of a running coroutine task is handled once: by its loop
        # (_aio_done), or by the timer when that loop was closed first.
        # Returns the task's chat to whoever claims it, else None.
        cdef ChatQueue q
        with self._run_lock:
            q = item._queue
            if q is not None:
                item._queue = None
                items = self._loop_items.get(item._loop)
                if items is not None:
                    items.discard(item)
                    if not items:
                        del self._loop_items[item._loop]
        return q

    def _aio_done(self, SendContext item, aio):
        # On the loop: the Task of a coroutine task's awaitable ended.
        result = error = None
        cancelled = aio.cancelled()
        if not cancelled:
            error = aio.exception()
            if error is None:
                result = aio.result()
        self._aio_ended(item, result, error, cancelled)

    cdef int _aio_ended(self, SendContext item, object result, object error,
                        bint cancelled) except -1:
        # On the loop: the awaitable of a coroutine task ended (its Task's
        # done-callback, or its caller that drove it).
        cdef int ran
        cdef ChatQueue q = self._claim(item)
        if q is None:
            return 0
        loop = item._loop
        item._aio = None
        panic = error if error is not None and not isinstance(error, Exception) else None
        ran = self._end(item, q, result, error, panic, cancelled, False, None)
        if ran == _PANICKED:
            self._release_slot()
        else:
            # The chat goes on with the slot its ended task held: giving it
            # back here would wake a chat waiting for one, only for this
            # chat to take it again first (and that chat to wait again).
            q._slot_held = True
            self._drain_chat(q, loop, None)
        return 0

    cdef int _caller_gone(self, SendContext item, object future) except -1:
        # asubmit's caller was cancelled while it awaited ``future``: the
        # attempt running now (if any) is cancelled; one handed to the
        # caller but not driven yet ends cancelled here; one not started
        # yet is skipped when its turn comes.
        cdef _Driven driven
        aio = item._aio
        if type(aio) is _Driven:
            driven = <_Driven>aio
            if not driven.driven:
                driven.coro.close()
                self._aio_ended(item, None, None, True)
        elif future.cancelled():
            _cancel_aio(item)
        return 0

    cdef int _end_on_closed_loop(self, SendContext item) except -1:
        # The loop of a running coroutine task is closed: its awaitable will
        # never end there.  End it here, and go on with its chat.
        cdef int ran
        cdef ChatQueue q = self._claim(item)
        if q is None:
            return 0
        item._aio = None
        ran = self._end(item, q, None, None, None, True, False, None)
        self._release_slot()
        if ran != _PANICKED:
            self._dispatch(q)
        return 0

    cdef int _cancel_async(self, SendContext item) except -1:
        # A coroutine task past its deadline, or force-closed: cancel its
        # awaitable on its loop (or end it here if that loop is closed).
        try:
            item._loop.call_soon_threadsafe(_cancel_aio, item)
        except RuntimeError:
            self._end_on_closed_loop(item)
        return 0

    cdef double _check_loops_locked(self, double now, list revoked, list dead) except? -1.0:
        # With _run_lock held (the timer): chats handed to a loop that has
        # stopped or closed without taking them go back (to ``revoked``);
        # coroutine tasks of closed loops go to ``dead``.  Returns when to
        # look again.
        cdef double until = _INF
        cdef double at
        for q, entry in list(self._handoffs.items()):
            loop, at = entry
            if now - at < _HANDOFF_CHECK:
                until = min(until, at + _HANDOFF_CHECK)
            elif loop.is_closed() or not loop.is_running():
                del self._handoffs[q]
                revoked.append(q)
            else:
                until = min(until, now + _HANDOFF_CHECK)  # a busy loop: look again
        for loop, items in list(self._loop_items.items()):
            if loop.is_closed():
                dead.extend(items)
            else:
                until = min(until, now + _LOOP_CHECK)
        return until
