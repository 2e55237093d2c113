"""Names and layout shared by producers and workers: one place decides them.

A stream ``S`` holds every message on a subject ``S.<shard>.<chat token>``;
the shard is a stable hash of the chat id (CRC-32, the same in every process
and Python version), so all messages of a chat land in one shard.  Each shard
has one durable pull consumer (``shard-<n>``) with ``max_ack_pending=1`` and
explicit acks: the NATS server lets one message per shard be in flight across
all workers, which is what keeps a chat in order without any coordination
between workers.  The stream uses work-queue retention (a message is removed
once acknowledged) and records its shard count in its metadata, so workers
learn it from the server instead of a flag that could disagree.

Failed-for-good messages go to a second stream ``S_dead`` (subjects
``S_dead.<shard>.<chat token>``), kept for a week for inspection.

Whichever side comes first (producer or worker) creates the streams and the
consumers; both do it idempotently (create if missing, verify if present).
"""

import base64
import re
import urllib.parse
import zlib

from .._netnum import parse_int

__all__ = [
    "DEFAULT_SHARDS", "DEFAULT_ACK_WAIT", "ShardMismatch", "shard_of", "chat_token",
    "subject_for", "dead_subject_for", "consumer_name", "ensure_topology",
    "HDR_CHAT", "HDR_KEY", "HDR_ERROR", "HDR_ATTEMPTS", "HDR_SEQ", "HDR_WORKER",
    "HDR_CHAT_ENCODING", "HDR_PAYLOAD_DROPPED", "chat_headers", "chat_from_headers",
    "DEAD_LETTER_ROOM", "MAX_ERROR_BYTES", "headers_size",
]

# 128 shards: enough for Telegram's 30 messages/s bot limit with 1 message/s
# per chat and a 4x margin for hash collisions (docs/cluster.md, "Sizing").
DEFAULT_SHARDS = 128
# How long a crashed worker's chats wait for another worker: JetStream's own
# default (30 s) is too long for a chat bot; a live worker's long sends stay
# claimed by 'in progress' acks every ack_wait / 3 (docs/cluster.md).
DEFAULT_ACK_WAIT = 6.0
SHARDS_METADATA = "fastdispatch.shards"
DEAD_MAX_AGE = 7 * 24 * 3600.0
DUPLICATE_WINDOW = 120.0

HDR_CHAT = "Fd-Chat"
HDR_KEY = "Fd-Key"
HDR_ERROR = "Fd-Error"
HDR_ATTEMPTS = "Fd-Attempts"
HDR_SEQ = "Fd-Stream-Seq"
HDR_WORKER = "Fd-Worker"
# "pct": Fd-Chat holds the chat id percent-encoded (see chat_headers)
HDR_CHAT_ENCODING = "Fd-Chat-Encoding"
# On a dead letter stored without its payload: the payload's size in bytes
HDR_PAYLOAD_DROPPED = "Fd-Payload-Dropped"
# Bytes every message leaves free under the server's max_payload for what its
# dead letter adds (error text, worker, sequence, ...; the error is cut to
# MAX_ERROR_BYTES), so that a message that fails for good can be stored.
MAX_ERROR_BYTES = 4000
DEAD_LETTER_ROOM = 8192


def headers_size(headers):
    """Bytes NATS puts on the wire for ``headers`` (they count towards max_payload)."""
    return 12 + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())

_STREAM_NAME = re.compile(r"^[A-Za-z0-9_-]{1,200}$")
_PLAIN_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def chat_headers(chat_id):
    """The headers that carry ``chat_id`` so that it arrives exactly as published.

    NATS header values lose what a header line cannot hold (leading and
    trailing white space is trimmed, CR/LF end the line): ``' dup'`` and
    ``'dup '`` would both arrive as ``'dup'``.  An id that is printable and
    has no white space at its ends travels as it is; any other is
    percent-encoded (all ASCII), which ``Fd-Chat-Encoding: pct`` says.
    """
    if chat_id.isprintable() and chat_id == chat_id.strip():
        return {HDR_CHAT: chat_id}
    return {HDR_CHAT: urllib.parse.quote(chat_id, safe=""), HDR_CHAT_ENCODING: "pct"}


def chat_from_headers(headers):
    """The chat id ``chat_headers`` sent, or None when the headers hold none."""
    chat = headers.get(HDR_CHAT)
    if chat and headers.get(HDR_CHAT_ENCODING) == "pct":
        return urllib.parse.unquote(chat, errors="strict")
    return chat or None


def require_clients(*names):
    """Import nats-py / redis-py, or say which extra brings them."""
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            dist = {"nats": "nats-py"}.get(name, name)
            raise ImportError("fastdispatch.cluster needs %s (import %r failed): "
                              "pip install 'fastdispatch[cluster]'" % (dist, name)) from exc


class ShardMismatch(ValueError):
    """The stream exists with another shard count than the one asked for."""


def check_stream_name(stream):
    if not isinstance(stream, str):
        raise TypeError("stream must be a str, got %r" % (type(stream).__name__,))
    if not _STREAM_NAME.match(stream):
        raise ValueError("stream must be 1-200 letters, digits, '_' or '-', got %r" % (stream,))
    return stream


