"""Prometheus metrics and OpenTelemetry spans for a dispatcher.

A bot in production is run by dashboards and alerts: how many sends succeed
and fail, how long messages wait in their chat's queue, how many chats are
waiting out a rate limit, whether the worker cap is saturated.  The
dispatcher has the raw material (its hooks and ``stats()``); this module
turns it into metrics with fixed names, so that dashboards and alerts can be
shared (``docs/observability.md`` lists them, with PromQL and a Grafana
dashboard).

- :class:`PrometheusMetrics` (extra ``fastdispatch[prometheus]``): one
  collector for any number of dispatchers, each under a name that becomes
  the ``dispatcher`` label.  ``metrics.hooks(name, compose=user_hooks)``
  gives a dispatcher the hooks that feed the latency histograms and the
  rejection and retry counters (the user's own hooks still run);
  ``metrics.track(d, name)`` lets the collector read the task counters and
  the gauges from ``d.stats()`` at scrape time.  :func:`serve` exposes a
  registry over HTTP.
- :class:`TracedDispatcher` (extra ``fastdispatch[otel]``): wraps a
  dispatcher so that every attempt of every send runs in its own
  OpenTelemetry span, the child of the span that was current when the send
  was submitted (for ``ctx.reply``: the event's span).

Why the counters come from ``stats()`` and not from ``on_done``.  The
dispatcher already counts every outcome exactly, under its own locks (the
accounting identity of ``stats()``).  Re-deriving the outcome from
``DispatchInfo.error`` cannot be exact: a panicking task ends with
``TaskDiscarded`` yet counts as failed, a task may raise ``SendTimeout``
itself, a waiting task cancelled by its caller may report the error that
discarded it.  Reading ``stats()`` at scrape time is exact by construction
and costs nothing per task.  The same holds for the gauges: a custom
collector reads them when Prometheus asks, so no thread polls.

Why no chat-id label.  Every distinct label value is a time series that the
metrics server keeps for weeks; a bot talks to an unbounded number of chats,
so a chat label would grow the database without bound (and put user
identifiers into it).  Per-chat detail belongs in traces and logs: the spans
of :class:`TracedDispatcher` carry the chat id as an attribute.

Cost.  The hot path is ``on_done``: it runs once per task, in the worker
thread.  It adds two observations to histograms kept per thread (plain lists
of bucket counts, written only by their own thread, so no lock is taken per
task and nothing relies on the GIL); the collector adds the threads' lists
up when scraped.  A thread's counts are folded into a retired total when the
thread ends (workers come and go with ``idle_timeout``), so memory does not
grow with thread churn.  ``python -m fastdispatch bench --section metrics``
(and the suite's ``bench_metrics``) measures the cost.

Locks, and what each guards:

- ``PrometheusMetrics._lock``: the table of names, the tracked dispatchers
  and the counts folded from untracked ones.
- ``_Series._lock``: one name's live per-thread cells and its retired total
  (taken when a thread first observes, when a thread ends, and by a scrape),
  and the rejection and retry counts (rare events).
"""

import bisect
import threading
import weakref
from time import monotonic

from ._errors import Cancelled, QueueFull, RetryAfter, SendTimeout
from ._types import DispatcherHooks

try:  # ``pip install fastdispatch[prometheus]``
    from prometheus_client import REGISTRY as _DEFAULT_REGISTRY
    from prometheus_client import make_wsgi_app as _make_wsgi_app
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.utils import floatToGoString as _le_label
except ImportError:  # pragma: no cover - exercised where the extra is absent
    _DEFAULT_REGISTRY = None  # type: ignore[assignment]
    _make_wsgi_app = None  # type: ignore[assignment]

try:  # the compiled core records latencies itself, with no Python per task
    from ._ringbuf import LatencyHistogram as _LatencyHistogram
except ImportError:  # the pure-Python twin only: the hook below does it
    _LatencyHistogram = None

