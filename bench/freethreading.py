"""Free-threaded vs GIL: the compiled core's end-to-end figures per interpreter, in one run.

Run with any interpreter that has fastdispatch installed; each one named
must have it installed with its compiled core:

    .venv/bin/python bench/freethreading.py --python .venv-ft/bin/python --python .venv311/bin/python

``PYTHON=python3.13t bash tools/dev.sh freethreaded`` makes ``.venv-ft``;
``python3.11 -m venv .venv311 && .venv311/bin/pip install .`` the other.  A
free-threaded interpreter is measured twice, with ``PYTHON_GIL=0`` and with
``PYTHON_GIL=1``.

The workload is the end-to-end one of ``fastdispatch.bench.scenarios``:
10,000 no-op tasks round-robin over 1,000 chats, compiled core,
``max_inflight=8``, fed by one or two producer threads (task ``i`` by
producer ``i % 2``), either ``submit`` with every producer waiting for its
Futures' results, or ``post`` and a ``drain()``.  Each interpreter runs it in
a child process of its own; the interpreters take turns (``--turns``) so
that a slow spell of a shared machine spreads over all of them, and each
reports medians of its rounds:

- time per task (median round / 10,000) of ``submit`` + wait and of
  ``post``, one producer;
- two producers / one producer: end-to-end throughput, ``submit`` + wait
  (on two cores the ideal is 2.0);
- involuntary context switches per 10,000 tasks (``getrusage``'s
  ``ru_nivcsw`` of the whole process around each round; one producer,
  ``submit``): a thread preempted while it holds the CPU, as happens when
  threads spin on each other's locks and ``sched_yield``;
- the floor: the same interpreter creating, setting and reading 10,000
  ``Future`` objects in one thread.

It prints every interpreter's figures, then the verdicts: the free-threaded
build with the GIL off against the first GIL build named; without both, it
says what it is missing.  The figures and what they led to:
``bench/notes/freethreading.md``.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig

from fastdispatch.bench.report import format_table

HEADER = ("measure", "free-threaded", "GIL build", "ratio", "target", "verdict")

TASKS = 10_000
THREADS = 8

# The child: one interpreter's rounds, printed as one JSON line.
CHILD = r"""
import json, sys, sysconfig
import fastdispatch
from fastdispatch.bench import scenarios as sc
rounds, threads = int(sys.argv[1]), int(sys.argv[2])
assert fastdispatch.IMPLEMENTATION == "cython", fastdispatch.IMPLEMENTATION
contenders = {
    "floor": sc.EndToEnd("floor"),
    "submit-1": sc.EndToEnd("fastdispatch", producers=1, threads=threads),
    "submit-2": sc.EndToEnd("fastdispatch", producers=2, threads=threads),
    "post-1": sc.EndToEnd("fastdispatch", producers=1, post=True, threads=threads),
    "post-2": sc.EndToEnd("fastdispatch", producers=2, post=True, threads=threads),
}
# (what the dispatchers were built with, for the caller to check)
max_inflight = sorted({c.d.max_inflight for name, c in contenders.items() if name != "floor"})
switches = {}
times = sc.time_rounds(contenders, rounds, warmup=1, block=max(1, rounds // 2),
                       switches=switches)
for contender in contenders.values():
    contender.close()
print(json.dumps({
    "version": sys.version.split()[0],
    "free_threaded_build": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    "gil": getattr(sys, "_is_gil_enabled", lambda: True)(),
    "max_inflight": max_inflight,
    "times": times,
    "switches": switches,
}))
"""


def _is_free_threaded(python):
    probe = subprocess.run(
        [python, "-c", "import sysconfig; print(bool(sysconfig.get_config_var('Py_GIL_DISABLED')))"],
        capture_output=True, text=True, check=True)
    return probe.stdout.strip() == "True"


def interpreters(pythons):
    """(python, env) runs: each interpreter, a free-threaded one twice (GIL off, on)."""
    runs = []
    for python in pythons:
        if _is_free_threaded(python):
            runs.append((python, {"PYTHON_GIL": "0"}))
            runs.append((python, {"PYTHON_GIL": "1"}))
        else:
            runs.append((python, {}))
    return runs


def _child(python, env, rounds, threads=THREADS):
    proc = subprocess.run([python, "-c", CHILD, str(rounds), str(threads)],
                          capture_output=True, text=True,
                          env=dict(os.environ, **env), check=False)
    if proc.returncode:
        raise RuntimeError("%s failed (is fastdispatch installed there, with its compiled "
                           "core?):\n%s" % (python, proc.stderr[-2000:]))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(runs, rounds=6, turns=3, progress=lambda msg: None, threads=THREADS):
    """Per run: its medians (seconds per task, switches per 10,000 tasks, 2-vs-1 ratios).

    ``threads``: the dispatcher's ``max_inflight`` (the section's workload
    has 8; as many as the machine has cores shows what more runnable
    threads than cores cost without the GIL).
    """
    pooled = [None] * len(runs)
    for turn in range(turns):
        for i, (python, env) in enumerate(runs):
            progress("turn %d/%d: %s %s" % (turn + 1, turns, python,
                                            " ".join("%s=%s" % kv for kv in env.items())))
            result = _child(python, env, rounds, threads)
            if pooled[i] is None:
                pooled[i] = result
            else:
                for key in result["times"]:
                    pooled[i]["times"][key].extend(result["times"][key])
                    pooled[i]["switches"][key].extend(result["switches"][key])
    figures = []
    for (python, env), result in zip(runs, pooled):
        med = {key: statistics.median(ts) for key, ts in result["times"].items()}
        switches = {key: statistics.median(ns) * 10_000 / TASKS
                    for key, ns in result["switches"].items()}
        figures.append({
            "python": python,
            "build": result["version"] + ("t" if result["free_threaded_build"] else ""),
            "free_threaded_build": result["free_threaded_build"],
            "gil": result["gil"],
            "max_inflight": result["max_inflight"],
            "per_task": {key: t / TASKS for key, t in med.items()},
            "two_vs_one": {kind: med[kind + "-1"] / med[kind + "-2"] for kind in ("submit", "post")},
            "switches": switches,
        })
    return figures


def _verdict(ok):
    return "met" if ok else "MISSED"


def rows_for(figures):
    """The section's rows: the free-threaded build (GIL off) against the first GIL build."""
    ft = next((f for f in figures if f["free_threaded_build"] and not f["gil"]), None)
    gil = next((f for f in figures if not f["free_threaded_build"]), None)
    if ft is None or gil is None:
        return [_missing(ft is None, gil is None)]
    rows = []
    for kind, label in (("submit-1", "submit + wait, per task"), ("post-1", "post, per task")):
        a, b = ft["per_task"][kind], gil["per_task"][kind]
        rows.append(("%s (%s / %s)" % (label, ft["build"], gil["build"]),
                     "%.2f us" % (a * 1e6), "%.2f us" % (b * 1e6), "%.2fx" % (a / b),
                     "<= 1.00x", _verdict(a / b <= 1.0)))
    a, b = ft["two_vs_one"]["submit"], gil["two_vs_one"]["submit"]
    rows.append(("2 producers / 1, submit + wait, throughput", "%.2fx" % a, "%.2fx" % b, "",
                 ">= 1.70x", _verdict(a >= 1.7)))
    a, b = ft["two_vs_one"]["post"], gil["two_vs_one"]["post"]
    rows.append(("2 producers / 1, post, throughput", "%.2fx" % a, "%.2fx" % b, "", "",
                 "(info)"))
    a, b = ft["switches"]["submit-1"], gil["switches"]["submit-1"]
    rows.append(("involuntary context switches / 10,000 tasks", "%.0f" % a, "%.0f" % b,
                 "%.1fx" % (a / max(b, 1.0)), "<= 10x of max(GIL build, 1)",
                 _verdict(a <= 10 * max(b, 1.0))))
    a, b = ft["per_task"]["floor"], gil["per_task"]["floor"]
    rows.append(("floor: Future created, set, read, per task", "%.2f us" % (a * 1e6),
                 "%.2f us" % (b * 1e6), "%.2fx" % (a / b), "", "(info)"))
    return rows


def _missing(no_ft, no_gil):
    what = " and ".join(w for w, absent in (("a free-threaded CPython", no_ft),
                                            ("a GIL build", no_gil)) if absent)
    return ("(not measured: needs %s; name one with --python)" % what,
            "", "", "", "", "(info)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", action="append", required=True,
                        help="an interpreter with fastdispatch installed (repeat)")
    parser.add_argument("--rounds", type=int, default=6,
                        help="timed rounds per contender per turn (default 6)")
    parser.add_argument("--turns", type=int, default=3,
                        help="turns each interpreter takes (default 3)")
    parser.add_argument("--max-inflight", type=int, default=THREADS,
                        help="the dispatcher's max_inflight (default %d, "
                             "the number of cores shows what more threads than cores "
                             "cost)" % THREADS)
    args = parser.parse_args(argv)
    if args.max_inflight < 1:
        parser.error("--max-inflight must be at least 1")

    figures = measure(interpreters(args.python), rounds=args.rounds, turns=args.turns,
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
    print(format_table(HEADER, rows_for(figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
