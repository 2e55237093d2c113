"""Bench section: coroutine tasks -- ``asubmit`` against the asyncio code users write instead.

The workload: ``chats`` chats x ``per_chat`` coroutine tasks, each
``await asyncio.sleep(0)`` (one trip through the event loop, no I/O), all
started at once with ``asyncio.gather`` and awaited, under a cap of
``max_inflight`` running at a time.  CPU per task is ``time.process_time``
(the whole process) around that ``gather``, divided by the number of tasks;
setting up and closing the dispatcher are not counted.

The contenders (:data:`CONTENDERS`), each a coroutine function
``(jobs, max_inflight, core) -> None``:

- ``lock+semaphore``  THE FLOOR: what asyncio users write by hand for
  "one at a time per chat, at most N at once": a ``defaultdict`` of
  ``asyncio.Lock`` (one per chat, FIFO: keeps the chat's order) and a global
  ``asyncio.Semaphore(max_inflight)`` taken inside the chat's lock.  Every
  harness of this package that speaks of the asyncio floor means this code
  (:data:`FLOOR`), with the same workload, measured in the same run;
- ``queue per chat``  an ``asyncio.Queue`` per chat and a consumer task that
  drains it and exits when it is empty, under the same ``Semaphore``;
- ``gather+semaphore``  the ``Semaphore`` alone: no per-chat order at all
  (a ceiling, not a per-chat dispatcher);
- ``asubmit``, ``asubmit (twin)``  ``await dispatcher.asubmit(chat, task)``
  on the compiled core and on the pure-Python twin, with nothing but
  ``max_inflight`` configured (every other argument at its default).

Rounds are interleaved (every contender once per round, in a rotating
order) and every ratio is taken within one round, against that round's
floor; the report gives the median of those same-round ratios and prints
every run (:func:`measure_rounds`).  The ``in_flight`` row measures what the
thread bridge users write without ``asubmit`` holds (threads) with 1,000
sends of 50 ms in flight.  ``python -m fastdispatch bench --section asyncio``;
the longer sweep over 1,000 to 100,000 chats is the repository's
``bench/asyncio_floor.py``.
"""

import asyncio
import gc
import statistics
import threading
import time
from collections import defaultdict

from .. import _core_py
from .contenders import _dispatcher_class, compiled_core

__all__ = ["TITLE", "HEADER", "FLOOR", "CONTENDERS", "run", "in_flight",
           "cpu_per_task", "measure_rounds", "summarize"]

TITLE = ("asyncio: coroutine tasks, CPU per task as a ratio to the floor "
         "(a per-chat asyncio.Lock + a global Semaphore), in this run")
HEADER = ("measure", "contender", "us per task", "/ floor (median)", "target", "verdict")

LATENCY = 0.05
FLOOR = "lock+semaphore"


async def _job():
    await asyncio.sleep(0)


def _task(sc):
    return _job()


async def _lock_semaphore(jobs, max_inflight, core):
    locks = defaultdict(asyncio.Lock)
    sem = asyncio.Semaphore(max_inflight)

    async def send(chat):
        async with locks[chat]:
            async with sem:
                return await _job()

    await asyncio.gather(*[send(chat) for chat in jobs])


async def _queue_per_chat(jobs, max_inflight, core):
    loop = asyncio.get_running_loop()
    queues = {}
    sem = asyncio.Semaphore(max_inflight)

    async def consume(chat, queue):
        while not queue.empty():
            future = queue.get_nowait()
            async with sem:
                try:
                    result = await _job()
                except Exception as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
        del queues[chat]

    async def send(chat):
        future = loop.create_future()
        queue = queues.get(chat)
        if queue is None:
            queue = queues[chat] = asyncio.Queue()
            loop.create_task(consume(chat, queue))
        queue.put_nowait(future)
        return await future

    await asyncio.gather(*[send(chat) for chat in jobs])


async def _gather_semaphore(jobs, max_inflight, core):
    sem = asyncio.Semaphore(max_inflight)

    async def send(chat):
        async with sem:
            return await _job()

    await asyncio.gather(*[send(chat) for chat in jobs])


def _asubmit(core):
    async def contender(jobs, max_inflight, _core):
        d = _dispatcher_class(core)(max_inflight=max_inflight)
        try:
            t0 = time.process_time()
            await asyncio.gather(*[d.asubmit(chat, _task) for chat in jobs])
            return time.process_time() - t0
        finally:
            await d.ashutdown()
    return contender


