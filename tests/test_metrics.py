"""Prometheus metrics (fastdispatch.metrics): every family, scraped over real HTTP.

Each test builds a dispatcher of the core under test (``make_dispatcher``)
with ``PrometheusMetrics`` hooks, runs real tasks, then fetches the
exposition from a real ``prometheus_client`` HTTP server on 127.0.0.1 (port
chosen by the OS) and checks it against ``d.stats()``.
"""

import gc
import threading
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from fastdispatch import (
    DispatcherClosed,
    DispatcherHooks,
    Pacing,
    QueueFull,
    RateLimit,
    RetryAfter,
    RetryPolicy,
    TaskDiscarded,
)
from fastdispatch.metrics import (
    LATENCY_BUCKETS,
    OUTCOMES,
    PrometheusMetrics,
    serve,
)


class Panic(BaseException):
    """A task that raises this panics (G7 in docs/guarantees.md)."""


@pytest.fixture
def metrics():
    """A PrometheusMetrics in its own registry, and a function that scrapes
    that registry over HTTP: ``scrape() -> {(name, labels): value}``."""
    registry = CollectorRegistry()
    m = PrometheusMetrics(registry)
    server = serve(0, registry)

    def scrape():
        with urllib.request.urlopen(server.url, timeout=10) as response:
            assert response.status == 200
            text = response.read().decode("utf-8")
        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                assert key not in samples, "duplicate sample %r" % (key,)
                samples[key] = s.value
        return samples

    m.scrape = scrape
    yield m
    server.stop()


def value(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]


class Gate:
    """Tasks that block until ``open()``; ``started`` counts how many began."""

    def __init__(self):
        self._open = threading.Event()
        self._started = threading.Semaphore(0)

    def task(self, sc):
        self._started.release()
        assert self._open.wait(10)
        return "gate"

    def wait_started(self, n=1):
        for _ in range(n):
            assert self._started.acquire(timeout=10)

    def open(self):
        self._open.set()


def panics(sc):
    raise Panic("task panicked")


def fails_once(exc):
    """A task that raises ``exc`` on its first attempt and succeeds after."""
    def task(sc):
        if sc.attempt == 1:
            raise exc
        return "ok after %d" % sc.attempt
    return task


def check_families_against_stats(samples, stats, name="replies"):
    for outcome in OUTCOMES:
        assert value(samples, "fastdispatch_tasks_total",
                     dispatcher=name, outcome=outcome) == stats[outcome], outcome
    assert value(samples, "fastdispatch_paced_total", dispatcher=name) == stats.paced
    assert (value(samples, "fastdispatch_rejected_total", dispatcher=name, reason="queue_full")
            + value(samples, "fastdispatch_rejected_total", dispatcher=name, reason="closed")
            ) == stats.rejected
    assert (value(samples, "fastdispatch_retries_total", dispatcher=name, cause="retry_after")
            + value(samples, "fastdispatch_retries_total", dispatcher=name, cause="error")
            ) == stats.retried
    for gauge, field in (("fastdispatch_inflight", "inflight"),
                         ("fastdispatch_active_chats", "active_chats"),
                         ("fastdispatch_threads", "threads"),
                         ("fastdispatch_parked_chats", "parked")):
        assert value(samples, gauge, dispatcher=name) == stats[field], gauge


def check_histogram(samples, family, name, count):
    les = [floatToGoString(b) for b in LATENCY_BUCKETS] + ["+Inf"]
    buckets = [value(samples, family + "_bucket", dispatcher=name, le=le) for le in les]
    assert buckets == sorted(buckets), "cumulative buckets must not decrease"
    assert buckets[-1] == value(samples, family + "_count", dispatcher=name) == count
    return buckets


# --------------------------------------------------------------- the scrape


