"""``python -m fastdispatch.testing``: a local Bot API server from the command line."""

import argparse
import json
import signal
import sys
import threading

from ..pacing import RateLimit
from ._telegram import FakeTelegramServer


def _parse_limit(text):
    count, _, per = text.partition("/")
    return RateLimit(int(count), per=float(per or 1))


def main(argv=None):
    """``python -m fastdispatch.testing``: serve until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m fastdispatch.testing",
        description="Run a FakeTelegramServer on 127.0.0.1 until interrupted; prints its "
                    "base URL on the first line.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--port", type=int, default=0, help="port (0: the OS picks one)")
    parser.add_argument("--token", default=None, help="the only token accepted (default: any)")
    parser.add_argument("--chat-limit", type=_parse_limit, default=None,
                        help="COUNT/SECONDS per private chat, e.g. 1/1")
    parser.add_argument("--group-limit", type=_parse_limit, default=None,
                        help="COUNT/SECONDS per group, e.g. 20/60")
    parser.add_argument("--global-limit", type=_parse_limit, default=None,
                        help="COUNT/SECONDS bot-wide, e.g. 30/1")
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="milliseconds every answer is held back")
    parser.add_argument("--tolerance", type=float, default=0.0,
                        help="seconds shaved off every limit window (for jitter)")
    args = parser.parse_args(argv)
    server = FakeTelegramServer(args.token, chat_limit=args.chat_limit,
                                group_limit=args.group_limit, global_limit=args.global_limit,
                                latency=args.latency_ms / 1000.0, port=args.port,
                                tolerance=args.tolerance)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    with server:
        sys.stdout.write(server.base_url + "\n")
        sys.stdout.flush()
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        sys.stdout.write(json.dumps(server.stats(), sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