try:  # ``pip install fastdispatch[otel]``
    from opentelemetry import context as _otel_context
    from opentelemetry import trace as _otel_trace
except ImportError:  # pragma: no cover - exercised where otel is absent
    _otel_context = _otel_trace = None  # type: ignore[assignment]

__all__ = [
    "PrometheusMetrics",
    "MetricsServer",
    "serve",
    "TracedDispatcher",
    "LATENCY_BUCKETS",
    "OUTCOMES",
    "REJECT_REASONS",
    "RETRY_CAUSES",
]

#: Upper bounds of the latency histograms' buckets, in seconds: a send to a
#: chat API takes milliseconds, a paced or rate-limited chat waits seconds,
#: ``send_timeout`` defaults to 30 s; a minute covers them all.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Values of the ``outcome`` label of ``fastdispatch_tasks_total``.
OUTCOMES = ("completed", "failed", "discarded", "cancelled", "timed_out")
#: Values of the ``reason`` label of ``fastdispatch_rejected_total``.
REJECT_REASONS = ("queue_full", "closed")
#: Values of the ``cause`` label of ``fastdispatch_retries_total``.
RETRY_CAUSES = ("retry_after", "error")

_GAUGES = (
    ("fastdispatch_inflight", "inflight",
     "Tasks running right now (at most max_inflight)."),
    ("fastdispatch_active_chats", "active_chats",
     "Chats with waiting or running work."),
    ("fastdispatch_threads", "threads",
     "Worker threads alive (running, or idle until idle_timeout)."),
    ("fastdispatch_parked_chats", "parked",
     "Chats waiting out a rate limit or a RetryAfter before their next start."),
)
_STAT_COUNTERS = OUTCOMES + ("paced",)


def _check_name(name):
    if not isinstance(name, str):
        raise TypeError("name must be a str, got %r" % (type(name).__name__,))
    if not name:
        raise ValueError("name must not be empty")
    return name


class _Holder:
    """Lives in one thread's ``threading.local``; its death means the thread ended."""

    __slots__ = ("__weakref__",)


class _Series:
    """Everything one ``dispatcher`` label value accumulates through hooks.

    Latencies go into per-thread *cells*: a list of ``2 * (len(bounds) + 1)``
    bucket counts (queue latency, then run latency) followed by the two sums.
    A cell is written only by its own thread; readers add the cells up.
    """

    def __init__(self, bounds):
        self.bounds = bounds
        self.width = len(bounds) + 1
        self.local = threading.local()
        # A weakref callback may run in any thread, even one inside
        # snapshot(): re-entrant.
        self._lock = threading.RLock()
        self._live = {}                     # weakref to a thread's _Holder -> its cell
        self._retired = self._new_list()    # cells of threads that ended
        self.recorders = []                 # the compiled core's LatencyHistograms
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)
        self.retries = dict.fromkeys(RETRY_CAUSES, 0)

    def _new_list(self):
        return [0] * (2 * self.width) + [0.0, 0.0]

    def new_cell(self):
        """This thread's cell, created and registered on its first task."""
        cell = self._new_list()
        holder = _Holder()
        with self._lock:
            self._live[weakref.ref(holder, self._retire)] = cell
        local = self.local
        local.cell = cell
        local.holder = holder
        return cell

    def _retire(self, key):
        # The thread ended (its threading.local values were dropped): its cell
        # will not change any more; fold it into the retired total.
        with self._lock:
            cell = self._live.pop(key, None)
            if cell is not None:
                retired = self._retired
                for i, value in enumerate(cell):
                    retired[i] += value

    def snapshot(self):
        """Bucket counts and sums over every thread, live or ended."""
        with self._lock:
            total = list(self._retired)
            for cell in list(self._live.values()):
                for i, value in enumerate(list(cell)):
                    total[i] += value
            recorders = list(self.recorders)
        for recorder in recorders:
            for i, value in enumerate(recorder.snapshot()):
                total[i] += value
        return total

    def count(self, table, key):
        with self._lock:
            table[key] += 1


