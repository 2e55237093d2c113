"""``python -m fastdispatch demo``: the Telegram path end to end, in seconds.

Producer threads play bot handlers replying to hundreds of chats (some of
them groups).  Every reply goes through an ``OutboundDispatcher`` with
``Pacing`` and a ``RetryPolicy``, into ``TelegramSender``, over real HTTP
(keep-alive, one shared pool) to a ``FakeTelegramServer`` on 127.0.0.1 that
enforces Telegram's limits with every window divided by ``--speedup`` (at 10:
1 message per 100 ms per chat, 20 per 6 s per group, 30 per 100 ms bot-wide)
and answers a send over a limit with a real 429.

With pacing matching the limits, no 429 should come back (the server
shortens its windows by ``--tolerance`` for the time between a paced start
and the request reaching the server; a busy machine can exceed it, and the
summary then says so: those sends are retried, in order).  ``--inject-429``
and ``--inject-5xx`` make the server refuse a share of sends anyway (the
dispatcher retries them, keeping each chat's order); ``--no-pacing`` shows
what happens without it.  The summary checks, on the server's own record,
that every chat received its messages exactly once and in order, and
reports throughput against the bot-wide limit, the limit-imposed minimum
time, and latency percentiles.  Exit status 0 means every check held.

Needs the ``telegram`` extra (urllib3).
"""

import argparse
import random
import sys
import threading
import time
from typing import Any, NamedTuple

DESCRIPTION = (
    "Thousands of messages to hundreds of chats through TelegramSender over HTTP into a "
    "local FakeTelegramServer with Telegram's limits scaled down by --speedup, paced by "
    "the dispatcher; checks per-chat order on the server's record and reports 429s, "
    "throughput against the limit and latency percentiles.")


def _count(n, singular, plural=None):
    """``"1 send"``, ``"2 sends"``, ``"0 sends"``."""
    return "%d %s" % (n, singular if n == 1 else (plural or singular + "s"))


def jitter_note(too_many, tolerance):
    """What the summary says when paced sends still met the server's limits."""
    # Not a failure: each was retried in order.  The starts were paced
    # exactly; some requests reached the server later than their start by
    # more than the tolerance (a busy machine), which made two windows
    # overlap at the server.
    return ("\n  note: pacing matched the limits, yet %s reached the server over a "
            "limit:\n        %s more than %.0f ms after %s paced start (a busy "
            "machine);\n        the dispatcher retried %s in order.\n"
            % (_count(too_many, "send"), "it left" if too_many == 1 else "they left",
               1000 * tolerance, "its" if too_many == 1 else "their",
               "it" if too_many == 1 else "them"))


