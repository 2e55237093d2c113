# Budgets a platform announces (``sc.report_limit``), for the limiter (G14, G16).
#
# The compiled twin of _core/budgets.py, whose docstring explains this room;
# included by _ringbuf.pyx.  What differs here: a budget is a few C fields;
# a start's reserved places are three fields of the queue.

cdef object _learned_key(ChatQueue q):
    # The key of a chat's learned budgets: like a window's, one that keeps
    # equalling the chat's other keys after its queue left the chat map.
    cdef object key = q._key
    if type(key) is _ChatKey:
        key = _rekey(<_ChatKey>key)
    return key


@cython.final
cdef class _Bucket:
    """A budget the platform announced (``sc.report_limit``): at most
    ``remaining`` more starts before ``reset`` (a monotonic time).

    ``pending`` counts starts admitted against it, not made yet (as in
    ``_Window``); ``commit`` spends one of ``remaining``.  Once ``reset``
    has passed it no longer applies, and the timer forgets it (``dead``):
    ``in_heap`` says it has its one entry on the limiter's forget schedule.
    A shared bucket knows the chats that reported it (``members``), whose
    links to it go with it.  Guarded by the limiter's lock.
    """

    cdef int kind
    cdef object key             # chat key, bucket string, or None (global)
    cdef long long remaining
    cdef double reset
    cdef long long pending
    cdef bint dead
    cdef bint in_heap
    cdef set members

    def __cinit__(self, int kind, key):
        self.kind = kind
        self.key = key
        if kind == _B_SHARED:
            self.members = set()

    cdef inline bint spent(self, double now):
        """Whether one more start now would overdraw it (it still applies)."""
        return self.reset > now and self.remaining - self.pending <= 0


cdef inline double _spent_until(_Bucket b, ChatQueue q, double now, double until):
    # ``until``, or the reset of budget ``b`` if it is spent and later.
    if b is not None and b.spent(now):
        q._waited = True
        if b.reset > until:
            return b.reset
    return until


