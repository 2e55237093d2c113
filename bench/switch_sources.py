"""Where the involuntary context switches of a run come from, by the code that gave up the CPU.

    python bench/switch_sources.py --python .venv-ft/bin/python [--mode post|submit] [--rounds 30]

``bench/freethreading.py`` counts the involuntary context switches of the
end-to-end workload (``getrusage``); this says what they are.  It runs the
same workload (10,000 no-op tasks round-robin over 1,000 chats, compiled
core, one producer, ``max_inflight=8``; ``post`` + ``drain()`` or
``submit`` + wait) in the interpreter given, with ``PYTHON_GIL=0``, under
``perf record -e sched:sched_switch --call-graph dwarf``.  A switch away
from a thread that is still runnable (``prev_state=R``) is what the kernel
counts as involuntary: the thread yielded the CPU (``sched_yield``, which
CPython 3.13's locks call while they spin on a held mutex) or was
preempted (a timer tick, or a thread it had just woken taking its core).
Each such switch is put in the first group of ``GROUPS`` whose test its
call stack passes, and the groups are printed with their shares.

Needs ``perf`` and leave to trace scheduler events (root, or
``kernel.perf_event_paranoid`` at -1).  The figures and what they led to:
``bench/notes/freethreading.md``.
"""

import argparse
import collections
import os
import subprocess
import sys
import tempfile

# The child: the rounds of one contender, timed as bench/freethreading.py
# times them (scenarios.time_rounds); prints its per-task figures, and the
# voluntary switches of the whole run (the sleeps, for comparison).
CHILD = r"""
import resource, statistics, sys
from fastdispatch.bench import scenarios as sc
mode, rounds = sys.argv[1], int(sys.argv[2])
c = sc.EndToEnd("fastdispatch", producers=1, post=(mode == "post"), threads=8)
switches = {}
voluntary = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
times = sc.time_rounds({mode: c}, rounds, warmup=3, block=rounds, switches=switches)[mode]
voluntary = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - voluntary
print("%s: %.3f us per task (under perf), involuntary switches %.0f per 10,000 tasks, "
      "voluntary %.0f in the run" % (mode, statistics.median(times) / c.ops * 1e6,
                                     statistics.median(switches[mode]) / c.ops * 1e4, voluntary))
c.close()
"""

# (group, test of the stack: its frames innermost first, joined by " < "),
# tried in this order.
GROUPS = (
    ("a woken SimpleQueue sleeper taking back the queue's critical section",
     lambda s: "_PyCriticalSection_Resume" in s and "_PySemaphore_Wait" in s),
    ("a dict's critical section in a part of the chat map (PyDict_Pop, PyDict_SetDefaultRef)",
     lambda s: "_PyCriticalSection_Begin" in s and ("PyDict_Pop" in s or "PyDict_SetDefault" in s)),
    ("another critical section",
     lambda s: "_PyCriticalSection_Begin" in s),
    ("biased reference counting: an object queued to its creating thread, or merged there",
     lambda s: "_Py_brc_" in s),
    ("a threading.Lock taken from Python code (drain()'s Condition, a thread's start)",
     lambda s: "lock_PyThread_acquire_lock" in s),
    ("the core's own locks after their spin (pool, chat queue, map part, timer)",
     lambda s: _caller_of_mutex(s).startswith("__pyx_f_12fastdispatch")),
    ("the waker preempted by the thread it just woke (futex wake)",
     lambda s: "futex_wake" in s or "sem_post" in s),
    ("another sched_yield",
     lambda s: "sched_yield" in s),
    ("preempted at a timer tick or another interrupt",
     lambda s: "irqentry" in s or "asm_sysvec" in s or "asm_exc" in s),
    ("anything else",
     lambda s: True),
)


def _caller_of_mutex(stack):
    # The function that took a PyMutex whose slow path yielded ("" if none):
    # the first frame past CPython's lock functions and the core's spin.
    frames = stack.split(" < ")
    if "_PyMutex_LockTimed" not in frames:
        return ""
    for frame in frames[frames.index("_PyMutex_LockTimed") + 1:]:
        if frame not in ("PyMutex_Lock", "_PyMutex_Lock", "fd_mutex_lock", "fd_mutex_lock_parking"):
            return frame
    return ""


def involuntary_stacks(perf_script_text):
    """The call stacks (innermost first) of the switches away from a runnable thread."""
    for event in perf_script_text.split("\n\n"):
        lines = event.strip().splitlines()
        if not lines or "prev_state=R" not in lines[0]:
            continue
        frames = []
        for line in lines[1:]:
            parts = line.split()
            if len(parts) >= 2:
                frames.append(parts[1].split("+")[0])
        yield frames


def group_counts(perf_script_text):
    """{group: switches}, every group of GROUPS present (0 when none fell in it)."""
    counts = collections.Counter({name: 0 for name, _ in GROUPS})
    for frames in involuntary_stacks(perf_script_text):
        stack = " < ".join(frames)
        for name, test in GROUPS:
            if test(stack):
                counts[name] += 1
                break
    return counts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True,
                        help="a free-threaded interpreter with fastdispatch installed")
    parser.add_argument("--mode", choices=("post", "submit"), default="post")
    parser.add_argument("--rounds", type=int, default=30,
                        help="timed rounds of 10,000 tasks (default 30)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        run = subprocess.run(
            ["perf", "record", "-q", "-o", data, "-e", "sched:sched_switch",
             "--call-graph", "dwarf,16384", "--", args.python, "-c", CHILD, args.mode,
             str(args.rounds)],
            env=dict(os.environ, PYTHON_GIL="0"), capture_output=True, text=True)
        if run.returncode:
            sys.stderr.write(run.stderr[-2000:])
            return run.returncode
        script = subprocess.run(["perf", "script", "-i", data], capture_output=True, text=True,
                                check=True)
    print(run.stdout.strip())
    counts = group_counts(script.stdout)
    total = sum(counts.values())
    print("%d switches away from a runnable thread (the whole process, warm-up included)" % total)
    for name, _ in GROUPS:
        print("%6.1f %%  %7d  %s" % (100.0 * counts[name] / max(total, 1), counts[name], name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
