"""``ClusterWorker``: takes messages from NATS JetStream and sends them through an
in-process ``OutboundDispatcher``, sharing rate limits and idempotency keys in Redis.

Threads.  One asyncio event-loop thread per process talks to NATS (nats-py
is asyncio-only) and to Redis for the per-message bookkeeping
(``redis.asyncio``); the dispatcher's worker threads run the sends (with the
dispatcher's ``send_timeout`` and retries) and the shared limiter (a sync
``redis`` client: one atomic script per start).  The loop hands a send to
the dispatcher with ``submit`` (thread safe, never blocks) and awaits the
Future through ``asyncio.wrap_future``; nothing else crosses threads.

Per shard, one coroutine keeps a pull request open on the shard's durable
consumer (``fetch``: the server pushes the next message when there is one).
The consumer has ``max_ack_pending=1``, so across all workers at most one
message of a shard is out; the shard's next message is delivered only after
this one is acknowledged.  That is the whole ordering argument: no lease,
no lock between workers.

One message, in order:
1. idempotency check: ``EXISTS fastdispatch:{stream}:done:<key>`` (Redis);
   already sent: acknowledge, done.
2. ``dispatcher.submit(chat, task)``; the task reserves a start in the shared
   limiter (one Lua script over the global and the chat key, Redis time),
   sleeps until that start, calls the sender, records the key in Redis.  A
   ``RetryAfter`` or retryable error is retried by the dispatcher (docs/pacing.md).
3. While the Future is pending (a slow send, a reserved start further away,
   a ``RetryAfter`` being waited out) the worker sends "in progress" acks
   every ``ack_wait / 3``: the server does not redeliver a message that a
   live worker is still working on.
4. Success: acknowledge.  Failed for good (a non-retryable error, attempts
   spent, a ``RetryAfter`` over ``max_retry_after``, a send timeout): publish
   it to the dead-letter subject with the error, then acknowledge.

Failure handling.  NATS or Redis unreachable: the worker logs a clear error
naming the URL and keeps trying (NATS: nats-py's own reconnect loop, every
2 s; Redis: exponential back-off from 0.5 s up to 10 s); it never exits for
it and never acknowledges a message it could not send.  A
worker that dies (``kill -9``) leaves its messages unacknowledged: the server
redelivers them after ``ack_wait`` to another worker, still in order.

``SIGTERM``/``stop()``: stop fetching; messages in flight get ``grace``
seconds to finish (and are acknowledged as usual); what is still running
after that is handed back (``nak``: redelivered at once to another worker);
exit code 0.
"""

import asyncio
import functools
import logging
import os
import signal
import socket
import threading
import time

from .. import OutboundDispatcher, RateLimit, RetryPolicy
from ..pacing import _positive_seconds as _seconds
from ._limiter import SharedLimiter
from ._loop import LoopThread
from ._message import _Backoff, _MessageSteps, _redis_errors
from ._topology import (DEFAULT_ACK_WAIT, ShardMismatch, check_shards, check_stream_name,
                        consumer_name, ensure_topology, require_clients, stream_created,
                        topology_missing)

__all__ = ["ClusterWorker", "WorkerStats"]

log = logging.getLogger("fastdispatch.cluster")

NATS_RETRY_WAIT = 2.0