CONTENDERS = {
    "lock+semaphore": _lock_semaphore,
    "queue per chat": _queue_per_chat,
    "gather+semaphore": _gather_semaphore,
    "asubmit": _asubmit(compiled_core()),
    "asubmit (twin)": _asubmit(_core_py),
}


def cpu_per_task(name, chats, per_chat, max_inflight):
    """CPU seconds per task of contender ``name`` on one fresh event loop."""
    jobs = [i % chats for i in range(chats * per_chat)]
    contender = CONTENDERS[name]

    async def scenario():
        t0 = time.process_time()
        spent = await contender(jobs, max_inflight, None)
        return spent if spent is not None else time.process_time() - t0

    gc.collect()
    return asyncio.run(scenario()) / len(jobs)


def measure_rounds(names, chats, per_chat, max_inflight, rounds, progress=None):
    """``{name: [seconds per task, one per round]}``, rounds interleaved.

    Each round runs every contender once; the order rotates from round to
    round so that no contender always runs first (or right after another).
    """
    runs = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            runs[name].append(cpu_per_task(name, chats, per_chat, max_inflight))
        if progress is not None:
            progress("asyncio: %d chats x %d, max_inflight %d, round %d of %d: %s" % (
                chats, per_chat, max_inflight, r + 1, rounds, "  ".join(
                    "%s %.2f us" % (n, runs[n][-1] * 1e6) for n in names)))
    return runs


def summarize(runs, floor=FLOOR):
    """``{name: (median us per task, median of same-round ratios to floor, ratios)}``."""
    out = {}
    for name, values in runs.items():
        ratios = [v / f for v, f in zip(values, runs[floor])]
        out[name] = (statistics.median(values) * 1e6, statistics.median(ratios), ratios)
    return out


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
    """(asubmit's peak threads, the thread bridge's) with ``sends`` sends in flight.

    The thread bridge: ``submit`` of a thread task that runs the coroutine on
    the loop with ``asyncio.run_coroutine_threadsafe(...).result()``, awaited
    with ``asyncio.wrap_future`` -- what a user writes without ``asubmit``.
    """

    async def scenario(bridge):
        loop = asyncio.get_running_loop()
        d = cls(max_inflight=sends, queue_size=4)

        def coroutine_task(sc):
            return asyncio.sleep(latency)

        def thread_task(sc):
            return asyncio.run_coroutine_threadsafe(asyncio.sleep(latency), loop).result()

        try:
            with _PeakThreads() as threads:
                if bridge:
                    await asyncio.gather(*[asyncio.wrap_future(d.submit(c, thread_task))
                                           for c in range(sends)])
                else:
                    await asyncio.gather(*[d.asubmit(c, coroutine_task) for c in range(sends)])
        finally:
            await loop.run_in_executor(None, d.shutdown, 30.0)
        return threads.peak

    return asyncio.run(scenario(False)), asyncio.run(scenario(True))


# (chats, tasks per chat, max_inflight, target for asubmit / floor or None)
SCENARIOS = ((1000, 10, 100, 1.0), (1000, 10, 1000, 1.0))


def run(quick, progress):
    rounds = 3 if quick else 7
    names = list(CONTENDERS)
    rows = []
    for chats, per_chat, max_inflight, target in SCENARIOS:
        runs = measure_rounds(names, chats, per_chat, max_inflight, rounds, progress)
        label = "%d chats x %d, max_inflight %d" % (chats, per_chat, max_inflight)
        for name, (us, ratio, ratios) in summarize(runs).items():
            aim = target if name == "asubmit" else (1.5 if name == "asubmit (twin)" else None)
            rows.append((label, name, "%.2f" % us,
                         "%.2f  (rounds: %s)" % (ratio, " ".join("%.2f" % r for r in ratios)),
                         "<= %.1f" % aim if aim else "(info)",
                         ("met" if ratio <= aim else "MISSED") if aim else "(info)"))
            label = ""
    progress("asyncio: 1,000 sends of 50 ms in flight: threads alive")
    ours, bridge = in_flight(_dispatcher_class(compiled_core()))
    rows.append(("threads alive, 1,000 sends in flight", "asubmit / thread bridge",
                 "%d / %d" % (ours, bridge), "%.3f" % (ours / bridge), "<= 0.1",
                 "met" if ours / bridge <= 0.1 else "MISSED"))
    return rows
