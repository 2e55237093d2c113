"""Waiting for room: ``block=True`` on a full chat (G24, G25).

A caller that may wait enters the chat's line (``_add_waiter_locked``)
and sleeps: a thread on its own wake, a coroutine on a Future of its
loop (holding no thread).  A task leaving the ring lets the oldest waiter
in (``_admit_locked``, in the chat room) and wakes it
(``_wake_admitted``); ``close()`` wakes every waiter with
``DispatcherClosed`` (``_close_waiters``); a waiter that times out or is
cancelled leaves the line and nothing behind (``_end_wait``).

Nothing waits for itself (G25): a running task that would wait for room
in another chat is entered in a wait-for graph (``ChatQueue.blocked_on``
under ``_wait_lock``); a wait that would close a cycle, or need the slot
its own task holds, is refused at once with the reason.
``running_chat()`` says which chat the calling code runs for.
"""

from collections import deque

from .._errors import DispatcherClosed, _wait_ended

from . import constants
from .chats import _ChatMap, _Waiter
from .constants import (
    _current_task, _NO_ROOM_CYCLE, _NO_ROOM_LOOP, _NO_ROOM_MAX, _NO_ROOM_SELF,
    _NO_ROOM_SLOTS, _sleep, _TIMED_OUT, _W_ADMITTED, _W_CLOSED, _W_GONE, _W_WAITING)
from .items import _aio_set, _on_loop


class _WaitingRoom(_ChatMap):
    """Callers waiting for room in a full chat, and the graph of who waits for whom."""

    __slots__ = ("_wait_lock", "_task_waiting", "_tls")

    def _add_waiter_locked(self, q, item, loop, holder):
        # With q.lock held, the chat full: enter the caller in the chat's
        # line of waiters and return its _Waiter, or say why it may not wait.
        # A running task that waits holds a max_inflight slot (and, a thread
        # task, its worker) until room comes: refused when room could then
        # never come (its own chat; every slot held by waiting tasks; a
        # cycle of chats whose running tasks wait for each other), and a
        # thread's wait on a running event loop once coroutine tasks exist.
        if holder is q:
            return _NO_ROOM_SELF
        if loop is None and self._async_used and constants._asyncio._get_running_loop() is not None:
            return _NO_ROOM_LOOP  # a thread wait would stall the loop coroutine tasks need
        with self._count_lock:
            if self._waiting >= self._max_waiting:
                return _NO_ROOM_MAX
            self._waiting += 1
            self._submitted -= 1  # counted once let in
        if holder is not None:
            why = self._block_on(holder, q)
            if why:
                with self._count_lock:
                    self._waiting -= 1
                    self._submitted += 1
                return why
        waiter = _Waiter(item, q, loop, holder)
        if q.waiters is None:
            q.waiters = deque()
        q.waiters.append(waiter)
        if self._closed:
            # close() may have swept this chat before we came: turn away now.
            q.waiters.remove(waiter)
            if not q.waiters:
                q.waiters = None
            waiter.state = _W_CLOSED
            self._wake_waiter(waiter)
        return waiter

    def _block_on(self, holder, q):
        # The chat ``holder``'s running task is about to wait for room in
        # ``q``: record it, or return why that wait could never end.
        with self._wait_lock:
            if not holder.blocked_on and self._task_waiting + 1 >= self._max_inflight:
                return _NO_ROOM_SLOTS
            seen = set()
            todo = [q]
            while todo:
                other = todo.pop()
                if other is holder:
                    return _NO_ROOM_CYCLE
                if other.blocked_on and id(other) not in seen:
                    seen.add(id(other))
                    todo.extend(other.blocked_on)
            if holder.blocked_on is None:
                holder.blocked_on = [q]
                self._task_waiting += 1
            else:
                holder.blocked_on.append(q)
        return 0

    def _unblock(self, holder, q):
        with self._wait_lock:
            holder.blocked_on.remove(q)
            if not holder.blocked_on:
                holder.blocked_on = None
                self._task_waiting -= 1

    def _wake_waiter(self, waiter):
        # Wake a waiter whose state was decided (under its chat's lock).
        if waiter.loop is None:
            waiter.wake.put(None)
        else:
            _on_loop(waiter.loop, _aio_set, waiter.wake, None, None)

    def _wake_admitted(self, q):
        # After q.lock was released: wake the waiters let in meanwhile.
        with q.lock:
            woken, q.woken = q.woken, None
        if woken:
            with self._count_lock:
                self._submitted += len(woken)
                self._waiting -= len(woken)
            for w in woken:
                self._wake_waiter(w)

    def _close_waiters(self):
        # close(): every caller waiting for room gets DispatcherClosed.
        for q in list(self._queues.values()):
            with q.lock:
                waiters, q.waiters = q.waiters, None
                for w in waiters or ():
                    w.state = _W_CLOSED
            for w in waiters or ():
                self._wake_waiter(w)

    def _wait_for_room(self, waiter, timeout):
        # submit/post with block=True: this thread waits for its turn.
        try:
            woken = _sleep(waiter.wake, timeout)
        except BaseException:
            self._end_wait(waiter, False)
            raise
        self._end_wait(waiter, not woken, timeout)

    async def _await_room(self, waiter, timeout, future):
        # asubmit with block=True: this coroutine waits for its turn.
        timer = None
        if timeout is not None:
            timer = waiter.loop.call_later(timeout, _aio_set, waiter.wake, _TIMED_OUT, None)
        try:
            timed_out = await waiter.wake is _TIMED_OUT
        except BaseException:
            # Cancelled: nothing is left behind (a task let in meanwhile is
            # skipped, as a task cancelled before it started).
            try:
                if self._end_wait(waiter, False):
                    future.cancel()
            except DispatcherClosed:
                pass  # closed meanwhile: the cancellation is what the caller sees
            raise
        finally:
            if timer is not None:
                timer.cancel()
        self._end_wait(waiter, timed_out, timeout)

    def _end_wait(self, waiter, timed_out, timeout=None):
        # The end of a wait for room.  ``timed_out``: the caller gives up
        # because its timeout passed (QueueFull), else it was woken, or it
        # gives up because it was interrupted (None).  Returns True if its
        # task was let in, else raises QueueFull or DispatcherClosed (or
        # returns False: interrupted).
        q = waiter.q
        item = waiter.item
        with q.lock:
            state = waiter.state
            if state == _W_WAITING:
                q.waiters.remove(waiter)
                if not q.waiters:
                    q.waiters = None
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
        with self._count_lock:
            self._waiting -= 1
            if state == _W_GONE and not timed_out:
                self._pending -= 1
        if state == _W_GONE and not timed_out:
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
        q = self._holder()
        return None if q is None else q.chat_id

    def _holder(self):
        # The chat queue of the running task of this dispatcher that the
        # calling code runs in, or None.
        q = getattr(self._tls, "chat", None)
        if q is not None:
            return q
        item = _current_task.get()
        if item is not None and item._fn is not None:
            q = item._chatq
            if q is not None and q.core_ref is self._ref:
                return q
        return None
