# Pacing: when may a chat start its next task (G12, G13, G15).
#
# The compiled twin of _core/limiter.py, whose docstring explains this room;
# included by _ringbuf.pyx.  What differs here: a window is a C ring of
# doubles.

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

    cpdef restamp_newest(self, double t):
        """Move the newest stamp to ``t`` (no earlier than it)."""
        cdef int i
        if self._len:
            i = self._head + self._len - 1
            if i >= self._cap:
                i -= self._cap
            self._stamps[i] = t


@cython.final
cdef class _Limiter(_Budgets):
    """Pacing: everything that decides when a chat may start its next task.

    The configured windows (each chat's, the global one), the lines of
    chats waiting their turn under the global limit, the global pause of a
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

    Two lines wait for the global limit, each first come, first served:
    ``_bursts`` holds the chats whose own window allows a burst (a group's
    20 a minute) and ``_line`` the others; while both wait they take turns.
    A burst window's room is lost if it is not used while it lasts, and it
    sets the pace of its chat for every later window: served once per turn
    of a line of a hundred private chats, a group's 20 starts would spread
    over seconds, and so would every later 20.  Taking every other start,
    such a chat uses its room as soon as it is free; the others keep at
    least half of the global limit.

    Learned budgets cost nothing until the first report: it sets the
    core's ``_limited``, after which every start is admitted here.  Each
    budget has one entry on the forget schedule (``_bucket_heap``), pushed
    again when a later report moved its reset further: the tables hold only
    budgets whose reset has not passed.
    """

    cdef double _pause_until          # a global RetryAfter (read unlocked as a hint)
    cdef list _wakeups                # heap of (time, seq, ChatQueue): parked chats
    cdef object _line                 # deque: chats waiting their turn (global limit)
    cdef object _bursts               # deque: those whose own window allows a burst
    cdef Py_ssize_t _line_len         # chats in both lines
    cdef bint _turn                   # the next grant is the bursts' (when both wait)
    cdef long long _granted           # starts granted from the line, not yet taken
    cdef _Window _glob
    cdef object _chat_limit, _limit_for
    cdef bint _chat_limits            # chats have windows (chat_limit or limit_for)
    cdef bint _configured             # every start must be admitted
    cdef dict _windows                # chat key -> _Window (outlives the chat's queue)
    cdef dict _expiry                 # per -> deque of _Window, by last start
    cdef long long _paced
    cdef long long _parked

    def __cinit__(self):
        self._wakeups = []
        self._line = deque()
        self._bursts = deque()
        self._windows = {}
        self._expiry = {}

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
        window = fd_dict_get(self._windows, key)
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
                until = self._learned_until_locked(q, now, until)
            if until > now:
                if q._granted:
                    # Hand the granted start back to the line.
                    q._granted = False
                    self._granted -= 1
                    self._need_timer(now)
                self._park_locked(q, until)
                return _PARK
            q._not_before = 0.0
            # Then the global limit: chats take turns, in two lines.
            glob = self._glob
            if glob is not None:
                if q._granted:
                    q._granted = False
                    self._granted -= 1
                elif self._line_len or glob.next_start(self._granted) > now:
                    self._join_line_locked(q, window)
                    return _PARK
                glob._pending += 1
                reserved = _GLOBAL
            if window is not None and window.count:
                window._pending += 1
                reserved |= _CHAT
            if self._learned:
                reserved |= self._reserve_learned_locked(q, now)
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

    cdef int _join_line_locked(self, ChatQueue q, _Window window) except -1:
        # The chat waits for the global limit, in the line of its kind.
        q._waited = True
        if window is not None and window.count > 1:
            self._bursts.append(q)
        else:
            self._line.append(q)
        self._line_len += 1
        self._parked += 1
        self._need_timer(self._glob.next_start(self._granted))
        return 0

    cdef ChatQueue _next_in_line_locked(self):
        # The chat the next global start goes to: the lines take turns.
        self._line_len -= 1
        if self._bursts and (self._turn or not self._line):
            self._turn = False
            return self._bursts.popleft()
        self._turn = True
        return self._line.popleft()

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

    cdef int answered(self, ChatQueue q) except -1:
        """The chat's attempt has ended (its answer came): in a window
        with room for a burst, the start now counts from here.

        The platform counted the request when it arrived, somewhere between
        the start and the answer; on a loaded machine that can be a second
        after the start, more than any margin.  A burst window (a group's
        20 a minute) spaced from the starts then lets the next burst reach
        the platform too early, a 429 that costs the chat its wait; spaced
        from the answers it cannot, and the delay is paid once per window
        rather than once per message.  A chat runs one attempt at a time,
        so the window's newest stamp is this attempt's (unless it was
        refused or the window forgotten since: nothing to move then).
        """
        cdef _Window window
        cdef double t
        with self._lock:
            window = q._stamped
            if (window is not None and window.count > 1 and not window.dead
                    and not self._closed and window.last() == q._last_start):
                t = monotonic()
                window.restamp_newest(t)
                q._last_start = t
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
            if self._line_len:
                if self._pause_until > now:
                    until = min(until, self._pause_until)
                else:
                    while self._line_len and glob.next_start(self._granted) <= now:
                        q = self._next_in_line_locked()
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
            parked.extend(self._bursts)
            self._wakeups = []
            self._line.clear()
            self._bursts.clear()
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
                    "wakeups": len(self._wakeups),
                    "line": len(self._line) + len(self._bursts),
                    "granted": self._granted, "parked": self._parked,
                    "pending": self._glob._pending if self._glob is not None else 0,
                    "buckets": (len(self._chat_buckets) + len(self._shared)
                                + (self._gbucket is not None)),
                    "links": len(self._links), "bucket_heap": len(self._bucket_heap)}
