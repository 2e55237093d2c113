"""Bench section ``discord``: limits learned from Discord's headers against a
sender that only retries on 429, over real HTTP to a FakeDiscordServer.

The same 2,000 messages over 100 channels (20 each; submitted round-robin,
then in bursts: each channel's 20 in a row) go to a server with Discord's limits scaled down ``SPEEDUP`` times (each
channel's bucket 5 per 5 s, the bot-wide 50 per 1 s, both divided):

- ``fastdispatch``  ``OutboundDispatcher(max_inflight=32,
                    pacing=Pacing.discord() scaled)`` submitting
                    ``DiscordSender.send``, which reports every answer's
                    ``X-RateLimit-*`` headers (``sc.report_limit``): each
                    channel is parked until its bucket resets, holding no
                    thread;
- ``naive``         what a user writes first: a ``ThreadPoolExecutor(32)``
                    sending each message, and on a 429 sleeping its
                    ``retry_after`` and sending again (the same
                    ``DiscordSender`` and connection pool, its limits unread).

Reported: the 429s each met, the invalid requests each spent (Discord bans
the IP for an hour at 10,000 in 10 minutes; every 429 but a shared one
counts), channels whose messages arrived out of order, and wall time
divided by the least time the limits allow (a fixed window of ``count``
per ``per`` lets ``n`` requests finish no sooner than ``((n - 1) // count)
* per``; the larger of the channel's and the global bound).

It also times a task that reports a limit against one that does not,
through a dispatcher without HTTP (the cost of learned limits per task;
the repository's ``bench/instructions.py --learned`` counts it without
timing noise).

``python -m fastdispatch bench --section discord`` runs it;
``bench/discord_learned.py`` prints the same table from the repository.
"""

import time
from concurrent.futures import ThreadPoolExecutor

MESSAGES, CHANNELS, INFLIGHT = 2000, 100, 32
SPEEDUP = 10.0
TOKEN = "MTEwMDAwMDAwMDAwMDAwMDAwMQ.bench.token"

TITLE = "Discord: learned limits against retry-on-429 (FakeDiscordServer, limits / %g)" % SPEEDUP
HEADER = ("measure", "fastdispatch", "naive", "ratio", "target", "")


