"""``python -m fastdispatch.cluster bench``: the cluster at scale, against its limit.

Real ``nats-server -js`` and ``redis-server`` on loopback, ``--workers``
worker processes with the demo's recording sender (``--latency`` per send),
``--chats`` chats x ``--per-chat`` messages published up front over
``--shards`` shards, a global limit and a per-chat limit.  For each chat
count given (``--chats 10000 1000`` runs both, in one run), it reports:

- steady throughput (sends/s over whole limiter windows within the middle
  80 % of the sends, from the sender's own record: ``_steady_rate``) and its
  ratio to the global limit (at most ``per / (per + guard)``, 0.95 with the
  defaults);
- limiter calls per send (Redis ``INFO commandstats``: EVALSHA/EVAL calls
  over the run, divided by the sends);
- Redis CPU per send (``INFO cpu``: user + system seconds over the run);
- worker RSS at the end (``/proc/<pid>/status``, Linux);
- the verification of order, overlap and both limits (``_verify.py``).

The figure a throughput goal is judged on; the test suite keeps none (a
test that fails on a slow machine would be a defect).
"""

import argparse
import bisect
import os
import tempfile
import time

from ._demo import LocalCluster, _count_lines, _limit, wait_for
from ._verify import read_file_records, verify

__all__ = ["main"]


def _redis_counters(client):
    stats = client.info("commandstats")
    calls = sum(v.get("calls", 0) for k, v in stats.items()
                if k in ("cmdstat_evalsha", "cmdstat_eval"))
    cpu = client.info("cpu")
    return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _rss_mib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def _steady_rate(starts, window):
    """Sends/s over whole limiter windows, from the 10th percentile of the start times.

    At the limit the starts come in bursts, ``window`` (the limiter's
    ``per + guard``) apart: a sliding-window log repeats its first burst.
    Counted over as many whole windows as fit before the 90th percentile, it
    is the long-run rate (over any other span a burst more or less skews it);
    the first and last tenth (the workers' start, the last shards' tails)
    are left out.
    """
    if len(starts) < 10:
        return None
    starts = sorted(starts)
    lo, hi = starts[len(starts) // 10], starts[len(starts) * 9 // 10]
    windows = int((hi - lo) // window)
    if windows < 1:
        return None
    end = lo + windows * window
    return (bisect.bisect_left(starts, end) - bisect.bisect_left(starts, lo)) / (end - lo)


def run_one(args, chats, global_limit, chat_limit):
    import redis

    from ._producer import ClusterProducer

    record = tempfile.mkdtemp(prefix="fastdispatch-bench-record-")
    env = {"FD_DEMO_RECORD": record, "FD_DEMO_LATENCY": str(args.latency)}
    worker_args = ["--global-limit", args.global_limit, "--chat-limit", args.chat_limit,
                   "--ack-wait", str(args.ack_wait), "--fetch-timeout", "1",
                   "--limit-guard", str(args.limit_guard), "--log-level", "WARNING"]
    total = chats * args.per_chat
    with LocalCluster(stream="bench", sender="fastdispatch.cluster._demo:make_sender",
                      worker_args=worker_args, env=env) as cluster:
        producer = ClusterProducer(nats_url=cluster.nats.url, stream="bench",
                                   shards=args.shards, ack_wait=args.ack_wait,
                                   publish_timeout=30.0)
        expected = {}
        for _ in range(args.per_chat):
            for c in range(chats):
                chat = "chat%d" % c
                expected[chat] = expected.get(chat, 0) + 1
                producer.publish(chat, str(expected[chat] - 1).encode())
        client = redis.Redis.from_url(cluster.redis.url)
        calls0, cpu0 = _redis_counters(client)
        workers = [cluster.spawn_worker() for _ in range(args.workers)]
        t0 = time.monotonic()
        limit_floor = total / (global_limit.count / global_limit.per)
        finished = wait_for(lambda: _count_lines(record) >= total,
                            max(120.0, args.timeout_factor * limit_floor), 1.0)
        wall = time.monotonic() - t0
        calls1, cpu1 = _redis_counters(client)
        rss = [_rss_mib(w.pid) for w in workers]
        codes = [cluster.terminate(w) for w in workers]
        producer.close()
        client.close()
        records = read_file_records(record)
        verdict = verify(records, expected, global_limit=global_limit, chat_limit=chat_limit)
    sent = len(records)
    rate = _steady_rate([r.start for r in records], global_limit.per + args.limit_guard)
    limit_rate = global_limit.count / global_limit.per
    return {
        "chats": chats, "messages": total, "sent": sent, "finished": finished,
        "wall": wall, "floor": limit_floor,
        "steady": rate, "ratio": None if rate is None else rate / limit_rate,
        "calls_per_send": (calls1 - calls0) / sent if sent else None,
        "redis_cpu_ms_per_send": 1000.0 * (cpu1 - cpu0) / sent if sent else None,
        "rss_mib": [r for r in rss if r is not None], "exit_codes": codes,
        "verdict": verdict,
    }


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fastdispatch.cluster bench",
                                description="The cluster at scale against its global limit.")
    p.add_argument("--chats", type=int, nargs="+", default=[10000, 1000],
                   help="chat counts to run, one after the other (default 10000 1000)")
    p.add_argument("--per-chat", type=int, default=3)
    p.add_argument("--shards", type=int, default=128)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--global-limit", default="500/1")
    p.add_argument("--chat-limit", default="1/1")
    p.add_argument("--latency", type=float, default=0.005, help="simulated send time (s)")
    p.add_argument("--ack-wait", type=float, default=6.0)
    p.add_argument("--limit-guard", type=float, default=0.05)
    p.add_argument("--timeout-factor", type=float, default=5.0,
                   help="give up after this many times the limit-imposed minimum")
    args = p.parse_args(argv)
    global_limit, chat_limit = _limit(args.global_limit), _limit(args.chat_limit)
    rows = []
    for chats in args.chats:
        print("running %d chats x %d over %d shards, %d workers, global %s, chat %s ..."
              % (chats, args.per_chat, args.shards, args.workers, args.global_limit,
                 args.chat_limit), flush=True)
        rows.append(run_one(args, chats, global_limit, chat_limit))
    print()
    print("| chats | messages | sent | steady sends/s | x limit | wall / minimum "
          "| limiter calls/send | Redis CPU ms/send | worker RSS MiB | order, limits |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    ok = True
    for r in rows:
        v = r["verdict"]
        clean = (not v.missing and not v.order_violations and not v.overlaps
                 and v.global_max <= v.global_limit.count and v.chat_max <= v.chat_limit.count)
        ok = ok and clean and r["finished"]
        print("| %d | %d | %d | %s | %s | %s | %s | %s | %s | %s |" % (
            r["chats"], r["messages"], r["sent"], _fmt(r["steady"], ".1f"),
            _fmt(r["ratio"], ".2f"), _fmt(r["wall"] / r["floor"], ".2f"),
            _fmt(r["calls_per_send"], ".2f"), _fmt(r["redis_cpu_ms_per_send"], ".3f"),
            "/".join("%.0f" % x for x in r["rss_mib"]) or "-",
            "clean" if clean else "FAILED: " + "; ".join(v.lines()[1:6])))
    return 0 if ok else 1
