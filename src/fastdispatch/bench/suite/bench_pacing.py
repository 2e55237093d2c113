"""Pacing benchmarks (docs/pacing.md), the same measurements as ``python -m fastdispatch bench --section pacing``.

    python -m pytest --pyargs fastdispatch.bench.suite.bench_pacing --benchmark-only -s

Each test times one run of a measurement of ``fastdispatch.bench.pacing``
and prints its figures; the figures (rates against the limit, bytes, a
ratio of delivered messages) are the result, not the time of the run.  The
instruction-count version of the cost of the checks is
``python bench/instructions.py --pacing``.
"""

from fastdispatch.bench import pacing
from fastdispatch.bench.contenders import _dispatcher_class, compiled_core

CLS = _dispatcher_class(compiled_core())


def _once(benchmark, fn, *args, **kwargs):
    return benchmark.pedantic(fn, args=args, kwargs=kwargs, rounds=1, iterations=1)


def test_paced_rate_meets_the_global_limit(benchmark):
    benchmark.group = "pacing: 10k chats, global limit 2000/s, 5 s"
    r = _once(benchmark, pacing.paced_throughput, CLS)
    print("\npaced rate %.0f/s = %.3f x the limit; most in any window: %d"
          % (r["rate"], r["ratio"], r["max_window"]))
    benchmark.extra_info.update(r)


def test_bytes_per_parked_chat(benchmark):
    benchmark.group = "pacing: memory"
    r = _once(benchmark, pacing.parked_bytes, CLS)
    print("\n%.0f bytes per parked chat" % r["bytes_per_chat"])
    benchmark.extra_info.update(r)


def test_retry_after_pauses_one_chat_not_all(benchmark):
    benchmark.group = "pacing: one 429 in 100 chats"
    r = _once(benchmark, pacing.retry_after_scopes, CLS)
    print("\ndelivered in 2 s: %d when one chat waits, %d when all wait (%.1fx)"
          % (r["chat"], r["global"], r["gain"]))
    benchmark.extra_info.update(r)


def test_cost_of_never_binding_limits(benchmark):
    benchmark.group = "pacing: cost of the checks"
    r = _once(benchmark, pacing.check_cost, CLS)
    print("\nmedian e2e round: %.1f ms paced, %.1f ms not (%.2fx)"
          % (r["paced"] * 1e3, r["plain"] * 1e3, r["paced"] / r["plain"]))
    benchmark.extra_info.update(r)
