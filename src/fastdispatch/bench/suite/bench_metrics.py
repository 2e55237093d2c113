"""What observability costs per task: metrics on vs off, in one run.

Run:  python -m pytest --pyargs fastdispatch.bench.suite.bench_metrics --benchmark-only
      (the short version: python -m fastdispatch bench --section metrics)

The workloads and contenders live in ``fastdispatch.bench.metrics`` (shared
with ``python -m fastdispatch bench``).  Every group holds one workload on:

- ``off``            the Cython core, no hooks (the baseline);
- ``empty-hook``     an ``on_done`` that does nothing: the core's own cost of
                     reporting each task to a hook;
- ``prometheus``     ``PrometheusMetrics.hooks()`` + ``track()``;
- ``traced``         ``TracedDispatcher``, OpenTelemetry SDK, no exporter;
- ``py-off``, ``py-prometheus``: the pure-Python twin.

Groups: ``metrics e2e: submit|post 10k over 1000 chats`` (no-op tasks: all
overhead, nothing hides it) and ``metrics io: 2000 chats x 5 x 10 ms``
(sends that take 10 ms, as a real one would).  The conftest prints the
ratios (target: Prometheus on / off <= 1.15 per task) at the end of the run.
"""

import pytest

from fastdispatch.bench import metrics

pytest.importorskip("prometheus_client")    # the prometheus extra

CASES = [
    pytest.param(group, impl, rounds, id="%s|%s" % (group, impl))
    for group, (_, impls, rounds, _) in metrics.GROUPS.items()
    for impl in impls
]


@pytest.mark.parametrize("group, impl, rounds", CASES)
def test_metrics_overhead(benchmark, record_median, group, impl, rounds):
    benchmark.group = group
    benchmark.name = impl
    scenario = metrics.GROUPS[group][0](impl)
    benchmark.extra_info["ops_per_round"] = scenario.ops
    try:
        benchmark.pedantic(scenario.run, setup=scenario.prepare, rounds=rounds,
                           warmup_rounds=1 if rounds <= 5 else 2)
    finally:
        scenario.close()
    record_median(group, impl)
