"""What the per-event Context costs, each operation beside a baseline.

Run:  python -m pytest --pyargs fastdispatch.bench.suite.bench_context --benchmark-only

Every group holds one of our operations and the cheapest plain-Python code
doing the same job, measured in the same run:

- ``create``: ``Context(...)`` vs. a bare ``__slots__`` object with the same
  fields (no argument checks, no span lookup).
- ``set+get``, ``ext.get``: the stores vs. a plain dict.
- ``clone``: ``ctx.clone()`` vs. copying the bare object and its dicts.
- ``match path``: ``engine.process_event`` (fresh Context, one rule, a
  handler that replies) vs. calling the handler and the dispatcher by hand;
  the dispatcher here completes sends inline, so only our overhead is timed.
- ``round trip``: the same through a real ``OutboundDispatcher``, waiting
  for the send on its worker thread, vs. ``submit(...).result()`` by hand.

The ratio to read is median(ours) / median(baseline) within a group.  Each
round times many calls (``pedantic`` with fixed iterations), so the timer's
own overhead and resolution do not blur the nanosecond-sized operations.
"""

from concurrent.futures import Future

import pytest

import fastdispatch
from fastdispatch import rules
from fastdispatch.context import Context
from fastdispatch.engine import Engine
from fastdispatch.platform import ChatInfo, Event, SenderInfo, SendRequest, SendResult, TextMessage

EVENT = Event("bench", ChatInfo("chat-1"), SenderInfo("user-1"), text="/ping now")
RESULT = SendResult("m1")


class Sender:
    def send(self, sc, request):
        return RESULT


class InlineDispatcher:
    """Runs each task at once in the caller: isolates the match-path cost."""

    def submit(self, chat_id, task):
        fut = Future()
        fut.set_result(task(None))
        return fut

    def shutdown(self, timeout=None):
        return True


SENDER = Sender()
DISPATCHER = InlineDispatcher()


def measure(benchmark, fn, *args, iterations=1000, rounds=200):
    """Time ``fn(*args)``: ``rounds`` samples of ``iterations`` calls each."""
    benchmark.pedantic(fn, args, iterations=iterations, rounds=rounds, warmup_rounds=2)


class ParsedCommand:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


class PlainContext:
    """The baseline: Context's fields in ``__slots__``, nothing else."""

    __slots__ = ("event", "sender", "dispatcher", "capabilities", "deadline", "span",
                 "bot_id", "cancelled", "values", "ext", "effects", "content",
                 "content_lock")

    def __init__(self, event, *, sender=None, dispatcher=None, capabilities=None,
                 deadline=None, span=None, bot_id=""):
        self.event = event
        self.sender = sender
        self.dispatcher = dispatcher
        self.capabilities = capabilities
        self.deadline = deadline
        self.span = span
        self.bot_id = bot_id
        self.cancelled = False
        self.values = None
        self.ext = None
        self.effects = None
        self.content = None
        self.content_lock = None

    def clone(self):
        other = PlainContext.__new__(PlainContext)
        other.event = self.event
        other.sender = self.sender
        other.dispatcher = self.dispatcher
        other.capabilities = self.capabilities
        other.deadline = self.deadline
        other.span = self.span
        other.bot_id = self.bot_id
        other.cancelled = False
        other.values = self.values.copy()
        other.ext = self.ext.copy()
        other.effects = None
        other.content = self.content
        other.content_lock = None
        return other


# -- create ---------------------------------------------------------------------------


@pytest.mark.benchmark(group="create")
def test_create_context(benchmark):
    measure(benchmark, lambda: Context(EVENT, sender=SENDER, dispatcher=DISPATCHER))


@pytest.mark.benchmark(group="create")
def test_create_baseline_slots_object(benchmark):
    measure(benchmark, lambda: PlainContext(EVENT, sender=SENDER, dispatcher=DISPATCHER))


# -- string store ---------------------------------------------------------------------


@pytest.mark.benchmark(group="set+get")
def test_set_get_context(benchmark):
    ctx = Context(EVENT)

    def op():
        ctx.set("key", 1)
        return ctx.get("key")

    measure(benchmark, op)


@pytest.mark.benchmark(group="set+get")
def test_set_get_baseline_dict(benchmark):
    d = {}

    def op():
        d["key"] = 1
        return d.get("key")

    measure(benchmark, op)


# -- typed store ----------------------------------------------------------------------


@pytest.mark.benchmark(group="ext.get")
def test_ext_get_context(benchmark):
    ctx = Context(EVENT)
    ctx.ext.set(ParsedCommand("ping"))
    measure(benchmark, lambda: ctx.ext.get(ParsedCommand))


@pytest.mark.benchmark(group="ext.get")
def test_ext_get_baseline_dict(benchmark):
    d = {ParsedCommand: ParsedCommand("ping")}
    measure(benchmark, lambda: d.get(ParsedCommand))


# -- clone ----------------------------------------------------------------------------


@pytest.mark.benchmark(group="clone")
def test_clone_context(benchmark):
    ctx = Context(EVENT, sender=SENDER, dispatcher=DISPATCHER)
    ctx.set("a", 1)
    ctx.set("b", 2)
    ctx.ext.set(ParsedCommand("ping"))
    measure(benchmark, ctx.clone)


@pytest.mark.benchmark(group="clone")
def test_clone_baseline_slots_object(benchmark):
    plain = PlainContext(EVENT, sender=SENDER, dispatcher=DISPATCHER)
    plain.values = {"a": 1, "b": 2}
    plain.ext = {ParsedCommand: ParsedCommand("ping")}
    measure(benchmark, plain.clone)


# -- the match path, dispatcher cost excluded -----------------------------------------


@pytest.mark.benchmark(group="match path")
def test_match_path_engine(benchmark):
    engine = Engine(DISPATCHER)
    engine.on(rules.on_command("ping"))(lambda ctx: ctx.reply_text("pong"))
    measure(benchmark, engine.process_event, EVENT, SENDER, iterations=100)


@pytest.mark.benchmark(group="match path")
def test_match_path_baseline_by_hand(benchmark):
    def handle(event, sender):
        words = event.content().split(None, 1)
        if words and words[0] == "/ping":
            request = SendRequest(event.chat, TextMessage("pong"))
            DISPATCHER.submit(event.chat.id, lambda sc: sender.send(sc, request))

    measure(benchmark, handle, EVENT, SENDER, iterations=100)


# -- the whole round trip through a real dispatcher -----------------------------------


@pytest.fixture
def dispatcher():
    d = fastdispatch.OutboundDispatcher()
    yield d
    d.shutdown(timeout=10)


@pytest.mark.benchmark(group="round trip")
def test_round_trip_engine(benchmark, dispatcher):
    engine = Engine(dispatcher)
    futures = []
    engine.on(rules.on_command("ping"))(lambda ctx: futures.append(ctx.reply_text("pong")))

    def op():
        engine.process_event(EVENT, SENDER)
        return futures.pop().result(timeout=10)

    measure(benchmark, op, iterations=10, rounds=500)


@pytest.mark.benchmark(group="round trip")
def test_round_trip_baseline_by_hand(benchmark, dispatcher):
    def op():
        request = SendRequest(EVENT.chat, TextMessage("pong"))
        return dispatcher.submit(EVENT.chat.id, lambda sc: SENDER.send(sc, request)).result(
            timeout=10)

    measure(benchmark, op, iterations=10, rounds=500)
