"""The durable outbox: sends per second, against persist-queue, and its cost per reply.

    python bench/outbox.py [--seconds 1] [--rounds 3] [--dir DIR]    # ~1.5 minutes

Three tables, measured in one run:

1. **Durable sends/s**: 1, 8 and 64 threads call ``Outbox.send`` in a
   loop; every call returns once its row is committed
   (``durability="full"``: fsync'd; ``"normal"``: written, not synced).
   Beside it, the same threads ``put`` into ``persistqueue.SQLiteQueue``
   (``auto_commit=True``: each ``put`` commits, WAL, SQLite's default
   ``synchronous=FULL``): what a user would reach for instead.  The sender
   is an in-process no-op with ``call()``, so the figures are the outbox's
   own (the platform's HTTP round trip is not in them).  The three take
   turns in rounds of ``--seconds``; each cell is the median (and range)
   of its rounds, since a shared disk's fsync swings from under 1 ms to
   several within seconds.
2. **The fsync floor**: the median ``fdatasync`` of 4 KiB on ``--dir``,
   which bounds what N blocking callers can reach: N rows per fsync.
3. **Cost per reply over the in-memory dispatcher**: 20,000 replies to 100
   chats from 8 threads, through ``dispatcher.submit`` alone and through an
   Outbox (send, and wait until every reply was sent and marked): CPU
   microseconds per reply (every thread of the process) and wall seconds.

``--dir`` is where the files go (default: a temporary folder in the
current directory, i.e. on its disk; ``/dev/shm`` shows the CPU ceiling
with no fsync cost).  Needs ``pip install persist-queue`` (in the test
extra).  The machine this was written on is shared: run it a few times.
"""

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time

from fastdispatch import OutboundDispatcher
from fastdispatch.outbox import Outbox


class NoopSender:
    """A sender that answers at once: the outbox's cost alone."""

    def call(self, method, params, *, timeout=None):
        return True


def _run_threads(threads, seconds, one):
    """Call ``one()`` from ``threads`` threads for ``seconds``; return calls/s."""
    stop = threading.Event()
    counts = [0] * threads
    barrier = threading.Barrier(threads + 1)

    def loop(k):
        barrier.wait()
        n = 0
        while not stop.is_set():
            one(k, n)
            n += 1
        counts[k] = n

    workers = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    return sum(counts) / (time.perf_counter() - started)


def outbox_rate(folder, threads, durability, seconds):
    d = OutboundDispatcher(max_inflight=64)
    path = os.path.join(folder, "outbox-%s-%d.db" % (durability, threads))
    outbox = Outbox(path, d, senders={"noop": NoopSender()}, durability=durability)
    try:
        return _run_threads(threads, seconds, lambda k, n: outbox.send(
            (k * 7919 + n) % 1000, "sendMessage", {"chat_id": k, "text": "reply %d" % n}))
    finally:
        outbox.close(timeout=60)
        d.shutdown(timeout=60)


def persist_queue_rate(folder, threads, seconds):
    import persistqueue
    q = persistqueue.SQLiteQueue(os.path.join(folder, "pq-%d" % threads), auto_commit=True,
                                 multithreading=True)
    return _run_threads(threads, seconds, lambda k, n: q.put(
        {"chat_id": (k * 7919 + n) % 1000, "method": "sendMessage",
         "params": {"chat_id": k, "text": "reply %d" % n}}))


def fsync_floor(folder, count=200):
    path = os.path.join(folder, "fsync-probe")
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    try:
        os.write(fd, b"\0" * 4096 * count)
        os.fsync(fd)
        times = []
        for i in range(count):
            os.pwrite(fd, b"x" * 4096, 4096 * i)
            t = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(path)
    return statistics.median(times), sorted(times)[count // 10]


def cost_per_reply(folder, durability, replies=20000, chats=100, threads=8):
    """(CPU µs per reply, wall s) for the dispatcher alone and through an Outbox."""
    sender = NoopSender()
    per_thread = replies // threads

    def timed(one, finish):
        cpu, wall = time.process_time(), time.perf_counter()
        workers = [threading.Thread(target=lambda k=k: [one(k, n) for n in range(per_thread)])
                   for k in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        finish()
        return ((time.process_time() - cpu) / (per_thread * threads) * 1e6,
                time.perf_counter() - wall)

    d = OutboundDispatcher(max_inflight=64, queue_size=per_thread)
    plain = timed(lambda k, n: d.post((k + n * threads) % chats, lambda sc, n=n: sender.call(
        "sendMessage", {"chat_id": k, "text": "reply %d" % n})), lambda: d.drain(120))
    d.shutdown(60)
    d = OutboundDispatcher(max_inflight=64)
    outbox = Outbox(os.path.join(folder, "cost-%s.db" % durability), d,
                    senders={"noop": sender}, durability=durability)
    through = timed(lambda k, n: outbox.send((k + n * threads) % chats, "sendMessage",
                                             {"chat_id": k, "text": "reply %d" % n}),
                    lambda: outbox.drain(120))
    outbox.close(60)
    d.shutdown(60)
    return plain, through


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="one round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="outbox-bench-", dir=args.dir or os.getcwd())
    try:
        median, p10 = fsync_floor(folder)
        print("fdatasync of 4 KiB on %s: median %.2f ms, p10 %.2f ms"
              % (args.dir or "the current disk", median * 1e3, p10 * 1e3))
        print()
        print("sends/s, median of %d rounds of %g s (low-high); the three take turns:"
              % (args.rounds, args.seconds))
        print("%-8s %22s %22s %22s %10s" % ("threads", "outbox full", "outbox normal",
                                              "persist-queue", "full / pq"))
        for threads in (1, 8, 64):
            rates = {"full": [], "normal": [], "pq": []}
            for _ in range(args.rounds):
                rates["full"].append(outbox_rate(folder, threads, "full", args.seconds))
                rates["normal"].append(outbox_rate(folder, threads, "normal", args.seconds))
                rates["pq"].append(persist_queue_rate(folder, threads, args.seconds))
            cells = {k: "%6.0f (%5.0f-%5.0f)" % (statistics.median(v), min(v), max(v))
                     for k, v in rates.items()}
            print("%-8d %22s %22s %22s %9.1fx" % (
                threads, cells["full"], cells["normal"], cells["pq"],
                statistics.median(rates["full"]) / statistics.median(rates["pq"])))
        print()
        print("20,000 replies to 100 chats from 8 threads, no-op sender:")
        for durability in ("full", "normal"):
            plain, through = cost_per_reply(folder, durability)
            print("  dispatcher alone: %5.1f us CPU/reply, %5.2f s | outbox %-6s: %5.1f us "
                  "CPU/reply, %5.2f s | +%.1f us CPU per reply"
                  % (plain[0], plain[1], durability, through[0], through[1],
                     through[0] - plain[0]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
