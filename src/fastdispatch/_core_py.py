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
- ``_run_lock`` (the timer's lock): everything the timer thread looks at —
  the registry of running tasks (the deadline schedule), the wake-up
  schedule of parked chats, the rate-limit windows, the line of chats
  waiting for the global limit, the global pause, and the timer thread's
  sleep state.
- ``_count_lock``: the counters (the C twin uses atomic integers instead).

The only nesting is ``_map_lock`` inside a queue lock (when the last chat
leaves the map); nothing takes them the other way round, so there is no lock
order to get wrong.
"""

import heapq
import logging
import operator
import sys
import threading
from collections import OrderedDict, deque
from concurrent.futures._base import CANCELLED as _CANCELLED
from time import monotonic

from ._errors import (
    Cancelled, DispatcherClosed, QueueFull, RetryAfter, SendTimeout, TaskDiscarded)
from ._errors import _safe_repr
from ._types import DispatchInfo, Future
from .pacing import RateLimit

__all__ = ["RingBuffer", "ChatQueue", "SendContext", "DispatcherCore"]

logger = logging.getLogger("fastdispatch")

_allocate_lock = threading.Lock
_NOT_CANCELLED, _BY_TIMEOUT, _BY_FORCE = 0, 1, 2
# The timer thread's state: awake, asleep until the registry head's deadline,
# or asleep with nothing to wait for (a task start must wake it).
_AWAKE, _UNTIL_DEADLINE, _IDLE = 0, 1, 2
# What _call_searcher_locked returns when a new worker thread must start.
_SPAWN = object()
# What _run returns: the task ended, it panicked, or it will run again.
_DONE, _PANICKED, _RETRYING, _FORCED = 0, 1, 2, 3
# What _next_paced returns besides a task: parked, or look again.
_PARKED, _AGAIN = object(), object()
_INF = float("inf")
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

    __slots__ = ("chat_id", "lock", "running", "_key", "_removed", "retry_item",
                 "not_before", "granted", "waited", "window")

    def __init__(self, chat_id, capacity):
        RingBuffer.__init__(self, capacity)
        self.chat_id = chat_id
        self._key = chat_id  # the chat map's key (see _chat_key)
        self._removed = False  # out of the chat map for good (under lock)
        self.lock = _allocate_lock()
        # True from the moment the chat is scheduled until its worker removes
        # the queue from the chat map; at most one worker owns it meanwhile
        # (a parked chat stays owned: it is on the timer's schedule).
        self.running = False
        # A task that will run again: it goes before every waiting task and
        # does not count against the capacity (it was accepted once).
        # Guarded by ``lock``.
        self.retry_item = None
        # The pacing fields below belong to whoever owns the chat (its
        # worker, or the timer while it is parked); _run_lock when shared.
        self.not_before = 0.0    # monotonic time before which it may not start
        self.granted = False     # holds a start granted by the global line
        self.waited = False      # its next start had to wait for a limit
        self.window = None       # its rate-limit window, while alive


class _Window:
    """The last ``count`` start times of one rate limit (a sliding window).

    A start is allowed at ``t`` when fewer than ``count`` starts fall in
    ``(t - per, t]``: the window holds at most ``count`` stamps, so that is
    ``len < count or stamps[0] <= t - per``.  Guarded by ``_run_lock``.
    """

    __slots__ = ("count", "per", "stamps", "dead", "key", "expiry", "entries")

    def __init__(self, limit, key=None):
        self.key = key
        self.expiry = None      # the timer's deque of windows of this period
        self.entries = 0        # how many times this window is in it
        if limit is None:
            # A chat without a limit: remembered only so that ``limit_for``
            # is not asked again at every start.
            self.count, self.per = 0, 1.0
        else:
            self.count, self.per = limit.count, limit.per
        self.stamps = deque(maxlen=max(1, self.count))
        self.dead = False

    def next_start(self, granted=0):
        """Earliest time at which ``granted + 1`` more starts are allowed."""
        count = self.count
        if not count:
            return 0.0
        stamps = self.stamps
        m = len(stamps) - count + granted + 1
        if m <= 0:
            return 0.0
        if m > len(stamps):
            return _INF  # more grants than the limit: never (not reached)
        return stamps[m - 1] + self.per

    def last(self):
        return self.stamps[-1] if self.stamps else 0.0

    def add(self, t):
        self.stamps.append(t)


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


def _take_head_locked(q):
    # With q.lock held: the chat's next task (a retried one first, then the
    # oldest waiting), or None when it has none.
    item = q.retry_item
    if item is not None:
        q.retry_item = None
    elif q._items:
        item = q._items.popleft()
    else:
        return None
    item._queue_len = len(q._items)
    return item


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
        self._timer_until = _INF      # when the sleeping timer wakes by itself
        # Pacing and retries; all guarded by _run_lock (the timer's lock).
        self._forced = False          # force_close() ran: nothing starts any more
        self._pause_until = 0.0       # a global RetryAfter: no start before this
        self._wakeups = []            # heap of (time, seq, ChatQueue): parked chats
        self._wakeup_seq = 0
        self._line = deque()          # chats waiting their turn under the global limit
        self._granted = 0             # starts granted from the line, not yet taken
        self._global_window = None    # _Window of the global limit, or None
        self._windows = {}            # chat key -> _Window (outlives the chat's queue)
        self._expiry = {}             # per -> deque of _Window, by last start
        self._count_lock = _allocate_lock()
        self._pending = 0
        self._drain_waiters = 0
        self._inflight = 0
        self._submitted = self._completed = self._failed = 0
        self._rejected = self._discarded = self._cancelled = self._timed_out = 0
        self._retried = 0             # under _count_lock
        self._paced = self._parked = 0  # under _run_lock

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
        self._retry = retry
        self._retry_on = retry.retry_on if retry is not None else ()
        self._max_attempts = retry.max_attempts if retry is not None else 1
        self._max_retry_after = retry.max_retry_after if retry is not None else 0.0
        self._global_window = None
        self._chat_limit = self._limit_for = None
        self._chat_limits = False
        if pacing is not None:
            if pacing.global_limit is not None:
                self._global_window = _Window(pacing.global_limit)
            self._chat_limit = pacing.chat_limit
            self._limit_for = pacing.limit_for
            self._chat_limits = pacing.chat_limit is not None or pacing.limit_for is not None
        # Whether every start must ask the limiter (else only a chat with a
        # pending retry delay or during a global pause does).
        self._limited = self._global_window is not None or self._chat_limits

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
        with self._run_lock:
            paced, parked = self._paced, self._parked
        with self._count_lock:
            return (self._submitted, self._completed, self._failed, self._rejected,
                    self._discarded, self._cancelled, self._timed_out,
                    len(self._queues), self._inflight, self._threads,
                    self._retried, paced, parked)

    def _pacing_state(self):
        """Sizes of the limiter's structures (for tests and debugging)."""
        with self._run_lock:
            return {"windows": len(self._windows),
                    "expiry": sum(len(e) for e in self._expiry.values()),
                    "wakeups": len(self._wakeups), "line": len(self._line),
                    "granted": self._granted, "parked": self._parked}

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
            if self._limited or q.not_before or self._pause_until:
                item = self._next_paced(q)
                if item is _PARKED:
                    return
                if item is _AGAIN:
                    continue
            else:
                with q.lock:
                    item = _take_head_locked(q)
                    if item is None:
                        # Invariant 4: the empty queue leaves the map while
                        # its lock is held, so a submitter's re-check cannot
                        # miss it.
                        q.running = False
                        self._remove_locked(q)
            if item is None:
                break
            ran = self._run(item, q)
            if ran == _PANICKED:
                return  # the task panicked; its chat is gone
            if ran == _DONE and self._ready and q._items:
                # Other chats wait for a worker: go to the back of the line
                # so that a busy chat cannot starve quiet ones.
                with self._pool_lock:
                    self._ready.append(q)
                return
        if q.granted:
            self._return_grant(q)
        self._maybe_drained()

    # ------------------------------------------------------------------ pacing

    def _next_paced(self, q):
        # The chat's next task if pacing lets it start now; _PARKED if the
        # chat was parked (the timer will hand it back: no worker sleeps
        # for a limit); _AGAIN to look again; None once the chat is empty
        # and removed.
        window = q.window
        failed = False
        if self._chat_limits and (window is None or window.dead):
            try:
                window = q.window = self._chat_window(q)
            except BaseException as exc:
                # limit_for, or the chat id's __hash__/__eq__, failed: the
                # task it was asked for fails with that error.
                if self._refuse_head(q, exc):
                    return _AGAIN
                window, failed = None, True
        with q.lock:
            if q.retry_item is None and not q._items:
                q.running = False
                self._remove_locked(q)
                return None
            if failed:
                return _AGAIN  # a task arrived meanwhile: judge it again
            admitted = self._admit_locked(q, window)
            if admitted is not True:
                return _AGAIN if admitted is None else _PARKED
            return _take_head_locked(q)

    def _admit_locked(self, q, window):
        """May ``q`` start its next task now?  Else park it.

        With ``q.lock`` held, by the chat's owner.  Returns True (start,
        and the start is recorded), False (parked) or None (the chat's
        window was forgotten meanwhile: fetch it again).  The checks and
        the recording are one step under _run_lock, so that no two starts
        can both take the last place in a window.
        """
        with self._run_lock:
            if self._forced:
                return True  # _run settles it as cancelled
            if window is not None and window.dead:
                q.window = None
                return None
            now = monotonic()
            # Time rules first: a retry delay, a global pause, the chat's
            # own window.  A chat that must wait for them waits alone.
            until = q.not_before
            if self._pause_until:
                if self._pause_until <= now:
                    self._pause_until = 0.0  # over: back to the fast path
                elif self._pause_until > until:
                    until = self._pause_until
            if window is not None and window.count:
                t = window.next_start()
                if t > until:
                    until = t
                    if t > now:
                        q.waited = True
            if until > now:
                if q.granted:
                    # Hand the granted start back to the line.
                    q.granted = False
                    self._granted -= 1
                    self._timer_needed_locked(now)
                self._park_locked(q, until)
                return False
            q.not_before = 0.0
            # Then the global limit: chats take turns in one line.
            glob = self._global_window
            if glob is not None:
                if q.granted:
                    q.granted = False
                    self._granted -= 1
                elif self._line or glob.next_start(self._granted) > now:
                    q.waited = True
                    self._line.append(q)
                    self._parked += 1
                    self._timer_needed_locked(glob.next_start(self._granted))
                    return False
                glob.stamps.append(now)
            if window is not None:
                self._record_locked(window, now)
            if q.waited:
                q.waited = False
                self._paced += 1
        return True

    def _chat_window(self, q):
        # The chat's live window, made on first use (limit_for runs here,
        # outside every lock).  A window outlives the chat's queue until
        # its last start leaves it; the timer then forgets it.  Keyed like
        # the chat map (a hash taken once, an __eq__ that cannot raise), by
        # a key of its own: the queue's key stops equalling others once the
        # queue leaves the map.
        chat_id = q.chat_id
        key = q._key
        if type(key) is _ChatKey:
            key = _ChatKey(chat_id, key._hash)
        window = self._windows.get(key)
        if window is not None and not window.dead:
            return window
        limit = self._chat_limit
        if self._limit_for is not None:
            try:
                own = self._limit_for(chat_id)
            except Exception as exc:
                raise TypeError("limit_for(%s) raised %s" % (
                    _safe_repr(chat_id), type(exc).__name__)) from exc
            if own is not None:
                if not isinstance(own, RateLimit):
                    raise TypeError("limit_for(%s) must return a RateLimit or None, got %r"
                                    % (_safe_repr(chat_id), type(own).__name__))
                limit = own
        fresh = _Window(limit, key)
        with self._run_lock:
            window = self._windows.get(key)
            if window is None or window.dead:
                expiry = self._expiry.get(fresh.per)
                if expiry is None:
                    expiry = self._expiry[fresh.per] = deque()
                fresh.expiry = expiry
                self._windows[key] = window = fresh
        return window

    def _record_locked(self, window, now):
        # A chat's start: into its window, and onto the timer's list of
        # windows to forget once their last start has left them.
        window.stamps.append(now)
        expiry = window.expiry
        if not expiry:
            self._timer_needed_locked(now + window.per)
        expiry.append(window)
        window.entries += 1

    def _park_locked(self, q, until):
        # Put an owned chat on the wake-up schedule (with _run_lock held).
        self._wakeup_seq += 1
        heapq.heappush(self._wakeups, (until, self._wakeup_seq, q))
        self._parked += 1
        self._timer_needed_locked(until)

    def _return_grant(self, q):
        with self._run_lock:
            if q.granted and not self._forced:  # force_close() reset the line
                q.granted = False
                self._granted -= 1
                if self._line:
                    self._timer_needed_locked(0.0)

    def _refuse_head(self, q, exc):
        # The limiter could not judge this chat (limit_for or the chat id's
        # __hash__/__eq__ failed): its next task fails with that error, the
        # chat goes on with the one after.
        with q.lock:
            item = _take_head_locked(q)
        if item is None:
            return False
        logger.error("chat %s: cannot apply pacing", _safe_repr(q.chat_id), exc_info=exc)
        if not isinstance(exc, Exception):
            exc = TypeError("pacing failed: %r" % (exc,))
        if item._attempt > 1:
            self._settle_started(item, exc, "failed")
        else:
            self._finish(item, exc, "failed")
            self._maybe_drained()
        return True

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
        """Run one attempt of a task: _DONE, _PANICKED or _RETRYING."""
        future = item._future
        if self._forced:
            # Popped just before force_close() cleared the queue: dropped as
            # a waiting task is (its Future cancelled).  _register re-checks.
            if item._attempt == 1:
                self._finish(item, Cancelled("the dispatcher was force-closed"), "cancelled")
                self._maybe_drained()
            else:
                self._settle_started(item, Cancelled("the dispatcher was force-closed"),
                                     "cancelled")
            return _DONE
        if (item._attempt == 1 and future is not None
                and not future.set_running_or_notify_cancel()):
            self._finish(item, Cancelled("cancelled before it started"), "cancelled")
            return _DONE
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
            # force_close() ran since this task left its queue: it never starts.
            self._settle_started(item, Cancelled("the dispatcher was force-closed"),
                                 "cancelled")
            return _DONE
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
                verdict = self._retry_later(item, q, error)
                if verdict == _RETRYING:
                    return _RETRYING
                if verdict == _FORCED:
                    self._resolve(item, None, Cancelled("the dispatcher was force-closed"),
                                  "cancelled")
                else:
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
        return _PANICKED if panic is not None else _DONE

    def _retry_later(self, item, q, error):
        # SPEC §5: a RetryAfter, or a retry_on error, runs the same task
        # again ahead of every later task of its chat.  Return _RETRYING,
        # _DONE when it is not retried (it fails with ``error``), or
        # _FORCED when force_close() came first.
        if isinstance(error, RetryAfter):
            delay = error.seconds
            if delay > self._max_retry_after:
                return _DONE
        elif self._retry_on and isinstance(error, self._retry_on):
            delay = self._retry.backoff_delay(item._attempt)
        else:
            return _DONE
        attempt = item._attempt
        if attempt >= self._max_attempts:
            return _DONE
        until = monotonic() + delay
        with q.lock:
            # Checked under the queue's lock: force_close() clears the
            # queues under it after setting _forced, so either it sees this
            # retry item or we see _forced.
            if self._forced:
                return _FORCED
            item._attempt = attempt + 1
            item._deadline = None
            q.retry_item = item
        with self._run_lock:
            if until > q.not_before:
                q.not_before = until
            if isinstance(error, RetryAfter) and error.scope == "global":
                if until > self._pause_until:
                    self._pause_until = until
        with self._count_lock:
            self._retried += 1
        if self._on_retry is not None:
            try:
                self._on_retry(item.chat_id, attempt, delay, error)
            except BaseException as exc:
                self._hook_failed("on_retry", exc)
        return _RETRYING

    def _settle_started(self, item, error, outcome):
        # Resolve a task whose Future is already RUNNING but that will not
        # run (again): force_close() came first.
        self._resolve(item, None, error, outcome)
        item._fn = None
        with self._count_lock:
            self._pending -= 1
        self._maybe_drained()

    def _resolve(self, item, result, error, outcome):
        # Only the owner of the outcome touches (and then drops) the Future.
        # Counted first: whoever sees the Future done sees it counted.
        future = item._future
        item._future = None
        self._count(outcome)
        if future is not None:
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
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
        # Enter a starting task in the running registry; False, registering
        # nothing, once force_close() has begun (then the task must not start).
        with self._run_lock:
            if self._forced:
                return False
            self._running[item] = None
            if item._deadline is not None:
                self._timer_needed_locked(item._deadline)
        return True

    def _refuse_new_starts(self):
        # force_close(), before it cancels what runs: from now on _register
        # refuses, so no task starts after force_close() returned.
        with self._run_lock:
            self._forced = True

    def _unregister(self, item):
        with self._run_lock:
            return self._running.pop(item, 0) is None

    def _timer_needed_locked(self, when):
        # With _run_lock held: make sure the timer looks at its schedules no
        # later than ``when`` (starting it on first use, waking it if it
        # sleeps past that).
        if not self._timer_started:
            self._timer_started = True
            try:
                self._start_timer()
            except BaseException:
                # The OS refused a thread: the next caller tries again.
                self._timer_started = False
                logger.exception("could not start the timer thread")
        elif when < self._timer_until:
            self._wake_timer_locked()

    def _wake_timer_locked(self):
        # Release the timer's wake lock once per sleep (with _run_lock held):
        # the state flag makes sure we never release it twice.
        if self._timer_state != _AWAKE:
            self._timer_state = _AWAKE
            self._timer_until = _INF
            self._timer_wake.release()

    def _timer_main(self):
        """Body of the timer thread: deadlines, parked chats, the global line.

        Deadlines: the registry is ordered by start time and every task gets
        the same send_timeout, so it is also ordered by deadline: the timer
        only ever looks at its head.  Parked chats: a heap by wake-up time;
        a chat whose time came goes back to the ready list.  The global
        line: as places free up in the global window, the chats at the
        front get a start each, in turn.  Windows whose last start has left
        them are forgotten.  The timer sleeps until the earliest of these,
        or until woken by something earlier; after idle_timeout seconds
        with nothing to watch, it ends (the next need starts a new one), so
        that a dispatcher dropped without shutdown() is not kept alive by it.
        """
        running = self._running
        while True:
            expired = []
            ready = []
            with self._run_lock:
                if self._timer_stop:
                    return
                now = monotonic()
                until = _INF
                if self._send_timeout is not None:
                    for item in running:
                        if item._deadline > now:
                            until = item._deadline
                            break
                        expired.append(item)
                    for item in expired:
                        del running[item]
                        item._error = SendTimeout()  # see _expired_error
                if not expired:
                    until = min(until, self._pacing_tick_locked(now, ready))
                    if not ready:
                        # About to sleep (only then: a waker releases the
                        # wake lock once per sleep, as the state says).
                        self._timer_until = until
                        self._timer_state = _IDLE if until == _INF else _UNTIL_DEADLINE
            for item in expired:
                self._expire(item, _BY_TIMEOUT)
            for q in ready:
                self._schedule(q)
            if expired or ready:
                continue
            woken = self._timer_wake.acquire(
                True, self._idle_timeout if until == _INF else max(0.0, until - monotonic()))
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
                        self._timer_until = _INF
                        continue
                # Woken just after the timeout: consume that release.
                self._timer_wake.acquire()

    def _pacing_tick_locked(self, now, ready):
        # With _run_lock held: move parked chats whose time came to
        # ``ready``, grant starts from the global line, forget stale
        # windows.  Return when to look again.
        until = _INF
        wakeups = self._wakeups
        while wakeups:
            if wakeups[0][0] > now:
                until = wakeups[0][0]
                break
            ready.append(heapq.heappop(wakeups)[2])
            self._parked -= 1
        line = self._line
        if line:
            if self._pause_until > now:
                until = min(until, self._pause_until)
            else:
                glob = self._global_window
                while line and glob.next_start(self._granted) <= now:
                    q = line.popleft()
                    q.granted = True
                    self._granted += 1
                    self._parked -= 1
                    ready.append(q)
                if line:
                    until = min(until, glob.next_start(self._granted))
        for per, expiry in self._expiry.items():
            # One entry per start, in start order; an entry is stale when
            # its window has later ones (it started again since).
            while expiry:
                window = expiry[0]
                if window.entries == 1:
                    t = window.last() + per
                    if t > now:
                        until = min(until, t)
                        break
                    self._forget_window_locked(window)
                window.entries -= 1
                expiry.popleft()
        return until

    def _forget_window_locked(self, window):
        # Its last start left the window: the chat's limit no longer
        # constrains anything, so the window goes (a chat's next start makes
        # a new one).  The chat id's __hash__/__eq__ run here: whatever they
        # do, the timer goes on (the entry is then simply kept).
        window.dead = True
        try:
            if self._windows.get(window.key) is window:
                del self._windows[window.key]
                if not self._windows:
                    # A dict keeps its largest table after deletions: give
                    # back the memory of a burst of chats.
                    self._windows.clear()
        except BaseException:
            logger.exception("could not forget the rate-limit window of a chat")

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
        self._count(outcome)
        if future is not None:
            future.set_exception(error)
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
        """force_close(): cancel running, retrying, parked and waiting tasks."""
        self._closed = True
        with self._run_lock:
            self._forced = True
            running = list(self._running)
            self._running.clear()
            for item in running:
                item._error = Cancelled("the dispatcher was force-closed")
            parked = [entry[2] for entry in self._wakeups]
            parked.extend(self._line)
            self._wakeups = []
            self._line.clear()
            self._parked = self._granted = 0
            self._pause_until = 0.0
        for item in running:
            self._expire(item, _BY_FORCE)
        for q in list(self._queues.values()):
            with q.lock:
                retrying, q.retry_item = q.retry_item, None
                waiting = q.clear()
            if retrying is not None:
                self._settle_started(retrying, Cancelled("the dispatcher was force-closed"),
                                     "cancelled")
            for item in waiting:
                self._finish(item, Cancelled("the dispatcher was force-closed"),
                             "cancelled")
        # Parked chats are owned by nobody but the timer's schedule, which
        # is now empty: hand them to workers, which find them empty and
        # remove them.
        for q in parked:
            q.not_before = 0.0
            q.granted = False
            self._schedule(q)
        self._maybe_drained()

    def _stop_workers(self):
        """Wake every idle worker so that it exits; stop the timer."""
        with self._pool_lock:
            self._stopping = True
            idle, self._idle = self._idle, []
        for wake in idle:
            wake.release()
        self._stop_timer()
