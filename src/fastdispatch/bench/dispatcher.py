"""Bench section: the per-chat dispatcher against its baselines (the targets).

Runs the scenarios of :data:`fastdispatch.bench.scenarios.SCENARIOS` that
have CLI rounds, then the tracemalloc figures, and evaluates
:data:`fastdispatch.bench.report.TARGETS` on the medians.
"""

import statistics

from . import QUICK_SCALE, RUNS
from .memory import MEMORY_IMPLS, queued_post_bytes, retained_after_chats
from .report import format_table, ratio_rows, round_maps, scenario_rows
from .scenarios import SCENARIOS, time_rounds

__all__ = ["TITLE", "run", "measure"]

TITLE = "Dispatcher targets (medians; ratios within this run)"


def _silent(msg):
    pass


def measure(rounds_scale=1.0, memory_impls=("fastdispatch",), progress=_silent, groups=None):
    """The scenarios that carry targets.  Returns (medians, times, memory).

    ``medians`` maps (group, impl) -> median seconds, ``times`` maps group ->
    (impl -> round times, ops per round), ``memory`` maps (impl, what) -> bytes.
    ``groups`` limits the run to those scenario groups.
    """
    medians, all_times = {}, {}
    for group, (factory, impls, _, cli_rounds) in SCENARIOS.items():
        if not cli_rounds or (groups is not None and group not in groups):
            continue
        rounds = max(3, int(round(cli_rounds * rounds_scale)))
        progress("%s (%d rounds x %d contenders)" % (group, rounds, len(impls)))
        scenarios = {impl: factory(impl) for impl in impls}
        try:
            times = time_rounds(scenarios, rounds)
        finally:
            for scenario in scenarios.values():
                scenario.close()
        all_times[group] = (times, next(iter(scenarios.values())).ops)
        for impl, ts in times.items():
            medians[(group, impl)] = statistics.median(ts)
    memory = {}
    for impl in memory_impls:
        progress("memory (tracemalloc): %s" % impl)
        memory[(impl, "post-bytes")] = queued_post_bytes(impl)
        memory[(impl, "retained-bytes")] = retained_after_chats(impl)
    return medians, all_times, memory


def run(quick, progress, rounds_scale=1.0, details=False, runs=RUNS):
    """Rows of the target table; with ``details``, first print every contender's median.

    The scenarios are measured ``runs`` times, unconditionally; every run
    counts (see :func:`fastdispatch.bench.report.ratio_rows`).
    """
    scale = rounds_scale * (QUICK_SCALE if quick else 1.0)
    medians, all_times, memory = measure(
        scale, MEMORY_IMPLS if details else ("fastdispatch",), progress)
    every = [round_maps(all_times)]
    for n in range(1, runs):
        progress("run %d of %d" % (n + 1, runs))
        more = measure(scale, (), progress)[1]
        every.append(round_maps(more))
        for group, (times, _) in more.items():
            for impl, ts in times.items():
                all_times[group][0][impl] = all_times[group][0][impl] + ts
    for group, (times, _) in all_times.items():
        for impl, ts in times.items():
            medians[(group, impl)] = statistics.median(ts)
    if details:
        for group, (times, ops) in all_times.items():
            print("\n%s  (%d ops per round)" % (group, ops))
            print(format_table(("contender", "median", "per op", "x ours"),
                               scenario_rows(group, times, ops)))
        print("\nmemory")
        print(format_table(
            ("contender", "bytes / queued post", "retained after 100k chats"),
            [(impl, "%.0f" % memory[(impl, "post-bytes")],
              "%d" % memory[(impl, "retained-bytes")]) for impl in MEMORY_IMPLS]))
    return ratio_rows(medians, memory, runs=every)
