"""Pacing: when may a chat start its next task (G12, G13, G15).

``_Window`` is one rate limit's memory (the last starts, within ``per``);
``_Limiter`` decides each start: its class docstring explains the two-step
start (admit, then commit or release), the line of chats under the global
limit, and parking.  One lock guards it all (``_Limiter.lock``), taken
inside a queue's lock and never the other way round.
"""

from collections import deque
import heapq
from time import monotonic

from .._errors import _safe_repr
from ..pacing import RateLimit

from .budgets import _Budgets
from .chats import _ChatKey
from .constants import _CHAT, _GLOBAL, _INF, _LEARNED, logger, _PARK, _REFETCH, _START


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

    def restamp_newest(self, t):
        """Move the newest stamp to ``t`` (no earlier than it)."""
        self.stamps[-1] = t


class _Limiter(_Budgets):
    """Pacing: everything that decides when a chat may start its next task.

    The configured windows (each chat's, the global one), the lines of
    chats waiting their turn under the global limit, the global pause of a
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

    Two lines wait for the global limit, each first come, first served:
    ``bursts`` holds the chats whose own window allows a burst (a group's
    20 a minute) and ``line`` the others; while both wait they take turns.
    A burst window's room is lost if it is not used while it lasts, and it
    sets the pace of its chat for every later window: served once per turn
    of a line of a hundred private chats, a group's 20 starts would spread
    over seconds, and so would every later 20.  Taking every other start,
    such a chat uses its room as soon as it is free; the others keep at
    least half of the global limit.

    Learned budgets cost nothing until the first report: it sets the
    core's ``_limited`` (``on_learn``), after which every start is
    admitted here.  Each budget has one entry on the forget schedule
    (``bucket_heap``), pushed again when a later report moved its reset
    further: the tables hold only budgets whose reset has not passed.
    """

    __slots__ = ("pause_until", "wakeups", "line", "bursts", "turn", "granted", "glob",
                 "chat_limit", "limit_for", "chat_limits", "configured", "windows", "expiry",
                 "paced", "parked")

    def __init__(self, pacing, need_timer, on_learn=None):
        super().__init__(need_timer, on_learn)
        self.pause_until = 0.0        # a global RetryAfter: no start before this
        self.wakeups = []             # heap of (time, seq, ChatQueue): parked chats
        self.line = deque()           # chats waiting their turn under the global limit
        self.bursts = deque()         # those whose own window allows a burst (a group)
        self.turn = False             # the next grant is the bursts' (when both wait)
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
            if self.learned:
                until = self._learned_until_locked(q, now, until)
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
            # Then the global limit: chats take turns, in two lines.
            glob = self.glob
            if glob is not None:
                if q.granted:
                    q.granted = False
                    self.granted -= 1
                elif self.line or self.bursts or glob.next_start(self.granted) > now:
                    self._join_line_locked(q, window)
                    return _PARK
                glob.reserve()
                reserved = _GLOBAL
            if window is not None and window.count:
                window.reserve()
                reserved |= _CHAT
            if self.learned:
                reserved |= self._reserve_learned_locked(q, now)
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
                self._take_learned_locked(q, True)
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
                self._take_learned_locked(q, False)

    def _join_line_locked(self, q, window):
        # The chat waits for the global limit, in the line of its kind.
        q.waited = True
        if window is not None and window.count > 1:
            self.bursts.append(q)
        else:
            self.line.append(q)
        self.parked += 1
        self.need_timer(self.glob.next_start(self.granted))

    def _next_in_line_locked(self):
        # The chat the next global start goes to: the lines take turns.
        if self.bursts and (self.turn or not self.line):
            self.turn = False
            return self.bursts.popleft()
        self.turn = True
        return self.line.popleft()

    def _line_changed_locked(self):
        # A pending global start was made or given back: the line's next
        # grant may have become possible (it was infinitely far while the
        # pending starts filled the window).  Every change that can make a
        # grant due wakes the timer, which then never sleeps past it.
        if self.line or self.bursts:
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

    def answered(self, q):
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
        with self.lock:
            window = q.stamped
            if (window is not None and window.count > 1 and not window.dead
                    and not self.closed and window.last() == q.last_start):
                t = monotonic()
                window.restamp_newest(t)
                q.last_start = t

    def return_grant(self, q):
        """The chat left without using the start the line granted it."""
        with self.lock:
            if q.granted and not self.closed:  # force_close() reset the line
                q.granted = False
                self.granted -= 1
                if self.line or self.bursts:
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
            line, bursts = self.line, self.bursts
            if line or bursts:
                if self.pause_until > now:
                    until = min(until, self.pause_until)
                else:
                    glob = self.glob
                    while (line or bursts) and glob.next_start(self.granted) <= now:
                        q = self._next_in_line_locked()
                        q.granted = True
                        self.granted += 1
                        self.parked -= 1
                        ready.append(q)
                    if line or bursts:
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
                b.in_heap = False
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
            parked.extend(self.bursts)
            self.wakeups = []
            self.line.clear()
            self.bursts.clear()
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
                    "wakeups": len(self.wakeups),
                    "line": len(self.line) + len(self.bursts),
                    "granted": self.granted, "parked": self.parked,
                    "pending": self.glob.pending if self.glob is not None else 0,
                    "buckets": (len(self.chat_buckets) + len(self.shared)
                                + (self.gbucket is not None)),
                    "links": len(self.links), "bucket_heap": len(self.bucket_heap)}
