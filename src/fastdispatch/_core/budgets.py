"""Budgets a platform announces (``sc.report_limit``), for the limiter (G14, G16).

A chat's own budget, a shared bucket, the global one: at most
``remaining`` starts before ``reset``.  ``pacing._checked_report`` checks
the numbers a task reports before anything here trusts them.  ``_Budgets`` is the part of the
limiter that keeps them; ``_Limiter`` (limiter.py) asks it at each start.
"""

import heapq
from time import monotonic

from .chats import _ChatKey
from .constants import _allocate_lock, _B_CHAT, _B_GLOBAL, _B_SHARED, _LEARNED, logger


def _learned_key(q):
    # The key of a chat's learned budgets: like a window's, one that keeps
    # equalling the chat's other keys after its queue left the chat map.
    key = q._key
    if type(key) is _ChatKey:
        key = _ChatKey(q.chat_id, key._hash)
    return key


class _Bucket:
    """A budget the platform announced (``sc.report_limit``): at most
    ``remaining`` more starts before ``reset`` (a monotonic time).

    ``pending`` counts starts admitted against it, not made yet (as in
    ``_Window``); ``commit`` spends one of ``remaining``.  Once ``reset``
    has passed it no longer applies, and the timer forgets it
    (``dead``): ``in_heap`` says it has its one entry on the limiter's
    forget schedule.  A shared bucket knows the
    chats that reported it (``members``), whose links to it go with it.
    Guarded by the limiter's lock.
    """

    __slots__ = ("kind", "key", "remaining", "reset", "pending", "dead", "in_heap",
                 "members")

    def __init__(self, kind, key):
        self.kind = kind
        self.key = key          # chat key, bucket string, or None (global)
        self.remaining = 0
        self.reset = 0.0
        self.pending = 0
        self.dead = False
        self.in_heap = False
        self.members = set() if kind == _B_SHARED else None

    def spent(self, now):
        """Whether one more start now would overdraw it (it still applies)."""
        return self.reset > now and self.remaining - self.pending <= 0


class _Budgets:
    """The budgets a platform announced (``report_limit``), for ``_Limiter``.

    A chat's own budget, the shared bucket it last reported and the global
    one; each with one entry on the forget schedule (``bucket_heap``),
    pushed again when a later report moved its reset further, so the tables
    hold only budgets whose reset has not passed.  They cost nothing until
    the first report (``on_learn`` then tells the core to ask the limiter
    at every start).  ``lock`` is the limiter's one lock (see
    ``_Limiter``); ``seq`` orders both of its schedules.
    """

    __slots__ = ("lock", "need_timer", "closed", "seq", "on_learn", "learned",
                 "chat_buckets", "shared", "links", "gbucket", "bucket_heap")

    def __init__(self, need_timer, on_learn):
        self.lock = _allocate_lock()
        self.need_timer = need_timer  # the core's _timer_needed(when)
        self.closed = False           # force_close(): the line and schedule are gone
        self.seq = 0
        self.on_learn = on_learn      # called once, at the first report
        self.learned = False          # a report arrived: budgets may exist
        self.chat_buckets = {}        # chat key -> _Bucket (scope="chat")
        self.shared = {}              # bucket string -> _Bucket
        self.links = {}               # chat key -> the shared _Bucket it last reported
        self.gbucket = None           # the _Bucket of scope="global", or None
        self.bucket_heap = []         # heap of (time, seq, _Bucket): when to forget

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
            if not b.in_heap:
                self._forget_at_locked(b, reset)

    def _forget_at_locked(self, b, when):
        # The bucket's one entry on the forget schedule; the timer is told
        # when it becomes the earliest.
        b.in_heap = True
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

    def _learned_until_locked(self, q, now, until):
        # ``until``, or the latest reset among the spent budgets that cover
        # the chat if later (the chat waits for it).
        for b in self._buckets_of_locked(q):
            if b.spent(now):
                q.waited = True
                if b.reset > until:
                    until = b.reset
        return until

    def _reserve_learned_locked(self, q, now):
        # Hold a place in each budget that covers the chat (spent or given
        # back by _take_learned_locked): _LEARNED if any, else 0.
        live = [b for b in self._buckets_of_locked(q) if b.reset > now]
        if not live:
            return 0
        for b in live:
            b.pending += 1
        q.lres = live
        return _LEARNED

    def _take_learned_locked(self, q, spend):
        # The start that held places in q's budgets is made (``spend``: one
        # of each budget goes) or given back.
        lres, q.lres = q.lres, None
        for b in lres:
            b.pending -= 1
            if spend:
                b.remaining -= 1
