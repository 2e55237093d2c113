# The chat map and the chat queue: order within a chat (G1, G2, G4, G5).
#
# The compiled twin of _core/chats.py, whose docstring explains this room;
# included by _ringbuf.pyx.  What differs here: the map is cut in FD_STRIPES
# parts (_Stripe), each with its own dict and lock, so that free-threaded
# submitters of different chats do not meet; the ring is a C array; a queue
# links into the ready list by a C field.

cdef Py_ssize_t _checked_capacity(object capacity) except -1:
    # The same limits and errors as the pure-Python core (the bare C ssize_t
    # conversion would raise OverflowError naming nothing).
    cdef Py_ssize_t n
    try:
        n = capacity
    except OverflowError:
        if capacity < 0:
            n = 0
        else:
            raise ValueError("capacity must be at most sys.maxsize (%d), got %r"
                             % (sys.maxsize, capacity)) from None
    if n < 1:
        raise ValueError("capacity must be at least 1")
    return n


cdef class RingBuffer:
    """A FIFO of fixed capacity.  ``push`` is O(1) and refuses when full.

    The slots are allocated lazily, doubling up to ``capacity``: most chats
    never hold more than a few waiting tasks, and a dispatcher configured
    with a deep ``queue_size`` must not pay for it on every new chat.
    """

    cdef list _slots          # None where empty; len(_slots) <= capacity
    cdef Py_ssize_t _size     # len(_slots)
    cdef Py_ssize_t _head
    cdef Py_ssize_t _count
    cdef readonly Py_ssize_t capacity

    def __init__(self, capacity):
        self._init(_checked_capacity(capacity))

    cdef inline void _init(self, Py_ssize_t capacity):
        # Also (re)sets the indexes: __init__ called again empties the buffer
        # instead of leaving them pointing past the new slots.
        self._head = 0
        self._count = 0
        self.capacity = capacity
        self._size = 4 if capacity > 4 else capacity
        self._slots = [None] * self._size

    cdef int _grow(self) except -1:
        # Double the slots (up to capacity), unrolling the ring to start at 0.
        cdef Py_ssize_t size = self._size * 2
        if size > self.capacity:
            size = self.capacity
        cdef list slots = self._slots[self._head:] + self._slots[:self._head]
        slots.extend([None] * (size - self._size))
        self._slots = slots
        self._size = size
        self._head = 0
        return 0

    cdef inline bint _push(self, object item) except -1:
        cdef Py_ssize_t i
        if self._count >= self._size:
            if self._count >= self.capacity:
                return False
            self._grow()
        i = self._head + self._count
        if i >= self._size:
            i -= self._size
        self._slots[i] = item
        self._count += 1
        return True

    cdef inline object _pop(self):
        cdef object item = self._slots[self._head]
        self._slots[self._head] = None
        self._head += 1
        if self._head == self._size:
            self._head = 0
        self._count -= 1
        return item

    cdef list _clear(self):
        cdef list items = []
        while self._count:
            items.append(self._pop())
        self._head = 0
        return items

    # The Python-facing methods lock the object itself (a no-op with the
    # GIL); the dispatcher never calls them: it uses the cdef methods above
    # under ChatQueue._lock.

    @cython.critical_section
    def push(self, item):
        """Append ``item``; return False (and store nothing) when full."""
        return self._push(item)

    @cython.critical_section
    def pop(self):
        """Remove and return the oldest item; raise IndexError when empty."""
        if self._count == 0:
            raise IndexError("pop from an empty RingBuffer")
        return self._pop()

    @cython.critical_section
    def clear(self):
        """Remove every item and return them, oldest first."""
        return self._clear()

    @cython.critical_section
    def __len__(self):
        return self._count

    @property
    @cython.critical_section
    def full(self):
        return self._count >= self.capacity