def _percentile(sorted_values, q):
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, int(round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def _bar(done, total, started, width=30):
    filled = int(width * done / total) if total else width
    elapsed = time.monotonic() - started
    return "\r  [%s%s] %6d/%d sends  %5.1fs" % (
        "#" * filled, "." * (width - filled), done, total, elapsed)


def _min_time(n, limit):
    """The least time ``n`` starts can take under a sliding-window limit."""
    if limit is None or n <= 0:
        return 0.0
    return ((n - 1) // limit.count) * limit.per


def plan_messages(messages, chats, groups, seed):
    """Chat ids (a share of them groups, negative ids) and how many messages
    each gets: every chat at least one, the rest at random."""
    rng = random.Random(seed)
    n_groups = int(round(chats * groups))
    ids = ["-100%d" % (1000 + i) for i in range(n_groups)]
    ids += [str(10000 + i) for i in range(chats - n_groups)]
    counts = dict.fromkeys(ids, 1)
    for _ in range(messages - chats):
        counts[rng.choice(ids)] += 1
    return counts


class _Demo:
    """One run of the demo: the plan, the fake server with its limits, the
    pacing and retry policy, and what the sends recorded (from the worker
    threads, under ``lock``)."""

    def __init__(self, args, out):
        from . import Pacing, RetryPolicy
        from .testing import FakeTelegramServer, telegram_limits

        self.args, self.out = args, out
        limits = telegram_limits(args.speedup)
        self.chat_limit, self.group_limit, self.global_limit = (
            limits["chat_limit"], limits["group_limit"], limits["global_limit"])
        self.counts = plan_messages(args.messages, args.chats, args.groups, args.seed)
        self.total = sum(self.counts.values())
        latency = args.latency_ms / 1000.0
        # The server shortens its windows by a little, for the scheduling jitter
        # between a worker starting a send and the server reading it (at real
        # Telegram scale, 1 s windows, it is noise; at 50 ms it is not).
        self.tolerance = min(self.chat_limit.per, self.global_limit.per) * args.tolerance
        # exact_retry_after: with windows of 100 ms, Telegram's whole-second
        # retry_after would make each 429 cost ten windows.
        self.server = FakeTelegramServer(**limits, tolerance=self.tolerance,
                                         exact_retry_after=True,
                                         latency=(0.5 * latency, 1.5 * latency), seed=args.seed)
        if args.inject_429 or args.inject_5xx:
            self.server.set_fault_rates(too_many=args.inject_429, error=args.inject_5xx,
                                        retry_after=self.chat_limit.per)
        group_limit = self.group_limit
        self.pacing = None
        if not args.no_pacing:
            self.pacing = Pacing(global_limit=self.global_limit, chat_limit=self.chat_limit,
                                 limit_for=lambda chat_id: group_limit
                                 if chat_id[:1] == "-" else None)
        self.retry = RetryPolicy(max_attempts=args.max_attempts,
                                 backoff=self.chat_limit.per / 2,
                                 max_backoff=self.chat_limit.per * 4, max_retry_after=60.0)
        self.lock = threading.Lock()  # guards the counters and latencies below
        self.received = {"429": 0, "5xx": 0}
        self.latencies = []
        self.round_trips = []
        self.done = 0

    def task(self, sender, request, t_submit):
        """The task that sends ``request`` and records how it went."""
        from . import RetryAfter
        from .telegram import TelegramNetworkError

        def task(sc):
            t_start = time.monotonic()
            try:
                result = sender.send(sc, request)
            except RetryAfter:
                with self.lock:
                    self.received["429"] += 1
                raise
            except TelegramNetworkError:
                with self.lock:
                    self.received["5xx"] += 1
                raise
            now = time.monotonic()
            with self.lock:
                self.latencies.append(now - t_submit)
                self.round_trips.append(now - t_start)
                self.done += 1
            return result
        return task

    def produce(self, d, sender, index, chats, futures):
        """Producer ``index``: submit the messages of ``chats`` in a random
        order across them.  One producer owns each chat, so "submission
        order" is well defined."""
        from .platform import ChatInfo, SendRequest, TextMessage

        rng = random.Random(self.args.seed + index)
        todo = [c for c in chats for _ in range(self.counts[c])]
        rng.shuffle(todo)
        seq = dict.fromkeys(chats, 0)
        for chat in todo:
            request = SendRequest(ChatInfo(chat, is_group=chat[:1] == "-"),
                                  TextMessage("%s #%d" % (chat, seq[chat])))
            seq[chat] += 1
            futures.append(d.submit(chat, self.task(sender, request, time.monotonic())))

    def header(self):
        from . import IMPLEMENTATION

        args, counts = self.args, self.counts
        n_groups = sum(1 for c in counts if c[:1] == "-")
        self.out.write(
            "fastdispatch demo (%s core): %s to %s (%s) from %s"
            "\n  TelegramSender -> HTTP -> FakeTelegramServer on 127.0.0.1, "
            "~%g ms per answer, max_inflight=%d\n  limits (Telegram's / %g): chat %s, "
            "group %s, bot-wide %s; pacing %s\n"
            % (IMPLEMENTATION, _count(self.total, "message"), _count(len(counts), "chat"),
               _count(n_groups, "group"), _count(args.producers, "producer thread"),
               args.latency_ms,
               args.max_inflight, args.speedup, self.chat_limit, self.group_limit,
               self.global_limit, "on (the same limits)" if self.pacing else "OFF"))
        if args.inject_429 or args.inject_5xx:
            self.out.write("  injected faults: %.1f%% of sends answered 429, %.1f%% answered "
                           "500\n" % (100 * args.inject_429, 100 * args.inject_5xx))

    def dispatcher(self):
        """The dispatcher, and the metrics server when ``--metrics-port``
        asks for one (or None)."""
        from . import OutboundDispatcher

        args = self.args
        hooks = metrics_server = None
        if args.metrics_port is not None:
            # Prometheus metrics of this run (fastdispatch[prometheus]).
            from prometheus_client import CollectorRegistry

            from .metrics import PrometheusMetrics, serve
            registry = CollectorRegistry()
            metrics = PrometheusMetrics(registry)
            hooks = metrics.hooks("demo")
        d = OutboundDispatcher(max_inflight=args.max_inflight,
                               queue_size=max(self.counts.values()), send_timeout=30.0,
                               pacing=self.pacing, retry=self.retry, hooks=hooks)
        if args.metrics_port is not None:
            metrics.track(d, "demo", max_inflight=args.max_inflight)
            metrics_server = serve(args.metrics_port, registry)
            self.out.write("  metrics         %s (Prometheus; kept up until the summary)\n"
                           % (metrics_server.url,))
        return d, metrics_server

    def send_all(self):
        """Run the producers against the server until every send ended (or
        ``--give-up`` seconds passed); what the summary needs."""
        from .telegram import TelegramSender

        args, out = self.args, self.out
        chat_ids = list(self.counts)
        owned = [chat_ids[i::args.producers] for i in range(args.producers)]
        with self.server:
            sender = TelegramSender("123456:demo", base_url=self.server.base_url,
                                    pool_size=args.max_inflight)
            d, metrics_server = self.dispatcher()
            started = time.monotonic()
            futures = [[] for _ in range(args.producers)]
            threads = [threading.Thread(target=self.produce,
                                        args=(d, sender, i, owned[i], futures[i]))
                       for i in range(args.producers)]
            for t in threads:
                t.start()
            tty = out.isatty()
            while any(t.is_alive() for t in threads) or not d.drain(timeout=0.1):
                if tty:
                    out.write(_bar(self.done, self.total, started))
                    out.flush()
                if time.monotonic() - started > args.give_up:
                    break
            for t in threads:
                t.join()
            ok_drain = d.shutdown(timeout=30)
            if metrics_server is not None and args.metrics_linger:
                out.write("\n  metrics stay up for %g s at %s\n"
                          % (args.metrics_linger, metrics_server.url))
                out.flush()
                time.sleep(args.metrics_linger)
            elapsed = time.monotonic() - started
            out.write(_bar(self.done, self.total, started) + "\n")
            sender.close()
            record = {chat: self.server.messages(chat) for chat in self.counts}
            server_stats = self.server.stats()
        return _Sent(d, metrics_server, futures, ok_drain, elapsed, record, server_stats)


class _Sent(NamedTuple):
    """What :meth:`_Demo.send_all` leaves for the summary."""

    dispatcher: Any
    metrics_server: Any
    futures: list
    ok_drain: bool
    elapsed: float
    record: dict        # chat -> the messages the server received, in order
    server_stats: dict


def _errors(futures):
    """Exception class name -> how many sends ended with it."""
    errors = {}
    for fs in futures:
        for f in fs:
            exc = f.exception() if f.done() else TimeoutError("not done")
            if exc is not None:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
    return errors


def _check_record(record):
    """(chats whose messages arrived out of order, duplicates, messages
    delivered) from the server's record."""
    broken, duplicated, delivered = [], 0, 0
    for chat, arrived in record.items():
        numbers = [int(m.text.rsplit("#", 1)[1]) for m in arrived]
        delivered += len(set(numbers))
        duplicated += len(numbers) - len(set(numbers))
        if numbers != sorted(numbers):  # a retry's duplicate sits next to its original
            broken.append(chat)
    return broken, duplicated, delivered


def _limit_bound(demo):
    """The least time the limits allow for the whole plan."""
    counts, total = demo.counts, demo.total
    busiest_chat = max((n for c, n in counts.items() if c[:1] != "-"), default=0)
    busiest_group = max((n for c, n in counts.items() if c[:1] == "-"), default=0)
    return max(_min_time(total, demo.global_limit), _min_time(busiest_chat, demo.chat_limit),
               _min_time(busiest_group, demo.group_limit))


def _summary(demo, sent):
    """Write the summary; True if every check held."""
    args, out, total, server_stats = demo.args, demo.out, demo.total, sent.server_stats
    errors = _errors(sent.futures)
    failures = sum(errors.values())
    broken, duplicated, delivered = _check_record(sent.record)
    latencies, round_trips = sorted(demo.latencies), sorted(demo.round_trips)
    elapsed, bound = sent.elapsed, _limit_bound(demo)
    limit_rate = demo.global_limit.count / demo.global_limit.per

    out.write("\n  delivered       %d / %d  (%d failed%s)\n" % (
        delivered, total, failures,
        ": " + ", ".join("%d %s" % (n, k) for k, n in sorted(errors.items())) if errors else ""))
    out.write("  per-chat order  %s (%s checked on the server's record, %s)\n"
              % ("OK" if not broken else "BROKEN in %s" % _count(len(broken), "chat"),
                 _count(len(sent.record), "chat"), _count(duplicated, "duplicate")))
    out.write("  429s received   %d  (%d from limits [chat %d, group %d, bot-wide %d], "
              "%d injected)\n" % (
                  demo.received["429"], server_stats.get("too_many", 0),
                  server_stats.get("too_many_chat", 0), server_stats.get("too_many_group", 0),
                  server_stats.get("too_many_global", 0),
                  server_stats.get("injected_too_many", 0)))
    out.write("  5xx received    %d  (%s)\n" % (
        demo.received["5xx"], "the server answers 500 only when told to: --inject-5xx"
        if not args.inject_5xx else "all injected, %.1f%% of sends" % (100 * args.inject_5xx)))
    out.write("  retries         %d  (sends tried again after a 429 or a 5xx)\n"
              % sent.dispatcher.stats().retried)
    out.write("  wall time       %.2f s  (limit-imposed minimum %.2f s: ratio %.2f)\n"
              % (elapsed, bound, elapsed / bound if bound else float("nan")))
    out.write("  throughput      %.0f messages delivered/s  (bot-wide limit %.0f/s: %.0f%% of it)\n"
              % (delivered / elapsed, limit_rate, 100 * delivered / elapsed / limit_rate))
    out.write("  latency         p50 %.0f ms   p90 %.0f ms   p99 %.0f ms   max %.0f ms"
              "  (submit to answered, pacing waits included)\n" % tuple(
                  1000 * _percentile(latencies, q) for q in (0.5, 0.9, 0.99, 1.0)))
    out.write("  HTTP round trip p50 %.1f ms p90 %.1f ms p99 %.1f ms max %.1f ms"
              "  (one sendMessage call)\n" % tuple(
                  1000 * _percentile(round_trips, q) for q in (0.5, 0.9, 0.99, 1.0)))
    out.write("  server          %s, windows shortened by %.1f ms for jitter\n"
              % (_count(server_stats.get("requests", 0), "request"), 1000 * demo.tolerance))
    out.write("  stats           %s\n" % (sent.dispatcher.stats(),))
    ok = (sent.ok_drain and delivered == total and not failures and not broken
          and not duplicated)
    if demo.pacing is not None and server_stats.get("too_many", 0):
        out.write(jitter_note(server_stats["too_many"], demo.tolerance))
    return ok


def run(args, out):
    """The demo: plan, send, check and summarise; the exit status."""
    demo = _Demo(args, out)
    demo.header()
    sent = demo.send_all()
    ok = _summary(demo, sent)
    if sent.metrics_server is not None:
        sent.metrics_server.stop()
    out.write("\n%s\n" % ("all checks passed" if ok else "CHECKS FAILED"))
    return 0 if ok else 1


def _int_at_least(low):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not an integer" % (text,)) from None
        if value < low:
            raise argparse.ArgumentTypeError("must be at least %d, got %d" % (low, value))
        return value
    return parse


def _int_in_range(low, high):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not an integer" % (text,)) from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError("must be from %d to %d, got %d" % (low, high, value))
        return value
    return parse


def _float_in(low, high, low_open=False):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a number" % (text,)) from None
        if not (value > low if low_open else value >= low) or value > high:
            raise argparse.ArgumentTypeError("must be in %s%g, %g], got %g" % (
                "(" if low_open else "[", low, high, value))
        return value
    return parse


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m fastdispatch demo", description=DESCRIPTION,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--messages", type=_int_at_least(1), default=2000,
                        help="messages in all (at least one per chat)")
    parser.add_argument("--chats", type=_int_at_least(1), default=200,
                        help="chats to send to")
    parser.add_argument("--groups", type=_float_in(0, 1), default=0.1,
                        help="share of the chats that are groups (20 messages per minute "
                             "each, scaled)")
    parser.add_argument("--producers", type=_int_at_least(1), default=4,
                        help="threads submitting replies (each owns a share of the chats)")
    parser.add_argument("--speedup", type=_float_in(0, 1000, low_open=True), default=10.0,
                        help="divide every Telegram limit window by this (1 = real limits)")
    parser.add_argument("--latency-ms", type=_float_in(0, 60000), default=2.0,
                        help="mean milliseconds the server holds each answer (a network "
                             "round trip; uniform between 0.5x and 1.5x)")
    parser.add_argument("--max-inflight", type=_int_at_least(1), default=64,
                        help="the dispatcher's cap on sends in flight (and the HTTP pool size)")
    parser.add_argument("--inject-429", type=_float_in(0, 1), default=0.0, metavar="RATE",
                        help="share of sends the server answers 429 regardless of the limits")
    parser.add_argument("--inject-5xx", type=_float_in(0, 1), default=0.0, metavar="RATE",
                        help="share of sends the server answers 500")
    parser.add_argument("--no-pacing", action="store_true",
                        help="do not pace: see the server's 429s and the retries they cause")
    parser.add_argument("--max-attempts", type=_int_at_least(1), default=10,
                        help="RetryPolicy.max_attempts: attempts per message, retries included")
    parser.add_argument("--tolerance", type=_float_in(0, 0.5), default=0.2,
                        help="the server shortens its windows by this share of the shortest "
                             "window, for scheduling jitter")
    parser.add_argument("--metrics-port", type=_int_in_range(0, 65535), default=None,
                        metavar="PORT",
                        help="serve Prometheus metrics of the run on 127.0.0.1:PORT "
                             "(0: any free port; needs fastdispatch[prometheus])")
    parser.add_argument("--metrics-linger", type=_float_in(0, 3600), default=0.0,
                        metavar="SECONDS",
                        help="with --metrics-port: keep serving this long after the run")
    parser.add_argument("--seed", type=int, default=1, help="random seed")
    parser.add_argument("--give-up", type=_float_in(0, 86400, low_open=True), default=300.0,
                        metavar="SECONDS", help="stop waiting after this long")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.messages < args.chats:
        parser.error("--messages (%d) must be at least --chats (%d): every chat gets at "
                     "least one message" % (args.messages, args.chats))
    if args.producers > args.chats:
        parser.error("--producers (%d) must be at most --chats (%d): each producer owns "
                     "its own chats" % (args.producers, args.chats))
    if args.inject_429 + args.inject_5xx > 1:
        parser.error("--inject-429 and --inject-5xx must add up to at most 1")
    try:
        import urllib3  # noqa: F401
    except ImportError:
        parser.exit(2, "the demo needs the telegram extra: pip install 'fastdispatch[telegram]'\n")
    if args.metrics_port is not None:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            parser.exit(2, "--metrics-port needs the prometheus extra: "
                           "pip install 'fastdispatch[prometheus]'\n")
    return run(args, sys.stdout)
