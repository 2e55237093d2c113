"""Platform types and protocols."""

import dataclasses

import pytest

import fastdispatch
from fastdispatch.platform import (
    Capabilities,
    ChatInfo,
    Event,
    GroupMemberLister,
    MessageAuthorMuter,
    MessageDeleter,
    Sender,
    SenderInfo,
    SendRequest,
    SendResult,
    TextMessage,
    TypingSender,
)


def _event(text=""):
    return Event("test", ChatInfo("c1"), SenderInfo("u1"), text=text)


def test_public_names_are_exported_from_the_package():
    for name in (
        "ChatInfo", "SenderInfo", "Event", "TextMessage", "SendRequest",
        "SendResult", "Capabilities", "Sender", "MessageDeleter",
        "TypingSender", "GroupMemberLister", "MessageAuthorMuter",
        "Context", "Engine",
    ):
        assert hasattr(fastdispatch, name), name
    from fastdispatch import rules  # noqa: F401
    from fastdispatch.context import ReservedKeyError  # noqa: F401


def test_constructors_and_defaults_match_the_contract():
    chat = ChatInfo("c1")
    assert (chat.id, chat.is_group, chat.name) == ("c1", False, "")
    assert (SenderInfo("u1").id, SenderInfo("u1").display_name) == ("u1", "")
    event = Event("tg", chat, SenderInfo("u1"))
    assert (event.platform, event.text, event.message_id, event.kind, event.raw) == (
        "tg", "", "", "message", None)
    assert TextMessage("hi").text == "hi"
    request = SendRequest(target=chat, message=TextMessage("hi"))
    assert request.target is chat and request.message == TextMessage("hi")
    assert (SendResult().message_id, SendResult().raw) == ("", None)
    assert dataclasses.astuple(Capabilities()) == (False,) * 6
    caps = Capabilities(delete_message=True, typing=True, group_members=True,
                        mute=True, markdown=True, embeds=True)
    assert dataclasses.astuple(caps) == (True,) * 6


@pytest.mark.parametrize("value, field", [
    (ChatInfo("c1"), "id"),
    (SenderInfo("u1"), "id"),
    (_event(), "text"),
    (TextMessage("x"), "text"),
    (SendRequest(ChatInfo("c1"), TextMessage("x")), "message"),
    (SendResult("m1"), "message_id"),
    (Capabilities(), "typing"),
])
def test_value_types_are_immutable(value, field):
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, field, "changed")


def test_value_types_compare_by_value_and_hash():
    assert ChatInfo("c1", True, "g") == ChatInfo("c1", True, "g")
    assert ChatInfo("c1") != ChatInfo("c2")
    assert len({_event("a"), _event("a"), _event("b")}) == 2


def test_raw_payload_takes_no_part_in_equality_or_repr():
    a = Event("t", ChatInfo("c"), SenderInfo("u"), text="x", raw={"secret": 1})
    b = Event("t", ChatInfo("c"), SenderInfo("u"), text="x", raw=None)
    assert a == b and hash(a) == hash(b)
    assert "secret" not in repr(a)
    assert SendResult("m", raw=[1]) == SendResult("m", raw=[2])


def test_default_content_strips_surrounding_whitespace_only():
    assert _event("  /echo  a  b \n").content() == "/echo  a  b"
    assert _event("").content() == ""


def test_adapters_override_content():
    class MarkupEvent(Event):
        def content(self):
            return self.text.replace("<b>", "").replace("</b>", "")

    event = MarkupEvent("t", ChatInfo("c"), SenderInfo("u"), text="<b>hi</b>")
    assert event.content() == "hi"
    assert isinstance(event, Event)


class _BareSender:
    def send(self, sc, request):
        return SendResult()


class _FullSender(_BareSender):
    def delete_message(self, chat_id, message_id):
        pass

    def send_typing(self, chat_id):
        pass

    def get_group_members(self, chat_id):
        return []

    def mute(self, chat_id, user_id, seconds):
        pass


_OPTIONAL = [MessageDeleter, TypingSender, GroupMemberLister, MessageAuthorMuter]


def test_sender_protocol_accepts_any_object_with_send():
    assert isinstance(_BareSender(), Sender)
    assert not isinstance(object(), Sender)


@pytest.mark.parametrize("protocol", _OPTIONAL, ids=lambda p: p.__name__)
def test_optional_abilities_are_runtime_checkable_protocols(protocol):
    assert isinstance(_FullSender(), protocol)
    assert not isinstance(_BareSender(), protocol)
    assert not isinstance(None, protocol)
