"""The room every other room stands on: configuration, counters, hooks.

``_Bookkeeping`` holds what is written once before any task (the limits,
the user's hooks, ``recover``, the limiter) and the counters ``stats()``
reads, and makes the calls every room needs: counting an outcome
(``_count``), reporting it to ``on_done`` (``_report``), refusing a task
(``_reject``), calling a hook that may raise (``_hook_failed``,
``_call_recover``), and telling ``drain()`` that nothing is left
(``_maybe_drained``).  The counters stay exact whatever user code does
(G8, docs/guarantees.md): each is changed in one place, under
``_count_lock``.
"""

from time import monotonic

from .._errors import _safe_repr
from .._types import DispatchInfo

from .constants import C_CANCELLED, C_COMPLETED, C_DISCARDED, C_FAILED, C_TIMED_OUT, logger


class _Bookkeeping:
    """Configuration, counters and hooks: what every room reads."""

    __slots__ = ("_max_inflight", "_queue_size", "_send_timeout", "_idle_timeout", "_on_queued",
                 "_on_done", "_on_rejected", "_recover", "_limiter", "_ref", "_limited",
                 "_async_used", "_closed", "_count_lock", "_pending", "_drain_waiters",
                 "_inflight", "_submitted", "_rejected", "_retried", "_counts", "_waiting",
                 "_max_waiting",
                 "_threads", "_pool_lock")

    def _reject(self, chat_id, exc, waited=False):
        # ``waited``: a caller that waited for room (not counted as submitted).
        with self._count_lock:
            if not waited:
                self._submitted -= 1
            self._pending -= 1
            self._rejected += 1
        self._maybe_drained()
        if self._on_rejected is not None:
            try:
                self._on_rejected(chat_id, exc)
            except BaseException as hook_exc:
                self._hook_failed("on_rejected", hook_exc)
        raise exc

    def _counters(self):
        paced, parked = self._limiter.counters()
        with self._count_lock:
            counts = self._counts
            return (self._submitted, counts[C_COMPLETED], counts[C_FAILED], self._rejected,
                    counts[C_DISCARDED], counts[C_CANCELLED], counts[C_TIMED_OUT],
                    len(self._queues), self._inflight, self._threads,
                    self._retried, paced, parked, self._waiting)

    def _pending_count(self):
        return self._pending

    def _add_drain_waiter(self, n):
        with self._count_lock:
            self._drain_waiters += n

    def _maybe_drained(self):
        if (self._drain_waiters and not self._pending and not self._queues
                and not self._inflight):
            self._notify_drained()

    def _log_unobserved(self, item, error):
        # A post()ed task that failed, with no on_done hook to see it: as
        # Python reports an exception that ends a thread, once, with its
        # traceback.
        logger.error("task posted for chat %s failed", _safe_repr(item.chat_id),
                     exc_info=(type(error), error, error.__traceback__))

    def _count(self, outcome):
        with self._count_lock:
            self._counts[outcome] += 1

    def _report(self, item, error, run_latency):
        start = item._t_start if item._t_start else monotonic()
        info = DispatchInfo(item.chat_id, item._queue_len,
                            max(0.0, start - item._t_queued), run_latency, error)
        try:
            self._on_done(info)
        except BaseException as exc:
            self._hook_failed("on_done", exc)

    def _hook_failed(self, name, exc):
        logger.error("dispatcher hook %s raised", name, exc_info=exc)
        self._call_recover(exc)

    def _call_recover(self, exc):
        if self._recover is None:
            return
        try:
            self._recover(exc)
        except BaseException:
            logger.exception("recover callable raised")
