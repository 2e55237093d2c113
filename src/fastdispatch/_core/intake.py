"""Accepting a task: ``submit``, ``post`` and ``asubmit`` (G1, G4, G24).

``_enqueue`` puts the task in its chat's queue (inserting the queue on a
miss), starts the chat if it had no owner, and when the chat is full
either refuses (``QueueFull``, the default) or, with ``block=True``,
enters the caller in the chat's line of waiters.  The task counts as
pending before ``closed`` is read, so a ``shutdown()`` that saw no
pending work also made this call see the dispatcher closed.
"""

import contextvars
from time import monotonic

from .._errors import DispatcherClosed, _no_room, QueueFull, _safe_repr
from .._types import _checked_wait, Future

from . import constants
from .chats import _chat_key, _retry_key, _Waiter
from .items import _caller_cancelled, _caller_loop, _Driven, _new_item, _started_here
from .loops import _LoopHandoff


class _Intake(_LoopHandoff):
    """submit, post and asubmit."""

    __slots__ = ()

    def submit(self, chat_id, task, *, block=False, timeout=None):
        """Queue ``task`` for ``chat_id``; return a ``Future`` of its result.

        Cost: O(1) — one dict lookup, one lock, one push; a new chat also
        allocates its queue, and a chat without a worker is scheduled.
        Raises ``TypeError`` for bad arguments, ``QueueFull`` when the chat
        already has ``queue_size`` waiting tasks, ``DispatcherClosed`` after
        ``close()``; in each case nothing was queued.

        ``block=True``: when the chat is full, this thread waits for room
        (in turn with the chat's other waiters) instead, at most ``timeout``
        seconds (None: no limit), then ``QueueFull``.  ``QueueFull`` at
        once if ``max_waiting`` callers already wait, or if the wait could
        never end (the caller is the chat's own running task; see
        https://github.com/fastdispatch/fastdispatch/blob/main/docs/dispatcher.md#waiting-for-room);
        ``DispatcherClosed`` if ``close()`` comes first.
        """
        if not callable(task):
            raise TypeError("task must be callable, got %r" % (type(task).__name__,))
        if block or timeout is not None:
            timeout = _checked_wait(timeout)
        future = Future()
        waiter = self._enqueue(chat_id, task, future, None, block)
        if waiter is not None:
            self._wait_for_room(waiter, timeout)
        return future

    def post(self, chat_id, task, *, block=False, timeout=None):
        """Like ``submit`` without a Future: the outcome reaches hooks only."""
        if not callable(task):
            raise TypeError("task must be callable, got %r" % (type(task).__name__,))
        if block or timeout is not None:
            timeout = _checked_wait(timeout)
        waiter = self._enqueue(chat_id, task, None, None, block)
        if waiter is not None:
            self._wait_for_room(waiter, timeout)

    def _refuse_full(self, chat_id, q, block, waiter):
        # The chat is full and the caller does not wait: raise (``waiter``
        # says why a caller that asked to wait may not).
        if block:
            self._reject(chat_id, _no_room(chat_id, q.capacity, waiter,
                                           self._max_waiting))
        self._reject(chat_id, QueueFull(
            "chat %s already has %d waiting tasks" % (_safe_repr(chat_id), q.capacity)))

    def _enqueue(self, chat_id, task, future, loop=None, block=False, ctx=None):
        # Queue the task; or, when its chat is full and the caller waits
        # (``block``), return the _Waiter it must wait on.
        if chat_id is None:
            raise TypeError("chat_id must not be None")
        queues = self._queues
        key = _chat_key(chat_id)
        q = queues.get(key)
        item = _new_item(chat_id, task, future,
                         monotonic() if self._on_done is not None else 0.0, loop, ctx)
        holder = self._holder() if block else None
        waiter = None
        # Count the task as pending *before* looking at ``closed``: then a
        # shutdown() that saw no pending work also made this call see closed.
        with self._count_lock:
            self._submitted += 1
            self._pending += 1
        if self._closed:
            self._reject(chat_id, DispatcherClosed("the dispatcher is closed"))
        while True:
            if q is None:
                q = self._insert(chat_id, key)
            with q.lock:
                # G5 (docs/guarantees.md): the worker may have removed this very queue
                # from the map while we waited for its lock.  Pushing onto
                # it would give the chat a second queue and a second worker.
                # (_removed is set in the same critical section as the
                # removal: it says whether the map still holds this queue,
                # without running the chat id's __eq__ again.)
                if q._removed:
                    key = _retry_key(q, key)
                    q = None
                    continue
                items = q._items
                if len(items) >= q.capacity:
                    queue_len = -1
                    if block:
                        waiter = self._add_waiter_locked(q, item, loop, holder)
                else:
                    items.append(item)
                    queue_len = len(items)
                    start = not q.running
                    q.running = True
            break
        if queue_len < 0:
            if block and type(waiter) is _Waiter:
                return waiter
            self._refuse_full(chat_id, q, block, waiter)
        if start and loop is None:
            self._schedule(q)
        if self._on_queued is not None:
            try:
                self._on_queued(chat_id, queue_len)
            except BaseException as exc:  # the task is queued: submit must return
                self._hook_failed("on_queued", exc)
        if loop is None:
            return None
        if start:
            # asubmit, on ``loop``: the chat it now owns starts here, in this
            # call, as a free asyncio.Lock is taken without a trip through
            # the loop (a hand-off would cost a callback, a lock and an
            # entry the timer must watch, per chat that starts).
            item._inline = True
            self._drain_chat(q, loop)
            item._inline = False
        return item

    async def asubmit(self, chat_id, task, *, block=False, timeout=None):
        """Queue ``task`` for ``chat_id`` and await its result.

        Must be called from a coroutine on a running event loop
        (``RuntimeError`` otherwise).  ``task(sc)`` is called on this loop's
        thread, in a copy of the caller's ``contextvars`` context taken
        now (as ``asyncio.create_task`` does); when it returns an awaitable,
        that runs on this loop, in that context, and the chat stays owned
        until it ends; no thread is held meanwhile.  Returns the task's
        result or raises what ``submit``'s Future would hold (the task's
        exception, ``SendTimeout``, ``TaskDiscarded``, ``Cancelled``);
        ``QueueFull`` and ``DispatcherClosed`` at once.  ``block=True``:
        a full chat makes this coroutine wait for room as ``submit`` does
        (holding no thread).  Cancelling the await while it waits for
        room, or before the task started, skips it; after, the running
        attempt's awaitable is cancelled (whichever attempt it is) and the
        chat goes on.
        """
        loop = _caller_loop()
        if loop is None:
            raise RuntimeError(
                "asubmit() must be awaited in a coroutine running on an event loop "
                "(e.g. inside asyncio.run()); from a thread without a running loop, "
                "use submit() or post()")
        if not callable(task):
            raise TypeError("task must be callable, got %r" % (type(task).__name__,))
        if block or timeout is not None:
            timeout = _checked_wait(timeout)
        future = loop.create_future()
        self._async_used = True
        item = self._enqueue(chat_id, task, future, loop, block, contextvars.copy_context())
        suspended = False
        try:
            if type(item) is _Waiter:
                waiter, item = item, item.item
                await self._await_room(waiter, timeout, future)
                suspended = True
            outcome = _started_here(item, future)
            while True:
                if outcome is None:
                    if future.done():
                        outcome = future.result()
                    else:
                        suspended = True
                        outcome = await future
                if type(outcome) is not _Driven:
                    break
                # Its attempt started: the outcome goes to ``out``; a
                # coroutine is run here, in this Task (see _Driven).
                future = outcome.out
                if outcome.coro is not None:
                    await outcome
                    # (Taken off the attempt: its traceback holds the frame
                    # that holds the attempt.)
                    error, outcome.error = outcome.error, None
                    self._aio_ended(item, outcome.result, error, outcome.cancelled)
                    if _caller_cancelled(outcome):
                        raise constants._asyncio.CancelledError()
                    if isinstance(error, (KeyboardInterrupt, SystemExit)):
                        raise error
                    suspended = suspended or outcome.suspended
                outcome = None
            if not suspended:
                # Its task ended in this call without waiting: still let the
                # loop run others once, so that a loop of such calls cannot
                # starve them.
                await constants._asyncio.sleep(0)
            return outcome
        except constants._asyncio.CancelledError:
            # The caller cancelled its await: the attempt running now (if
            # any) is cancelled too; one not started yet is skipped.
            self._caller_gone(item, future)
            raise
