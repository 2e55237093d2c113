"""A span per send attempt (fastdispatch.metrics.TracedDispatcher, otel extra).

Spans go to the OpenTelemetry SDK's in-memory exporter through a provider of
the test's own (no global provider is installed).
"""

import threading
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fastdispatch import RetryAfter, RetryPolicy, SendResult, SendTimeout, TextMessage
from fastdispatch.context import Context
from fastdispatch.engine import Engine
from fastdispatch.metrics import TracedDispatcher
from fastdispatch.platform import ChatInfo, Event, SenderInfo


@pytest.fixture
def tracing():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, provider.get_tracer("fastdispatch-tests"), exporter
    provider.shutdown()


def _event(chat="c1"):
    return Event("test", ChatInfo(chat), SenderInfo("u1"), text="hi")


def _sends(exporter):
    spans = [s for s in exporter.get_finished_spans() if s.name == "fastdispatch.send"]
    return sorted(spans, key=lambda s: s.attributes["fastdispatch.attempt"])


class Sender:
    """Fails the first ``failures`` attempts with ``exc``, then succeeds."""

    def __init__(self, exc=None, failures=0):
        self.exc = exc
        self.failures = failures
        self.seen = []
        self.lock = threading.Lock()

    def send(self, sc, request):
        with self.lock:
            self.seen.append((sc.attempt, trace.get_current_span()))
        if sc.attempt <= self.failures:
            raise self.exc
        return SendResult(message_id="m%d" % sc.attempt)


def test_a_reply_is_sent_in_a_span_that_is_a_child_of_the_event(tracing, make_dispatcher):
    provider, tracer, exporter = tracing
    d = TracedDispatcher(make_dispatcher(), tracer_provider=provider, name="replies")
    sender = Sender()
    with tracer.start_as_current_span("receive") as receive:
        ctx = Context(_event(), sender=sender, dispatcher=d)
        fut = ctx.reply(TextMessage("pong"))
    assert fut.result(timeout=5).message_id == "m1"
    assert d.drain(timeout=5)
    (send,) = _sends(exporter)
    assert send.parent.span_id == receive.get_span_context().span_id
    assert send.context.trace_id == receive.get_span_context().trace_id
    assert send.attributes["fastdispatch.attempt"] == 1
    assert send.attributes["fastdispatch.outcome"] == "completed"
    assert send.attributes["fastdispatch.chat_id"] == "c1"
    assert send.attributes["fastdispatch.dispatcher"] == "replies"
    assert 0.0 <= send.attributes["fastdispatch.queue_latency"] < 5
    assert send.status.is_ok
    # The send ran with its attempt span current (the sender's own spans nest).
    assert sender.seen[0][1].get_span_context().span_id == send.context.span_id


def test_a_retried_send_shows_each_attempt(tracing, make_dispatcher):
    provider, tracer, exporter = tracing
    d = TracedDispatcher(make_dispatcher(retry=RetryPolicy(
        max_attempts=4, backoff=0.01, max_backoff=0.02, retry_on=(ConnectionError,))),
        tracer_provider=provider)
    sender = Sender()
    sender.attempts = iter([RetryAfter(0.02), ConnectionError("reset")])

    def send(sc, request):
        exc = next(sender.attempts, None)
        if exc is not None:
            raise exc
        return SendResult(message_id="done")

    sender.send = send
    with tracer.start_as_current_span("receive") as receive:
        ctx = Context(_event(), sender=sender, dispatcher=d)
    fut = ctx.reply(TextMessage("pong"))     # outside the span: ctx.span still wins
    assert fut.result(timeout=5).message_id == "done"
    assert d.drain(timeout=5)
    spans = _sends(exporter)
    assert [s.attributes["fastdispatch.attempt"] for s in spans] == [1, 2, 3]
    assert [s.attributes["fastdispatch.outcome"] for s in spans] == [
        "retry_after", "failed", "completed"]
    assert all(s.parent.span_id == receive.get_span_context().span_id for s in spans)
    assert spans[0].events[0].name == "retry_after"
    assert spans[0].events[0].attributes["fastdispatch.retry_after"] == 0.02
    assert spans[1].events[0].name == "exception"
    # A retry waited at least its RetryAfter before it started.
    assert spans[1].attributes["fastdispatch.queue_latency"] >= 0.015
    assert spans[1].start_time >= spans[0].end_time
    assert spans[2].start_time >= spans[1].end_time


