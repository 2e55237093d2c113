"""Pure-Python implementation of the dispatcher core.

This module is the twin of ``_ringbuf.pyx``: same classes, same behaviour,
same locking protocol, line for line where it matters.  It is used when the
extension is missing or ``FASTDISPATCH_NO_EXTENSIONS=1`` is set, and the test
suite runs every behaviour test against both.  The design is explained once,
in ``docs/dispatcher.md``; the comments here only mark where each invariant
of SPEC §2.3 is kept.

Locks, and what each protects:

- ``ChatQueue.lock``: the queue's items and its ``running`` flag, and the
  removal of the queue from the chat map (invariant 4).
- ``_map_lock``: inserting a new queue into the chat map, against resetting
  the map when its last chat leaves.
- ``_pool_lock``: the ready list (chats that have work but no worker), the
  idle-worker stack and the thread count.
- ``_run_lock``: the registry of running tasks (the deadline schedule) and
  the timer thread's sleep state.
- ``_count_lock``: the counters (the C twin uses atomic integers instead).

The only nesting is ``_map_lock`` inside a queue lock (when the last chat
leaves the map); nothing takes them the other way round, so there is no lock
order to get wrong.
"""

import logging
import operator
import sys
import threading
from collections import OrderedDict, deque
from concurrent.futures._base import CANCELLED as _CANCELLED
from time import monotonic

from ._errors import Cancelled, DispatcherClosed, QueueFull, SendTimeout, TaskDiscarded
from ._errors import _safe_repr
from ._types import DispatchInfo, Future

__all__ = ["RingBuffer", "ChatQueue", "SendContext", "DispatcherCore"]

logger = logging.getLogger("fastdispatch")

_allocate_lock = threading.Lock
_NOT_CANCELLED, _BY_TIMEOUT, _BY_FORCE = 0, 1, 2
# The timer thread's state: awake, asleep until the registry head's deadline,
# or asleep with nothing to wait for (a task start must wake it).
_AWAKE, _UNTIL_DEADLINE, _IDLE = 0, 1, 2
# What _call_searcher_locked returns when a new worker thread must start.
_SPAWN = object()
# Guards the lazy creation of SendContext events (rare: only for wait()).
_event_lock = threading.Lock()


class RingBuffer:
    """A FIFO of fixed capacity.  ``push`` is O(1) and refuses when full."""

    __slots__ = ("_items", "capacity")

    def __init__(self, capacity):
        self._items = deque()
        self.capacity = _checked_capacity(capacity)

    def push(self, item):
        """Append ``item``; return False (and store nothing) when full."""
        if len(self._items) >= self.capacity:
            return False
        self._items.append(item)
        return True

    def pop(self):
        """Remove and return the oldest item; raise IndexError when empty."""
        return self._items.popleft()

    def clear(self):
        """Remove every item and return them, oldest first."""
        items = list(self._items)
        self._items.clear()
        return items

    def __len__(self):
        return len(self._items)

    @property
    def full(self):
        return len(self._items) >= self.capacity


def _checked_capacity(capacity):
    # The same limits as the compiled core, which keeps it in a C ssize_t.
    capacity = operator.index(capacity)
    if capacity < 1:
        raise ValueError("capacity must be at least 1")
    if capacity > sys.maxsize:
        raise ValueError("capacity must be at most sys.maxsize (%d), got %r"
                         % (sys.maxsize, capacity))
    return capacity


class ChatQueue(RingBuffer):
    """One chat's waiting tasks, its lock, and whether a worker owns it."""

    __slots__ = ("chat_id", "lock", "running", "_key", "_removed")

    def __init__(self, chat_id, capacity):
        RingBuffer.__init__(self, capacity)
        self.chat_id = chat_id
        self._key = chat_id  # the chat map's key (see _chat_key)
        self._removed = False  # out of the chat map for good (under lock)
        self.lock = _allocate_lock()
        # True from the moment the chat is scheduled until its worker removes
        # the queue from the chat map; at most one worker owns it meanwhile.
        self.running = False