def test_scraped_exposition_matches_stats_after_a_mixed_run(make_dispatcher, metrics):
    recovered = []
    d = make_dispatcher(
        max_inflight=4, queue_size=3, send_timeout=0.3, recover=recovered.append,
        hooks=metrics.hooks("replies"),
        retry=RetryPolicy(max_attempts=3, backoff=0.01, max_backoff=0.02,
                          retry_on=(ConnectionError,)))
    metrics.track(d, "replies")

    ok = [d.submit("chat-%d" % i, lambda sc: "sent") for i in range(5)]
    failed = [d.submit("bad-%d" % i, lambda sc: 1 / 0) for i in range(2)]
    timed_out = d.submit("slow", lambda sc: time.sleep(0.6))
    retried_429 = d.submit("limited", fails_once(RetryAfter(0.01)))
    retried_error = d.submit("flaky", fails_once(ConnectionError("reset")))

    # queue_full: chat "busy" runs a gate task and holds queue_size waiting.
    gate = Gate()
    d.submit("busy", gate.task)
    gate.wait_started()
    waiting = [d.submit("busy", lambda sc: "sent") for _ in range(3)]
    with pytest.raises(QueueFull):
        d.submit("busy", lambda sc: "never")
    # cancelled: a waiting task whose caller gives up on it.
    cancel_gate = Gate()
    d.submit("cancel", cancel_gate.task)
    cancel_gate.wait_started()
    doomed = d.submit("cancel", lambda sc: "never")
    assert doomed.cancel()
    # a panic: its own Future fails, the two tasks behind it are discarded.
    panic_gate = Gate()
    d.submit("panic", panic_gate.task)
    panic_gate.wait_started()
    d.submit("panic", panics)
    behind = [d.submit("panic", lambda sc: "never") for _ in range(2)]

    for g in (gate, cancel_gate, panic_gate):
        g.open()
    assert d.drain(timeout=10)
    d.close()
    with pytest.raises(DispatcherClosed):
        d.submit("late", lambda sc: "never")

    assert [f.result() for f in ok + waiting] == ["sent"] * 8
    assert all(isinstance(f.exception(), ZeroDivisionError) for f in failed)
    assert isinstance(timed_out.exception(), TimeoutError)
    assert retried_429.result() == "ok after 2"
    assert retried_error.result() == "ok after 2"
    assert doomed.cancelled()
    assert all(isinstance(f.exception(), TaskDiscarded) for f in behind)

    samples = metrics.scrape()
    stats = d.stats()
    assert (stats.completed, stats.failed, stats.timed_out, stats.cancelled,
            stats.discarded, stats.rejected, stats.retried) == (13, 3, 1, 1, 2, 2, 2)
    check_families_against_stats(samples, stats)
    assert value(samples, "fastdispatch_rejected_total",
                 dispatcher="replies", reason="queue_full") == 1
    assert value(samples, "fastdispatch_rejected_total",
                 dispatcher="replies", reason="closed") == 1
    assert value(samples, "fastdispatch_retries_total",
                 dispatcher="replies", cause="retry_after") == 1
    assert value(samples, "fastdispatch_retries_total",
                 dispatcher="replies", cause="error") == 1
    # The histograms hold one observation per task that started.
    started = stats.completed + stats.failed + stats.timed_out
    check_histogram(samples, "fastdispatch_queue_latency_seconds", "replies", started)
    run = check_histogram(samples, "fastdispatch_run_latency_seconds", "replies", started)
    # The timed-out task ran for its whole send_timeout (0.3 s): above 0.25.
    assert run[LATENCY_BUCKETS.index(0.25)] <= started - 1
    assert value(samples, "fastdispatch_run_latency_seconds_sum", dispatcher="replies") >= 0.3


