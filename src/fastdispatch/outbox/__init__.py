"""``fastdispatch.outbox``: a durable outbox, so that a crash loses no accepted reply.

``Outbox(path, dispatcher, *, senders)`` stores each reply in an SQLite
file before it is sent (``send`` returns once it is committed), sends it
through the dispatcher in the chat's order, and marks it once sent.  At the
next open, replies not marked are sent again first.  Guarantees and costs:
https://github.com/fastdispatch/fastdispatch/blob/main/docs/outbox.md
"""

from ._outbox import DeadLetter, Outbox, Ticket
from ._store import OutboxClosed, OutboxCorrupt, OutboxError, OutboxLocked

__all__ = ["Outbox", "Ticket", "DeadLetter", "OutboxError", "OutboxLocked", "OutboxCorrupt",
           "OutboxClosed"]
