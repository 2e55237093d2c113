"""One message of a ``ClusterWorker``, in order: the idempotency check, the
send through the dispatcher, then the acknowledgement or the dead letter.

``ClusterWorker`` (``_worker.py``) is the process: its connections, the
topology, one fetch loop per shard, the stop.  It mixes in
:class:`_MessageSteps`, this module, for what happens to each message it
fetches (the steps are listed in ``_worker.py``'s docstring).  The steps
run on the worker's event-loop thread, except :meth:`_MessageSteps._send_task`,
which a dispatcher worker thread runs.  They use these fields of the worker:
``stats``, ``stream``, ``redis_url``, the clients ``_redis`` (sync, for the
send task), ``_aredis``, ``_nc`` and ``_js``, ``_dispatcher``, ``_limiter``,
``_sender``, ``_done_prefix``, ``_key_ttl``, ``_guard``, ``_identity``,
``_progress_every`` and ``_fence_after``, and its helpers ``_warn``,
``_sleep_or_stop`` and ``_stopping``.
"""

import asyncio
import functools
import logging
import time

from .._errors import Cancelled, DispatcherClosed
from ._topology import (HDR_CHAT, HDR_ERROR, HDR_KEY, HDR_PAYLOAD_DROPPED, HDR_SEQ, HDR_WORKER,
                        MAX_ERROR_BYTES, chat_from_headers, chat_headers, dead_stream,
                        dead_subject_for, headers_size)

log = logging.getLogger("fastdispatch.cluster")

HDR_DELIVERIES = "Fd-Deliveries"


class _RedisDown(Exception):
    """Raised by a send task when Redis cannot be asked for a start: hand back, wait."""


class _ClaimLost(Exception):
    """Raised by a send task instead of sending: the message may be another worker's now."""


class _Throttled(Exception):
    """The shared limiter's earliest start is further away than the task may wait."""

    def __init__(self, wait):
        super().__init__(wait)
        self.wait = wait


class _Claim:
    """A message being processed, and when the server last heard it is (``at``, monotonic).

    ``lost``: once the server went longer than the fence allows without
    hearing it (a loop held up, a paused process), the message may be
    another worker's: this worker must not send it, whatever it says later.
    """

    __slots__ = ("msg", "at", "lost")

    def __init__(self, msg):
        self.msg, self.at, self.lost = msg, time.monotonic(), False


class _Backoff:
    """Exponential back-off, 0.5 s doubling up to 10 s; ``reset()`` after a success."""

    def __init__(self, first=0.5, cap=10.0):
        self.first, self.cap, self.next = first, cap, first

    def delay(self):
        d, self.next = self.next, min(self.cap, self.next * 2)
        return d

    def reset(self):
        self.next = self.first


def _redis_errors():
    import redis.exceptions as rx

    return (rx.ConnectionError, rx.TimeoutError, rx.BusyLoadingError, OSError)


