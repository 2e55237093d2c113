"""The rate budget that all workers share: one atomic Redis Lua script.

Why one script over both keys.  A send may start only when the bot-wide log
*and* the chat's log allow it; two separate limiter calls are not atomic (a
process can win the global check, lose the chat check, and the slots it took
are skewed).  The script decides and records over both keys at once, with
the Redis server's clock (``TIME``), so clocks of different machines do not
matter.

How it decides.  Each key is a sorted set of start times (microseconds of
Redis time), a sliding-window log: a new start ``s`` is allowed when the
``count``-th most recent start is at least ``per`` seconds before ``s``
(``RateLimit``'s strictest reading: never ``count + 1`` starts within any
``per`` seconds).  Instead of answering "no, try later" (which makes every
waiting worker ask again and again), the script *reserves* the earliest
start that both logs allow and returns how long until then: the caller
sleeps once, exactly that long, and sends.  Reservations are appended in
time order, so waiting senders are served first come, first served.  A
reservation further away than ``max_wait`` is not made (the caller gives
the message back and asks again later).

``guard`` widens each window a little (50 ms by default): a start recorded
by Redis and the request leaving the process are not the same instant.  The
caller never starts before its reserved start (it sleeps from the moment
the answer arrived, and Redis decided before that), and starts no later
than ``guard / 2`` after it (measured from the moment it asked, so neither
a late answer nor a late wake-up escapes): every real start lies within
``[reserved, reserved + guard/2]`` plus the few microseconds to the send,
so windows ``per + guard`` apart in Redis are more than ``per`` apart in
fact.  A caller that would start later than that gives its start up and
reserves a new one, at the end of the queue (one call: ``reserve`` drops the
caller's earlier start).  A start is never moved later where it stands:
the reservations after it were made against it, and only ever removing an
entry keeps every window that was true true.  So a send costs one call when
it starts in time, whatever the number of chats or the Redis latency, and
one more each time it does not.

The script is registered once (``redis-py``'s ``register_script``: EVALSHA,
reloaded by itself after a Redis restart).  Keys carry a ``{stream}`` hash
tag, so on Redis Cluster both keys live on one node, as a script requires.
"""

import threading
import uuid
from time import monotonic

from .._netnum import parse_int

__all__ = ["SharedLimiter", "LIMIT_SCRIPT"]

LIMIT_SCRIPT = """
-- KEYS[1]: global log, KEYS[2]: chat log (sorted sets: member -> start, us)
-- ARGV: g_count, g_per_us, c_count, c_per_us, max_wait_us, member, mode
-- (a count of 0 switches that limit off).  mode:
--   reserve: drop member's earlier start if it has one (asked again), then
--            take the earliest start both logs allow: {1, wait} = reserved
--            wait us after now (0: start now), {0, wait} = not reserved
--            (further than max_wait)
--   cancel:  drop member's start
-- Every step is O(log n): no call reads a whole window.
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local member, mode = ARGV[6], ARGV[7]
local limits = {{KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])},
                {KEYS[2], tonumber(ARGV[3]), tonumber(ARGV[4])}}
local start = now
for _, l in ipairs(limits) do
  local key, count, per = l[1], l[2], l[3]
  if count > 0 then
    redis.call('ZREM', key, member)
    if mode == 'reserve' then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now - per)
      -- after every entry, and count entries back at least per apart
      local n = redis.call('ZCARD', key)
      if n > 0 then
        local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
        start = math.max(start, tonumber(last[2]))
        if n >= count then
          local e = redis.call('ZRANGE', key, -count, -count, 'WITHSCORES')
          start = math.max(start, tonumber(e[2]) + per)
        end
      end
    end
  end
end
if mode ~= 'reserve' then return {1, 0} end
local wait = start - now
if wait > tonumber(ARGV[5]) then
  return {0, wait}
end
for _, l in ipairs(limits) do
  if l[2] > 0 then
    redis.call('ZADD', l[1], start, member)
    redis.call('PEXPIRE', l[1], math.floor((wait + l[3]) / 1000) + 1000)
  end
end
return {1, wait}
"""

