"""``python -m fastdispatch bench``: fastdispatch against what else a user could pick.

The modules, by role:

- :mod:`~fastdispatch.bench.contenders`  the dispatchers compared (both cores,
  a naive per-chat dispatcher, a bare thread pool) and their labels;
- :mod:`~fastdispatch.bench.scenarios`   the workloads, their registry
  ``SCENARIOS`` and the round timer (shared with the pytest-benchmark suite
  :mod:`fastdispatch.bench.suite`);
- :mod:`~fastdispatch.bench.memory`      tracemalloc figures;
- :mod:`~fastdispatch.bench.report`      targets, verdicts and tables;
- :mod:`~fastdispatch.bench.cli`         the command line;
- :mod:`~fastdispatch.bench.flood`       ``bench flood``: the Telegram
  plug-ins under a flood (not a section: it takes minutes);
- one module per *section* of the report, listed in :data:`SECTIONS`.

This module is the registry and nothing else: ``bench --help`` reads it and
imports no section (a section may import asyncio, an HTTP client or the
OpenTelemetry SDK).

Adding a section
----------------

A section is one module in this package, registered by adding its name and
its time estimate to :data:`SECTIONS` below (the report prints sections in
that order).  It exposes:

``TITLE``
    the heading printed above its table (say what the ratios are of);
``run(quick, progress)``
    measures and returns a list of rows.  ``quick`` (bool) asks for fewer
    rounds; ``progress(msg)`` is to be called before each step that takes
    more than a second or so (it prints to stderr).  Each row is a tuple of
    strings matching :data:`fastdispatch.bench.report.HEADER`:
    ``(measure, ours, baseline, ratio, target, verdict)`` with verdict
    ``"met"``, ``"MISSED"``, ``"(info)"`` or ``""``;
    :func:`fastdispatch.bench.report.ratio_rows` builds them from medians;
``HEADER`` (optional)
    other column titles, if the rows are not ratios.

Rules of the house: baselines are measured in the same run as what they are
compared with, results are medians of rounds, and targets are ratios, never
absolute times.  ``python -m fastdispatch bench --section NAME`` runs one.
"""

__all__ = ["SECTIONS", "QUICK_SCALE", "RUNS", "main"]

# Section modules of this package, in report order, each with the seconds it
# takes on a two-core machine: ((full run), (--quick)), each (idle, busy).
# These are the one statement of how long the command takes (``bench
# --help`` prints them; the pages point there).  The busy end is what a
# machine shared with other jobs gave; the measurements behind each are in
# the repository's bench/notes/bench-command.md.
SECTIONS = {
    # the per-chat dispatcher against its baselines: the targets
    "dispatcher": ((20, 110), (12, 45)),
    # rate limits and 429s: paced rate, parked chats, scopes
    "pacing": ((10, 35), (6, 18)),
    # fastdispatch.metrics: cost per task with metrics on vs off
    "metrics": ((30, 120), (15, 60)),
    # TelegramSender over HTTP against requests.post; a paced run
    "telegram": ((22, 55), (9, 20)),
    # coroutine tasks: threads held by 1,000 sends in flight, CPU per task
    "asyncio": ((25, 70), (12, 35)),
    # limits learned from Discord's headers against retry-on-429
    "discord": ((45, 90), (9, 20)),
}

# --quick: each scenario of the dispatcher section gets this share of its
# rounds (at least 3).
QUICK_SCALE = 0.4

# How many times the dispatcher section is measured (--runs).  Every run
# made is reported: a target's ratio is the median of its same-round ratios
# over all of them, never a best run, whatever the verdict.
RUNS = 1


def main(argv=None):
    """``python -m fastdispatch bench``: see :func:`fastdispatch.bench.cli.main`."""
    from .cli import main as cli_main
    return cli_main(argv)
