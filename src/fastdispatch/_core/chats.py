"""The chat map and the chat queue: order within a chat (G1, G2, G4, G5).

A ``ChatQueue`` is one chat's ring of waiting tasks (fixed capacity: a
full chat refuses, G4), the ``running`` flag that makes one worker its
owner (G2), the task a retry brings back to its head, and the line of
callers waiting for room (``_Waiter``: ``_admit_locked`` moves the oldest
into the ring when a task leaves it, so nobody jumps the line).

``_ChatMap`` keeps chat key -> queue for the chats that have work.  A
queue is inserted on a miss (``_insert``: setdefault keeps whichever
queue another submitter installed first) and removed by its owner when
it empties, under the queue's lock; ``_removed`` says so in the same
critical section, so a submitter that found the queue just before its
removal looks it up again instead of pushing onto an orphan (G5).  Chat
ids are user code: ``_ChatKey`` takes the hash once and gives the map an
``__eq__`` that cannot raise.

Locks: ``ChatQueue.lock`` (the queue's items, ``running``, its waiters,
its removal from the map); ``_map_lock`` (an insertion, against resetting
the map's table when its last chat leaves, ``_remove_locked``).
"""

from collections import deque
import operator
import sys

from .bookkeeping import _Bookkeeping
from .constants import (
    _allocate_lock, _ELSEWHERE, _KEEP_CHATS, _W_ADMITTED, _W_WAITING, _Wake, _WORKERS)


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


class _Waiter:
    """A caller waiting for room in a full chat (``block=True``).

    ``wake`` is a wake (a SimpleQueue, as an idle worker's: see _sleep) in
    which the waker puts one token (a thread), or a Future of the caller's
    event loop (an ``asubmit``).  ``holder`` is the chat queue of the
    running task the caller waits inside, if any.
    """

    __slots__ = ("item", "q", "loop", "wake", "state", "queue_len", "holder")

    def __init__(self, item, q, loop, holder):
        self.item = item
        self.q = q
        self.loop = loop
        if loop is None:
            self.wake = _Wake()
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


def _peek_head(q):
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


def _rekey(key):
    # A fresh key for the same chat id and hash (never marked _removing).
    return _ChatKey(key.chat_id, key._hash)


def _retry_key(q, key):
    # The key to look the chat up again with, after queue ``q`` (found or
    # inserted with ``key``) left the map.  If ``q`` was the queue we
    # inserted, ``key`` is its key, now marked _removing: it equals no other
    # key, so the next insert would miss the chat's live queue and add a
    # second one (G5).  Then a fresh key for the same chat id and hash.
    if q._key is key and type(key) is _ChatKey:
        return _rekey(key)
    return key


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
        if q.waiters is not None:
            _admit_locked(q)
    else:
        return None
    item._queue_len = len(q._items)
    return item


class _ChatMap(_Bookkeeping):
    """The chat map: chat key -> ChatQueue, for the chats that have work."""

    __slots__ = ("_queues", "_map_lock", "_map_high")

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

    def _insert(self, chat_id, key):
        # A new queue for the chat, in the map; or the one another submitter
        # installed first (setdefault keeps it).  Allocated only on a miss.
        fresh = ChatQueue(chat_id, self._queue_size)
        fresh._key = key
        fresh.core_ref = self._ref
        queues = self._queues
        with self._map_lock:
            q = queues.setdefault(key, fresh)
            if q is fresh:
                self._map_high = max(self._map_high, len(queues))
        return q

    def _take_head_here_locked(self, q, here):
        # With q.lock held: the chat's next task if it runs here, else
        # _ELSEWHERE (q.elsewhere says where), or None when it has none.
        if self._async_used:
            head = _peek_head(q)
            if head is not None and head._loop is not here:
                q.elsewhere = head._loop if head._loop is not None else _WORKERS
                return _ELSEWHERE
        return _take_head_locked(q)

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