@cython.final
cdef class ChatQueue(RingBuffer):
    """One chat's waiting tasks, its lock, and whether a worker owns it."""

    cdef readonly object chat_id
    cdef cython.pymutex _lock  # guards the ring, _running, _retry_item, map removal
    # True from the moment the chat is scheduled until its worker removes
    # the queue from the chat map; at most one worker owns it meanwhile
    # (a parked chat stays owned: it is on the timer's schedule).
    cdef bint _running
    cdef ChatQueue _next_ready  # ready list link; guarded by the pool lock
    cdef object _key            # the chat map's key (see _chat_key)
    cdef _Stripe _stripe        # the part of the chat map that holds it
    cdef bint _removed          # out of the chat map for good; under _lock
    # A task that will run again: it goes before every waiting task and
    # does not count against the capacity (it was accepted once).
    cdef SendContext _retry_item
    # Pacing, owned by whoever owns the chat (its worker, or the timer while
    # it is parked); under the limiter's lock where shared.
    cdef double _not_before     # monotonic time before which it may not start
    cdef bint _granted          # holds a start granted by the global line
    cdef bint _waited           # its next start had to wait for a limit
    cdef _Window _window        # its rate-limit window, while alive
    # The start admitted but not yet made (see _Limiter): which windows
    # hold a place for it (_CHAT | _GLOBAL).
    cdef int _reserved
    cdef _Window _stamped       # the chat window its last start went into
    cdef double _last_start     # ... and when
    # Where its next task must run when that is not here (an event loop, or
    # _WORKERS): set by the owner for itself.
    cdef object _elsewhere
    # A weak reference to the core whose limiter its tasks report learned
    # limits to (set by the core when it makes the queue; None for a queue
    # built by hand): a SendContext kept after its dispatcher is gone must
    # not keep the limiter alive, nor reach it.  Then the key of its
    # learned budgets (made on first use) and the learned budgets that hold
    # a place for its admitted start (both under the limiter's lock).
    cdef object _core_ref
    cdef object _lkey
    cdef _Bucket _lres_chat, _lres_shared, _lres_glob
    # Callers waiting for room (block=True), oldest first (a deque), or
    # None: while there are any the ring is full (a task leaving it lets the
    # oldest waiter's task in, in the same critical section), so a call that
    # does not wait finds no room either.  _woken: the waiters let in under
    # the lock, to wake once it is released.  Both under _lock.
    cdef object _waiters
    cdef list _woken
    # The chats this chat's running task waits for room in, or None (under
    # the core's _wait_lock).
    cdef list _blocked_on
    # Its owner goes on with it holding the max_inflight slot of the
    # coroutine task that just ended (see DispatcherCore._aio_done).
    cdef bint _slot_held

    def __init__(self, chat_id, capacity):
        RingBuffer.__init__(self, capacity)
        self.chat_id = chat_id
        self._key = chat_id


@cython.final
cdef class _Stripe:
    """One part of the chat map: the chats whose key hashes to it.

    On free-threaded CPython every insert into a dict and every removal
    takes that dict's lock; with one map, a producer adding a chat and a
    worker removing an emptied one meet on it (and on its cache lines) at
    every turn.  The map is cut in FD_STRIPES parts (64 there, one with the
    GIL, where nothing runs at the same time anyway).
    """

    cdef dict queues              # key -> ChatQueue (dict ops are atomic)
    cdef cython.pymutex lock      # inserts into queues vs. its reset when empty
    cdef long long high           # the most chats it held since its last reset:
                                  # written under lock, read atomically

    def __cinit__(self):
        self.queues = {}


@cython.final
cdef class _ChatKey:
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

    cdef readonly object chat_id
    cdef Py_hash_t _hash
    cdef bint _removing   # set under its queue's lock, before the removal

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        if self._removing:
            return self is other
        if type(other) is _ChatKey:
            if (<_ChatKey>other)._removing:
                return self is other
            other_id = (<_ChatKey>other).chat_id
        else:
            other_id = other
        if self.chat_id is other_id:
            return True
        try:
            return bool(self.chat_id == other_id)
        except BaseException:
            return False


cdef _ChatKey _rekey(_ChatKey key):
    # A fresh key for the same chat id and hash (never marked _removing).
    cdef _ChatKey fresh = _ChatKey.__new__(_ChatKey)
    fresh.chat_id = key.chat_id
    fresh._hash = key._hash
    return fresh


cdef object _retry_key(ChatQueue q, object key):
    # The key to look the chat up again with, after queue ``q`` (found or
    # inserted with ``key``) left the map.  If ``q`` was the queue we
    # inserted, ``key`` is its key, now marked _removing: it equals no other
    # key, so the next insert would miss the chat's live queue and add a
    # second one (G5).  Then a fresh key for the same chat id and hash.
    if q._key is key and type(key) is _ChatKey:
        return _rekey(<_ChatKey>key)
    return key


cdef inline object _chat_key(object chat_id):
    """The chat map's key for ``chat_id`` (itself for a plain int or str)."""
    if type(chat_id) is int or type(chat_id) is str:
        return chat_id
    return _wrap_chat_id(chat_id)


cdef object _wrap_chat_id(object chat_id):
    cdef _ChatKey key
    cdef Py_hash_t hash_value
    try:
        hash_value = hash(chat_id)
    except TypeError:
        raise TypeError("chat_id must be hashable, got %r"
                        % (type(chat_id).__name__,)) from None
    key = _ChatKey.__new__(_ChatKey)
    key.chat_id = chat_id
    key._hash = hash_value
    return key


@cython.final
cdef class _Waiter:
    """A caller waiting for room in a full chat (``block=True``).

    ``wake`` is a wake (a SimpleQueue, as an idle worker's: see _sleep) in
    which the waker puts one token (a thread), or a Future of the caller's
    event loop (an ``asubmit``).  ``holder`` is the chat queue of the
    running task the caller waits inside, if any.
    """

    cdef SendContext item
    cdef ChatQueue q
    cdef object loop
    cdef object wake
    cdef int state              # under q._lock
    cdef Py_ssize_t queue_len
    cdef ChatQueue holder


cdef _Waiter _new_waiter(SendContext item, ChatQueue q, object loop, ChatQueue holder):
    cdef _Waiter w = _Waiter.__new__(_Waiter)
    w.item = item
    w.q = q
    w.loop = loop
    if loop is None:
        w.wake = _Wake()
    else:
        w.wake = loop.create_future()
    w.state = _W_WAITING
    w.holder = holder
    return w


