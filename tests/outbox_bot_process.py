"""A polling bot with a durable outbox, run in a subprocess by test_outbox_polling.py.

    python tests/outbox_bot_process.py BASE_URL DB

An echo bot: every update "<text>" is answered "<text> /0" and "<text> /1".
The engine queues the replies into the outbox (its own dispatcher); the
outbox sends them through a second, slower one (4 at a time), so a backlog
of durable replies builds up in the file.
"""

import logging
import sys

from fastdispatch import Engine, OutboundDispatcher, RetryPolicy
from fastdispatch.outbox import Outbox
from fastdispatch.telegram import TelegramSender, run_polling

logging.basicConfig(level=logging.WARNING, stream=sys.stdout)


def main(base_url, db):
    sender = TelegramSender("123:outbox", base_url=base_url)
    sending = OutboundDispatcher(max_inflight=4, queue_size=1000, retry=RetryPolicy())
    outbox = Outbox(db, sending, senders={"telegram": sender}, durability="normal")
    engine = Engine(OutboundDispatcher(max_inflight=16, queue_size=1000))

    @engine.on()
    def echo(ctx):
        for k in range(2):
            ctx.reply_text("%s /%d" % (ctx.event.text, k))

    code = run_polling(engine, sender, poll_timeout=1, drain_timeout=30, outbox=outbox)
    outbox.close(timeout=30)
    sending.shutdown(timeout=30)
    return code


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
