"""Free-threaded vs GIL: end-to-end throughput with 1 and 2 producers, as multiples of the floor.

Run (each interpreter must have fastdispatch installed with its compiled core):

    python bench/freethreading.py --python .venv-ft/bin/python --python .venv313/bin/python

``PYTHON=python3.13t bash tools/dev.sh freethreaded`` makes ``.venv-ft``;
``python3.13 -m venv .venv313 && .venv313/bin/pip install ".[test]"`` the
other.  A free-threaded interpreter is measured twice, with ``PYTHON_GIL=0``
and with ``PYTHON_GIL=1``.

The workload is ``fastdispatch._bench``'s ``e2e: submit 10k over 1000
chats`` (``producers: N``): 10,000 no-op tasks round-robin over 1,000 chats,
submitted from N threads that each wait for their Futures, on the compiled
core with ``max_inflight=8``.  The floor is the same interpreter creating,
setting and reading 10,000 ``Future``s in one thread.  The figure is
throughput ÷ the floor's throughput (floor time ÷ time): 1.0 means the
dispatcher moves tasks across threads as fast as one thread can merely
resolve Futures; on two cores the ideal with two producers is 2.0.  The
interpreters take turns (``--turns``) so that a slow spell of a shared
machine spreads over all of them; each reports medians.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, sysconfig
from fastdispatch import _bench
import fastdispatch
rounds = int(sys.argv[1])
assert fastdispatch.IMPLEMENTATION == "cython", fastdispatch.IMPLEMENTATION
scenarios = {
    "floor": _bench.EndToEnd("floor"),
    "1": _bench.EndToEnd("fastdispatch", producers=1),
    "2": _bench.EndToEnd("fastdispatch", producers=2),
}
times = _bench.time_rounds(scenarios, rounds, warmup=1, block=max(1, rounds // 2))
for scenario in scenarios.values():
    scenario.close()
is_gil_enabled = getattr(sys, "_is_gil_enabled", lambda: True)
print(json.dumps({
    "version": sys.version.split()[0],
    "free_threaded_build": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    "gil": is_gil_enabled(),
    "times": times,
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


def _child(python, env, rounds):
    proc = subprocess.run([python, "-c", CHILD, str(rounds)], capture_output=True, text=True,
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
    args = parser.parse_args(argv)

    runs = _runs(args.python)
    pooled = [None] * len(runs)
    for turn in range(args.turns):
        for i, (python, env) in enumerate(runs):
            sys.stderr.write("turn %d/%d: %s %s\n" % (turn + 1, args.turns, python,
                                                       " ".join("%s=%s" % kv for kv in env.items())))
            result = _child(python, env, args.rounds)
            if pooled[i] is None:
                pooled[i] = result
            else:
                for key, ts in result["times"].items():
                    pooled[i]["times"][key].extend(ts)

    print("e2e: submit 10k over 1000 chats, compiled core, max_inflight=8; %d CPUs"
          % (os.cpu_count() or 0))
    print("throughput / floor (floor: Future() created, set, read in one thread; "
          "ideal with 2 producers on 2 cores: 2.0)\n")
    header = ("interpreter", "GIL", "floor / task", "1 producer", "2 producers", "2 vs 1")
    rows = []
    for (python, env), result in zip(runs, pooled):
        med = {key: statistics.median(ts) for key, ts in result["times"].items()}
        floor = med["floor"]
        build = result["version"] + ("t" if result["free_threaded_build"] else "")
        rows.append((build, "on" if result["gil"] else "off",
                     "%.0f ns" % (floor / 10_000 * 1e9),
                     "%.2f" % (floor / med["1"]), "%.2f" % (floor / med["2"]),
                     "%.2fx" % (med["1"] / med["2"])))
    widths = [max(len(str(r[c])) for r in rows + [header]) for c in range(len(header))]
    line = "  ".join("%-*s" % (w, h) for w, h in zip(widths, header))
    print(line)
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join("%-*s" % (w, v) for w, v in zip(widths, row)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
