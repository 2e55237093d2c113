"""Bench section: coroutine tasks (SPEC §8) -- what ``asubmit`` holds, and what it costs.

- ``in_flight``: 1,000 sends at once, each awaiting 50 ms (a platform's
  answer time), over 1,000 chats, ``max_inflight=1000``: ``asubmit`` with a
  coroutine task against the thread bridge a user writes without it
  (``submit`` of a thread task that runs the coroutine on the loop with
  ``asyncio.run_coroutine_threadsafe(...).result()``, awaited with
  ``asyncio.wrap_future``).  Wall time / the ideal (one latency: all at
  once), and the most threads alive during the run.
- ``per_task_cost``: CPU per task of ``await d.asubmit(chat, task)`` against
  ``await asyncio.wrap_future(d.submit(chat, task))`` for a task that does
  nothing, 20,000 tasks over 1,000 chats awaited in batches of 1,000
  (``time.process_time``: the whole process, the dispatcher's threads
  included).

Both sides of each row run in the same process, interleaved, and the
medians of the rounds are compared.  ``python -m fastdispatch bench
--section asyncio``.
"""

import asyncio
import statistics
import threading
import time

from .contenders import _dispatcher_class, compiled_core

__all__ = ["TITLE", "ESTIMATE", "HEADER", "run", "in_flight", "per_task_cost"]

TITLE = "asyncio (SPEC 8): coroutine tasks against the thread bridge, in this run"
HEADER = ("measure", "asubmit", "thread bridge", "ratio", "target", "verdict")
# measured 30 s at a load average of 7-8
ESTIMATE = ((12, 40), (7, 25))

LATENCY = 0.05


class _PeakThreads:
    """Samples ``threading.active_count()`` every 5 ms on its own thread; ``peak``."""

    def __init__(self):
        self.peak = threading.active_count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, threading.active_count())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, threading.active_count())


def in_flight(cls, sends=1000, latency=LATENCY):
    """(asubmit wall / ideal, its peak threads, bridge wall / ideal, its peak threads)."""

    async def scenario(bridge):
        loop = asyncio.get_running_loop()
        d = cls(max_inflight=sends, queue_size=4)

        def coroutine_task(sc):
            return asyncio.sleep(latency)

        def thread_task(sc):
            return asyncio.run_coroutine_threadsafe(asyncio.sleep(latency), loop).result()

        try:
            with _PeakThreads() as threads:
                t0 = time.perf_counter()
                if bridge:
                    await asyncio.gather(*[asyncio.wrap_future(d.submit(c, thread_task))
                                           for c in range(sends)])
                else:
                    await asyncio.gather(*[d.asubmit(c, coroutine_task) for c in range(sends)])
                wall = time.perf_counter() - t0
        finally:
            await loop.run_in_executor(None, d.shutdown, 30.0)
        return wall / latency, threads.peak

    ours, ours_threads = asyncio.run(scenario(False))
    base, base_threads = asyncio.run(scenario(True))
    return ours, ours_threads, base, base_threads


def per_task_cost(cls, tasks=20_000, chats=1000, batch=1000):
    """(CPU seconds per task of asubmit, of submit + wrap_future)."""

    def noop(sc):
        return None

    async def scenario(bridge):
        loop = asyncio.get_running_loop()
        d = cls(max_inflight=64)
        try:
            c0 = time.process_time()
            for start in range(0, tasks, batch):
                if bridge:
                    await asyncio.gather(*[asyncio.wrap_future(d.submit(i % chats, noop))
                                           for i in range(start, start + batch)])
                else:
                    await asyncio.gather(*[d.asubmit(i % chats, noop)
                                           for i in range(start, start + batch)])
            return (time.process_time() - c0) / tasks
        finally:
            await loop.run_in_executor(None, d.shutdown, 30.0)

    return asyncio.run(scenario(False)), asyncio.run(scenario(True))


def run(quick, progress):
    cls = _dispatcher_class(compiled_core())
    rounds = 3 if quick else 5
    flights, costs = [], []
    for r in range(rounds):
        progress("asyncio: 1,000 sends in flight, round %d of %d" % (r + 1, rounds))
        flights.append(in_flight(cls))
        progress("asyncio: CPU per task, round %d of %d" % (r + 1, rounds))
        costs.append(per_task_cost(cls, tasks=10_000 if quick else 20_000))
    med = [statistics.median(f[i] for f in flights) for i in range(4)]
    ours_cost = statistics.median(c[0] for c in costs)
    base_cost = statistics.median(c[1] for c in costs)
    return [
        ("1,000 sends of 50 ms at once: wall / ideal", "%.2f" % med[0], "%.2f" % med[2],
         "%.2f" % (med[0] / med[2]), "(info)", "(info)"),
        ("... threads alive at most", "%d" % med[1], "%d" % med[3],
         "%.3f" % (med[1] / med[3]), "<= 0.1", "met" if med[1] / med[3] <= 0.1 else "MISSED"),
        ("CPU per no-op task (us)", "%.1f" % (ours_cost * 1e6), "%.1f" % (base_cost * 1e6),
         "%.2f" % (ours_cost / base_cost), "<= 1.0",
         "met" if ours_cost <= base_cost else "MISSED"),
    ]
