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
        description="Run a FakeTelegramServer on 127.0.0.1 until interrupted (SIGTERM or "
                    "Ctrl-C); prints its base URL on the first line, and its counters as "
                    "JSON when it stops.")
    parser.add_argument("--port", type=int, default=0,
                        help="port to listen on (default: 0, a free port the OS picks)")
    parser.add_argument("--token", default=None,
                        help="the only bot token accepted; any other gets 401 "
                             "(default: every token is accepted)")
    parser.add_argument("--chat-limit", type=_parse_limit, default=None, metavar="COUNT/SECONDS",
                        help="sendMessage limit per private chat, e.g. 1/1 as Telegram's "
                             "(default: no limit)")
    parser.add_argument("--group-limit", type=_parse_limit, default=None,
                        metavar="COUNT/SECONDS",
                        help="limit per group (a negative chat id), e.g. 20/60 as "
                             "Telegram's (default: groups get --chat-limit)")
    parser.add_argument("--global-limit", type=_parse_limit, default=None,
                        metavar="COUNT/SECONDS",
                        help="bot-wide limit, e.g. 30/1 as Telegram's (default: no limit)")
    parser.add_argument("--latency-ms", type=float, default=0.0, metavar="MS",
                        help="milliseconds every answer is held back (default: 0)")
    parser.add_argument("--tolerance", type=float, default=0.0, metavar="SECONDS",
                        help="seconds shaved off every limit window, for network jitter "
                             "(default: 0)")
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
