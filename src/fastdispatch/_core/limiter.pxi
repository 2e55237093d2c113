@cython.final
cdef class _Window:
    """The newest start times of one rate limit (a sliding window).

    A start is allowed at ``t`` when fewer than ``count`` starts fall in
    ``(t - per, t]``.  Besides the stamps of starts made, it counts
    ``_pending`` starts: admitted, not yet made (the task is about to be
    called).  Their time is not known yet, so they count as inside every
    window until they are stamped (``commit``) or given back (``release``).
    The ring keeps the ``count + 1`` newest stamps, oldest first (one more
    than the limit needs: after ``pop_newest`` it still knows the ``count``
    newest starts made before).  Guarded by the limiter's lock.
    """

    cdef readonly int count     # 0: no limit (kept so limit_for is not asked again)
    cdef readonly double per
    cdef double *_stamps        # a ring of count + 1 doubles
    cdef int _cap, _head, _len
    cdef int _pending           # starts admitted, not yet made
    cdef object key
    cdef bint dead
    cdef Py_ssize_t entries     # how many times this window is on the expiry list
    cdef double born            # when the limiter made it ("last start" until one)

    def __cinit__(self, limit, key=None):
        if limit is None:
            self.count, self.per = 0, 1.0
        else:
            self.count, self.per = limit.count, limit.per
        self._cap = self.count + 1
        self._stamps = <double *>PyMem_Malloc(self._cap * sizeof(double))
        if self._stamps == NULL:
            raise MemoryError()
        self.key = key

    def __dealloc__(self):
        PyMem_Free(self._stamps)

    cdef inline double _at(self, int i):
        # The i-th oldest stamp (0 <= i < _len).
        i += self._head
        if i >= self._cap:
            i -= self._cap
        return self._stamps[i]

    cpdef double next_start(self, long long granted=0):
        """Earliest time at which ``granted + 1`` more starts are allowed.

        Infinite when the pending starts alone fill the window: the next
        start then waits for one of them to be made (which wakes the timer).
        """
        cdef long long m
        if self.count == 0:
            return 0.0
        m = <long long>self._len + self._pending - self.count + granted + 1
        if m <= 0:
            return 0.0
        if m > self._len:
            return _INF
        return self._at(<int>(m - 1)) + self.per

    cpdef double last(self):
        return self._at(self._len - 1) if self._len else self.born

    cpdef add(self, double t):
        cdef int i
        if self._len < self._cap:
            i = self._head + self._len
            if i >= self._cap:
                i -= self._cap
            self._stamps[i] = t
            self._len += 1
        else:
            self._stamps[self._head] = t
            self._head += 1
            if self._head == self._cap:
                self._head = 0

    cpdef reserve(self):
        self._pending += 1

    cpdef commit(self, double t):
        """A reserved start was made at ``t`` (no earlier than any stamp)."""
        self._pending -= 1
        self.add(t)

    cpdef release(self):
        """A reserved start will not be made."""
        self._pending -= 1

    cpdef pop_newest(self):
        """Forget the newest stamp (a start the platform refused)."""
        if self._len:
            self._len -= 1


cdef long long _checked_remaining(object remaining) except -1:
    # report_limit's ``remaining``, checked.  An int subclass is
    # read as the plain int it holds (int.__int__), so that nothing
    # user-defined runs past this point (nor in the limiter's lock).
    if type(remaining) is not int:
        if isinstance(remaining, bool) or not isinstance(remaining, int):
            raise TypeError("report_limit: remaining must be an int, got %s"
                            % (type(remaining).__name__,))
        remaining = int.__int__(remaining)
    if remaining < 0:
        raise ValueError("report_limit: remaining must be >= 0, got %d" % (remaining,))
    if remaining > _MAX_REMAINING:
        return _MAX_REMAINING
    return remaining


cdef double _checked_reset_after(object reset_after) except -1.0:
    # ... its ``reset_after`` (an int or float subclass read as the plain
    # value it holds).
    cdef double delay
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
    if delay != delay or delay < 0 or delay > _TIMEOUT_MAX_D:
        raise ValueError("report_limit: reset_after must be >= 0 and at most "
                         "threading.TIMEOUT_MAX (%r), got %r" % (_TIMEOUT_MAX, delay))
    return delay


