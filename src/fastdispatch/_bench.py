"""``python -m fastdispatch bench``: fastdispatch against what else a user could pick.

Every scenario runs the same workload on each contender, in the same process:

- ``fastdispatch``     the compiled core (``_ringbuf``), ``max_inflight=8``;
- ``fastdispatch-py``  the pure-Python twin (``_core_py``), same settings;
- ``naive``            :class:`NaiveDispatcher`: a lock, a dict of deques and a
                       ``ThreadPoolExecutor``, written the way a user would;
- ``threadpool``       ``concurrent.futures.ThreadPoolExecutor(8)`` with no
                       per-chat order at all (the chat id is ignored);
- ``floor``            no threads: create a ``Future``, set it, read it (or,
                       where only the submit side is timed, create the same
                       number of ``Future`` objects and keep them alive);

and, in some scenarios, ``fastdispatch-default`` (``OutboundDispatcher()``
with no arguments: 512 threads), ``futures-only`` (plain Futures created,
run, resolved and read in one thread: their life cycle without dispatch) and
``ideal`` (I/O-bound: total send time / ``max_inflight``).

Results are medians over rounds, and every figure that matters is a *ratio*
within one run, never an absolute time: the machine may be busy.  The
pytest-benchmark suite in ``bench/`` runs the same scenarios (it imports this
module) with more rounds; this command is the short version, and can draw
throughput against the number of chats and producer threads (``--plot``,
needs matplotlib: ``pip install fastdispatch[plot]``).
"""

import argparse
import gc
import logging
import os
import platform
import statistics
import sys
import threading
import time
import tracemalloc
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait

from . import _core_py
from ._dispatcher import build_dispatcher_class

try:
    from . import _ringbuf
except ImportError:  # no compiled core: the twin stands in, and says so
    _ringbuf = None

__all__ = ["main", "NaiveDispatcher", "PoolDispatcher", "SCENARIOS", "TARGETS",
           "make_scenario", "ratio_rows", "format_table"]

logger = logging.getLogger("fastdispatch.bench")

# Workload sizes.
TASKS = 10_000          # end-to-end: no-op tasks per round
CHATS = 1_000           # ... spread round-robin over this many chats
THREADS = 8             # worker threads for every contender
MICRO_OPS = 2_000       # submit-side scenarios: calls per round
IO_CHATS, IO_SENDS, IO_SEND_TIME, IO_INFLIGHT = 2_000, 5, 0.010, 200
IO_IDEAL = IO_CHATS * IO_SENDS * IO_SEND_TIME / IO_INFLIGHT   # 0.5 s

IMPL_LABELS = {
    "fastdispatch": "fastdispatch (Cython core)",
    "fastdispatch-default": "fastdispatch, all defaults (max_inflight=512)",
    "fastdispatch-py": "fastdispatch (pure-Python twin)",
    "naive": "naive lock+dict+deque on a thread pool",
    "threadpool": "ThreadPoolExecutor (no per-chat order)",
    "floor": "floor: Future() created, set, read in one thread",
    "futures-only": "10k plain Futures created, run, resolved, read; one thread",
    "ideal": "ideal: total send time / max_inflight",
}


def noop(sc):
    return None


def io_send(sc):
    time.sleep(IO_SEND_TIME)


# ----------------------------------------------------------------- contenders


class NaiveDispatcher:
    """The per-chat dispatcher a user writes in ten minutes.

    A lock, a dict of deques, and a ``ThreadPoolExecutor``: the first task of
    an idle chat submits a job that drains that chat's deque, one task at a
    time, and deletes the deque when it finds it empty.  It keeps per-chat
    order and is correct; it has no backpressure, timeouts or hooks.
    """

    def __init__(self, max_workers=THREADS):
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._chats = {}
        self._pool = ThreadPoolExecutor(max_workers)

    def submit(self, chat_id, task):
        future = Future()
        self._put(chat_id, task, future)
        return future

    def post(self, chat_id, task):
        self._put(chat_id, task, None)

    def _put(self, chat_id, task, future):
        with self._lock:
            queue = self._chats.get(chat_id)
            if queue is not None:
                queue.append((task, future))
                return
            self._chats[chat_id] = deque([(task, future)])
        self._pool.submit(self._drain_chat, chat_id)

    def _drain_chat(self, chat_id):
        while True:
            with self._lock:
                queue = self._chats[chat_id]
                if not queue:
                    del self._chats[chat_id]
                    if not self._chats:
                        self._idle.notify_all()
                    return
                task, future = queue.popleft()
            if future is None:
                try:
                    task(None)
                except Exception:
                    logger.exception("task of chat %r failed", chat_id)
            elif future.set_running_or_notify_cancel():
                try:
                    result = task(None)
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)

    def drain(self, timeout=None):
        with self._idle:
            return self._idle.wait_for(lambda: not self._chats, timeout)

    def shutdown(self, timeout=None):
        self.drain(timeout)
        self._pool.shutdown(wait=True)
        return True