def _make_on_done(series):
    # With the compiled core: a LatencyHistogram, which that core recognises
    # as its on_done and fills from C (no DispatchInfo, no Python call per
    # task); any other caller (the pure-Python twin, a composed user hook)
    # calls it with the DispatchInfo like any hook.
    if _LatencyHistogram is not None:
        recorder = _LatencyHistogram(series.bounds)
        with series._lock:
            series.recorders.append(recorder)
        return recorder
    # Without it, the per-task hot path: keep it to local lookups, two
    # bisects and four list stores.  A task that never started (cancelled while waiting, or
    # discarded after a panic of its chat) has run_latency 0.0 and an error:
    # it is counted by fastdispatch_tasks_total, not in the histograms.
    local = series.local
    new_cell = series.new_cell
    bounds = series.bounds
    width = series.width
    queue_sum, run_sum = 2 * width, 2 * width + 1
    where = bisect.bisect_left   # "le": a value equal to a bound falls in it

    def on_done(info):
        _, _, queue, run, error = info
        if run == 0.0 and error is not None:
            return
        try:
            cell = local.cell
        except AttributeError:
            cell = new_cell()
        cell[where(bounds, queue)] += 1
        cell[width + where(bounds, run)] += 1
        cell[queue_sum] += queue
        cell[run_sum] += run

    return on_done


def _make_on_rejected(series):
    def on_rejected(chat_id, exc):
        series.count(series.rejected,
                      "queue_full" if isinstance(exc, QueueFull) else "closed")
    return on_rejected


def _make_on_retry(series):
    def on_retry(chat_id, attempt, delay, exc):
        series.count(series.retries,
                     "retry_after" if isinstance(exc, RetryAfter) else "error")
    return on_retry


def _chain(ours, theirs):
    """Call ``ours`` then ``theirs``; whatever ``theirs`` raises goes on to the
    dispatcher, which logs it and hands it to ``recover`` as for any hook."""
    if theirs is None:
        return ours

    def both(*args):
        try:
            ours(*args)
        finally:
            theirs(*args)

    both.__name__ = getattr(theirs, "__name__", "hook")
    both.__wrapped__ = theirs
    return both


