"""Waiting for room: ``submit``/``post``/``asubmit`` with ``block=True``.

A full chat makes a caller that asks to wait wait (its thread, or its
coroutine holding no thread), in turn with the chat's other waiters; while
anyone waits, a call that does not wait finds no room; ``timeout`` and
``max_waiting`` bound it; ``close()``/``force_close()`` wake every waiter
with ``DispatcherClosed``; a cancelled waiting ``asubmit`` leaves nothing
behind.  Every test runs against both cores.
"""

import asyncio
import sys
import threading
import time

import pytest

from fastdispatch import DispatcherClosed, DispatcherHooks, QueueFull, TaskDiscarded

from helpers import wait_until

WAIT = 10.0  # a bound on any wait that should end at once (never reached when correct)


def _identity(s):
    return s.submitted == s.completed + s.failed + s.discarded + s.cancelled + s.timed_out


def _held_chat(d, chat, fill):
    """Hold ``chat``'s worker in a task and fill its queue with ``fill`` tasks."""
    gate = threading.Event()
    started = threading.Event()

    def hold(sc):
        started.set()
        gate.wait(WAIT)

    d.submit(chat, hold)
    assert started.wait(WAIT)
    for _ in range(fill):
        d.submit(chat, lambda sc: None)
    return gate


def test_default_raises_at_once(make_dispatcher):
    d = make_dispatcher(queue_size=1)
    gate = _held_chat(d, 1, 1)
    with pytest.raises(QueueFull):
        d.submit(1, lambda sc: None)
    with pytest.raises(QueueFull):
        d.post(1, lambda sc: None)
    assert d.stats().waiting == 0
    gate.set()


def test_bad_timeout_raises_at_the_call_naming_it(make_dispatcher):
    d = make_dispatcher()
    for bad, error in (("1", TypeError), (-1, ValueError), (float("nan"), ValueError),
                       (True, TypeError)):
        with pytest.raises(error, match="timeout"):
            d.submit(1, lambda sc: None, block=True, timeout=bad)
        with pytest.raises(error, match="timeout"):
            d.post(1, lambda sc: None, block=True, timeout=bad)
    assert d.stats().submitted == 0


def test_max_waiting_is_checked_like_the_other_sizes(impl):
    for bad, error in ((0, ValueError), ("3", TypeError), (True, TypeError)):
        with pytest.raises(error, match="max_waiting"):
            impl.OutboundDispatcher(max_waiting=bad)


def test_blocked_caller_gets_in_fifo_and_counts(make_dispatcher):
    d = make_dispatcher(queue_size=2)
    gate = _held_chat(d, 1, 2)
    ran = []
    futures = {}

    def producer(i):
        futures[i] = d.submit(1, lambda sc: ran.append(i), block=True)

    threads = []
    for i in range(5):
        t = threading.Thread(target=producer, args=(i,))
        t.start()
        threads.append(t)
        wait_until(lambda: d.stats().waiting == i + 1)  # in this order
    s = d.stats()
    assert s.waiting == 5 and s.submitted == 3   # waiters count once let in
    gate.set()
    for t in threads:
        t.join(WAIT)
    assert [futures[i].result(WAIT) for i in range(5)] == [None] * 5
    assert d.drain(WAIT)
    assert ran == [0, 1, 2, 3, 4]
    s = d.stats()
    assert s.waiting == 0 and s.submitted == 8 and s.completed == 8 and _identity(s)


def test_nobody_jumps_the_line(make_dispatcher):
    # The moment a task leaves the full queue, the oldest waiter's task
    # takes its place: a call that does not wait, made right then (here:
    # by the task that just left, from inside it), finds no room.
    d = make_dispatcher(queue_size=1)
    gate = threading.Event()
    started = threading.Event()
    results = []

    def first(sc):
        started.set()
        gate.wait(WAIT)

    def second(sc):
        try:
            d.submit(2, lambda sc: None)   # another chat: room
            d.submit(1, lambda sc: results.append("jumped"))
            results.append("accepted")
        except QueueFull:
            results.append("refused")

    d.submit(1, first)
    assert started.wait(WAIT)          # out of the ring: room for one
    d.submit(1, second)
    waiter = threading.Thread(target=lambda: d.submit(
        1, lambda sc: results.append("waiter"), block=True))
    waiter.start()
    wait_until(lambda: d.stats().waiting == 1)
    gate.set()
    waiter.join(WAIT)
    assert d.drain(WAIT)
    assert results == ["refused", "waiter"]


