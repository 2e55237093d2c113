"""Bench section: the compiled core on free-threaded CPython against a GIL build, in one run.

The workload is the end-to-end one of :mod:`fastdispatch.bench.scenarios`:
10,000 no-op tasks round-robin over 1,000 chats, compiled core,
``max_inflight=8``, fed by one or two producer threads (task ``i`` by
producer ``i % 2``), either ``submit`` with every producer waiting for its
Futures' results, or ``post`` and a ``drain()``.  Each interpreter runs it in
a child process of its own; the interpreters take turns (``turns``) so that
a slow spell of a shared machine spreads over all of them, and each reports
medians of its rounds:

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

The interpreters: this one (a free-threaded one twice, with ``PYTHON_GIL=0``
and ``=1``), then those named in ``FASTDISPATCH_BENCH_PYTHONS``
(``os.pathsep``-separated paths of interpreters that have fastdispatch
installed with its compiled core).  The targets compare the free-threaded
build with the GIL off against the first GIL build among them (the one
``docs/performance.md`` measures); without both, the section says what it
is missing.  ``bench/freethreading.py --python A --python B`` runs the same
with a table of every interpreter.
"""

import json
import os
import statistics
import subprocess
import sys
import sysconfig

__all__ = ["TITLE", "HEADER", "ESTIMATE", "ESTIMATE_NOTE", "measure", "interpreters", "run", "rows_for"]

TITLE = ("free-threading: the compiled core on a free-threaded CPython (GIL off) "
         "against a GIL build, in this run")
HEADER = ("measure", "free-threaded", "GIL build", "ratio", "target", "verdict")


def _configured():
    # Whether run() will measure (a free-threaded interpreter runs this, or
    # others are named) or only say what it is missing: the estimate is
    # that of what it will do.
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED")
                or os.environ.get("FASTDISPATCH_BENCH_PYTHONS"))


# Seconds on two cores, (full, quick): measured 9 s and 2 s (3.11 and a
# free-threaded 3.13 twice) with the test suite running beside it; nothing
# to measure: under a second.
ESTIMATE = ((8, 30), (2, 10)) if _configured() else ((0, 1), (0, 1))
# What --help adds to the estimate when there is nothing to measure.
ESTIMATE_NOTE = None if _configured() else (
    "(nothing to measure here: no free-threaded CPython; see FASTDISPATCH_BENCH_PYTHONS)")

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


def interpreters(pythons=None):
    """(python, env) runs: each interpreter, a free-threaded one twice (GIL off, on)."""
    if pythons is None:
        extra = os.environ.get("FASTDISPATCH_BENCH_PYTHONS", "")
        pythons = [sys.executable] + [p for p in extra.split(os.pathsep) if p]
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
    return ("(not measured: needs %s; name interpreters in FASTDISPATCH_BENCH_PYTHONS)" % what,
            "", "", "", "", "(info)")


def run(quick, progress):
    runs = interpreters()
    no_ft = not any(env.get("PYTHON_GIL") == "0" for _, env in runs)
    no_gil = not any(not env for _, env in runs)
    if no_ft or no_gil:
        return [_missing(no_ft, no_gil)]
    return rows_for(measure(runs, rounds=2 if quick else 6, turns=1 if quick else 3,
                            progress=progress))
