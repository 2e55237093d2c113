"""Pure-Python implementation of the dispatcher core.

This module is the twin of ``_ringbuf.pyx``: same classes, same behaviour,
same locking protocol, line for line where it matters.  It is used when the
extension is missing or ``FASTDISPATCH_NO_EXTENSIONS=1`` is set, and the test
suite runs every behaviour test against both.  The design is explained once,
in ``docs/dispatcher.md``; the comments here only mark where each invariant
of docs/guarantees.md (G1-G6) is kept.

Locks, and what each protects:

- ``ChatQueue.lock``: the queue's items and its ``running`` flag, and the
  removal of the queue from the chat map (G5, docs/guarantees.md).
- ``_map_lock``: inserting a new queue into the chat map (and the most
  chats it held since its last reset), against resetting the map when its
  last chat leaves (the compiled core, on free-threaded
  CPython, cuts the map in parts, each with such a lock: the same protocol
  per part).
- ``_pool_lock``: the ready list (chats that have work but no worker), the
  idle-worker stack and the thread count.
- ``_run_lock`` (the timer's lock): the registry of running tasks (the
  deadline schedule), ``_forced``, and the timer thread's sleep state.
- ``_Limiter.lock``: all of pacing (windows, the global line and pause,
  the budgets learned from ``sc.report_limit``, the wake-up schedule of
  parked chats); its class says more.
- ``_count_lock``: the counters (the C twin uses atomic integers instead).
- ``_wait_lock``: which running tasks wait for room in another chat
  (``ChatQueue.blocked_on``, ``_task_waiting``), read to refuse a wait that
  could never end (see ``_add_waiter_locked``).

Nesting: a queue lock is held around ``_map_lock`` (when the last chat
leaves the map), around ``_wait_lock`` and ``_count_lock`` (a caller
starting to wait for room) and around the limiter's lock (admitting a start); the
limiter's lock is held around the timer's (to wake it).  Nothing takes them
the other way round, and the timer thread takes each alone.
"""

import contextvars
import functools
import heapq
import inspect
import logging
import operator
import sys
import threading
import weakref
from collections import OrderedDict, deque
from concurrent.futures._base import CANCELLED as _CANCELLED
from concurrent.futures._base import CANCELLED_AND_NOTIFIED as _CANCELLED_AND_NOTIFIED
from concurrent.futures._base import PENDING as _PENDING
from time import monotonic

from ._errors import (
    Cancelled, DispatcherClosed, QueueFull, RetryAfter, SendTimeout, TaskDiscarded)
from ._errors import _no_room, _safe_repr, _task_call_error, _wait_ended
from ._types import DispatchInfo, Future, _checked_wait
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
# What _start_async returns when the task's awaitable now runs on its loop.
_ASYNC = 4
# How often the timer looks at event loops that hold work of this
# dispatcher: a chat handed to a loop that stopped before it took the chat
# is taken back (its task never starts there); the coroutine tasks of a
# closed loop are ended (they can never end there).
_HANDOFF_CHECK = 0.1
_LOOP_CHECK = 0.5
# The chat map is reset when it empties only if it held more chats than
# this since its last reset (see _remove_locked; FD_KEEP_CHATS in the C twin).
_KEEP_CHATS = 32
# Where a chat's next task runs when it is not an event loop's.
_WORKERS = object()
# asyncio, imported by the first asubmit() (a thread-only program never
# pays for it).
_asyncio = None
# What _next_paced returns besides a task: parked, or look again.
_PARKED, _AGAIN = object(), object()
# ... or: the chat's next task runs elsewhere (ChatQueue.elsewhere says where).
_ELSEWHERE = object()
_INF = float("inf")
_TIMEOUT_MAX = threading.TIMEOUT_MAX
# The largest learned budget kept: more than any platform announces.
_MAX_REMAINING = 1 << 62
# Guards the lazy creation of SendContext events (rare: only for wait()).
_event_lock = threading.Lock()
# The coroutine task whose code runs in this context (set in the task's own
# context when it starts; see DispatcherCore.running_chat).
_current_task = contextvars.ContextVar("fastdispatch_current_task", default=None)
# A caller waiting for room (_Waiter.state): still waiting, let in (its task
# is in the chat's queue), woken by close(), or gone (timed out, cancelled).
_W_WAITING, _W_ADMITTED, _W_CLOSED, _W_GONE = 0, 1, 2, 3
# Why a caller that asked to wait may not (_add_waiter_locked; _errors._no_room
# says it with the same codes).
_NO_ROOM_MAX, _NO_ROOM_SELF, _NO_ROOM_SLOTS, _NO_ROOM_CYCLE, _NO_ROOM_LOOP = 1, 2, 3, 4, 5
# What a waiting asubmit's wake-up Future holds when its timeout passed.
_TIMED_OUT = object()


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
                 "not_before", "granted", "waited", "window", "reserved",
                 "stamped", "last_start", "elsewhere", "core_ref", "lkey", "lres",
                 "waiters", "woken", "blocked_on", "slot_held")

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
        # worker, or the timer while it is parked); the limiter's lock when
        # shared.
        self.not_before = 0.0    # monotonic time before which it may not start
        self.granted = False     # holds a start granted by the global line
        self.waited = False      # its next start had to wait for a limit
        self.window = None       # its rate-limit window, while alive
        # The start admitted but not yet made (see _Limiter): which windows
        # hold a place for it (_CHAT | _GLOBAL).
        self.reserved = 0
        self.stamped = None      # the chat window its last start went into
        self.last_start = 0.0    # ... and when
        # Where its next task must run when that is not here (an event
        # loop, or _WORKERS): set by the owner for itself.
        self.elsewhere = None
        # A weak reference to the core whose limiter its tasks report
        # learned limits to (set by the core when it makes the queue; None
        # for a queue built by hand): a SendContext kept after its
        # dispatcher is gone must not keep it alive.  Then the key of its
        # learned budgets (made on first use) and the learned budgets that
        # hold a place for its admitted start (both under the limiter's lock).
        self.core_ref = None
        self.lkey = None
        self.lres = None
        # Callers waiting for room (block=True), oldest first, or None: while
        # there are any the ring is full (a task leaving it lets the oldest
        # waiter's task in, in the same critical section), so a call that
        # does not wait finds no room either.  ``woken``: the waiters let in
        # or turned away under the lock, to wake once it is released.
        # Guarded by ``lock``.
        self.waiters = None
        self.woken = None
        # The chats this chat's running task waits for room in (a list;
        # under the core's _wait_lock), or None.
        self.blocked_on = None
        # Its owner goes on with it holding the max_inflight slot of the
        # coroutine task that just ended (see DispatcherCore._aio_done).
        self.slot_held = False


class _Window:
    """The last ``count`` start times of one rate limit (a sliding window).

    A start is allowed at ``t`` when fewer than ``count`` starts fall in
    ``(t - per, t]``.  Besides the stamps of starts made, it counts
    ``pending`` starts: admitted, not yet made (the task is about to be
    called).  Their time is not known yet, so they count as inside every
    window until they are stamped (``commit``) or given back (``release``).
    The window keeps the ``count + 1`` newest stamps, oldest first.
    Guarded by the limiter's lock.
    """

    __slots__ = ("count", "per", "stamps", "pending", "dead", "key", "entries", "born")

    def __init__(self, limit, key=None):
        self.key = key
        self.entries = 0        # how many times this window is on the expiry list
        if limit is None:
            # A chat without a limit: remembered only so that ``limit_for``
            # is not asked again at every start.
            self.count, self.per = 0, 1.0
        else:
            self.count, self.per = limit.count, limit.per
        # One stamp more than the limit needs: after pop_newest the window
        # still knows the ``count`` newest starts made before it.
        self.stamps = deque(maxlen=self.count + 1)
        self.pending = 0
        self.dead = False
        self.born = 0.0         # when the limiter made it (its "last start" until one)

    def next_start(self, granted=0):
        """Earliest time at which ``granted + 1`` more starts are allowed.

        Infinite when the pending starts alone fill the window: the next
        start then waits for one of them to be made (which wakes the timer).
        """
        count = self.count
        if not count:
            return 0.0
        stamps = self.stamps
        m = len(stamps) + self.pending - count + granted + 1
        if m <= 0:
            return 0.0
        if m > len(stamps):
            return _INF
        return stamps[m - 1] + self.per

    def last(self):
        return self.stamps[-1] if self.stamps else self.born

    def add(self, t):
        self.stamps.append(t)

    def reserve(self):
        self.pending += 1

    def commit(self, t):
        """A reserved start was made at ``t`` (no earlier than any stamp)."""
        self.pending -= 1
        self.stamps.append(t)

    def release(self):
        """A reserved start will not be made."""
        self.pending -= 1

    def pop_newest(self):
        """Forget the newest stamp (a start the platform refused)."""
        if self.stamps:
            self.stamps.pop()


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
        "_error", "_loop", "_aio", "_queue", "_chatq", "_ctx",
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
        # A coroutine task (asubmit): the event loop it runs on, the asyncio
        # Task of the awaitable it returned, and its chat while that runs
        # (None once its end was claimed: see DispatcherCore._claim); all
        # None for a thread task.
        self._loop = self._aio = self._queue = self._ctx = None
        # The chat queue of the running attempt (set at its start), through
        # which report_limit reaches the limiter; None outside a dispatcher.
        self._chatq = None

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
        return self._t_start or None

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
        remaining, reset_after, bucket, is_global = _checked_report(
            remaining, reset_after, bucket, scope)
        q = self._chatq
        if q is not None and q.core_ref is not None:
            core = q.core_ref()
            if core is not None:
                core._limiter.learn(q, remaining, reset_after, bucket, is_global)

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


