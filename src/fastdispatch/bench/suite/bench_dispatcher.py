"""The dispatcher beside the alternatives, one pytest-benchmark group per workload.

Run:  python -m pytest --pyargs fastdispatch.bench.suite --benchmark-only
      (just these: ... --pyargs fastdispatch.bench.suite.bench_dispatcher)

The workloads and the contenders live in ``fastdispatch.bench`` (shared with
``python -m fastdispatch bench``); every group holds the same workload on:

- ``fastdispatch``       the Cython core, 8 worker threads;
- ``fastdispatch-py``    the pure-Python twin, same settings;
- ``naive``              a lock + dict + deque per-chat dispatcher on a pool;
- ``threadpool``         ``ThreadPoolExecutor(8)``, no per-chat order;
- ``floor``              a bare ``Future``: created, set, read in one thread
                         (or, where only submitting is timed, created and kept).

Groups (the Go original's benchmarks first):

- ``ring push+pop``                       RingBuffer push + pop (vs. a deque);
- ``inject: post to a busy chat``         lookup + lock + push + unlock, no Future;
- ``submit: busy chat``                   submit to a chat whose worker is running;
- ``submit: 64 queued chats, no worker``  queues exist, every worker busy elsewhere;
- ``submit: 64 rotating chats``           submit while the workers drain;
- ``e2e: submit|post 10k over 1000 chats`` until every task ran;
- ``e2e defaults: ...``                   the same with ``OutboundDispatcher()``
                                          as constructed with no arguments;
- ``producers: 1|2|4|8``                  the e2e submit from N threads;
- ``io: 2000 chats x 5 x 10 ms``          ``max_inflight=200``; ``ideal`` sleeps
                                          total send time / 200 = 0.5 s;
- ``memory``                              tracemalloc (times are not the result).

Each round is timed once (``pedantic``: untimed setup, then one timed call
that performs thousands of operations), the garbage collector runs as in a
program (no collection is forced between rounds: see
``fastdispatch.bench.scenarios``), and the number to read is the ratio of
medians within a group.
The conftest prints those ratios against the targets at the end of the run.
"""

import pytest

from fastdispatch.bench import contenders, memory, scenarios

CASES = [
    pytest.param(group, impl, rounds, id="%s|%s" % (group, impl))
    for group, (_, impls, rounds, _) in scenarios.SCENARIOS.items()
    for impl in impls
]


@pytest.mark.parametrize("group, impl, rounds", CASES)
def test_dispatch(benchmark, record_median, group, impl, rounds):
    benchmark.group = group
    benchmark.name = impl
    scenario = scenarios.make_scenario(group, impl)
    benchmark.extra_info["ops_per_round"] = scenario.ops
    benchmark.extra_info["contender"] = contenders.IMPL_LABELS.get(impl, impl)
    try:
        benchmark.pedantic(scenario.run, setup=scenario.prepare, rounds=rounds,
                           warmup_rounds=1 if rounds <= 5 else 2)
    finally:
        scenario.close()
    record_median(group, impl)


@pytest.mark.parametrize("impl", memory.MEMORY_IMPLS)
def test_memory(benchmark, record_memory, impl):
    """Bytes per queued ``post`` task, and what 100k drained chats leave behind."""
    benchmark.group = "memory (tracemalloc; see extra_info, not the times)"
    benchmark.name = impl
    results = {}

    def measure():
        results["post-bytes"] = memory.queued_post_bytes(impl)
        results["retained-bytes"] = memory.retained_after_chats(impl)

    benchmark.pedantic(measure, rounds=1, iterations=1)
    benchmark.extra_info.update(results)
    for what, value in results.items():
        record_memory(impl, what, value)