def test_paced_starts_and_parked_chats_are_exposed(make_dispatcher, metrics):
    d = make_dispatcher(max_inflight=4, hooks=metrics.hooks("paced"),
                        pacing=Pacing(chat_limit=RateLimit(1, per=0.5)))
    metrics.track(d, "paced")
    futures = [d.submit("chat", lambda sc: "sent") for _ in range(3)]
    assert futures[0].result(timeout=5) == "sent"
    # The second and third starts each wait ~0.5 s: the chat is parked meanwhile.
    parked_seen = False
    while not futures[-1].done() and not parked_seen:
        samples = metrics.scrape()
        parked_seen = value(samples, "fastdispatch_parked_chats", dispatcher="paced") == 1
    assert parked_seen
    assert [f.result(timeout=5) for f in futures] == ["sent"] * 3
    assert d.drain(timeout=5)
    samples = metrics.scrape()
    stats = d.stats()
    assert stats.paced >= 2
    check_families_against_stats(samples, stats, "paced")


def test_gauges_are_read_from_stats_at_scrape_time(make_dispatcher, metrics):
    d = make_dispatcher(max_inflight=3, hooks=metrics.hooks("live"))
    metrics.track(d, "live", max_inflight=3)
    with pytest.raises(ValueError, match="max_inflight"):
        metrics.track(make_dispatcher(), "other", max_inflight=0)
    gate = Gate()
    for chat in range(3):
        d.submit(chat, gate.task)
        d.submit(chat, lambda sc: "after")
    d.submit("waiting-for-a-worker", lambda sc: "queued")
    gate.wait_started(3)
    samples = metrics.scrape()
    assert value(samples, "fastdispatch_inflight", dispatcher="live") == 3
    assert value(samples, "fastdispatch_active_chats", dispatcher="live") == 4
    assert value(samples, "fastdispatch_threads", dispatcher="live") == 3
    assert value(samples, "fastdispatch_max_inflight", dispatcher="live") == 3
    gate.open()
    assert d.drain(timeout=10)
    samples = metrics.scrape()
    assert value(samples, "fastdispatch_inflight", dispatcher="live") == 0
    assert value(samples, "fastdispatch_active_chats", dispatcher="live") == 0
    check_families_against_stats(samples, d.stats(), "live")


def test_no_family_has_a_chat_label(make_dispatcher, metrics):
    d = make_dispatcher(hooks=metrics.hooks("replies"))
    metrics.track(d, "replies")
    d.submit("one chat", lambda sc: None).result(timeout=5)
    assert d.drain(timeout=5)
    few = metrics.scrape()
    for chat in range(300):
        d.post(chat, lambda sc: None)
    assert d.drain(timeout=10)
    many = metrics.scrape()
    # The number of series does not grow with the number of chats.
    assert set(few) == set(many)
    labels = {name for _, pairs in many for name, _ in pairs}
    assert labels == {"dispatcher", "outcome", "reason", "cause", "le"}
    assert value(many, "fastdispatch_tasks_total",
                 dispatcher="replies", outcome="completed") == 301


def test_every_series_exists_at_zero_before_any_task(make_dispatcher, metrics):
    d = make_dispatcher(hooks=metrics.hooks("fresh"))
    metrics.track(d, "fresh")
    samples = metrics.scrape()
    check_families_against_stats(samples, d.stats(), "fresh")
    check_histogram(samples, "fastdispatch_queue_latency_seconds", "fresh", 0)
    check_histogram(samples, "fastdispatch_run_latency_seconds", "fresh", 0)


# -------------------------------------------------------- hook composition


