"""Why the wake-up schedule of parked chats is a heap and not a sorted container.

A chat that may not start yet (its rate limit, a ``RetryAfter``) is parked
until a time of its own: different chats wake at different times, so unlike
the deadline schedule (``bench_deadlines.py``) the order of insertion is not
the order of waking.  The timer needs two operations: park (insert) and
take the earliest.  Nothing is ever removed from the middle (``force_close``
empties the whole schedule at once), so a binary heap (``heapq``, in C in
the standard library) does all that is asked: O(log n) insert and pop.
``sortedcontainers.SortedList`` is the general tool (it would be needed to
cancel one parked chat, or to look at the k-th earliest); this benchmark
measures what that generality would cost with 10,000 chats parked at random
times, each one parked and woken once per round.

    python -m pytest bench/bench_wakeups.py --benchmark-only

Result on the 2-core development machine (CPython 3.11, shared with other
work, so the fastest round of each is quoted): heapq 4.5 ms, SortedList
9.6 ms per round of 10,000 park + wake (2.1x).
"""

import heapq
import itertools
import random

import pytest

sortedcontainers = pytest.importorskip("sortedcontainers")

CHATS = 10_000


class Chat:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


def _plan(seed=1):
    rng = random.Random(seed)
    # (wake time, chat) for each chat: a mix of 1 s limits and RetryAfters.
    return [(rng.uniform(0.0, 30.0), Chat(i)) for i in range(CHATS)]


def test_heap_wakeups(benchmark):
    benchmark.group = "wake-up schedule: park + wake 10k chats"
    plan = _plan()
    seq = itertools.count()

    def round_():
        heap = []
        for until, chat in plan:
            heapq.heappush(heap, (until, next(seq), chat))   # park
        woken = 0
        while heap:
            heapq.heappop(heap)                                # the earliest wakes
            woken += 1
        return woken

    assert benchmark(round_) == CHATS


def test_sorted_list_wakeups(benchmark):
    benchmark.group = "wake-up schedule: park + wake 10k chats"
    plan = _plan()
    seq = itertools.count()

    def round_():
        schedule = sortedcontainers.SortedList()
        for until, chat in plan:
            schedule.add((until, next(seq), chat))
        woken = 0
        while schedule:
            schedule.pop(0)
            woken += 1
        return woken

    assert benchmark(round_) == CHATS
