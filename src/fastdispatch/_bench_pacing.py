"""Pacing benchmarks: paced throughput, bytes per parked chat, 429 scopes.

- ``paced_throughput``: 10,000 chats, a global limit of 2,000 starts/s and
  no per-chat bottleneck: the rate achieved over 5 s against the limit
  (target >= 0.97) and the most starts seen in any one-second window
  (never above the limit).
- ``parked_bytes``: memory per chat parked on the wake-up schedule (its
  queue, its waiting task, its window and its schedule entry).
- ``retry_after_scopes``: a 429 for one chat in a hundred, answered the way
  fastdispatch does (that chat waits) and the way python-telegram-bot's
  rate limiter does (every chat waits: ``RetryAfter(scope="global")``):
  messages delivered in the same time.

Each returns a dict of figures; ``rows()`` turns them into the table that
``python -m fastdispatch bench`` prints.
"""

import gc
import threading
import time
import tracemalloc
from bisect import bisect_left

from ._errors import RetryAfter
from .pacing import Pacing, RateLimit

__all__ = ["paced_throughput", "parked_bytes", "retry_after_scopes", "max_in_window"]


def max_in_window(times, per):
    """The largest number of ``times`` within any window of ``per`` seconds."""
    times = sorted(times)
    best = j = 0
    for i, t in enumerate(times):
        while times[j] + per <= t:
            j += 1
        best = max(best, i - j + 1)
    return best


def paced_throughput(cls, limit=2_000, chats=10_000, seconds=5.0, threads=8):
    """Start rate under a binding global limit, against the limit."""
    starts = []
    record = starts.append
    total = int(limit * seconds * 1.2) + 1

    def task(sc):
        record(time.monotonic())

    d = cls(max_inflight=threads, queue_size=64,
            pacing=Pacing(global_limit=RateLimit(limit, per=1.0)))
    try:
        for i in range(total):
            d.post(i % chats, task)
        done = d.drain(timeout=seconds * 3)
    finally:
        d.shutdown(timeout=10)
    starts.sort()
    t0 = starts[0]
    in_span = bisect_left(starts, t0 + seconds)
    rate = in_span / seconds
    return {
        "rate": rate,
        "ratio": rate / limit,
        "max_window": max_in_window(starts, 1.0),
        "limit": limit,
        "drained": done,
        "paced": d.stats().paced,
    }


def parked_bytes(cls, chats=10_000):
    """Bytes per chat parked for its chat limit (queue, task, window, entry)."""
    d = cls(max_inflight=8, pacing=Pacing(chat_limit=RateLimit(1, per=60.0)))
    noop = _noop
    try:
        for c in range(chats):           # the first start of each chat
            d.post(c, noop)
        d.drain(timeout=30)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for c in range(chats):           # the second must wait a minute
            d.post(c, noop)
        deadline = time.monotonic() + 30
        while d.stats().parked < chats and time.monotonic() < deadline:
            time.sleep(0.01)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        parked = d.stats().parked
    finally:
        d.force_close()
        d.shutdown(timeout=10)
    return {"bytes_per_chat": (after - before) / chats, "parked": parked}


def _noop(sc):
    return None


def retry_after_scopes(cls, chats=200, per_chat=20, every=100, retry_after=1.0,
                       send_time=0.002, window=2.0, threads=32):
    """Delivered messages in ``window`` seconds with a 429 per ``every`` chats.

    Chat ``c`` with ``c % every == 0`` answers its first send with
    ``RetryAfter(retry_after)``.  ``scope="chat"``: only that chat waits
    (fastdispatch); ``scope="global"``: everything waits, which is what a
    limiter that halts all chats on one 429 does.
    """
    result = {}
    for scope in ("chat", "global"):
        delivered = []
        lock = threading.Lock()
        t0 = [0.0]

        def make(chat, seq, scope=scope, delivered=delivered):
            def task(sc):
                if chat % every == 0 and seq == 0 and sc.attempt == 1:
                    raise RetryAfter(retry_after, scope=scope)
                time.sleep(send_time)
                with lock:
                    delivered.append(time.monotonic())
            return task

        d = cls(max_inflight=threads, queue_size=per_chat + 1)
        try:
            t0[0] = time.monotonic()
            for seq in range(per_chat):
                for chat in range(chats):
                    d.post(chat, make(chat, seq))
            d.drain(timeout=60)
        finally:
            d.shutdown(timeout=10)
        end = t0[0] + window
        result[scope] = sum(1 for t in delivered if t <= end)
    result["total"] = chats * per_chat
    result["gain"] = result["chat"] / max(1, result["global"])
    return result
