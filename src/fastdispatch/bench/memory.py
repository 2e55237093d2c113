"""Memory: what a queued task costs and what a drained chat leaves behind (tracemalloc).

Bytes, not times: these figures do not move with the machine's load.
"""

import gc
import tracemalloc

from .contenders import THREADS, make_dispatcher, noop
from .scenarios import _Gate

__all__ = ["queued_post_bytes", "retained_after_chats", "MEMORY_IMPLS"]




def queued_post_bytes(impl="fastdispatch", n=20_000):
    """tracemalloc bytes per task waiting in a chat's queue (callable not counted)."""
    d = make_dispatcher(impl, 1, queue_size=n)
    gate = _Gate()
    try:
        gate.block(d, ["blocker"])
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            post = d.post
            for _ in range(n):
                post("chat", noop)
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    finally:
        gate.open()
        d.shutdown()
    return (after - before) / n


def retained_after_chats(impl="fastdispatch", chats=100_000, threads=THREADS):
    """tracemalloc bytes still held after ``chats`` chats were queued and drained.

    Every worker is held busy while one task per chat is posted, so all the
    chats exist at once (the worst case); then they drain.  The dispatcher is
    warmed up first (threads started, lazy state built) so that only what
    the chats leave behind is counted.
    """
    d = make_dispatcher(impl, threads, queue_size=64)
    blockers = ["blocker-%d" % i for i in range(threads)]
    try:
        for _ in range(2):     # warm-up: same path, fewer chats
            gate = _Gate()
            gate.block(d, blockers)
            for i in range(1000):
                d.post(i, noop)
            gate.open()
            d.drain()
        gate = _Gate()
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            gate.block(d, blockers)
            post = d.post
            for i in range(chats):
                post(i, noop)
            gate.open()
            d.drain()
            del gate
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    finally:
        d.shutdown()
    return after - before


MEMORY_IMPLS = ("fastdispatch", "fastdispatch-py", "naive")

