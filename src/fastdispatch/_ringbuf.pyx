# cython: language_level=3, freethreading_compatible=True
# cython: boundscheck=False, wraparound=False, cdivision=True
"""The dispatcher core, compiled: the twin of ``_core_py.py``.

Same rooms, same behaviour, same locking protocol.  This module includes
the rooms' ``_core/*.pxi`` files, so the whole core is one extension module
and one C translation unit: a call from one room to another is a C call.
Each ``.pxi`` opens with what it does differently from its ``.py`` twin,
whose docstring explains the room; ``_core_py.py`` lists the rooms and
their locks.  What the compiled version changes is the cost of each step:

- queue and pool locks are ``cython.pymutex`` (a ``PyMutex`` on 3.13+), which
  release the GIL while they block and never lean on it for exclusion;
- counters are atomic integers, so the free-threaded build needs no extra lock;
- the ready list, and the running registry of coroutine tasks, are intrusive
  linked lists through the ``ChatQueue`` and ``SendContext`` objects
  themselves: no allocation and O(1) unlink; a worker's running task is one
  field of its own ``_Runner``, under a lock no other worker takes;
- a rate-limit window is a C ring of doubles, a learned budget a few C
  fields, and a dispatcher without pacing (and without a report) pays for
  pacing with one test of three C fields per task.

On free-threaded CPython three more things keep threads from meeting where
they need not (bench/notes/freethreading.md has the measurements): the
chat map is cut in 64 parts (``_Stripe``), each with its own dict and
lock; an idle worker, or the timer, sleeps on a
``SimpleQueue`` (``_sleep``), not on a held ``Lock`` that would spin before
it sleeps; and a held lock of this module is spun for briefly before
CPython's own ``PyMutex_Lock`` yields the CPU (``fd_mutex_lock``).  On a GIL
build the map has one part.

Nothing here relies on the GIL for mutual exclusion: every shared field is
either read and written under the lock that owns it (see the comment on each
field) or is an atomic integer.  No borrowed reference is kept across a lock
release.
"""

cimport cython
from cpython.contextvars cimport (
    PyContext_CopyCurrent, PyContext_Enter, PyContext_Exit, PyContextVar_Set)
from cpython.object cimport PyObject

import contextvars
import functools
import inspect
import logging
import sys
import threading
from collections import deque
from heapq import heappop as _heappop, heappush as _heappush
from concurrent.futures import _base as _futures_base
from queue import Empty as _Empty, SimpleQueue as _Wake
from time import monotonic
from weakref import ref as _weakref

from cpython.mem cimport PyMem_Free, PyMem_Malloc

from ._errors import (
    Cancelled, DispatcherClosed, QueueFull, RetryAfter, SendTimeout, TaskDiscarded)
from ._errors import _no_room, _safe_repr, _task_call_error, _wait_ended
from ._types import DispatchInfo, Future, _checked_wait
from .pacing import RateLimit, _checked_report, _retry_plan

__all__ = ["RingBuffer", "ChatQueue", "SendContext", "DispatcherCore", "LatencyHistogram"]

# The extension types, declared before the rooms that name each other's.
cdef class SendContext
cdef class _Stripe
cdef class _Window
cdef class _Bucket
cdef class _Budgets
cdef class _Limiter
cdef class _Runner
cdef class ChatQueue
cdef class _Waiter
cdef class _ChatKey
cdef class LatencyHistogram
cdef class DispatcherCore

# The rooms, from the bottom up (see _core_py.py).
include "_core/c_support.pxi"
include "_core/constants.pxi"
include "_core/futures.pxi"
include "_core/items.pxi"
include "_core/bookkeeping.pxi"
include "_core/chats.pxi"
include "_core/waiting.pxi"
include "_core/budgets.pxi"
include "_core/limiter.pxi"
include "_core/histogram.pxi"
include "_core/deadlines.pxi"
include "_core/outcomes.pxi"
include "_core/pool.pxi"
include "_core/loops.pxi"
include "_core/intake.pxi"


