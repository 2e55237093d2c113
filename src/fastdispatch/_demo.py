"""``python -m fastdispatch demo``: many chats, simulated network, verified order.

Several producer threads play bot handlers replying to hundreds of chats; a
fake platform API sleeps for a random latency per send (the network).  At the
end the demo checks that every chat received its messages in the order they
were sent, with never two sends of one chat in flight at once, and prints
throughput and latency percentiles.  Exit status 0 means every check held.
"""

import argparse
import random
import sys
import threading
import time

from . import IMPLEMENTATION, OutboundDispatcher


class FakePlatform:
    """Stands in for a chat API: records arrival order and per-chat overlap."""

    def __init__(self, latency_ms, seed):
        self._latency = latency_ms / 1000.0
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._lock = threading.Lock()
        self.received = {}
        self.in_flight = {}
        self.overlaps = 0

    def send(self, sc, chat, seq):
        with self._rng_lock:
            delay = self._rng.uniform(0.5, 1.5) * self._latency
        with self._lock:
            self.in_flight[chat] = self.in_flight.get(chat, 0) + 1
            if self.in_flight[chat] > 1:
                self.overlaps += 1
        sc.wait(delay)  # a real client would use sc.remaining() as its timeout
        with self._lock:
            self.in_flight[chat] -= 1
            self.received.setdefault(chat, []).append(seq)
        return seq


def _percentile(sorted_values, q):
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, int(round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def _bar(done, total, started, width=30):
    filled = int(width * done / total)
    elapsed = time.monotonic() - started
    return "\r  [%s%s] %6d/%d sends  %5.1fs" % (
        "#" * filled, "." * (width - filled), done, total, elapsed)


def run(messages, chats, producers, latency_ms, max_inflight, seed, out):
    platform = FakePlatform(latency_ms, seed)
    latencies = []
    lat_lock = threading.Lock()
    done = [0]

    def make_task(chat, seq, t_submit):
        def task(sc):
            result = platform.send(sc, chat, seq)
            with lat_lock:
                latencies.append(time.monotonic() - t_submit)
                done[0] += 1
            return result
        return task

    # Each chat's messages are numbered by the single producer that owns it,
    # so "submission order" is well defined per chat.
    def produce(index, futures):
        rng = random.Random(seed + index)
        owned = [c for c in range(chats) if c % producers == index]
        counters = dict.fromkeys(owned, 0)
        for _ in range(messages // producers):
            chat = rng.choice(owned)
            seq = counters[chat]
            counters[chat] += 1
            futures.append(d.submit(chat, make_task(chat, seq, time.monotonic())))

    out.write("fastdispatch demo (%s core): %d messages to %d chats from %d "
              "producer threads, ~%d ms per send, max_inflight=%d\n"
              % (IMPLEMENTATION, messages // producers * producers, chats,
                 producers, latency_ms, max_inflight))
    started = time.monotonic()
    d = OutboundDispatcher(max_inflight=max_inflight, queue_size=messages,
                           send_timeout=30.0)
    futures = [[] for _ in range(producers)]
    threads = [threading.Thread(target=produce, args=(i, futures[i]))
               for i in range(producers)]
    for t in threads:
        t.start()
    total = messages // producers * producers
    while any(t.is_alive() for t in threads) or done[0] < total:
        out.write(_bar(done[0], total, started))
        out.flush()
        if not d.drain(timeout=0.1) and time.monotonic() - started > 600:
            break
        if done[0] >= total:
            break
    for t in threads:
        t.join()
    ok_drain = d.shutdown(timeout=60)
    elapsed = time.monotonic() - started
    out.write(_bar(done[0], total, started) + "\n")

    failures = sum(1 for fs in futures for f in fs if f.exception() is not None)
    out_of_order = [c for c, seqs in platform.received.items()
                    if seqs != sorted(seqs) or seqs != list(range(len(seqs)))]
    delivered = sum(len(s) for s in platform.received.values())
    latencies.sort()
    # No schedule can beat either the total send time spread over
    # max_inflight threads, or the busiest chat's sends one after another.
    busiest = max((len(seqs) for seqs in platform.received.values()), default=0)
    bound = max(total / max_inflight, busiest) * latency_ms / 1000.0
    out.write("\n  delivered       %d / %d  (%d failed)\n" % (delivered, total, failures))
    out.write("  per-chat order  %s (%d chats checked)\n" % (
        "OK" if not out_of_order else "BROKEN in %d chats" % len(out_of_order),
        len(platform.received)))
    out.write("  one at a time   %s\n" % (
        "OK" if not platform.overlaps else "BROKEN (%d overlaps)" % platform.overlaps))
    out.write("  wall time       %.2f s  (lower bound %.2f s: the busiest chat's %d sends"
              " in a row,\n                  or all sends spread over max_inflight threads)\n"
              % (elapsed, bound, busiest))
    out.write("  throughput      %.0f sends/s\n" % (total / elapsed))
    out.write("  latency         p50 %.0f ms   p90 %.0f ms   p99 %.0f ms   max %.0f ms"
              "  (submit to delivered)\n" % tuple(
                  1000 * _percentile(latencies, q) for q in (0.5, 0.9, 0.99, 1.0)))
    out.write("  stats           %s\n" % (d.stats(),))
    ok = (ok_drain and delivered == total and not failures and not out_of_order
          and not platform.overlaps)
    out.write("\n%s\n" % ("all checks passed" if ok else "CHECKS FAILED"))
    return 0 if ok else 1


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fastdispatch demo",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--chats", type=int, default=300)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--max-inflight", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.producers < 1 or args.chats < args.producers or args.messages < args.producers:
        parser.error("need messages >= producers, chats >= producers >= 1")
    return run(args.messages, args.chats, args.producers, args.latency_ms,
               args.max_inflight, args.seed, sys.stdout)