class PoolDispatcher:
    """``ThreadPoolExecutor`` behind the dispatcher's methods; ignores the chat.

    Tasks of one chat may run at the same time and out of order: this is the
    ceiling of a pool, not a per-chat dispatcher.  It has no ``post``; ours
    submits and keeps the Future so that ``drain`` can wait for it.
    """

    def __init__(self, max_workers=THREADS):
        self._pool = ThreadPoolExecutor(max_workers)
        self._posted = []

    def submit(self, chat_id, task):
        return self._pool.submit(task, None)

    def post(self, chat_id, task):
        self._posted.append(self._pool.submit(task, None))

    def drain(self, timeout=None):
        posted, self._posted = self._posted, []
        return not wait(posted, timeout).not_done

    def shutdown(self, timeout=None):
        self.drain(timeout)
        self._pool.shutdown(wait=True)
        return True


_classes = {}


def _dispatcher_class(core):
    cls = _classes.get(core)
    if cls is None:
        cls = _classes[core] = build_dispatcher_class(core)
    return cls


def compiled_core():
    """The compiled core module, or the twin when the extension is missing."""
    return _ringbuf if _ringbuf is not None else _core_py


def make_dispatcher(impl, threads=THREADS, queue_size=64):
    """A fresh contender ``impl`` with ``threads`` workers."""
    if impl == "fastdispatch":
        return _dispatcher_class(compiled_core())(max_inflight=threads, queue_size=queue_size)
    if impl == "fastdispatch-default":
        return _dispatcher_class(compiled_core())(queue_size=queue_size)
    if impl == "fastdispatch-py":
        return _dispatcher_class(_core_py)(max_inflight=threads, queue_size=queue_size)
    if impl == "naive":
        return NaiveDispatcher(threads)
    if impl == "threadpool":
        return PoolDispatcher(threads)
    raise ValueError("unknown contender %r" % (impl,))


def make_ring(impl, capacity):
    if impl == "fastdispatch":
        return compiled_core().RingBuffer(capacity)
    if impl == "fastdispatch-py":
        return _core_py.RingBuffer(capacity)
    raise ValueError("unknown ring buffer %r" % (impl,))


# ------------------------------------------------------------------ scenarios


class Scenario:
    """One workload on one contender.

    ``setup()`` prepares a round (untimed), ``run()`` is the timed part,
    ``close()`` ends the contender's threads.  ``ops`` is how many operations
    one ``run()`` performs, for per-operation figures.
    """

    ops = 1

    def __init__(self, impl):
        self.impl = impl

    def setup(self):
        pass

    def prepare(self):
        """``setup()``, then a full collection so that every round starts
        from the same garbage-collector state whatever ran before it."""
        self.setup()
        gc.collect()

    def run(self):
        raise NotImplementedError

    def close(self):
        pass


class RingPushPop(Scenario):
    """``RingBuffer.push`` + ``pop``, steady state (Go: BenchmarkRingBufferPush)."""

    impls = ("fastdispatch", "fastdispatch-py", "naive")
    ops = 10_000

    def __init__(self, impl):
        super().__init__(impl)
        if impl == "naive":
            self.ring = deque()     # what the naive dispatcher uses
        else:
            self.ring = make_ring(impl, 64)

    def run(self):
        ring = self.ring
        if self.impl == "naive":
            push, pop = ring.append, ring.popleft
        else:
            push, pop = ring.push, ring.pop
        for _ in range(self.ops):
            push(1)
            pop()


