"""Free-threaded vs GIL: end-to-end throughput with 1 and 2 producers, as multiples of the floor.

Run (each interpreter must have fastdispatch installed with its compiled core):

    python bench/freethreading.py --python .venv-ft/bin/python --python .venv313/bin/python

``PYTHON=python3.13t bash tools/dev.sh freethreaded`` makes ``.venv-ft``;
``python3.13 -m venv .venv313 && .venv313/bin/pip install ".[test]"`` the
other.  A free-threaded interpreter is measured twice, with ``PYTHON_GIL=0``
and with ``PYTHON_GIL=1``.

The workload is ``fastdispatch.bench.scenarios``' ``e2e: submit 10k over
1000 chats`` (``producers: N``): 10,000 no-op tasks round-robin over 1,000
chats, submitted from N threads that each wait for their Futures, on the
compiled core with ``max_inflight=8``.  The floor is the same interpreter
creating, setting and reading 10,000 ``Future``s in one thread.  The figure
is throughput ÷ the floor's throughput (floor time ÷ time): 1.0 means the
dispatcher moves tasks across threads as fast as one thread can merely
resolve Futures; on two cores the ideal with two producers is 2.0.  The
interpreters take turns (``--turns``) so that a slow spell of a shared
machine spreads over all of them; each reports medians.

The garbage collector runs as in a program (no collection forced between
rounds; see ``fastdispatch.bench.scenarios``); the table says how many
collections a round of one producer ran and how long they took.
``--collect`` forces a ``gc.collect()`` before every round instead (the
method this script once used), to show what that does to the figures.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, statistics, sys, sysconfig
from fastdispatch.bench import scenarios as sc
import fastdispatch
rounds, collect = int(sys.argv[1]), sys.argv[2] == "collect"
assert fastdispatch.IMPLEMENTATION == "cython", fastdispatch.IMPLEMENTATION
contenders = {
    "floor": sc.EndToEnd("floor"),
    "1": sc.EndToEnd("fastdispatch", producers=1),
    "2": sc.EndToEnd("fastdispatch", producers=2),
}
collector = {}
times = sc.time_rounds(contenders, rounds, warmup=1, block=max(1, rounds // 2),
                       collect=collect, collector=collector)
for contender in contenders.values():
    contender.close()
is_gil_enabled = getattr(sys, "_is_gil_enabled", lambda: True)
print(json.dumps({
    "version": sys.version.split()[0],
    "free_threaded_build": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    "gil": is_gil_enabled(),
    "times": times,
    "collections": collector,
}))
"""


def _runs(pythons):
    """(label, python, env) for each interpreter (twice for a free-threaded one)."""
    runs = []
    for python in pythons:
        probe = subprocess.run(
            [python, "-c", "import sysconfig; print(bool(sysconfig.get_config_var('Py_GIL_DISABLED')))"],
            capture_output=True, text=True, check=True)
        if probe.stdout.strip() == "True":
            runs.append((python, {"PYTHON_GIL": "0"}))
            runs.append((python, {"PYTHON_GIL": "1"}))
        else:
            runs.append((python, {}))
    return runs


def _child(python, env, rounds, collect):
    proc = subprocess.run([python, "-c", CHILD, str(rounds), "collect" if collect else "natural"],
                          capture_output=True, text=True,
                          env=dict(os.environ, **env), check=False)
    if proc.returncode:
        raise SystemExit("%s failed (is fastdispatch installed there, with its compiled "
                         "core?):\n%s" % (python, proc.stderr[-2000:]))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", action="append", required=True,
                        help="an interpreter with fastdispatch installed (repeat)")
    parser.add_argument("--rounds", type=int, default=6,
                        help="timed rounds per contender per turn (default 6)")
    parser.add_argument("--turns", type=int, default=3,
                        help="turns each interpreter takes (default 3)")
    parser.add_argument("--collect", action="store_true",
                        help="gc.collect() before every round (the old method, to compare)")
    args = parser.parse_args(argv)

    runs = _runs(args.python)
    pooled = [None] * len(runs)
    for turn in range(args.turns):
        for i, (python, env) in enumerate(runs):
            sys.stderr.write("turn %d/%d: %s %s\n" % (turn + 1, args.turns, python,
                                                       " ".join("%s=%s" % kv for kv in env.items())))
            result = _child(python, env, args.rounds, args.collect)
            if pooled[i] is None:
                pooled[i] = result
            else:
                for key, ts in result["times"].items():
                    pooled[i]["times"][key].extend(ts)
                for key, cs in result["collections"].items():
                    pooled[i]["collections"][key].extend(cs)

    print("e2e: submit 10k over 1000 chats, compiled core, max_inflight=8; %d CPUs; %s"
          % (os.cpu_count() or 0, "gc.collect() before every round" if args.collect
             else "the garbage collector as in a program"))
    print("throughput / floor (floor: Future() created, set, read in one thread; "
          "ideal with 2 producers on 2 cores: 2.0); per task: median round / 10,000;\n"
          "gc, 1 producer: collections per round and the share of the round spent in "
          "them (medians)\n")
    header = ("interpreter", "GIL", "floor / task", "1 producer", "2 producers", "2 vs 1",
              "per task 1 / 2", "gc, 1 producer")
    rows = []
    for (python, env), result in zip(runs, pooled):
        med = {key: statistics.median(ts) for key, ts in result["times"].items()}
        floor = med["floor"]
        build = result["version"] + ("t" if result["free_threaded_build"] else "")
        gc_runs = result["collections"]["1"]
        share = statistics.median(secs / t for (_, secs), t in zip(gc_runs, result["times"]["1"]))
        rows.append((build, "on" if result["gil"] else "off",
                     "%.1f us" % (floor / 10_000 * 1e6),
                     "%.2f" % (floor / med["1"]), "%.2f" % (floor / med["2"]),
                     "%.2fx" % (med["1"] / med["2"]),
                     "%.1f / %.1f us" % (med["1"] / 10_000 * 1e6, med["2"] / 10_000 * 1e6),
                     "%g, %.0f%%" % (statistics.median(n for n, _ in gc_runs), 100 * share)))
    widths = [max(len(str(r[c])) for r in rows + [header]) for c in range(len(header))]
    line = "  ".join("%-*s" % (w, h) for w, h in zip(widths, header))
    print(line)
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join("%-*s" % (w, v) for w, v in zip(widths, row)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
