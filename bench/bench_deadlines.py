"""Why the deadline schedule is an ordered list and not a sorted container.

Every running task enters the schedule when it starts and leaves it when it
ends, so the schedule's insert + remove is paid once per task.  All tasks of
a dispatcher share one ``send_timeout``, so start order *is* deadline order:
an insertion-ordered structure keeps the earliest deadline at its head with
O(1) insert and remove.  A ``sortedcontainers.SortedKeyList`` keyed by
deadline would be the general tool (it would be needed if deadlines could
differ per task); this benchmark measures what that generality would cost
on the per-task path, with 64 tasks in flight.

    python -m pytest bench/bench_deadlines.py --benchmark-only
"""

import itertools
from collections import OrderedDict
from time import monotonic

import pytest

sortedcontainers = pytest.importorskip("sortedcontainers")

IN_FLIGHT = 64
TASKS = 2_000


class Task:
    __slots__ = ("deadline",)

    def __init__(self, deadline):
        self.deadline = deadline


def _prefilled(add):
    now = monotonic()
    tasks = [Task(now + 30.0 + i * 1e-6) for i in range(IN_FLIGHT)]
    for t in tasks:
        add(t)
    return tasks


def test_ordered_dict_schedule(benchmark):
    benchmark.group = "deadline schedule: insert + remove per task"
    running = OrderedDict()
    window = _prefilled(lambda t: running.__setitem__(t, None))
    clock = itertools.count()

    def per_task():
        for _ in range(TASKS):
            task = Task(30.0 + next(clock))
            running[task] = None                  # task starts
            oldest = window.pop(0)
            running.pop(oldest, None)             # the oldest one ends
            window.append(task)
        return next(iter(running)).deadline       # the head: earliest deadline

    benchmark(per_task)


def test_sorted_key_list_schedule(benchmark):
    benchmark.group = "deadline schedule: insert + remove per task"
    running = sortedcontainers.SortedKeyList(key=lambda t: t.deadline)
    window = _prefilled(running.add)
    clock = itertools.count()

    def per_task():
        for _ in range(TASKS):
            task = Task(30.0 + next(clock))
            running.add(task)
            oldest = window.pop(0)
            running.remove(oldest)
            window.append(task)
        return running[0].deadline

    benchmark(per_task)