def _keep_futures(n):
    futures = []
    append = futures.append
    for _ in range(n):
        append(Future())
    return futures


class _Gate:
    """Holds workers busy, one blocker task per chat given to ``block``, until ``open()``."""

    def __init__(self):
        self._open = threading.Event()
        self._started = threading.Semaphore(0)

    def block(self, dispatcher, chats):
        for chat in chats:
            dispatcher.post(chat, self._blocker)
        for _ in chats:
            self._started.acquire()

    def _blocker(self, sc):
        self._started.release()
        self._open.wait()

    def open(self):
        self._open.set()


class SubmitToBusyChats(Scenario):
    """Submit-side cost: each call only queues (every worker is held busy).

    - ``chats == 0``: one chat whose own worker is busy (Go: submit to an
      existing chat with a running worker);
    - ``chats == 64``: 64 chats whose queues exist and wait for a worker
      that is busy elsewhere (Go: pre-created queue, no worker).

    ``post=True`` times ``post`` instead of ``submit`` (queue injection:
    lookup, lock, push, unlock).  The pool is held busy the same way; the
    floor creates the same number of Futures and keeps them.
    """

    impls = ("fastdispatch", "fastdispatch-py", "naive", "threadpool", "floor")
    ops = MICRO_OPS

    def __init__(self, impl, chats=0, post=False):
        super().__init__(impl)
        self.chats = chats
        self.post = post
        self.kept = None
        self.gate = None
        if impl == "floor":
            self.run = self._run_floor
            return
        threads = THREADS if impl == "threadpool" else 1
        self.d = make_dispatcher(impl, threads, queue_size=MICRO_OPS + 1)
        if chats:
            self.blockers = ["blocker"] if threads == 1 else ["b%d" % i for i in range(threads)]
            self.targets = ["chat-%d" % i for i in range(chats)]
        else:
            # The busy worker belongs to the target chat itself.
            self.blockers = ["chat"] if threads == 1 else ["b%d" % i for i in range(threads)]
            self.targets = ["chat"]
        self.run = self._run_post if post else self._run_submit

    def _release(self):
        if self.gate is not None:
            self.gate.open()
            self.d.drain()
            self.gate = None
        self.kept = None

    def setup(self):
        self.kept = None
        if self.impl == "floor":
            return
        self._release()
        self.gate = _Gate()
        self.gate.block(self.d, self.blockers)
        if self.chats:
            for chat in self.targets:
                self.d.post(chat, noop)

    def _run_floor(self):
        self.kept = _keep_futures(self.ops)

    def _run_submit(self):
        submit = self.d.submit
        targets = self.targets
        n = len(targets)
        futures = []
        append = futures.append
        if n == 1:
            chat = targets[0]
            for _ in range(self.ops):
                append(submit(chat, noop))
        else:
            for i in range(self.ops):
                append(submit(targets[i % n], noop))
        self.kept = futures

    def _run_post(self):
        post = self.d.post
        targets = self.targets
        n = len(targets)
        if n == 1:
            chat = targets[0]
            for _ in range(self.ops):
                post(chat, noop)
        else:
            for i in range(self.ops):
                post(targets[i % n], noop)

    def close(self):
        if self.impl != "floor":
            self._release()
            self.d.shutdown()


class SubmitRotating(Scenario):
    """Submit over 64 rotating chats while the workers run (Go: rotating chats).

    Only the submitting loop is timed; the workers drain the no-op tasks at
    the same time (they share the GIL with it), so a chat's queue comes and
    goes as in production.
    """

    impls = ("fastdispatch", "fastdispatch-py", "naive", "threadpool", "floor")
    ops = MICRO_OPS

    def __init__(self, impl, chats=64):
        super().__init__(impl)
        self.chats = chats
        self.kept = None
        if impl != "floor":
            self.d = make_dispatcher(impl, THREADS)

    def setup(self):
        self.kept = None
        if self.impl != "floor":
            self.d.drain()

    def run(self):
        if self.impl == "floor":
            self.kept = _keep_futures(self.ops)
            return
        submit = self.d.submit
        chats = self.chats
        futures = []
        append = futures.append
        for i in range(self.ops):
            append(submit(i % chats, noop))
        self.kept = futures

    def close(self):
        if self.impl != "floor":
            self.d.drain()
            self.d.shutdown()


