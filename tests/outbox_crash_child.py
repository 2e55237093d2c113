"""A bot process for test_outbox_crash.py: sends replies through an Outbox until done.

``python outbox_crash_child.py DB BASE_URL LOGDIR THREADS CHATS PER_CHAT DURABILITY``

Thread t owns the chats c with ``c % THREADS == t`` and sends their replies
round-robin, ``"<chat>:<seq>"``, seq 0..PER_CHAT-1 per chat.  Before each
send it appends the item's number to ``LOGDIR/<t>.log`` (unbuffered: it
survives SIGKILL), and a restarted child resumes after the last number
logged.  So the one item of a thread that was being sent at a kill may not
have been accepted; every item before it was.  Each start appends the
outbox's ``restored`` count to ``LOGDIR/restored.log``.
"""

import os
import sys
import threading

from fastdispatch import OutboundDispatcher
from fastdispatch.outbox import Outbox
from fastdispatch.telegram import TelegramSender

TOKEN = "123456:SECRET-token_value"


def last_logged(path):
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return -1
    complete = [line for line in lines[:-1] if line]  # the last may be cut by the kill
    return int(complete[-1]) if complete else -1


def main():
    db, base_url, logdir = sys.argv[1:4]
    threads, chats, per_chat = map(int, sys.argv[4:7])
    durability = sys.argv[7]
    d = OutboundDispatcher(max_inflight=64)
    sender = TelegramSender(TOKEN, base_url=base_url, pool_size=64)
    outbox = Outbox(db, d, senders={"telegram": sender}, durability=durability)
    fd = os.open(os.path.join(logdir, "restored.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, b"%d\n" % outbox.restored)
    os.close(fd)

    def produce(t):
        own = [c for c in range(chats) if c % threads == t]
        path = os.path.join(logdir, "%d.log" % t)
        start = last_logged(path) + 1
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        for n in range(start, len(own) * per_chat):
            chat, seq = own[n % len(own)], n // len(own)
            os.write(fd, b"%d\n" % n)
            outbox.send(chat, "sendMessage", {"chat_id": chat, "text": "%d:%d" % (chat, seq)})
        os.close(fd)

    workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if not outbox.drain(timeout=300):
        sys.exit("the outbox did not drain")
    outbox.close()
    d.shutdown(timeout=30)
    sender.close()


if __name__ == "__main__":
    main()