class SendContext:
    """What a task receives: its chat, its deadline and its cancellation.

    A task should pass it on to blocking calls (``sc.remaining()`` as a
    timeout) and may poll ``sc.cancelled`` or call ``sc.check()``.
    ``SendContext(chat_id, deadline=None)`` can be built by hand to test a
    sender outside a dispatcher.
    """

    __slots__ = (
        "chat_id", "_deadline", "_cancel", "_event",
        "_fn", "_future", "_t_queued", "_t_start", "_queue_len", "_attempt",
        "_error",
    )

    def __init__(self, chat_id, deadline=None):
        self.chat_id = chat_id
        self._deadline = None if deadline is None else float(deadline)
        self._cancel = _NOT_CANCELLED
        self._event = None
        self._fn = self._future = None
        self._t_queued = self._t_start = 0.0
        self._queue_len = 0
        self._attempt = 1
        self._error = None  # set when the deadline or force_close() claims it

    @property
    def attempt(self):
        """Which attempt of the task this is: 1 for the first run."""
        return self._attempt

    @property
    def deadline(self):
        """``time.monotonic()`` value at which the task must stop, or None."""
        return self._deadline

    def remaining(self):
        """Seconds left before the deadline (never negative), or None."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - monotonic())

    @property
    def cancelled(self):
        """True once the deadline passed or ``force_close()`` ran."""
        if self._cancel:
            return True
        return self._deadline is not None and monotonic() >= self._deadline

    def wait(self, timeout=None):
        """Block until cancelled or ``timeout`` seconds; return ``cancelled``."""
        if self.cancelled:
            return True
        remaining = self.remaining()
        if remaining is not None and (timeout is None or remaining < timeout):
            timeout = remaining
        if timeout is not None and timeout > threading.TIMEOUT_MAX:
            timeout = None  # longer than a lock can wait: until cancelled
        with _event_lock:
            if self._cancel:
                return True
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        event.wait(timeout)
        return self.cancelled

    def check(self):
        """Raise ``Cancelled`` or ``SendTimeout`` if cancelled; else return."""
        if self._cancel == _BY_FORCE:
            raise Cancelled("the dispatcher was force-closed")
        if self.cancelled:
            raise SendTimeout("the send deadline passed")

    def __repr__(self):
        return "<SendContext chat_id=%s deadline=%r cancelled=%r>" % (
            _safe_repr(self.chat_id), self._deadline, self.cancelled)

    def _cancel_with(self, reason):
        # Called once, by whoever claimed the task out of the running registry.
        self._cancel = reason
        with _event_lock:
            event = self._event
        if event is not None:
            event.set()


def _new_item(chat_id, fn, future, t_queued):
    item = SendContext.__new__(SendContext)
    item.chat_id = chat_id
    item._deadline = None
    item._cancel = _NOT_CANCELLED
    item._event = None
    item._fn = fn
    item._future = future
    item._t_queued = t_queued
    item._t_start = 0.0
    item._queue_len = 0
    item._attempt = 1
    item._error = None
    return item


class _ChatKey:
    """A chat id as the chat map's key: its hash taken once, its ``==`` safe.

    A chat id is user code: its ``__hash__`` runs again at every dict
    operation (a lookup, an insert, the worker's removal) and may raise or
    change between calls, and its ``__eq__`` may raise.  The map therefore
    keys anything but a plain ``int`` or ``str`` by this wrapper: one hash
    per submit (an error there is the caller's, raised before anything is
    counted), and an ``__eq__`` that raises makes two ids unequal.  Such an
    ``__eq__`` can leave two equal keys in the map; the worker removes its
    own entry all the same, because a key being removed (``_removing``,
    set under its queue's lock) equals nothing but itself.
    """

    __slots__ = ("chat_id", "_hash", "_removing")

    def __init__(self, chat_id, hash_value):
        self.chat_id = chat_id
        self._hash = hash_value
        self._removing = False

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        if self._removing:
            return self is other
        if type(other) is _ChatKey:
            if other._removing:
                return self is other
            other_id = other.chat_id
        else:
            other_id = other
        if self.chat_id is other_id:
            return True
        try:
            return bool(self.chat_id == other_id)
        except BaseException:
            return False


def _chat_key(chat_id):
    """The chat map's key for ``chat_id`` (itself for a plain int or str)."""
    if type(chat_id) is int or type(chat_id) is str:
        return chat_id
    try:
        hash_value = hash(chat_id)
    except TypeError:
        raise TypeError("chat_id must be hashable, got %r"
                        % (type(chat_id).__name__,)) from None
    return _ChatKey(chat_id, hash_value)


def _settle(future, exc):
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



def _notify_cancelled(future):
    # concurrent.futures.wait() and as_completed() see a cancelled Future
    # only once set_running_or_notify_cancel() has moved it on to
    # CANCELLED_AND_NOTIFIED, as an executor does for each one it drops.
    # The worker does that for a task it pops; this is for the others.
    if future._state == _CANCELLED:
        future.set_running_or_notify_cancel()


class DispatcherCore:
    """The per-chat queues, the worker loop and the deadline loop.

    ``OutboundDispatcher`` (in ``_dispatcher.py``) adds configuration checks,
    threads and the lifecycle on top of this class.
    """

    def __init__(self, *args, **kwargs):
        self._queues = {}
        self._map_lock = _allocate_lock()
        self._closed = False
        self._pool_lock = _allocate_lock()
        self._ready = deque()
        self._idle = []
        self._threads = 0
        self._searching = False
        self._stopping = False
        self._run_lock = _allocate_lock()
        self._running = OrderedDict()
        self._timer_wake = _allocate_lock()
        self._timer_wake.acquire()
        self._timer_state = _AWAKE
        self._timer_started = False
        self._timer_stop = False
        self._forced = False
        self._count_lock = _allocate_lock()
        self._pending = 0
        self._drain_waiters = 0
        self._inflight = 0
        self._submitted = self._completed = self._failed = 0
        self._rejected = self._discarded = self._cancelled = self._timed_out = 0
        self._retried = self._paced = self._parked = 0

    def _configure(self, max_inflight, queue_size, send_timeout, idle_timeout,
                   hooks, recover, pacing=None, retry=None):
        self._max_inflight = max_inflight
        self._queue_size = queue_size
        self._send_timeout = send_timeout
        self._idle_timeout = idle_timeout
        self._on_queued = hooks.on_queued
        self._on_start = hooks.on_start
        self._on_done = hooks.on_done
        self._on_rejected = hooks.on_rejected
        self._on_retry = hooks.on_retry
        self._recover = recover
        self._pacing = pacing
        self._retry = retry

    # ------------------------------------------------------------------ submit

    def submit(self, chat_id, task):
        """Queue ``task`` for ``chat_id``; return a ``Future`` of its result.

        Cost: O(1) — one dict lookup, one lock, one push; a new chat also
        allocates its queue, and a chat without a worker is scheduled.
        Raises ``TypeError`` for bad arguments, ``QueueFull`` when the chat
        already has ``queue_size`` waiting tasks, ``DispatcherClosed`` after
        ``close()``; in each case nothing was queued.
        """
        if not callable(task):
            raise TypeError("task must be callable, got %r" % (type(task).__name__,))
        future = Future()
        self._enqueue(chat_id, task, future)
        return future

    def post(self, chat_id, task):
        """Like ``submit`` without a Future: the outcome reaches hooks only."""
        if not callable(task):
            raise TypeError("task must be callable, got %r" % (type(task).__name__,))
        self._enqueue(chat_id, task, None)

    def _enqueue(self, chat_id, task, future):
        if chat_id is None:
            raise TypeError("chat_id must not be None")
        queues = self._queues
        key = _chat_key(chat_id)
        q = queues.get(key)
        item = _new_item(chat_id, task, future,
                         monotonic() if self._on_done is not None else 0.0)
        # Count the task as pending *before* looking at ``closed``: then a
        # shutdown() that saw no pending work also made this call see closed.
        with self._count_lock:
            self._submitted += 1
            self._pending += 1
        if self._closed:
            self._reject(chat_id, DispatcherClosed("the dispatcher is closed"))
        while True:
            if q is None:
                # Allocate only on a miss; setdefault keeps whichever queue
                # another submitter may have installed first.
                fresh = ChatQueue(chat_id, self._queue_size)
                fresh._key = key
                with self._map_lock:
                    q = queues.setdefault(key, fresh)
            with q.lock:
                # Invariant 4: the worker may have removed this very queue
                # from the map while we waited for its lock.  Pushing onto
                # it would give the chat a second queue and a second worker.
                # (_removed is set in the same critical section as the
                # removal: it says whether the map still holds this queue,
                # without running the chat id's __eq__ again.)
                if q._removed:
                    q = None
                    continue
                items = q._items
                if len(items) >= q.capacity:
                    queue_len = -1
                else:
                    items.append(item)
                    queue_len = len(items)
                    start = not q.running
                    q.running = True
            break
        if queue_len < 0:
            self._reject(chat_id, QueueFull(
                "chat %s already has %d waiting tasks" % (_safe_repr(chat_id), q.capacity)))
        if start:
            self._schedule(q)
        if self._on_queued is not None:
            try:
                self._on_queued(chat_id, queue_len)
            except BaseException as exc:  # the task is queued: submit must return
                self._hook_failed("on_queued", exc)

    def _reject(self, chat_id, exc):
        with self._count_lock:
            self._submitted -= 1
            self._pending -= 1
            self._rejected += 1
        self._maybe_drained()
        if self._on_rejected is not None:
            try:
                self._on_rejected(chat_id, exc)
            except BaseException as hook_exc:
                self._hook_failed("on_rejected", hook_exc)
        raise exc

    def _schedule(self, q):
        # Put a chat that just got work (and has no worker) on the ready list.
        # When all max_inflight workers are busy the chat simply waits there:
        # it holds no thread (invariant 5).
        with self._pool_lock:
            self._ready.append(q)
            searcher = self._call_searcher_locked()
        self._send_searcher(searcher)

    def _call_searcher_locked(self):
        # With _pool_lock held: if no worker is already on its way to the
        # ready list, send one (an idle one, else a new one under the cap).
        # One at a time: a searcher that finds work calls the next one, so
        # workers are woken as fast as they actually start, not once per
        # chat (with the GIL, a burst of wake-ups is a burst of thread
        # switches that buys nothing).  Returns the idle worker's wake lock to
        # release, _SPAWN to start a new worker, or None.
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

    def _send_searcher(self, searcher):
        if searcher is None:
            return
        if searcher is not _SPAWN:
            searcher.release()
        else:
            try:
                self._spawn_worker()
            except BaseException:
                with self._pool_lock:
                    self._threads -= 1
                    self._searching = False
                logger.exception("could not start a worker thread")

    def queue_len(self, chat_id):
        """Number of tasks of ``chat_id`` waiting (the running one excluded)."""
        q = self._queues.get(_chat_key(chat_id))
        if q is None:
            return 0
        with q.lock:
            return len(q._items)

    @property
    def active_chats(self):
        """Chats that have waiting or running work."""
        return len(self._queues)

    @property
    def inflight(self):
        """Tasks running right now."""
        return self._inflight

    @property
    def closed(self):
        """True once ``close()`` (or ``shutdown``/``force_close``) ran."""
        return self._closed

    def _counters(self):
        with self._count_lock:
            return (self._submitted, self._completed, self._failed, self._rejected,
                    self._discarded, self._cancelled, self._timed_out,
                    len(self._queues), self._inflight, self._threads,
                    self._retried, self._paced, self._parked)

    def _pending_count(self):
        return self._pending

    def _add_drain_waiter(self, n):
        with self._count_lock:
            self._drain_waiters += n

    def _maybe_drained(self):
        if self._drain_waiters and not self._pending and not self._queues:
            self._notify_drained()

    # ----------------------------------------------------------------- workers

    def _worker_main(self):
        """Body of one worker thread: take a ready chat, drain it, repeat."""
        wake = _allocate_lock()
        wake.acquire()
        searching = True  # a new worker was started as the searcher
        while True:
            q = self._next_chat(wake, searching)
            if q is None:
                return
            self._drain_chat(q)
            searching = False

    def _next_chat(self, wake, searching):
        # Return the next ready chat, or None when this worker should exit
        # (idle for idle_timeout, or the dispatcher is stopping).
        # ``searching``: this worker was woken (or started) as the searcher.
        while True:
            searcher = None
            with self._pool_lock:
                if searching:
                    self._searching = searching = False
                    if len(self._ready) > 1:
                        # More work than this worker: pass the baton on.
                        searcher = self._call_searcher_locked()
                if self._ready:
                    q = self._ready.popleft()
                elif self._stopping:
                    self._threads -= 1
                    return None
                else:
                    q = None
                    self._idle.append(wake)
            if q is not None:
                self._send_searcher(searcher)
                return q
            if wake.acquire(True, self._idle_timeout):
                searching = True
                continue
            with self._pool_lock:
                if wake in self._idle:
                    self._idle.remove(wake)
                    self._threads -= 1
                    return None
            # A waker popped us just as we timed out; take its release.
            wake.acquire()
            searching = True

    def _drain_chat(self, q):
        while True:
            with q.lock:
                items = q._items
                if not items:
                    # Invariant 4: the empty queue leaves the map while its
                    # lock is held, so a submitter's re-check cannot miss it.
                    q.running = False
                    self._remove_locked(q)
                    break
                item = items.popleft()
                item._queue_len = len(items)
            if not self._run(item, q):
                return  # the task panicked; its chat is gone
            if self._ready and q._items:
                # Other chats wait for a worker: go to the back of the line
                # so that a busy chat cannot starve quiet ones.
                with self._pool_lock:
                    self._ready.append(q)
                return
        self._maybe_drained()

    def _remove_locked(self, q):
        # With q.lock held: take q out of the chat map.  A dict never
        # shrinks on deletion, so after a burst of 100k chats its table would
        # keep its peak size for good; when the last chat leaves, reset it
        # (under _map_lock, so that no insert can slip in between).
        queues = self._queues
        if not q._removed:
            q._removed = True
            key = q._key
            if type(key) is _ChatKey:
                key._removing = True
            queues.pop(key, None)
        if not queues:
            with self._map_lock:
                if not queues:
                    queues.clear()

    def _run(self, item, q):
        """Run one task.  Return False if it panicked."""
        future = item._future
        if self._forced:
            # Popped just before force_close() cleared the queue: dropped as
            # a waiting task is (its Future cancelled).  _register re-checks.
            self._finish(item, Cancelled("the dispatcher was force-closed"), "cancelled")
            return True
        if future is not None and not future.set_running_or_notify_cancel():
            self._finish(item, Cancelled("cancelled before it started"), "cancelled")
            return True
        if self._on_start is not None:
            try:
                self._on_start(item.chat_id)
            except BaseException as exc:
                self._hook_failed("on_start", exc)
        if self._send_timeout is not None or self._on_done is not None:
            item._t_start = monotonic()
            if self._send_timeout is not None:
                item._deadline = item._t_start + self._send_timeout
        if not self._register(item):
            return self._refused(item)
        with self._count_lock:
            self._inflight += 1
        panic = None
        try:
            result = item._fn(item)
            error = None
        except Exception as exc:
            error = exc
        except BaseException as exc:
            error = panic = exc
        with self._count_lock:
            self._inflight -= 1
        # Whoever takes the task out of the running registry owns its
        # outcome: us, or the timer (deadline) or force_close().
        if self._unregister(item):
            if panic is not None:
                discarded = TaskDiscarded("the task panicked: %s" % (_safe_repr(panic),))
                discarded.__cause__ = panic
                self._resolve(item, None, discarded, "failed")
            elif error is not None:
                self._resolve(item, None, error, "failed")
            else:
                self._resolve(item, result, None, "completed")
        elif self._on_done is not None:
            # Timed out or force-closed meanwhile: its outcome is settled;
            # report it now that it has returned, from this thread.
            self._report(item, self._expired_error(item), monotonic() - item._t_start)
            item._error = None
        if panic is not None:
            self._panic(q, panic)
        item._fn = None
        with self._count_lock:
            self._pending -= 1
        self._maybe_drained()
        return panic is None

    def _resolve(self, item, result, error, outcome):
        # Only the owner of the outcome touches (and then drops) the Future.
        future = item._future
        item._future = None
        if future is not None:
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
        self._count(outcome)
        if self._on_done is not None:
            self._report(item, error, monotonic() - item._t_start)

    def _finish(self, item, error, outcome):
        # Settle a task that never started (cancelled, discarded, dropped).
        if not _settle(item._future, error):
            outcome = "cancelled"
        self._count(outcome)
        if self._on_done is not None:
            self._report(item, error, 0.0)
        item._fn = item._future = None
        with self._count_lock:
            self._pending -= 1

    def _count(self, outcome):
        with self._count_lock:
            if outcome == "completed":
                self._completed += 1
            elif outcome == "failed":
                self._failed += 1
            elif outcome == "cancelled":
                self._cancelled += 1
            elif outcome == "discarded":
                self._discarded += 1
            else:
                self._timed_out += 1

    def _report(self, item, error, run_latency):
        start = item._t_start if item._t_start else monotonic()
        info = DispatchInfo(item.chat_id, item._queue_len,
                            max(0.0, start - item._t_queued), run_latency, error)
        try:
            self._on_done(info)
        except BaseException as exc:
            self._hook_failed("on_done", exc)

    def _panic(self, q, exc):
        # SPEC §2.6: the worker survives; the chat's waiting tasks are
        # discarded (each Future resolved, never left pending), the queue is
        # removed, then recover(exc) runs.
        with q.lock:
            waiting = q.clear()
            q.running = False
            self._remove_locked(q)
        chat = _safe_repr(q.chat_id)
        for item in waiting:
            error = TaskDiscarded("a previous task of chat %s panicked" % (chat,))
            error.__cause__ = exc
            self._finish(item, error, "discarded")
        logger.error("task of chat %s panicked; %d waiting task(s) discarded",
                     chat, len(waiting), exc_info=exc)
        self._call_recover(exc)

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

    # -------------------------------------------------- running tasks, deadlines

    def _register(self, item):
        # Return False, registering nothing, once force_close() has begun.
        with self._run_lock:
            if self._forced:
                return False
            self._running[item] = None
            if item._deadline is not None:
                if not self._timer_started:
                    self._timer_started = True
                    start_timer = True
                else:
                    start_timer = False
                    if self._timer_state == _IDLE:
                        self._wake_timer_locked()
            else:
                start_timer = False
        if start_timer:
            self._start_timer()
        return True

    def _refused(self, item):
        # A task popped just before force_close() cleared its queue: it must
        # not start once force_close() has returned.
        self._resolve(item, None, Cancelled("the dispatcher was force-closed"), "cancelled")
        item._fn = None
        with self._count_lock:
            self._pending -= 1
        self._maybe_drained()
        return True

    def _refuse_new_starts(self):
        # force_close(), before it cancels what runs: from now on _register
        # refuses, so no task starts after force_close() returned.
        with self._run_lock:
            self._forced = True

    def _unregister(self, item):
        with self._run_lock:
            return self._running.pop(item, 0) is None

    def _wake_timer_locked(self):
        # Release the timer's wake lock once per sleep (with _run_lock held):
        # the state flag makes sure we never release it twice.
        if self._timer_state != _AWAKE:
            self._timer_state = _AWAKE
            self._timer_wake.release()

    def _timer_main(self):
        """Body of the deadline thread.

        The registry is ordered by start time and every task gets the same
        send_timeout, so it is also ordered by deadline: the timer only ever
        looks at its head.  It sleeps until the head's deadline, or until
        woken when a first task starts after a quiet spell; after
        idle_timeout seconds with nothing to watch, it ends.
        """
        running = self._running
        while True:
            expired = []
            with self._run_lock:
                if self._timer_stop:
                    return
                now = monotonic()
                delay = None
                for item in running:
                    if item._deadline > now:
                        delay = item._deadline - now
                        break
                    expired.append(item)
                for item in expired:
                    del running[item]
                    item._error = SendTimeout()  # see _expired_error
                if not expired:
                    self._timer_state = _IDLE if delay is None else _UNTIL_DEADLINE
            if expired:
                for item in expired:
                    self._expire(item, _BY_TIMEOUT)
                continue
            woken = self._timer_wake.acquire(
                True, self._idle_timeout if delay is None else delay)
            if not woken:
                with self._run_lock:
                    if self._timer_state == _IDLE:
                        # Nothing to watch for idle_timeout seconds: end, as an
                        # idle worker does (the next task with a deadline starts
                        # a new thread), so that a dispatcher dropped without
                        # shutdown() is not kept alive by this thread.
                        self._timer_state = _AWAKE
                        self._timer_started = False
                        return
                    if self._timer_state != _AWAKE:
                        self._timer_state = _AWAKE
                        continue
                # Woken just after the timeout: consume that release.
                self._timer_wake.acquire()

    def _timer_start_failed(self):
        # The deadline thread could not start: let the next task retry.
        with self._run_lock:
            self._timer_started = False

    def _stop_timer(self):
        with self._run_lock:
            self._timer_stop = True
            self._wake_timer_locked()

    def _expire(self, item, reason):
        # The task is still running (Python cannot stop a thread); we release
        # its Future now and drop whatever it returns later.
        item._cancel_with(reason)
        error = self._expired_error(item)
        outcome = "timed_out" if reason == _BY_TIMEOUT else "cancelled"
        future = item._future
        item._future = None
        if future is not None:
            future.set_exception(error)
        self._count(outcome)
        # on_done is called by the task's worker once the task returns (see
        # _run): a slow hook here would hold every other deadline, or
        # force_close().

    def _expired_error(self, item):
        # The error was made when the task was claimed (under _run_lock, so
        # that its worker finds it); a SendTimeout gets its message here,
        # outside any lock (the chat id's repr is user code).
        error = item._error
        if isinstance(error, SendTimeout) and not error.args:
            error.args = ("chat %s: the task ran past its %ss send_timeout"
                          % (_safe_repr(item.chat_id), self._send_timeout),)
        return error

    # ---------------------------------------------------------------- lifecycle

    def _close(self):
        self._closed = True

    def _cancel_everything(self):
        """force_close(): cancel running tasks and every waiting task."""
        self._closed = True
        with self._run_lock:
            running = list(self._running)
            self._running.clear()
            for item in running:
                item._error = Cancelled("the dispatcher was force-closed")
        for item in running:
            self._expire(item, _BY_FORCE)
        for q in list(self._queues.values()):
            with q.lock:
                waiting = q.clear()
            for item in waiting:
                self._finish(item, Cancelled("the dispatcher was force-closed"),
                             "cancelled")
        self._maybe_drained()

    def _stop_workers(self):
        """Wake every idle worker so that it exits; stop the timer."""
        with self._pool_lock:
            self._stopping = True
            idle, self._idle = self._idle, []
        for wake in idle:
            wake.release()
        self._stop_timer()