cdef int _admit_locked(ChatQueue q) except -1:
    # With q._lock held, a task just left the ring: the oldest waiter's
    # task takes its place (so the ring stays full while anyone waits, and
    # nobody jumps the line).
    cdef _Waiter w = <_Waiter>q._waiters.popleft()
    if not q._waiters:
        q._waiters = None
    q._push(w.item)
    w.state = _W_ADMITTED
    w.queue_len = q._count
    if q._woken is None:
        q._woken = [w]
    else:
        q._woken.append(w)
    return 0


cdef inline SendContext _take_head_locked(ChatQueue q):
    # With q._lock held: the chat's next task (a retried one first, then the
    # oldest waiting), or None when it has none.
    cdef SendContext item = q._retry_item
    if item is not None:
        q._retry_item = None
    elif q._count:
        item = <SendContext>q._pop()
        if q._waiters is not None:
            _admit_locked(q)
    else:
        return None
    item._queue_len = q._count
    return item


cdef inline SendContext _peek_head(ChatQueue q):
    # With q._lock held: the chat's next task, left in place.
    if q._retry_item is not None:
        return q._retry_item
    if q._count:
        return <SendContext>q._slots[q._head]
    return None




cdef class _ChatMap(_Bookkeeping):
    """The chat map: chat key -> ChatQueue, for the chats that have work."""

    # The chat map: chat key -> ChatQueue, in FD_STRIPES parts (_Stripe).
    # How many chats it holds is _chats (a counter, atomic: counted as
    # they go in and out).
    cdef list _stripes

    cdef inline _Stripe _stripe_for(self, object key):
        # The part of the chat map for a key made by _chat_key: its hash
        # (cached for a wrapped chat id, so no user code runs), its bits
        # mixed so that ids that are multiples of FD_STRIPES spread too.
        cdef Py_hash_t h
        cdef size_t i = 0
        if FD_STRIPES > 1:
            if type(key) is _ChatKey:
                h = (<_ChatKey>key)._hash
            else:
                h = hash(key)   # an int or a str
            i = (<size_t>h * <size_t>0x9E3779B97F4A7C15ULL) >> (8 * sizeof(size_t) - FD_STRIPE_BITS)
        return <_Stripe>self._stripes[i]


    cdef ChatQueue _insert(self, object chat_id, object key, _Stripe stripe):
        # A new queue for the chat, in the map; or the one another submitter
        # installed first (setdefault keeps it).  Allocated only on a miss.
        cdef ChatQueue fresh = ChatQueue(chat_id, self._queue_size)
        cdef ChatQueue q
        cdef Py_ssize_t held
        fresh._key = key
        fresh._stripe = stripe
        fresh._core_ref = self._ref
        with stripe.lock:
            q = stripe.queues.setdefault(key, fresh)
            if q is fresh:
                FD_ADD(&self._chats, 1)
                held = len(stripe.queues)
                if held > stripe.high:
                    FD_STORE(&stripe.high, held)
        return q
    def queue_len(self, chat_id):
        """Number of tasks of ``chat_id`` waiting (the running one excluded)."""
        cdef ChatQueue q
        key = _chat_key(chat_id)
        q = fd_dict_get(self._stripe_for(key).queues, key)
        if q is None:
            return 0
        with q._lock:
            return q._count

    @property
    def active_chats(self):
        """Chats that have waiting or running work."""
        return FD_LOAD(&self._chats)

    cdef object _take_head_here_locked(self, ChatQueue q, object here):
        # With q._lock held: the chat's next task if it runs here, else
        # _ELSEWHERE (q._elsewhere says where), or None when it has none.
        cdef SendContext head
        if self._async_used:
            head = _peek_head(q)
            if head is not None and head._loop is not here:
                q._elsewhere = head._loop if head._loop is not None else _WORKERS
                return _ELSEWHERE
        return _take_head_locked(q)

    cdef int _remove_locked(self, ChatQueue q) except -1:
        # With q._lock held: take q out of the chat map.  A dict never
        # shrinks on deletion, so after a burst of 100k chats its table would
        # keep its peak size for good; when the last chat of its part leaves,
        # reset that part (under its lock, so that no insert can slip in
        # between) if it grew past FD_KEEP_CHATS since its last reset.  A
        # part that stayed smaller keeps its small table and this path takes
        # no lock: a producer inserting into the part held it, and on
        # free-threaded CPython that lock is where producers and workers
        # would meet at every emptied chat.
        cdef _Stripe stripe = q._stripe
        cdef dict queues
        if stripe is None:      # a queue built by hand: never in the map
            q._removed = True
            return 0
        queues = stripe.queues
        if not q._removed:
            q._removed = True
            key = q._key
            if type(key) is _ChatKey:
                (<_ChatKey>key)._removing = True
            if queues.pop(key, None) is not None:
                FD_ADD(&self._chats, -1)
        if not queues and FD_LOAD(&stripe.high) > FD_KEEP_CHATS:
            with stripe.lock:
                if not queues:
                    queues.clear()
                    FD_STORE(&stripe.high, 0)
        return 0
