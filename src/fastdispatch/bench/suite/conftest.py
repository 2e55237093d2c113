"""Benchmark suite setup: collect ``bench_*.py`` and print the ratio table.

Run the whole suite (not part of the test run):

    python -m pytest --pyargs fastdispatch.bench.suite --benchmark-only

pytest collects only ``test_*.py`` files by default; the hook below also
collects the ``bench_*.py`` modules of this package, so that the one
command runs every benchmark.  Each dispatcher benchmark records its median
here, and the end of the run prints the target ratios (median / median of
the baseline in the same group, in the same run) with a met/MISSED verdict.
Nothing is asserted on times: the table is the result.
"""

import pytest

from fastdispatch.bench import report

# Printed under the table when a target is MISSED: what a miss in this run
# can and cannot mean.
MISSED_NOTE = (
    "",
    "MISSED: in this run.  pytest-benchmark times the contenders one after the other,",
    "so a change of the machine's load between them moves a ratio (on a shared",
    "machine one round varies by +-30 %); 'python -m fastdispatch bench' lets the",
    "contenders take turns and is the reference for these targets.  Whether",
    "fastdispatch itself got slower is what 'bench_compare' answers (docs/performance.md,",
    "\"Did an upgrade make it slower?\").",
)

# (group, contender) -> median seconds; (contender, what) -> bytes.
MEDIANS = {}
MEMORY = {}


def pytest_collect_file(file_path, parent):
    if (file_path.suffix == ".py" and file_path.name.startswith("bench_")
            and not parent.session.isinitpath(file_path)):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


@pytest.fixture
def record_median(benchmark):
    """``record_median(group, impl)`` after ``benchmark.pedantic``: keep the median."""

    def record(group, impl):
        stats = getattr(benchmark, "stats", None)
        if stats is not None:       # None under --benchmark-disable
            MEDIANS[(group, impl)] = stats.stats.median

    return record


@pytest.fixture
def record_memory():
    """``record_memory(impl, what, nbytes)``."""

    def record(impl, what, nbytes):
        MEMORY[(impl, what)] = nbytes

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    _skipped_summary(terminalreporter, config)
    _metrics_summary(terminalreporter)
    rows = report.ratio_rows(MEDIANS, MEMORY)
    if not rows:
        return
    tr = terminalreporter
    tr.section("fastdispatch targets (medians; ratios within this run)")
    tr.write_line(report.describe_machine())
    for line in report.format_table(
            ("measure", "ours", "baseline", "ratio", "target", ""), rows).splitlines():
        tr.write_line(line)
    if any(row[-1].startswith("MISSED") for row in rows):
        for line in MISSED_NOTE:
            tr.write_line(line)
    if MEMORY:
        tr.write_line("")
        impls = sorted({impl for impl, _ in MEMORY})
        for line in report.format_table(
                ("memory (tracemalloc)", "bytes / queued post", "retained after 100k chats"),
                [(impl, "%.0f" % MEMORY.get((impl, "post-bytes"), float("nan")),
                  "%d" % MEMORY.get((impl, "retained-bytes"), -1)) for impl in impls]
        ).splitlines():
            tr.write_line(line)


def _metrics_summary(tr):
    # bench_metrics.py: metrics on / off, its own targets.
    from fastdispatch.bench import metrics
    rows = metrics.ratio_rows(MEDIANS)
    if not rows:
        return
    tr.section(metrics.TITLE)
    for line in report.format_table(report.HEADER, rows).splitlines():
        tr.write_line(line)


def _skipped_summary(tr, config):
    # Run from an installed package, pytest reports a skipped module as an
    # "s" and nothing more unless -rs is given: say which and why (an extra
    # not installed) every time.
    chars = getattr(config.option, "reportchars", "") if config is not None else ""
    if any(c in chars for c in "sSaA"):
        return          # pytest's own short summary lists them
    reasons = {}
    for rep in tr.stats.get("skipped", ()):
        longrepr = rep.longrepr
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            path, _, reason = longrepr
            reason = reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
            reasons.setdefault((path.split("/")[-1], reason), 0)
            reasons[(path.split("/")[-1], reason)] += 1
    if reasons:
        tr.section("skipped")
        for (where, reason), n in sorted(reasons.items()):
            tr.write_line("%s: %s (%d skipped)" % (where, reason, n))