class _MessageSteps:
    """What a ``ClusterWorker`` does with one message (see the module docstring)."""

    async def _hand_back(self, msg):
        try:
            await msg.nak()
            self.stats.handed_back += 1
        except Exception:
            pass  # unacknowledged anyway: redelivered after ack_wait

    async def _with_progress(self, claim, awaitable):
        """Await ``awaitable``, telling the server every ack_wait/3 that the message is in progress.

        The clock is the message's (``claim.at``: its delivery or last
        'in progress'), not this call's: a message that goes through many
        short waits (a throttled start asked for again and again) is kept
        claimed as well as one that waits once.
        """
        fut = asyncio.ensure_future(awaitable)
        while True:
            wait = claim.at + self._progress_every - time.monotonic()
            if wait > 0:
                done, _ = await asyncio.wait({fut}, timeout=wait)
                if done:
                    return fut.result()
                continue
            now = time.monotonic()
            if now - claim.at > self._fence_after:
                claim.lost = True    # too late to tell the server: see _send_task
            claim.at = now
            try:
                await claim.msg.in_progress()
            except Exception as exc:
                self._warn("progress", "could not send 'in progress' for a message (%s)", exc)

    async def _already_sent(self, claim, key):
        """Ask Redis whether ``key`` was sent; waits out a Redis outage. None: hand back."""
        backoff = _Backoff()
        while True:
            try:
                return bool(await self._aredis.exists(self._done_prefix + key))
            except _redis_errors() as exc:
                delay = backoff.delay()
                self._warn("redis", "cannot reach Redis at %s (%s); retrying in %.1f s",
                           self.redis_url, exc or type(exc).__name__, delay)
                if await self._with_progress(claim, self._sleep_or_stop(delay)):
                    return None

    async def _process(self, shard, msg):
        claim = _Claim(msg)
        headers = msg.headers or {}
        key = headers.get(HDR_KEY)
        try:
            chat = chat_from_headers(headers)
        except UnicodeDecodeError:
            chat = None
        try:
            deliveries = msg.metadata.num_delivered
        except Exception:
            deliveries = 1
        if deliveries > 1:
            self.stats.redelivered += 1
        if not chat or not key:
            await self._dead_letter(shard, msg, chat or "?", key or "",
                                    ValueError("message without %s/%s headers" % (HDR_CHAT,
                                                                                 HDR_KEY)))
            return
        sent = await self._already_sent(claim, key)
        if sent is None:
            await self._hand_back(msg)
            return
        if sent:
            self.stats.skipped += 1
            await self._ack(msg)
            return
        recorded = await self._send(shard, claim, chat, key)
        if recorded is None:
            return
        if not recorded:
            try:
                await self._aredis.set(self._done_prefix + key, b"1", ex=self._key_ttl)
            except _redis_errors():
                # The send happened; the acknowledgement below is what stops a
                # second send, the key only covers a crash in between.
                pass
        self.stats.sent += 1
        await self._ack(msg)

    async def _send(self, shard, claim, chat, key):
        """Send the message through the dispatcher, asking again while Redis
        is down or the shared limiter's start is too far.  Whether the send
        task recorded the key (a bool) once it was sent; None when the
        message was handed back or dead-lettered instead."""
        msg = claim.msg
        task = functools.partial(self._send_task, chat, msg.data, key, claim)
        backoff = _Backoff()
        while True:
            try:
                fut = self._dispatcher.submit(chat, task)
            except DispatcherClosed:
                await self._hand_back(msg)
                return None
            try:
                return await self._with_progress(claim, asyncio.wrap_future(fut))
            except _ClaimLost:
                # Not sent: the server may have given the message to another
                # worker already; if not, it goes to one at once.
                self.stats.fenced += 1
                self._warn("fenced", "a send was not made: this worker had not told the "
                           "server for %.1f s that it still holds the message (its loop "
                           "was held up: an overloaded process?); handed back",
                           self._fence_after)
                await self._hand_back(msg)
                return None
            except _RedisDown as exc:
                wait = backoff.delay()
                self._warn("redis", "cannot reach Redis at %s (%s); retrying in %.1f s",
                           self.redis_url, exc, wait)
            except _Throttled as exc:
                self._note_late_answers()
                wait = max(0.05, exc.wait / 2)
            except (Cancelled, DispatcherClosed) as exc:
                if self._stopping:
                    await self._hand_back(msg)
                else:
                    await self._dead_letter(shard, msg, chat, key, exc)
                return None
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # the sender failed for good
                await self._dead_letter(shard, msg, chat, key, exc)
                return None
            if await self._with_progress(claim, self._sleep_or_stop(wait)):
                await self._hand_back(msg)
                return None

    def _note_late_answers(self):
        late = self._limiter.late_answers   # the limiter counts, under its lock
        if late != self.stats.late_answers:
            self.stats.late_answers = late
            self._warn("late", "this worker's sends kept starting later than half of "
                       "limit_guard (%.0f ms) after the shared limiter's decision (late "
                       "answers from Redis, or threads woken late): a start was given "
                       "back and is asked for again (this process is overloaded, or "
                       "Redis is far: raise --limit-guard)", self._guard * 1000)

    async def _ack(self, msg):
        try:
            await msg.ack()
        except Exception as exc:
            # Not acknowledged: redelivered after ack_wait; the idempotency key
            # stops a second send.
            self._warn("ack", "could not acknowledge a message (%s)", exc)

    async def _dead_letter(self, shard, msg, chat, key, exc):
        # One line (a header value cannot hold a line break), MAX_ERROR_BYTES at most.
        error = " ".join(("%s: %s" % (type(exc).__name__, exc)).split())
        error = error.encode("utf-8")[:MAX_ERROR_BYTES].decode("utf-8", "ignore")
        log.warning("message %s of chat %s failed for good (%s): to %s", key, chat, error,
                    dead_stream(self.stream))
        headers = dict(chat_headers(chat), **{HDR_KEY: key, HDR_ERROR: error,
                                              HDR_WORKER: self._identity})
        try:
            headers[HDR_SEQ] = str(msg.metadata.sequence.stream)
            headers[HDR_DELIVERIES] = str(msg.metadata.num_delivered)
        except Exception:
            pass
        if key:
            headers["Nats-Msg-Id"] = "dead:" + key
        subject = dead_subject_for(self.stream, shard, chat)
        data = msg.data
        # 64 bytes for what the JetStream publish adds (Nats-Expected-Stream).
        if len(data) + headers_size(headers) + 64 > self._nc.max_payload:
            # Published by something that did not keep room for this (a
            # producer that checks sizes refuses such messages): stored
            # without its payload rather than not at all -- a dead letter
            # too big for the server would cost this worker its connection,
            # and every worker after it.
            log.error("the dead letter of message %s is too big for the NATS server's "
                      "max_payload (%d bytes): stored without its %d-byte payload",
                      key, self._nc.max_payload, len(data))
            headers[HDR_PAYLOAD_DROPPED] = str(len(data))
            data = b""
        backoff = _Backoff()
        while True:
            try:
                await self._js.publish(subject, data, stream=dead_stream(self.stream),
                                       headers=headers)
                break
            except Exception as publish_exc:
                delay = backoff.delay()
                self._warn("dead", "cannot store a dead letter on NATS (%s); retrying in %.1f s",
                           publish_exc, delay)
                if await self._sleep_or_stop(delay) and self._stopping:
                    await self._hand_back(msg)
                    return
        self.stats.dead += 1
        await self._ack(msg)

    # -- in a dispatcher worker thread ------------------------------------

    def _send_task(self, chat, payload, key, claim, sc):
        """Reserve a start in the shared limiter, wait for it, send, record the key.

        Returns True when the key was recorded in Redis.  Right before the
        send, the fence: if the loop has not told the server for half of
        ack_wait that this worker still holds the message (``claim.at``),
        the server may give it to another worker, which would then send it
        too (a duplicate, and the chat's next message before a late copy):
        raises ``_ClaimLost`` instead of sending.
        """
        limiter = self._limiter
        if limiter.active:
            remaining = sc.remaining()
            # Leave at least half of the send's time for the send itself.
            max_wait = 300.0 if remaining is None else max(0.0, remaining / 2.0)
            try:
                wait = limiter.acquire(chat, sc, max_wait)
            except _redis_errors() as exc:
                raise _RedisDown("%s" % (exc or type(exc).__name__,)) from None
            if wait is not None:
                raise _Throttled(wait)
        if claim.lost or time.monotonic() - claim.at > self._fence_after:
            raise _ClaimLost()
        self._sender(sc, chat, payload, key)
        try:
            self._redis.set(self._done_prefix + key, b"1", ex=self._key_ttl)
            return True
        except _redis_errors():
            return False
