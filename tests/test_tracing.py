"""Trace spans travel with the event (the Context's clone; needs the otel extra)."""

import threading

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from fastdispatch.context import Context  # noqa: E402
from fastdispatch.engine import Engine  # noqa: E402
from fastdispatch.platform import ChatInfo, Event, SenderInfo  # noqa: E402


@pytest.fixture
def tracing():
    """A tracer whose finished spans land in an in-memory exporter (no
    global provider is installed, so tests stay independent)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("fastdispatch-tests"), exporter
    provider.shutdown()


def _event():
    return Event("test", ChatInfo("c1"), SenderInfo("u1"), text="hi")


def _finished(exporter, name):
    (span,) = [s for s in exporter.get_finished_spans() if s.name == name]
    return span


def test_context_captures_the_span_current_when_it_is_made(tracing):
    tracer, _ = tracing
    with tracer.start_as_current_span("receive") as span:
        ctx = Context(_event())
    assert ctx.span is span
    assert Context(_event()).span is None  # no span current: none captured


def test_explicit_span_wins_over_the_current_one(tracing):
    tracer, _ = tracing
    with tracer.start_as_current_span("outer"):
        ctx = Context(_event(), span="given")
    assert ctx.span == "given"


def test_clone_carries_the_same_span(tracing):
    tracer, _ = tracing
    with tracer.start_as_current_span("receive") as span:
        ctx = Context(_event())
    assert ctx.clone().span is span


def test_pooled_handler_runs_with_the_events_span_current(tracing, make_dispatcher):
    tracer, exporter = tracing
    engine = Engine(make_dispatcher())
    seen = []
    done = threading.Event()

    @engine.on(pooled=True)
    def handler(ctx):
        seen.append(trace.get_current_span())
        with tracer.start_as_current_span("handle"):
            pass
        done.set()

    with tracer.start_as_current_span("receive") as receive:
        engine.process_event(_event(), None)
    assert done.wait(5)
    assert seen == [receive]
    handle = _finished(exporter, "handle")
    assert handle.parent.span_id == receive.get_span_context().span_id
    assert handle.context.trace_id == receive.get_span_context().trace_id
    assert engine.shutdown(timeout=10)


def test_pool_thread_is_left_without_the_span_afterwards(tracing, make_dispatcher):
    tracer, _ = tracing
    engine = Engine(make_dispatcher(), pool_size=1)
    after = []
    done = threading.Event()

    engine.on(pooled=True)(lambda ctx: None)
    with tracer.start_as_current_span("receive"):
        engine.process_event(_event(), None)
    # Same single pool thread, an event without a span: nothing leaks over.
    engine.on(pooled=True)(lambda ctx: (after.append(trace.get_current_span()), done.set()))
    engine.process_event(_event(), None)
    assert done.wait(5)
    assert after == [trace.INVALID_SPAN]
    assert engine.shutdown(timeout=10)


def test_failing_pooled_handler_does_not_end_or_mark_the_events_span(tracing, make_dispatcher):
    tracer, exporter = tracing
    engine = Engine(make_dispatcher())
    engine.on(pooled=True)(lambda ctx: 1 / 0)
    with tracer.start_as_current_span("receive") as receive:
        engine.process_event(_event(), None)
        assert engine.shutdown(timeout=10)
        assert receive.is_recording()  # still ours to end
    assert _finished(exporter, "receive").status.is_ok