def _new_item(chat_id, fn, future, t_queued, loop=None, ctx=None):
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
    item._loop = loop
    item._ctx = ctx
    item._aio = item._queue = item._chatq = None
    return item


class _Waiter:
    """A caller waiting for room in a full chat (``block=True``).

    ``wake`` is a held lock that the waker releases (a thread), or a Future
    of the caller's event loop (an ``asubmit``).  ``holder`` is the chat
    queue of the running task the caller waits inside, if any.
    """

    __slots__ = ("item", "q", "loop", "wake", "state", "queue_len", "holder")

    def __init__(self, item, q, loop, holder):
        self.item = item
        self.q = q
        self.loop = loop
        if loop is None:
            self.wake = _allocate_lock()
            self.wake.acquire()
        else:
            self.wake = loop.create_future()
        self.state = _W_WAITING
        self.queue_len = 0
        self.holder = holder


def _admit_locked(q):
    # With q.lock held, a task just left the ring: the oldest waiter's task
    # takes its place (so the ring stays full while anyone waits, and
    # nobody jumps the line).
    waiters = q.waiters
    w = waiters.popleft()
    if not waiters:
        q.waiters = None
    q._items.append(w.item)
    w.state = _W_ADMITTED
    w.queue_len = len(q._items)
    if q.woken is None:
        q.woken = [w]
    else:
        q.woken.append(w)


def _call_in_context(item):
    # In the task's own context (see _start_async): mark it as the running
    # task there, then call it.
    _current_task.set(item)
    return item._fn(item)


def _checked_report(remaining, reset_after, bucket, scope):
    # The values of a report_limit call, checked and made plain
    # (an int or float subclass is read as the exact int or float it holds,
    # a str subclass as its exact str: nothing user-defined runs past this
    # point, nor in the limiter's lock or on the timer).  Raises in the task.
    if type(remaining) is not int:
        if isinstance(remaining, bool) or not isinstance(remaining, int):
            raise TypeError("report_limit: remaining must be an int, got %s"
                            % (type(remaining).__name__,))
        remaining = int.__int__(remaining)
    if remaining < 0:
        raise ValueError("report_limit: remaining must be >= 0, got %d" % (remaining,))
    if remaining > _MAX_REMAINING:
        remaining = _MAX_REMAINING  # as the compiled core, which keeps a C integer
    if type(reset_after) is float:
        delay = reset_after
    elif type(reset_after) is int or (isinstance(reset_after, int)
                                      and not isinstance(reset_after, bool)):
        try:
            delay = int.__float__(reset_after)
        except OverflowError:
            delay = _INF
    elif isinstance(reset_after, float):
        delay = float.__float__(reset_after)
    else:
        raise TypeError("report_limit: reset_after must be a number of seconds, got %s"
                        % (type(reset_after).__name__,))
    if delay != delay or delay < 0 or delay > _TIMEOUT_MAX:
        raise ValueError("report_limit: reset_after must be >= 0 and at most "
                         "threading.TIMEOUT_MAX (%r), got %r" % (_TIMEOUT_MAX, delay))
    if bucket is not None:
        if type(bucket) is not str:
            if not isinstance(bucket, str):
                raise TypeError("report_limit: bucket must be a str or None, got %s"
                                % (type(bucket).__name__,))
            bucket = str.__str__(bucket)
        if not bucket:
            raise ValueError("report_limit: bucket must not be empty")
    if type(scope) is not str:
        if not isinstance(scope, str):
            raise TypeError("report_limit: scope must be 'chat' or 'global', got %s"
                            % (type(scope).__name__,))
        scope = str.__str__(scope)
    if scope == "chat":
        is_global = False
    elif scope == "global":
        is_global = True
    else:
        raise ValueError("report_limit: scope must be 'chat' or 'global', got %r" % (scope,))
    return remaining, delay, bucket, is_global


def _awaitable_error(item, result):
    # A thread task that returned a coroutine (or another awaitable) did not
    # do its work: nothing awaits it on a worker thread.  Close a coroutine
    # (no "never awaited" warning) and fail the task saying what to use.
    close = getattr(result, "close", None)
    if inspect.iscoroutine(result) and close is not None:
        try:
            close()
        except BaseException:
            pass
    return TypeError(
        "the task for chat %s returned %s, which a worker thread cannot await: "
        "give coroutine tasks to `await dispatcher.asubmit(chat_id, task)`, which "
        "runs them on the caller's event loop" % (
            _safe_repr(item.chat_id), _safe_repr(type(result).__name__)))


def _aio_set(future, result, error):
    # On the future's own loop: resolve it, unless it is already done (the
    # caller cancelled its await).
    if not future.done():
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


def _on_loop(loop, fn, *args):
    """Run ``fn(*args)`` on ``loop``: now when this is its thread, else at
    its next turn.  False when the loop is closed (nothing can run there)."""
    if _asyncio._get_running_loop() is loop:
        fn(*args)
        return True
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed
        return False
    return True


def _cancel_aio(item):
    # On the loop: cancel the awaitable a coroutine task is running, if any.
    aio = item._aio
    if aio is not None:
        aio.cancel()


def _head(q):
    # With q.lock held: the chat's next task, left in place.
    if q.retry_item is not None:
        return q.retry_item
    return q._items[0] if q._items else None


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


def _learned_key(q):
    # The key of a chat's learned budgets: like a window's, one that keeps
    # equalling the chat's other keys after its queue left the chat map.
    key = q._key
    if type(key) is _ChatKey:
        key = _ChatKey(q.chat_id, key._hash)
    return key


def _take_head_locked(q):
    # With q.lock held: the chat's next task (a retried one first, then the
    # oldest waiting), or None when it has none.
    item = q.retry_item
    if item is not None:
        q.retry_item = None
    elif q._items:
        item = q._items.popleft()
        if q.waiters is not None:
            _admit_locked(q)
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



def _start_future(future):
    """``future.set_running_or_notify_cancel()``: False if it was cancelled.

    The caller holds the Future too and may have moved it on itself
    (``set_running_or_notify_cancel()``, ``set_result()``): only a
    cancellation skips the task; anything else leaves it to run (whatever
    it returns is then dropped).
    """
    state = future._state
    if state == _CANCELLED_AND_NOTIFIED:
        return False
    if state == _PENDING or state == _CANCELLED:
        try:
            return future.set_running_or_notify_cancel()
        except RuntimeError:  # moved on by the caller meanwhile
            return not future.cancelled()
    return True


def _finish_future(future, result, error):
    """``set_result(result)``, or ``set_exception(error)`` if it is not None.

    A Future the caller already resolved (or cancelled) keeps what it has:
    the worker, the timer thread and the chat go on.
    """
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except Exception:  # InvalidStateError
        pass


def _notify_cancelled(future):
    # concurrent.futures.wait() and as_completed() see a cancelled Future
    # only once set_running_or_notify_cancel() has moved it on to
    # CANCELLED_AND_NOTIFIED, as an executor does for each one it drops.
    # The worker does that for a task it pops; this is for the others.
    if future._state == _CANCELLED:
        future.set_running_or_notify_cancel()


# Which windows hold a place for a chat's admitted start (ChatQueue.reserved):
# its own window, the global one, learned budgets (ChatQueue.lres says which).
_CHAT, _GLOBAL, _LEARNED = 1, 2, 4
# What a learned budget covers (_Bucket.kind).
_B_CHAT, _B_SHARED, _B_GLOBAL = 0, 1, 2