class WorkerStats:
    """Counters of one worker (read them after ``wait()``; updated on the loop thread)."""

    __slots__ = ("sent", "skipped", "dead", "handed_back", "redelivered", "late_answers",
                 "topology_recreated", "fenced")

    def __init__(self):
        self.sent = self.skipped = self.dead = self.handed_back = self.redelivered = 0
        self.late_answers = 0   # starts given back because this worker kept starting late
        self.topology_recreated = 0   # times the stream or consumers were found gone
        self.fenced = 0         # sends not made: the claim on the message had gone stale

    def __repr__(self):
        return ("sent %d, skipped as already sent %d, dead-lettered %d, handed back %d, "
                "redeliveries seen %d, starts given back on late answers %d, sends fenced %d"
                % (self.sent, self.skipped, self.dead, self.handed_back, self.redelivered,
                   self.late_answers, self.fenced))


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class ClusterWorker(_MessageSteps):
    """One worker process's engine; ``python -m fastdispatch.cluster worker`` runs one.

    ``sender``: ``callable(sc, chat_id: str, payload: bytes, key: str) -> None``.
    ``global_limit``/``chat_limit``: ``RateLimit`` or None, shared by every
    worker on the same Redis and stream.  ``shards`` is used only when this
    worker is the first and creates the stream (default 128); otherwise the
    worker learns the shard count from the stream.  ``ack_wait`` likewise
    applies to consumers this worker creates; the one in force is read back
    from the server.
    """

    def __init__(self, sender, *, nats_url, redis_url, stream="fastdispatch",
                 max_inflight=64, global_limit=None, chat_limit=None, send_timeout=30.0,
                 retry=None, ack_wait=DEFAULT_ACK_WAIT, shards=None, limit_guard=0.05,
                 key_ttl=7 * 24 * 3600, grace=None, fetch_timeout=5.0):
        if not callable(sender):
            raise TypeError("sender must be callable, got %r" % (type(sender).__name__,))
        for name, url in (("nats_url", nats_url), ("redis_url", redis_url)):
            if not isinstance(url, str) or not url:
                raise TypeError("%s must be a non-empty str, got %r" % (name, url))
        self.stream = check_stream_name(stream)
        require_clients("nats", "redis")
        for name, limit in (("global_limit", global_limit), ("chat_limit", chat_limit)):
            if limit is not None and not isinstance(limit, RateLimit):
                raise TypeError("%s must be a RateLimit or None, got %r"
                                % (name, type(limit).__name__))
        if shards is not None:
            check_shards(shards)
        self._ack_wait = _seconds("ack_wait", ack_wait)
        self._guard = _seconds("limit_guard", limit_guard, allow_zero=True)
        self._fetch_timeout = _seconds("fetch_timeout", fetch_timeout)
        self._key_ttl = int(_seconds("key_ttl", key_ttl))
        self._retry = RetryPolicy() if retry is None else retry
        # Made here so that bad sizes and timeouts raise at the call; its
        # worker threads start only when the first send is submitted.
        self._dispatcher = OutboundDispatcher(max_inflight=max_inflight,
                                              send_timeout=send_timeout, retry=self._retry)
        self._grace = (send_timeout or 30.0) + 5.0 if grace is None else _seconds(
            "grace", grace, allow_zero=True)
        self._sender = sender
        self.nats_url, self.redis_url = nats_url, redis_url
        self._global_limit, self._chat_limit = global_limit, chat_limit
        self._send_timeout = send_timeout
        self._shards_wanted = shards
        self._done_prefix = "fastdispatch:{%s}:done:" % (self.stream,)
        self._identity = "%s:%d" % (socket.gethostname(), os.getpid())
        self.stats = WorkerStats()
        self.shards = None          # learnt from the stream
        self.exit_code = None
        self._loop = None
        self._stop_event = None     # asyncio.Event, created on the loop
        # A plain flag, not an Event: stop() runs in signal handlers, which
        # may interrupt the main thread inside an Event's own lock.
        self._stop_requested = False
        self._finished = threading.Event()
        self._redis = None          # sync client, used by the dispatcher's threads
        self._aredis = None         # asyncio client, used by the loop thread
        self._limiter = None
        self._nc = self._js = None
        self._subs = []             # pull subscription of each shard (rebound if remade)
        self._fetch_failed = None   # asyncio.Event: a fetch failed, check the topology
        self._stream_created = None  # the stream's creation time when this worker bound it
        self._progress_every = self._ack_wait / 3.0
        self._fence_after = self._ack_wait / 2.0   # see _send_task
        self._warned = {}           # what -> monotonic time of the last warning

    # -- public control -------------------------------------------------

    def start(self):
        """Start the loop thread and begin connecting (returns at once)."""
        if self._loop is not None:
            raise RuntimeError("ClusterWorker already started")
        self._loop = LoopThread("fastdispatch-cluster-loop")
        fut = self._loop.submit(self._main())
        fut.add_done_callback(self._on_main_done)

    def _on_main_done(self, fut):
        if fut.cancelled():
            self.exit_code = 1
        elif fut.exception() is not None:
            exc = fut.exception()
            log.error("worker stopped by an unexpected error: %r", exc, exc_info=exc)
            self.exit_code = 1
        else:
            self.exit_code = fut.result()
        self._finished.set()

    def stop(self):
        """Ask for a graceful stop (thread safe; safe in a signal handler: it
        takes no lock)."""
        self._stop_requested = True
        loop = self._loop
        if loop is not None:
            try:
                loop.loop.call_soon_threadsafe(self._wake_stop)
            except RuntimeError:
                pass

    def _wake_stop(self):
        if self._stop_event is not None:
            self._stop_event.set()

    def wait(self, timeout=None):
        """Wait for the worker to end; True once it has."""
        done = self._finished.wait(timeout)
        if done and self._loop is not None:
            self._loop.stop()
        return done

    def run(self):
        """Start, stop on SIGTERM/SIGINT, return the exit code (0 after a graceful stop)."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda signum, frame: self.stop())
        try:
            self.start()
            while not self.wait(1.0):
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.exit_code

    # -- helpers on the loop ----------------------------------------------

    @property
    def _stopping(self):
        return self._stop_requested

    def _warn(self, what, message, *args):
        # One line per kind of trouble every 5 s at most: clear, not a flood.
        now = time.monotonic()
        if now - self._warned.get(what, -1e9) >= 5.0:
            self._warned[what] = now
            log.warning(message, *args)

    async def _sleep_or_stop(self, seconds):
        """Sleep; returns True early if a stop was requested."""
        try:
            await asyncio.wait_for(self._stop_event.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return self._stopping

    async def _connect_nats(self):
        """Connect, waiting as long as it takes; None if a stop came first.

        nats-py itself retries an unreachable server (every
        ``reconnect_time_wait`` seconds, with jitter) and reconnects after a
        lost connection, forever here (``max_reconnect_attempts=-1``); each
        failed attempt comes to ``error_cb``, which says what and where.
        """
        import nats

        connected = False

        async def on_error(exc):
            if not connected:
                self._warn("nats", "cannot reach NATS at %s (%s); retrying every %.0f s",
                           self.nats_url, exc or type(exc).__name__, NATS_RETRY_WAIT)
            else:
                self._warn("nats", "NATS at %s: %s", self.nats_url, exc or type(exc).__name__)

        async def on_disconnect():
            if self._stopping:
                return
            self._warn("nats-down", "lost the connection to NATS at %s; reconnecting",
                       self.nats_url)

        async def on_reconnect():
            log.info("reconnected to NATS at %s", self.nats_url)

        connect = asyncio.ensure_future(nats.connect(
            self.nats_url, connect_timeout=2, allow_reconnect=True,
            max_reconnect_attempts=-1, reconnect_time_wait=NATS_RETRY_WAIT,
            error_cb=on_error, disconnected_cb=on_disconnect, reconnected_cb=on_reconnect))
        stop = asyncio.ensure_future(self._stop_event.wait())
        await asyncio.wait({connect, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not connect.done():
            connect.cancel()
            await asyncio.gather(connect, return_exceptions=True)
            return None
        nc = connect.result()
        connected = True
        log.info("connected to NATS at %s", self.nats_url)
        return nc

    async def _connect_redis(self):
        import redis
        import redis.asyncio

        self._redis = redis.Redis.from_url(self.redis_url, socket_connect_timeout=2,
                                           socket_timeout=5)
        self._aredis = redis.asyncio.Redis.from_url(self.redis_url, socket_connect_timeout=2,
                                                    socket_timeout=5)
        backoff = _Backoff()
        while not self._stopping:
            try:
                await self._aredis.ping()
                await self._check_persistence()
                return True
            except _redis_errors() as exc:
                delay = backoff.delay()
                log.error("cannot reach Redis at %s (%s); retrying in %.1f s",
                          self.redis_url, exc or type(exc).__name__, delay)
                if await self._sleep_or_stop(delay):
                    break
        return False

    async def _check_persistence(self):
        """Warn when Redis keeps nothing on disk: a restart then forgets the limit logs.

        With neither an append-only file nor snapshots, a Redis restart
        empties the rate logs (up to one window's worth of starts can then go
        through again: the limit is exceeded once, for one window) and the
        idempotency keys (a redelivery after that can be sent twice).  A
        Redis that refuses CONFIG (managed services) is not asked again.
        """
        import redis.exceptions

        try:
            config = await self._aredis.config_get("appendonly")
            config.update(await self._aredis.config_get("save"))
        except redis.exceptions.ResponseError:
            return
        aof = _text(config.get("appendonly", "")).lower() == "yes"
        snapshots = bool(_text(config.get("save", "")).strip())
        if not aof and not snapshots:
            log.warning("Redis at %s keeps nothing on disk (appendonly no, save \"\"): a Redis "
                        "restart forgets the limit logs (one window may then exceed the limit) "
                        "and the idempotency keys (a redelivery may be sent twice); see "
                        "docs/cluster.md, 'Guarantees and limits'", self.redis_url)

    # -- the main coroutine -------------------------------------------------

    async def _main(self):
        self._stop_event = asyncio.Event()
        if self._stopping:
            self._stop_event.set()
        nc = await self._connect_nats()
        if nc is None:
            return 0
        self._nc, self._js = nc, nc.jetstream(timeout=10)
        try:
            return await self._run_connected()
        finally:
            try:
                await nc.close()
            except Exception:
                pass
            if self._aredis is not None:
                try:
                    await self._aredis.aclose()
                except Exception:
                    pass
            if self._redis is not None:
                self._redis.close()

    async def _run_connected(self):
        if not await self._connect_redis():
            return 0
        backoff = _Backoff()
        while True:
            try:
                self.shards = await ensure_topology(self._js, self.stream, self._shards_wanted,
                                                    ack_wait=self._ack_wait)
                break
            except ShardMismatch as exc:
                log.error("%s", exc)
                return 2
            except Exception as exc:
                delay = backoff.delay()
                log.error("cannot set up stream %r on NATS at %s (%s); retrying in %.1f s",
                          self.stream, self.nats_url, exc or type(exc).__name__, delay)
                if await self._sleep_or_stop(delay):
                    return 0
        self._stream_created = await stream_created(self._js, self.stream)
        subs = await self._bind_shards()
        info = await subs[0].consumer_info()
        ack_wait = info.config.ack_wait or self._ack_wait
        self._progress_every = max(0.05, ack_wait / 3.0)
        self._fence_after = ack_wait / 2.0
        if self._send_timeout is not None and self._send_timeout >= ack_wait:
            log.info("send_timeout %.1f s >= ack_wait %.1f s: long sends stay claimed by "
                     "'in progress' acks every %.1f s", self._send_timeout, ack_wait,
                     self._progress_every)

        self._limiter = SharedLimiter(self._redis, self.stream, self._global_limit,
                                      self._chat_limit, guard=self._guard)
        log.info("worker %s: stream %r, %d shards, ack_wait %.1f s, global limit %r, "
                 "chat limit %r", self._identity, self.stream, self.shards, ack_wait,
                 self._global_limit, self._chat_limit)
        self._subs = subs
        self._fetch_failed = asyncio.Event()
        tasks = [asyncio.ensure_future(self._shard_loop(shard))
                 for shard in range(self.shards)]
        watcher = asyncio.ensure_future(self._watch_topology())
        try:
            await self._stop_event.wait()
            log.info("stopping: no new fetches; %.1f s for the messages in flight",
                     self._grace)
            done, pending = await asyncio.wait(tasks, timeout=self._fetch_timeout + self._grace)
            if pending:
                # Still sending after the grace period: cancel the sends and
                # hand their messages back (each _process naks on Cancelled).
                self._dispatcher.force_close()
                done, pending = await asyncio.wait(pending, timeout=5.0)
                for task in pending:
                    task.cancel()
        finally:
            watcher.cancel()
            for task in tasks:
                if not task.done():
                    task.cancel()
            await asyncio.gather(watcher, *tasks, return_exceptions=True)
            dispatcher = self._dispatcher
            await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(dispatcher.shutdown, 5.0))
            try:
                await self._nc.flush(timeout=5)
            except Exception:
                pass
        log.info("worker %s stopped: %r", self._identity, self.stats)
        return 0

    async def _bind_shards(self):
        subs = []
        for shard in range(self.shards):
            subs.append(await self._js.pull_subscribe_bind(
                consumer=consumer_name(shard), stream=self.stream))
        return subs

    async def _watch_topology(self):
        """After a failed fetch: is the stream (or a consumer) gone? Then say so, and remake it.

        A NATS server restarted without its store lost the stream and every
        message it held; fetches then fail for good while the worker looks
        alive.  The worker logs what is gone (at ERROR: messages were lost),
        recreates the topology with the shard count it knows, and binds its
        shard loops to the new consumers.
        """
        while not self._stopping:
            await self._fetch_failed.wait()
            self._fetch_failed.clear()
            try:
                missing = await topology_missing(self._js, self.stream, self.shards,
                                                 self._stream_created)
                if missing:
                    log.error("%s gone from NATS at %s (a server restarted without its "
                              "store?): the messages it held that were not sent yet are "
                              "lost; recreating the topology",
                              ", ".join(missing[:3]) + (" and %d more" % (len(missing) - 3)
                                                        if len(missing) > 3 else ""),
                              self.nats_url)
                    await ensure_topology(self._js, self.stream, self.shards,
                                          ack_wait=self._ack_wait)
                    self._stream_created = await stream_created(self._js, self.stream)
                    self._subs = await self._bind_shards()
                    self.stats.topology_recreated += 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._warn("topology", "cannot check stream %r on NATS (%s); will try again",
                           self.stream, exc or type(exc).__name__)
            await self._sleep_or_stop(1.0)

    async def _shard_loop(self, shard):
        import nats.errors

        backoff = _Backoff()
        while not self._stopping:
            try:
                msgs = await self._subs[shard].fetch(1, timeout=self._fetch_timeout)
            except nats.errors.TimeoutError:
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._warn("fetch", "fetching from shard %d failed (%s); retrying",
                           shard, exc or type(exc).__name__)
                self._fetch_failed.set()
                await self._sleep_or_stop(backoff.delay())
                continue
            backoff.reset()
            for msg in msgs:
                if self._stopping:
                    await self._hand_back(msg)
                else:
                    await self._process(shard, msg)
