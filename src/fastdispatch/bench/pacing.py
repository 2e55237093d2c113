"""Bench section: pacing (docs/pacing.md) — paced rate, parked chats, 429 scopes.

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

- ``retained_after_windows``: 100,000 chats send once; once their windows
  have passed, the limiter's memory is back to (near) nothing;
- ``check_cost``: wall clock of 10,000 no-op posts over 1,000 chats with
  limits that never bind, against no pacing (the CPU figure without noise
  is ``python bench/instructions.py --pacing``).

Each returns a dict of figures; :func:`run` turns them into the section's
rows.  Start times are ``sc.started``: the time each task was called,
the very stamp the limiter's windows hold, so the window check is exact.
"""

import gc
import statistics
import threading
import time
import tracemalloc
from bisect import bisect_left

from .._errors import RetryAfter
from ..pacing import Pacing, RateLimit
from .contenders import _dispatcher_class, compiled_core

__all__ = ["TITLE", "run", "paced_throughput", "parked_bytes",
           "retained_after_windows", "retry_after_scopes", "check_cost", "max_in_window"]

TITLE = "Pacing: rates against the limit, in this run"


def max_in_window(times, per):
    """The largest number of ``times`` within any window of ``per`` seconds.

    A start at exactly ``t + per`` is in the next window, as for the
    dispatcher.
    """
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
        record(sc.started)

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


def retained_after_windows(cls, chats=100_000, per=0.5):
    """Bytes left once ``chats`` chats sent once and their windows passed."""
    d = cls(max_inflight=8, pacing=Pacing(chat_limit=RateLimit(1, per=per)))
    try:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for c in range(chats):
            d.post(c, _noop)
        d.drain(timeout=60)
        peak_windows = d._pacing_state()["windows"]
        deadline = time.monotonic() + per + 10
        while d._pacing_state()["windows"] and time.monotonic() < deadline:
            time.sleep(0.05)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        left = d._pacing_state()["windows"]
    finally:
        d.shutdown(timeout=10)
    return {"retained": after - before, "windows_at_drain": peak_windows,
            "windows_left": left, "chats": chats}


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


def check_cost(cls, rounds=7, tasks=10_000, chats=1_000, threads=8):
    """Median seconds of one round, with never-binding limits and without."""
    never = Pacing(global_limit=RateLimit(1_000_000, per=1.0),
                   chat_limit=RateLimit(1_000, per=1.0))
    dispatchers = {"plain": cls(max_inflight=threads), "paced": cls(max_inflight=threads,
                                                                    pacing=never)}
    times = {name: [] for name in dispatchers}
    try:
        for _ in range(rounds):
            for name, d in dispatchers.items():   # interleaved: same load for both
                # (no gc.collect() first: the collector runs as in a program;
                # see fastdispatch.bench.scenarios)
                t0 = time.perf_counter()
                for i in range(tasks):
                    d.post(i % chats, _noop)
                d.drain()
                times[name].append(time.perf_counter() - t0)
    finally:
        for d in dispatchers.values():
            d.shutdown(timeout=10)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _verdict(ok):
    return "met" if ok else "MISSED"


def run(quick, progress):
    """The section's rows: (measure, ours, baseline, ratio, target, verdict)."""
    cls = _dispatcher_class(compiled_core())
    seconds = 2.0 if quick else 5.0
    progress("pacing: 10,000 chats under a global limit of 2,000/s for %g s" % seconds)
    tp = paced_throughput(cls, seconds=seconds)
    progress("pacing: bytes per parked chat")
    pb = parked_bytes(cls, chats=2_000 if quick else 10_000)
    progress("pacing: one 429 in 100 chats, this chat waits vs every chat waits")
    ra = retry_after_scopes(cls)
    chats = 20_000 if quick else 100_000
    progress("pacing: %d chats send once; memory after their windows pass" % chats)
    rw = retained_after_windows(cls, chats=chats)
    progress("pacing: cost of the checks (limits that never bind)")
    cost = check_cost(cls, rounds=3 if quick else 7)
    ratio = cost["paced"] / cost["plain"]
    return [
        ("paced rate / global limit (10k chats, %g s)" % seconds,
         "%.0f/s" % tp["rate"], "%d/s" % tp["limit"], "%.3f" % tp["ratio"],
         ">= 0.97", _verdict(tp["ratio"] >= 0.97)),
        ("most starts in any 1 s window / limit",
         "%d" % tp["max_window"], "%d" % tp["limit"],
         "%.3f" % (tp["max_window"] / tp["limit"]), "<= 1", _verdict(tp["max_window"] <= tp["limit"])),
        ("bytes per parked chat (queue, task, window)", "%.0f B" % pb["bytes_per_chat"],
         "", "", "", "(info)"),
        ("%dk chats sent once: windows at drain, then bytes left" % (rw["chats"] // 1000),
         "%d B" % rw["retained"], "%d windows" % rw["windows_at_drain"], "",
         "< 100 kB", _verdict(rw["retained"] < 100_000 and rw["windows_left"] == 0)),
        ("429 in 1 chat of 100: delivered in 2 s, one chat waits / all wait",
         "%d" % ra["chat"], "%d" % ra["global"], "%.1f" % ra["gain"], "", "(info)"),
        ("e2e time, never-binding limits / no pacing (wall clock)",
         "%.1f ms" % (cost["paced"] * 1e3), "%.1f ms" % (cost["plain"] * 1e3),
         "%.2f" % ratio, "", "(info)"),
    ]
