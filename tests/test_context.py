"""The per-event Context."""

import logging
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import Future

import pytest

from fastdispatch import context as context_module
from fastdispatch._errors import DispatcherClosed, QueueFull
from fastdispatch.context import Context, Extensions, ReservedKeyError
from fastdispatch.platform import (
    Capabilities,
    ChatInfo,
    Event,
    SenderInfo,
    SendResult,
    TextMessage,
)


def _event(text="hello", chat_id="c1", sender_id="u1", is_group=False):
    return Event("test", ChatInfo(chat_id, is_group), SenderInfo(sender_id), text=text)


class RecordingSender:
    """A platform sender that records what it sent, in order."""

    def __init__(self):
        self.sent = []

    def send(self, sc, request):
        self.sent.append((sc.chat_id, request.target.id, request.message.text))
        return SendResult(message_id=str(len(self.sent)))


class ParsedCommand:
    """A framework value type, the kind that lives in the typed store."""

    def __init__(self, name):
        self.name = name


# -- construction ----------------------------------------------------------------


def test_fresh_context_creates_no_store_until_used():
    ctx = Context(_event())
    assert ctx._values is None and ctx._ext is None and ctx._effects is None
    assert ctx.get("k") is None and ctx.all() == {}
    ctx.delete("k")
    assert ctx._values is None  # reading and deleting create nothing
    ctx.set("k", 1)
    assert ctx._values == {"k": 1} and ctx._ext is None
    ctx.ext.get(ParsedCommand)
    assert isinstance(ctx._ext, Extensions)


def test_context_has_slots_and_no_instance_dict():
    ctx = Context(_event())
    assert not hasattr(ctx, "__dict__")
    with pytest.raises(AttributeError):
        ctx.anything = 1


def test_construction_arguments_are_readable_and_read_only():
    event, sender, caps = _event(), RecordingSender(), Capabilities(typing=True)

    class FakeDispatcher:
        def submit(self, chat_id, task):
            raise AssertionError("not used")

    dispatcher = FakeDispatcher()
    ctx = Context(event, sender=sender, dispatcher=dispatcher, capabilities=caps,
                  deadline=123.0, span="span", bot_id="bot")
    assert ctx.event is event and ctx.sender is sender and ctx.dispatcher is dispatcher
    assert (ctx.deadline, ctx.span, ctx.bot_id) == (123.0, "span", "bot")
    assert ctx.get_platform_capabilities() is caps
    for name in ("event", "sender", "dispatcher", "deadline", "span", "bot_id"):
        with pytest.raises(AttributeError):
            setattr(ctx, name, None)


def test_capabilities_default_to_none_supported():
    assert Context(_event()).get_platform_capabilities() == Capabilities()


@pytest.mark.parametrize("kwargs, match", [
    ({"event": "not an event"}, "event"),
    ({"sender": object()}, "sender"),
    ({"dispatcher": object()}, "dispatcher"),
    ({"capabilities": {"typing": True}}, "capabilities"),
    ({"deadline": "soon"}, "deadline"),
    ({"deadline": True}, "deadline"),
    ({"bot_id": 42}, "bot_id"),
])
def test_bad_constructor_arguments_raise_type_error(kwargs, match):
    event = kwargs.pop("event", _event())
    with pytest.raises(TypeError, match=match):
        Context(event, **kwargs)


def test_context_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        Context(_event(), RecordingSender())


# -- message content ---------------------------------------------------------------


class CountingEvent(Event):
    """An event that counts how often it was parsed."""

    def content(self):
        self.raw.append(1)
        return self.text.upper()


def _counting_event(text="hello"):
    return CountingEvent("test", ChatInfo("c1"), SenderInfo("u1"), text=text, raw=[])


def test_message_content_is_parsed_lazily_and_once():
    event = _counting_event()
    ctx = Context(event)
    assert event.raw == []
    assert ctx.message_content == "HELLO"
    assert ctx.message_content == "HELLO"
    assert event.raw == [1]