def check_shards(shards):
    if isinstance(shards, bool) or not isinstance(shards, int):
        raise TypeError("shards must be an int, got %r" % (type(shards).__name__,))
    if not 1 <= shards <= 65536:
        raise ValueError("shards must be between 1 and 65536, got %r" % (shards,))
    return shards


def shard_of(chat_id, shards):
    """The shard of a chat: CRC-32 of its UTF-8 id, modulo ``shards``."""
    return zlib.crc32(chat_id.encode("utf-8")) % shards


def chat_token(chat_id):
    """A subject token for a chat id: itself when it is plain, else base64url.

    Subject tokens may not hold ``.``, ``*``, ``>`` or white space; a chat id
    that does is encoded (prefixed with ``~``).  The exact id always travels
    in the ``Fd-Chat`` header too; the token is for people reading subjects.
    """
    if _PLAIN_TOKEN.match(chat_id):
        return chat_id
    raw = chat_id.encode("utf-8")[:180]
    return "~" + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def subject_for(stream, shard, chat_id):
    return "%s.%d.%s" % (stream, shard, chat_token(chat_id))


def dead_stream(stream):
    return stream + "_dead"


def dead_subject_for(stream, shard, chat_id):
    return "%s.%d.%s" % (dead_stream(stream), shard, chat_token(chat_id))


def consumer_name(shard):
    return "shard-%d" % (shard,)


async def topology_missing(js, stream, shards, created=None):
    """What of the stream's topology is gone from the server (a list; empty: all there).

    A NATS server restarted without its store has lost the stream, its
    consumers and every message it held; nothing else says so.  ``created``:
    the stream's creation time as first seen; a stream created since (by
    another process that found it gone) counts as gone too.
    """
    from nats.js.errors import NotFoundError

    info = await _stream_info_or_none(js, stream)
    if info is None:
        return ["stream %r" % (stream,)]
    if created is not None and info.created != created:
        return ["stream %r (made again since)" % (stream,)]
    missing = []
    for shard in range(shards):
        try:
            await js.consumer_info(stream, consumer_name(shard))
        except NotFoundError:
            missing.append("consumer %r" % (consumer_name(shard),))
    return missing


async def stream_created(js, stream):
    """When the stream was created (None when it does not exist)."""
    info = await _stream_info_or_none(js, stream)
    return None if info is None else info.created


async def _stream_info_or_none(js, name):
    from nats.js.errors import NotFoundError

    try:
        return await js.stream_info(name)
    except NotFoundError:
        return None


async def ensure_topology(js, stream, shards=None, ack_wait=DEFAULT_ACK_WAIT):
    """Create (or verify) the work stream, its shard consumers and the dead-letter stream.

    ``shards=None``: the stream must exist already or is created with
    ``DEFAULT_SHARDS``; the shard count actually in force is returned.  A
    stream that exists with another shard count raises :class:`ShardMismatch`
    (changing it would reorder chats: drain the stream and recreate it).
    Existing consumers are left as they are (their ``ack_wait`` included).
    """
    from nats.js.api import (AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy,
                             StorageType, StreamConfig)
    from nats.js.errors import BadRequestError

    info = await _stream_info_or_none(js, stream)
    if info is None:
        want = DEFAULT_SHARDS if shards is None else shards
        config = StreamConfig(
            name=stream,
            subjects=["%s.*.*" % (stream,)],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            duplicate_window=DUPLICATE_WINDOW,
            metadata={SHARDS_METADATA: str(want)},
            description="fastdispatch work stream (%d shards)" % (want,),
        )
        try:
            await js.add_stream(config)
        except BadRequestError:
            # Someone else created it at the same moment: verify below.
            pass
        info = await js.stream_info(stream)
    meta = info.config.metadata or {}
    if SHARDS_METADATA not in meta:
        raise ShardMismatch("stream %r exists but was not made by fastdispatch.cluster "
                            "(no %r in its metadata)" % (stream, SHARDS_METADATA))
    have = parse_int(meta[SHARDS_METADATA], lo=1, hi=65536)
    if have is None:
        raise ShardMismatch("stream %r has a shard count that is not a number (%r in its "
                            "metadata): drain it and recreate it" % (stream, SHARDS_METADATA))
    if shards is not None and have != shards:
        raise ShardMismatch("stream %r has %d shards, not %d: drain it and recreate it "
                            "to change the shard count" % (stream, have, shards))

    if await _stream_info_or_none(js, dead_stream(stream)) is None:
        try:
            await js.add_stream(StreamConfig(
                name=dead_stream(stream),
                subjects=["%s.>" % (dead_stream(stream),)],
                storage=StorageType.FILE,
                max_age=DEAD_MAX_AGE,
                duplicate_window=DUPLICATE_WINDOW,
                description="fastdispatch dead letters of %s" % (stream,),
            ))
        except BadRequestError:
            pass

    from nats.js.errors import NotFoundError
    for shard in range(have):
        name = consumer_name(shard)
        try:
            await js.consumer_info(stream, name)
            continue
        except NotFoundError:
            pass
        try:
            await js.add_consumer(stream, ConsumerConfig(
                durable_name=name,
                filter_subject="%s.%d.*" % (stream, shard),
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                max_ack_pending=1,
                ack_wait=ack_wait,
                max_deliver=-1,
            ))
        except BadRequestError:
            # Created concurrently by another process (same config).
            await js.consumer_info(stream, name)
    return have
