"""``ClusterProducer``: puts messages for chats into the NATS JetStream work stream.

``publish`` is synchronous and thread safe: it hands the publish to the
producer's event-loop thread (nats-py is asyncio-only) and returns once the
server has stored the message (JetStream's publish acknowledgement), so a
message ``publish`` returned for survives any worker crash.  Messages of one
chat published one after the other (from one thread) are delivered in that
order.

The idempotency key travels as ``Nats-Msg-Id`` as well: publishing the same
key twice within the stream's duplicate window (2 minutes) stores it once,
so a caller may safely retry a ``publish`` whose outcome it did not learn.

What a failed ``publish`` means.  It raises :class:`ClusterUnavailable`
within ``publish_timeout`` (plus a second); the message may then be stored
or not: nats-py keeps a message it could not write in its buffer and sends
it once it reconnects.  A retry is safe by default: publishing the same
payload to the same chat again with ``key=None`` reuses the key of the
failed attempt (the producer remembers the keys of its failed publishes,
the newest 10,000, until one with that key succeeds), so the stream stores
it once; the key is also on the exception (``exc.key``).
"""

import asyncio
import collections
import hashlib
import logging
import threading
import uuid

from ._loop import LoopThread
from ._topology import (DEAD_LETTER_ROOM, DEFAULT_ACK_WAIT, DEFAULT_SHARDS, HDR_KEY, chat_headers,
                        check_shards, check_stream_name, ensure_topology, headers_size,
                        require_clients, shard_of, subject_for, topology_missing)

__all__ = ["ClusterProducer", "ClusterUnavailable"]


class ClusterUnavailable(ConnectionError):
    """NATS (or Redis) could not be reached; the message says which and where.

    Raised by ``publish``, ``key`` is the failed message's idempotency key
    (else None): the message may still be stored, publish it again with it.
    """

    def __init__(self, *args, key=None):
        super().__init__(*args)
        self.key = key


_UNCONFIRMED_MAX = 10_000

log = logging.getLogger("fastdispatch.cluster")


def _retry_key(chat_id, payload):
    return chat_id, hashlib.sha256(payload).digest()


def _check_chat_id(chat_id):
    if chat_id is None or isinstance(chat_id, bool):
        raise TypeError("chat_id must be a str or an int, got %r" % (chat_id,))
    if isinstance(chat_id, int):
        chat_id = str(chat_id)
    if not isinstance(chat_id, str):
        raise TypeError("chat_id must be a str or an int, got %r" % (type(chat_id).__name__,))
    if not chat_id:
        raise ValueError("chat_id must not be empty")
    return chat_id


