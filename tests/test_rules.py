"""Ready-made rules (``fastdispatch.rules``)."""

import pytest

from fastdispatch import rules
from fastdispatch.context import Context
from fastdispatch.engine import Engine
from fastdispatch.platform import ChatInfo, Event, SenderInfo
from fastdispatch.rules import Command


def _ctx(text="", chat_id="c1", sender_id="u1", is_group=False, platform="test", bot_id=""):
    event = Event(platform, ChatInfo(chat_id, is_group), SenderInfo(sender_id), text=text)
    return Context(event, bot_id=bot_id)


class FakeClock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


# -- on_command ----------------------------------------------------------------------


@pytest.mark.parametrize("text, args", [
    ("/echo", ""),
    ("  /echo  ", ""),
    ("/echo hello world", "hello world"),
    ("/echo\n  multi\nline  ", "multi\nline"),
])
def test_on_command_matches_first_word_and_stores_parsed_command(text, args):
    ctx = _ctx(text)
    assert rules.on_command("echo")(ctx) is True
    assert ctx.ext.get(Command) == Command("echo", args)


@pytest.mark.parametrize("text", ["", "echo", "/echoes", "/Echo", "say /echo", "//echo", "!echo"])
def test_on_command_ignores_other_messages(text):
    ctx = _ctx(text)
    assert rules.on_command("echo")(ctx) is False
    assert ctx.ext.get(Command) is None


def test_on_command_with_custom_prefix():
    assert rules.on_command("ban", prefix="!")(_ctx("!ban bob"))
    assert not rules.on_command("ban", prefix="!")(_ctx("/ban bob"))
    assert rules.on_command("help", prefix="")(_ctx("help me"))


def test_on_command_accepts_a_mention_of_this_bot_only():
    rule = rules.on_command("echo")
    ctx = _ctx("/echo@mybot hi", bot_id="mybot")
    assert rule(ctx) and ctx.ext.get(Command) == Command("echo", "hi")
    assert not rule(_ctx("/echo@otherbot hi", bot_id="mybot"))
    assert not rule(_ctx("/echo@mybot hi"))  # no bot id known: no mention matches


@pytest.mark.parametrize("name, prefix, exc", [
    ("", "/", ValueError),
    ("two words", "/", ValueError),
    (" echo", "/", ValueError),
    (5, "/", TypeError),
    ("echo", None, TypeError),
])
def test_on_command_rejects_bad_arguments(name, prefix, exc):
    with pytest.raises(exc):
        rules.on_command(name, prefix)


# -- on_keyword ----------------------------------------------------------------------


def test_on_keyword_matches_any_word_as_substring():
    rule = rules.on_keyword("hello", "bye")
    assert rule(_ctx("oh hello there"))
    assert rule(_ctx("goodbye"))
    assert not rule(_ctx("hi there"))


def test_on_keyword_is_case_sensitive_and_reads_parsed_content():
    class ShoutingEvent(Event):
        def content(self):
            return self.text.upper()

    rule = rules.on_keyword("HELLO")
    ctx = Context(ShoutingEvent("t", ChatInfo("c"), SenderInfo("u"), text="hello"))
    assert rule(ctx)
    assert not rule(_ctx("hello"))


@pytest.mark.parametrize("words, exc", [((), ValueError), (("",), ValueError),
                                        (("ok", 3), TypeError), ((None,), TypeError)])
def test_on_keyword_rejects_bad_arguments(words, exc):
    with pytest.raises(exc):
        rules.on_keyword(*words)


# -- chat kind -------------------------------------------------------------------------


def test_is_private_and_is_group_follow_the_chat_kind():
    private, group = _ctx(is_group=False), _ctx(is_group=True)
    assert rules.is_private()(private) and not rules.is_private()(group)
    assert rules.is_group()(group) and not rules.is_group()(private)


# -- on_cooldown --------------------------------------------------------------------------


def _check(rule, ctx):
    """Run a rule as the engine would for a matcher of this rule alone."""
    passed = rule(ctx)
    if passed:
        ctx.commit_pending_rule_effects()
    else:
        ctx.discard_pending_rule_effects()
    return passed


def test_cooldown_blocks_repeats_until_it_expires():
    clock = FakeClock()
    rule = rules.on_cooldown(10, clock=clock)
    assert _check(rule, _ctx())
    clock.now += 9.9
    assert not _check(rule, _ctx())
    clock.now += 0.1
    assert _check(rule, _ctx())
    assert not _check(rule, _ctx())


def test_cooldown_is_recorded_only_through_a_deferred_effect():
    clock = FakeClock()
    rule = rules.on_cooldown(10, clock=clock)
    ctx = _ctx()
    assert rule(ctx)
    # Until committed, nothing is spent: another event still passes.
    assert rule(_ctx())
    assert ctx._effects and len(ctx._effects) == 1
    ctx.commit_pending_rule_effects()
    assert not rule(_ctx())


