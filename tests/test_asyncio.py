"""docs/guarantees.md G17: coroutine tasks (``asubmit``) on both cores.

A coroutine task is called on the caller's event loop; the awaitable it
returns runs there, and its chat stays owned until it ends.  No thread is
held meanwhile.  Everything the dispatcher promises for thread tasks holds
for them too, mixed with thread tasks in one chat.
"""

import asyncio
import gc
import re
import sys
import threading
import time
import warnings
from collections import defaultdict

import pytest

from fastdispatch import (Cancelled, DispatcherClosed, DispatcherHooks, Pacing, QueueFull,
                          RateLimit, RetryAfter, RetryPolicy, SendTimeout, TaskDiscarded)

from helpers import max_in_window


class LoopThread:
    """An event loop running on a thread of its own (for tests that stop or
    close a loop while the dispatcher still has work for it)."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout=10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def close(self):
        self.stop()
        self.loop.close()


# ------------------------------------------------------------- the basics

def test_asubmit_returns_the_result_and_runs_the_task_on_the_loop_thread(make_dispatcher):
    d = make_dispatcher()
    seen = {}

    async def main():
        seen["loop"] = threading.get_ident()

        async def task(sc):
            seen["coroutine"] = threading.get_ident()
            await asyncio.sleep(0.01)
            return ("sent", sc.chat_id)

        def sync_task(sc):
            seen["sync"] = threading.get_ident()
            return "plain"

        return (await d.asubmit("c", task), await d.asubmit("c", sync_task),
                await d.asubmit("c", lambda sc: asyncio.sleep(0, result="awaitable")))

    assert asyncio.run(main()) == (("sent", "c"), "plain", "awaitable")
    assert seen["coroutine"] == seen["loop"] == seen["sync"]
    assert d.drain(timeout=5)
    s = d.stats()
    assert s.completed == 3 and s.submitted == 3 and d.active_chats == 0


def test_asubmit_must_be_awaited_on_a_running_loop(make_dispatcher):
    d = make_dispatcher()
    coro = d.asubmit("c", lambda sc: None)
    with pytest.raises(RuntimeError):
        coro.send(None)
    coro.close()
    assert d.stats().submitted == 0


def test_asubmit_raises_what_the_task_raised(make_dispatcher):
    d = make_dispatcher()

    async def main():
        async def task(sc):
            await asyncio.sleep(0)
            raise KeyError("nope")
        with pytest.raises(KeyError):
            await d.asubmit("c", task)
        with pytest.raises(TypeError, match="task"):
            await d.asubmit("c", "not callable")
        with pytest.raises(TypeError, match="chat_id"):
            await d.asubmit(None, task)

    asyncio.run(main())
    assert d.drain(timeout=5)
    assert d.stats().failed == 1


def test_queue_full_and_closed_are_raised_at_once(make_dispatcher):
    d = make_dispatcher(queue_size=1)

    async def main():
        gate = asyncio.Event()

        async def hold(sc):
            await gate.wait()

        first = asyncio.ensure_future(d.asubmit("c", hold))
        await asyncio.sleep(0.05)                 # hold runs
        second = asyncio.ensure_future(d.asubmit("c", hold))
        await asyncio.sleep(0.05)                 # second waits in the queue
        with pytest.raises(QueueFull):
            await d.asubmit("c", hold)
        gate.set()
        await first
        await second
        d.close()
        with pytest.raises(DispatcherClosed):
            await d.asubmit("c", hold)

    asyncio.run(main())
    assert d.stats().rejected == 2


def test_coroutine_tasks_in_flight_hold_no_thread(make_dispatcher):
    """1,000 coroutine sends in flight at once: the dispatcher's threads do
    not grow with them."""
    d = make_dispatcher(max_inflight=1000)
    peak = []

    async def main():
        release = asyncio.Event()
        started = 0

        async def send(sc):
            nonlocal started
            started += 1
            await release.wait()
            return sc.chat_id

        futs = [asyncio.ensure_future(d.asubmit(chat, send)) for chat in range(1000)]
        while started < 1000:
            await asyncio.sleep(0.01)
        peak.append((d.inflight, d.stats().threads))
        release.set()
        return await asyncio.gather(*futs)

    assert asyncio.run(main()) == list(range(1000))
    inflight, threads = peak[0]
    assert inflight == 1000
    assert threads <= 2      # at most the timer; no worker was needed
    assert d.drain(timeout=5)


def test_max_inflight_counts_coroutine_tasks(make_dispatcher):
    d = make_dispatcher(max_inflight=5)
    running = [0]
    peak = [0]

    async def main():
        async def send(sc):
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            await asyncio.sleep(0.01)
            running[0] -= 1

        await asyncio.gather(*(d.asubmit(chat % 40, send) for chat in range(200)))

    asyncio.run(main())
    assert peak[0] == 5
    assert d.drain(timeout=5) and d.stats().completed == 200


def test_max_inflight_counts_coroutine_and_thread_tasks_together(make_dispatcher):
    d = make_dispatcher(max_inflight=4)
    lock = threading.Lock()
    running = [0]
    peak = [0]

    def enter():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])

    def leave():
        with lock:
            running[0] -= 1

    async def main():
        async def coro(sc):
            enter()
            await asyncio.sleep(0.01)
            leave()

        def thread_task(sc):
            enter()
            time.sleep(0.01)
            leave()

        futs = [asyncio.wrap_future(d.submit(("t", i % 10), thread_task)) for i in range(60)]
        futs += [d.asubmit(("a", i % 10), coro) for i in range(60)]
        await asyncio.gather(*futs)

    asyncio.run(main())
    assert peak[0] <= 4
    assert d.drain(timeout=5) and d.stats().completed == 120


# ------------------------------------------------- order across both kinds

def test_thread_and_coroutine_tasks_of_one_chat_keep_order_and_never_overlap(
        make_dispatcher, tiny_switch_interval):
    d = make_dispatcher(max_inflight=8, queue_size=1000)
    log = defaultdict(list)
    running = set()
    overlaps = []
    lock = threading.Lock()

    def enter(chat, seq):
        with lock:
            if chat in running:
                overlaps.append(chat)
            running.add(chat)
            log[chat].append(seq)

    def leave(chat):
        with lock:
            running.discard(chat)

    def make(chat, seq):
        if seq % 2:
            async def coro(sc):
                enter(chat, seq)
                await asyncio.sleep(0.001 * (seq % 3))
                leave(chat)
                return seq
            return coro

        def thread_task(sc):
            enter(chat, seq)
            time.sleep(0.001 * (seq % 3))
            leave(chat)
            return seq
        return thread_task

    async def main():
        futs = []
        for seq in range(60):
            for chat in range(10):
                task = make(chat, seq)
                if seq % 2:
                    futs.append(asyncio.ensure_future(d.asubmit(chat, task)))
                    # asubmit queues its task when its coroutine first runs:
                    # let it run before the next submit.
                    await asyncio.sleep(0)
                else:
                    futs.append(asyncio.wrap_future(d.submit(chat, task)))
        return await asyncio.gather(*futs)

    asyncio.run(main())
    assert not overlaps
    for chat in range(10):
        assert log[chat] == list(range(60)), chat
    assert d.drain(timeout=10)


def test_coroutine_tasks_from_threads_and_loops_keep_per_producer_order(
        make_dispatcher, tiny_switch_interval, soak_factor):
    """Several loops on their own threads and several plain threads submit to
    the same chats at once: each producer's tasks of a chat start in its
    order, and no two tasks of a chat ever run at once."""
    d = make_dispatcher(max_inflight=6, queue_size=100_000)
    lock = threading.Lock()
    log = defaultdict(list)
    running = set()
    overlaps = []
    n = 100 * soak_factor

    def record(chat, producer, seq):
        with lock:
            if chat in running:
                overlaps.append(chat)
            running.add(chat)
            log[(chat, producer)].append(seq)

    def done(chat):
        with lock:
            running.discard(chat)

    def loop_producer(p):
        async def main():
            futs = []
            for seq in range(n):
                chat = seq % 7

                async def task(sc, chat=chat, seq=seq):
                    record(chat, p, seq)
                    await asyncio.sleep(0)
                    done(chat)
                futs.append(asyncio.ensure_future(d.asubmit(chat, task)))
            await asyncio.gather(*futs)
        asyncio.run(main())

    def thread_producer(p):
        futs = []
        for seq in range(n):
            chat = seq % 7

            def task(sc, chat=chat, seq=seq):
                record(chat, p, seq)
                done(chat)
            futs.append(d.submit(chat, task))
        for f in futs:
            f.result(timeout=60)

    threads = [threading.Thread(target=loop_producer, args=(p,)) for p in range(3)]
    threads += [threading.Thread(target=thread_producer, args=(p,)) for p in range(3, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not overlaps
    for key, seqs in log.items():
        assert seqs == sorted(seqs), key
    assert sum(len(v) for v in log.values()) == 5 * n
    assert d.drain(timeout=10)


# -------------------------------------------------- pacing and retries

def test_pacing_counts_a_coroutine_start_when_it_is_called_on_the_loop(make_dispatcher):
    d = make_dispatcher(pacing=Pacing(chat_limit=RateLimit(2, per=0.2),
                                      global_limit=RateLimit(5, per=0.2)))
    starts = defaultdict(list)
    all_starts = []

    async def main():
        async def send(sc):
            starts[sc.chat_id].append(sc.started)
            all_starts.append(sc.started)
            assert sc.started <= time.monotonic()
            await asyncio.sleep(0.001)

        await asyncio.gather(*(d.asubmit(chat, send) for chat in range(6) for _ in range(5)))

    asyncio.run(main())
    for chat, times in starts.items():
        assert max_in_window(times, 0.2) <= 2
    assert max_in_window(all_starts, 0.2) <= 5
    assert d.stats().paced > 0


def test_retry_after_in_a_coroutine_retries_on_the_same_loop_before_later_tasks(
        make_dispatcher):
    d = make_dispatcher(retry=RetryPolicy())
    order = []
    threads = set()

    async def main():
        async def flaky(sc):
            threads.add(threading.get_ident())
            order.append(("flaky", sc.attempt))
            if sc.attempt < 3:
                raise RetryAfter(0.02)
            return "finally"

        async def later(sc):
            order.append(("later", sc.attempt))
            return "later"

        return await asyncio.gather(d.asubmit("c", flaky), d.asubmit("c", later))

    assert asyncio.run(main()) == ["finally", "later"]
    assert order == [("flaky", 1), ("flaky", 2), ("flaky", 3), ("later", 1)]
    assert len(threads) == 1
    assert d.stats().retried == 2


# ------------------------------------------ deadlines, cancels, force_close

def test_send_timeout_cancels_the_coroutine_and_the_chat_goes_on(make_dispatcher):
    d = make_dispatcher(send_timeout=0.2)
    seen = []

    async def main():
        async def stuck(sc):
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        with pytest.raises(SendTimeout):
            await d.asubmit("c", stuck)
        return await d.asubmit("c", lambda sc: "next")

    assert asyncio.run(main()) == "next"
    assert seen == ["cancelled"]
    assert d.drain(timeout=5)
    s = d.stats()
    assert s.timed_out == 1 and s.completed == 1


def test_cancelling_the_await_before_the_start_skips_the_task(make_dispatcher):
    d = make_dispatcher()
    ran = []

    async def main():
        gate = asyncio.Event()

        async def hold(sc):
            await gate.wait()

        async def never(sc):
            ran.append("never")

        first = asyncio.ensure_future(d.asubmit("c", hold))
        await asyncio.sleep(0.02)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(d.asubmit("c", never), 0.05)
        gate.set()
        await first
        return await d.asubmit("c", lambda sc: "after")

    assert asyncio.run(main()) == "after"
    assert ran == []
    assert d.drain(timeout=5)
    s = d.stats()
    assert s.cancelled == 1 and s.completed == 2


def test_cancelling_the_await_after_the_start_cancels_the_coroutine(make_dispatcher):
    d = make_dispatcher()
    seen = []

    async def main():
        async def slow(sc):
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(d.asubmit("c", slow), 0.1)
        return await d.asubmit("c", lambda sc: "next")

    assert asyncio.run(main()) == "next"
    assert seen == ["cancelled"]
    assert d.drain(timeout=5)
    assert d.stats().cancelled == 1


def test_force_close_cancels_running_coroutines(make_dispatcher):
    d = make_dispatcher()
    seen = []

    async def main():
        async def slow(sc):
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                seen.append(sc.chat_id)
                raise

        futs = [asyncio.ensure_future(d.asubmit(chat, slow)) for chat in range(5)]
        waiting = asyncio.ensure_future(d.asubmit(0, slow))
        await asyncio.sleep(0.1)
        d.force_close()
        results = await asyncio.gather(*futs, waiting, return_exceptions=True)
        return results

    results = asyncio.run(main())
    assert all(isinstance(r, Cancelled) for r in results), results
    assert sorted(seen) == list(range(5))
    assert d.drain(timeout=5)
    assert d.stats().cancelled == 6


def test_a_panicking_coroutine_discards_its_chat_and_the_dispatcher_goes_on(make_dispatcher):
    class Panic(BaseException):
        pass

    d = make_dispatcher()

    async def main():
        gate = asyncio.Event()

        async def panic(sc):
            await gate.wait()
            raise Panic()

        first = asyncio.ensure_future(d.asubmit("c", panic))
        second = asyncio.ensure_future(d.asubmit("c", lambda sc: "discarded"))
        await asyncio.sleep(0.05)
        gate.set()
        return await asyncio.gather(first, second, return_exceptions=True)

    first, second = asyncio.run(main())
    assert isinstance(first, TaskDiscarded) and isinstance(first.__cause__, Panic)
    assert isinstance(second, TaskDiscarded)
    assert d.drain(timeout=5)


# ------------------------------------------------ loops that stop or close

def test_tasks_of_a_closed_loop_fail_with_cancelled_and_never_run(make_dispatcher):
    """A loop closed while its coroutine tasks wait behind a thread task:
    they never run, they are counted cancelled, and drain() returns."""
    d = make_dispatcher()
    gate = threading.Event()
    ran = []
    lt = LoopThread()
    blocker = d.submit("c", lambda sc: gate.wait(5))

    async def queue_some():
        async def task(sc):
            ran.append(sc.chat_id)
        return [asyncio.ensure_future(d.asubmit("c", task)) for _ in range(3)]

    lt.run(queue_some())
    lt.close()
    gate.set()
    blocker.result(timeout=5)
    after = d.submit("c", lambda sc: "after")
    assert after.result(timeout=5) == "after"
    assert d.drain(timeout=5)
    assert ran == []
    assert d.stats().cancelled == 3


def test_tasks_of_a_stopped_loop_do_not_hold_their_chat(make_dispatcher):
    """A loop that stops (without being closed) after its chat was handed
    to it: the timer takes the chat back, its task fails with Cancelled."""
    d = make_dispatcher()
    lt = LoopThread()
    gate = threading.Event()
    ran = []
    blocker = d.submit("c", lambda sc: gate.wait(5))

    async def queue_one():
        async def task(sc):
            ran.append("ran")
        return asyncio.ensure_future(d.asubmit("c", task))

    lt.run(queue_one())
    lt.stop()              # stopped, not closed
    gate.set()
    blocker.result(timeout=5)
    assert d.submit("c", lambda sc: "after").result(timeout=5) == "after"
    assert d.drain(timeout=5)
    assert ran == []
    lt.loop.close()


def test_a_running_coroutine_of_a_closed_loop_is_ended_and_its_chat_goes_on(make_dispatcher):
    d = make_dispatcher(send_timeout=0.3)
    lt = LoopThread()
    running = threading.Event()

    async def start_one():
        async def task(sc):
            running.set()
            await asyncio.sleep(10)
        return asyncio.ensure_future(d.asubmit("c", task))

    lt.run(start_one())
    # Stopped once the coroutine runs (not after a fixed sleep: on a loaded
    # machine the task may not have started yet, another case).
    assert running.wait(10)
    lt.stop()
    lt.loop.close()    # the coroutine never ends there
    assert d.submit("c", lambda sc: "after").result(timeout=5) == "after"
    assert d.drain(timeout=5)
    s = d.stats()
    # Ended by whichever comes first: its deadline (0.3 s: timed out) or the
    # timer's look at the loops (a closed loop's task: cancelled).
    assert s.timed_out + s.cancelled == 1 and s.completed == 1


def test_drain_refuses_to_block_the_loop_coroutine_tasks_run_on(make_dispatcher):
    d = make_dispatcher()

    async def main():
        await d.asubmit("c", lambda sc: None)
        with pytest.raises(RuntimeError, match="event loop"):
            d.drain(timeout=1)
        with pytest.raises(RuntimeError, match="event loop"):
            d.shutdown(timeout=1)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, d.shutdown, 5)

    assert asyncio.run(main()) is True


# ----------------------------------- no silent success for thread tasks

def test_submit_of_a_coroutine_task_fails_saying_to_use_asubmit(make_dispatcher):
    d = make_dispatcher()

    async def send(sc):
        return "never awaited"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fut = d.submit("c", send)
        exc = fut.exception(timeout=5)
        gc.collect()
    assert isinstance(exc, TypeError) and "asubmit" in str(exc)
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]
    fut = d.submit("c", lambda sc: asyncio.sleep(0))
    assert isinstance(fut.exception(timeout=5), TypeError)
    assert d.drain(timeout=5)
    assert d.stats().failed == 2


def test_post_of_a_coroutine_task_is_reported_as_failed(make_dispatcher, caplog):
    d = make_dispatcher()

    async def send(sc):
        return None

    d.post("c", send)
    assert d.drain(timeout=5)
    assert d.stats().failed == 1
    assert "asubmit" in caplog.text


# -------------------------------------------------------- the accounting

def test_a_finished_task_leaves_no_reference_cycle(make_dispatcher):
    # A task's own context holds the task (what re-entrant sends look up):
    # kept on the task past its end, that made a cycle per task, which only
    # the cyclic garbage collector frees (a quarter of asubmit's CPU with
    # 10,000 tasks in flight).  Tasks that succeed, at once or after a
    # retry, coroutine and thread tasks.  (Not a task whose plain function
    # raises: in the pure-Python core the exception's traceback holds the
    # frames it passed through, as any caught exception kept in a local does.)
    d = make_dispatcher(retry=RetryPolicy(max_attempts=2, backoff=0.001))
    tries = defaultdict(int)

    async def ok(sc):
        await asyncio.sleep(0)
        return sc.chat_id

    async def retried(sc):
        tries[sc.chat_id] += 1
        if tries[sc.chat_id] % 2:
            raise RetryAfter(0.001)
        await asyncio.sleep(0)

    async def main():
        await asyncio.gather(
            *[d.asubmit(c % 7, (ok, retried)[c % 2]) for c in range(60)])
        await asyncio.gather(*[asyncio.wrap_future(d.submit(c, lambda sc: 1))
                               for c in range(10)])

    asyncio.run(main())  # a first run: imports and caches settle
    assert d.drain(timeout=5)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        asyncio.run(main())
        assert d.drain(timeout=5)
        gc.collect()
        # What a task makes (a chat queue or a context in the garbage may be
        # asyncio's own: a closed loop's handles hold both).
        left = sorted({type(o).__name__ for o in gc.garbage
                       if type(o).__name__ in ("SendContext", "_Driven")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []
    assert d.stats().completed == 2 * 70


@pytest.mark.stress
def test_random_mix_of_coroutine_and_thread_tasks_keeps_every_promise(
        make_dispatcher, tiny_switch_interval, soak_factor):
    import random
    rng = random.Random(5)
    d = make_dispatcher(max_inflight=6, queue_size=10_000, send_timeout=0.5,
                        retry=RetryPolicy(max_attempts=3, backoff=0.001, max_backoff=0.002),
                        pacing=Pacing(chat_limit=RateLimit(3, per=0.02)),
                        hooks=DispatcherHooks(on_start=lambda chat: None))
    lock = threading.Lock()
    running = set()
    overlaps = []
    log = defaultdict(list)

    def make(chat, seq, kind, fail):
        def enter(sc):
            with lock:
                if chat in running:
                    overlaps.append(chat)
                running.add(chat)
                log[chat].append(seq)

        def leave():
            with lock:
                running.discard(chat)

        if kind == "coro":
            async def coro(sc):
                enter(sc)
                try:
                    await asyncio.sleep(rng.choice([0, 0, 0.001]))
                    if fail == "retry" and sc.attempt == 1:
                        raise RetryAfter(0.001)
                    if fail == "error":
                        raise ValueError("bad")
                    return seq
                finally:
                    leave()
            return coro

        def thread_task(sc):
            enter(sc)
            try:
                if fail == "retry" and sc.attempt == 1:
                    raise ConnectionError("flaky")
                if fail == "error":
                    raise ValueError("bad")
                return seq
            finally:
                leave()
        return thread_task

    async def main():
        futs = []
        for seq in range(300 * soak_factor):
            chat = rng.randrange(12)
            kind = rng.choice(["coro", "coro", "thread"])
            fail = rng.choice([None, None, None, "retry", "error"])
            task = make(chat, seq, kind, fail)
            if kind == "coro":
                fut = asyncio.ensure_future(d.asubmit(chat, task))
                await asyncio.sleep(0)   # queued now, in order with the thread tasks
                if rng.random() < 0.03:
                    fut.cancel()
            else:
                fut = asyncio.wrap_future(d.submit(chat, task))
            futs.append(fut)
        return await asyncio.gather(*futs, return_exceptions=True)

    asyncio.run(main())
    assert d.drain(timeout=60)
    assert not overlaps
    for chat, seqs in log.items():
        assert seqs == sorted(seqs), chat
    s = d.stats()
    assert s.submitted == s.completed + s.failed + s.cancelled + s.discarded + s.timed_out
    assert s.inflight == 0 and d.active_chats == 0


def _unused():  # keep sys imported for debugging sessions
    return sys


# ------------------------------------------- each caller's context, cancels

def test_each_task_runs_in_its_own_callers_context(make_dispatcher):
    # Two handlers with different context values send to one chat: the run
    # of the chat is started by the first, yet the second's task sees the
    # second's values (its call and its awaitable), never the first's.
    import contextvars
    request_id = contextvars.ContextVar("request_id", default="none")
    d = make_dispatcher()
    seen = []

    async def send(sc, label):
        seen.append((label, "awaitable", request_id.get()))
        await asyncio.sleep(0.01)
        seen.append((label, "after await", request_id.get()))

    def task(label):
        def call(sc):
            seen.append((label, "call", request_id.get()))
            return send(sc, label)
        return call

    async def handler(label):
        request_id.set(label)
        await d.asubmit("chat", task(label))

    async def main():
        await asyncio.gather(*(handler("req-%d" % i) for i in range(4)))

    asyncio.run(main())
    assert len(seen) == 12
    assert all(label == value for label, _, value in seen), seen


def test_a_task_changing_its_context_does_not_leak_into_the_next(make_dispatcher):
    import contextvars
    var = contextvars.ContextVar("var", default="unset")
    d = make_dispatcher()
    seen = []

    async def first(sc):
        var.set("set by the first task")

    async def second(sc):
        seen.append(var.get())

    async def main():
        await asyncio.gather(d.asubmit("c", first), d.asubmit("c", second))
        seen.append(var.get())

    asyncio.run(main())
    assert seen == ["unset", "unset"]


@pytest.mark.parametrize("first_attempt", ["raises at the call", "raises in the awaitable"])
def test_cancelling_the_caller_after_a_retry_cancels_the_running_attempt(
        make_dispatcher, first_attempt):
    d = make_dispatcher(retry=RetryPolicy())
    seen = []

    async def slow(sc):
        seen.append(("attempt", sc.attempt))
        if sc.attempt == 1:
            raise RetryAfter(0.01)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append(("cancelled", sc.attempt))
            raise

    def task(sc):
        if sc.attempt == 1 and first_attempt == "raises at the call":
            seen.append(("attempt", 1))
            raise RetryAfter(0.01)
        return slow(sc)

    async def main():
        call = asyncio.ensure_future(d.asubmit("c", task))
        while ("attempt", 2) not in seen:
            await asyncio.sleep(0.005)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # The chat goes on at once (not after the 30 s the attempt would take).
        return await asyncio.wait_for(d.asubmit("c", lambda sc: "next"), 10)

    assert asyncio.run(main()) == "next"
    assert ("cancelled", 2) in seen
    assert d.drain(timeout=5)
    s = d.stats()
    assert s.cancelled == 1 and s.retried == 1


# ------------------------------------------------------------- ashutdown

def test_ashutdown_drains_on_the_loop_its_coroutine_tasks_need(make_dispatcher, caplog):
    d = make_dispatcher(max_inflight=8)
    sent = []
    ticks = []
    before = []

    async def main():
        async def send(sc):
            await asyncio.sleep(0.005)
            sent.append(sc.chat_id)

        async def ticker():
            while True:
                ticks.append(1)
                await asyncio.sleep(0.001)

        tick = asyncio.ensure_future(ticker())
        calls = [asyncio.ensure_future(d.asubmit(i % 5, send)) for i in range(100)]
        for i in range(20):
            d.post(i % 3, lambda sc: sent.append("thread"))
        await asyncio.sleep(0)
        before.append(d.stats().completed)
        with caplog.at_level("INFO", logger="fastdispatch"):
            done = await d.ashutdown(10)
        tick.cancel()
        await asyncio.gather(*calls)
        return done

    assert asyncio.run(main()) is True
    assert len(sent) == 120 and ticks   # the loop kept running meanwhile
    s = d.stats()
    assert s.completed == 120 and s.threads == 0 and d.closed
    # Sent since it began: every coroutine task (none can end before the
    # loop turns again), and the thread tasks the workers had not ended by
    # then (any number of them: they run on their own threads meanwhile).
    said = [re.search(r"ashutdown: (\d+) task\(s\) sent and 0 failed", r.getMessage())
            for r in caplog.records]
    counts = [int(m.group(1)) for m in said if m]
    assert len(counts) == 1 and 100 <= counts[0] <= 120 - before[0]
    with pytest.raises(DispatcherClosed):
        d.post(1, lambda sc: None)


def test_ashutdown_says_what_was_left_when_its_timeout_passes(make_dispatcher, caplog):
    d = make_dispatcher()
    release = []

    async def main():
        gate = asyncio.Event()
        release.append(gate)

        async def stuck(sc):
            await gate.wait()

        calls = [asyncio.ensure_future(d.asubmit("c", stuck)) for _ in range(3)]
        await asyncio.sleep(0.01)
        with caplog.at_level("INFO", logger="fastdispatch"):
            done = await d.ashutdown(0.05)
        gate.set()
        await asyncio.gather(*calls)
        return done

    assert asyncio.run(main()) is False
    warnings_ = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("3 task(s) not done (1 running, in 1 chat(s))" in m for m in warnings_), warnings_
    assert d.shutdown(5)


def test_ashutdown_refuses_to_wait_for_itself(make_dispatcher):
    d = make_dispatcher()

    async def main():
        async def task(sc):
            with pytest.raises(RuntimeError, match="wait for itself"):
                await d.ashutdown(1)
            return "ok"
        return await d.asubmit("c", task)

    assert asyncio.run(main()) == "ok"
    assert not d.closed
