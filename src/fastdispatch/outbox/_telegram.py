"""``run_polling(..., outbox=)`` and ``run_webhook(..., outbox=)``: updates confirmed once their replies are durable.

The engine's replies go through the sender the intake hands it.  With an
outbox, that sender is a :class:`DurableTelegramSender`: its ``send``
stores the reply in the outbox (returning once the row is committed)
instead of calling Telegram, so an update's replies count as done once they
are durable; the outbox then sends them through its dispatcher with the
real sender.  The poller already confirms an update's offset only once its
replies are done, so it now confirms it once they are durable; the webhook
answers 200 only once they are (:meth:`DurableTelegramSender.confirm_durable`).

A bot killed at any point therefore loses nothing: an update whose replies
were not all durable is not confirmed and comes again (its handlers run
again: a reply that was durable may then be stored twice), and a durable
reply not yet sent is sent by the next process at open.
"""

from typing import Any

from .._errors import RetryAfter
from ..platform import SendResult
from ..telegram._sender import TelegramSender
from ._store import OutboxError

__all__ = ["DurableTelegramSender", "durable_sender"]

#: How long the webhook waits for an update's replies to be durable before
#: answering 503 (Telegram then delivers the update again).
CONFIRM_TIMEOUT = 20.0


class DurableTelegramSender(TelegramSender):
    """The ``sender`` an intake gives the engine when it has an outbox.

    Everything but :meth:`send` is the wrapped ``TelegramSender``'s own (it
    shares its connection pool: getUpdates, the optional protocols);
    ``send`` stores ``sendMessage`` in the outbox.  A store that fails (a
    full disk) raises ``RetryAfter(1)``: the dispatcher retries it within
    its retry policy, and the update is not confirmed meanwhile."""

    def __init__(self, outbox: Any, sender: TelegramSender, name: str) -> None:
        # Not TelegramSender.__init__: the same sender, one method replaced.
        self.__dict__.update(sender.__dict__)
        self.outbox = outbox
        self.outbox_sender = name

    def send(self, sc: Any, request: Any) -> SendResult:
        chat_id = request.target.id
        try:
            ticket = self.outbox.send(chat_id, "sendMessage",
                                      {"chat_id": chat_id, "text": request.message.text},
                                      sender=self.outbox_sender)
        except OutboxError:
            raise RetryAfter(1.0) from None
        return SendResult(message_id="", raw=ticket)

    def confirm_durable(self, outcome: Any) -> bool:
        """Whether an update whose handling is ``outcome`` may be confirmed:
        every reply it queued is durable (waits up to ``CONFIRM_TIMEOUT``)."""
        return outcome.wait(CONFIRM_TIMEOUT) and outcome.delivered and outcome.failed == 0


def durable_sender(outbox: Any, sender: TelegramSender) -> DurableTelegramSender:
    """The sender run_polling/run_webhook give the engine with ``outbox``:
    ``sender`` must be one of the outbox's senders (the one its rows name)."""
    names = [name for name, s in outbox.senders.items() if s is sender]
    if not names:
        raise ValueError("outbox must have the run's sender among its senders (it sends the "
                         "stored replies with it)")
    return DurableTelegramSender(outbox, sender, names[0])
