"""Command line: ``python -m fastdispatch.cluster worker|demo``.

``worker`` runs one :class:`ClusterWorker` until SIGTERM (exit 0).  Exit
codes: 0 after a graceful stop, 2 for a bad argument, a sender that cannot be
loaded, or a stream whose shard count disagrees.
"""

import argparse
import importlib
import importlib.util
import logging
import sys

from ..pacing import RateLimit, RetryPolicy
from ._topology import DEFAULT_ACK_WAIT

USAGE = """usage: python -m fastdispatch.cluster COMMAND [options]

commands:
  worker  take messages from NATS JetStream and send them (run any number, anywhere)
  demo    start nats-server and redis-server, 3 workers, kill -9 one mid-run,
          and verify from the sender's own record that nothing was lost or reordered
  bench   the cluster at scale (default 10,000 and 1,000 chats x 3, 3 workers,
          500/s global, 1/s per chat): throughput against the limit, limiter
          calls and Redis CPU per send

Run 'python -m fastdispatch.cluster COMMAND --help' for a command's options.
"""


INSTALL_HINT = ("pip install 'fastdispatch[cluster]' installs them all on Linux and macOS "
                "(elsewhere, put nats-server and redis-server on PATH).")


def missing_parts(servers=True):
    """What the cluster extra brings and is not here: Python packages, then
    (for the demo and the bench, which start their own) the two servers."""
    missing = [dist for module, dist in (("nats", "nats-py"), ("redis", "redis"))
               if importlib.util.find_spec(module) is None]
    if servers:
        from ._servers import REDIS_PACKAGED, ServerNotFound, find_executable
        for name, packaged in (("nats-server", None), ("redis-server", REDIS_PACKAGED)):
            try:
                find_executable(name, "", packaged=packaged)
            except ServerNotFound:
                missing.append(name)
    return missing


def parse_limit(text):
    """``"30/1"`` -> ``RateLimit(30, per=1.0)`` (N starts per S seconds)."""
    try:
        count, per = text.split("/", 1)
        return RateLimit(int(count), per=float(per))
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(
            "expected N/S (at most N sends in any S seconds), got %r (%s)" % (text, exc))


def load_sender(path):
    """Import ``module:function`` and call it; the result must be callable."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError("--sender must be module:function, got %r" % (path,))
    module = importlib.import_module(module_name)
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part)
    sender = factory()
    if not callable(sender):
        raise TypeError("%s() returned %r, which is not callable" % (path, sender))
    return sender


def _positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError("must be > 0, got %r" % (text,))
        return value
    return parse


def worker_parser():
    p = argparse.ArgumentParser(prog="python -m fastdispatch.cluster worker",
                                description="Send messages from a NATS JetStream stream, "
                                            "sharing limits through Redis.")
    p.add_argument("--nats", required=True, help="NATS URL, e.g. nats://127.0.0.1:4222")
    p.add_argument("--redis", required=True, help="Redis URL, e.g. redis://127.0.0.1:6379/0")
    p.add_argument("--stream", default="fastdispatch", help="stream name (default fastdispatch)")
    p.add_argument("--sender", required=True,
                   help="module:function returning callable(sc, chat_id, payload, key)")
    p.add_argument("--max-inflight", type=_positive(int), default=64,
                   help="sends at once in this process (default 64)")
    p.add_argument("--global-limit", type=parse_limit, default=None, metavar="N/S",
                   help="at most N sends in any S seconds, all workers together")
    p.add_argument("--chat-limit", type=parse_limit, default=None, metavar="N/S",
                   help="at most N sends per chat in any S seconds, all workers together")
    p.add_argument("--send-timeout", type=_positive(float), default=30.0,
                   help="seconds per send attempt (default 30)")
    p.add_argument("--max-attempts", type=_positive(int), default=5,
                   help="attempts per message before it is dead-lettered (default 5)")
    p.add_argument("--max-retry-after", type=float, default=120.0,
                   help="longest RetryAfter waited out; longer: dead-lettered (default 120)")
    p.add_argument("--ack-wait", type=_positive(float), default=DEFAULT_ACK_WAIT,
                   help="redelivery delay of consumers this worker creates (default %g)"
                        % (DEFAULT_ACK_WAIT,))
    p.add_argument("--shards", type=_positive(int), default=None,
                   help="shard count if this worker creates the stream (default 128); "
                        "otherwise read from the stream")
    p.add_argument("--limit-guard", type=float, default=0.05,
                   help="seconds added to each limit window against scheduling jitter "
                        "(default 0.05)")
    p.add_argument("--fetch-timeout", type=_positive(float), default=5.0,
                   help="seconds one pull request stays open (default 5)")
    p.add_argument("--grace", type=float, default=None,
                   help="seconds in-flight sends get after SIGTERM (default send-timeout + 5)")
    p.add_argument("--log-level", default="INFO")
    return p


def _stop_on_signals():
    """SIGTERM/SIGINT ask for a graceful stop from the first moment of a worker's life.

    Installed before anything slow (argument parsing, imports of the
    clients and of the sender): a signal that comes while the process is
    still starting (a deploy that changes its mind) is kept, and the worker
    stops as soon as it exists, with exit code 0 -- never killed with -15.
    Returns ``attach(worker)``, which hands later signals to ``worker.stop``.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda worker: None
    state = {"worker": None, "asked": False}

    def on_signal(signum, frame):
        state["asked"] = True
        if state["worker"] is not None:
            state["worker"].stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    def attach(worker):
        state["worker"] = worker
        if state["asked"]:
            worker.stop()
    return attach


def worker_main(argv):
    attach = _stop_on_signals()
    args = worker_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        sender = load_sender(args.sender)
    except Exception as exc:
        sys.stderr.write("cannot load --sender %s: %s: %s\n"
                         % (args.sender, type(exc).__name__, exc))
        return 2
    from ._worker import ClusterWorker

    retry = RetryPolicy(max_attempts=args.max_attempts, max_retry_after=args.max_retry_after)
    worker = ClusterWorker(
        sender, nats_url=args.nats, redis_url=args.redis, stream=args.stream,
        max_inflight=args.max_inflight, global_limit=args.global_limit,
        chat_limit=args.chat_limit, send_timeout=args.send_timeout, retry=retry,
        ack_wait=args.ack_wait, shards=args.shards, limit_guard=args.limit_guard,
        grace=args.grace, fetch_timeout=args.fetch_timeout)
    attach(worker)
    return worker.run()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in ("worker", "demo", "bench") and not {"-h", "--help"} & set(rest):
        missing = missing_parts(servers=command != "worker")
        if missing:
            listed = ", ".join(missing[:-1]) + " and " + missing[-1] if len(missing) > 1 \
                else missing[0]
            sys.stderr.write("python -m fastdispatch.cluster %s needs %s, not found here.\n%s\n"
                             % (command, listed, INSTALL_HINT))
            return 2
    if command == "worker":
        return worker_main(rest)
    if command == "demo":
        from ._demo import main as demo_main
        return demo_main(rest)
    if command == "bench":
        from ._bench import main as bench_main
        return bench_main(rest)
    sys.stderr.write("unknown command %r\n\n%s" % (command, USAGE))
    return 2


if __name__ == "__main__":
    sys.exit(main())