cdef class _Budgets:
    """The budgets a platform announced (``report_limit``), for ``_Limiter``.

    A chat's own budget, the shared bucket it last reported and the global
    one; each with one entry on the forget schedule (``_bucket_heap``),
    pushed again when a later report moved its reset further, so the tables
    hold only budgets whose reset has not passed.  They cost nothing until
    the first report (it sets the core's ``_limited``: from then on every
    start asks the limiter).  ``_lock`` is the limiter's one lock (see
    ``_Limiter``); ``_seq`` orders both of its schedules.
    """

    cdef cython.pymutex _lock
    # The dispatcher core, borrowed: it owns this limiter and outlives it
    # (no reference cycle for the collector to find).
    cdef PyObject *_core
    cdef bint _closed                 # force_close(): the line and schedule are gone
    cdef long long _seq
    cdef bint _learned                # a report arrived: budgets may exist
    cdef dict _chat_buckets           # chat key -> _Bucket (scope="chat")
    cdef dict _shared                 # bucket string -> _Bucket
    cdef dict _links                  # chat key -> the shared _Bucket it last reported
    cdef _Bucket _gbucket             # the _Bucket of scope="global", or None
    cdef list _bucket_heap            # heap of (time, seq, _Bucket): when to forget

    def __cinit__(self):
        self._chat_buckets = {}
        self._shared = {}
        self._links = {}
        self._bucket_heap = []

    @cython.final
    cdef inline int _need_timer(self, double when) except -1:
        # Make sure the timer looks at its schedules no later than ``when``.
        (<DispatcherCore>self._core)._timer_needed(when)
        return 0

    @cython.final
    cdef int learn(self, ChatQueue q, long long remaining, double reset_after,
                   object bucket, bint is_global) except -1:
        """A task of ``q`` reported a budget (values checked by the caller).

        O(1): one lock, at most three dict operations; a bucket seen for
        the first time also gets its entry on the forget schedule.
        """
        cdef _Bucket b, old
        cdef double now, reset
        cdef object key
        with self._lock:
            if self._closed:
                return 0
            # Under the lock: a task may report from any thread, even after
            # its end, while the chat's owner admits its next start.
            key = q._lkey
            if key is None:
                key = q._lkey = _learned_key(q)
            if not self._learned:
                self._learned = True
                # From now on every start asks the limiter (a dispatcher
                # that never learns a limit never pays for it).
                (<DispatcherCore>self._core)._limited = True
            now = monotonic()
            reset = now + reset_after
            if bucket is not None:
                b = self._shared.get(bucket)
                if b is None:
                    b = _Bucket(_B_SHARED, bucket)
                    self._shared[bucket] = b
                elif b.reset <= now:
                    # Its reset passed (the timer has not forgotten it yet):
                    # the chats that reported it before are no longer in it.
                    self._unlink_members_locked(b)
                old = self._links.get(key)
                if old is not b:
                    if old is not None:
                        old.members.discard(key)
                    self._links[key] = b
                    b.members.add(key)
            elif is_global:
                b = self._gbucket
                if b is None:
                    b = self._gbucket = _Bucket(_B_GLOBAL, None)
            else:
                b = self._chat_buckets.get(key)
                if b is None:
                    b = _Bucket(_B_CHAT, key)
                    self._chat_buckets[key] = b
            b.remaining = remaining
            b.reset = reset
            if not b.in_heap:
                self._forget_at_locked(b, reset)
        return 0

    @cython.final
    cdef int _forget_at_locked(self, _Bucket b, double when) except -1:
        # The bucket's one entry on the forget schedule; the timer is told
        # when it becomes the earliest.
        b.in_heap = True
        self._seq += 1
        entry = (when, self._seq, b)
        _heappush(self._bucket_heap, entry)
        if self._bucket_heap[0] is entry:
            self._need_timer(when)
        return 0

    @cython.final
    cdef int _unlink_members_locked(self, _Bucket b) except -1:
        # The chats that reported shared bucket ``b`` leave it.
        cdef dict links = self._links
        for key in b.members:
            if links.get(key) is b:
                del links[key]
        b.members = set()
        if not links:
            links.clear()
        return 0

    @cython.final
    cdef int _forget_bucket_locked(self, _Bucket b) except -1:
        # Its reset passed: the budget no longer applies and goes, with the
        # links of the chats that reported it.  Chat keys' __eq__ cannot
        # raise (see _ChatKey); the timer goes on whatever happens.
        cdef dict table = None
        b.dead = True
        try:
            if b.kind == _B_CHAT:
                table = self._chat_buckets
                if table.get(b.key) is b:
                    del table[b.key]
            elif b.kind == _B_SHARED:
                table = self._shared
                if table.get(b.key) is b:
                    del table[b.key]
                self._unlink_members_locked(b)
            elif self._gbucket is b:
                self._gbucket = None
            if table is not None and not table:
                # A dict keeps its largest table after deletions: give back
                # the memory of a burst of chats.
                table.clear()
        except BaseException:
            logger.exception("could not forget a learned rate limit")
        return 0

    @cython.final
    cdef inline _Bucket _own_locked(self, ChatQueue q):
        # The chat's own budget, or None.
        if not self._chat_buckets:
            return None
        if q._lkey is None:
            q._lkey = _learned_key(q)
        return self._chat_buckets.get(q._lkey)

    @cython.final
    cdef inline _Bucket _shared_locked(self, ChatQueue q):
        # The shared bucket the chat last reported, or None.
        if not self._links:
            return None
        if q._lkey is None:
            q._lkey = _learned_key(q)
        return self._links.get(q._lkey)

    @cython.final
    cdef double _learned_until_locked(self, ChatQueue q, double now,
                                      double until) except? -1.0:
        # ``until``, or the latest reset among the spent budgets that cover
        # the chat if later (the chat waits for it).
        until = _spent_until(self._own_locked(q), q, now, until)
        until = _spent_until(self._shared_locked(q), q, now, until)
        return _spent_until(self._gbucket, q, now, until)

    @cython.final
    cdef int _reserve_learned_locked(self, ChatQueue q, double now) except -1:
        # Hold a place in each budget that covers the chat (spent or given
        # back by _take_learned_locked): _LEARNED if any, else 0.
        cdef int reserved = 0
        cdef _Bucket b = self._own_locked(q)
        if b is not None and b.reset > now:
            b.pending += 1
            q._lres_chat = b
            reserved = _LEARNED
        b = self._shared_locked(q)
        if b is not None and b.reset > now:
            b.pending += 1
            q._lres_shared = b
            reserved = _LEARNED
        b = self._gbucket
        if b is not None and b.reset > now:
            b.pending += 1
            q._lres_glob = b
            reserved = _LEARNED
        return reserved

    @cython.final
    cdef inline int _take_learned_locked(self, ChatQueue q, bint spend) except -1:
        # The learned budgets holding a place for q's start: the start is
        # made (``spend``: one of each budget goes) or given back.
        cdef _Bucket b
        b = q._lres_chat
        if b is not None:
            q._lres_chat = None
            b.pending -= 1
            if spend:
                b.remaining -= 1
        b = q._lres_shared
        if b is not None:
            q._lres_shared = None
            b.pending -= 1
            if spend:
                b.remaining -= 1
        b = q._lres_glob
        if b is not None:
            q._lres_glob = None
            b.pending -= 1
            if spend:
                b.remaining -= 1
        return 0
