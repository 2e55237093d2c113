"""The workloads: one :class:`Scenario` per (workload, contender), and their registry.

Every scenario runs the same workload on each contender, in the same process
(see :mod:`fastdispatch.bench.contenders`), plus the baselines that need no
dispatcher:

- ``floor``         no threads: create a ``Future``, set it, read it (or,
                    where only the submit side is timed, create the same
                    number of ``Future`` objects and keep them alive);
- ``futures-only``  plain Futures created, run, resolved and read in one
                    thread: their life cycle without dispatch;
- ``ideal``         I/O-bound: total send time / ``max_inflight``.

:data:`SCENARIOS` maps each group (the pytest-benchmark group of the suite
in :mod:`fastdispatch.bench.suite`) to its factory, contenders and number
of rounds; :func:`time_rounds` times contenders in turns.

**The garbage collector runs as it does in a user's program.**  No
collection is forced before a round: the untimed warm-up rounds bring the
collector to the steady state of the workload, and the timed rounds pay
what a program running that workload pays (a caller keeps its Futures, so
collections happen, and they are part of the cost).  A collection forced
between rounds would leave a nearly empty heap behind, and a collector that
spaces its collections by what the last one left alive (the free-threaded
build's) would then collect far more often in the next round than it does
in a program.
"""

import threading
import time
from collections import deque
from concurrent.futures import Future

from .contenders import THREADS, make_dispatcher, make_ring, noop

__all__ = ["TASKS", "CHATS", "MICRO_OPS", "IO_CHATS", "IO_SENDS", "IO_SEND_TIME",
           "IO_INFLIGHT", "IO_IDEAL", "Scenario", "RingPushPop", "SubmitToBusyChats",
           "SubmitRotating", "EndToEnd", "IOBound", "SCENARIOS", "PRODUCERS",
           "make_scenario", "time_rounds"]

# Workload sizes.
TASKS = 10_000          # end-to-end: no-op tasks per round
CHATS = 1_000           # ... spread round-robin over this many chats
MICRO_OPS = 2_000       # submit-side scenarios: calls per round
IO_CHATS, IO_SENDS, IO_SEND_TIME, IO_INFLIGHT = 2_000, 5, 0.010, 200
IO_IDEAL = IO_CHATS * IO_SENDS * IO_SEND_TIME / IO_INFLIGHT   # 0.5 s


def io_send(sc):
    time.sleep(IO_SEND_TIME)





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
        """What runs before each timed round, untimed: ``setup()``.  The
        garbage collector is left alone (see the module's docstring)."""
        self.setup()

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


def _involuntary_switches():
    # The process's involuntary context switches so far (all its threads),
    # or 0 where getrusage has no such count.
    try:
        import resource
    except ImportError:  # Windows
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def time_rounds(scenarios, rounds, warmup=1, block=5, switches=None):
    """Run ``scenarios`` (impl -> Scenario) in turns; return impl -> times.

    The contenders take turns by blocks of ``block`` rounds, each block
    preceded by ``warmup`` untimed rounds: turns spread a slow spell of a
    shared machine over all of them instead of one, and blocks (rather than
    single rounds) let each contender run in its own steady state, its
    memory warm and its garbage collector's schedule its own, as an
    application would, instead of in the state the previous contender left
    behind.

    ``switches``, a dict, receives impl -> [involuntary context switches of
    the process per timed round] (``getrusage``; all zero where it has
    none): threads that preempt each other show there before they show in
    the times (the repository's free-threading benchmarks read it).
    """
    times = {impl: [] for impl in scenarios}
    while any(len(ts) < rounds for ts in times.values()):
        for impl, scenario in scenarios.items():
            todo = min(block, rounds - len(times[impl]))
            for r in range(warmup + todo):
                scenario.prepare()
                nivcsw = _involuntary_switches() if switches is not None else 0
                t0 = time.perf_counter()
                scenario.run()
                elapsed = time.perf_counter() - t0
                if switches is not None:
                    nivcsw = _involuntary_switches() - nivcsw
                if r >= warmup:
                    times[impl].append(elapsed)
                    if switches is not None:
                        switches.setdefault(impl, []).append(nivcsw)
    return times