class ClusterProducer:
    """Publishes ``(chat_id, payload)`` into stream ``stream`` for the workers.

    ``ClusterProducer(nats_url="nats://127.0.0.1:4222", stream="fastdispatch",
    shards=128, connect_timeout=5.0, publish_timeout=5.0)``.  The stream, its
    shard consumers and the dead-letter stream are created if missing; a
    stream that exists with another shard count raises ``ValueError``
    (``ShardMismatch``).  NATS unreachable raises :class:`ClusterUnavailable`
    (a ``ConnectionError``) naming the URL.

    Cost: one round trip to the NATS server per ``publish``.
    """

    def __init__(self, nats_url="nats://127.0.0.1:4222", stream="fastdispatch",
                 shards=DEFAULT_SHARDS, *, connect_timeout=5.0, publish_timeout=5.0,
                 ack_wait=DEFAULT_ACK_WAIT):
        if not isinstance(nats_url, str) or not nats_url:
            raise TypeError("nats_url must be a non-empty str, got %r" % (nats_url,))
        self.stream = check_stream_name(stream)
        self.shards = check_shards(shards)
        require_clients("nats")
        self.nats_url = nats_url
        self._publish_timeout = float(publish_timeout)
        self._ack_wait = float(ack_wait)
        # (chat id, sha-256 of the payload) -> key of a publish that failed
        # (it may be stored): a retry with key=None reuses it.
        self._unconfirmed = collections.OrderedDict()
        self._unconfirmed_lock = threading.Lock()   # guards _unconfirmed
        self._loop = LoopThread("fastdispatch-producer-loop")
        self._nc = None
        try:
            self._nc, self._js = self._loop.run(
                self._connect(float(connect_timeout), float(ack_wait)))
        except BaseException:
            self._loop.stop()
            raise

    async def _connect(self, connect_timeout, ack_wait):
        import nats

        errors = []

        async def remember(exc):  # nats-py reports each failed attempt here
            errors.append(exc)

        try:
            # nats-py retries an unreachable server by itself (and reconnects
            # later on); the first connection gets connect_timeout in all.
            nc = await asyncio.wait_for(
                nats.connect(self.nats_url, connect_timeout=connect_timeout,
                             max_reconnect_attempts=-1, allow_reconnect=True,
                             reconnect_time_wait=0.5, error_cb=remember),
                connect_timeout)
        except (Exception, asyncio.TimeoutError) as exc:
            cause = errors[-1] if errors else exc
            raise ClusterUnavailable("cannot reach NATS at %s: %s"
                                     % (self.nats_url, cause or type(cause).__name__)) from exc
        js = nc.jetstream(timeout=self._publish_timeout)
        try:
            await ensure_topology(js, self.stream, self.shards, ack_wait=ack_wait)
        except BaseException:
            await nc.close()
            raise
        return nc, js

    def shard_of(self, chat_id):
        """The shard a chat's messages go to."""
        return shard_of(_check_chat_id(chat_id), self.shards)

    def publish(self, chat_id, payload, *, key=None):
        """Store one message for ``chat_id``; returns its idempotency key.

        ``payload`` is bytes; ``key`` a str (default: a new uuid4 hex).  The
        worker hands ``key`` to the sender and records it in Redis after the
        send, so the message is not sent again after a redelivery.
        """
        chat_id = _check_chat_id(chat_id)
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError("payload must be bytes, got %r" % (type(payload).__name__,))
        payload = bytes(payload)
        # (chat id, payload digest): computed only while a failed publish is
        # remembered, or when this one fails -- not on every publish.
        retry_of = None
        if key is None:
            if self._unconfirmed:
                retry_of = _retry_key(chat_id, payload)
                with self._unconfirmed_lock:
                    key = self._unconfirmed.get(retry_of)
            key = key or uuid.uuid4().hex
        elif not isinstance(key, str) or not key:
            raise TypeError("key must be a non-empty str or None, got %r" % (key,))
        elif not (key.isprintable() and key == key.strip() and key.isascii()):
            # It travels as a header and as Nats-Msg-Id, and names a Redis key:
            # refused rather than changed on the way (two keys must not merge).
            raise ValueError("key must be printable ASCII with no white space at its ends, "
                             "got %r" % (key,))
        if self._nc is None:
            raise ClusterUnavailable("ClusterProducer is closed")
        subject = subject_for(self.stream, shard_of(chat_id, self.shards), chat_id)
        headers = dict(chat_headers(chat_id), **{HDR_KEY: key, "Nats-Msg-Id": key})
        size = len(payload) + headers_size(headers) + DEAD_LETTER_ROOM
        if size > self._nc.max_payload:
            # Headers count towards the server's limit (the client checks only
            # the payload): too big a message would make the server drop the
            # connection of every worker that fails it and tries to store its
            # dead letter.
            raise ValueError("payload of %d bytes is too big: with its headers and %d bytes "
                             "kept free for a dead letter's, a message must fit the NATS "
                             "server's max_payload (%d bytes)"
                             % (len(payload), DEAD_LETTER_ROOM, self._nc.max_payload))
        try:
            self._loop.run(self._publish(subject, payload, headers),
                           timeout=self._publish_timeout + 1.0)
        except Exception as exc:
            retry_of = retry_of or _retry_key(chat_id, payload)
            with self._unconfirmed_lock:
                self._unconfirmed[retry_of] = key
                self._unconfirmed.move_to_end(retry_of)
                while len(self._unconfirmed) > _UNCONFIRMED_MAX:
                    self._unconfirmed.popitem(last=False)
            raise ClusterUnavailable(
                "publish to NATS at %s did not complete within %g s (%s): the message may "
                "still be stored; publishing it again (key=None reuses this key, %s) stores "
                "it once" % (self.nats_url, self._publish_timeout,
                             exc or type(exc).__name__, key), key=key) from exc
        if self._unconfirmed:
            retry_of = retry_of or _retry_key(chat_id, payload)
            with self._unconfirmed_lock:
                self._unconfirmed.pop(retry_of, None)
        return key

    async def _publish(self, subject, payload, headers):
        # The whole publish within publish_timeout: nats-py's own timeout
        # covers the wait for the acknowledgement, not a client that is
        # reconnecting.
        return await asyncio.wait_for(self._publish_or_remake(subject, payload, headers),
                                      self._publish_timeout)

    async def _publish_or_remake(self, subject, payload, headers):
        """Publish; if the stream turns out gone (a server that lost its store), remake it once."""
        try:
            return await self._js.publish(subject, payload, stream=self.stream, headers=headers,
                                          timeout=self._publish_timeout)
        except Exception:
            if await topology_missing(self._js, self.stream, 0) == []:
                raise
        log.error("stream %r is gone from NATS at %s (a server restarted without its "
                  "store?): the messages it held that were not sent yet are lost; "
                  "recreating it", self.stream, self.nats_url)
        await ensure_topology(self._js, self.stream, self.shards, ack_wait=self._ack_wait)
        return await self._js.publish(subject, payload, stream=self.stream, headers=headers,
                                      timeout=self._publish_timeout)

    def close(self):
        """Flush and disconnect; ``publish`` raises afterwards."""
        nc, self._nc = self._nc, None
        if nc is not None:
            try:
                self._loop.run(nc.close(), timeout=10)
            finally:
                self._loop.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
