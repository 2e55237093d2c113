"""The sender that tests/test_cluster.py's worker processes load (``--sender cluster_sender:make_sender``).

It keeps its own record of every send, the record the tests verify:

- ``FD_SENDER_RECORD=<dir>``: one line per finished send, appended with a
  single ``os.write`` to ``<dir>/send-<pid>.log`` (survives ``kill -9`` of the
  process once written): ``chat seq start end pid key``, the chat id
  percent-encoded.
- ``FD_SENDER_RECORD=redis://...``: the line goes to the Redis list
  ``fd-test:record`` and, in the same MULTI/EXEC, the sender records the
  message's idempotency key where the worker looks for it
  (``fastdispatch.cluster.done_key``): a sender that records keys itself.

``FD_SENDER_LOAD_SLEEP=<s>`` makes loading the sender slow (a sender that
imports a big client): ``make_sender`` touches ``FD_SENDER_LOAD_MARKER``, then
sleeps that long.

``FD_SENDER_LATENCY`` (seconds, default 0.005) simulates the platform's
answer time.  The payload is ``b"<seq>"`` or ``b"<seq>|<mode>"`` with mode
``fail`` (a non-retryable error), ``retry:<s>`` (RetryAfter(s) on the first
attempt) or ``slow:<s>`` (a send that takes s seconds).
"""

import os
import time
import urllib.parse

from fastdispatch import RetryAfter
from fastdispatch.cluster import done_key


def make_sender():
    if os.environ.get("FD_SENDER_LOAD_SLEEP"):
        with open(os.environ["FD_SENDER_LOAD_MARKER"], "w"):
            pass
        time.sleep(float(os.environ["FD_SENDER_LOAD_SLEEP"]))
    record = os.environ["FD_SENDER_RECORD"]
    latency = float(os.environ.get("FD_SENDER_LATENCY", "0.005"))
    stream = os.environ.get("FD_SENDER_STREAM", "fastdispatch")
    pid = os.getpid()
    if record.startswith("redis://"):
        import redis

        client = redis.Redis.from_url(record)

        def write(line, key):
            with client.pipeline(transaction=True) as pipe:
                pipe.rpush("fd-test:record", line)
                pipe.set(done_key(stream, key), b"1")
                pipe.execute()
    else:
        fd = os.open(os.path.join(record, "send-%d.log" % pid),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

        def write(line, key):
            os.write(fd, line.encode())

    def send(sc, chat_id, payload, key):
        seq, _, mode = payload.decode().partition("|")
        if mode.startswith("fail"):   # "fail" and any padding after it
            raise ValueError("refused by the test sender")
        if mode.startswith("retry:") and sc.attempt == 1:
            raise RetryAfter(float(mode[6:]))
        start = time.time()
        time.sleep(float(mode[5:]) if mode.startswith("slow:") else latency)
        end = time.time()
        write("%s %s %.6f %.6f %d %s\n" % (urllib.parse.quote(chat_id, safe=""), seq, start,
                                            end, pid, key), key)

    return send