class PrometheusMetrics:
    """Prometheus metrics for any number of dispatchers (a custom collector).

    ``PrometheusMetrics(registry=REGISTRY, *, buckets=LATENCY_BUCKETS)``
    registers itself in ``registry`` (prometheus_client's default registry
    unless told otherwise; ``None``: not registered, call
    ``registry.register(metrics)`` yourself).  Then, per dispatcher::

        d = OutboundDispatcher(hooks=metrics.hooks("replies", compose=my_hooks))
        metrics.track(d, "replies")

    ``name`` becomes the ``dispatcher`` label.  ``hooks()`` feeds the latency
    histograms and the rejection and retry counters; ``track()`` makes the
    task counters, ``fastdispatch_paced_total`` and the gauges read
    ``d.stats()`` whenever the registry is collected.  Several dispatchers may
    share a name (their figures add up).  Every family and label value is
    present from the start, at zero, so that ``rate()`` works from the first
    scrape.  See ``docs/observability.md`` for what each metric means.
    """

    def __init__(self, registry=_DEFAULT_REGISTRY, *, buckets=LATENCY_BUCKETS):
        if _make_wsgi_app is None:
            raise ImportError("PrometheusMetrics needs prometheus-client: "
                              "pip install fastdispatch[prometheus]")
        bounds = tuple(float(b) for b in buckets)
        if not bounds or list(bounds) != sorted(set(bounds)) or bounds[0] <= 0 \
                or bounds[-1] == float("inf"):
            raise ValueError("buckets must be increasing finite positive bounds, got %r"
                             % (buckets,))
        self._bounds = bounds
        self._lock = threading.Lock()
        self._series = {}      # name -> _Series
        self._tracked = {}     # name -> [dispatcher, ...]
        self._folded = {}      # name -> {counter: value} of untracked dispatchers
        self._caps = {}        # id(tracked dispatcher) -> its max_inflight, if known
        if registry is not None:
            registry.register(self)

    def _series_for(self, name):
        with self._lock:
            series = self._series.get(name)
            if series is None:
                series = self._series[name] = _Series(self._bounds)
            return series

    def hooks(self, name, compose=None):
        """The :class:`DispatcherHooks` to give the dispatcher called ``name``.

        ``compose``: the hooks the dispatcher would have had otherwise; each
        of them still runs, after ours, with the same arguments, and what it
        raises reaches the dispatcher's usual hook-failure path (logged on
        the ``fastdispatch`` logger, passed to ``recover``).
        """
        _check_name(name)
        if compose is not None and not isinstance(compose, DispatcherHooks):
            raise TypeError("compose must be a DispatcherHooks or None, got %r"
                            % (type(compose).__name__,))
        user = compose if compose is not None else DispatcherHooks()
        series = self._series_for(name)
        return DispatcherHooks(
            on_queued=user.on_queued,
            on_start=user.on_start,
            on_done=_chain(_make_on_done(series), user.on_done),
            on_rejected=_chain(_make_on_rejected(series), user.on_rejected),
            on_retry=_chain(_make_on_retry(series), user.on_retry),
        )

    def track(self, dispatcher, name, *, max_inflight=None):
        """Read ``dispatcher.stats()`` at every scrape, labelled ``name``.

        ``max_inflight``: the dispatcher's worker cap, exposed as the gauge
        ``fastdispatch_max_inflight`` so that saturation can be computed
        (taken from ``dispatcher.max_inflight`` when it has one).  The
        dispatcher is kept (a strong reference) until :meth:`untrack`.
        Tracking the same dispatcher again under the same name does nothing;
        under another name raises ``ValueError``.
        """
        _check_name(name)
        if not callable(getattr(dispatcher, "stats", None)):
            raise TypeError("dispatcher must have a stats() method, got %r"
                            % (type(dispatcher).__name__,))
        if max_inflight is None:
            max_inflight = getattr(dispatcher, "max_inflight", None)
            if isinstance(max_inflight, bool) or not isinstance(max_inflight, int):
                max_inflight = None
        elif isinstance(max_inflight, bool) or not isinstance(max_inflight, int) \
                or max_inflight < 1:
            raise ValueError("max_inflight must be an int >= 1, got %r" % (max_inflight,))
        self._series_for(name)
        with self._lock:
            for other, tracked in self._tracked.items():
                if any(d is dispatcher for d in tracked):
                    if other == name:
                        return
                    raise ValueError("dispatcher is already tracked as %r" % (other,))
            self._tracked.setdefault(name, []).append(dispatcher)
            if max_inflight is not None:
                self._caps[id(dispatcher)] = max_inflight

    def untrack(self, dispatcher):
        """Stop reading ``dispatcher``; its final counts stay in the counters
        (they never go down), its gauges leave the sums."""
        final = dispatcher.stats()
        with self._lock:
            for name, tracked in self._tracked.items():
                for i, d in enumerate(tracked):
                    if d is dispatcher:
                        del tracked[i]
                        self._caps.pop(id(dispatcher), None)
                        folded = self._folded.setdefault(name, dict.fromkeys(_STAT_COUNTERS, 0))
                        for key in _STAT_COUNTERS:
                            folded[key] += getattr(final, key)
                        return
        raise ValueError("dispatcher is not tracked")

    def serve(self, port=0, addr="127.0.0.1", registry=None):
        """:func:`serve` this object's registry (or ``registry``)."""
        return serve(port, registry if registry is not None else self, addr=addr)

    # prometheus_client's collector protocol ----------------------------------

    def describe(self):
        """The families this collector yields (empty), for the registry's
        duplicate-name check."""
        return list(self._families({}, {}, {}, {}, {}))

    def collect(self):
        """Every family, read now: counters and gauges from ``stats()``,
        histograms and the rejection/retry counters from the hooks."""
        with self._lock:
            series = dict(self._series)
            tracked = {name: list(ds) for name, ds in self._tracked.items() if ds}
            folded = {name: dict(f) for name, f in self._folded.items()}
            caps = {name: [self._caps[id(d)] for d in ds if id(d) in self._caps]
                    for name, ds in tracked.items()}
        stats = {}
        for name in series:
            total = dict.fromkeys(_STAT_COUNTERS + tuple(g[1] for g in _GAUGES), 0)
            for key, value in folded.get(name, {}).items():
                total[key] += value
            for d in tracked.get(name, ()):
                s = d.stats()
                for key in total:
                    total[key] += getattr(s, key)
            stats[name] = total
        return self._families(series, stats, tracked, folded, caps)

    def _families(self, series, stats, tracked, folded, caps):
        tasks = CounterMetricFamily(
            "fastdispatch_tasks", "Tasks ended, by outcome (each accepted task ends "
            "in exactly one; read from stats()).", labels=("dispatcher", "outcome"))
        rejected = CounterMetricFamily(
            "fastdispatch_rejected", "Submits refused: queue_full (the chat already had "
            "queue_size waiting tasks) or closed.", labels=("dispatcher", "reason"))
        retries = CounterMetricFamily(
            "fastdispatch_retries", "Retries scheduled: after a RetryAfter (HTTP 429) "
            "or a retryable error.", labels=("dispatcher", "cause"))
        paced = CounterMetricFamily(
            "fastdispatch_paced", "Task starts that had to wait for a rate limit.",
            labels=("dispatcher",))
        queue = HistogramMetricFamily(
            "fastdispatch_queue_latency_seconds", "Seconds from submit to start, "
            "per task that started.", labels=("dispatcher",))
        run = HistogramMetricFamily(
            "fastdispatch_run_latency_seconds", "Seconds from start to end, "
            "per task that started.", labels=("dispatcher",))
        gauges = [(GaugeMetricFamily(metric, doc, labels=("dispatcher",)), key)
                  for metric, key, doc in _GAUGES]
        cap = GaugeMetricFamily(
            "fastdispatch_max_inflight", "The worker cap (max_inflight), where "
            "track() was told it.", labels=("dispatcher",))
        bounds = self._bounds
        les = [_le_label(b) for b in bounds] + ["+Inf"]
        for name in sorted(series):
            s = series[name]
            labels = (name,)
            st = stats[name]
            # Without a tracked dispatcher (hooks only) there is no stats()
            # to read: those families leave the name out rather than say 0.
            from_stats = name in tracked or name in folded
            if from_stats:
                for outcome in OUTCOMES:
                    tasks.add_metric((name, outcome), st[outcome])
                paced.add_metric(labels, st["paced"])
            with s._lock:
                rej = dict(s.rejected)
                ret = dict(s.retries)
            for reason in REJECT_REASONS:
                rejected.add_metric((name, reason), rej[reason])
            for cause in RETRY_CAUSES:
                retries.add_metric((name, cause), ret[cause])
            cells = s.snapshot()
            width = s.width
            for family, offset, total in ((queue, 0, cells[-2]), (run, width, cells[-1])):
                cumulative, buckets = 0, []
                for i, le in enumerate(les):
                    cumulative += cells[offset + i]
                    buckets.append((le, cumulative))
                family.add_metric(labels, buckets, total)
            if name in tracked:   # an untracked dispatcher's gauges are gone
                for family, key in gauges:
                    family.add_metric(labels, st[key])
                if caps.get(name):
                    cap.add_metric(labels, sum(caps[name]))
        return [tasks, rejected, retries, paced, queue, run] + [g for g, _ in gauges] + [cap]