def test_cooldown_not_spent_when_a_rule_is_called_outside_the_engine():
    rule = rules.on_cooldown(60, clock=FakeClock())
    for _ in range(3):
        assert rule(_ctx())  # nobody commits: the effects never run


def test_failed_check_spends_nothing():
    clock = FakeClock()
    rule = rules.on_cooldown(10, clock=clock)
    assert _check(rule, _ctx())
    clock.now += 5
    assert not _check(rule, _ctx())  # refused at t+5: must not restart the period
    clock.now += 5
    assert _check(rule, _ctx())


@pytest.mark.parametrize("key, same, different", [
    ("user", dict(sender_id="u1", chat_id="other"), dict(sender_id="u2")),
    ("user", dict(sender_id="u1"), dict(sender_id="u1", platform="other platform")),
    ("chat", dict(chat_id="c1", sender_id="other"), dict(chat_id="c2")),
    ("global", dict(chat_id="c9", sender_id="u9", platform="p9"), None),
    (lambda ctx: ctx.message_content, dict(text="x", sender_id="u9"), dict(text="y")),
])
def test_cooldown_is_kept_per_key(key, same, different):
    rule = rules.on_cooldown(10, key=key, clock=FakeClock())
    assert _check(rule, _ctx(text="x", chat_id="c1", sender_id="u1"))
    assert not _check(rule, _ctx(**{"text": "x", **same}))
    if different is not None:
        assert _check(rule, _ctx(**{"text": "x", **different}))


def test_each_on_cooldown_call_has_its_own_table():
    clock = FakeClock()
    a, b = rules.on_cooldown(10, clock=clock), rules.on_cooldown(10, clock=clock)
    assert _check(a, _ctx())
    assert _check(b, _ctx())


def test_cooldown_table_forgets_expired_keys():
    table = rules._Cooldowns(10.0)
    for i in range(1023):
        table.spend(("user", i), 0.0)
    assert len(table._last) == 1023
    table.spend("fresh", 100.0)  # the table reached its sweep size
    assert set(table._last) == {"fresh"}
    assert table.ready(("user", 1), 100.0) and not table.ready("fresh", 105.0)


def test_a_late_commit_never_moves_a_cooldown_back():
    table = rules._Cooldowns(10.0)
    table.spend("k", 50.0)
    table.spend("k", 45.0)  # an event checked earlier, committed later
    assert not table.ready("k", 59.0)


@pytest.mark.parametrize("seconds, key, exc", [
    (0, "user", ValueError),
    (-1, "user", ValueError),
    (float("nan"), "user", ValueError),
    ("10", "user", TypeError),
    (True, "user", TypeError),
    (10, "sender", ValueError),
    (10, 42, TypeError),
])
def test_on_cooldown_rejects_bad_arguments(seconds, key, exc):
    with pytest.raises(exc):
        rules.on_cooldown(seconds, key)


def test_on_cooldown_rejects_a_non_callable_clock():
    with pytest.raises(TypeError):
        rules.on_cooldown(1, clock=5)


# -- rules in the engine ----------------------------------------------------------------


def _event(text, sender_id="u1"):
    return Event("test", ChatInfo("c1"), SenderInfo(sender_id), text=text)


def test_cooldown_not_spent_by_a_matcher_whose_later_rule_failed(make_dispatcher):
    engine = Engine(make_dispatcher())
    handled = []

    @engine.on(rules.on_cooldown(60, clock=FakeClock()), rules.on_keyword("go"))
    def go(ctx):
        handled.append(ctx.message_content)

    assert engine.process_event(_event("nope"), None) == []
    assert engine.process_event(_event("go 1"), None) == [go]
    assert engine.process_event(_event("go 2"), None) == []
    assert handled == ["go 1"]


def test_cooldown_spent_only_by_the_matcher_that_handles_the_event(make_dispatcher):
    engine = Engine(make_dispatcher())
    cooldown = rules.on_cooldown(60, clock=FakeClock())
    seen = []

    @engine.on(cooldown, rules.is_group(), block=True)
    def group_only(ctx):
        seen.append("group")

    @engine.on(cooldown)
    def anywhere(ctx):
        seen.append("anywhere")

    # group_only's check passes the cooldown, then fails on is_group; the
    # event is handled by ``anywhere``, which spends the shared cooldown once.
    assert engine.process_event(_event("hi"), None) == [anywhere]
    assert engine.process_event(_event("hi"), None) == []
    assert seen == ["anywhere"]


def test_on_command_handler_reads_the_parsed_command(make_dispatcher):
    engine = Engine(make_dispatcher())
    got = []

    @engine.on(rules.on_command("echo"))
    def echo(ctx):
        got.append(ctx.ext.get(Command))

    engine.process_event(_event("/echo  some text "), None)
    assert got == [Command("echo", "some text")]
