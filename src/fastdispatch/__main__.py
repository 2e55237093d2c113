"""Command line: ``python -m fastdispatch demo`` or ``python -m fastdispatch bench``."""

import sys

USAGE = """usage: python -m fastdispatch COMMAND [options]

commands:
  demo    thousands of messages to hundreds of chats through TelegramSender over
          HTTP into a local FakeTelegramServer with Telegram's limits scaled
          down; verifies per-chat order, reports 429s, throughput, latency
  bench   a short benchmark run printing a table of ratios against baselines

Run 'python -m fastdispatch COMMAND --help' for a command's options.
"""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from ._demo import main as run
    elif command == "bench":
        from ._bench import main as run
    else:
        sys.stderr.write("unknown command %r\n\n%s" % (command, USAGE))
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