class MetricsServer:
    """A running metrics endpoint (see :func:`serve`): ``.port``, ``.url``,
    ``.stop()``; a context manager."""

    def __init__(self, server, addr):
        self._server = server
        self.addr, self.port = addr, server.port
        host = "[%s]" % self.addr if ":" in self.addr else self.addr
        self.url = "http://%s:%d/metrics" % (host, self.port)

    def stop(self, timeout=5.0):
        """Stop serving and close the socket; return once the thread ended."""
        if self._server is None:
            return
        self._server.stop()
        self._server = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stop()

    def __repr__(self):
        return "<MetricsServer %s>" % (self.url,)


def serve(port=0, registry=None, *, addr="127.0.0.1", request_timeout=10.0):
    """Expose ``registry`` in the Prometheus text format on ``addr:port``.

    ``registry``: a prometheus_client registry, or any collector (such as a
    :class:`PrometheusMetrics` made with ``registry=None``); None means
    prometheus_client's default registry.  ``port=0`` lets the OS choose
    (read it from ``.port``).  ``addr`` is loopback unless you say otherwise
    (``"0.0.0.0"`` for a Prometheus server on another machine).  Returns a
    :class:`MetricsServer`; call ``.stop()`` when done.  The server runs on a
    daemon thread, answers every path with the metrics, and serves
    concurrent scrapes on 2 threads, each request held to ``request_timeout``
    seconds in all, 16 KiB of headers and no body (the limits of every
    server of the package, ``fastdispatch._serve``; it needs cheroot, which
    the ``prometheus`` extra installs).  prometheus_client's own
    ``start_http_server`` gives every connection a thread, with no timeout.
    """
    if _make_wsgi_app is None:
        raise ImportError("serve needs prometheus-client: pip install fastdispatch[prometheus]")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError("port must be an int in 0..65535, got %r" % (port,))
    if registry is None:
        registry = _DEFAULT_REGISTRY
    elif not callable(getattr(registry, "collect", None)):
        raise TypeError("registry must be a prometheus_client registry or collector, got %r"
                        % (type(registry).__name__,))
    from ._serve import Server
    server = Server(_make_wsgi_app(registry), addr, port, 2, max_body=4096,
                    request_timeout=request_timeout, name="fastdispatch-metrics")
    return MetricsServer(server, addr)


