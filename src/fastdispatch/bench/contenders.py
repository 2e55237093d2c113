"""The contenders: fastdispatch's two cores and what else a user could pick.

- ``fastdispatch``          the compiled core (``_ringbuf``), ``max_inflight=8``;
- ``fastdispatch-default``  ``OutboundDispatcher()`` with no arguments (512 threads);
- ``fastdispatch-py``       the pure-Python twin (``_core_py``), same settings;
- ``naive``                 :class:`NaiveDispatcher`: a lock, a dict of deques and
                            a ``ThreadPoolExecutor``, written the way a user would;
- ``threadpool``            :class:`PoolDispatcher`: ``ThreadPoolExecutor(8)``
                            with no per-chat order at all (the chat id is ignored).

The baselines without a dispatcher (``floor``, ``futures-only``, ``ideal``)
are workloads, not objects: they live in :mod:`fastdispatch.bench.scenarios`.
"""

import logging
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait

from .. import _core_py
from .._dispatcher import build_dispatcher_class

try:
    from .. import _ringbuf
except ImportError:  # no compiled core: the twin stands in, and says so
    _ringbuf = None  # type: ignore[assignment]

__all__ = ["THREADS", "IMPL_LABELS", "NaiveDispatcher", "PoolDispatcher",
           "compiled_core", "make_dispatcher", "make_ring", "noop"]

logger = logging.getLogger("fastdispatch.bench")

THREADS = 8             # worker threads for every contender

IMPL_LABELS = {
    "fastdispatch": "fastdispatch (Cython core)",
    "fastdispatch-default": "fastdispatch, all defaults (max_inflight=512)",
    "fastdispatch-py": "fastdispatch (pure-Python twin)",
    "naive": "naive lock+dict+deque on a thread pool",
    "threadpool": "ThreadPoolExecutor (no per-chat order)",
    "floor": "floor: Future() created, set, read in one thread",
    "futures-only": "10k plain Futures created, run, resolved, read; one thread",
    "ideal": "ideal: total send time / max_inflight",
}


def noop(sc):
    return None




class NaiveDispatcher:
    """The per-chat dispatcher a user writes in ten minutes.

    A lock, a dict of deques, and a ``ThreadPoolExecutor``: the first task of
    an idle chat submits a job that drains that chat's deque, one task at a
    time, and deletes the deque when it finds it empty.  It keeps per-chat
    order and is correct; it has no backpressure, timeouts or hooks.
    """

    def __init__(self, max_workers=THREADS):
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._chats = {}
        self._pool = ThreadPoolExecutor(max_workers)

    def submit(self, chat_id, task):
        future = Future()
        self._put(chat_id, task, future)
        return future

    def post(self, chat_id, task):
        self._put(chat_id, task, None)

    def _put(self, chat_id, task, future):
        with self._lock:
            queue = self._chats.get(chat_id)
            if queue is not None:
                queue.append((task, future))
                return
            self._chats[chat_id] = deque([(task, future)])
        self._pool.submit(self._drain_chat, chat_id)

    def _drain_chat(self, chat_id):
        while True:
            with self._lock:
                queue = self._chats[chat_id]
                if not queue:
                    del self._chats[chat_id]
                    if not self._chats:
                        self._idle.notify_all()
                    return
                task, future = queue.popleft()
            if future is None:
                try:
                    task(None)
                except Exception:
                    logger.exception("task of chat %r failed", chat_id)
            elif future.set_running_or_notify_cancel():
                try:
                    result = task(None)
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)

    def drain(self, timeout=None):
        with self._idle:
            return self._idle.wait_for(lambda: not self._chats, timeout)

    def shutdown(self, timeout=None):
        self.drain(timeout)
        self._pool.shutdown(wait=True)
        return True


class PoolDispatcher:
    """``ThreadPoolExecutor`` behind the dispatcher's methods; ignores the chat.

    Tasks of one chat may run at the same time and out of order: this is the
    ceiling of a pool, not a per-chat dispatcher.  It has no ``post``; ours
    submits and keeps the Future so that ``drain`` can wait for it.
    """

    def __init__(self, max_workers=THREADS):
        self._pool = ThreadPoolExecutor(max_workers)
        self._posted = []

    def submit(self, chat_id, task):
        return self._pool.submit(task, None)

    def post(self, chat_id, task):
        self._posted.append(self._pool.submit(task, None))

    def drain(self, timeout=None):
        posted, self._posted = self._posted, []
        return not wait(posted, timeout).not_done

    def shutdown(self, timeout=None):
        self.drain(timeout)
        self._pool.shutdown(wait=True)
        return True


_classes: dict = {}   # core module -> OutboundDispatcher class built on it


def _dispatcher_class(core):
    cls = _classes.get(core)
    if cls is None:
        cls = _classes[core] = build_dispatcher_class(core)
    return cls


def compiled_core():
    """The compiled core module, or the twin when the extension is missing."""
    return _ringbuf if _ringbuf is not None else _core_py


def make_dispatcher(impl, threads=THREADS, queue_size=64):
    """A fresh contender ``impl`` with ``threads`` workers."""
    if impl == "fastdispatch":
        return _dispatcher_class(compiled_core())(max_inflight=threads, queue_size=queue_size)
    if impl == "fastdispatch-default":
        return _dispatcher_class(compiled_core())(queue_size=queue_size)
    if impl == "fastdispatch-py":
        return _dispatcher_class(_core_py)(max_inflight=threads, queue_size=queue_size)
    if impl == "naive":
        return NaiveDispatcher(threads)
    if impl == "threadpool":
        return PoolDispatcher(threads)
    raise ValueError("unknown contender %r" % (impl,))


def make_ring(impl, capacity):
    if impl == "fastdispatch":
        return compiled_core().RingBuffer(capacity)
    if impl == "fastdispatch-py":
        return _core_py.RingBuffer(capacity)
    raise ValueError("unknown ring buffer %r" % (impl,))

