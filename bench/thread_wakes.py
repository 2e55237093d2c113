"""Waking a sleeping thread: a held Lock released against a SimpleQueue given a token.

    python bench/thread_wakes.py [--trips 20000] [--rounds 5]

Why the compiled core's idle workers and its timer sleep on a
``queue.SimpleQueue`` (see ``_sleep`` in ``_ringbuf.pyx``): two threads
play ping-pong, each waking the other and going back to sleep, ``trips``
round trips a round, first with a pair of held ``Lock`` objects (the waker
releases, the sleeper acquires), then with a pair of ``SimpleQueue``
objects (the waker puts ``None``, the sleeper gets).  Printed per round
trip: wall time, CPU time of the process (both threads), and involuntary
context switches (``getrusage``): on free-threaded CPython a ``Lock``
that is held spins before it sleeps (``sched_yield``), which shows as CPU
time and as preemptions; ``SimpleQueue.get`` sleeps at once.  On a GIL
build both are about the same.
"""

import argparse
import queue
import resource
import statistics
import sys
import threading
import time


def _locks():
    a, b = threading.Lock(), threading.Lock()
    a.acquire()
    b.acquire()
    return (a.release, lambda: a.acquire()), (b.release, lambda: b.acquire())


def _queues():
    a, b = queue.SimpleQueue(), queue.SimpleQueue()
    return (lambda: a.put(None), a.get), (lambda: b.put(None), b.get)


def ping_pong(make, trips):
    """(wall, cpu, involuntary switches) of ``trips`` round trips."""
    (wake_a, sleep_a), (wake_b, sleep_b) = make()

    def other():
        for _ in range(trips):
            sleep_b()
            wake_a()

    thread = threading.Thread(target=other)
    thread.start()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for _ in range(trips):
        wake_b()
        sleep_a()
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    thread.join()
    cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
    return wall, cpu, ru1.ru_nivcsw - ru0.ru_nivcsw


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trips", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    print("%s, GIL %s; %d round trips a round, medians of %d rounds"
          % (sys.version.split()[0], "on" if gil else "off", args.trips, args.rounds))
    print("%-12s %14s %14s %24s" % ("wake", "wall / trip", "CPU / trip", "invol. switches / trip"))
    for name, make in (("Lock", _locks), ("SimpleQueue", _queues)):
        runs = [ping_pong(make, args.trips) for _ in range(args.rounds)]
        wall, cpu, nivcsw = (statistics.median(r[i] for r in runs) for i in range(3))
        print("%-12s %11.2f us %11.2f us %24.3f" % (name, wall / args.trips * 1e6,
                                                   cpu / args.trips * 1e6, nivcsw / args.trips))
    return 0


if __name__ == "__main__":
    sys.exit(main())