# ------------------------------------------------------------ OpenTelemetry


class _TracedTask:
    """A task that runs each of its attempts in a span of its own."""

    __slots__ = ("_task", "_tracer", "_parent", "_since", "_attributes")

    def __init__(self, task, tracer, parent, attributes):
        self._task = task
        self._tracer = tracer
        self._parent = parent          # the OpenTelemetry context at submit time
        self._since = monotonic()      # submit, then the end of the last attempt
        self._attributes = attributes

    def __call__(self, sc):
        started = monotonic()
        attributes = dict(self._attributes)
        attributes["fastdispatch.chat_id"] = str(sc.chat_id)
        attributes["fastdispatch.attempt"] = sc.attempt
        attributes["fastdispatch.queue_latency"] = started - self._since
        span = self._tracer.start_span("fastdispatch.send", context=self._parent,
                                       attributes=attributes)
        token = _otel_context.attach(_otel_trace.set_span_in_context(span, self._parent))
        outcome = "completed"
        try:
            result = self._task(sc)
        except RetryAfter as exc:
            outcome = "retry_after"
            span.add_event("retry_after", {"fastdispatch.retry_after": exc.seconds,
                                           "fastdispatch.scope": exc.scope})
            raise
        except BaseException as exc:
            outcome = _outcome_of(exc)
            span.record_exception(exc)
            span.set_status(_otel_trace.Status(_otel_trace.StatusCode.ERROR,
                                               "%s: %s" % (type(exc).__name__, exc)))
            raise
        else:
            if sc.cancelled:
                # Returned after its deadline or a force_close(): the Future
                # was already resolved with SendTimeout / Cancelled.
                outcome = _outcome_of_cancelled(sc)
                span.set_status(_otel_trace.Status(_otel_trace.StatusCode.ERROR, outcome))
            return result
        finally:
            self._since = monotonic()
            _otel_context.detach(token)
            span.set_attribute("fastdispatch.outcome", outcome)
            span.end()


