"""The flood: each Telegram plug-in (and python-telegram-bot's AIORateLimiter)
under 100 private chats x 30 messages plus a group x 200, Telegram's limits
10x faster on a local FakeTelegramServer: 429s met, replies lost,
duplicates, order violations, wall time against the ideal.

    bash tools/dev.sh test --co -q     # the test extras: PTB, aiogram, pyTelegramBotAPI, aiolimiter
    .venv/bin/python bench/flood.py [--speedup 10] [--only ptb] [--rounds 1] [--margin S]

The same as ``python -m fastdispatch bench flood``; the workload and the
figures are described in ``fastdispatch.bench.flood``.  About a minute per
bot (the group's limit sets the pace: 200 messages at 20 per 6 s).
"""

import sys

from fastdispatch.bench.flood import main

if __name__ == "__main__":
    sys.exit(main())