cdef object _checked_bucket(object bucket):
    # ... its ``bucket``: None or a non-empty str (a subclass read as the
    # plain str it holds).
    if type(bucket) is not str:
        if not isinstance(bucket, str):
            raise TypeError("report_limit: bucket must be a str or None, got %s"
                            % (type(bucket).__name__,))
        bucket = str.__str__(bucket)
    if not bucket:
        raise ValueError("report_limit: bucket must not be empty")
    return bucket


cdef bint _checked_scope(object scope) except -1:
    # ... its ``scope``: True for "global", False for "chat".
    if type(scope) is not str:
        if not isinstance(scope, str):
            raise TypeError("report_limit: scope must be 'chat' or 'global', got %s"
                            % (type(scope).__name__,))
        scope = str.__str__(scope)
    if scope == "chat":
        return False
    if scope == "global":
        return True
    raise ValueError("report_limit: scope must be 'chat' or 'global', got %r" % (scope,))


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


@cython.final
cdef class _Limiter:
    """Pacing: everything that decides when a chat may start its next task.

    The configured windows (each chat's, the global one), the line of chats
    waiting their turn under the global limit, the global pause of a
    ``RetryAfter(scope="global")``, the budgets the platform announced
    (``learn``: a chat's own, shared buckets, the global one), the wake-up
    schedule of parked chats, and the expiry lists that forget windows once
    their last start has left them and budgets once their reset passed.
    The core asks it once per start (``admit``), tells it when the
    start is made (``commit``, right before the task is called: the limit
    holds where the platform sees it) or will not be (``release``), and the
    timer thread runs ``tick``.  No thread ever sleeps in here.

    Lock: ``_lock`` guards every field below, and the pacing fields of a
    ``ChatQueue`` when the chat changes hands (its owner, a worker or the
    timer's schedule, uses them otherwise).  It is taken inside a queue's
    lock (``admit``), never the other way round, and the only lock taken
    inside it is the timer's (``_need_timer``, to wake the timer thread);
    the timer thread takes it with nothing else held.

    Starts in two steps.  ``admit`` reserves a place in each window the
    start counts against (``_Window._pending``); ``commit`` stamps them with
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
    core's ``_limited``, after which every start is admitted here.  Each
    budget has one entry on the forget schedule (``_bucket_heap``), pushed
    again when a later report moved its reset further: the tables hold only
    budgets whose reset has not passed.
    """

    cdef cython.pymutex _lock
    # The dispatcher core, borrowed: it owns this limiter and outlives it
    # (no reference cycle for the collector to find).
    cdef PyObject *_core
    cdef bint _closed                 # force_close(): the line and schedule are gone
    cdef double _pause_until          # a global RetryAfter (read unlocked as a hint)
    cdef list _wakeups                # heap of (time, seq, ChatQueue): parked chats
    cdef long long _seq
    cdef object _line                 # deque: chats waiting their turn (global limit)
    cdef Py_ssize_t _line_len
    cdef long long _granted           # starts granted from the line, not yet taken
    cdef _Window _glob
    cdef object _chat_limit, _limit_for
    cdef bint _chat_limits            # chats have windows (chat_limit or limit_for)
    cdef bint _configured             # every start must be admitted
    cdef dict _windows                # chat key -> _Window (outlives the chat's queue)
    cdef dict _expiry                 # per -> deque of _Window, by last start
    cdef long long _paced
    cdef long long _parked
    cdef bint _learned                # a report arrived: budgets may exist
    cdef dict _chat_buckets           # chat key -> _Bucket (scope="chat")
    cdef dict _shared                 # bucket string -> _Bucket
    cdef dict _links                  # chat key -> the shared _Bucket it last reported
    cdef _Bucket _gbucket             # the _Bucket of scope="global", or None
    cdef list _bucket_heap            # heap of (time, seq, _Bucket): when to forget

    def __cinit__(self):
        self._wakeups = []
        self._line = deque()
        self._windows = {}
        self._expiry = {}
        self._chat_buckets = {}
        self._shared = {}
        self._links = {}
        self._bucket_heap = []

    cdef int _configure(self, DispatcherCore core, object pacing) except -1:
        self._core = <PyObject *>core
        self._glob = None
        self._chat_limit = self._limit_for = None
        self._chat_limits = False
        if pacing is not None:
            if pacing.global_limit is not None:
                self._glob = _Window(pacing.global_limit)
            self._chat_limit = pacing.chat_limit
            self._limit_for = pacing.limit_for
            self._chat_limits = pacing.chat_limit is not None or pacing.limit_for is not None
        self._configured = self._glob is not None or self._chat_limits
        return 0

    cdef inline int _need_timer(self, double when) except -1:
        # Make sure the timer looks at its schedules no later than ``when``.
        (<DispatcherCore>self._core)._timer_needed(when)
        return 0

    # -- a chat's window --------------------------------------------------

    cdef _Window window_for(self, ChatQueue q):
        """The chat's live window, made on first use (``limit_for`` runs
        here, outside every lock; its failure is raised to the caller).

        A window outlives the chat's queue until its last start leaves it;
        the timer then forgets it.  Keyed like the chat map (a hash taken
        once, an ``__eq__`` that cannot raise), by a key of its own: the
        queue's key stops equalling others once the queue leaves the map.
        """
        cdef object chat_id = q.chat_id
        cdef object key = q._key
        cdef _Window window
        cdef _Window fresh
        if type(key) is _ChatKey:
            key = _rekey(<_ChatKey>key)
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
        with self._lock:
            window = self._windows.get(key)
            if window is None or window.dead:
                self._windows[key] = window = fresh
                # On the expiry list from birth: a window whose chat never
                # starts (a cancelled task) is forgotten too.
                fresh.born = monotonic()
                self._expire_later_locked(fresh)
        return window

    # -- one start: admit, then commit or release ---------------------------

    cdef int admit(self, ChatQueue q, _Window window) except -2:
        """May ``q`` start its next task now?  Else park it.

        Called by the chat's owner with ``q._lock`` held.  Returns _START
        (places reserved: ``q._reserved`` says where), _PARK (the chat is on
        the wake-up schedule or in the line; the timer hands it back) or
        _REFETCH (its window was forgotten meanwhile: fetch it again).
        """
        cdef _Window glob
        cdef _Bucket own = None, shared = None, gb = None
        cdef double now, until, t
        cdef int reserved = 0
        with self._lock:
            if self._closed:
                return _START  # force_close(): the core settles it as cancelled
            if window is not None and window.dead:
                q._window = None
                return _REFETCH
            now = monotonic()
            # Time rules first: a retry delay, a global pause, the chat's
            # own window.  A chat that must wait for them waits alone.
            until = q._not_before
            if self._pause_until != 0.0:
                if self._pause_until <= now:
                    self._pause_until = 0.0  # over: back to the fast path
                elif self._pause_until > until:
                    until = self._pause_until
            if window is not None and window.count:
                t = window.next_start(0)
                if t > until:
                    until = t
                    if t > now:
                        q._waited = True
            if self._learned:
                # The learned budgets that cover the chat: its own, the
                # shared bucket it last reported, the global one.
                if self._chat_buckets or self._links:
                    if q._lkey is None:
                        q._lkey = _learned_key(q)
                    if self._chat_buckets:
                        own = self._chat_buckets.get(q._lkey)
                    if self._links:
                        shared = self._links.get(q._lkey)
                gb = self._gbucket
                if own is not None and own.spent(now):
                    q._waited = True
                    if own.reset > until:
                        until = own.reset
                if shared is not None and shared.spent(now):
                    q._waited = True
                    if shared.reset > until:
                        until = shared.reset
                if gb is not None and gb.spent(now):
                    q._waited = True
                    if gb.reset > until:
                        until = gb.reset
            if until > now:
                if q._granted:
                    # Hand the granted start back to the line.
                    q._granted = False
                    self._granted -= 1
                    self._need_timer(now)
                self._park_locked(q, until)
                return _PARK
            q._not_before = 0.0
            # Then the global limit: chats take turns in one line.
            glob = self._glob
            if glob is not None:
                if q._granted:
                    q._granted = False
                    self._granted -= 1
                elif self._line_len or glob.next_start(self._granted) > now:
                    q._waited = True
                    self._line.append(q)
                    self._line_len += 1
                    self._parked += 1
                    self._need_timer(glob.next_start(self._granted))
                    return _PARK
                glob._pending += 1
                reserved = _GLOBAL
            if window is not None and window.count:
                window._pending += 1
                reserved |= _CHAT
            if self._learned:
                if own is not None and own.reset > now:
                    own.pending += 1
                    q._lres_chat = own
                    reserved |= _LEARNED
                if shared is not None and shared.reset > now:
                    shared.pending += 1
                    q._lres_shared = shared
                    reserved |= _LEARNED
                if gb is not None and gb.reset > now:
                    gb.pending += 1
                    q._lres_glob = gb
                    reserved |= _LEARNED
            q._reserved = reserved
            q._stamped = None
            if q._waited:
                q._waited = False
                self._paced += 1
        return _START

    cdef double commit(self, ChatQueue q) except -1.0:
        """The start ``admit`` reserved is being made: stamp it, now.

        Returns the stamp, which the task is called right after.
        """
        cdef double t
        cdef int reserved
        cdef _Window window
        with self._lock:
            t = monotonic()
            reserved = q._reserved
            q._reserved = 0
            if reserved & _LEARNED:
                self._take_learned_locked(q, True)
            if self._closed:
                return t  # force_close() dropped every window
            if reserved & _CHAT:
                window = q._window
                window.commit(t)
                self._expire_later_locked(window)
                q._stamped = window
                q._last_start = t
            if reserved & _GLOBAL:
                self._glob.commit(t)
                self._line_changed_locked()
        return t

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

    cdef int release(self, ChatQueue q) except -1:
        """The start ``admit`` reserved will not be made (the task was
        cancelled, or the dispatcher force-closed, before its call)."""
        cdef int reserved
        cdef _Window window
        with self._lock:
            reserved = q._reserved
            q._reserved = 0
            if reserved & _LEARNED:
                self._take_learned_locked(q, False)
            if self._closed:
                return 0
            if reserved & _CHAT:
                window = q._window
                window.release()
                self._expire_later_locked(window)
            if reserved & _GLOBAL:
                self._glob.release()
                self._line_changed_locked()
        return 0

    cdef int _line_changed_locked(self) except -1:
        # A pending global start was made or given back: the line's next
        # grant may have become possible (it was infinitely far while the
        # pending starts filled the window).  Every change that can make a
        # grant due wakes the timer, which then never sleeps past it.
        if self._line_len:
            self._need_timer(self._glob.next_start(self._granted))
        return 0

    cdef int _expire_later_locked(self, _Window window) except -1:
        # Put the window on the timer's list of windows to forget once
        # their last start has left them (one entry per start, in start
        # order).  The list of each ``per`` is looked up here and dropped by
        # the timer once empty, so that the table does not grow with every
        # distinct ``per`` ever seen.
        expiry = self._expiry.get(window.per)
        if expiry is None:
            expiry = self._expiry[window.per] = deque()
        if not expiry:
            self._need_timer(window.last() + window.per)
        expiry.append(window)
        window.entries += 1
        return 0

    # -- budgets the platform announced ---------------------------------------

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

    cdef int retry_at(self, ChatQueue q, double until, bint is_global,
                      bint refused) except -1:
        """The chat's next attempt may not start before ``until``.

        ``refused``: the platform turned the attempt away (``RetryAfter``),
        so it is not held against the chat's window as well: its stamp goes.
        """
        cdef _Window window
        with self._lock:
            if refused:
                window = q._stamped
                if (window is not None and not window.dead
                        and window.last() == q._last_start):
                    window.pop_newest()
            q._stamped = None
            if until > q._not_before:
                q._not_before = until
            if is_global and until > self._pause_until:
                self._pause_until = until
        return 0

    cdef int return_grant(self, ChatQueue q) except -1:
        """The chat left without using the start the line granted it."""
        with self._lock:
            if q._granted and not self._closed:  # force_close() reset the line
                q._granted = False
                self._granted -= 1
                if self._line_len:
                    self._need_timer(0.0)
        return 0

    cdef int _park_locked(self, ChatQueue q, double until) except -1:
        # Put an owned chat on the wake-up schedule.
        self._seq += 1
        _heappush(self._wakeups, (until, self._seq, q))
        self._parked += 1
        self._need_timer(until)
        return 0

    # -- the timer's side -----------------------------------------------------

    cdef double tick(self, double now, list ready) except? -1.0:
        """Move parked chats whose time came to ``ready``, grant starts from
        the global line, forget stale windows.  Return when to look again."""
        cdef double until = _INF
        cdef double stamp, per
        cdef ChatQueue q
        cdef _Window window
        cdef _Window glob = self._glob
        cdef list wakeups = self._wakeups
        cdef list emptied = None
        cdef list heap
        cdef _Bucket b
        with self._lock:
            while wakeups:
                if <double>wakeups[0][0] > now:
                    until = wakeups[0][0]
                    break
                ready.append(_heappop(wakeups)[2])
                self._parked -= 1
            line = self._line
            if self._line_len:
                if self._pause_until > now:
                    until = min(until, self._pause_until)
                else:
                    while self._line_len and glob.next_start(self._granted) <= now:
                        q = line.popleft()
                        self._line_len -= 1
                        q._granted = True
                        self._granted += 1
                        self._parked -= 1
                        ready.append(q)
                    if self._line_len:
                        # Infinite while pending starts fill the window:
                        # their commit (or release) wakes the timer.
                        until = min(until, glob.next_start(self._granted))
            for per_key, expiry in self._expiry.items():
                # An entry is stale when its window has later ones (it
                # started again since) or a start pending (its commit or
                # release adds a new entry).
                per = per_key
                while expiry:
                    window = expiry[0]
                    if window.entries == 1 and not window._pending:
                        stamp = window.last() + per
                        if stamp > now:
                            until = min(until, stamp)
                            break
                        self._forget_window_locked(window)
                    window.entries -= 1
                    expiry.popleft()
                if not expiry:
                    if emptied is None:
                        emptied = []
                    emptied.append(per_key)
            if emptied is not None:
                for per_key in emptied:
                    del self._expiry[per_key]
            heap = self._bucket_heap
            while heap:
                stamp = heap[0][0]
                if stamp > now:
                    until = min(until, stamp)
                    break
                b = <_Bucket>(_heappop(heap)[2])
                b.in_heap = False
                if b.reset > now:
                    self._forget_at_locked(b, b.reset)  # a later report moved it
                else:
                    self._forget_bucket_locked(b)
        return until

    cdef int _forget_window_locked(self, _Window window) except -1:
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
        return 0

    cdef list cancel_all(self):
        """force_close(): empty the schedule and the line; return the chats
        that were on them (owned by nobody now)."""
        cdef list parked
        cdef _Window window
        with self._lock:
            self._closed = True
            parked = [entry[2] for entry in self._wakeups]
            parked.extend(self._line)
            self._wakeups = []
            self._line.clear()
            self._line_len = 0
            self._parked = self._granted = 0
            self._pause_until = 0.0
            # Nothing starts any more: no window can constrain anything.
            for window in self._windows.values():
                window.dead = True
            self._windows.clear()
            self._expiry.clear()
            self._chat_buckets.clear()
            self._shared.clear()
            self._links.clear()
            self._gbucket = None
            self._bucket_heap = []
        return parked

    cdef tuple counters(self):
        with self._lock:
            return self._paced, self._parked

    cdef dict state(self):
        with self._lock:
            return {"windows": len(self._windows),
                    "expiry": sum([len(e) for e in self._expiry.values()]),
                    "expiry_lists": len(self._expiry),
                    "wakeups": len(self._wakeups), "line": len(self._line),
                    "granted": self._granted, "parked": self._parked,
                    "pending": self._glob._pending if self._glob is not None else 0,
                    "buckets": (len(self._chat_buckets) + len(self._shared)
                                + (self._gbucket is not None)),
                    "links": len(self._links), "bucket_heap": len(self._bucket_heap)}
