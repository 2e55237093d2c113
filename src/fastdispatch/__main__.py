"""Command line: ``python -m fastdispatch demo|bench|cluster|testing``.

``--help`` imports nothing but the package itself: the commands' modules
(the benchmarks, the cluster, the fake servers) load when one is run.
"""

import sys

from . import IMPLEMENTATION, __version__

USAGE = """\
usage: python -m fastdispatch COMMAND [options]
       python -m fastdispatch --version

fastdispatch {version} (core in use: {core}): a per-chat outbound dispatcher
for bot servers.

commands:
  demo     thousands of messages to hundreds of chats through TelegramSender over
           HTTP into a local FakeTelegramServer with Telegram's limits scaled
           down; checks per-chat order, reports 429s, throughput and latency
  bench    fastdispatch against a thread pool, a naive per-chat dispatcher, its
           pure-Python twin and a bare Future, then pacing, metrics and Telegram:
           tables of ratios and targets ('bench --help' says how long each
           section takes)
  cluster  the NATS + Redis cluster: 'cluster worker', 'cluster demo' (kill -9
           a worker mid-run, verify nothing was lost or reordered), 'cluster
           bench' (needs the cluster extra); the same as python -m fastdispatch.cluster
  testing  a fake Telegram Bot API (or, with --discord, Discord REST API)
           server on 127.0.0.1 for a bot in another process; the same as
           python -m fastdispatch.testing

Run 'python -m fastdispatch COMMAND --help' for a command's options.
Documentation: https://github.com/fastdispatch/fastdispatch
"""


def usage():
    return USAGE.format(version=__version__, core=IMPLEMENTATION)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        sys.stdout.write("fastdispatch %s (core: %s)\n" % (__version__, IMPLEMENTATION))
        return 0
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from ._demo import main as run
    elif command == "bench":
        from .bench import main as run
    elif command == "cluster":
        from .cluster.__main__ import main as run
    elif command == "testing":
        from .testing.__main__ import main as run
    else:
        sys.stderr.write("python -m fastdispatch: unknown command %r\n\n%s" % (command, usage()))
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