def test_user_hooks_still_run_with_the_same_arguments(make_dispatcher, metrics):
    calls = []
    user = DispatcherHooks(
        on_queued=lambda chat, n: calls.append(("queued", chat, n)),
        on_start=lambda chat: calls.append(("start", chat)),
        on_done=lambda info: calls.append(("done", info.chat_id, info.error)),
        on_rejected=lambda chat, exc: calls.append(("rejected", chat, type(exc))),
        on_retry=lambda chat, attempt, delay, exc: calls.append(
            ("retry", chat, attempt, type(exc))),
    )
    d = make_dispatcher(queue_size=1, hooks=metrics.hooks("replies", compose=user))
    metrics.track(d, "replies")
    gate = Gate()
    d.submit("a", gate.task)
    gate.wait_started()
    d.submit("a", fails_once(RetryAfter(0.01)))
    with pytest.raises(QueueFull):
        d.submit("a", lambda sc: None)
    gate.open()
    assert d.drain(timeout=10)
    assert ("queued", "a", 1) in calls
    assert calls.count(("start", "a")) == 3     # the gate, then two attempts
    assert ("rejected", "a", QueueFull) in calls
    assert ("retry", "a", 1, RetryAfter) in calls
    assert calls.count(("done", "a", None)) == 2
    samples = metrics.scrape()
    check_families_against_stats(samples, d.stats())
    check_histogram(samples, "fastdispatch_run_latency_seconds", "replies", 2)


@pytest.mark.parametrize("raised", [ValueError("hook bug"), Panic("hook panic")],
                         ids=["Exception", "BaseException"])
def test_a_raising_user_hook_goes_to_recover_and_metrics_still_count(
        make_dispatcher, metrics, raised, caplog):
    recovered = []

    def boom(*args):
        raise raised

    # on_queued and on_rejected run in the submitting thread, where only an
    # Exception is caught (a BaseException there is the caller's own); the
    # other hooks run in the dispatcher's threads and must survive anything.
    in_caller = boom if isinstance(raised, Exception) else None
    user = DispatcherHooks(on_queued=in_caller, on_rejected=in_caller,
                           on_start=boom, on_done=boom, on_retry=boom)
    d = make_dispatcher(queue_size=1, recover=recovered.append,
                        hooks=metrics.hooks("replies", compose=user))
    metrics.track(d, "replies")
    gate = Gate()
    d.submit("a", gate.task)
    gate.wait_started()
    retried = d.submit("a", fails_once(RetryAfter(0.01)))
    with pytest.raises(QueueFull):
        d.submit("a", lambda sc: None)
    gate.open()
    assert retried.result(timeout=10) == "ok after 2"
    futures = [d.submit(chat, lambda sc: "sent") for chat in range(20)]
    assert [f.result(timeout=10) for f in futures] == ["sent"] * 20
    assert d.drain(timeout=10)
    assert recovered and all(exc is raised for exc in recovered)
    assert "dispatcher hook" in caplog.text
    stats = d.stats()
    assert stats.completed == 22
    samples = metrics.scrape()
    check_families_against_stats(samples, stats)
    check_histogram(samples, "fastdispatch_queue_latency_seconds", "replies", 22)


def test_bad_arguments_raise_naming_the_argument(metrics):
    with pytest.raises(TypeError, match="compose"):
        metrics.hooks("replies", compose={"on_done": print})
    with pytest.raises(TypeError, match="name"):
        metrics.hooks(42)
    with pytest.raises(ValueError, match="name"):
        metrics.hooks("")
    with pytest.raises(TypeError, match="dispatcher"):
        metrics.track(object(), "replies")
    with pytest.raises(ValueError, match="buckets"):
        PrometheusMetrics(None, buckets=(1.0, 0.5))
    registry = CollectorRegistry()
    PrometheusMetrics(registry)
    with pytest.raises(ValueError, match="fastdispatch_"):   # same names twice in one registry
        PrometheusMetrics(registry)
    with pytest.raises(ValueError, match="port"):
        serve(-1)
    with pytest.raises(TypeError, match="registry"):
        serve(0, object())


# ------------------------------------------- dispatchers and threads coming and going


