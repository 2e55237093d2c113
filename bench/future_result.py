"""``result()`` of a finished Future: the compiled core's against the stdlib's.

    python bench/future_result.py [--futures 10000] [--rounds 15]

Why the compiled core gives ``fastdispatch``'s Future its own ``result()``
(``_future_result`` in ``_ringbuf.pyx``): a caller of ``submit`` reads
every result, and the stdlib's method is Python code (the Future's
Condition entered and left, two state tests, a private method called),
which free-threaded CPython 3.13 runs without bytecode specialization.
Each round calls ``result()`` once on each of ``futures`` finished
Futures, made by ``submit`` and resolved by the dispatcher's workers, then
the same on as many ``concurrent.futures.Future`` objects finished with
``set_result``; the two take turns, and the medians per call are printed
with their ratio.  Run it under each interpreter to compare builds.
"""

import argparse
import concurrent.futures
import statistics
import sys
import time

import fastdispatch


def _time_results(futures):
    t0 = time.perf_counter()
    for future in futures:
        future.result()
    return (time.perf_counter() - t0) / len(futures)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--futures", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)

    d = fastdispatch.OutboundDispatcher(max_inflight=8)
    ours = [d.submit(i % 1000, lambda sc: None) for i in range(args.futures)]
    d.drain()
    d.shutdown()
    stdlib = []
    for _ in range(args.futures):
        future = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        future.set_result(None)
        stdlib.append(future)
    times = {"fastdispatch": [], "stdlib": []}
    for _ in range(args.rounds):
        times["fastdispatch"].append(_time_results(ours))
        times["stdlib"].append(_time_results(stdlib))
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    print("%s (GIL %s), core %s: result() of a finished Future, median of %d rounds of %d"
          % (sys.version.split()[0], "on" if gil else "off", fastdispatch.IMPLEMENTATION,
             args.rounds, args.futures))
    a, b = statistics.median(times["fastdispatch"]), statistics.median(times["stdlib"])
    print("  fastdispatch Future: %.3f us" % (a * 1e6))
    print("  concurrent.futures.Future: %.3f us" % (b * 1e6))
    print("  ratio: %.2fx" % (a / b))


if __name__ == "__main__":
    main()
