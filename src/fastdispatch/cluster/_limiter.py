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
by Redis and the request leaving the process are not the same instant, and
the guard keeps scheduling jitter from ever squeezing ``count + 1`` real
sends into ``per`` seconds.

The script is registered once (``redis-py``'s ``register_script``: EVALSHA,
reloaded by itself after a Redis restart).  Keys carry a ``{stream}`` hash
tag, so on Redis Cluster both keys live on one node, as a script requires.
"""

import threading
import uuid
from time import monotonic

__all__ = ["SharedLimiter", "LIMIT_SCRIPT"]

LIMIT_SCRIPT = """
-- KEYS[1]: global log, KEYS[2]: chat log (sorted sets: member -> start, us)
-- ARGV: g_count, g_per_us, c_count, c_per_us, max_wait_us, member, mode
-- (a count of 0 switches that limit off).  mode:
--   reserve: take the earliest start both logs allow; {1, 0} = start now,
--            {1, wait} = reserved wait us ahead (confirm then), {0, wait} =
--            not reserved (further than max_wait)
--   confirm: the reservation is due: {1, 0} = start now (recorded at now),
--            {0, wait} = not yet (moved wait us ahead; confirm again)
--   cancel:  drop the reservation
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local member, mode = ARGV[6], ARGV[7]
local limits = {{KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])},
                {KEYS[2], tonumber(ARGV[3]), tonumber(ARGV[4])}}
if mode == 'cancel' then
  for _, l in ipairs(limits) do
    if l[2] > 0 then redis.call('ZREM', l[1], member) end
  end
  return {1, 0}
end
local start = now
for _, l in ipairs(limits) do
  local key, count, per = l[1], l[2], l[3]
  if count > 0 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - per)
    if mode == 'reserve' then
      -- after every entry, and count entries back at least per apart
      local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      if last[2] then start = math.max(start, tonumber(last[2])) end
      if redis.call('ZCARD', key) >= count then
        local e = redis.call('ZRANGE', key, -count, -count, 'WITHSCORES')
        start = math.max(start, tonumber(e[2]) + per)
      end
    else
      -- starting now: fewer than count other entries within (now - per, now]
      local r = redis.call('ZREVRANGEBYSCORE', key, now, '-inf', 'WITHSCORES',
                           'LIMIT', 0, count + 1)
      local n = 0
      for i = 1, #r, 2 do
        if r[i] ~= member then
          n = n + 1
          if n == count then
            start = math.max(start, tonumber(r[i + 1]) + per)
          end
        end
      end
    end
  end
end
local wait = start - now
if mode == 'reserve' and wait > tonumber(ARGV[5]) then
  return {0, wait}
end
for _, l in ipairs(limits) do
  if l[2] > 0 then
    redis.call('ZADD', l[1], start, member)
    redis.call('PEXPIRE', l[1], math.floor((wait + l[3]) / 1000) + 1000)
  end
end
if mode == 'reserve' then return {1, wait} end
if wait > 0 then return {0, wait} end
return {1, 0}
"""


def _us(seconds):
    return int(round(seconds * 1_000_000))


class SharedLimiter:
    """``acquire(chat_id, sc)`` over Redis: sleeps until both limits allow a start.

    ``global_limit`` and ``chat_limit`` are ``RateLimit`` or None.  Thread
    safe (redis-py's client holds a connection pool).  A start costs one
    round trip when it is allowed at once, else two (reserve, sleep,
    confirm); the confirmation is what makes the limit strict even when a
    thread wakes up late: a late start is checked against the starts
    actually made, and pushed back if it would overfill a window.  Redis
    errors propagate (``redis.exceptions.ConnectionError`` and friends): the
    caller decides how to wait for Redis.
    """

    #: how many late "yes" answers one ``acquire`` asks again after
    LATE_ANSWERS = 3

    def __init__(self, client, stream, global_limit=None, chat_limit=None, guard=0.05):
        self._client = client
        self._script = client.register_script(LIMIT_SCRIPT)
        self._prefix = "fastdispatch:{%s}:rate:" % (stream,)
        self.global_limit = global_limit
        self.chat_limit = chat_limit
        self.guard = guard
        self._late_lock = threading.Lock()   # guards late_answers (many threads add)
        self.late_answers = 0   # starts given back: every answer came back late
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
        ok, wait_us = r[0], r[1]
        return bool(ok), max(0, int(wait_us)) / 1_000_000

    def acquire(self, chat_id, sc, max_wait):
        """Wait (in ``sc.wait``) until a start is allowed; returns None then.

        Returns a wait in seconds instead (the caller gives the message back
        and asks again that much later), having dropped its reservation,
        when the start cannot be made within ``max_wait`` of the call: the
        earliest start is further away, confirmations kept pushing it back,
        or the answers kept coming back late (below).  The whole call stays
        within ``max_wait`` plus a few round trips, so the limiter never
        runs a send into its ``send_timeout``.  A cancelled ``sc`` (deadline,
        force_close) drops the reservation and raises through ``sc.check()``.

        "Allowed" is only trusted when the answer came back within half the
        guard (measured round trip, no clock shared with Redis needed): a
        thread that got the answer late (a busy machine, the GIL) asks again
        instead of sending on a stale yes -- at most ``LATE_ANSWERS`` times
        in one call; then the start is given back (``late_answers`` counts
        them), so an overloaded process slows down instead of spinning on
        Redis.
        """
        member = uuid.uuid4().hex
        fresh = self.guard / 2.0 if self.guard > 0 else float("inf")
        t0 = monotonic()
        give_up = t0 + max_wait
        ok, wait = self._call(chat_id, "reserve", member, max_wait)
        if not ok:
            return wait
        late = 0
        while True:
            if wait <= 0:
                if monotonic() - t0 <= fresh:
                    return None
                late += 1
                if late > self.LATE_ANSWERS:
                    self._call(chat_id, "cancel", member)
                    with self._late_lock:
                        self.late_answers += 1
                    return max(self.guard, 0.01)
            elif monotonic() + wait > give_up:
                self._call(chat_id, "cancel", member)
                return wait
            elif sc.wait(wait):
                self._call(chat_id, "cancel", member)
                sc.check()
            t0 = monotonic()
            ok, wait = self._call(chat_id, "confirm", member)
            if sc.cancelled:
                self._call(chat_id, "cancel", member)
                sc.check()
