"""``python -m fastdispatch.testing``: a local Bot API server from the command
line, controllable over HTTP, for a bot in another process or language
(``--discord``: a local Discord REST API instead, a FakeDiscordServer).

It prints its base URL on the first line and its control URL on the second,
serves until SIGTERM or Ctrl-C, then prints its counters as one line of
JSON.  The control endpoint (``POST <control URL>/<action>`` with a JSON
object of keyword arguments) offers what the Python API does::

    curl -s -H 'Content-Type: application/json' \\
         -X POST http://127.0.0.1:PORT/control/push_message -d '{"chat_id": 42, "text": "/start"}'
    curl -s -H 'Content-Type: application/json' \\
         -X POST http://127.0.0.1:PORT/control/messages -d '{"chat_id": 42}'

Only requests a web page in a browser cannot forge are obeyed: ``Content-Type:
application/json``, ``Host`` the server's own address and port, no foreign
``Origin``.

With ``--discord`` the first line is the API's base URL (``.../api/v10``)
and the actions are FakeDiscordServer's (``public_key``,
``make_interaction``, ``post_interaction``, ``set_channel_status``, ...).
``--onebot``: a FakeOneBotServer (the first line is its forward WebSocket;
the control URL's base is its HTTP API); ``--qq``: a FakeQQServer.
"""

import argparse
import json
import signal
import sys
import threading

from .._signals import SignalRelay
from ..pacing import RateLimit
from ._discord import FakeDiscordServer
from ._onebot import FakeOneBotServer
from ._qq import FakeQQServer
from ._telegram import FakeTelegramServer


def _parse_limit(text):
    count, _, per = text.partition("/")
    try:
        return RateLimit(int(count), per=float(per or 1))
    except ValueError as exc:
        raise argparse.ArgumentTypeError("%r is not COUNT/SECONDS (%s)" % (text, exc))


def main(argv=None):
    """``python -m fastdispatch.testing``: serve until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m fastdispatch.testing",
        description="Run a FakeTelegramServer on 127.0.0.1 until interrupted. It prints its "
                    "base URL on the first line and its control URL on the second; POST a "
                    "JSON object to <control URL>/<action> to push updates, inject faults, "
                    "read a chat's record or reset (actions: %s)."
                    % ", ".join(FakeTelegramServer.control_actions))
    parser.add_argument("--port", type=int, default=0,
                        help="port (default: 0, the OS picks one)")
    parser.add_argument("--token", default=None,
                        help="the only token accepted (default: any <digits>:<secret>)")
    parser.add_argument("--chat-limit", type=_parse_limit, default=None, metavar="N/SECONDS",
                        help="per private chat, e.g. 1/1 (default: none)")
    parser.add_argument("--group-limit", type=_parse_limit, default=None, metavar="N/SECONDS",
                        help="per group, e.g. 20/60 (default: none)")
    parser.add_argument("--global-limit", type=_parse_limit, default=None,
                        metavar="N/SECONDS", help="bot-wide, e.g. 30/1 (default: none)")
    parser.add_argument("--exact-retry-after", action="store_true",
                        help="answer 429s with the exact fractional retry_after instead of "
                             "whole seconds (for limits scaled down to milliseconds)")
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="milliseconds every answer is held back (default: 0)")
    parser.add_argument("--tolerance", type=float, default=0.0,
                        help="seconds shaved off every limit window, for jitter (default: 0)")
    parser.add_argument("--no-control", action="store_true",
                        help="do not serve the /control endpoint")
    parser.add_argument("--discord", action="store_true",
                        help="serve a FakeDiscordServer instead: --chat-limit is each "
                             "channel's bucket (default 5/5), --global-limit the bot's "
                             "(default 50/1); --group-limit, --exact-retry-after and "
                             "--tolerance do not apply (actions: %s)"
                             % ", ".join(FakeDiscordServer.control_actions))
    parser.add_argument("--onebot", action="store_true",
                        help="serve a FakeOneBotServer instead (first line: its forward "
                             "WebSocket URL, then the control URL, whose base is the HTTP "
                             "API); --chat-limit/--global-limit override its limits")
    parser.add_argument("--qq", action="store_true",
                        help="serve a FakeQQServer instead (QQ official bot API; --token "
                             "is the client secret of app 1024)")
    args = parser.parse_args(argv)
    if args.onebot:
        return _serve(FakeOneBotServer(
            chat_limit=args.chat_limit or RateLimit(1, per=1.0),
            global_limit=args.global_limit or RateLimit(2, per=1.0),
            tolerance=args.tolerance or 0.1,
            latency=args.latency_ms / 1000.0, port=args.port, control=not args.no_control),
            "ws_url")
    if args.qq:
        return _serve(FakeQQServer(client_secret=args.token or "secret",
                                   latency=args.latency_ms / 1000.0, port=args.port,
                                   control=not args.no_control), "base_url")
    if args.discord:
        return _serve(FakeDiscordServer(
            args.token, channel_limit=args.chat_limit or RateLimit(5, per=5.0),
            global_limit=args.global_limit or RateLimit(50, per=1.0),
            latency=args.latency_ms / 1000.0, port=args.port, control=not args.no_control),
            "api_url")
    return _serve(FakeTelegramServer(
        args.token, chat_limit=args.chat_limit, group_limit=args.group_limit,
        global_limit=args.global_limit, exact_retry_after=args.exact_retry_after,
        latency=args.latency_ms / 1000.0, port=args.port, tolerance=args.tolerance,
        control=not args.no_control), "base_url")


def _serve(server, url_attribute):
    stop = threading.Event()
    # Set from the relay's thread: the main thread below may hold stop's lock.
    SignalRelay(lambda signum: stop.set(), (signal.SIGTERM,)).install()
    with server:
        sys.stdout.write(getattr(server, url_attribute) + "\n")
        sys.stdout.write((server.control_url if server.control else "control: off") + "\n")
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