class _Bucket:
    """A budget the platform announced (``sc.report_limit``): at most
    ``remaining`` more starts before ``reset`` (a monotonic time).

    ``pending`` counts starts admitted against it, not made yet (as in
    ``_Window``); ``commit`` spends one of ``remaining``.  Once ``reset``
    has passed it no longer applies, and the timer forgets it
    (``dead``): ``heap_at`` is the time of its one entry on the limiter's
    forget schedule (None while it has none).  A shared bucket knows the
    chats that reported it (``members``), whose links to it go with it.
    Guarded by the limiter's lock.
    """

    __slots__ = ("kind", "key", "remaining", "reset", "pending", "dead", "heap_at",
                 "members")

    def __init__(self, kind, key):
        self.kind = kind
        self.key = key          # chat key, bucket string, or None (global)
        self.remaining = 0
        self.reset = 0.0
        self.pending = 0
        self.dead = False
        self.heap_at = None
        self.members = set() if kind == _B_SHARED else None

    def spent(self, now):
        """Whether one more start now would overdraw it (it still applies)."""
        return self.reset > now and self.remaining - self.pending <= 0
# What _Limiter.admit returns.
_START, _PARK, _REFETCH = 1, 0, -1


class _Limiter:
    """Pacing: everything that decides when a chat may start its next task.

    The configured windows (each chat's, the global one), the line of chats
    waiting their turn under the global limit, the global pause of a
    ``RetryAfter(scope="global")``, the budgets the platform announced
    (``learn``: a chat's own, shared buckets, the global one), the wake-up
    schedule of parked chats, and the expiry lists that forget windows once
    their last start has left them and budgets once their reset passed.
    The core asks it once per start (``admit``), tells it when the start is
    made (``commit``, right before the task is called: the limit holds
    where the platform sees it) or will not be (``release``), and the timer
    thread runs ``tick``.  No thread ever sleeps in here.

    Lock: ``lock`` guards every field below, and the pacing fields of a
    ``ChatQueue`` when the chat changes hands (its owner, a worker or the
    timer's schedule, uses them otherwise).  It is taken inside a queue's
    lock (``admit``), never the other way round, and the only lock taken
    inside it is the timer's (``need_timer``, to wake the timer thread);
    the timer thread takes it with nothing else held.

    Starts in two steps.  ``admit`` reserves a place in each window the
    start counts against (``_Window.pending``); ``commit`` stamps them with
    the time of the call.  A start admitted but not yet made counts as
    inside every window, so two chats cannot both take the last place, and a
    slow ``on_start`` hook (or, for a coroutine task, the hop to its event
    loop) cannot squeeze two calls closer than the window allows.  Learned
    budgets work the same way (``_Bucket.pending``); a start needs every
    configured window and every learned budget that covers its chat.
    A start admitted before a report and made after it counts against the
    new budget (it is made after the report) even if that leaves it
    overdrawn: what is under way is not called back.

    Learned budgets cost nothing until the first report: it sets the
    core's ``_limited`` (``on_learn``), after which every start is
    admitted here.  Each budget has one entry on the forget schedule
    (``bucket_heap``), pushed again when a later report moved its reset
    further: the tables hold only budgets whose reset has not passed.
    """

    __slots__ = ("lock", "need_timer", "closed", "pause_until", "wakeups", "seq",
                 "line", "granted", "glob", "chat_limit", "limit_for", "chat_limits",
                 "configured", "windows", "expiry", "paced", "parked",
                 "on_learn", "learned", "chat_buckets", "shared", "links", "gbucket",
                 "bucket_heap")

    def __init__(self, pacing, need_timer, on_learn=None):
        self.lock = _allocate_lock()
        self.need_timer = need_timer  # the core's _timer_needed(when)
        self.closed = False           # force_close(): the line and schedule are gone
        self.pause_until = 0.0        # a global RetryAfter: no start before this
        self.wakeups = []             # heap of (time, seq, ChatQueue): parked chats
        self.seq = 0
        self.line = deque()           # chats waiting their turn under the global limit
        self.granted = 0              # starts granted from the line, not yet taken
        self.glob = None              # _Window of the global limit, or None
        self.chat_limit = self.limit_for = None
        self.chat_limits = False      # chats have windows (chat_limit or limit_for)
        if pacing is not None:
            if pacing.global_limit is not None:
                self.glob = _Window(pacing.global_limit)
            self.chat_limit = pacing.chat_limit
            self.limit_for = pacing.limit_for
            self.chat_limits = pacing.chat_limit is not None or pacing.limit_for is not None
        # Whether every start must be admitted (else only a chat with a
        # retry delay, or any chat during a global pause, is).
        self.configured = self.glob is not None or self.chat_limits
        self.windows = {}             # chat key -> _Window (outlives the chat's queue)
        self.expiry = {}              # per -> deque of _Window, by last start
        self.paced = self.parked = 0
        self.on_learn = on_learn      # called once, at the first report
        self.learned = False          # a report arrived: budgets may exist
        self.chat_buckets = {}        # chat key -> _Bucket (scope="chat")
        self.shared = {}              # bucket string -> _Bucket
        self.links = {}               # chat key -> the shared _Bucket it last reported
        self.gbucket = None           # the _Bucket of scope="global", or None
        self.bucket_heap = []         # heap of (time, seq, _Bucket): when to forget

    # -- a chat's window --------------------------------------------------

    def window_for(self, q):
        """The chat's live window, made on first use (``limit_for`` runs
        here, outside every lock; its failure is raised to the caller).

        A window outlives the chat's queue until its last start leaves it;
        the timer then forgets it.  Keyed like the chat map (a hash taken
        once, an ``__eq__`` that cannot raise), by a key of its own: the
        queue's key stops equalling others once the queue leaves the map.
        """
        chat_id = q.chat_id
        key = q._key
        if type(key) is _ChatKey:
            key = _ChatKey(chat_id, key._hash)
        window = self.windows.get(key)
        if window is not None and not window.dead:
            return window
        limit = self.chat_limit
        if self.limit_for is not None:
            try:
                own = self.limit_for(chat_id)
            except Exception as exc:
                raise TypeError("limit_for(%s) raised %s" % (
                    _safe_repr(chat_id), type(exc).__name__)) from exc
            if own is not None:
                if not isinstance(own, RateLimit):
                    raise TypeError("limit_for(%s) must return a RateLimit or None, got %r"
                                    % (_safe_repr(chat_id), type(own).__name__))
                limit = own
        fresh = _Window(limit, key)
        with self.lock:
            window = self.windows.get(key)
            if window is None or window.dead:
                self.windows[key] = window = fresh
                # On the expiry list from birth: a window whose chat never
                # starts (force_close, a cancelled task) is forgotten too.
                fresh.born = monotonic()
                self._expire_later_locked(fresh)
        return window

    # -- one start: admit, then commit or release ---------------------------

    def admit(self, q, window):
        """May ``q`` start its next task now?  Else park it.

        Called by the chat's owner with ``q.lock`` held.  Returns _START
        (places reserved: ``q.reserved`` says where), _PARK (the chat is on
        the wake-up schedule or in the line; the timer hands it back) or
        _REFETCH (its window was forgotten meanwhile: fetch it again).
        """
        with self.lock:
            if self.closed:
                return _START  # force_close(): the core settles it as cancelled
            if window is not None and window.dead:
                q.window = None
                return _REFETCH
            now = monotonic()
            # Time rules first: a retry delay, a global pause, the chat's
            # own window.  A chat that must wait for them waits alone.
            until = q.not_before
            if self.pause_until:
                if self.pause_until <= now:
                    self.pause_until = 0.0  # over: back to the fast path
                elif self.pause_until > until:
                    until = self.pause_until
            if window is not None and window.count:
                t = window.next_start()
                if t > until:
                    until = t
                    if t > now:
                        q.waited = True
            buckets = None
            if self.learned:
                buckets = self._buckets_of_locked(q)
                for b in buckets:
                    if b.spent(now):
                        q.waited = True
                        if b.reset > until:
                            until = b.reset
            if until > now:
                if q.granted:
                    # Hand the granted start back to the line.
                    q.granted = False
                    self.granted -= 1
                    self.need_timer(now)
                self._park_locked(q, until)
                return _PARK
            q.not_before = 0.0
            reserved = 0
            # Then the global limit: chats take turns in one line.
            glob = self.glob
            if glob is not None:
                if q.granted:
                    q.granted = False
                    self.granted -= 1
                elif self.line or glob.next_start(self.granted) > now:
                    q.waited = True
                    self.line.append(q)
                    self.parked += 1
                    self.need_timer(glob.next_start(self.granted))
                    return _PARK
                glob.reserve()
                reserved = _GLOBAL
            if window is not None and window.count:
                window.reserve()
                reserved |= _CHAT
            if buckets:
                live = [b for b in buckets if b.reset > now]
                if live:
                    for b in live:
                        b.pending += 1
                    q.lres = live
                    reserved |= _LEARNED
            q.reserved = reserved
            q.stamped = None
            if q.waited:
                q.waited = False
                self.paced += 1
        return _START

    def commit(self, q):
        """The start ``admit`` reserved is being made: stamp it, now.

        Returns the stamp, which the task is called right after.
        """
        with self.lock:
            t = monotonic()
            reserved, q.reserved = q.reserved, 0
            if self.closed:
                q.lres = None
                return t  # force_close() dropped every window
            if reserved & _CHAT:
                window = q.window
                window.commit(t)
                self._expire_later_locked(window)
                q.stamped, q.last_start = window, t
            if reserved & _GLOBAL:
                self.glob.commit(t)
                self._line_changed_locked()
            if reserved & _LEARNED:
                lres, q.lres = q.lres, None
                for b in lres:
                    b.pending -= 1
                    b.remaining -= 1
        return t

    def release(self, q):
        """The start ``admit`` reserved will not be made (the task was
        cancelled, or the dispatcher force-closed, before its call)."""
        with self.lock:
            reserved, q.reserved = q.reserved, 0
            if self.closed:
                q.lres = None
                return
            if reserved & _CHAT:
                window = q.window
                window.release()
                self._expire_later_locked(window)
            if reserved & _GLOBAL:
                self.glob.release()
                self._line_changed_locked()
            if reserved & _LEARNED:
                lres, q.lres = q.lres, None
                for b in lres:
                    b.pending -= 1

    def _line_changed_locked(self):
        # A pending global start was made or given back: the line's next
        # grant may have become possible (it was infinitely far while the
        # pending starts filled the window).  Every change that can make a
        # grant due wakes the timer, which then never sleeps past it.
        if self.line:
            self.need_timer(self.glob.next_start(self.granted))

    def _expire_later_locked(self, window):
        # Put the window on the timer's list of windows to forget once
        # their last start has left them (one entry per start, in start
        # order).  The list of each ``per`` is looked up here and dropped by
        # the timer once empty, so that the table does not grow with every
        # distinct ``per`` ever seen.
        expiry = self.expiry.get(window.per)
        if expiry is None:
            expiry = self.expiry[window.per] = deque()
        if not expiry:
            self.need_timer(window.last() + window.per)
        expiry.append(window)
        window.entries += 1

    # -- budgets the platform announced ---------------------------------------

    def learn(self, q, remaining, reset_after, bucket, is_global):
        """A task of ``q`` reported a budget (values checked by the caller).

        O(1): one lock, at most three dict operations; a bucket seen for
        the first time also gets its entry on the forget schedule.
        """
        with self.lock:
            if self.closed:
                return
            # Under the lock: a task may report from any thread, even after
            # its end, while the chat's owner admits its next start.
            key = q.lkey
            if key is None:
                key = q.lkey = _learned_key(q)
            if not self.learned:
                self.learned = True
                if self.on_learn is not None:
                    self.on_learn()
            now = monotonic()
            reset = now + reset_after
            if bucket is not None:
                b = self.shared.get(bucket)
                if b is None:
                    b = self.shared[bucket] = _Bucket(_B_SHARED, bucket)
                elif b.reset <= now:
                    # Its reset passed (the timer has not forgotten it yet):
                    # the chats that reported it before are no longer in it.
                    self._unlink_members_locked(b)
                old = self.links.get(key)
                if old is not b:
                    if old is not None:
                        old.members.discard(key)
                    self.links[key] = b
                    b.members.add(key)
            elif is_global:
                b = self.gbucket
                if b is None:
                    b = self.gbucket = _Bucket(_B_GLOBAL, None)
            else:
                b = self.chat_buckets.get(key)
                if b is None:
                    b = self.chat_buckets[key] = _Bucket(_B_CHAT, key)
            b.remaining = remaining
            b.reset = reset
            if b.heap_at is None:
                self._forget_at_locked(b, reset)

    def _forget_at_locked(self, b, when):
        # The bucket's one entry on the forget schedule; the timer is told
        # when it becomes the earliest.
        b.heap_at = when
        self.seq += 1
        entry = (when, self.seq, b)
        heapq.heappush(self.bucket_heap, entry)
        if self.bucket_heap[0] is entry:
            self.need_timer(when)

    def _buckets_of_locked(self, q):
        # The learned budgets that cover ``q``: its own, the shared bucket it
        # last reported, the global one.
        found = []
        if self.chat_buckets or self.links:
            key = q.lkey
            if key is None:
                key = q.lkey = _learned_key(q)
            b = self.chat_buckets.get(key)
            if b is not None:
                found.append(b)
            b = self.links.get(key)
            if b is not None:
                found.append(b)
        if self.gbucket is not None:
            found.append(self.gbucket)
        return found

    def _unlink_members_locked(self, b):
        # The chats that reported shared bucket ``b`` leave it.
        links = self.links
        for key in b.members:
            if links.get(key) is b:
                del links[key]
        b.members = set()
        if not links:
            links.clear()

    def _forget_bucket_locked(self, b):
        # Its reset passed: the budget no longer applies and goes, with the
        # links of the chats that reported it.  Chat keys' __eq__ cannot
        # raise (see _ChatKey); the timer goes on whatever happens.
        b.dead = True
        try:
            if b.kind == _B_CHAT:
                table = self.chat_buckets
                if table.get(b.key) is b:
                    del table[b.key]
            elif b.kind == _B_SHARED:
                table = self.shared
                if table.get(b.key) is b:
                    del table[b.key]
                self._unlink_members_locked(b)
            else:
                table = None
                if self.gbucket is b:
                    self.gbucket = None
            if table is not None and not table:
                # A dict keeps its largest table after deletions: give back
                # the memory of a burst of chats.
                table.clear()
        except BaseException:
            logger.exception("could not forget a learned rate limit")

    def retry_at(self, q, until, is_global, refused):
        """The chat's next attempt may not start before ``until``.

        ``refused``: the platform turned the attempt away (``RetryAfter``),
        so it is not held against the chat's window as well: its stamp goes.
        """
        with self.lock:
            if refused:
                window = q.stamped
                if (window is not None and not window.dead
                        and window.last() == q.last_start):
                    window.pop_newest()
            q.stamped = None
            if until > q.not_before:
                q.not_before = until
            if is_global and until > self.pause_until:
                self.pause_until = until

    def return_grant(self, q):
        """The chat left without using the start the line granted it."""
        with self.lock:
            if q.granted and not self.closed:  # force_close() reset the line
                q.granted = False
                self.granted -= 1
                if self.line:
                    self.need_timer(0.0)

    def _park_locked(self, q, until):
        # Put an owned chat on the wake-up schedule.
        self.seq += 1
        heapq.heappush(self.wakeups, (until, self.seq, q))
        self.parked += 1
        self.need_timer(until)

    # -- the timer's side -----------------------------------------------------

    def tick(self, now, ready):
        """Move parked chats whose time came to ``ready``, grant starts from
        the global line, forget stale windows.  Return when to look again."""
        with self.lock:
            until = _INF
            wakeups = self.wakeups
            while wakeups:
                if wakeups[0][0] > now:
                    until = wakeups[0][0]
                    break
                ready.append(heapq.heappop(wakeups)[2])
                self.parked -= 1
            line = self.line
            if line:
                if self.pause_until > now:
                    until = min(until, self.pause_until)
                else:
                    glob = self.glob
                    while line and glob.next_start(self.granted) <= now:
                        q = line.popleft()
                        q.granted = True
                        self.granted += 1
                        self.parked -= 1
                        ready.append(q)
                    if line:
                        # Infinite while pending starts fill the window:
                        # their commit (or release) wakes the timer.
                        until = min(until, glob.next_start(self.granted))
            emptied = []
            for per, expiry in self.expiry.items():
                # An entry is stale when its window has later ones (it
                # started again since) or a start pending (its commit or
                # release adds a new entry).
                while expiry:
                    window = expiry[0]
                    if window.entries == 1 and not window.pending:
                        t = window.last() + per
                        if t > now:
                            until = min(until, t)
                            break
                        self._forget_window_locked(window)
                    window.entries -= 1
                    expiry.popleft()
                if not expiry:
                    emptied.append(per)
            for per in emptied:
                del self.expiry[per]
            heap = self.bucket_heap
            while heap:
                if heap[0][0] > now:
                    until = min(until, heap[0][0])
                    break
                b = heapq.heappop(heap)[2]
                b.heap_at = None
                if b.reset > now:
                    self._forget_at_locked(b, b.reset)  # a later report moved it
                else:
                    self._forget_bucket_locked(b)
            return until

    def _forget_window_locked(self, window):
        # Its last start left the window: the chat's limit no longer
        # constrains anything, so the window goes (a chat's next start makes
        # a new one).  The chat id's __hash__/__eq__ run here: whatever they
        # do, the timer goes on (the entry is then simply kept).
        window.dead = True
        try:
            if self.windows.get(window.key) is window:
                del self.windows[window.key]
                if not self.windows:
                    # A dict keeps its largest table after deletions: give
                    # back the memory of a burst of chats.
                    self.windows.clear()
        except BaseException:
            logger.exception("could not forget the rate-limit window of a chat")

    def cancel_all(self):
        """force_close(): empty the schedule and the line; return the chats
        that were on them (owned by nobody now)."""
        with self.lock:
            self.closed = True
            parked = [entry[2] for entry in self.wakeups]
            parked.extend(self.line)
            self.wakeups = []
            self.line.clear()
            self.parked = self.granted = 0
            self.pause_until = 0.0
            # Nothing starts any more: no window can constrain anything.
            for window in self.windows.values():
                window.dead = True
            self.windows.clear()
            self.expiry.clear()
            self.chat_buckets.clear()
            self.shared.clear()
            self.links.clear()
            self.gbucket = None
            self.bucket_heap = []
        return parked

    def counters(self):
        with self.lock:
            return self.paced, self.parked

    def state(self):
        with self.lock:
            return {"windows": len(self.windows),
                    "expiry": sum(len(e) for e in self.expiry.values()),
                    "expiry_lists": len(self.expiry),
                    "wakeups": len(self.wakeups), "line": len(self.line),
                    "granted": self.granted, "parked": self.parked,
                    "pending": self.glob.pending if self.glob is not None else 0,
                    "buckets": (len(self.chat_buckets) + len(self.shared)
                                + (self.gbucket is not None)),
                    "links": len(self.links), "bucket_heap": len(self.bucket_heap)}


