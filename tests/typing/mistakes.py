"""Planted mistakes: each line whose comment starts with "error" must be reported, no other.

Not run, only type-checked by ``tests/test_typing.py`` (with mypy and with
pyright).  The first seven are the ones a newcomer makes in an hour.
"""

from fastdispatch import OutboundDispatcher, Pacing, RateLimit, RetryAfter, SendContext


def returns_int(sc: SendContext) -> int:
    return 1


def uses_deadline(sc: SendContext) -> float:
    return sc.remaining() + 1.0  # error: remaining() may be None


def reports(sc: SendContext) -> None:
    sc.report_limit(1, 1.0, "route")  # error: bucket is keyword-only
    sc.report_limit(1, 1.0, scope="everyone")  # error: scope is "chat" or "global"


def mistakes() -> None:
    d = OutboundDispatcher(max_inflight="8")  # error: str for an int
    d.sumbit(1, returns_int)  # error: misspelt method
    d.submit("chat", 42)  # error: the task is not callable
    d.post(1, lambda: None)  # error: a task takes a SendContext
    d.shutdown(timeout="soon")  # error: seconds are a number
    x: str = d.submit(1, returns_int).result()  # error: Future[int]
    OutboundDispatcher(8)  # error: options are keyword-only
    OutboundDispatcher(pacing=RateLimit(1))  # error: a RateLimit is not a Pacing
    Pacing(chat_limit=20)  # error: a limit is a RateLimit
    RetryAfter("3")  # error: seconds are a number
    d.stats().submited  # error: misspelt counter
    print(x)