def test_counts_of_ended_worker_threads_are_kept(make_dispatcher, metrics):
    d = make_dispatcher(max_inflight=4, idle_timeout=0.05, hooks=metrics.hooks("churn"))
    metrics.track(d, "churn")
    for _ in range(3):
        futures = [d.submit(chat, lambda sc: time.sleep(0.001)) for chat in range(40)]
        for f in futures:
            f.result(timeout=10)
        deadline = time.monotonic() + 5
        while d.stats().threads and time.monotonic() < deadline:
            time.sleep(0.02)
        assert d.stats().threads == 0   # every worker exited
    series = metrics._series["churn"]
    deadline = time.monotonic() + 5
    while series._live and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.02)
    assert not series._live, "an ended thread's cell was not folded"
    samples = metrics.scrape()
    check_histogram(samples, "fastdispatch_run_latency_seconds", "churn", 120)
    check_families_against_stats(samples, d.stats(), "churn")


def test_dispatchers_sharing_a_name_add_up_and_untrack_keeps_counters(
        make_dispatcher, metrics):
    hooks = metrics.hooks("shared")
    d1 = make_dispatcher(hooks=hooks)
    d2 = make_dispatcher(hooks=hooks)
    metrics.track(d1, "shared")
    metrics.track(d2, "shared")
    metrics.track(d2, "shared")    # again, same name: nothing changes
    with pytest.raises(ValueError, match="already tracked"):
        metrics.track(d2, "other")
    for d in (d1, d2):
        [d.submit(c, lambda sc: None) for c in range(5)][-1].result(timeout=5)
        assert d.drain(timeout=5)
    samples = metrics.scrape()
    assert value(samples, "fastdispatch_tasks_total",
                 dispatcher="shared", outcome="completed") == 10
    metrics.untrack(d1)
    with pytest.raises(ValueError, match="not tracked"):
        metrics.untrack(d1)
    d1.submit("after", lambda sc: None).result(timeout=5)   # no longer read
    samples = metrics.scrape()
    assert value(samples, "fastdispatch_tasks_total",
                 dispatcher="shared", outcome="completed") == 10
    assert value(samples, "fastdispatch_threads", dispatcher="shared") == d2.stats().threads


def test_hooks_without_track_expose_no_made_up_counters(make_dispatcher, metrics):
    d = make_dispatcher(hooks=metrics.hooks("untracked"))
    d.submit("a", lambda sc: None).result(timeout=5)
    assert d.drain(timeout=5)
    samples = metrics.scrape()
    names = {name for (name, labels) in samples if ("dispatcher", "untracked") in labels}
    assert "fastdispatch_tasks_total" not in names
    assert "fastdispatch_inflight" not in names
    check_histogram(samples, "fastdispatch_run_latency_seconds", "untracked", 1)


def test_scrapes_during_a_run_never_go_backwards(make_dispatcher, metrics):
    d = make_dispatcher(max_inflight=4, hooks=metrics.hooks("busy"))
    metrics.track(d, "busy")
    stop = threading.Event()
    scraping = threading.Event()
    scrapes = []

    def scraper():
        while not stop.is_set():
            scrapes.append(metrics.scrape())
            scraping.set()

    thread = threading.Thread(target=scraper)
    thread.start()
    try:
        assert scraping.wait(10)
        for round_ in range(20):
            for chat in range(50):
                d.post(chat, lambda sc: time.sleep(0.001))
        assert d.drain(timeout=20)
    finally:
        stop.set()
        thread.join(10)
    scrapes.append(metrics.scrape())
    assert len(scrapes) >= 3
    monotonic_names = ("fastdispatch_tasks_total", "fastdispatch_queue_latency_seconds_bucket",
                       "fastdispatch_run_latency_seconds_count")
    for before, after in zip(scrapes, scrapes[1:]):
        for key, v in before.items():
            if key[0] in monotonic_names:
                assert after[key] >= v, key
    check_histogram(scrapes[-1], "fastdispatch_run_latency_seconds", "busy", 1000)