def min_time(n, count, per):
    return ((n - 1) // count) * per if n > 0 else 0.0


def _plan(messages, channels, bursts=False):
    """(channel, text) in submission order: round-robin over the channels,
    or in bursts (each channel's messages in a row, as a busy channel's)."""
    per = -(-messages // channels)
    if bursts:
        return [(str(9000 + i // per), "m%d" % (i % per)) for i in range(messages)]
    return [(str(9000 + i % channels), "m%d" % (i // channels)) for i in range(messages)]


def _out_of_order(server, channels):
    bad = 0
    for c in range(channels):
        texts = [m.content for m in server.messages(str(9000 + c))]
        if texts != sorted(texts, key=lambda t: int(t[1:])):
            bad += 1
    return bad


def _limits():
    from ..testing import discord_limits
    return discord_limits(SPEEDUP)


class _Unpaced:
    """A SendContext stand-in for the naive sender: no deadline, no learning."""

    def remaining(self):
        return None

    def check(self):
        pass


def run_fastdispatch(messages=MESSAGES, channels=CHANNELS, bursts=False):
    from .. import ChatInfo, OutboundDispatcher, Pacing, RetryPolicy, SendRequest, TextMessage
    from ..discord import DiscordSender
    from ..testing import FakeDiscordServer

    limits = _limits()
    with FakeDiscordServer(**limits) as server, \
            DiscordSender(TOKEN, base_url=server.api_url, pool_size=INFLIGHT) as sender:
        d = OutboundDispatcher(max_inflight=INFLIGHT,
                               pacing=Pacing(global_limit=limits["global_limit"]),
                               retry=RetryPolicy(max_attempts=10))
        start = time.perf_counter()
        futures = [d.submit(ch, lambda sc, ch=ch, t=t: sender.send(
            sc, SendRequest(ChatInfo(ch), TextMessage(t)))) for ch, t in _plan(messages, channels, bursts)]
        failed = sum(1 for f in futures if f.exception(timeout=300) is not None)
        wall = time.perf_counter() - start
        d.shutdown(timeout=10)
        stats = server.stats()
        return {"wall": wall, "failed": failed, "too_many": stats.get("too_many", 0),
                "too_many_channel": stats.get("too_many_channel", 0),
                "too_many_global": stats.get("too_many_global", 0),
                "invalid": stats.get("invalid", 0), "out_of_order": _out_of_order(server, channels),
                "sent": stats.get("sent", 0)}


def run_naive(messages=MESSAGES, channels=CHANNELS, bursts=False):
    from .. import ChatInfo, RetryAfter, SendRequest, TextMessage
    from ..discord import DiscordSender
    from ..testing import FakeDiscordServer

    with FakeDiscordServer(**_limits()) as server, \
            DiscordSender(TOKEN, base_url=server.api_url, pool_size=INFLIGHT,
                          invalid_request_limit=10 ** 9, invalid_request_margin=0) as sender:
        sc = _Unpaced()

        def send(ch, text):
            for _ in range(1000):
                try:
                    return sender.send(sc, SendRequest(ChatInfo(ch), TextMessage(text)))
                except RetryAfter as exc:
                    time.sleep(exc.seconds)
            raise RuntimeError("gave up")

        start = time.perf_counter()
        with ThreadPoolExecutor(INFLIGHT) as pool:
            futures = [pool.submit(send, ch, t) for ch, t in _plan(messages, channels, bursts)]
            failed = sum(1 for f in futures if f.exception() is not None)
        wall = time.perf_counter() - start
        stats = server.stats()
        return {"wall": wall, "failed": failed, "too_many": stats.get("too_many", 0),
                "too_many_channel": stats.get("too_many_channel", 0),
                "too_many_global": stats.get("too_many_global", 0),
                "invalid": stats.get("invalid", 0), "out_of_order": _out_of_order(server, channels),
                "sent": stats.get("sent", 0)}


def report_cost(tasks=20000, chats=1000, rounds=3):
    """Microseconds per task through a dispatcher (no HTTP): tasks that do
    nothing, and tasks that report a learned limit (a budget far from
    spent, as most answers announce), alternating rounds, medians."""
    import statistics

    from .. import OutboundDispatcher

    def plain(sc):
        return None

    def reporting(sc):
        sc.report_limit(1000000, 60.0)

    def one(task):
        d = OutboundDispatcher(max_inflight=8)
        start = time.perf_counter()
        futures = [d.submit(i % chats, task) for i in range(tasks)]
        for f in futures:
            f.result(timeout=120)
        elapsed = time.perf_counter() - start
        d.shutdown(timeout=10)
        return elapsed / tasks * 1e6

    times = {"plain": [], "reporting": []}
    for _ in range(rounds):
        times["plain"].append(one(plain))
        times["reporting"].append(one(reporting))
    return {k: statistics.median(v) for k, v in times.items()}


def measure(progress=None, quick=False):
    limits = _limits()
    ch, gl = limits["channel_limit"], limits["global_limit"]
    bound = max(min_time(MESSAGES, gl.count, gl.per),
                min_time(-(-MESSAGES // CHANNELS), ch.count, ch.per))
    figures = {"bound": bound}
    plans = (("round-robin", False),) if quick else (("round-robin", False), ("bursts", True))
    for plan, bursts in plans:
        for name, run_one in (("fastdispatch", run_fastdispatch), ("naive", run_naive)):
            if progress:
                progress("discord: %s, %s, %d messages" % (name, plan, MESSAGES))
            figures[name, plan] = run_one(bursts=bursts)
    if progress:
        progress("discord: the cost of a report per task (no HTTP)")
    figures["cost"] = report_cost(rounds=1 if quick else 3)
    return figures


def missing_dependencies():
    missing = []
    for name in ("urllib3", "nacl"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    return missing


def rows(f):
    bound, out = f["bound"], []
    for plan in ("round-robin", "bursts"):
        if ("naive", plan) not in f:
            continue
        fd, naive = f["fastdispatch", plan], f["naive", plan]
        out += [
            ("%s: 429s met (channel buckets + global)" % plan,
             "%(too_many)d (%(too_many_channel)d + %(too_many_global)d)" % fd,
             "%(too_many)d (%(too_many_channel)d + %(too_many_global)d)" % naive,
             "", "", "(info)"),
            ("%s: invalid requests spent (Discord: 10,000 / 10 min)" % plan,
             "%d" % fd["invalid"], "%d" % naive["invalid"], "", "", "(info)"),
            ("%s: channels out of order (of %d)" % (plan, CHANNELS),
             "%d" % fd["out_of_order"], "%d" % naive["out_of_order"], "", "0 for ours",
             "met" if fd["out_of_order"] == 0 else "MISSED"),
            ("%s: wall time / the limits' minimum (%.1f s)" % (plan, bound),
             "%.2f (%.1f s)" % (fd["wall"] / bound, fd["wall"]),
             "%.2f (%.1f s)" % (naive["wall"] / bound, naive["wall"]),
             "", "<= 1.3 for ours", "met" if fd["wall"] / bound <= 1.3 else "MISSED"),
        ]
        if fd["failed"] or naive["failed"]:
            out.append(("%s: sends that failed (should be 0)" % plan, "%d" % fd["failed"],
                        "%d" % naive["failed"], "", "", "MISSED"))
    cost = f.get("cost")
    if cost:
        out.append(("time per task: reporting a limit / not (no HTTP)",
                    "%.1f us" % cost["reporting"], "%.1f us" % cost["plain"],
                    "%.2f" % (cost["reporting"] / cost["plain"]), "", "(info)"))
    return out


def run(quick, progress):
    """The section's rows."""
    missing = missing_dependencies()
    if missing:
        return [("skipped: needs %s (pip install 'fastdispatch[discord]')"
                 % " and ".join(missing), "", "", "", "", "")]
    return rows(measure(progress, quick))