def _us(seconds):
    return int(round(seconds * 1_000_000))


class SharedLimiter:
    """``acquire(chat_id, sc)`` over Redis: sleeps until both limits allow a start.

    ``global_limit`` and ``chat_limit`` are ``RateLimit`` or None.  Thread
    safe (redis-py's client holds a connection pool).  A start costs one
    script call (reserve, sleep until the reserved start) when the thread
    starts within ``guard / 2`` of it, one more (reserve anew) each time it
    does not; see the module's docstring for why that keeps the limit
    strict.  Redis errors propagate (``redis.exceptions.ConnectionError``
    and friends): the caller decides how to wait for Redis.
    """

    #: how many late starts one ``acquire`` reserves anew after
    LATE_ANSWERS = 3

    def __init__(self, client, stream, global_limit=None, chat_limit=None, guard=0.05):
        self._client = client
        self._script = client.register_script(LIMIT_SCRIPT)
        self._prefix = "fastdispatch:{%s}:rate:" % (stream,)
        self.global_limit = global_limit
        self.chat_limit = chat_limit
        self.guard = guard
        self._late_lock = threading.Lock()   # guards late_answers (many threads add)
        self.late_answers = 0   # starts given back: this thread kept starting late
        g, c = global_limit, chat_limit
        self._args = [
            g.count if g else 0, _us(g.per + guard) if g else 0,
            c.count if c else 0, _us(c.per + guard) if c else 0,
        ]

    @property
    def active(self):
        return self.global_limit is not None or self.chat_limit is not None

    def keys_for(self, chat_id):
        return [self._prefix + "global", self._prefix + "chat:" + chat_id]

    def _call(self, chat_id, mode, member, max_wait=0.0):
        r = self._script(keys=self.keys_for(chat_id),
                         args=self._args + [_us(max_wait), member, mode])
        ok, wait_us = r[0], parse_int(r[1], signed=True)
        if wait_us is None:  # not our script's answer: ask again a second later
            return False, 1.0
        return bool(ok), max(0, wait_us) / 1_000_000

    def acquire(self, chat_id, sc, max_wait):
        """Wait (in ``sc.wait``) until a start is allowed; returns None then.

        Returns a wait in seconds instead (the caller gives the message back
        and asks again that much later), having dropped its reservation,
        when the start cannot be made within ``max_wait`` of the call: the
        earliest start is further away, or this thread kept starting late
        (below).  The whole call stays within ``max_wait`` plus a few round
        trips, so the limiter never runs a send into its ``send_timeout``.
        A cancelled ``sc`` (deadline, force_close) drops the reservation and
        raises through ``sc.check()``.

        A start is only taken when the thread is at most ``guard / 2`` past
        the reserved start, counted from the moment it asked (a late answer
        and a late wake-up alike: a busy machine, the GIL); else it reserves
        anew -- at most ``LATE_ANSWERS`` times in one call; then the start
        is given back (``late_answers`` counts them), so an overloaded
        process slows down instead of spinning on Redis.
        """
        member = uuid.uuid4().hex
        fresh = self.guard / 2.0 if self.guard > 0 else float("inf")
        give_up = monotonic() + max_wait
        late = 0
        while True:
            asked = monotonic()
            ok, wait = self._call(chat_id, "reserve", member, max(0.0, give_up - asked))
            if not ok:
                return wait        # nothing reserved (an earlier start was dropped)
            # Redis decided after `asked` and before the answer arrived:
            # `wait` from now is never early.
            if wait > 0 and sc.wait(wait):
                self._call(chat_id, "cancel", member)
                sc.check()
            if sc.cancelled:
                self._call(chat_id, "cancel", member)
                sc.check()
            if monotonic() - asked - wait <= fresh:
                return None
            late += 1
            if late > self.LATE_ANSWERS:
                self._call(chat_id, "cancel", member)
                with self._late_lock:
                    self.late_answers += 1
                return max(self.guard, 0.01)