cdef class DispatcherCore(_Intake):
    """The dispatcher core: its rooms, wired (see ``_core_py.py``)."""

    def __cinit__(self, *args, **kwargs):
        self._stripes = [_Stripe() for _ in range(FD_STRIPES)]
        self._idle = []
        self._runners = []
        self._timer_wake = _Wake()
        self._on_queued = self._on_start = self._on_done = None
        self._on_rejected = self._on_retry = self._recover = None
        self._timer_until = _INF
        self._timer_next = _INF
        self._limiter = _Limiter()
        self._limiter._configure(self, None)
        self._ref = _weakref(self)
        self._slot_waiters = deque()
        self._handoffs = {}
        self._loop_items = {}
        self._max_waiting = 100_000
        self._tls = threading.local()

    def _configure(self, Py_ssize_t max_inflight, Py_ssize_t queue_size, send_timeout,
                   double idle_timeout, hooks, recover, pacing=None, retry=None,
                   Py_ssize_t max_waiting=100_000):
        self._max_inflight = max_inflight
        self._max_waiting = max_waiting
        self._queue_size = queue_size
        self._has_timeout = send_timeout is not None
        self._send_timeout = send_timeout if send_timeout is not None else 0.0
        self._idle_timeout = idle_timeout
        self._on_queued = hooks.on_queued
        self._on_start = hooks.on_start
        self._on_done = hooks.on_done
        self._histogram = (hooks.on_done if type(hooks.on_done) is LatencyHistogram
                           else None)
        self._on_rejected = hooks.on_rejected
        self._on_retry = hooks.on_retry
        self._recover = recover
        self._retry = retry
        if retry is not None:
            self._max_attempts = retry.max_attempts
        else:
            self._max_attempts = 1
        self._limiter._configure(self, pacing)
        # Whether every start must ask the limiter (else only a chat with a
        # pending retry delay or during a global pause does).  Set for good
        # by the first report_limit (_Limiter.learn).
        self._limited = self._limiter._configured


    @property
    def queue_size(self):
        """How many tasks one chat may have waiting (the configured capacity)."""
        return self._queue_size

    @property
    def max_inflight(self):
        """Most tasks running at once (the configured cap)."""
        return self._max_inflight

    @property
    def inflight(self):
        """Tasks running right now."""
        return FD_LOAD(&self._inflight)

    @property
    def closed(self):
        """True once ``close()`` (or ``shutdown``/``force_close``) ran."""
        return FD_LOAD(&self._closed) != 0

    def _pacing_state(self):
        """Sizes of the limiter's structures (for tests and debugging)."""
        return self._limiter.state()

    def _close(self):
        FD_STORE(&self._closed, 1)
        self._close_waiters()

    def _cancel_everything(self):
        """force_close(): cancel running, retrying, parked and waiting tasks."""
        cdef list running = []         # (task, error) pairs
        cdef list parked
        cdef list waiting
        cdef list handed
        cdef list dead
        cdef SendContext item, retrying
        cdef ChatQueue q
        FD_STORE(&self._closed, 1)
        self._close_waiters()
        with self._run_lock:
            FD_STORE(&self._forced, 1)
            while self._run_head is not None:
                item = self._run_head
                self._unlink_locked(item)
                pair = (item, Cancelled("the dispatcher was force-closed"))
                item._error = (<tuple>pair)[1]
                running.append(pair)
            # Chats handed to a loop that has not taken them yet: the
            # workers find them (emptied below) and let them go.
            handed = list(self._handoffs)
            self._handoffs.clear()
            dead = [item for loop, items in self._loop_items.items()
                    if loop.is_closed() for item in items]
        # The workers' tasks (a start from now on sees _forced: _register).
        self._take_from_runners(0.0, True, running)
        parked = self._limiter.cancel_all()
        for pair in running:
            self._expire(<SendContext>(<tuple>pair)[0], _BY_FORCE, (<tuple>pair)[1])
        waiting_chats = []
        for stripe in self._stripes:
            # (a copy taken in one step: workers remove chats meanwhile)
            waiting_chats.extend(list((<_Stripe>stripe).queues.values()))
        for q in waiting_chats:
            with q._lock:
                retrying = q._retry_item
                q._retry_item = None
                waiting = q._clear()
            if retrying is not None:
                self._settle_started(retrying, Cancelled("the dispatcher was force-closed"),
                                     C_CANCELLED)
            for item in waiting:
                self._finish(item, Cancelled("the dispatcher was force-closed"),
                             C_CANCELLED)
        # Parked chats are owned by nobody but the timer's schedule, which
        # is now empty: hand them to workers, which find them empty and
        # remove them.
        for q in parked:
            q._not_before = 0.0
            q._granted = False
            self._schedule(q)
        with self._pool_lock:
            waiting_for_slots = list(self._slot_waiters)
            self._slot_waiters.clear()
            FD_STORE(&self._slot_waiting, 0)
        for q in handed + waiting_for_slots:
            self._schedule(q)
        for item in dead:
            self._end_on_closed_loop(item)
        self._maybe_drained()

