"""What a chat platform looks like to fastdispatch.

The value types (:class:`ChatInfo`, :class:`SenderInfo`, :class:`Event`,
:class:`TextMessage`, :class:`SendRequest`, :class:`SendResult`,
:class:`Capabilities`) are frozen dataclasses: an event is shared between a
Context and its clones, possibly on several threads, so nothing in it may
change after it was made.

A platform adapter supplies one object, the *sender*.  It must implement
:class:`Sender`; everything else a platform may or may not be able to do is a
separate, small protocol (:class:`MessageDeleter`, :class:`TypingSender`,
:class:`GroupMemberLister`, :class:`MessageAuthorMuter`).  A sender
implements the ones its platform supports and nothing more; the Context's
``try_*`` methods probe for them with ``isinstance`` and quietly do nothing
when a protocol is missing, so plugins need no per-platform branches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, List, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from . import SendContext

__all__ = [
    "ChatInfo",
    "SenderInfo",
    "Event",
    "TextMessage",
    "SendRequest",
    "SendResult",
    "Capabilities",
    "Sender",
    "MessageDeleter",
    "TypingSender",
    "GroupMemberLister",
    "MessageAuthorMuter",
]


@dataclass(frozen=True)
class ChatInfo:
    """A conversation: a private chat or a group.

    ``id`` is the platform's chat id; it is also the key under which replies
    to this chat are ordered by the dispatcher.
    """

    id: str
    is_group: bool = False
    name: str = ""


@dataclass(frozen=True)
class SenderInfo:
    """The user who sent an event."""

    id: str
    display_name: str = ""


@dataclass(frozen=True)
class Event:
    """One incoming event (usually a message) as the adapter received it.

    ``raw`` is the platform's own payload, kept for adapters and handlers that
    need more than the common fields; it takes no part in ``==`` or ``repr``.
    """

    platform: str
    chat: ChatInfo
    sender: SenderInfo
    text: str = ""
    message_id: str = ""
    kind: str = "message"
    raw: Any = field(default=None, compare=False, repr=False)

    def content(self) -> str:
        """Return the message as plain text: ``text`` without surrounding
        whitespace.

        Adapters whose platform sends markup, mentions or attachments override
        this.  Handlers should read ``ctx.message_content`` instead, which
        calls ``content()`` at most once per Context however many rules ask.
        """
        return self.text.strip()


@dataclass(frozen=True)
class TextMessage:
    """An outbound plain-text message."""

    text: str


@dataclass(frozen=True)
class SendRequest:
    """What :meth:`Sender.send` is asked to deliver: a message and its chat."""

    target: ChatInfo
    message: TextMessage


@dataclass(frozen=True)
class SendResult:
    """What the platform answered to a send: the new message's id (if the
    platform gives one) and its raw response."""

    message_id: str = ""
    raw: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Capabilities:
    """What the platform(s) behind an engine can do, for graceful degradation.

    A plugin that would rather not offer a feature at all than have it
    silently do nothing checks these (``ctx.get_platform_capabilities()``);
    one that is happy with "best effort" just calls the ``try_*`` methods.
    """

    delete_message: bool = False
    typing: bool = False
    group_members: bool = False
    mute: bool = False
    markdown: bool = False
    embeds: bool = False


@runtime_checkable
class Sender(Protocol):
    """The one thing every platform adapter provides.

    ``send`` runs on a dispatcher worker thread, never two at a time for the
    same chat, under the task's deadline: a long call should look at
    ``sc.remaining()`` or ``sc.cancelled`` (see ``SendContext``).
    """

    def send(self, sc: SendContext, request: SendRequest) -> SendResult: ...


@runtime_checkable
class MessageDeleter(Protocol):
    """Optional: the platform can delete a message."""

    def delete_message(self, chat_id: str, message_id: str) -> Any: ...


@runtime_checkable
class TypingSender(Protocol):
    """Optional: the platform can show a "typing..." indicator."""

    def send_typing(self, chat_id: str) -> Any: ...


@runtime_checkable
class GroupMemberLister(Protocol):
    """Optional: the platform can list the members of a group chat."""

    def get_group_members(self, chat_id: str) -> List[SenderInfo]: ...


@runtime_checkable
class MessageAuthorMuter(Protocol):
    """Optional: the platform can mute a user in a chat for some seconds."""

    def mute(self, chat_id: str, user_id: str, seconds: float) -> Any: ...
