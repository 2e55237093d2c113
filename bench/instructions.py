"""Instruction counts (valgrind callgrind) for the target scenarios: ratios without noise.

Run:  python bench/instructions.py            (needs valgrind; ~4 minutes)
      python bench/instructions.py --quick    (submit/post only, ~1 minute)
      python bench/instructions.py --pacing   (a paced task against one not paced)
      python bench/instructions.py --learned  (a task that reports a learned limit)

Wall-clock ratios on a shared two-core machine move with the neighbours'
load and with the allocator's state; instruction counts do not.  Each
contender runs the scenario of ``fastdispatch.bench.scenarios`` under callgrind
twice, with ``1`` and ``1 + rounds`` rounds, and the difference divided by
``rounds * ops`` is the cost of one operation:

- submit-side scenarios count only the timed call (``--toggle-collect`` on
  the ``exec`` that runs it; the workers are held blocked meanwhile);
- end-to-end scenarios count every thread of the process for the whole
  round (the work of producing, dispatching, running and resolving).

Instructions are CPU work, not time: they say nothing about waiting for a
thread to be woken or for the GIL, which the wall-clock runs measure.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

RUNNER = r"""
import sys
from fastdispatch.bench import scenarios
group, impl, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
scenario = scenarios.make_scenario(group, impl)
timed = compile("scenario.run()", "<timed>", "exec")
for _ in range(rounds):
    scenario.setup()
    exec(timed)
scenario.close()
"""

# Pacing: the whole life of 10,000 no-op posts over 1,000 chats on one
# worker, with the queues filled while the worker is held at a gate (so the
# count does not depend on how producer and worker interleave), without
# pacing and with limits that never bind (the cost of the checks alone).
# Learned limits (--learned): every task reports a budget that never binds,
# its chat's own ("report") or a shared bucket of ten chats ("report
# shared"), against a task that reports nothing (the "plain" one, whose
# count says what learned limits cost a dispatcher that never uses them).
PACING_RUNNER = r"""
import sys, threading
from fastdispatch import OutboundDispatcher, Pacing, RateLimit
mode, rounds = sys.argv[1], int(sys.argv[3])
kwargs = {}
if mode == "paced":
    kwargs["pacing"] = Pacing(global_limit=RateLimit(1_000_000, per=1.0),
                              chat_limit=RateLimit(1_000, per=1.0))
sys.setswitchinterval(1.0)
d = OutboundDispatcher(max_inflight=1, **kwargs)
noop = lambda sc: None
if mode == "report":
    noop = lambda sc: sc.report_limit(1_000_000, 600.0)
elif mode == "report shared":
    buckets = ["b%d" % i for i in range(100)]
    noop = lambda sc: sc.report_limit(1_000_000, 600.0, bucket=buckets[sc.chat_id % 100])
for _ in range(rounds):
    gate = threading.Event()
    d.post("gate", lambda sc: gate.wait())
    for i in range(10_000):
        d.post(i % 1_000, noop)
    gate.set()
    d.drain()
d.shutdown()
"""
PACING_OPS = 10_000

# (group, contenders, only the timed call?)
PLAN = (
    ("submit: busy chat", ("fastdispatch", "fastdispatch-py", "floor"), True),
    ("inject: post to a busy chat", ("fastdispatch", "fastdispatch-py", "floor"), True),
    ("e2e: submit 10k over 1000 chats",
     ("fastdispatch", "fastdispatch-py", "threadpool", "futures-only", "floor"), False),
    ("e2e: post 10k over 1000 chats",
     ("fastdispatch", "fastdispatch-py", "threadpool", "floor"), False),
)


def collected(group, impl, rounds, timed_only, runner=RUNNER):
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["valgrind", "--tool=callgrind",
               "--callgrind-out-file=" + os.path.join(tmp, "cg.out")]
        if timed_only:
            cmd.append("--toggle-collect=builtin_exec")
        cmd += [sys.executable, "-c", runner, group, impl, str(rounds)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode or not found:
        raise SystemExit("callgrind failed for %s / %s:\n%s" % (group, impl, proc.stderr[-2000:]))
    return int(found.group(1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds counted beyond the first (default 2)")
    parser.add_argument("--quick", action="store_true",
                        help="only the submit-side scenarios")
    parser.add_argument("--pacing", action="store_true",
                        help="only the cost of pacing: a task paced (limits that never "
                             "bind) against one not paced, whole process, ~1 minute")
    parser.add_argument("--learned", action="store_true",
                        help="only the cost of learned limits: a task that reports a "
                             "budget (never binding) against one that does not, ~1 minute")
    args = parser.parse_args(argv)
    if args.pacing:
        return pacing_cost(args.rounds)
    if args.learned:
        return pacing_cost(args.rounds, modes=LEARNED_MODES)
    from fastdispatch.bench import report, scenarios

    plan = PLAN[:2] if args.quick else PLAN
    print("instructions per operation (callgrind); %s" % report.describe_machine())
    for group, impls, timed_only in plan:
        per_op = {}
        for impl in impls:
            scenario = scenarios.make_scenario(group, impl)
            n_ops = scenario.ops
            scenario.close()
            base = collected(group, impl, 1, timed_only)
            more = collected(group, impl, 1 + args.rounds, timed_only)
            per_op[impl] = (more - base) / (args.rounds * n_ops)
            sys.stderr.write("  %s / %s: %.0f\n" % (group, impl, per_op[impl]))
        ref = per_op.get("floor")
        rows = [(impl, "%.0f" % v, "" if not ref else "%.2f" % (v / ref))
                for impl, v in per_op.items()]
        print("\n%s  (%s)" % (group, "timed call only" if timed_only else "all threads"))
        print(report.format_table(("contender", "instructions / op", "x floor"), rows))
    return 0


PACING_MODES = (("plain", "no pacing"),
                ("paced", "paced (global + chat limits, never binding)"))
LEARNED_MODES = (("plain", "no pacing, no report"),
                 ("report", "each task reports its chat's budget (never binding)"),
                 ("report shared", "each task reports a shared bucket (never binding)"))


def pacing_cost(rounds, modes=PACING_MODES):
    from fastdispatch.bench import report
    print("instructions per task, whole process (callgrind); %s" % report.describe_machine())
    per_task = {}
    for mode, _ in modes:
        base = collected(mode, "-", 1, False, runner=PACING_RUNNER)
        more = collected(mode, "-", 1 + rounds, False, runner=PACING_RUNNER)
        per_task[mode] = (more - base) / (rounds * PACING_OPS)
    plain = per_task["plain"]
    rows = [(label, "%.0f" % per_task[mode], "%.2f" % (per_task[mode] / plain))
            for mode, label in modes]
    print("\ne2e: post 10k over 1000 chats, one worker (all threads)")
    print(report.format_table(("dispatcher", "instructions / task", "x no pacing"), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