def test_timeout_gives_queue_full_and_leaves_nothing(make_dispatcher):
    rejected = []
    d = make_dispatcher(queue_size=1, hooks=DispatcherHooks(
        on_rejected=lambda chat, exc: rejected.append(type(exc))))
    gate = _held_chat(d, 1, 1)
    with pytest.raises(QueueFull, match="timeout"):
        d.submit(1, lambda sc: None, block=True, timeout=0.05)
    with pytest.raises(QueueFull, match="timeout"):
        d.post(1, lambda sc: None, block=True, timeout=0)
    s = d.stats()
    assert s.waiting == 0 and s.rejected == 2 and rejected == [QueueFull, QueueFull]
    gate.set()
    assert d.drain(WAIT)
    s = d.stats()
    assert s.submitted == 2 and _identity(s)


def test_max_waiting_refuses_at_once(make_dispatcher):
    d = make_dispatcher(queue_size=1, max_waiting=2)
    gate = _held_chat(d, 1, 1)
    threads = [threading.Thread(target=d.post, args=(1, lambda sc: None), kwargs={"block": True})
               for _ in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: d.stats().waiting == 2)
    started = time.monotonic()
    with pytest.raises(QueueFull, match="max_waiting"):
        d.submit(1, lambda sc: None, block=True)   # no timeout: it must not wait
    with pytest.raises(QueueFull, match="max_waiting"):
        d.post(1, lambda sc: None, block=True, timeout=WAIT)
    assert time.monotonic() - started < WAIT
    gate.set()
    for t in threads:
        t.join(WAIT)
    assert d.drain(WAIT)
    s = d.stats()
    assert s.rejected == 2 and s.submitted == 4 and _identity(s)


@pytest.mark.parametrize("how", ["close", "force_close"])
def test_close_wakes_every_waiter(make_dispatcher, how):
    d = make_dispatcher(queue_size=1)
    gate = _held_chat(d, 1, 1)
    errors = []

    def producer():
        try:
            d.submit(1, lambda sc: None, block=True)
        except BaseException as exc:
            errors.append(type(exc))

    threads = [threading.Thread(target=producer) for _ in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: d.stats().waiting == 4)
    getattr(d, how)()
    for t in threads:
        t.join(WAIT)
    assert errors == [DispatcherClosed] * 4
    assert d.stats().waiting == 0
    gate.set()
    assert d.drain(WAIT)
    s = d.stats()
    assert s.rejected == 4 and _identity(s)