class DispatcherCore:
    """The per-chat queues, the worker loop and the deadline loop.

    ``OutboundDispatcher`` (in ``_dispatcher.py``) adds configuration checks,
    threads and the lifecycle on top of this class.
    """

    def __init__(self, *args, **kwargs):
        self._queues = {}
        self._map_lock = _allocate_lock()
        self._map_high = 0   # the most chats the map held since its last reset
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
        # The earliest need that arrived while the timer was awake (it looks
        # at the limiter outside _run_lock): seen when it decides to sleep.
        self._timer_next = _INF
        self._forced = False          # force_close() ran: nothing starts any more
        self._limiter = _Limiter(None, self._timer_needed, self._learning)
        self._ref = weakref.ref(self)  # for its chat queues (see ChatQueue.core_ref)
        self._count_lock = _allocate_lock()
        self._pending = 0
        self._drain_waiters = 0
        self._inflight = 0
        self._submitted = self._completed = self._failed = 0
        self._rejected = self._discarded = self._cancelled = self._timed_out = 0
        self._retried = 0             # under _count_lock
        # Coroutine tasks (asubmit).  Every start takes one of max_inflight
        # slots (_inflight), held until the task ends: a coroutine task in
        # flight holds one but no thread.  With thread tasks only, a worker
        # always finds one (there are at most max_inflight workers); a chat
        # that finds none waits in _slot_waiters until an end hands it one.
        self._async_used = False
        self._slot_waiters = deque()  # under _pool_lock
        self._handoffs = {}           # ChatQueue -> (loop, when): handed to a loop; _run_lock
        self._loop_items = {}         # loop -> set of its running coroutine tasks; _run_lock
        # Callers waiting for room (block=True): how many (_count_lock), and
        # how many chats have a running task that waits (_wait_lock).
        self._waiting = 0
        self._max_waiting = 100_000
        self._wait_lock = _allocate_lock()
        self._task_waiting = 0
        # Per worker thread: the chat it is running (see running_chat).
        self._tls = threading.local()

    def _configure(self, max_inflight, queue_size, send_timeout, idle_timeout,
                   hooks, recover, pacing=None, retry=None, max_waiting=100_000):
        self._max_inflight = max_inflight
        self._max_waiting = max_waiting
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
        self._limiter = _Limiter(pacing, self._timer_needed, self._learning)
        # Whether every start must ask the limiter (else only a chat with a
        # pending retry delay or during a global pause does).  Set for good
        # by the first report_limit (_learning).
        self._limited = self._limiter.configured

    def _learning(self):
        # The first report_limit: from now on every start asks the limiter
        # (a dispatcher that never learns a limit never pays for it).
        self._limited = True

    # ------------------------------------------------------------------ submit

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
                fresh.core_ref = self._ref
                with self._map_lock:
                    q = queues.setdefault(key, fresh)
                    if q is fresh:
                        self._map_high = max(self._map_high, len(queues))
            with q.lock:
                # G5 (docs/guarantees.md): the worker may have removed this very queue
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
                    if block:
                        waiter = self._add_waiter_locked(q, item, loop, holder)
                else:
                    items.append(item)
                    queue_len = len(items)
                    start = not q.running
                    q.running = True
            break
        if queue_len < 0:
            if block:
                if type(waiter) is _Waiter:
                    return waiter
                self._reject(chat_id, _no_room(chat_id, q.capacity, waiter,
                                               self._max_waiting))
            self._reject(chat_id, QueueFull(
                "chat %s already has %d waiting tasks" % (_safe_repr(chat_id), q.capacity)))
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
            self._drain_chat(q, loop)
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
        global _asyncio
        if _asyncio is None:
            import asyncio as _asyncio_module
            _asyncio = _asyncio_module
        loop = _asyncio._get_running_loop()
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
        if type(item) is _Waiter:
            waiter, item = item, item.item
            await self._await_room(waiter, timeout, future)
        try:
            if future.done():
                # Its task ended in this call (it returned no awaitable):
                # still let the loop run others once, as before the chat
                # started here, so that a loop of such calls cannot starve
                # them.
                await _asyncio.sleep(0)
            return await future
        except _asyncio.CancelledError:
            # The caller cancelled its await: the attempt running now (if
            # any) is cancelled too; one not started yet is skipped.
            if future.cancelled():
                _cancel_aio(item)
            raise

    # ------------------------------------------------------- waiting for room

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
        if loop is None and self._async_used and _asyncio._get_running_loop() is not None:
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
            waiter.wake.release()
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
            woken = waiter.wake.acquire(True, -1 if timeout is None else timeout)
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

    # ------------------------------------------------ the running task's chat

    def running_chat(self):
        """The chat id of this dispatcher's task that the calling code runs in.

        A thread task: the calling thread is the worker running it; a
        coroutine task: the calling code runs in its call or its awaitable
        (its asyncio Task and what inherits that context).  None anywhere
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

    def _reject(self, chat_id, exc, waited=False):
        # ``waited``: a caller that waited for room (not counted as submitted).
        with self._count_lock:
            if not waited:
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
        # it holds no thread (G6, docs/guarantees.md).
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
    def queue_size(self):
        """How many tasks one chat may have waiting (the configured capacity)."""
        return self._queue_size

    @property
    def max_inflight(self):
        """Most tasks running at once (the configured cap)."""
        return self._max_inflight

    @property
    def inflight(self):
        """Tasks running right now."""
        return self._inflight

    @property
    def closed(self):
        """True once ``close()`` (or ``shutdown``/``force_close``) ran."""
        return self._closed

    def _counters(self):
        paced, parked = self._limiter.counters()
        with self._count_lock:
            return (self._submitted, self._completed, self._failed, self._rejected,
                    self._discarded, self._cancelled, self._timed_out,
                    len(self._queues), self._inflight, self._threads,
                    self._retried, paced, parked, self._waiting)

    def _pacing_state(self):
        """Sizes of the limiter's structures (for tests and debugging)."""
        return self._limiter.state()

    def _pending_count(self):
        return self._pending

    def _uses_loops(self):
        """Whether coroutine tasks (asubmit) were ever queued."""
        return self._async_used

    def _add_drain_waiter(self, n):
        with self._count_lock:
            self._drain_waiters += n

    def _maybe_drained(self):
        if (self._drain_waiters and not self._pending and not self._queues
                and not self._inflight):
            self._notify_drained()

    # ----------------------------------------------------------------- workers

    def _worker_main(self):
        """Body of one worker thread: take a ready chat, drain it, repeat."""
        wake = _allocate_lock()
        wake.acquire()
        searching = True  # a new worker was started as the searcher
        tls = self._tls
        while True:
            q = self._next_chat(wake, searching)
            if q is None:
                return
            tls.chat = q  # what running_chat() says in this thread meanwhile
            self._drain_chat(q)
            tls.chat = q = None  # an idle worker keeps nothing of the chats it ran
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

    def _drain_chat(self, q, here=None):
        # Run the chat's tasks that belong here (on a worker, ``here`` None:
        # thread tasks; on an event loop: that loop's coroutine tasks) until
        # the chat is empty, parked, handed to where its next task runs, or
        # left to a coroutine task whose end will go on with it.
        while True:
            if q.slot_held:
                q.slot_held = False
            elif not self._take_slot(q):
                return  # waits for a slot: a task's end hands it one
            if self._limited or q.not_before or self._limiter.pause_until:
                item = self._next_paced(q, here)
            else:
                with q.lock:
                    item = self._take_head_here_locked(q, here)
                    if item is None:
                        # G5 (docs/guarantees.md): the empty queue leaves the map while
                        # its lock is held, so a submitter's re-check cannot
                        # miss it.
                        q.running = False
                        self._remove_locked(q)
            if q.woken is not None:
                self._wake_admitted(q)  # its task took the place of one that left
            if item is None or item is _PARKED or item is _AGAIN or item is _ELSEWHERE:
                self._release_slot()
                if item is None:
                    break
                if item is _PARKED:
                    return
                if item is _ELSEWHERE:
                    target, q.elsewhere = q.elsewhere, None
                    if target is _WORKERS:
                        self._schedule(q)
                        return
                    if self._hand_to_loop(q, target):
                        return
                    self._drop_dead_head(q, target)
                continue
            if here is None:
                ran = self._run(item, q)
            else:
                ran = self._start_async(item, q, here)
                if ran == _ASYNC:
                    return  # its awaitable's end goes on with the chat (slot kept)
            self._release_slot()
            if ran == _PANICKED:
                return  # the task panicked; its chat is gone
            if ran == _DONE and here is None and self._ready and q._items:
                # Other chats wait for a worker: go to the back of the line
                # so that a busy chat cannot starve quiet ones.
                with self._pool_lock:
                    self._ready.append(q)
                return
        if q.granted:
            self._limiter.return_grant(q)
        self._maybe_drained()

    def _take_head_here_locked(self, q, here):
        # With q.lock held: the chat's next task if it runs here, else
        # _ELSEWHERE (q.elsewhere says where), or None when it has none.
        if self._async_used:
            head = _head(q)
            if head is not None and head._loop is not here:
                q.elsewhere = head._loop if head._loop is not None else _WORKERS
                return _ELSEWHERE
        return _take_head_locked(q)

    def _dispatch(self, q):
        # An owned chat that no thread or loop is running: give it to
        # whoever runs its next task (the workers, or that task's loop).
        if self._async_used:
            with q.lock:
                head = _head(q)
            if head is not None and head._loop is not None and self._hand_to_loop(q, head._loop):
                return
        self._schedule(q)

    # ------------------------------------------------------- coroutine tasks

    def _hand_to_loop(self, q, loop):
        # Give an owned chat whose next task is ``loop``'s to that loop.
        # False when the loop is closed or not running: that task can never
        # start there.  A loop that stops before it takes the chat loses it
        # again to the timer (see _check_loops_locked).
        if loop.is_closed() or not loop.is_running():
            return False
        now = monotonic()
        with self._run_lock:
            self._handoffs[q] = (loop, now)
            self._timer_needed_locked(now + _HANDOFF_CHECK)
        try:
            if _asyncio._get_running_loop() is loop:
                loop.call_soon(self._loop_step, q)
            else:
                loop.call_soon_threadsafe(self._loop_step, q)
        except RuntimeError:  # closed meanwhile
            with self._run_lock:
                taken = self._handoffs.pop(q, None) is not None
            return not taken  # else the timer took it back and handed it on
        return True

    def _loop_step(self, q):
        # On the loop a chat was handed to: take it (unless the timer took it
        # back meanwhile) and run its tasks that are this loop's.
        with self._run_lock:
            if self._handoffs.pop(q, None) is None:
                return
        self._drain_chat(q, _asyncio._get_running_loop())

    def _drop_dead_head(self, q, loop):
        # The loop the chat's next task belongs to is closed, or stopped
        # before it could start it: that task never runs.  It fails with
        # Cancelled, and the chat goes on.
        with q.lock:
            head = _head(q)
            item = _take_head_locked(q) if head is not None and head._loop is loop else None
        if q.woken is not None:
            self._wake_admitted(q)
        if item is None:
            return
        error = Cancelled("the event loop of this coroutine task is closed or stopped "
                          "before the task could start")
        if item._attempt > 1:
            self._settle_started(item, error, "cancelled")
        else:
            self._finish(item, error, "cancelled")
            self._maybe_drained()

    def _take_slot(self, q):
        # One of the max_inflight slots for the chat's next start, or False
        # (the chat then waits in _slot_waiters, which a task's end serves).
        with self._count_lock:
            if self._inflight < self._max_inflight:
                self._inflight += 1
                return True
        with self._pool_lock:
            self._slot_waiters.append(q)
        # A slot freed between our look and our wait must not be missed.
        with self._count_lock:
            free = self._inflight < self._max_inflight
        if free:
            self._wake_slot_waiter()
        return False

    def _release_slot(self):
        # The last slot given back may be what a drain() waits for (a
        # worker holds one from before it takes a task until after it has
        # ended it and, for the chat's last one, removed the emptied queue).
        with self._count_lock:
            self._inflight -= 1
            last = self._inflight == 0
        if last and self._drain_waiters:
            self._maybe_drained()
        if self._slot_waiters:
            self._wake_slot_waiter()

    def _wake_slot_waiter(self):
        with self._pool_lock:
            q = self._slot_waiters.popleft() if self._slot_waiters else None
        if q is not None:
            self._dispatch(q)

    def _start_async(self, item, q, loop):
        # On ``loop``'s thread: start one attempt of a coroutine task.
        # _ASYNC when the awaitable it returned runs on now (its end goes on
        # with the chat); else it ended at once, and this returns what
        # _run does.
        future = item._future
        if self._forced or future.cancelled():
            if q.reserved:
                self._limiter.release(q)
            error = (Cancelled("the dispatcher was force-closed") if self._forced
                     else Cancelled("cancelled before it started"))
            if item._attempt == 1:
                self._finish(item, error, "cancelled")
                self._maybe_drained()
            else:
                self._settle_started(item, error, "cancelled")
            return _DONE
        if not self._begin(item, q):
            return _DONE
        result = panic = None
        ctx = item._ctx
        try:
            # In the caller's context (copied at asubmit), never in the
            # context of whoever started the chat's run.
            result = ctx.run(_call_in_context, item)
            error = None
        except Exception as exc:
            error = exc if type(exc) is not TypeError else _task_call_error(item.chat_id, exc)
        except BaseException as exc:
            error = panic = exc
        if error is None and inspect.isawaitable(result):
            try:
                if inspect.iscoroutine(result):
                    aio = ctx.run(loop.create_task, result)
                else:
                    aio = ctx.run(_asyncio.ensure_future, result, loop=loop)
            except Exception as exc:
                error = exc
            else:
                item._aio = aio
                with self._run_lock:
                    item._queue = q
                    items = self._loop_items.get(loop)
                    if items is None:
                        items = self._loop_items[loop] = set()
                        self._timer_needed_locked(monotonic() + _LOOP_CHECK)
                    items.add(item)
                aio.add_done_callback(functools.partial(self._aio_done, item))
                return _ASYNC
        return self._end(item, q, result, error, panic)

    def _claim(self, item):
        # The end of a running coroutine task is handled once: by its loop
        # (_aio_done), or by the timer when that loop was closed first.
        # Returns the task's chat to whoever claims it, else None.
        with self._run_lock:
            q = item._queue
            if q is None:
                return None
            item._queue = None
            items = self._loop_items.get(item._loop)
            if items is not None:
                items.discard(item)
                if not items:
                    del self._loop_items[item._loop]
        return q

    def _aio_done(self, item, aio):
        # On the loop: the awaitable of a coroutine task ended.
        q = self._claim(item)
        if q is None:
            return
        loop = item._loop
        item._aio = None
        result = error = panic = None
        cancelled = aio.cancelled()
        if not cancelled:
            error = aio.exception()
            if error is None:
                result = aio.result()
            elif not isinstance(error, Exception):
                panic = error
        ran = self._end(item, q, result, error, panic, cancelled)
        if ran == _PANICKED:
            self._release_slot()
        else:
            # The chat goes on with the slot its ended task held: giving it
            # back here would wake a chat waiting for one, only for this
            # chat to take it again first (and that chat to wait again).
            q.slot_held = True
            self._drain_chat(q, loop)

    def _end_on_closed_loop(self, item):
        # The loop of a running coroutine task is closed: its awaitable will
        # never end there.  End it here, and go on with its chat.
        q = self._claim(item)
        if q is None:
            return
        item._aio = None
        ran = self._end(item, q, None, None, None, True)
        self._release_slot()
        if ran != _PANICKED:
            self._dispatch(q)

    def _cancel_async(self, item):
        # A coroutine task past its deadline, or force-closed: cancel its
        # awaitable on its loop (or end it here if that loop is closed).
        try:
            item._loop.call_soon_threadsafe(_cancel_aio, item)
        except RuntimeError:
            self._end_on_closed_loop(item)

    def _check_loops_locked(self, now, revoked, dead):
        # With _run_lock held (the timer): chats handed to a loop that has
        # stopped or closed without taking them go back (to ``revoked``);
        # coroutine tasks of closed loops go to ``dead``.  Returns when to
        # look again.
        until = _INF
        for q, (loop, at) in list(self._handoffs.items()):
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

    # ------------------------------------------------------------------ pacing

    def _next_paced(self, q, here=None):
        # The chat's next task if pacing lets it start now; _PARKED if the
        # chat was parked (the timer will hand it back: no worker sleeps
        # for a limit); _AGAIN to look again; _ELSEWHERE if it runs on
        # another thread or loop than ``here``; None once the chat is empty
        # and removed.
        limiter = self._limiter
        window = q.window
        failed = False
        if limiter.chat_limits and (window is None or window.dead):
            try:
                window = q.window = limiter.window_for(q)
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
            if self._async_used:
                head = _head(q)
                if head._loop is not here:
                    q.elsewhere = head._loop if head._loop is not None else _WORKERS
                    return _ELSEWHERE
            admitted = limiter.admit(q, window)
            if admitted != _START:
                return _AGAIN if admitted == _REFETCH else _PARKED
            return _take_head_locked(q)

    def _refuse_head(self, q, exc):
        # The limiter could not judge this chat (limit_for or the chat id's
        # __hash__/__eq__ failed): its next task fails with that error, the
        # chat goes on with the one after.
        with q.lock:
            item = _take_head_locked(q)
        if q.woken is not None:
            self._wake_admitted(q)
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
        # (under _map_lock, so that no insert can slip in between) if it
        # held more than _KEEP_CHATS since its last reset: a smaller table
        # is kept, and this path takes no lock.
        queues = self._queues
        if not q._removed:
            q._removed = True
            key = q._key
            if type(key) is _ChatKey:
                key._removing = True
            queues.pop(key, None)
        if not queues and self._map_high > _KEEP_CHATS:
            with self._map_lock:
                if not queues:
                    queues.clear()
                    self._map_high = 0

    def _run(self, item, q):
        """Run one attempt of a thread task: _DONE, _PANICKED or _RETRYING."""
        future = item._future
        if self._forced:
            # Popped just before force_close() cleared the queue: dropped as
            # a waiting task is (its Future cancelled).  _register re-checks.
            if q.reserved:
                self._limiter.release(q)
            if item._attempt == 1:
                self._finish(item, Cancelled("the dispatcher was force-closed"), "cancelled")
                self._maybe_drained()
            else:
                self._settle_started(item, Cancelled("the dispatcher was force-closed"),
                                     "cancelled")
            return _DONE
        if item._attempt == 1 and future is not None and not _start_future(future):
            if q.reserved:
                self._limiter.release(q)
            self._finish(item, Cancelled("cancelled before it started"), "cancelled")
            return _DONE
        if not self._begin(item, q):
            return _DONE
        result = panic = None
        try:
            result = item._fn(item)
            error = None
        except Exception as exc:
            error = exc if type(exc) is not TypeError else _task_call_error(item.chat_id, exc)
        except BaseException as exc:
            error = panic = exc
        if error is None and result is not None and inspect.isawaitable(result):
            error = _awaitable_error(item, result)
        return self._end(item, q, result, error, panic, posted=future is None)

    def _begin(self, item, q):
        # The start of an attempt, right before its call (on its worker, or
        # on its loop for a coroutine task): on_start, the start counted
        # (after on_start, so a slow hook cannot squeeze two calls closer
        # than a window allows), the deadline, the running registry.  False
        # when force_close() came first (the task was settled, never runs).
        if self._on_start is not None:
            try:
                self._on_start(item.chat_id)
            except BaseException as exc:
                self._hook_failed("on_start", exc)
        item._chatq = q
        if q.reserved:
            item._t_start = self._limiter.commit(q)
        elif self._send_timeout is not None or self._on_done is not None:
            item._t_start = monotonic()
        if self._send_timeout is not None:
            item._deadline = item._t_start + self._send_timeout
        if not self._register(item):
            # force_close() ran since this task left its queue: it never starts.
            self._settle_started(item, Cancelled("the dispatcher was force-closed"),
                                 "cancelled")
            return False
        return True

    def _end(self, item, q, result, error, panic, cancelled=False, posted=False):
        # The end of an attempt: its outcome (unless the deadline or
        # force_close() claimed it first), a retry, or a panic of its chat.
        # ``cancelled``: a coroutine task's awaitable was cancelled;
        # ``posted``: a task given to post() (no Future).
        waiting = None
        if panic is not None:
            # The chat is closed before its panicked task's Future is
            # resolved: a task submitted by whoever saw that result goes to a
            # new queue and runs, it is not discarded with the waiting ones.
            waiting = self._close_panicked(q)
        # Whoever takes the task out of the running registry owns its
        # outcome: us, or the timer (deadline) or force_close().
        if self._unregister(item):
            if cancelled:
                self._resolve(item, None, Cancelled("the coroutine task was cancelled"),
                              "cancelled")
            elif panic is not None:
                discarded = TaskDiscarded("the task panicked: %s" % (_safe_repr(panic),))
                discarded.__cause__ = panic
                self._resolve(item, None, discarded, "failed")
            elif error is not None:
                verdict, error = self._retry_later(item, q, error)
                if verdict == _RETRYING:
                    return _RETRYING
                if verdict == _FORCED:
                    self._resolve(item, None, Cancelled("the dispatcher was force-closed"),
                                  "cancelled")
                else:
                    self._resolve(item, None, error, "failed")
            else:
                self._resolve(item, result, None, "completed")
        else:
            # Timed out or force-closed meanwhile: its outcome is settled;
            # report it now that it has returned, from this thread.
            error = self._expired_error(item, item._error)
            if self._on_done is not None:
                self._report(item, error, monotonic() - item._t_start)
            elif posted and item._cancel == _BY_TIMEOUT:
                self._log_unobserved(item, error)
            item._error = None
        if panic is not None:
            self._panic(q, panic, waiting)
        item._fn = None
        with self._count_lock:
            self._pending -= 1
        self._maybe_drained()
        return _PANICKED if panic is not None else _DONE

    def _retry_plan(self, item, error):
        # G13 (docs/guarantees.md): how long until ``error``'s task may run again, and whether
        # every chat waits (a global RetryAfter); None when it is not retried.
        # ``error`` is user code (a RetryAfter subclass may carry anything in
        # ``seconds``, a retry_on class may have a hostile __instancecheck__):
        # what this raises fails the task, never the worker.
        if isinstance(error, RetryAfter):
            seconds = error.seconds
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
                raise TypeError("RetryAfter.seconds must be a number, got %r"
                                % (type(seconds).__name__,))
            try:
                delay = float(seconds)
            except OverflowError:
                delay = _INF  # an int too large for a float: longer than any cap
            if delay != delay or delay < 0:
                raise ValueError("RetryAfter.seconds must be >= 0, got %r" % (delay,))
            if delay > self._max_retry_after:
                return None
            scope = error.scope
            return delay, type(scope) is str and scope == "global", True
        if self._retry_on and isinstance(error, self._retry_on):
            return self._retry.backoff_delay(item._attempt), False, False
        return None

    def _retry_later(self, item, q, error):
        # A RetryAfter, or a retry_on error, runs the same task again ahead
        # of every later task of its chat.  Return (_RETRYING, error),
        # (_DONE, the error the task fails with) when it is not retried, or
        # (_FORCED, error) when force_close() came first.
        try:
            plan = self._retry_plan(item, error)
        except BaseException as exc:
            logger.error("chat %s: cannot retry the task's %s", _safe_repr(q.chat_id),
                         _safe_repr(type(error)), exc_info=exc)
            if not isinstance(exc, Exception):
                exc = TypeError("retry decision failed: %s" % (_safe_repr(exc),))
            exc.__cause__ = error
            return _DONE, exc
        if plan is None:
            return _DONE, error
        delay, is_global, refused = plan
        attempt = item._attempt
        if attempt >= self._max_attempts:
            return _DONE, error
        until = monotonic() + delay
        with q.lock:
            # Checked under the queue's lock: force_close() clears the
            # queues under it after setting _forced, so either it sees this
            # retry item or we see _forced.
            if self._forced:
                return _FORCED, error
            item._attempt = attempt + 1
            item._deadline = None
            q.retry_item = item
        self._limiter.retry_at(q, until, is_global, refused)
        with self._count_lock:
            self._retried += 1
        if self._on_retry is not None:
            try:
                self._on_retry(item.chat_id, attempt, delay, error)
            except BaseException as exc:
                self._hook_failed("on_retry", exc)
        return _RETRYING, error

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
        if item._loop is not None:
            _on_loop(item._loop, _aio_set, future, result, error)
        elif future is not None:
            _finish_future(future, result, error)
        elif error is not None and outcome == "failed" and self._on_done is None:
            self._log_unobserved(item, error)
        if self._on_done is not None:
            self._report(item, error, monotonic() - item._t_start)

    def _log_unobserved(self, item, error):
        # A post()ed task that failed, with no on_done hook to see it: as
        # Python reports an exception that ends a thread, once, with its
        # traceback.
        logger.error("task posted for chat %s failed", _safe_repr(item.chat_id),
                     exc_info=(type(error), error, error.__traceback__))

    def _finish(self, item, error, outcome):
        # Settle a task that never started (cancelled, discarded, dropped).
        if item._loop is not None:
            # asubmit's Future: its caller may have cancelled it; else it
            # gets the error on its loop (a Cancelled too: an exception, not
            # a cancellation of the caller's own await).
            if item._future.cancelled():
                outcome = "cancelled"
            else:
                _on_loop(item._loop, _aio_set, item._future, None, error)
        elif not _settle(item._future, error):
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

    def _close_panicked(self, q):
        # G7 (docs/guarantees.md), first step: the chat's waiting tasks are taken out and
        # its queue is removed (returns those tasks, for _panic).
        with q.lock:
            waiting = q.clear()
            # Callers waiting for room in it are let in, to be discarded
            # with the chat's waiting tasks (woken by _panic).
            while q.waiters is not None:
                _admit_locked(q)
                waiting.append(q._items.pop())
                q.woken[-1].queue_len = 0
            q.running = False
            self._remove_locked(q)
        return waiting

    def _panic(self, q, exc, waiting):
        # G7: the worker survives; the chat's waiting tasks (taken out
        # by _close_panicked) are discarded, each Future resolved, never
        # left pending; then recover(exc) runs.
        chat = _safe_repr(q.chat_id)
        for item in waiting:
            error = TaskDiscarded("a previous task of chat %s panicked" % (chat,))
            error.__cause__ = exc
            self._finish(item, error, "discarded")
        if q.woken is not None:
            self._wake_admitted(q)
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

    def _timer_needed(self, when):
        with self._run_lock:
            self._timer_needed_locked(when)

    def _timer_needed_locked(self, when):
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
        only ever looks at its head.  Pacing (parked chats, the global line,
        windows to forget) is the limiter's ``tick``, run outside _run_lock.
        A need that arrives meanwhile (a deadline registered, a chat parked,
        a start made) is kept in _timer_next, which the timer reads when it
        decides to sleep: it never sleeps past something due.  It sleeps
        until the earliest of these, or until woken by something earlier;
        after idle_timeout seconds with nothing to watch, it ends (the next
        need starts a new one), so that a dispatcher dropped without
        shutdown() is not kept alive by it.
        """
        running = self._running
        limiter = self._limiter
        while True:
            expired = []
            ready = []
            revoked = []
            dead = []
            with self._run_lock:
                if self._timer_stop:
                    return
                self._timer_next = _INF
                now = monotonic()
                until = _INF
                if self._send_timeout is not None:
                    for item in running:
                        if item._deadline > now:
                            until = item._deadline
                            break
                        expired.append(item)
                    for i, item in enumerate(expired):
                        del running[item]
                        error = item._error = SendTimeout()  # see _expired_error
                        expired[i] = (item, error)
                if self._handoffs or self._loop_items:
                    until = min(until, self._check_loops_locked(now, revoked, dead))
            if not expired:
                until = min(until, limiter.tick(now, ready))
            for item, error in expired:
                self._expire(item, _BY_TIMEOUT, error)
            for q in ready:
                self._dispatch(q)
            for q in revoked:
                self._schedule(q)  # a worker drops the task its loop never started
            for item in dead:
                self._end_on_closed_loop(item)
            if expired or ready or revoked or dead:
                continue
            item = q = None  # asleep, it keeps nothing of the tasks it looked at
            with self._run_lock:
                if self._timer_stop:
                    return
                until = min(until, self._timer_next)
                now = monotonic()
                if until <= now:
                    continue  # something became due while we looked
                # About to sleep (only then: a waker releases the wake lock
                # once per sleep, as the state says).
                self._timer_until = until
                self._timer_state = _IDLE if until == _INF else _UNTIL_DEADLINE
            # A lock wait longer than TIMEOUT_MAX raises: wake up earlier
            # and look again (every wait is bounded at its source too).
            delay = self._idle_timeout if until == _INF else min(until - now, _TIMEOUT_MAX)
            woken = self._timer_wake.acquire(True, delay)
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

    def _stop_timer(self):
        with self._run_lock:
            self._timer_stop = True
            self._wake_timer_locked()

    def _expire(self, item, reason, error):
        # The task is still running (Python cannot stop a thread); we release
        # its Future now (with ``error``, the one set on the task when it
        # was taken: not read back from the task, whose worker, woken by the
        # cancel, clears it) and drop whatever it returns later.
        item._cancel_with(reason)
        error = self._expired_error(item, error)
        outcome = "timed_out" if reason == _BY_TIMEOUT else "cancelled"
        future = item._future
        item._future = None
        self._count(outcome)
        if item._loop is not None:
            # A coroutine task: its caller hears it on its loop, and its
            # awaitable is cancelled there (its end goes on with the chat).
            _on_loop(item._loop, _aio_set, future, None, error)
            self._cancel_async(item)
        elif future is not None:
            _finish_future(future, None, error)
        # on_done is called by the task's worker once the task returns (see
        # _run): a slow hook here would hold every other deadline, or
        # force_close().

    def _expired_error(self, item, error):
        # ``error`` was made when the task was claimed (under _run_lock, so
        # that its worker finds it); a SendTimeout gets its message here,
        # outside any lock (the chat id's repr is user code), by whichever of
        # its claimer and its worker comes first.
        if isinstance(error, SendTimeout) and not error.args:
            error.args = ("chat %s: the task ran past its %ss send_timeout"
                          % (_safe_repr(item.chat_id), self._send_timeout),)
        return error

    # ---------------------------------------------------------------- lifecycle

    def _close(self):
        self._closed = True
        self._close_waiters()

    def _cancel_everything(self):
        """force_close(): cancel running, retrying, parked and waiting tasks."""
        self._closed = True
        self._close_waiters()
        with self._run_lock:
            self._forced = True
            running = [(item, Cancelled("the dispatcher was force-closed"))
                       for item in self._running]
            self._running.clear()
            for item, error in running:
                item._error = error
            # Chats handed to a loop that has not taken them yet: the
            # workers find them (emptied below) and let them go.
            handed = list(self._handoffs)
            self._handoffs.clear()
            dead = [item for loop, items in self._loop_items.items()
                    if loop.is_closed() for item in items]
        parked = self._limiter.cancel_all()
        for item, error in running:
            self._expire(item, _BY_FORCE, error)
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
        with self._pool_lock:
            waiting_for_slots = list(self._slot_waiters)
            self._slot_waiters.clear()
        for q in handed + waiting_for_slots:
            self._schedule(q)
        for item in dead:
            self._end_on_closed_loop(item)
        self._maybe_drained()

    def _stop_workers(self):
        """Wake every idle worker so that it exits; stop the timer."""
        with self._pool_lock:
            self._stopping = True
            idle, self._idle = self._idle, []
        for wake in idle:
            wake.release()
        self._stop_timer()
