"""Command line: ``python -m fastdispatch demo`` or ``python -m fastdispatch bench``."""

import sys

from . import IMPLEMENTATION, __version__

USAGE = """\
usage: python -m fastdispatch COMMAND [options]
       python -m fastdispatch --version

fastdispatch {version} (core in use: {core}): a per-chat outbound dispatcher
for bot servers.

commands:
  demo    thousands of messages to hundreds of chats through TelegramSender over
          HTTP into a local FakeTelegramServer with Telegram's limits scaled
          down; checks per-chat order, reports 429s, throughput and latency
  bench   fastdispatch against a thread pool, a naive per-chat dispatcher, its
          pure-Python twin and a bare Future, then pacing, metrics and Telegram:
          tables of ratios and targets ({full_lo}-{full_hi} s on two cores; 'bench
          --quick': {quick_lo}-{quick_hi} s; 'bench --help' gives each section's)

Run 'python -m fastdispatch COMMAND --help' for a command's options.
Documentation: https://github.com/fastdispatch/fastdispatch
"""


def usage():
    from .bench.cli import estimate, load_sections
    sections = load_sections()
    (full_lo, full_hi), (quick_lo, quick_hi) = estimate(sections, False), estimate(sections, True)
    return USAGE.format(version=__version__, core=IMPLEMENTATION, full_lo=full_lo,
                        full_hi=full_hi, quick_lo=quick_lo, quick_hi=quick_hi)


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
    else:
        sys.stderr.write("python -m fastdispatch: unknown command %r\n\n%s" % (command, usage()))
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