def test_close_after_the_check_still_turns_the_caller_away(make_dispatcher, impl):
    # A caller that looked at ``closed`` before close() and enters the line
    # after close() swept the chats is turned away all the same.
    d = make_dispatcher(queue_size=1)
    gate = _held_chat(d, 1, 1)
    errors = []
    stop = threading.Event()

    def producer():
        while not stop.is_set():
            try:
                d.submit(1, lambda sc: None, block=True, timeout=WAIT)
            except DispatcherClosed:
                errors.append("closed")
                return
    threads = [threading.Thread(target=producer) for _ in range(8)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for t in threads:
            t.start()
        d.close()
        for t in threads:
            t.join(WAIT)
    finally:
        sys.setswitchinterval(old)
        stop.set()
    assert errors == ["closed"] * 8
    gate.set()
    assert d.drain(WAIT)
    assert d.stats().waiting == 0


def test_a_panic_discards_the_waiters_tasks(make_dispatcher):
    d = make_dispatcher(queue_size=1)
    gate = threading.Event()
    running = threading.Event()

    def panics(sc):
        running.set()
        gate.wait(WAIT)
        raise KeyboardInterrupt("boom")

    d.submit(1, panics)
    assert running.wait(WAIT)  # out of the queue: room for one more
    d.submit(1, lambda sc: None)
    futures = []
    threads = [threading.Thread(target=lambda: futures.append(
        d.submit(1, lambda sc: None, block=True))) for _ in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: d.stats().waiting == 3)
    gate.set()
    for t in threads:
        t.join(WAIT)
    assert len(futures) == 3
    for f in futures:
        with pytest.raises(TaskDiscarded):
            f.result(WAIT)
    assert d.drain(WAIT)
    s = d.stats()
    assert s.waiting == 0 and s.discarded == 4 and _identity(s)


def test_asubmit_waits_holding_no_thread(make_dispatcher):
    d = make_dispatcher(queue_size=2)
    gate = _held_chat(d, 1, 2)
    n = 300

    async def main():
        threads_before = threading.active_count()
        order = []
        calls = [asyncio.ensure_future(d.asubmit(1, lambda sc, i=i: order.append(i) or i,
                                                 block=True)) for i in range(n)]
        while d.stats().waiting < n:
            await asyncio.sleep(0.001)
        assert threading.active_count() == threads_before
        with pytest.raises(QueueFull):
            await d.asubmit(1, lambda sc: None)   # nobody jumps the line
        gate.set()
        results = await asyncio.gather(*calls)
        return order, results

    order, results = asyncio.run(main())
    assert order == list(range(n)) and results == list(range(n))
    assert d.drain(WAIT)
    s = d.stats()
    assert s.waiting == 0 and s.submitted == n + 3 and _identity(s)


def test_asubmit_timeout_and_close(make_dispatcher):
    d = make_dispatcher(queue_size=1)
    gate = _held_chat(d, 1, 1)

    async def main():
        with pytest.raises(QueueFull, match="timeout"):
            await d.asubmit(1, lambda sc: None, block=True, timeout=0.05)
        waiting = asyncio.ensure_future(d.asubmit(1, lambda sc: None, block=True))
        while d.stats().waiting < 1:
            await asyncio.sleep(0.001)
        d.close()
        with pytest.raises(DispatcherClosed):
            await waiting

    asyncio.run(main())
    gate.set()
    assert d.drain(WAIT)
    s = d.stats()
    assert s.waiting == 0 and s.rejected == 2 and _identity(s)


def test_cancelled_waiting_asubmit_leaves_nothing_behind(make_dispatcher):
    d = make_dispatcher(queue_size=1)
    gate = _held_chat(d, 1, 1)
    ran = []

    async def main():
        calls = [asyncio.ensure_future(d.asubmit(1, lambda sc, i=i: ran.append(i),
                                                 block=True)) for i in range(6)]
        while d.stats().waiting < 6:
            await asyncio.sleep(0.001)
        for i in (0, 2, 3):
            calls[i].cancel()
        with pytest.raises(asyncio.TimeoutError):   # wait_for cancels the waiting call
            await asyncio.wait_for(d.asubmit(1, lambda sc: ran.append("t"), block=True), 0.05)
        s = d.stats()
        assert s.waiting == 3 and s.rejected == 0
        gate.set()
        await asyncio.gather(*(calls[i] for i in (1, 4, 5)))

    asyncio.run(main())
    assert d.drain(WAIT)
    assert ran == [1, 4, 5]
    s = d.stats()
    assert s.waiting == 0 and s.submitted == 5 and s.completed == 5 and _identity(s)


@pytest.mark.stress
def test_many_blocking_producers_keep_order_and_counts(
        make_dispatcher, tiny_switch_interval, soak_factor):
    chats, producers, per_producer = 4, 12, 150 * soak_factor
    d = make_dispatcher(queue_size=2, max_inflight=3)
    seen = {c: [] for c in range(chats)}
    jumped = []
    stop = threading.Event()

    def producer(p):
        for i in range(per_producer):
            chat = (p + i) % chats
            if i % 2:
                d.post(chat, lambda sc, v=(p, i): seen[sc.chat_id].append(v), block=True)
            else:
                d.submit(chat, lambda sc, v=(p, i): seen[sc.chat_id].append(v), block=True)

    def jumper():
        # Calls that do not wait: accepted only when nobody waits.
        while not stop.is_set():
            try:
                d.post(0, lambda sc: jumped.append(1))
            except QueueFull:
                pass

    threads = [threading.Thread(target=producer, args=(p,)) for p in range(producers)]
    j = threading.Thread(target=jumper)
    j.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    j.join(WAIT)
    assert d.drain(60)
    for chat, values in seen.items():
        by_producer = {}
        for p, i in values:
            by_producer.setdefault(p, []).append(i)
        for p, got in by_producer.items():
            assert got == sorted(got), (chat, p)    # each producer's order kept
    assert sum(len(v) for v in seen.values()) == producers * per_producer
    s = d.stats()
    assert s.waiting == 0 and s.completed == producers * per_producer + len(jumped)
    assert s.submitted == s.completed and _identity(s)


@pytest.mark.stress
def test_many_waiting_coroutines_with_cancellations(
        make_dispatcher, tiny_switch_interval, soak_factor):
    d = make_dispatcher(queue_size=2, max_inflight=4)
    n = 400 * soak_factor
    done = []

    async def main():
        async def one(i):
            await d.asubmit(i % 3, lambda sc: done.append(i), block=True,
                            timeout=None if i % 5 else 0.0)
        calls = [asyncio.ensure_future(one(i)) for i in range(n)]
        await asyncio.sleep(0)
        for i in range(0, n, 7):
            calls[i].cancel()
        return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(main())
    assert d.drain(60)
    s = d.stats()
    ok = sum(1 for r in results if r is None)
    full = sum(1 for r in results if isinstance(r, QueueFull))
    cancelled = sum(1 for r in results if isinstance(r, asyncio.CancelledError))
    assert ok + full + cancelled == n and cancelled >= 1
    # (a call cancelled just after its task was let in may have seen it run)
    assert s.waiting == 0 and ok <= s.completed == len(done) and s.rejected == full
    assert s.submitted == s.completed + s.cancelled and _identity(s)


# ------------------------------------------- calls from inside a running task

def test_running_chat_says_which_task_the_caller_runs_in(make_dispatcher):
    d = make_dispatcher()
    other = make_dispatcher()
    seen = {}
    assert d.running_chat() is None

    def thread_task(sc):
        seen["thread"] = d.running_chat()
        seen["other dispatcher"] = other.running_chat()
        seen["hook-free thread"] = []
        t = threading.Thread(target=lambda: seen["hook-free thread"].append(d.running_chat()))
        t.start()
        t.join()

    d.submit("t", thread_task).result(WAIT)

    async def main():
        leftovers = []

        async def coro_task(sc):
            seen["coroutine"] = d.running_chat()
            child = asyncio.ensure_future(asyncio.sleep(0, d.running_chat()))
            seen["child"] = await child
            leftovers.append(asyncio.ensure_future(_later(d)))
            return "ok"

        def sync_part(sc):
            seen["sync part"] = d.running_chat()
            return coro_task(sc)

        assert await d.asubmit(("c", 1), sync_part) == "ok"
        seen["caller"] = d.running_chat()
        seen["after the end"] = await leftovers[0]

    asyncio.run(main())
    assert seen == {"thread": "t", "other dispatcher": None, "hook-free thread": [None],
                    "coroutine": ("c", 1), "sync part": ("c", 1), "child": ("c", 1),
                    "caller": None, "after the end": None}


async def _later(d):
    await asyncio.sleep(0.05)
    return d.running_chat()


def test_waiting_for_its_own_chat_raises_at_once(make_dispatcher):
    d = make_dispatcher(queue_size=2)
    got = []

    def task(sc):
        for _ in range(2):
            d.submit(sc.chat_id, lambda sc: None)     # fills its own chat
        for call in (d.submit, d.post):
            try:
                call(sc.chat_id, lambda sc: None, block=True)   # no timeout: must not hang
            except QueueFull as exc:
                got.append(str(exc))

    d.submit(1, task).result(WAIT)

    async def main():
        async def coro(sc):
            for _ in range(2):
                d.submit(sc.chat_id, lambda sc: None)
            try:
                await d.asubmit(sc.chat_id, lambda sc: None, block=True)
            except QueueFull as exc:
                got.append(str(exc))
            try:
                d.submit(sc.chat_id, lambda sc: None, block=True)  # a thread call, on the loop
            except QueueFull as exc:
                got.append(str(exc))
        await d.asubmit(2, coro)

    asyncio.run(main())
    assert len(got) == 4 and all("wait for itself" in m for m in got), got
    assert d.drain(WAIT)
    s = d.stats()
    assert s.rejected == 4 and s.waiting == 0 and _identity(s)


def test_a_wait_that_would_hold_every_slot_is_refused(make_dispatcher):
    d = make_dispatcher(queue_size=1, max_inflight=1)
    got = []

    def task(sc):
        d.submit("b", lambda sc: None)            # "b" cannot start: the one slot is ours
        try:
            d.submit("b", lambda sc: None, block=True)
        except QueueFull as exc:
            got.append(str(exc))

    d.submit("a", task).result(WAIT)
    assert d.drain(WAIT)
    assert len(got) == 1 and "max_inflight" in got[0]


def test_a_wait_that_would_close_a_cycle_is_refused_and_others_end(make_dispatcher):
    d = make_dispatcher(queue_size=1, max_inflight=4)
    a_may_go = threading.Event()
    a_started = threading.Event()
    b_waits = threading.Event()
    got = []

    def a1(sc):
        a_started.set()
        assert a_may_go.wait(WAIT)
        try:
            d.submit("b", lambda sc: got.append("b3"), block=True)
        except QueueFull as exc:
            got.append(str(exc))

    def b1(sc):
        d.submit("b", lambda sc: got.append("b2"))          # "b" is full now
        b_waits.set()
        d.submit("a", lambda sc: got.append("a3"), block=True)  # waits for a2 to start
        got.append("b1 got in")

    d.submit("a", a1)
    assert a_started.wait(WAIT)                              # out of the ring
    d.submit("a", lambda sc: got.append("a2"))               # "a" is full now
    d.submit("b", b1)
    assert b_waits.wait(WAIT)
    wait_until(lambda: d.stats().waiting == 1)
    a_may_go.set()
    assert d.drain(WAIT)
    assert "never end" in got[0], got
    assert sorted(got[1:]) == ["a2", "a3", "b1 got in", "b2"]
    s = d.stats()
    assert s.rejected == 1 and s.waiting == 0 and _identity(s)


def test_a_task_may_wait_for_another_chat_that_can_make_room(make_dispatcher):
    d = make_dispatcher(queue_size=1, max_inflight=2)
    gate = _held_chat(d, "b", 1)
    order = []

    def task(sc):
        d.submit("b", lambda sc: order.append("b"), block=True)
        order.append("a got in")

    fut = d.submit("a", task)
    wait_until(lambda: d.stats().waiting == 1)
    gate.set()
    fut.result(WAIT)
    assert d.drain(WAIT)
    assert order == ["a got in", "b"] or order == ["b", "a got in"]


def test_a_thread_wait_on_the_loop_coroutine_tasks_need_is_refused(make_dispatcher):
    d = make_dispatcher(queue_size=1)
    gate = _held_chat(d, 1, 1)

    async def main():
        assert await d.asubmit(2, lambda sc: "coroutine tasks exist") == "coroutine tasks exist"
        for call in (d.submit, d.post):
            with pytest.raises(QueueFull, match="asubmit"):
                call(1, lambda sc: None, block=True)   # no timeout: must not hang the loop
        waiting = asyncio.ensure_future(d.asubmit(1, lambda sc: "waited", block=True))
        await asyncio.sleep(0.01)
        gate.set()
        return await waiting

    assert asyncio.run(main()) == "waited"
    assert d.drain(WAIT)
    s = d.stats()
    assert s.rejected == 2 and s.waiting == 0 and _identity(s)
