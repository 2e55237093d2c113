"""docs/guarantees.md G6 and G11: threads on demand, idle exit, close/drain/shutdown/force_close."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from fastdispatch import Cancelled, DispatcherClosed, SendTimeout

from helpers import wait_until


def _our_threads():
    return [t for t in threading.enumerate() if t.name.startswith("fastdispatch-")]


def test_threads_are_created_on_demand_and_capped(make_dispatcher):
    d = make_dispatcher(max_inflight=3)
    assert d.stats().threads == 0
    gates = [threading.Event() for _ in range(6)]
    futs = [d.submit(i, lambda sc, g=g: g.wait(10)) for i, g in enumerate(gates)]
    assert wait_until(lambda: d.inflight == 3)
    assert d.stats().threads == 3
    for g in gates:
        g.set()
    for f in futs:
        assert f.result(10) is True
    assert d.stats().threads <= 3


def test_a_chat_waiting_for_a_worker_holds_no_thread(make_dispatcher):
    d = make_dispatcher(max_inflight=1)
    gate = threading.Event()
    d.submit("busy", lambda sc: gate.wait(10))
    waiting = [d.submit("chat-%d" % i, lambda sc: threading.current_thread().name)
               for i in range(50)]
    assert wait_until(lambda: d.inflight == 1)
    assert d.stats().threads == 1 and d.active_chats == 51
    gate.set()
    names = {f.result(10) for f in waiting}
    assert len(names) == 1


def test_idle_workers_exit_after_idle_timeout(make_dispatcher):
    d = make_dispatcher(max_inflight=4, idle_timeout=0.2)
    gates = [threading.Event() for _ in range(4)]
    futs = [d.submit(i, lambda sc, g=g: g.wait(10)) for i, g in enumerate(gates)]
    assert wait_until(lambda: d.stats().threads == 4)
    for g in gates:
        g.set()
    for f in futs:
        f.result(10)
    assert wait_until(lambda: d.stats().threads == 0, timeout=5)
    # and new work brings a worker back
    assert d.submit("again", lambda sc: "ok").result(10) == "ok"


def test_close_rejects_new_work_but_finishes_queued_work(make_dispatcher):
    d = make_dispatcher()
    gate = threading.Event()
    first = d.submit("c", lambda sc: gate.wait(10))
    queued = d.submit("c", lambda sc: "queued")
    d.close()
    with pytest.raises(DispatcherClosed):
        d.submit("c", lambda sc: None)
    gate.set()
    assert first.result(10) is True and queued.result(10) == "queued"


def test_drain_waits_for_all_work_and_keeps_accepting(make_dispatcher):
    d = make_dispatcher()
    futs = [d.submit(i % 7, lambda sc: time.sleep(0.001)) for i in range(100)]
    assert d.drain(timeout=10)
    assert all(f.done() for f in futs) and d.active_chats == 0
    assert d.submit("c", lambda sc: "still open").result(5) == "still open"


def test_drain_returns_false_on_timeout(make_dispatcher):
    d = make_dispatcher()
    gate = threading.Event()
    d.submit("c", lambda sc: gate.wait(10))
    t0 = time.monotonic()
    assert d.drain(timeout=0.2) is False
    assert time.monotonic() - t0 < 2
    assert d.drain(timeout=0) is False       # 0: look without waiting
    gate.set()
    assert d.drain(timeout=10)
    assert d.drain(timeout=0) is True
    with pytest.raises(ValueError, match="timeout"):
        d.drain(timeout=-1)


def test_shutdown_finishes_work_and_leaves_no_thread(impl):
    d = impl.OutboundDispatcher(max_inflight=8, send_timeout=5)
    names = set()
    lock = threading.Lock()

    def task(sc):
        with lock:
            names.add(threading.current_thread())
        time.sleep(0.001)

    futs = [d.submit(i % 20, task) for i in range(200)]
    assert d.shutdown(timeout=20) is True
    assert all(f.done() and f.exception() is None for f in futs)
    assert d.closed and d.stats().threads == 0
    assert not any(t.is_alive() for t in names)
    assert d._timer_thread is not None and not d._timer_thread.is_alive()


def test_shutdown_returns_false_on_timeout_and_work_goes_on(impl):
    d = impl.OutboundDispatcher()
    gate = threading.Event()
    fut = d.submit("c", lambda sc: gate.wait(10))
    assert d.shutdown(timeout=0.2) is False
    assert d.closed
    gate.set()
    assert fut.result(10) is True
    assert d.shutdown(timeout=10) is True


def test_context_manager_shuts_down(impl):
    with impl.OutboundDispatcher() as d:
        fut = d.submit("c", lambda sc: time.sleep(0.05) or "done")
    assert fut.result(0) == "done"
    assert d.closed and d.stats().threads == 0


def test_shutdown_from_inside_a_task_is_refused(make_dispatcher):
    d = make_dispatcher()
    fut = d.submit("c", lambda sc: d.shutdown())
    with pytest.raises(RuntimeError, match="wait for itself"):
        fut.result(5)


def test_force_close_cancels_running_and_waiting_and_leaves_no_future_pending(impl):
    d = impl.OutboundDispatcher(max_inflight=2, send_timeout=None)
    release = threading.Event()
    started = threading.Barrier(3, timeout=10)
    seen_cancel = []

    def running(sc):
        started.wait()
        seen_cancel.append(sc.wait(10))   # wakes when force_close cancels it
        release.wait(10)
        return "late"

    runners = [d.submit(chat, running) for chat in ("a", "b")]
    waiters = [d.submit(chat, lambda sc: "never") for chat in ("a", "b", "c", "d")
               for _ in range(3)]
    started.wait()
    t0 = time.monotonic()
    d.force_close()
    assert time.monotonic() - t0 < 1.0           # returns at once
    assert d.closed
    with pytest.raises(DispatcherClosed):
        d.submit("a", lambda sc: None)
    for f in runners:
        with pytest.raises(Cancelled):
            f.result(5)
    for f in waiters:
        assert f.cancelled()
    release.set()
    assert d.shutdown(timeout=10) is True
    assert seen_cancel == [True, True]
    s = d.stats()
    assert s.cancelled == 14 and s.completed == 0
    assert s.submitted == s.completed + s.failed + s.discarded + s.cancelled + s.timed_out


@pytest.mark.stress
def test_a_task_woken_by_force_close_leaves_its_future_cancelled(
        impl, tiny_switch_interval, soak_factor):
    # force_close() cancels running tasks that wake at once and return
    # while it is still settling them: each Future still ends Cancelled,
    # never with None or the task's result, however the threads interleave
    # (force_close() once read the error back from the task after waking
    # it, and found None there when its worker had just cleared it).
    for _ in range(120 * soak_factor):
        d = impl.OutboundDispatcher(max_inflight=4, send_timeout=None, idle_timeout=60)
        started = threading.Barrier(5, timeout=10)

        def task(sc):
            started.wait()
            sc.wait(10)                 # wakes at the cancel
            return "returned after its cancel"

        futures = [d.submit(chat, task) for chat in range(4)]
        started.wait()
        d.force_close()
        for f in futures:
            with pytest.raises(Cancelled):
                f.result(10)
        assert d.shutdown(timeout=10)
        s = d.stats()
        assert s.cancelled == 4 and s.completed == 0


@pytest.mark.stress
def test_a_task_ending_at_its_deadline_has_one_outcome(impl, tiny_switch_interval, soak_factor):
    # A task that returns just as the deadline passes races the timer: its
    # Future ends with SendTimeout or with its result, whichever claimed it
    # first, never with None (the timer once read the error back from the
    # task, which its worker may just have cleared).
    timeout = 0.02
    for n in range(60 * soak_factor):
        d = impl.OutboundDispatcher(max_inflight=4, send_timeout=timeout, idle_timeout=60)
        futures = [d.submit(chat, lambda sc, k=k: (time.sleep(timeout * (0.9 + 0.05 * k)), "ran")[1])
                   for k, chat in enumerate(range(4))]
        outcomes = []
        for f in futures:
            try:
                outcomes.append(f.result(10))
            except SendTimeout:
                outcomes.append("timed out")
        assert set(outcomes) <= {"ran", "timed out"}, outcomes
        assert d.shutdown(timeout=10)
        s = d.stats()
        assert s.completed == outcomes.count("ran") and s.timed_out == outcomes.count("timed out")


def test_process_exits_without_shutdown(impl):
    script = textwrap.dedent("""
        import threading, time
        import fastdispatch
        from fastdispatch import OutboundDispatcher
        assert fastdispatch.IMPLEMENTATION == "<core>"
        d = OutboundDispatcher(idle_timeout=60)
        futs = [d.submit(i % 10, lambda sc: time.sleep(0.01)) for i in range(50)]
        for f in futs:
            f.result(10)
        d.submit("slow", lambda sc: time.sleep(0.2))
        print("done", flush=True)
    """).replace("<core>", impl.name)
    env = dict(os.environ, FASTDISPATCH_NO_EXTENSIONS="1" if impl.name == "python" else "0")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          text=True, timeout=30, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
    assert time.monotonic() - t0 < 15   # idle workers (60 s) did not hold it open


def test_nothing_is_retained_once_many_chats_have_drained(make_dispatcher):
    import gc
    import tracemalloc

    d = make_dispatcher(max_inflight=1, send_timeout=None)
    d.post("warm-up", lambda sc: None)
    assert d.drain(10)
    gc.collect()
    gate = threading.Event()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        d.post("blocker", lambda sc: gate.wait(120))  # the only worker waits:
        for chat in range(50_000):                     # all 50k chats pile up
            d.post(chat, lambda sc: None)
        assert d.active_chats == 50_001
        gate.set()
        assert d.drain(30)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        gate.set()
        tracemalloc.stop()
    retained = sum(s.size_diff for s in after.compare_to(before, "filename"))
    # The chat map's table alone would keep ~2.5 MB if it stayed at its peak.
    assert retained < 256 * 1024, retained
    assert d.active_chats == 0