def _outcome_of(exc):
    if isinstance(exc, SendTimeout):
        return "timed_out"
    if isinstance(exc, Cancelled):
        return "cancelled"
    if isinstance(exc, Exception):
        return "failed"
    return "panicked"


def _outcome_of_cancelled(sc):
    try:
        sc.check()
    except Cancelled:
        return "cancelled"
    except SendTimeout:
        return "timed_out"
    return "completed"


class TracedDispatcher:
    """A dispatcher whose sends are traced: one span per attempt.

    ``TracedDispatcher(dispatcher, *, tracer_provider=None, name=None)``
    wraps ``dispatcher``; ``submit`` and ``post`` wrap each task so that every
    attempt (a retried send runs its task again) opens a span
    ``fastdispatch.send``, current while the task runs (a sender's own
    instrumented HTTP calls become its children).  Its parent is the span
    current when the send was submitted; ``ctx.reply`` submits with the
    event's span current, so a reply's attempts are children of the event.

    Attributes: ``fastdispatch.attempt`` (``sc.attempt``),
    ``fastdispatch.outcome`` (``completed``, ``failed``, ``retry_after``,
    ``timed_out``, ``cancelled`` or ``panicked``: how this attempt ended),
    ``fastdispatch.queue_latency`` (seconds this attempt waited before it
    started: since submit for the first, since the previous attempt ended for
    a retry), ``fastdispatch.chat_id`` and, if given,
    ``fastdispatch.dispatcher``.  A raised exception is recorded on the span.

    Everything else (``stats()``, ``shutdown()``, ``with``...) is the wrapped
    dispatcher's; ``.dispatcher`` is the wrapped one.  ``tracer_provider``:
    None means OpenTelemetry's global provider.
    """

    def __init__(self, dispatcher, *, tracer_provider=None, name=None):
        if _otel_trace is None:
            raise ImportError("TracedDispatcher needs opentelemetry-api: "
                              "pip install fastdispatch[otel]")
        if not callable(getattr(dispatcher, "submit", None)):
            raise TypeError("dispatcher must have a submit(chat_id, task) method, got %r"
                            % (type(dispatcher).__name__,))
        if name is not None:
            _check_name(name)
        from . import __version__
        self._dispatcher = dispatcher
        self._tracer = _otel_trace.get_tracer("fastdispatch", __version__,
                                              tracer_provider=tracer_provider)
        self._attributes = {} if name is None else {"fastdispatch.dispatcher": name}

    @property
    def dispatcher(self):
        """The wrapped dispatcher."""
        return self._dispatcher

    def _wrap(self, task):
        if not callable(task):
            raise TypeError("task must be callable, got %r" % (type(task).__name__,))
        return _TracedTask(task, self._tracer, _otel_context.get_current(), self._attributes)

    def submit(self, chat_id, task):
        """``dispatcher.submit`` with the task traced."""
        return self._dispatcher.submit(chat_id, self._wrap(task))

    def post(self, chat_id, task):
        """``dispatcher.post`` with the task traced."""
        self._dispatcher.post(chat_id, self._wrap(task))

    def __getattr__(self, attr):
        # Only called for what this class lacks; never for _dispatcher once
        # set (a half-built object, e.g. during copy, must not recurse).
        if attr == "_dispatcher":
            raise AttributeError(attr)
        return getattr(self._dispatcher, attr)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self._dispatcher.shutdown()

    def __repr__(self):
        return "<TracedDispatcher %r>" % (self._dispatcher,)
