"""asubmit against the asyncio code users write: CPU per task, flat with the number of chats.

Runs the contenders of ``fastdispatch.bench.asyncio`` (the floor: a per-chat
``asyncio.Lock`` + a global ``asyncio.Semaphore``; an ``asyncio.Queue`` per
chat + consumer; ``gather`` + ``Semaphore`` without order; ``asubmit`` on
both cores) in interleaved rounds and prints every run, then the median of
each contender's CPU per task and the median of its same-round ratios to the
floor.  Scenarios:

- 1,000 chats x 10 tasks at max_inflight 100 and 1,000;
- the sweep over the number of chats (max_inflight 1,000): 1,000 / 10,000 /
  30,000 / 100,000 chats with max(10,000, chats) tasks in all (10 per chat
  at 1,000 chats, one per chat from 10,000 on).

    python bench/asyncio_floor.py                  # everything, 7 rounds
    python bench/asyncio_floor.py --only inflight  # the two max_inflight rows
    python bench/asyncio_floor.py --only sweep --contenders asubmit,lock+semaphore
    python bench/asyncio_floor.py --only sweep --chats 100000 --rounds 3
"""

import argparse
import sys

from fastdispatch.bench.asyncio import CONTENDERS, FLOOR, measure_rounds, summarize

INFLIGHT = ((1000, 10, 100), (1000, 10, 1000))
SWEEP = ((1000, 10, 1000), (10_000, 1, 1000), (30_000, 1, 1000), (100_000, 1, 1000))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", choices=("inflight", "sweep"))
    parser.add_argument("--chats", default="",
                        help="comma-separated: only the sweep's rows with these numbers of chats")
    parser.add_argument("--contenders", default=",".join(CONTENDERS),
                        help="comma-separated (the floor is always measured)")
    args = parser.parse_args(argv)
    names = [n for n in args.contenders.split(",") if n]
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown:
        parser.error("unknown contenders %s (known: %s)" % (unknown, ", ".join(CONTENDERS)))
    if FLOOR not in names:
        names.insert(0, FLOOR)
    scenarios = {"inflight": INFLIGHT, "sweep": SWEEP}
    plan = []
    for key in ("inflight", "sweep"):
        if args.only in (None, key):
            plan.extend(s for s in scenarios[key] if s not in plan)
    if args.chats:
        only = {int(n) for n in args.chats.split(",")}
        plan = [s for s in plan if s[0] in only]
    per_chats = {}
    for chats, per_chat, max_inflight in plan:
        print("\n%d chats x %d tasks, max_inflight %d (%d rounds; us of CPU per task)"
              % (chats, per_chat, max_inflight, args.rounds), flush=True)
        runs = measure_rounds(names, chats, per_chat, max_inflight, args.rounds,
                              lambda msg: print("  " + msg, flush=True))
        summary = summarize(runs)
        for name, (us, ratio, ratios) in summary.items():
            print("  %-18s median %7.2f us   / floor: median %.2f  (rounds: %s)"
                  % (name, us, ratio, " ".join("%.2f" % r for r in ratios)))
        if max_inflight == 1000:
            per_chats[chats] = summary
    if len(per_chats) > 1:
        first = min(per_chats)
        print("\nflatness (max_inflight 1000): us per task at N chats / at %d chats" % first)
        for name in names:
            print("  %-18s %s" % (name, "  ".join(
                "%dk: %.2f (%.2f us, %.2fx floor)" % (
                    n // 1000, s[name][0] / per_chats[first][name][0], s[name][0], s[name][1])
                for n, s in sorted(per_chats.items()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
