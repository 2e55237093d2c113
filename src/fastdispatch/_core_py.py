"""The dispatcher core in pure Python: the twin of the compiled ``_ringbuf``.

Same rooms, same behaviour, same locking protocol: it is used when the
extension is missing or ``FASTDISPATCH_NO_EXTENSIONS=1`` is set, and the test
suite runs every behaviour test against both (tests/test_core_rooms.py checks
that the two stay one design, room by room).  docs/dispatcher.md explains
the design; docs/guarantees.md says what it guarantees and which room keeps
each promise.

The core is one object, ``DispatcherCore``, built as a chain of rooms: each
room is a class that owns some fields and the methods that keep one
concern, in a file of its own under ``_core/`` (the room's docstring
explains it).  From the bottom up:

- ``bookkeeping``: configuration, counters, the user's hooks;
- ``chats``: the chat queue and the chat map (per-chat order);
- ``waiting``: callers waiting for room in a full chat;
- ``deadlines``: the running registry and the timer thread;
- ``outcomes``: running a task and deciding its outcome (retry, panic);
- ``pool``: workers, slots and the ready list (the global cap);
- ``loops``: chats handed to an event loop (coroutine tasks);
- ``intake``: submit, post and asubmit;

beside them ``budgets`` and ``limiter`` (pacing, an object of its own),
``items`` (``SendContext``), ``futures`` and ``constants``.  A room calls
its own methods and those of the rooms below it; the few calls to a room
above go through the whole object (the timer dispatching a chat, a worker
handing a chat to its loop).  ``DispatcherCore`` below is the wiring:
construction, configuration, the properties and the close paths.
``OutboundDispatcher`` (``_dispatcher.py``) adds the argument checks,
threads and the life cycle on top of it.

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

import threading
import weakref
from collections import OrderedDict, deque

from ._core.chats import ChatQueue, RingBuffer
from ._core.constants import _AWAKE, _BY_FORCE, _INF, _Wake, _allocate_lock, C_CANCELLED
from ._core.intake import _Intake
from ._core.items import SendContext
from ._core.limiter import _Limiter, _Window  # noqa: F401  (_Window: as in the compiled module)
from ._errors import Cancelled

__all__ = ["RingBuffer", "ChatQueue", "SendContext", "DispatcherCore"]


class DispatcherCore(_Intake):
    """The dispatcher core: its rooms, wired (see the module docstring)."""

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
        self._timer_wake = _Wake()
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
        self._submitted = self._rejected = 0
        self._counts = [0] * 5        # by outcome: C_COMPLETED ... C_TIMED_OUT
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
        self._max_attempts = retry.max_attempts if retry is not None else 1
        self._limiter = _Limiter(pacing, self._timer_needed, self._learning)
        # Whether every start must ask the limiter (else only a chat with a
        # pending retry delay or during a global pause does).  Set for good
        # by the first report_limit (_learning).
        self._limited = self._limiter.configured

    def _learning(self):
        # The first report_limit: from now on every start asks the limiter
        # (a dispatcher that never learns a limit never pays for it).
        self._limited = True

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

    def _pacing_state(self):
        """Sizes of the limiter's structures (for tests and debugging)."""
        return self._limiter.state()

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
                                     C_CANCELLED)
            for item in waiting:
                self._finish(item, Cancelled("the dispatcher was force-closed"),
                             C_CANCELLED)
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