def _floor(n):
    for _ in range(n):
        future = Future()
        future.set_result(None)
        future.result()


def _futures_only(n):
    # What every contender does to its Futures, minus the dispatching: all
    # created first and kept, then run and resolved, then read.
    futures = [Future() for _ in range(n)]
    for future in futures:
        future.set_running_or_notify_cancel()
        future.set_result(None)
    for future in futures:
        future.result()


_NO_DISPATCHER = ("floor", "futures-only", "ideal")


class EndToEnd(Scenario):
    """``tasks`` tasks over ``chats`` chats, from ``producers`` threads, until done.

    Task ``i`` goes to chat ``i % chats`` and is submitted by producer
    ``i % producers`` (so each chat is fed by one thread and its order is
    defined).  With ``post=False`` every producer waits for its Futures'
    results; with ``post=True`` it posts and the dispatcher is drained.
    """

    impls = ("fastdispatch", "fastdispatch-py", "naive", "threadpool", "floor")

    def __init__(self, impl, tasks=TASKS, chats=CHATS, producers=1, post=False,
                 threads=THREADS, task=noop):
        super().__init__(impl)
        self.ops = tasks
        self.chats = chats
        self.producers = producers
        self.post = post
        self.task = task
        self.threads = None
        if impl == "floor":
            self.run = self._run_floor
        elif impl == "futures-only":
            self.run = lambda: _futures_only(self.ops)
        elif impl == "ideal":
            self.run = self._run_ideal
        else:
            queue_size = max(64, -(-tasks // chats) + 1)
            self.d = make_dispatcher(impl, threads, queue_size=queue_size)
            self.run = self._run_threads if producers > 1 else self._run_one

    def _feed(self, first):
        d, task, chats, step = self.d, self.task, self.chats, self.producers
        if self.post:
            post = d.post
            for i in range(first, self.ops, step):
                post(i % chats, task)
        else:
            submit = d.submit
            futures = [submit(i % chats, task) for i in range(first, self.ops, step)]
            for future in futures:
                future.result()

    def setup(self):
        if self.impl in _NO_DISPATCHER:
            return
        if self.producers > 1:
            self.go = threading.Event()
            self.threads = [threading.Thread(target=self._producer, args=(k,), daemon=True)
                            for k in range(self.producers)]
            for thread in self.threads:
                thread.start()

    def _producer(self, first):
        self.go.wait()
        self._feed(first)

    def _run_one(self):
        self._feed(0)
        if self.post:
            self.d.drain()

    def _run_threads(self):
        self.go.set()
        for thread in self.threads:
            thread.join()
        if self.post:
            self.d.drain()

    def _run_floor(self):
        _floor(self.ops)

    def _run_ideal(self):
        time.sleep(IO_IDEAL)

    def close(self):
        if self.impl not in _NO_DISPATCHER:
            self.d.shutdown()


class IOBound(EndToEnd):
    """2000 chats x 5 sends of 10 ms each, ``max_inflight=200``.

    The ideal is total send time / max_inflight = 0.5 s.  The pool gets the
    same 200 threads (a pool of 8 would need 12.5 s by arithmetic).
    """

    impls = ("fastdispatch", "fastdispatch-py", "naive", "threadpool", "ideal")

    def __init__(self, impl):
        super().__init__(impl, tasks=IO_CHATS * IO_SENDS, chats=IO_CHATS,
                         threads=IO_INFLIGHT, task=io_send)


# Scenario registry: group -> (factory(impl), contenders, pytest rounds, CLI
# rounds; 0 = not in the short CLI run).  The groups are the pytest-benchmark
# groups.  The all-defaults dispatcher (512 threads) gets groups of its own so
# that its threads are not alive while the others are measured.
_E2E = EndToEnd.impls + ("futures-only",)
_DEFAULTS = ("fastdispatch-default", "threadpool", "floor")
SCENARIOS = {
    "ring push+pop": (RingPushPop, RingPushPop.impls, 30, 0),
    "inject: post to a busy chat": (
        lambda impl: SubmitToBusyChats(impl, post=True), SubmitToBusyChats.impls, 40, 15),
    "submit: busy chat": (SubmitToBusyChats, SubmitToBusyChats.impls, 40, 15),
    "submit: 64 queued chats, no worker": (
        lambda impl: SubmitToBusyChats(impl, chats=64), SubmitToBusyChats.impls, 30, 0),
    "submit: 64 rotating chats": (SubmitRotating, SubmitRotating.impls, 30, 0),
    "e2e: submit 10k over 1000 chats": (EndToEnd, _E2E, 20, 7),
    "e2e: post 10k over 1000 chats": (lambda impl: EndToEnd(impl, post=True),
                                      EndToEnd.impls, 20, 7),
    "e2e defaults: submit 10k over 1000 chats": (EndToEnd, _DEFAULTS, 15, 5),
    "e2e defaults: post 10k over 1000 chats": (lambda impl: EndToEnd(impl, post=True),
                                               _DEFAULTS, 15, 5),
}
PRODUCERS = (1, 2, 4, 8)
for _p in PRODUCERS:
    SCENARIOS["producers: %d" % _p] = (
        (lambda p: lambda impl: EndToEnd(impl, producers=p))(_p), EndToEnd.impls, 12, 0)
SCENARIOS["io: 2000 chats x 5 x 10 ms"] = (IOBound, IOBound.impls, 5, 3)


def make_scenario(group, impl):
    return SCENARIOS[group][0](impl)


def time_rounds(scenarios, rounds, warmup=1, block=5):
    """Run ``scenarios`` (impl -> Scenario) in turns; return impl -> times.

    The contenders take turns by blocks of ``block`` rounds, each block
    preceded by ``warmup`` untimed rounds: turns spread a slow spell of a
    shared machine over all of them instead of one, and blocks (rather than
    single rounds) let each contender run in its own steady state, its
    memory warm, as an application would, instead of in the allocator and
    cache state the previous contender left behind.
    """
    times = {impl: [] for impl in scenarios}
    while any(len(ts) < rounds for ts in times.values()):
        for impl, scenario in scenarios.items():
            todo = min(block, rounds - len(times[impl]))
            for r in range(warmup + todo):
                scenario.prepare()
                t0 = time.perf_counter()
                scenario.run()
                elapsed = time.perf_counter() - t0
                if r >= warmup:
                    times[impl].append(elapsed)
    return times


# --------------------------------------------------------------------- memory


def queued_post_bytes(impl="fastdispatch", n=20_000):
    """tracemalloc bytes per task waiting in a chat's queue (callable not counted)."""
    d = make_dispatcher(impl, 1, queue_size=n)
    gate = _Gate()
    try:
        gate.block(d, ["blocker"])
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            post = d.post
            for _ in range(n):
                post("chat", noop)
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    finally:
        gate.open()
        d.shutdown()
    return (after - before) / n


def retained_after_chats(impl="fastdispatch", chats=100_000, threads=THREADS):
    """tracemalloc bytes still held after ``chats`` chats were queued and drained.

    Every worker is held busy while one task per chat is posted, so all the
    chats exist at once (the worst case); then they drain.  The dispatcher is
    warmed up first (threads started, lazy state built) so that only what
    the chats leave behind is counted.
    """
    d = make_dispatcher(impl, threads, queue_size=64)
    blockers = ["blocker-%d" % i for i in range(threads)]
    try:
        for _ in range(2):     # warm-up: same path, fewer chats
            gate = _Gate()
            gate.block(d, blockers)
            for i in range(1000):
                d.post(i, noop)
            gate.open()
            d.drain()
        gate = _Gate()
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            gate.block(d, blockers)
            post = d.post
            for i in range(chats):
                post(i, noop)
            gate.open()
            d.drain()
            del gate
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    finally:
        d.shutdown()
    return after - before


MEMORY_IMPLS = ("fastdispatch", "fastdispatch-py", "naive")


# -------------------------------------------------------------------- targets

# "Nothing retained": what is left must not grow with the number of chats.
# A few KiB stay whatever the count (idle workers' wake locks, allocator
# caches); 16 KiB for 100k chats is 0.16 B per chat.
RETAINED_BOUND = 16 * 1024

# (label, group, ours, baseline, kind, op, bound)
#   kind "cost":       median(ours) / median(baseline)       (lower is better)
#   kind "throughput": median(baseline) / median(ours)       (higher is better)
#   kind "ideal":      median(ours) / IO_IDEAL
#   kind "bytes":      the measured value itself (memory group)
TARGETS = (
    ("submit, busy chat / Future() kept", "submit: busy chat",
     "fastdispatch", "floor", "cost", "<=", 1.15),
    ("post, busy chat / Future() kept", "inject: post to a busy chat",
     "fastdispatch", "floor", "cost", "<=", 0.25),
    ("e2e submit throughput / floor", "e2e: submit 10k over 1000 chats",
     "fastdispatch", "floor", "throughput", ">=", 0.6),
    ("e2e submit throughput / ThreadPoolExecutor(8)", "e2e: submit 10k over 1000 chats",
     "fastdispatch", "threadpool", "throughput", ">=", 1.5),
    ("e2e post throughput / ThreadPoolExecutor(8)", "e2e: post 10k over 1000 chats",
     "fastdispatch", "threadpool", "throughput", ">=", 3.0),
    ("e2e submit: Cython / pure-Python twin", "e2e: submit 10k over 1000 chats",
     "fastdispatch", "fastdispatch-py", "throughput", ">=", 1.8),
    ("e2e post: Cython / pure-Python twin", "e2e: post 10k over 1000 chats",
     "fastdispatch", "fastdispatch-py", "throughput", ">=", 1.8),
    ("I/O-bound wall time / ideal", "io: 2000 chats x 5 x 10 ms",
     "fastdispatch", "ideal", "ideal", "<=", 1.3),
    ("bytes per queued post task", "memory", "fastdispatch", "post-bytes",
     "bytes", "<=", 200),
    ("bytes retained after 100k chats drained", "memory", "fastdispatch",
     "retained-bytes", "bytes", "<=", RETAINED_BOUND),
)

# Not targets: context for reading them (the dispatcher as constructed with
# no arguments; the Future's own cost; the naive dispatcher against the pool).
INFO = (
    ("e2e submit / plain Futures' life cycle, no threads", "e2e: submit 10k over 1000 chats",
     "fastdispatch", "futures-only", "throughput", ">=", None),
    ("e2e submit, all defaults / floor", "e2e defaults: submit 10k over 1000 chats",
     "fastdispatch-default", "floor", "throughput", ">=", None),
    ("e2e submit, all defaults / ThreadPoolExecutor(8)",
     "e2e defaults: submit 10k over 1000 chats", "fastdispatch-default", "threadpool",
     "throughput", ">=", None),
    ("e2e post, all defaults / ThreadPoolExecutor(8)",
     "e2e defaults: post 10k over 1000 chats", "fastdispatch-default", "threadpool",
     "throughput", ">=", None),
    ("e2e submit, naive / ThreadPoolExecutor(8)", "e2e: submit 10k over 1000 chats",
     "naive", "threadpool", "throughput", ">=", None),
)


def ratio_rows(medians, memory=None, include_info=True):
    """Evaluate the targets.

    ``medians`` maps (group, impl) -> median seconds; ``memory`` maps
    (impl, "post-bytes" | "retained-bytes") -> bytes.  Returns rows of
    (label, ours, baseline, ratio, bound text, verdict); a target whose
    inputs were not measured is left out.
    """
    rows = []
    for label, group, ours, base, kind, op, bound in TARGETS + (INFO if include_info else ()):
        if kind == "bytes":
            if not memory or (ours, base) not in memory:
                continue
            value = memory[(ours, base)]
            rows.append((label, "%.0f B" % value, "", "%.0f" % value,
                         "%s %g B" % (op, bound), _verdict(value, op, bound)))
            continue
        t_ours = medians.get((group, ours))
        if t_ours is None:
            continue
        if kind == "ideal":
            t_base = IO_IDEAL
        else:
            t_base = medians.get((group, base))
            if t_base is None:
                continue
        ratio = t_base / t_ours if kind == "throughput" else t_ours / t_base
        bound_text = "" if bound is None else "%s %g" % (op, bound)
        rows.append((label, _fmt_time(t_ours), _fmt_time(t_base), "%.2f" % ratio,
                     bound_text, _verdict(ratio, op, bound)))
    return rows


def _verdict(value, op, bound):
    if bound is None:
        return "(info)"
    ok = value <= bound if op == "<=" else value >= bound
    return "met" if ok else "MISSED"


def _fmt_time(seconds):
    if seconds >= 1:
        return "%.2f s" % seconds
    if seconds >= 1e-3:
        return "%.1f ms" % (seconds * 1e3)
    return "%.0f us" % (seconds * 1e6)


def format_table(header, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = []
    for i, row in enumerate((header,) + tuple(rows)):
        cells = [str(c).ljust(w) if j == 0 else str(c).rjust(w)
                 for j, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def scenario_rows(group, times, ops):
    """Rows (contender, median, per op, vs fastdispatch) for one scenario."""
    medians = {impl: statistics.median(ts) for impl, ts in times.items()}
    ref = medians.get("fastdispatch", medians.get("fastdispatch-default"))
    rows = []
    for impl, m in medians.items():
        rel = "" if ref is None else "%.2f" % (m / ref)
        rows.append((impl, _fmt_time(m), "%.0f ns" % (m / ops * 1e9), rel))
    return rows


def describe_machine():
    core = "cython" if _ringbuf is not None else "python (extension missing)"
    return "core: %s; %s %s; %d CPUs; %s" % (
        core, platform.python_implementation(), platform.python_version(),
        os.cpu_count() or 0, platform.machine())


# ------------------------------------------------------------------------ CLI


def _progress(msg):
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def run_targets(rounds_scale=1.0, memory_impls=("fastdispatch",), quiet=False):
    """The short run: the scenarios that carry targets.  Returns (medians, times, memory)."""
    medians, all_times = {}, {}
    for group, (factory, impls, _, cli_rounds) in SCENARIOS.items():
        if not cli_rounds:
            continue
        rounds = max(3, int(round(cli_rounds * rounds_scale)))
        if not quiet:
            _progress("  %s (%d rounds)" % (group, rounds))
        scenarios = {impl: factory(impl) for impl in impls}
        try:
            times = time_rounds(scenarios, rounds)
        finally:
            for scenario in scenarios.values():
                scenario.close()
        all_times[group] = (times, next(iter(scenarios.values())).ops)
        for impl, ts in times.items():
            medians[(group, impl)] = statistics.median(ts)
    if not quiet:
        _progress("  memory (tracemalloc)")
    memory = {}
    for impl in memory_impls:
        memory[(impl, "post-bytes")] = queued_post_bytes(impl)
        memory[(impl, "retained-bytes")] = retained_after_chats(impl)
    return medians, all_times, memory


CHAT_SWEEP = (1, 10, 100, 1_000, 10_000)
SWEEP_IMPLS = ("fastdispatch", "fastdispatch-py", "naive", "threadpool", "floor")


def run_sweeps(rounds=3, quiet=False):
    """Throughput (tasks/s) against chats and against producer threads."""
    by_chats, by_producers = {}, {}
    for label, points, make in (
            ("chats", CHAT_SWEEP, lambda impl, x: EndToEnd(impl, chats=x)),
            ("producers", PRODUCERS, lambda impl, x: EndToEnd(impl, producers=x))):
        out = by_chats if label == "chats" else by_producers
        for x in points:
            if not quiet:
                _progress("  sweep: %s = %d" % (label, x))
            scenarios = {impl: make(impl, x) for impl in SWEEP_IMPLS}
            try:
                times = time_rounds(scenarios, rounds)
            finally:
                for scenario in scenarios.values():
                    scenario.close()
            for impl, ts in times.items():
                out.setdefault(impl, []).append((x, TASKS / statistics.median(ts)))
    return by_chats, by_producers


_PLOT_STYLE = {
    "fastdispatch": dict(color="#1f77b4", marker="o", lw=2.2),
    "fastdispatch-py": dict(color="#1f77b4", marker="o", ls="--", mfc="white"),
    "naive": dict(color="#d62728", marker="s"),
    "threadpool": dict(color="#7f7f7f", marker="^"),
    "floor": dict(color="black", ls=":", lw=1.2),
}
_PLOT_LABELS = {
    "fastdispatch": "fastdispatch (Cython core)",
    "fastdispatch-py": "fastdispatch (pure-Python twin)",
    "naive": "naive: lock + dict + deque + pool",
    "threadpool": "ThreadPoolExecutor(8), no per-chat order",
    "floor": "floor: Future created, set, read (1 thread)",
}


def plot(by_chats, by_producers, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'fastdispatch[plot]'")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    for impl in SWEEP_IMPLS:
        style = _PLOT_STYLE[impl]
        for ax, series in ((left, by_chats), (right, by_producers)):
            xs, ys = zip(*series[impl])
            if impl == "floor":
                level = statistics.median(ys)
                ax.axhline(level / 1e3, label=_PLOT_LABELS[impl], **style)
            else:
                ax.plot(xs, [y / 1e3 for y in ys], label=_PLOT_LABELS[impl], **style)
    left.set_xscale("log")
    left.set_xticks(CHAT_SWEEP)
    left.set_xticklabels([str(x) for x in CHAT_SWEEP])
    left.set_xlabel("chats (10,000 tasks spread round-robin)")
    left.set_ylabel("throughput, thousand tasks/s (higher is better)")
    left.set_title("Throughput vs. number of chats (1 producer)")
    right.set_xticks(PRODUCERS)
    right.set_xlabel("producer threads (10,000 tasks over 1,000 chats)")
    right.set_title("Throughput vs. producer threads")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False, fontsize=9)
    fig.suptitle("No-op tasks with Futures, %d worker threads each; median of rounds"
                 % THREADS, fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    """``python -m fastdispatch bench [--rounds-scale X] [--plot FILE.png]``."""
    parser = argparse.ArgumentParser(
        prog="python -m fastdispatch bench",
        description="Measure fastdispatch against a thread pool, a naive per-chat "
                    "dispatcher, its pure-Python twin and the cost of a bare Future; "
                    "print medians and the target ratios.")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="also sweep chats and producer threads and draw the "
                             "throughput (needs matplotlib)")
    parser.add_argument("--rounds-scale", type=float, default=1.0, metavar="X",
                        help="multiply the number of rounds (default 1.0: about "
                             "30 s on two cores; --plot adds about 40 s)")
    parser.add_argument("--details", action="store_true",
                        help="also print every contender's median per scenario")
    args = parser.parse_args(argv)
    if args.plot:
        try:
            import matplotlib  # noqa: F401  (fail before a minute of measuring)
        except ImportError:
            parser.error("--plot needs matplotlib: pip install 'fastdispatch[plot]'")

    print("fastdispatch bench -- %s" % describe_machine())
    if _ringbuf is None:
        print("WARNING: the compiled core is missing; 'fastdispatch' below is the "
              "pure-Python twin.")
    t0 = time.perf_counter()
    medians, all_times, memory = run_targets(
        args.rounds_scale, MEMORY_IMPLS if args.details else ("fastdispatch",))
    if args.details:
        for group, (times, ops) in all_times.items():
            print("\n%s  (%d ops per round)" % (group, ops))
            print(format_table(("contender", "median", "per op", "x ours"),
                               scenario_rows(group, times, ops)))
        print("\nmemory")
        print(format_table(
            ("contender", "bytes / queued post", "retained after 100k chats"),
            [(impl, "%.0f" % memory[(impl, "post-bytes")],
              "%d" % memory[(impl, "retained-bytes")]) for impl in MEMORY_IMPLS]))
    print("\nTargets (medians; ratios within this run)")
    print(format_table(("measure", "ours", "baseline", "ratio", "target", ""),
                       ratio_rows(medians, memory)))
    if args.plot:
        by_chats, by_producers = run_sweeps(max(3, int(round(3 * args.rounds_scale))))
        plot(by_chats, by_producers, args.plot)
        print("\nplot written to %s" % args.plot)
    print("\n(%.0f s)" % (time.perf_counter() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
