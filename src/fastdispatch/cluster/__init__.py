"""fastdispatch.cluster: per-chat order and a shared rate budget across processes.

Sends travel through NATS JetStream (one durable pull consumer per shard with
``max_ack_pending=1``: the server keeps each chat in order across workers and
redelivers a crashed worker's message) and Redis holds what workers share
(the bot-wide and per-chat limits, as one atomic Lua script over Redis time;
idempotency keys).  Each worker process feeds an in-process
``OutboundDispatcher``.  Install with ``pip install fastdispatch[cluster]``;
``docs/cluster.md`` has the design, the guarantees and how to size it.

- :class:`ClusterProducer` puts messages into the stream.
- :class:`ClusterWorker` is what ``python -m fastdispatch.cluster worker``
  runs; it can also be embedded.
"""

from ._limiter import LIMIT_SCRIPT, SharedLimiter
from ._producer import ClusterProducer, ClusterUnavailable
from ._topology import (DEFAULT_ACK_WAIT, DEFAULT_SHARDS, ShardMismatch, chat_token,
                        dead_stream, shard_of)
from ._worker import ClusterWorker, WorkerStats

__all__ = [
    "ClusterProducer",
    "ClusterWorker",
    "ClusterUnavailable",
    "ShardMismatch",
    "SharedLimiter",
    "WorkerStats",
    "LIMIT_SCRIPT",
    "DEFAULT_SHARDS",
    "DEFAULT_ACK_WAIT",
    "shard_of",
    "chat_token",
    "dead_stream",
    "done_key",
]


def done_key(stream, key):
    """The Redis key a worker checks before a send and sets after it.

    A sender that writes this key itself, atomically with its own record of
    the send (e.g. in one MULTI/EXEC on the same Redis), closes the crash
    window: no message is then ever sent twice.
    """
    return "fastdispatch:{%s}:done:%s" % (stream, key)
