"""Free-threaded vs GIL: the compiled core's end-to-end figures per interpreter, in one run.

Run with any interpreter that has fastdispatch installed; each one named
must have it installed with its compiled core:

    .venv/bin/python bench/freethreading.py --python .venv-ft/bin/python --python .venv311/bin/python

``PYTHON=python3.13t bash tools/dev.sh freethreaded`` makes ``.venv-ft``;
``python3.11 -m venv .venv311 && .venv311/bin/pip install .`` the other.  A
free-threaded interpreter is measured twice, with ``PYTHON_GIL=0`` and with
``PYTHON_GIL=1``.

The workload, the method and the targets are those of the bench section
``fastdispatch.bench.freethreading`` (``python -m fastdispatch bench
--section freethreading``, which takes its second interpreter from
``FASTDISPATCH_BENCH_PYTHONS``): 10,000 no-op tasks round-robin over 1,000
chats, ``max_inflight=8``, ``submit`` + wait and ``post`` + ``drain()``,
from one and two producer threads; per task times, 2-vs-1-producer
throughput, involuntary context switches per 10,000 tasks (``getrusage``),
and the floor (10,000 ``Future`` objects created, set and read in one
thread).  This script prints every interpreter's figures, then the
section's verdicts (the free-threaded build with the GIL off against the
first GIL build named).
"""

import argparse
import os
import sys

from fastdispatch.bench import freethreading as ft
from fastdispatch.bench.report import format_table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", action="append", required=True,
                        help="an interpreter with fastdispatch installed (repeat)")
    parser.add_argument("--rounds", type=int, default=6,
                        help="timed rounds per contender per turn (default 6)")
    parser.add_argument("--turns", type=int, default=3,
                        help="turns each interpreter takes (default 3)")
    parser.add_argument("--max-inflight", type=int, default=ft.THREADS,
                        help="the dispatcher's max_inflight (default %d, the section's; "
                             "the number of cores shows what more threads than cores "
                             "cost)" % ft.THREADS)
    args = parser.parse_args(argv)
    if args.max_inflight < 1:
        parser.error("--max-inflight must be at least 1")

    figures = ft.measure(ft.interpreters(args.python), rounds=args.rounds, turns=args.turns,
                         progress=lambda msg: sys.stderr.write(msg + "\n"),
                         threads=args.max_inflight)
    print("e2e: 10,000 no-op tasks over 1,000 chats, compiled core, max_inflight=%d; %d CPUs; "
          "medians of %d rounds" % (args.max_inflight, os.cpu_count() or 0,
                                    args.rounds * args.turns))
    header = ("interpreter", "python", "GIL", "floor / task", "submit+wait / task", "post / task",
              "2 vs 1 producers, submit", "2 vs 1, post", "invol. switches / 10k, submit",
              "... post")
    rows = []
    for f in figures:
        per = f["per_task"]
        rows.append((f["build"], f["python"], "on" if f["gil"] else "off",
                     "%.2f us" % (per["floor"] * 1e6),
                     "%.2f us" % (per["submit-1"] * 1e6), "%.2f us" % (per["post-1"] * 1e6),
                     "%.2fx" % f["two_vs_one"]["submit"], "%.2fx" % f["two_vs_one"]["post"],
                     "%.0f" % f["switches"]["submit-1"], "%.0f" % f["switches"]["post-1"]))
    print(format_table(header, rows))
    print()
    print(format_table(ft.HEADER, ft.rows_for(figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
