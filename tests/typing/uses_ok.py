"""Correct uses of the public API: mypy and pyright must accept every line.

Not run, only type-checked by ``tests/test_typing.py``; each ``assert_type``
states what a checker must infer.
"""

from concurrent.futures import Future
from typing import Hashable, List, Optional

from typing_extensions import assert_type

import fastdispatch
from fastdispatch import (
    DispatcherError,
    DispatcherHooks,
    DispatcherStats,
    DispatchInfo,
    OutboundDispatcher,
    Pacing,
    QueueFull,
    RateLimit,
    RetryAfter,
    RetryPolicy,
    SendContext,
)


def returns_int(sc: SendContext) -> int:
    assert_type(sc.chat_id, Hashable)
    assert_type(sc.attempt, int)
    assert_type(sc.started, Optional[float])
    assert_type(sc.deadline, Optional[float])
    assert_type(sc.remaining(), Optional[float])
    assert_type(sc.cancelled, bool)
    assert_type(sc.wait(0.1), bool)
    sc.check()
    assert_type(sc.report_limit(4, 0.5, bucket="route", scope="global"), None)
    sc.report_limit(remaining=0, reset_after=2)
    return 1


def rate_limited(sc: SendContext) -> None:
    raise RetryAfter(3.5, scope="global")


def on_done(info: DispatchInfo) -> None:
    assert_type(info.queue_len, int)
    assert_type(info.error, Optional[BaseException])


def main() -> None:
    assert_type(fastdispatch.IMPLEMENTATION, str)
    d = OutboundDispatcher(
        max_inflight=8, queue_size=16, send_timeout=None, idle_timeout=1,
        recover=lambda exc: None, hooks=DispatcherHooks(on_done=on_done),
        pacing=Pacing(global_limit=RateLimit(30), chat_limit=RateLimit(1, per=1.0)),
        retry=RetryPolicy(max_attempts=3, retry_on=(ConnectionError,)),
    )
    assert_type(d, OutboundDispatcher)
    fut = d.submit(42, returns_int)
    assert_type(fut, "Future[int]")
    assert_type(fut.result(), int)
    assert_type(d.submit("chat", lambda sc: "text"), "Future[str]")
    assert_type(d.post(-100123, rate_limited), None)
    assert_type(d.queue_len(42), int)
    assert_type(d.active_chats, int)
    assert_type(d.inflight, int)
    assert_type(d.closed, bool)
    stats = d.stats()
    assert_type(stats, DispatcherStats)
    assert_type(stats.completed, int)
    assert_type(d.drain(timeout=2.5), bool)
    assert_type(d.shutdown(5), bool)
    d.close()
    d.force_close()
    assert_type(Pacing.discord(), Pacing)
    with OutboundDispatcher(pacing=Pacing.telegram(broadcast=100)) as d2:
        assert_type(d2, OutboundDispatcher)
    try:
        d.submit(1, returns_int)
    except QueueFull as exc:
        assert_type(exc, QueueFull)
    except DispatcherError:
        pass


class Outbox(OutboundDispatcher):
    """A subclass keeps its own type through ``with``."""

    def sent(self) -> List[int]:
        return []


def subclass() -> None:
    with Outbox(max_inflight=2) as box:
        assert_type(box, Outbox)
        assert_type(box.sent(), List[int])


async def uses_asubmit(d: OutboundDispatcher) -> None:
    async def coroutine_task(sc: SendContext) -> str:
        return "sent"

    assert_type(await d.asubmit("chat", coroutine_task), str)
    assert_type(await d.asubmit("chat", returns_int), int)
    assert_type(d.queue_size, int)
    assert_type(d.max_inflight, int)