def test_a_failed_send_records_its_exception(tracing, make_dispatcher):
    provider, tracer, exporter = tracing
    d = TracedDispatcher(make_dispatcher(), tracer_provider=provider)
    sender = Sender(ValueError("bad request"), failures=1)
    with tracer.start_as_current_span("receive"):
        fut = Context(_event(), sender=sender, dispatcher=d).reply(TextMessage("x"))
    assert isinstance(fut.exception(timeout=5), ValueError)
    assert d.drain(timeout=5)
    (send,) = _sends(exporter)
    assert send.attributes["fastdispatch.outcome"] == "failed"
    assert send.status.status_code == trace.StatusCode.ERROR
    (event,) = send.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "ValueError"


def test_an_attempt_past_its_deadline_is_marked_timed_out(tracing, make_dispatcher):
    provider, tracer, exporter = tracing
    d = TracedDispatcher(make_dispatcher(send_timeout=0.1), tracer_provider=provider)
    fut = d.submit("slow", lambda sc: time.sleep(0.3))
    assert isinstance(fut.exception(timeout=5), SendTimeout)
    assert d.drain(timeout=5)
    (send,) = _sends(exporter)
    assert send.attributes["fastdispatch.outcome"] == "timed_out"
    assert send.status.status_code == trace.StatusCode.ERROR
    assert (send.end_time - send.start_time) / 1e9 >= 0.29   # the real duration


def test_a_panicking_send_is_marked_and_still_propagates(tracing, make_dispatcher):
    class Panic(BaseException):
        pass

    def panics(sc):
        raise Panic()

    provider, tracer, exporter = tracing
    recovered = []
    d = TracedDispatcher(make_dispatcher(recover=recovered.append), tracer_provider=provider)
    fut = d.submit("p", panics)
    assert isinstance(fut.exception(timeout=5).__cause__, Panic)
    assert d.drain(timeout=5)
    assert len(recovered) == 1 and isinstance(recovered[0], Panic)
    (send,) = _sends(exporter)
    assert send.attributes["fastdispatch.outcome"] == "panicked"


def test_an_explicit_event_span_parents_the_send_even_when_not_current(
        tracing, make_dispatcher):
    provider, tracer, exporter = tracing
    d = TracedDispatcher(make_dispatcher(), tracer_provider=provider)
    event_span = tracer.start_span("event")
    with tracer.start_as_current_span("unrelated"):
        ctx = Context(_event(), sender=Sender(), dispatcher=d, span=event_span)
        ctx.reply(TextMessage("pong")).result(timeout=5)
    event_span.end()
    assert d.drain(timeout=5)
    (send,) = _sends(exporter)
    assert send.parent.span_id == event_span.get_span_context().span_id


def test_a_direct_submit_is_a_child_of_the_submitters_span(tracing, make_dispatcher):
    provider, tracer, exporter = tracing
    d = TracedDispatcher(make_dispatcher(), tracer_provider=provider)
    with tracer.start_as_current_span("job") as job:
        d.submit("c", lambda sc: None).result(timeout=5)
        d.post("c", lambda sc: None)
    assert d.drain(timeout=5)
    spans = exporter.get_finished_spans()
    sends = [s for s in spans if s.name == "fastdispatch.send"]
    assert len(sends) == 2
    assert all(s.parent.span_id == job.get_span_context().span_id for s in sends)
    # Without any current span, a send is a root span of its own.
    d.submit("c", lambda sc: None).result(timeout=5)
    assert d.drain(timeout=5)
    root = [s for s in exporter.get_finished_spans() if s.name == "fastdispatch.send"][-1]
    assert root.parent is None


def test_an_engine_with_a_traced_dispatcher_parents_replies_to_the_event(
        tracing, make_dispatcher):
    provider, tracer, exporter = tracing
    engine = Engine(TracedDispatcher(make_dispatcher(), tracer_provider=provider))
    futures = []

    @engine.on(pooled=True)
    def handler(ctx):
        futures.append(ctx.reply_text("pong"))

    with tracer.start_as_current_span("receive") as receive:
        engine.process_event(_event(), Sender())
    deadline = time.monotonic() + 5
    while not futures and time.monotonic() < deadline:
        time.sleep(0.01)
    assert futures[0].result(timeout=5).message_id == "m1"
    assert engine.shutdown(timeout=10)
    (send,) = _sends(exporter)
    assert send.parent.span_id == receive.get_span_context().span_id


def test_traced_dispatcher_refuses_bad_arguments(make_dispatcher):
    with pytest.raises(TypeError, match="dispatcher"):
        TracedDispatcher(object())
    d = TracedDispatcher(make_dispatcher())
    with pytest.raises(TypeError, match="task"):
        d.submit("c", "not callable")
    with pytest.raises(TypeError, match="chat_id"):
        d.submit(None, lambda sc: None)
    with pytest.raises(TypeError, match="name"):
        TracedDispatcher(make_dispatcher(), name=3)
    assert d.stats().submitted == 0   # everything else is the wrapped dispatcher's