def test_a_collector_serves_itself_and_a_traced_dispatcher_can_be_tracked(make_dispatcher):
    from fastdispatch.metrics import TracedDispatcher

    m = PrometheusMetrics(None)      # in no registry: served on its own
    d = TracedDispatcher(make_dispatcher(hooks=m.hooks("traced")))
    m.track(d, "traced")
    d.submit("a", lambda sc: "sent").result(timeout=5)
    assert d.drain(timeout=5)
    with m.serve(0) as server:
        with urllib.request.urlopen(server.url, timeout=10) as response:
            text = response.read().decode("utf-8")
    assert 'fastdispatch_tasks_total{dispatcher="traced",outcome="completed"} 1.0' in text
    assert 'fastdispatch_run_latency_seconds_count{dispatcher="traced"} 1.0' in text


def test_serve_answers_until_stopped(metrics):
    registry = CollectorRegistry()
    PrometheusMetrics(registry).hooks("x")
    server = serve(0, registry)
    assert server.addr == "127.0.0.1" and server.port > 0
    with urllib.request.urlopen(server.url, timeout=10) as response:
        assert b"fastdispatch_queue_latency_seconds_count" in response.read()
    server.stop()
    server.stop()   # idempotent
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url, timeout=2)


def test_dashboard_and_docs_name_only_exported_families(make_dispatcher, metrics):
    """docs/observability.md and docs/grafana-dashboard.json must not drift
    from the metric names (they are API)."""
    import json
    import pathlib
    import re

    docs = pathlib.Path(__file__).resolve().parent.parent / "docs"
    if not (docs / "grafana-dashboard.json").exists():
        pytest.skip("docs/ is not beside tests/ (an installed-wheel run)")
    d = make_dispatcher(hooks=metrics.hooks("replies"))
    metrics.track(d, "replies", max_inflight=512)
    exported = {name for name, _ in metrics.scrape()}
    exported |= {re.sub(r"_(bucket|count|sum)$", "", name) for name in exported}
    dashboard = json.loads((docs / "grafana-dashboard.json").read_text("utf-8"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    text = (docs / "observability.md").read_text("utf-8") + "\n".join(exprs)
    named = set(re.findall(r"\bfastdispatch_[a-z_]+", text))
    assert named and named <= exported, sorted(named - exported)
    assert {"fastdispatch_tasks_total", "fastdispatch_queue_latency_seconds_bucket",
            "fastdispatch_parked_chats", "fastdispatch_max_inflight"} <= named


def test_latency_histogram_counts_every_started_task_on_both_cores(make_dispatcher):
    """The compiled core fills a LatencyHistogram from C; the twin calls it as a hook.

    Either way each task that started is counted once in both histograms, a
    task cancelled before it started is not, and the sums are the latencies.
    """
    ringbuf = pytest.importorskip("fastdispatch._ringbuf")
    from fastdispatch import DispatcherHooks
    hist = ringbuf.LatencyHistogram([0.001, 0.01, 0.05, 1.0])
    d = make_dispatcher(max_inflight=2, hooks=DispatcherHooks(on_done=hist))
    gate = threading.Event()
    d.submit("held", lambda sc: gate.wait(5))
    blocked = d.submit("held", lambda sc: None)
    cancelled = d.submit("held", lambda sc: None)
    assert cancelled.cancel()
    futs = [d.submit(i, lambda sc: time.sleep(0.02)) for i in range(6)]
    for f in futs:
        f.result(timeout=5)
    gate.set()
    blocked.result(timeout=5)
    assert d.drain(timeout=5)
    values = hist.snapshot()
    width = len(hist.bounds) + 1
    queue, run, queue_sum, run_sum = (values[:width], values[width:2 * width],
                                      values[-2], values[-1])
    assert sum(queue) == sum(run) == 8          # 6 sleepers, the gate, the one behind it
    assert sum(run[2:]) >= 6                    # 20 ms sends: above 0.01 s, however slow
    assert 6 * 0.02 <= run_sum < 10.0
    assert queue_sum >= 0.0
    with pytest.raises(ValueError):
        ringbuf.LatencyHistogram([])