def test_message_content_parsed_once_under_concurrent_readers():
    readers = 8
    parses = []
    every_reader_parsing = threading.Event()

    class SlowEvent(Event):
        def content(self):
            parses.append(threading.get_ident())
            if len(parses) == readers:
                every_reader_parsing.set()
            # A correct Context lets only one reader in here, so this wait
            # runs out; without the once-guard all readers arrive and it
            # ends at once with ``parses`` full.
            every_reader_parsing.wait(0.2)
            return "parsed"

    ctx = Context(SlowEvent("t", ChatInfo("c"), SenderInfo("u"), text="x"))
    start = threading.Barrier(readers)
    seen = []

    def read():
        start.wait()
        seen.append(ctx.message_content)

    threads = [threading.Thread(target=read) for _ in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == ["parsed"] * readers
    assert len(parses) == 1


def test_parsed_content_is_read_without_taking_a_lock():
    ctx = Context(_event(" hi "))
    assert ctx.message_content == "hi"
    seen = []
    # Hold every lock the Context could use; a read that needed one would hang.
    with context_module._lazy_lock, ctx._content_lock:
        reader = threading.Thread(target=lambda: seen.append(ctx.message_content))
        reader.start()
        reader.join(5)
    assert seen == ["hi"]


def test_failed_parse_propagates_and_the_next_read_retries():
    calls = []

    class FlakyEvent(Event):
        def content(self):
            calls.append(1)
            if len(calls) == 1:
                raise ValueError("bad markup")
            return "ok"

    ctx = Context(FlakyEvent("t", ChatInfo("c"), SenderInfo("u")))
    with pytest.raises(ValueError, match="bad markup"):
        _ = ctx.message_content
    assert ctx.message_content == "ok"
    assert ctx.message_content == "ok"
    assert len(calls) == 2


# -- the string store -----------------------------------------------------------------


def test_string_store_set_get_delete():
    ctx = Context(_event())
    ctx.set("k", 1)
    ctx.set("k", 2)
    assert ctx.get("k") == 2
    assert ctx.get("missing") is None
    assert ctx.get("missing", "dflt") == "dflt"
    ctx.delete("k")
    ctx.delete("k")  # deleting a missing key is not an error
    assert ctx.get("k", "gone") == "gone"


def test_all_returns_a_copy_of_the_string_store():
    ctx = Context(_event())
    ctx.set("a", 1)
    snapshot = ctx.all()
    assert snapshot == {"a": 1}
    snapshot["b"] = 2
    ctx.set("c", 3)
    assert ctx.all() == {"a": 1, "c": 3} and snapshot == {"a": 1, "b": 2}


@pytest.mark.parametrize("key", ["mw_trace", "retry_attempt", "_fastdispatch_", "_fastdispatch_x"])
@pytest.mark.parametrize("op", ["set", "get", "delete"])
def test_reserved_keys_raise_reserved_key_error(key, op):
    ctx = Context(_event())
    args = (key, 1) if op == "set" else (key,)
    with pytest.raises(ReservedKeyError):
        getattr(ctx, op)(*args)
    assert ctx.all() == {}


def test_reserved_key_error_is_a_value_error():
    assert issubclass(ReservedKeyError, ValueError)


@pytest.mark.parametrize("key", ["MW_TRACE", "mw_trace_x", "x_fastdispatch_", "_fastdispatch"])
def test_names_near_reserved_keys_are_allowed(key):
    ctx = Context(_event())
    ctx.set(key, 1)
    assert ctx.get(key) == 1


@pytest.mark.parametrize("key", [1, None, b"k", ("k",), ParsedCommand])
@pytest.mark.parametrize("op", ["set", "get", "delete"])
def test_non_str_key_raises_type_error(key, op):
    ctx = Context(_event())
    args = (key, 1) if op == "set" else (key,)
    with pytest.raises(TypeError):
        getattr(ctx, op)(*args)


def test_string_store_never_sees_typed_store():
    ctx = Context(_event())
    framework_value = ParsedCommand("real")
    ctx.ext.set(framework_value)
    for key in ("ParsedCommand", ParsedCommand.__qualname__, repr(ParsedCommand),
                f"{ParsedCommand.__module__}.{ParsedCommand.__qualname__}"):
        ctx.set(key, ParsedCommand("forged"))
        ctx.delete(key)
        ctx.set(key, "plugin value")
    assert ctx.ext.get(ParsedCommand) is framework_value
    assert len(ctx.ext) == 1


def test_typed_store_never_sees_string_store():
    ctx = Context(_event())
    ctx.set("ParsedCommand", "plugin value")
    ctx.ext.set(ParsedCommand("framework"))
    ctx.ext.set("a str value")  # keyed by str, the type
    assert ctx.all() == {"ParsedCommand": "plugin value"}
    assert ctx.get("str") is None


# -- the typed store -------------------------------------------------------------------


def test_typed_store_is_keyed_by_the_exact_type_of_the_value():
    class Sub(ParsedCommand):
        pass

    ext = Context(_event()).ext
    value = Sub("x")
    ext.set(value)
    assert ext.get(Sub) is value
    assert ext.get(ParsedCommand) is None
    assert Sub in ext and ParsedCommand not in ext


def test_typed_store_explicit_key_must_be_a_type_the_value_is_an_instance_of():
    class Sub(ParsedCommand):
        pass

    ext = Context(_event()).ext
    value = Sub("x")
    ext.set(value, key=ParsedCommand)
    assert ext.get(ParsedCommand) is value
    with pytest.raises(TypeError):
        ext.set("not a command", key=ParsedCommand)
    with pytest.raises(TypeError):
        ext.set(value, key="ParsedCommand")
    assert ext.get(ParsedCommand) is value


@pytest.mark.parametrize("key", ["ParsedCommand", 1, None, ParsedCommand("x")])
def test_typed_store_keys_must_be_types(key):
    ext = Context(_event()).ext
    with pytest.raises(TypeError):
        ext.get(key)
    with pytest.raises(TypeError):
        ext.get_or_init(key, lambda: 1)


def test_typed_store_get_returns_default_when_absent():
    ext = Context(_event()).ext
    sentinel = ParsedCommand("dflt")
    assert ext.get(ParsedCommand, sentinel) is sentinel


def test_get_or_init_calls_the_factory_only_when_absent():
    ext = Context(_event()).ext
    calls = []

    def factory():
        calls.append(1)
        return ParsedCommand("made")

    first = ext.get_or_init(ParsedCommand, factory)
    assert ext.get_or_init(ParsedCommand, factory) is first
    assert ext.get(ParsedCommand) is first and len(calls) == 1


def test_get_or_init_rejects_a_factory_result_of_the_wrong_type():
    ext = Context(_event()).ext
    with pytest.raises(TypeError):
        ext.get_or_init(ParsedCommand, lambda: "oops")
    assert ParsedCommand not in ext


# -- cancellation and deadline -----------------------------------------------------


def test_cancel_marks_only_this_context():
    a, b = Context(_event()), Context(_event())
    assert not a.cancelled
    a.cancel()
    assert a.cancelled and not b.cancelled


def test_past_deadline_means_cancelled():
    now = time.monotonic()
    past = Context(_event(), deadline=now - 1)
    future = Context(_event(), deadline=now + 3600)
    assert past.cancelled and past.remaining() == 0.0
    assert not future.cancelled and 3500 < future.remaining() <= 3600
    assert Context(_event()).remaining() is None


# -- clone -----------------------------------------------------------------------------


def test_clone_keeps_event_sender_dispatcher_deadline_span_and_capabilities():
    sender, caps = RecordingSender(), Capabilities(mute=True)

    class FakeDispatcher:
        def submit(self, chat_id, task):
            raise AssertionError("not used")

    dispatcher = FakeDispatcher()
    ctx = Context(_event(), sender=sender, dispatcher=dispatcher, capabilities=caps,
                  deadline=time.monotonic() + 60, span="the span", bot_id="bot")
    clone = ctx.clone()
    assert clone is not ctx and type(clone) is Context
    assert clone.event is ctx.event and clone.sender is sender
    assert clone.dispatcher is dispatcher and clone.get_platform_capabilities() is caps
    assert (clone.deadline, clone.span, clone.bot_id) == (ctx.deadline, "the span", "bot")


def test_clone_does_not_inherit_cancellation():
    ctx = Context(_event())
    clone = ctx.clone()
    ctx.cancel()
    assert ctx.cancelled and not clone.cancelled
    other = ctx.clone()  # cloned after the parent was cancelled
    assert not other.cancelled
    other.cancel()
    assert other.cancelled and not clone.cancelled


def test_clone_copies_the_string_store_and_shares_its_values():
    ctx = Context(_event())
    shared = []
    ctx.set("list", shared)
    ctx.set("n", 1)
    clone = ctx.clone()
    assert clone.all() == {"list": shared, "n": 1}
    assert clone.get("list") is shared
    clone.set("n", 2)
    clone.set("only_clone", 1)
    ctx.delete("list")
    assert ctx.all() == {"n": 1}
    assert clone.all() == {"list": shared, "n": 2, "only_clone": 1}


def test_clone_copies_the_typed_store_entry_by_entry():
    ctx = Context(_event())
    command = ParsedCommand("x")
    ctx.ext.set(command)
    clone = ctx.clone()
    assert clone.ext is not ctx.ext
    assert clone.ext.get(ParsedCommand) is command  # shared value
    clone.ext.set("clone only")
    ctx.ext.set(ParsedCommand("replaced"))
    assert str not in ctx.ext
    assert clone.ext.get(ParsedCommand) is command


def test_clone_of_an_unused_context_stays_lazy():
    clone = Context(_event()).clone()
    assert clone._values is None and clone._ext is None


def test_clone_does_not_copy_pending_rule_effects():
    ctx = Context(_event())
    ran = []
    ctx.defer_rule_effect(lambda: ran.append("parent"))
    clone = ctx.clone()
    clone.commit_pending_rule_effects()
    assert ran == []
    ctx.commit_pending_rule_effects()
    assert ran == ["parent"]


def test_clone_reuses_parsed_content():
    event = _counting_event()
    ctx = Context(event)
    assert ctx.message_content == "HELLO"
    assert ctx.clone().message_content == "HELLO"
    assert event.raw == [1]


# -- deferred rule effects -------------------------------------------------------------


def test_commit_runs_pending_effects_once_in_order():
    ctx = Context(_event())
    ran = []
    for i in range(3):
        ctx.defer_rule_effect(lambda i=i: ran.append(i))
    ctx.commit_pending_rule_effects()
    ctx.commit_pending_rule_effects()
    assert ran == [0, 1, 2]


def test_discard_drops_pending_effects_without_running_them():
    ctx = Context(_event())
    ran = []
    ctx.defer_rule_effect(lambda: ran.append(1))
    ctx.discard_pending_rule_effects()
    ctx.commit_pending_rule_effects()
    assert ran == []


def test_failing_effect_is_logged_and_the_others_still_run(caplog):
    ctx = Context(_event())
    ran = []

    def broken():
        raise RuntimeError("store down")

    ctx.defer_rule_effect(broken)
    ctx.defer_rule_effect(lambda: ran.append("after"))
    with caplog.at_level(logging.ERROR, logger="fastdispatch"):
        ctx.commit_pending_rule_effects()
    assert ran == ["after"]
    assert any(r.exc_info and "store down" in str(r.exc_info[1]) for r in caplog.records)


def test_defer_rule_effect_requires_a_callable():
    with pytest.raises(TypeError):
        Context(_event()).defer_rule_effect("not callable")


# -- capability probing ------------------------------------------------------------------


class DeleterSender(RecordingSender):
    def delete_message(self, chat_id, message_id):
        self.sent.append(("delete", chat_id, message_id))
        return "deleted"


class TypingSenderImpl(RecordingSender):
    def send_typing(self, chat_id):
        self.sent.append(("typing", chat_id))
        return "typing"


class MemberSender(RecordingSender):
    def get_group_members(self, chat_id):
        self.sent.append(("members", chat_id))
        return [SenderInfo("u1"), SenderInfo("u2")]


class MuterSender(RecordingSender):
    def mute(self, chat_id, user_id, seconds):
        self.sent.append(("mute", chat_id, user_id, seconds))
        return "muted"


_PROBES = [
    ("try_delete_message", ("m9",), DeleterSender, ("delete", "c1", "m9"), "deleted"),
    ("try_send_typing", (), TypingSenderImpl, ("typing", "c1"), "typing"),
    ("try_get_group_members", (), MemberSender, ("members", "c1"),
     [SenderInfo("u1"), SenderInfo("u2")]),
    ("try_mute_message_author", (30,), MuterSender, ("mute", "c1", "u1", 30), "muted"),
]


@pytest.mark.parametrize("method, args, sender_cls, call, result", _PROBES,
                         ids=[p[0] for p in _PROBES])
def test_try_calls_a_sender_that_implements_the_protocol(method, args, sender_cls, call,
                                                         result):
    sender = sender_cls()
    ctx = Context(_event(), sender=sender)
    assert getattr(ctx, method)(*args) == result
    assert sender.sent == [call]


@pytest.mark.parametrize("method, args, sender_cls, call, result", _PROBES,
                         ids=[p[0] for p in _PROBES])
def test_try_is_a_silent_no_op_without_the_protocol(method, args, sender_cls, call, result):
    # A sender with only send(), senders with every *other* ability, no sender.
    others = [cls for _, _, cls, _, _ in _PROBES if cls is not sender_cls]
    for sender in [RecordingSender(), None] + [cls() for cls in others]:
        ctx = Context(_event(), sender=sender)
        assert getattr(ctx, method)(*args) is None
        assert sender is None or sender.sent == []


def test_try_lets_the_platform_error_through():
    class FailingDeleter(RecordingSender):
        def delete_message(self, chat_id, message_id):
            raise PermissionError("not an admin")

    with pytest.raises(PermissionError):
        Context(_event(), sender=FailingDeleter()).try_delete_message("m1")


# -- replies ----------------------------------------------------------------------------


def test_reply_sends_to_the_events_chat_through_the_dispatcher(make_dispatcher):
    sender = RecordingSender()
    ctx = Context(_event(chat_id="chat-7"), sender=sender, dispatcher=make_dispatcher())
    fut = ctx.reply(TextMessage("pong"))
    assert isinstance(fut, Future)
    assert fut.result(timeout=5) == SendResult(message_id="1")
    assert sender.sent == [("chat-7", "chat-7", "pong")]


def test_reply_returns_before_the_send_runs(make_dispatcher):
    release = threading.Event()

    class SlowSender:
        def send(self, sc, request):
            release.wait(5)
            return SendResult("sent")

    ctx = Context(_event(), sender=SlowSender(), dispatcher=make_dispatcher())
    fut = ctx.reply_text("slow")
    assert not fut.done()
    release.set()
    assert fut.result(timeout=5) == SendResult("sent")


def test_reply_text_error_and_success_format_the_message(make_dispatcher):
    sender = RecordingSender()
    ctx = Context(_event(), sender=sender, dispatcher=make_dispatcher())
    futs = [ctx.reply_text("plain"), ctx.reply_error("failed"), ctx.reply_success("done")]
    for fut in futs:
        fut.result(timeout=5)
    assert [text for _, _, text in sender.sent] == ["plain", "❌ failed", "✅ done"]


def test_burst_of_replies_from_one_handler_is_delivered_in_order(make_dispatcher):
    sender = RecordingSender()
    dispatcher = make_dispatcher(max_inflight=8, queue_size=64)
    ctx = Context(_event(), sender=sender, dispatcher=dispatcher)
    other = Context(_event(chat_id="c2"), sender=sender, dispatcher=dispatcher)
    futs = []
    for i in range(60):
        futs.append(ctx.reply_text(str(i)))
        futs.append(other.reply_text(f"other {i}"))
    for fut in futs:
        fut.result(timeout=10)
    assert [text for chat, _, text in sender.sent if chat == "c1"] == [str(i) for i in range(60)]
    assert [text for chat, _, text in sender.sent if chat == "c2"] == [
        f"other {i}" for i in range(60)]


def test_reply_send_error_lands_in_the_future(make_dispatcher):
    class BrokenSender:
        def send(self, sc, request):
            raise ConnectionError("platform down")

    ctx = Context(_event(), sender=BrokenSender(), dispatcher=make_dispatcher())
    assert isinstance(ctx.reply_text("x").exception(timeout=5), ConnectionError)


def _failed_with(fut, exc_type):
    assert isinstance(fut, Future) and fut.done()
    assert isinstance(fut.exception(timeout=0), exc_type)


def test_reply_without_sender_is_an_already_failed_future(make_dispatcher):
    _failed_with(Context(_event(), dispatcher=make_dispatcher()).reply_text("x"), RuntimeError)


def test_reply_without_dispatcher_is_an_already_failed_future():
    _failed_with(Context(_event(), sender=RecordingSender()).reply_text("x"), RuntimeError)


def test_reply_to_a_full_chat_queue_is_an_already_failed_future(make_dispatcher):
    started, release = threading.Event(), threading.Event()

    class BlockingSender:
        def send(self, sc, request):
            started.set()
            release.wait(5)
            return SendResult()

    ctx = Context(_event(), sender=BlockingSender(),
                  dispatcher=make_dispatcher(queue_size=1))
    running = ctx.reply_text("running")
    assert started.wait(5)
    waiting = ctx.reply_text("waiting")
    _failed_with(ctx.reply_text("one too many"), QueueFull)
    release.set()
    assert running.result(timeout=5) == waiting.result(timeout=5) == SendResult()


def test_reply_after_dispatcher_closed_is_an_already_failed_future(make_dispatcher):
    dispatcher = make_dispatcher()
    dispatcher.close()
    ctx = Context(_event(), sender=RecordingSender(), dispatcher=dispatcher)
    _failed_with(ctx.reply_text("late"), DispatcherClosed)


def test_reply_turns_any_other_error_into_an_already_failed_future():
    class ExplodingDispatcher:
        def submit(self, chat_id, task):
            raise MemoryError("no room")

    ctx = Context(_event(), sender=RecordingSender(), dispatcher=ExplodingDispatcher())
    _failed_with(ctx.reply_text("x"), MemoryError)


@pytest.mark.parametrize("call", [
    lambda ctx: ctx.reply("a str, not a TextMessage"),
    lambda ctx: ctx.reply(None),
    lambda ctx: ctx.reply_text(42),
    lambda ctx: ctx.reply_error(None),
    lambda ctx: ctx.reply_success(b"bytes"),
])
def test_reply_with_a_bad_message_is_an_already_failed_future(make_dispatcher, call):
    sender = RecordingSender()
    ctx = Context(_event(), sender=sender, dispatcher=make_dispatcher())
    _failed_with(call(ctx), TypeError)
    assert sender.sent == []


def test_fastdispatch_imports_and_works_without_opentelemetry():
    code = textwrap.dedent("""
        import sys

        class BlockOpenTelemetry:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError("blocked: " + name)

        sys.meta_path.insert(0, BlockOpenTelemetry())
        import fastdispatch
        from fastdispatch.context import Context
        from fastdispatch.platform import ChatInfo, Event, SenderInfo
        ctx = Context(Event("t", ChatInfo("c"), SenderInfo("u")))
        assert ctx.span is None
        assert ctx.clone().span is None
        assert not any(m.startswith("opentelemetry") for m in sys.modules)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
