"""``python -m fastdispatch bench``: fastdispatch against what else a user could pick.

The modules, by role:

- :mod:`~fastdispatch.bench.contenders`  the dispatchers compared (both cores,
  a naive per-chat dispatcher, a bare thread pool) and their labels;
- :mod:`~fastdispatch.bench.scenarios`   the workloads, their registry
  ``SCENARIOS`` and the round timer (shared with the pytest-benchmark suite
  in the repository's ``bench/`` directory);
- :mod:`~fastdispatch.bench.memory`      tracemalloc figures;
- :mod:`~fastdispatch.bench.report`      targets, verdicts and tables;
- :mod:`~fastdispatch.bench.plot`        ``--plot``: throughput sweeps (matplotlib);
- :mod:`~fastdispatch.bench.cli`         the command line;
- one module per *section* of the report, listed in :data:`SECTIONS`.

Adding a section
----------------

A section is one module in this package, registered by adding its name to
:data:`SECTIONS` below (the report prints sections in that order).  It exposes:

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
    other column titles, if the rows are not ratios;
``ESTIMATE`` (optional)
    ``(full, quick)``: seconds the section takes on a two-core machine,
    for the time estimate printed before the run.

Rules of the house: baselines are measured in the same run as what they are
compared with, results are medians of rounds, and targets are ratios, never
absolute times.  ``python -m fastdispatch bench --section NAME`` runs one.
"""

__all__ = ["SECTIONS", "main"]

# Section modules of this package, in report order.  One line per section.
SECTIONS = [
    "dispatcher",     # the per-chat dispatcher against its baselines: the targets
    "pacing",         # rate limits and 429s: paced rate, parked chats, scopes
    "metrics",        # fastdispatch.metrics: cost per task with metrics on vs off
    "telegram",       # TelegramSender over HTTP against requests.post; a paced run
    "asyncio",        # coroutine tasks: threads held by 1,000 sends in flight, CPU per task
    "discord",        # limits learned from Discord's headers against retry-on-429
    "freethreading",  # the compiled core on free-threaded CPython against a GIL build
]


def main(argv=None):
    """``python -m fastdispatch bench``: see :func:`fastdispatch.bench.cli.main`."""
    from .cli import main as cli_main
    return cli_main(argv)
