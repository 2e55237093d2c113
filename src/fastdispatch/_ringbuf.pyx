# cython: language_level=3, freethreading_compatible=True
# cython: boundscheck=False, wraparound=False, cdivision=True
"""Compiled dispatcher core: ring buffer, chat queues, submit and the worker loop.

This module is the twin of ``_core_py.py``: same classes, same behaviour, same
locking protocol; the design is explained in ``docs/dispatcher.md``.  What
the compiled version changes is the cost of each step:

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
they need not (``docs/performance.md``, "Free-threaded CPython", has the
measurements): the chat map is cut in 64 parts (``_Stripe``), each with its
own dict and lock; an idle worker, or the timer, sleeps on a
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
from .pacing import RateLimit

__all__ = ["RingBuffer", "ChatQueue", "SendContext", "DispatcherCore", "LatencyHistogram"]

cdef extern from *:
    """
    #if defined(_MSC_VER)
      #include <intrin.h>
      #define FD_ADD(p, v) _InterlockedExchangeAdd64((volatile __int64 *)(p), (__int64)(v))
      #define FD_LOAD(p) _InterlockedOr64((volatile __int64 *)(p), 0)
      #define FD_STORE(p, v) _InterlockedExchange64((volatile __int64 *)(p), (__int64)(v))
    #else
      #define FD_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_SEQ_CST)
      #define FD_LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
      #define FD_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
    #endif
    """
    long long FD_ADD(long long *p, long long v) nogil
    long long FD_LOAD(long long *p) nogil
    void FD_STORE(long long *p, long long v) nogil

cdef extern from *:
    """
    /* 1: an awaitable (its type has __await__), 0: not, -1: a generator,
       which only inspect.isawaitable can judge (a @types.coroutine one). */
    static int fd_awaitable_kind(PyObject *o) {
        PyTypeObject *t = Py_TYPE(o);
        if (t->tp_as_async != NULL && t->tp_as_async->am_await != NULL) return 1;
        if (PyGen_CheckExact(o)) return -1;
        return 0;
    }
    """
    int fd_awaitable_kind(object o)
    bint PyCoro_CheckExact(object o)

cdef extern from *:
    """
    /* How many parts the chat map has (see _Stripe): 1 << FD_STRIPE_BITS. */
    #ifdef Py_GIL_DISABLED
    #define FD_STRIPE_BITS 6
    #else
    #define FD_STRIPE_BITS 0
    #endif
    #define FD_STRIPES ((Py_ssize_t)1 << FD_STRIPE_BITS)
    /* A part of the map that empties is reset (its dict's table freed) only
       if it held more chats than this since its last reset (see
       _remove_locked): a table for this many is about a kilobyte. */
    #define FD_KEEP_CHATS 32
    """
    const Py_ssize_t FD_STRIPES
    const int FD_STRIPE_BITS
    const long long FD_KEEP_CHATS

cdef extern from *:
    """
    /* Free-threaded CPython: every PyMutex of this module (its cython.pymutex
       locks) is taken with a short spin first.  CPython's own PyMutex_Lock
       calls sched_yield() at once when the mutex is held, up to 40 times,
       then parks: with more runnable threads than cores every yield is a
       switch to another thread, for a lock that its holder, running on the
       other core, gives back within tens of nanoseconds (each critical
       section here is a few pointer writes).  FD_SPINS pause-spins hand it
       over without a system call; a holder that is not running makes this
       fall back to CPython's lock.  See docs/performance.md. */
    #if defined(Py_GIL_DISABLED)
      #ifndef FD_SPINS
        #define FD_SPINS 64
      #endif
      #if defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
        #include <intrin.h>
        #define FD_PAUSE() _mm_pause()
      #elif defined(_MSC_VER) && defined(_M_ARM64)
        #include <intrin.h>
        #define FD_PAUSE() __yield()
      #elif defined(__x86_64__) || defined(__i386__)
        #define FD_PAUSE() __builtin_ia32_pause()
      #elif defined(__aarch64__) || defined(__arm__)
        #define FD_PAUSE() __asm__ __volatile__("yield" ::: "memory")
      #else
        #define FD_PAUSE() ((void)0)
      #endif
      static void fd_mutex_lock_parking(PyMutex *m) { PyMutex_Lock(m); }
      static void fd_mutex_lock(PyMutex *m) {
          uint8_t v = _Py_atomic_load_uint8_relaxed(&m->_bits);
          for (int i = 0; i <= FD_SPINS; i++) {
              /* bit 0: locked; bit 1: threads parked (kept as it is) */
              if ((v & 1) == 0 &&
                      _Py_atomic_compare_exchange_uint8(&m->_bits, &v, (uint8_t)(v | 1)))
                  return;
              FD_PAUSE();
              v = _Py_atomic_load_uint8_relaxed(&m->_bits);
          }
          fd_mutex_lock_parking(m);
      }
      #undef PyMutex_Lock
      #define PyMutex_Lock fd_mutex_lock
    #endif
    """

cdef extern from *:
    """
    /* Free-threaded CPython: objects a worker gives back to the thread that
       made them.  CPython counts the references an object's creating
       thread holds apart from the others' (biased reference counting); a
       worker dropping the last reference to a producer's object (a task's
       SendContext and its Future, an emptied chat's queue and its key)
       queues that object to the producer's thread under a mutex per
       creating thread, which the producer then merges: with several
       workers that mutex is where they meet.  Instead, the
       worker takes a reference of its own to such an object before it
       drops its last one (so its drop never queues), keeps it in a block
       of its own (FD_BACK_SLOTS per block, no atomics), and publishes the
       full block on one lock-free stack of the core (one compare-and-swap
       per block); the next submit or post takes the whole stack (one
       exchange) and drops each object as its owner, without a queue.  See
       docs/performance.md.  On a GIL build all of it compiles away. */
    #ifndef FD_BACK_SLOTS
      #define FD_BACK_SLOTS 30
    #endif
    typedef struct fd_back {
        struct fd_back *next;
        int n;
        PyObject *objs[FD_BACK_SLOTS];
    } fd_back;
    #if defined(Py_GIL_DISABLED)
      #define FD_HANDBACK 1
      /* Keep a new reference to ``o`` in ``*cur`` (allocating a block when
         there is none).  0: not kept (this thread owns ``o``, or nobody
         does, or no memory: dropping it here queues nothing, or the usual
         way); 1: kept; 2: kept and the block is full (publish it). */
      static int fd_back_keep(fd_back **cur, PyObject *o) {
          uintptr_t tid = _Py_atomic_load_uintptr_relaxed(&o->ob_tid);
          fd_back *b = *cur;
          if (tid == 0 || tid == _Py_ThreadId())
              return 0;
          if (b == NULL) {
              b = (fd_back *)PyMem_RawMalloc(sizeof(fd_back));
              if (b == NULL)
                  return 0;
              b->next = NULL;
              b->n = 0;
              *cur = b;
          }
          Py_INCREF(o);
          b->objs[b->n++] = o;
          return b->n == FD_BACK_SLOTS ? 2 : 1;
      }
      static void fd_back_publish(fd_back **head, fd_back *b) {
          fd_back *old = (fd_back *)_Py_atomic_load_ptr_relaxed(head);
          do {
              b->next = old;
          } while (!_Py_atomic_compare_exchange_ptr(head, &old, b));
      }
      static int fd_back_waiting(fd_back **head) {
          return _Py_atomic_load_ptr_relaxed(head) != NULL;
      }
      static fd_back *fd_back_take(fd_back **head) {
          return (fd_back *)_Py_atomic_exchange_ptr(head, NULL);
      }
    #else
      #define FD_HANDBACK 0
      static int fd_back_keep(fd_back **cur, PyObject *o) { return 0; }
      static void fd_back_publish(fd_back **head, fd_back *b) { }
      static int fd_back_waiting(fd_back **head) { return 0; }
      static fd_back *fd_back_take(fd_back **head) { return NULL; }
    #endif
    /* Drop every object of a chain of blocks, and the blocks. */
    static void fd_back_drop(fd_back *b) {
        while (b != NULL) {
            fd_back *next = b->next;
            for (int i = 0; i < b->n; i++)
                Py_DECREF(b->objs[i]);
            PyMem_RawFree(b);
            b = next;
        }
    }
    """
    ctypedef struct fd_back
    const bint FD_HANDBACK
    int fd_back_keep(fd_back **cur, object o)
    void fd_back_publish(fd_back **head, fd_back *b)
    bint fd_back_waiting(fd_back **head)
    fd_back *fd_back_take(fd_back **head)
    void fd_back_drop(fd_back *b)

logger = logging.getLogger("fastdispatch")

cdef object _allocate_lock = threading.Lock


# Wake-ups.  An idle worker, and the timer, sleep on a wake of their own (a
# SimpleQueue), in which a waker puts one token.  Not a Lock that the waker
# releases: on free-threaded CPython, acquiring a Lock that is held spins
# first (up to 40 sched_yield calls) and only then sleeps, and the wait of
# a thread going idle is seldom short; SimpleQueue.get sleeps at once.  With
# more threads than cores (the dispatcher's case) that spin is preemption and
# wasted CPU; on idle cores it is the faster wake-up (bench/thread_wakes.py
# measures both, docs/performance.md has the figures).
cdef inline bint _sleep(object wake, object timeout) except -1:
    # Take a token: True if one came, False after ``timeout`` seconds
    # (None: wait for one).
    try:
        wake.get(True, timeout)
    except _Empty:
        return False
    return True

cdef object _Event = threading.Event
cdef object _TIMEOUT_MAX = threading.TIMEOUT_MAX
cdef double _TIMEOUT_MAX_D = threading.TIMEOUT_MAX

cdef enum:
    # SendContext._cancel
    _NOT_CANCELLED = 0
    _BY_TIMEOUT = 1
    _BY_FORCE = 2
    # The timer thread's state: awake, asleep until the registry head's
    # deadline, or asleep with nothing to wait for (a task start must wake it).
    _AWAKE = 0
    _UNTIL_DEADLINE = 1
    _IDLE = 2
    # Outcome counters, indexes into DispatcherCore._counts.
    C_COMPLETED = 0
    C_FAILED = 1
    C_DISCARDED = 2
    C_CANCELLED = 3
    C_TIMED_OUT = 4
    # What _run returns: the task ended, it panicked, or it will run again
    # (and what _retry_later returns: retrying, not retried, force-closed).
    _DONE = 0
    _PANICKED = 1
    _RETRYING = 2
    _FORCED = 3
    _REFUSED = 4
    # What _start_async returns when the task's awaitable now runs on its loop.
    _ASYNC = 5

cdef double _INF = float("inf")


cdef inline long long _ns(double t) noexcept nogil:
    # A monotonic time in whole nanoseconds, at least 1 (so that 0 can mean
    # "none"); times past 2**62 ns (146 years) are all that.
    if t >= 4611686018.0:
        return 1LL << 62
    if t < 1e-9:
        return 1
    return <long long>(t * 1e9)
# What _next_paced returns besides a task: parked, or look again, or the
# chat's next task runs elsewhere (ChatQueue._elsewhere says where).
cdef object _PARKED_CHAT = object()
cdef object _AGAIN = object()
cdef object _ELSEWHERE = object()
# Where a chat's next task runs when it is not an event loop's.
cdef object _WORKERS = object()
# How often the timer looks at event loops that hold work of this
# dispatcher: a chat handed to a loop that stopped before it took the chat
# is taken back (its task never starts there); the coroutine tasks of a
# closed loop are ended (they can never end there).
cdef double _HANDOFF_CHECK = 0.1
cdef double _LOOP_CHECK = 0.5
# asyncio, imported by the first asubmit() (a thread-only program never
# pays for it), and its _get_running_loop.
cdef object _asyncio = None
cdef object _running_loop = None

# What _call_searcher_locked returns when a new worker thread must start.
cdef object _SPAWN = object()

# Guards the lazy creation of SendContext events (rare: only for wait()).
cdef cython.pymutex _event_lock

# The coroutine task whose code runs in this context (set in the task's own
# context when it starts; see DispatcherCore.running_chat).
_current_task = contextvars.ContextVar("fastdispatch_current_task", default=None)
cdef object _copy_context = contextvars.copy_context

cdef enum:
    # A caller waiting for room (_Waiter.state): still waiting, let in (its
    # task is in the chat's queue), woken by close(), or gone (timed out,
    # cancelled).
    _W_WAITING = 0
    _W_ADMITTED = 1
    _W_CLOSED = 2
    _W_GONE = 3
    # Why a caller that asked to wait may not (_add_waiter_locked; _errors._no_room
    # says it with the same codes).
    _NO_ROOM_MAX = 1
    _NO_ROOM_SELF = 2
    _NO_ROOM_SLOTS = 3
    _NO_ROOM_CYCLE = 4
    _NO_ROOM_LOOP = 5

# What a waiting asubmit's wake-up Future holds when its timeout passed.
cdef object _TIMED_OUT = object()


# ----------------------------------------------------------- Future fast paths
#
# Every submit makes a concurrent.futures.Future, and every task moves one to
# RUNNING and then FINISHED.  Done through the public methods, that is
# Python-level code (Future.__init__ builds a Condition; set_result takes it,
# notifies, runs callbacks) costing more than the whole rest of the dispatch.
# The three helpers below do the same state changes from C, under the same
# lock, and defer to the public methods whenever anything is unusual (a
# waiter to notify, a cancelled Future).  They rely on the layout of Future
# and Condition, which is checked once at import: if a Python version ever
# changes it, the public methods are used throughout.

cdef object _PENDING = _futures_base.PENDING
cdef object _RUNNING = _futures_base.RUNNING
cdef object _FINISHED = _futures_base.FINISHED
cdef object _CANCELLED = _futures_base.CANCELLED
cdef object _CANCELLED_AND_NOTIFIED = _futures_base.CANCELLED_AND_NOTIFIED
cdef object _Condition = threading.Condition
cdef object _RLock = threading.RLock


def _future_layout_is_known():
    future = Future()
    condition = future._condition
    return (list(vars(future)) == ["_condition", "_state", "_result", "_exception",
                                   "_waiters", "_done_callbacks"]
            and type(condition) is _Condition
            and list(vars(condition)) == ["_lock", "acquire", "release", "_release_save",
                                          "_acquire_restore", "_is_owned", "_waiters"]
            and type(condition._lock) is type(_RLock())
            and type(condition._waiters) is deque
            and future._state is _PENDING)


cdef bint _fast_futures = _future_layout_is_known()


class _LeanCondition(_Condition):
    """A ``threading.Condition`` over an RLock, minus five cached bound methods.

    ``Condition.__init__`` stores ``acquire``, ``release`` and three private
    helpers of its lock as bound methods on the instance: five more objects
    for the cyclic GC to track, per Future.  With thousands of Futures alive
    (a caller collecting results), the collector's work, not ours, becomes
    the largest cost of a submit.  These methods delegate instead; the
    behaviour is the same.
    """

    def acquire(self, *args, **kwargs):
        return self._lock.acquire(*args, **kwargs)

    def release(self):
        self._lock.release()

    def _release_save(self):
        return self._lock._release_save()

    def _acquire_restore(self, state):
        self._lock._acquire_restore(state)

    def _is_owned(self):
        return self._lock._is_owned()


cdef object _new_future():
    """``Future()``, with a lean Condition, built field by field."""
    if not _fast_futures:
        return Future()
    condition = _LeanCondition.__new__(_LeanCondition)
    condition._lock = _RLock()
    condition._waiters = deque()
    future = Future.__new__(Future)
    future._condition = condition
    future._state = _PENDING
    future._result = None
    future._exception = None
    future._waiters = []
    future._done_callbacks = []
    return future


cdef bint _future_start(object future) except -1:
    """``future.set_running_or_notify_cancel()``: False if it was cancelled.

    The caller holds the Future too and may have moved it on itself
    (``set_running_or_notify_cancel()``, ``set_result()``): only a
    cancellation skips the task; anything else leaves it to run (whatever
    it returns is then dropped).
    """
    cdef bint started = False
    if _fast_futures:
        lock = future._condition._lock
        lock.acquire()
        if future._state is _PENDING:
            future._state = _RUNNING
            started = True
        lock.release()
        if started:
            return True
    state = future._state
    if state is _CANCELLED_AND_NOTIFIED:
        return False
    if state is _PENDING or state is _CANCELLED:
        try:
            return future.set_running_or_notify_cancel()
        except RuntimeError:  # moved on by the caller meanwhile
            return not future.cancelled()
    return True


cdef int _future_finish(object future, object result, object error) except -1:
    """``set_result(result)`` or, if ``error`` is not None, ``set_exception(error)``.

    A Future the caller already resolved (or cancelled) keeps what it has:
    the worker, the timer thread and the chat go on.
    """
    cdef bint done = False
    if _fast_futures:
        condition = future._condition
        lock = condition._lock
        lock.acquire()
        # Nobody blocked in result()/wait(): no one to notify.
        if future._state is _RUNNING and not condition._waiters and not future._waiters:
            if error is None:
                future._result = result
            else:
                future._exception = error
            future._state = _FINISHED
            done = True
        lock.release()
        if done:
            if future._done_callbacks:
                future._invoke_callbacks()
            return 0
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except Exception:  # InvalidStateError
        pass
    return 0


cdef object _stdlib_result = _futures_base.Future.result


def _future_result(self, timeout=None):
    # Future.result (installed below): a Future finished with a result
    # hands it over from C, under its lock as the stdlib's method takes it;
    # anything else (not finished yet, an exception to raise, a cancelled
    # Future, a layout of its own) is the stdlib's method.  The stdlib's
    # result() was a fifth of a submit + wait on free-threaded 3.13, which
    # does not specialize bytecode (its Python code cost 1.8x what it does
    # on 3.11); from C it costs a third of that (docs/performance.md).
    cdef bint done = False
    lock = self._condition._lock
    lock.acquire()
    try:
        if self._state is _FINISHED and self._exception is None:
            result = self._result
            done = True
    finally:
        lock.release()
    if done:
        return result
    return _stdlib_result(self, timeout)


if _fast_futures:
    _future_result.__name__ = "result"
    _future_result.__qualname__ = Future.__qualname__ + ".result"
    _future_result.__doc__ = _stdlib_result.__doc__
    Future.result = _future_result


cdef Py_ssize_t _checked_capacity(object capacity) except -1:
    # The same limits and errors as the pure-Python core (the bare C ssize_t
    # conversion would raise OverflowError naming nothing).
    cdef Py_ssize_t n
    try:
        n = capacity
    except OverflowError:
        if capacity < 0:
            n = 0
        else:
            raise ValueError("capacity must be at most sys.maxsize (%d), got %r"
                             % (sys.maxsize, capacity)) from None
    if n < 1:
        raise ValueError("capacity must be at least 1")
    return n


cdef class RingBuffer:
    """A FIFO of fixed capacity.  ``push`` is O(1) and refuses when full.

    The slots are allocated lazily, doubling up to ``capacity``: most chats
    never hold more than a few waiting tasks, and a dispatcher configured
    with a deep ``queue_size`` must not pay for it on every new chat.
    """

    cdef list _slots          # None where empty; len(_slots) <= capacity
    cdef Py_ssize_t _size     # len(_slots)
    cdef Py_ssize_t _head
    cdef Py_ssize_t _count
    cdef readonly Py_ssize_t capacity

    def __init__(self, capacity):
        self._init(_checked_capacity(capacity))

    cdef inline void _init(self, Py_ssize_t capacity):
        # Also (re)sets the indexes: __init__ called again empties the buffer
        # instead of leaving them pointing past the new slots.
        self._head = 0
        self._count = 0
        self.capacity = capacity
        self._size = 4 if capacity > 4 else capacity
        self._slots = [None] * self._size

    cdef int _grow(self) except -1:
        # Double the slots (up to capacity), unrolling the ring to start at 0.
        cdef Py_ssize_t size = self._size * 2
        if size > self.capacity:
            size = self.capacity
        cdef list slots = self._slots[self._head:] + self._slots[:self._head]
        slots.extend([None] * (size - self._size))
        self._slots = slots
        self._size = size
        self._head = 0
        return 0

    cdef inline bint _push(self, object item) except -1:
        cdef Py_ssize_t i
        if self._count >= self._size:
            if self._count >= self.capacity:
                return False
            self._grow()
        i = self._head + self._count
        if i >= self._size:
            i -= self._size
        self._slots[i] = item
        self._count += 1
        return True

    cdef inline object _pop(self):
        cdef object item = self._slots[self._head]
        self._slots[self._head] = None
        self._head += 1
        if self._head == self._size:
            self._head = 0
        self._count -= 1
        return item

    cdef list _clear(self):
        cdef list items = []
        while self._count:
            items.append(self._pop())
        self._head = 0
        return items

    # The Python-facing methods lock the object itself (a no-op with the
    # GIL); the dispatcher never calls them: it uses the cdef methods above
    # under ChatQueue._lock.

    @cython.critical_section
    def push(self, item):
        """Append ``item``; return False (and store nothing) when full."""
        return self._push(item)

    @cython.critical_section
    def pop(self):
        """Remove and return the oldest item; raise IndexError when empty."""
        if self._count == 0:
            raise IndexError("pop from an empty RingBuffer")
        return self._pop()

    @cython.critical_section
    def clear(self):
        """Remove every item and return them, oldest first."""
        return self._clear()

    @cython.critical_section
    def __len__(self):
        return self._count

    @property
    @cython.critical_section
    def full(self):
        return self._count >= self.capacity


cdef class SendContext
cdef class _Stripe
cdef class _Window
cdef class _Bucket
cdef class _Limiter
cdef class _Runner
cdef class DispatcherCore


@cython.final
cdef class ChatQueue(RingBuffer):
    """One chat's waiting tasks, its lock, and whether a worker owns it."""

    cdef readonly object chat_id
    cdef cython.pymutex _lock  # guards the ring, _running, _retry_item, map removal
    # True from the moment the chat is scheduled until its worker removes
    # the queue from the chat map; at most one worker owns it meanwhile
    # (a parked chat stays owned: it is on the timer's schedule).
    cdef bint _running
    cdef ChatQueue _next_ready  # ready list link; guarded by the pool lock
    cdef object _key            # the chat map's key (see _chat_key)
    cdef _Stripe _stripe        # the part of the chat map that holds it
    cdef bint _removed          # out of the chat map for good; under _lock
    # A task that will run again: it goes before every waiting task and
    # does not count against the capacity (it was accepted once).
    cdef SendContext _retry_item
    # Pacing, owned by whoever owns the chat (its worker, or the timer while
    # it is parked); under the limiter's lock where shared.
    cdef double _not_before     # monotonic time before which it may not start
    cdef bint _granted          # holds a start granted by the global line
    cdef bint _waited           # its next start had to wait for a limit
    cdef _Window _window        # its rate-limit window, while alive
    # The start admitted but not yet made (see _Limiter): which windows
    # hold a place for it (_CHAT | _GLOBAL).
    cdef int _reserved
    cdef _Window _stamped       # the chat window its last start went into
    cdef double _last_start     # ... and when
    # Where its next task must run when that is not here (an event loop, or
    # _WORKERS): set by the owner for itself.
    cdef object _elsewhere
    # A weak reference to the core whose limiter its tasks report learned
    # limits to (set by the core when it makes the queue; None for a queue
    # built by hand): a SendContext kept after its dispatcher is gone must
    # not keep the limiter alive, nor reach it.  Then the key of its
    # learned budgets (made on first use) and the learned budgets that hold
    # a place for its admitted start (both under the limiter's lock).
    cdef object _core_ref
    cdef object _lkey
    cdef _Bucket _lres_chat, _lres_shared, _lres_glob
    # Callers waiting for room (block=True), oldest first (a deque), or
    # None: while there are any the ring is full (a task leaving it lets the
    # oldest waiter's task in, in the same critical section), so a call that
    # does not wait finds no room either.  _woken: the waiters let in under
    # the lock, to wake once it is released.  Both under _lock.
    cdef object _waiters
    cdef list _woken
    # The chats this chat's running task waits for room in, or None (under
    # the core's _wait_lock).
    cdef list _blocked_on
    # Its owner goes on with it holding the max_inflight slot of the
    # coroutine task that just ended (see DispatcherCore._aio_done).
    cdef bint _slot_held

    def __init__(self, chat_id, capacity):
        RingBuffer.__init__(self, capacity)
        self.chat_id = chat_id
        self._key = chat_id


@cython.final
cdef class _Stripe:
    """One part of the chat map: the chats whose key hashes to it.

    On free-threaded CPython every insert into a dict and every removal
    takes that dict's lock; with one map, a producer adding a chat and a
    worker removing an emptied one meet on it (and on its cache lines) at
    every turn.  The map is cut in FD_STRIPES parts (64 there, one with the
    GIL, where nothing runs at the same time anyway).
    """

    cdef dict queues              # key -> ChatQueue (dict ops are atomic)
    cdef cython.pymutex lock      # inserts into queues vs. its reset when empty
    cdef long long high           # the most chats it held since its last reset:
                                  # written under lock, read atomically

    def __cinit__(self):
        self.queues = {}


@cython.final
cdef class _Window:
    """The newest start times of one rate limit (a sliding window).

    A start is allowed at ``t`` when fewer than ``count`` starts fall in
    ``(t - per, t]``.  Besides the stamps of starts made, it counts
    ``_pending`` starts: admitted, not yet made (the task is about to be
    called).  Their time is not known yet, so they count as inside every
    window until they are stamped (``commit``) or given back (``release``).
    The ring keeps the ``count + 1`` newest stamps, oldest first (one more
    than the limit needs: after ``pop_newest`` it still knows the ``count``
    newest starts made before).  Guarded by the limiter's lock.
    """

    cdef readonly int count     # 0: no limit (kept so limit_for is not asked again)
    cdef readonly double per
    cdef double *_stamps        # a ring of count + 1 doubles
    cdef int _cap, _head, _len
    cdef int _pending           # starts admitted, not yet made
    cdef object key
    cdef bint dead
    cdef Py_ssize_t entries     # how many times this window is on the expiry list
    cdef double born            # when the limiter made it ("last start" until one)

    def __cinit__(self, limit, key=None):
        if limit is None:
            self.count, self.per = 0, 1.0
        else:
            self.count, self.per = limit.count, limit.per
        self._cap = self.count + 1
        self._stamps = <double *>PyMem_Malloc(self._cap * sizeof(double))
        if self._stamps == NULL:
            raise MemoryError()
        self.key = key

    def __dealloc__(self):
        PyMem_Free(self._stamps)

    cdef inline double _at(self, int i):
        # The i-th oldest stamp (0 <= i < _len).
        i += self._head
        if i >= self._cap:
            i -= self._cap
        return self._stamps[i]

    cpdef double next_start(self, long long granted=0):
        """Earliest time at which ``granted + 1`` more starts are allowed.

        Infinite when the pending starts alone fill the window: the next
        start then waits for one of them to be made (which wakes the timer).
        """
        cdef long long m
        if self.count == 0:
            return 0.0
        m = <long long>self._len + self._pending - self.count + granted + 1
        if m <= 0:
            return 0.0
        if m > self._len:
            return _INF
        return self._at(<int>(m - 1)) + self.per

    cpdef double last(self):
        return self._at(self._len - 1) if self._len else self.born

    cpdef add(self, double t):
        cdef int i
        if self._len < self._cap:
            i = self._head + self._len
            if i >= self._cap:
                i -= self._cap
            self._stamps[i] = t
            self._len += 1
        else:
            self._stamps[self._head] = t
            self._head += 1
            if self._head == self._cap:
                self._head = 0

    cpdef reserve(self):
        self._pending += 1

    cpdef commit(self, double t):
        """A reserved start was made at ``t`` (no earlier than any stamp)."""
        self._pending -= 1
        self.add(t)

    cpdef release(self):
        """A reserved start will not be made."""
        self._pending -= 1

    cpdef pop_newest(self):
        """Forget the newest stamp (a start the platform refused)."""
        if self._len:
            self._len -= 1


@cython.final
@cython.freelist(256)
cdef class SendContext:
    """What a task receives: its chat, its deadline and its cancellation.

    A task should pass it on to blocking calls (``sc.remaining()`` as a
    timeout) and may poll ``sc.cancelled`` or call ``sc.check()``.
    ``SendContext(chat_id, deadline=None)`` can be built by hand to test a
    sender outside a dispatcher.
    """

    cdef readonly object chat_id
    cdef double _deadline
    cdef bint _has_deadline
    cdef long long _cancel      # atomic; written once, by the outcome's owner
    cdef object _event          # created on first wait(); under _event_lock
    cdef object _fn
    cdef object _future
    cdef double _t_queued
    cdef double _t_start
    cdef Py_ssize_t _queue_len
    cdef int _attempt
    cdef object _error          # set when the deadline or force_close() claims it
    # A running coroutine task's links in the running list (thread tasks
    # are in their worker's _Runner); guarded by DispatcherCore._run_lock.
    cdef SendContext _prev
    cdef SendContext _next
    cdef bint _registered
    # A coroutine task (asubmit): the event loop it runs on, the asyncio Task
    # of the awaitable it returned, and its chat while that runs (None once
    # its end was claimed: see DispatcherCore._claim; _run_lock); all None
    # for a thread task.
    cdef object _loop
    cdef object _aio
    cdef ChatQueue _queue
    # The chat queue of the running attempt (set at its start), through
    # which report_limit reaches the limiter; None outside a dispatcher.
    cdef ChatQueue _chatq
    # asubmit: a copy of the caller's contextvars context, which every
    # attempt runs in.
    cdef object _ctx

    def __init__(self, chat_id, deadline=None):
        self.chat_id = chat_id
        self._attempt = 1
        if deadline is not None:
            self._deadline = float(deadline)
            self._has_deadline = True

    @property
    def attempt(self):
        """Which attempt of the task this is: 1 for the first run."""
        return self._attempt

    @property
    def started(self):
        """``time.monotonic()`` value at which this attempt was called, or None.

        Taken right before the call, after ``on_start``: with pacing, it is
        the very stamp the rate-limit windows hold.  None when the
        dispatcher has no pacing, no ``send_timeout`` and no ``on_done`` hook
        (it then reads no clock per task), or outside a dispatcher.
        """
        return self._t_start if self._t_start != 0.0 else None

    @property
    def deadline(self):
        """``time.monotonic()`` value at which the task must stop, or None."""
        return self._deadline if self._has_deadline else None

    def remaining(self):
        """Seconds left before the deadline (never negative), or None."""
        if not self._has_deadline:
            return None
        return max(0.0, self._deadline - <double>monotonic())

    @property
    def cancelled(self):
        """True once the deadline passed or ``force_close()`` ran."""
        return self._is_cancelled()

    cdef bint _is_cancelled(self) except -1:
        if FD_LOAD(&self._cancel):
            return True
        return self._has_deadline and <double>monotonic() >= self._deadline

    def wait(self, timeout=None):
        """Block until cancelled or ``timeout`` seconds; return ``cancelled``."""
        if self._is_cancelled():
            return True
        remaining = self.remaining()
        if remaining is not None and (timeout is None or remaining < timeout):
            timeout = remaining
        if timeout is not None and timeout > _TIMEOUT_MAX:
            timeout = None  # longer than a lock can wait: until cancelled
        with _event_lock:
            if FD_LOAD(&self._cancel):
                return True
            event = self._event
            if event is None:
                event = self._event = _Event()
        event.wait(timeout)
        return self._is_cancelled()

    def check(self):
        """Raise ``Cancelled`` or ``SendTimeout`` if cancelled; else return."""
        if FD_LOAD(&self._cancel) == _BY_FORCE:
            raise Cancelled("the dispatcher was force-closed")
        if self._is_cancelled():
            raise SendTimeout("the send deadline passed")

    def report_limit(self, remaining, reset_after, *, bucket=None, scope="chat"):
        """Tell the dispatcher what the platform announced in its answer.

        After this attempt at most ``remaining`` more starts are allowed
        before ``reset_after`` seconds from now: for this chat
        (``scope="chat"``), for every chat (``scope="global"``), or for every
        chat that reports the same ``bucket`` string (``bucket`` wins over
        ``scope``).  A later report replaces an earlier one for the same
        bucket.  Bad values raise ``TypeError``/``ValueError`` here, in the
        task.  Outside a dispatcher the values are checked, then dropped.
        Cost: O(1) (one lock, a few dict operations).
        """
        cdef long long n = _checked_remaining(remaining)
        cdef double delay = _checked_reset_after(reset_after)
        cdef bint is_global
        cdef ChatQueue q
        if bucket is not None:
            bucket = _checked_bucket(bucket)
        is_global = _checked_scope(scope)
        q = self._chatq
        if q is not None and q._core_ref is not None:
            core = q._core_ref()
            if core is not None:  # held for the call: the limiter reaches it
                (<DispatcherCore>core)._limiter.learn(q, n, delay, bucket, is_global)

    def __repr__(self):
        return "<SendContext chat_id=%s deadline=%r cancelled=%r>" % (
            _safe_repr(self.chat_id), self.deadline, self.cancelled)

    cdef void _cancel_with(self, long long reason):
        # Called once, by whoever claimed the task out of the running registry.
        FD_STORE(&self._cancel, reason)
        with _event_lock:
            event = self._event
        if event is not None:
            event.set()


@cython.final
cdef class _ChatKey:
    """A chat id as the chat map's key: its hash taken once, its ``==`` safe.

    A chat id is user code: its ``__hash__`` runs again at every dict
    operation (a lookup, an insert, the worker's removal) and may raise or
    change between calls, and its ``__eq__`` may raise.  The map therefore
    keys anything but a plain ``int`` or ``str`` by this wrapper: one hash
    per submit (an error there is the caller's, raised before anything is
    counted), and an ``__eq__`` that raises makes two ids unequal.  Such an
    ``__eq__`` can leave two equal keys in the map; the worker removes its
    own entry all the same, because a key being removed (``_removing``,
    set under its queue's lock) equals nothing but itself.
    """

    cdef readonly object chat_id
    cdef Py_hash_t _hash
    cdef bint _removing   # set under its queue's lock, before the removal

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        if self._removing:
            return self is other
        if type(other) is _ChatKey:
            if (<_ChatKey>other)._removing:
                return self is other
            other_id = (<_ChatKey>other).chat_id
        else:
            other_id = other
        if self.chat_id is other_id:
            return True
        try:
            return bool(self.chat_id == other_id)
        except BaseException:
            return False


cdef _ChatKey _rekey(_ChatKey key):
    # A fresh key for the same chat id and hash (never marked _removing).
    cdef _ChatKey fresh = _ChatKey.__new__(_ChatKey)
    fresh.chat_id = key.chat_id
    fresh._hash = key._hash
    return fresh


cdef inline object _chat_key(object chat_id):
    """The chat map's key for ``chat_id`` (itself for a plain int or str)."""
    if type(chat_id) is int or type(chat_id) is str:
        return chat_id
    return _wrap_chat_id(chat_id)


cdef object _wrap_chat_id(object chat_id):
    cdef _ChatKey key
    cdef Py_hash_t hash_value
    try:
        hash_value = hash(chat_id)
    except TypeError:
        raise TypeError("chat_id must be hashable, got %r"
                        % (type(chat_id).__name__,)) from None
    key = _ChatKey.__new__(_ChatKey)
    key.chat_id = chat_id
    key._hash = hash_value
    return key


cdef inline SendContext _new_item(object chat_id, object fn, object future, double t_queued,
                                  object loop, object ctx):
    cdef SendContext item = SendContext.__new__(SendContext)
    item.chat_id = chat_id
    item._fn = fn
    item._future = future
    item._t_queued = t_queued
    item._attempt = 1
    item._loop = loop
    item._ctx = ctx
    return item


@cython.final
cdef class _Waiter:
    """A caller waiting for room in a full chat (``block=True``).

    ``wake`` is a wake (a SimpleQueue, as an idle worker's: see _sleep) in
    which the waker puts one token (a thread), or a Future of the caller's
    event loop (an ``asubmit``).  ``holder`` is the chat queue of the
    running task the caller waits inside, if any.
    """

    cdef SendContext item
    cdef ChatQueue q
    cdef object loop
    cdef object wake
    cdef int state              # under q._lock
    cdef Py_ssize_t queue_len
    cdef ChatQueue holder


cdef _Waiter _new_waiter(SendContext item, ChatQueue q, object loop, ChatQueue holder):
    cdef _Waiter w = _Waiter.__new__(_Waiter)
    w.item = item
    w.q = q
    w.loop = loop
    if loop is None:
        w.wake = _Wake()
    else:
        w.wake = loop.create_future()
    w.state = _W_WAITING
    w.holder = holder
    return w


cdef int _admit_locked(ChatQueue q) except -1:
    # With q._lock held, a task just left the ring: the oldest waiter's
    # task takes its place (so the ring stays full while anyone waits, and
    # nobody jumps the line).
    cdef _Waiter w = <_Waiter>q._waiters.popleft()
    if not q._waiters:
        q._waiters = None
    q._push(w.item)
    w.state = _W_ADMITTED
    w.queue_len = q._count
    if q._woken is None:
        q._woken = [w]
    else:
        q._woken.append(w)
    return 0


def _call_in_context(SendContext item):
    # In the task's own context (see _start_async): mark it as the running
    # task there, then call it.
    _current_task.set(item)
    return item._fn(item)


# The largest budget kept: more than any platform announces, far from overflow.
cdef long long _MAX_REMAINING = 1 << 62


cdef long long _checked_remaining(object remaining) except -1:
    # report_limit's ``remaining``, checked.  An int subclass is
    # read as the plain int it holds (int.__int__), so that nothing
    # user-defined runs past this point (nor in the limiter's lock).
    if type(remaining) is not int:
        if isinstance(remaining, bool) or not isinstance(remaining, int):
            raise TypeError("report_limit: remaining must be an int, got %s"
                            % (type(remaining).__name__,))
        remaining = int.__int__(remaining)
    if remaining < 0:
        raise ValueError("report_limit: remaining must be >= 0, got %d" % (remaining,))
    if remaining > _MAX_REMAINING:
        return _MAX_REMAINING
    return remaining


cdef double _checked_reset_after(object reset_after) except -1.0:
    # ... its ``reset_after`` (an int or float subclass read as the plain
    # value it holds).
    cdef double delay
    if type(reset_after) is float:
        delay = reset_after
    elif type(reset_after) is int or (isinstance(reset_after, int)
                                      and not isinstance(reset_after, bool)):
        try:
            delay = int.__float__(reset_after)
        except OverflowError:
            delay = _INF
    elif isinstance(reset_after, float):
        delay = float.__float__(reset_after)
    else:
        raise TypeError("report_limit: reset_after must be a number of seconds, got %s"
                        % (type(reset_after).__name__,))
    if delay != delay or delay < 0 or delay > _TIMEOUT_MAX_D:
        raise ValueError("report_limit: reset_after must be >= 0 and at most "
                         "threading.TIMEOUT_MAX (%r), got %r" % (_TIMEOUT_MAX, delay))
    return delay


cdef object _checked_bucket(object bucket):
    # ... its ``bucket``: None or a non-empty str (a subclass read as the
    # plain str it holds).
    if type(bucket) is not str:
        if not isinstance(bucket, str):
            raise TypeError("report_limit: bucket must be a str or None, got %s"
                            % (type(bucket).__name__,))
        bucket = str.__str__(bucket)
    if not bucket:
        raise ValueError("report_limit: bucket must not be empty")
    return bucket


cdef bint _checked_scope(object scope) except -1:
    # ... its ``scope``: True for "global", False for "chat".
    if type(scope) is not str:
        if not isinstance(scope, str):
            raise TypeError("report_limit: scope must be 'chat' or 'global', got %s"
                            % (type(scope).__name__,))
        scope = str.__str__(scope)
    if scope == "chat":
        return False
    if scope == "global":
        return True
    raise ValueError("report_limit: scope must be 'chat' or 'global', got %r" % (scope,))


cdef object _learned_key(ChatQueue q):
    # The key of a chat's learned budgets: like a window's, one that keeps
    # equalling the chat's other keys after its queue left the chat map.
    cdef object key = q._key
    if type(key) is _ChatKey:
        key = _rekey(<_ChatKey>key)
    return key


cdef inline SendContext _take_head_locked(ChatQueue q):
    # With q._lock held: the chat's next task (a retried one first, then the
    # oldest waiting), or None when it has none.
    cdef SendContext item = q._retry_item
    if item is not None:
        q._retry_item = None
    elif q._count:
        item = <SendContext>q._pop()
        if q._waiters is not None:
            _admit_locked(q)
    else:
        return None
    item._queue_len = q._count
    return item


cdef bint _settle(object future, object exc) except -1:
    """Resolve a not-started task's Future with ``exc``.

    Return False when the caller had already cancelled it (then it counts as
    cancelled, not as whatever ``exc`` says).
    """
    if future is None:
        return True
    if isinstance(exc, Cancelled):
        future.cancel()
        _notify_cancelled(future)
        return False
    try:
        future.set_exception(exc)
    except Exception:  # InvalidStateError: cancelled by the caller meanwhile
        _notify_cancelled(future)
        return False
    return True



cdef int _notify_cancelled(object future) except -1:
    # concurrent.futures.wait() and as_completed() see a cancelled Future
    # only once set_running_or_notify_cancel() has moved it on to
    # CANCELLED_AND_NOTIFIED, as an executor does for each one it drops.
    # The worker does that for a task it pops; this is for the others.
    if future._state is _CANCELLED:
        future.set_running_or_notify_cancel()
    return 0


cdef inline bint _is_awaitable(object o) except -1:
    cdef int kind = fd_awaitable_kind(o)
    if kind < 0:
        return inspect.isawaitable(o)
    return kind


cdef object _awaitable_error(SendContext item, object result):
    # A thread task that returned a coroutine (or another awaitable) did not
    # do its work: nothing awaits it on a worker thread.  Close a coroutine
    # (no "never awaited" warning) and fail the task saying what to use.
    if inspect.iscoroutine(result):
        try:
            result.close()
        except BaseException:
            pass
    return TypeError(
        "the task for chat %s returned %s, which a worker thread cannot await: "
        "give coroutine tasks to `await dispatcher.asubmit(chat_id, task)`, which "
        "runs them on the caller's event loop" % (
            _safe_repr(item.chat_id), _safe_repr(type(result).__name__)))


def _aio_set(future, result, error):
    # On the future's own loop: resolve it, unless it is already done (the
    # caller cancelled its await).
    if not future.done():
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


cdef bint _on_loop(object loop, object fn, object a, object b, object c) except -1:
    """Run ``fn(a, b, c)`` on ``loop``: now when this is its thread, else at
    its next turn.  False when the loop is closed (nothing can run there)."""
    if _running_loop() is loop:
        fn(a, b, c)
        return True
    try:
        loop.call_soon_threadsafe(fn, a, b, c)
    except RuntimeError:  # the loop is closed
        return False
    return True


def _cancel_aio(SendContext item):
    # On the loop: cancel the awaitable a coroutine task is running, if any.
    aio = item._aio
    if aio is not None:
        aio.cancel()


cdef inline SendContext _peek_head(ChatQueue q):
    # With q._lock held: the chat's next task, left in place.
    if q._retry_item is not None:
        return q._retry_item
    if q._count:
        return <SendContext>q._slots[q._head]
    return None


@cython.final
cdef class LatencyHistogram:
    """Queue- and run-latency histograms kept by the compiled core itself.

    ``LatencyHistogram(bounds)`` is an ``on_done`` hook (it takes a
    ``DispatchInfo``), and when a dispatcher on the compiled core is given
    it as its ``on_done``, the core records each task's latencies straight
    into it: no ``DispatchInfo`` is built and no Python code runs per task
    (``fastdispatch.metrics`` uses it; a hook of the user's composed with it
    takes the ordinary path).  Buckets are "less than or equal" to each
    bound, plus one above them all; counts and sums are atomic integers, so
    every worker records without a lock.  Tasks that never started are not
    recorded.  ``snapshot()`` returns the queue-latency bucket counts, then
    the run-latency ones, then the two sums in seconds.
    """

    cdef double *_bounds
    cdef Py_ssize_t _n            # len(bounds); there are _n + 1 buckets per histogram
    cdef long long *_counts       # 2 * (_n + 1) atomic counts
    cdef long long _sums[2]       # atomic nanoseconds: queue, run

    def __cinit__(self, bounds):
        cdef Py_ssize_t i
        values = sorted(float(b) for b in bounds)
        if not values:
            raise ValueError("bounds must not be empty")
        self._n = len(values)
        self._bounds = <double *>PyMem_Malloc(self._n * sizeof(double))
        self._counts = <long long *>PyMem_Malloc(2 * (self._n + 1) * sizeof(long long))
        if self._bounds == NULL or self._counts == NULL:
            raise MemoryError()
        for i in range(self._n):
            self._bounds[i] = values[i]
        for i in range(2 * (self._n + 1)):
            self._counts[i] = 0
        self._sums[0] = self._sums[1] = 0

    def __init__(self, bounds):
        pass  # all done in __cinit__, which even LatencyHistogram.__new__ runs

    def __dealloc__(self):
        PyMem_Free(self._bounds)
        PyMem_Free(self._counts)

    cdef inline Py_ssize_t _bucket(self, double value) noexcept nogil:
        # The first bound >= value (bisect_left), or _n above them all.
        cdef Py_ssize_t lo = 0, hi = self._n, mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if self._bounds[mid] < value:
                lo = mid + 1
            else:
                hi = mid
        return lo

    cdef void _record(self, double queue, double run) noexcept nogil:
        FD_ADD(&self._counts[self._bucket(queue)], 1)
        FD_ADD(&self._counts[self._n + 1 + self._bucket(run)], 1)
        FD_ADD(&self._sums[0], <long long>(queue * 1e9))
        FD_ADD(&self._sums[1], <long long>(run * 1e9))

    def __call__(self, info):
        """Record one ``DispatchInfo`` (the path for any other core or caller)."""
        queue, run, error = info[2], info[3], info[4]
        if run == 0.0 and error is not None:
            return  # never started
        self._record(queue, run)

    @property
    def bounds(self):
        return [self._bounds[i] for i in range(self._n)]

    def snapshot(self):
        """[queue buckets..., run buckets..., queue sum, run sum] (seconds)."""
        cdef Py_ssize_t i
        values = [FD_LOAD(&self._counts[i]) for i in range(2 * (self._n + 1))]
        values.append(FD_LOAD(&self._sums[0]) / 1e9)
        values.append(FD_LOAD(&self._sums[1]) / 1e9)
        return values


# Which windows hold a place for a chat's admitted start (ChatQueue._reserved).
cdef enum:
    # Which windows hold a place for a chat's admitted start (_reserved):
    # its own window, the global one, learned budgets (_lres_* say which).
    _CHAT = 1
    _GLOBAL = 2
    _LEARNED = 4
    # What a learned budget covers (_Bucket.kind).
    _B_CHAT = 0
    _B_SHARED = 1
    _B_GLOBAL = 2
    # What _Limiter.admit returns.
    _START = 1
    _PARK = 0
    _REFETCH = -1


@cython.final
cdef class _Bucket:
    """A budget the platform announced (``sc.report_limit``): at most
    ``remaining`` more starts before ``reset`` (a monotonic time).

    ``pending`` counts starts admitted against it, not made yet (as in
    ``_Window``); ``commit`` spends one of ``remaining``.  Once ``reset``
    has passed it no longer applies, and the timer forgets it (``dead``):
    ``in_heap`` says it has its one entry on the limiter's forget schedule.
    A shared bucket knows the chats that reported it (``members``), whose
    links to it go with it.  Guarded by the limiter's lock.
    """

    cdef int kind
    cdef object key             # chat key, bucket string, or None (global)
    cdef long long remaining
    cdef double reset
    cdef long long pending
    cdef bint dead
    cdef bint in_heap
    cdef set members

    def __cinit__(self, int kind, key):
        self.kind = kind
        self.key = key
        if kind == _B_SHARED:
            self.members = set()

    cdef inline bint spent(self, double now):
        """Whether one more start now would overdraw it (it still applies)."""
        return self.reset > now and self.remaining - self.pending <= 0


@cython.final
cdef class _Limiter:
    """Pacing: everything that decides when a chat may start its next task.

    The configured windows (each chat's, the global one), the line of chats
    waiting their turn under the global limit, the global pause of a
    ``RetryAfter(scope="global")``, the budgets the platform announced
    (``learn``: a chat's own, shared buckets, the global one), the wake-up
    schedule of parked chats, and the expiry lists that forget windows once
    their last start has left them and budgets once their reset passed.
    The core asks it once per start (``admit``), tells it when the
    start is made (``commit``, right before the task is called: the limit
    holds where the platform sees it) or will not be (``release``), and the
    timer thread runs ``tick``.  No thread ever sleeps in here.

    Lock: ``_lock`` guards every field below, and the pacing fields of a
    ``ChatQueue`` when the chat changes hands (its owner, a worker or the
    timer's schedule, uses them otherwise).  It is taken inside a queue's
    lock (``admit``), never the other way round, and the only lock taken
    inside it is the timer's (``_need_timer``, to wake the timer thread);
    the timer thread takes it with nothing else held.

    Starts in two steps.  ``admit`` reserves a place in each window the
    start counts against (``_Window._pending``); ``commit`` stamps them with
    the time of the call.  A start admitted but not yet made counts as
    inside every window, so two chats cannot both take the last place, and a
    slow ``on_start`` hook (or, for a coroutine task, the hop to its event
    loop) cannot squeeze two calls closer than the window allows.  Learned
    budgets work the same way (``_Bucket.pending``); a start needs every
    configured window and every learned budget that covers its chat.
    A start admitted before a report and made after it counts against the
    new budget (it is made after the report) even if that leaves it
    overdrawn: what is under way is not called back.

    Learned budgets cost nothing until the first report: it sets the
    core's ``_limited``, after which every start is admitted here.  Each
    budget has one entry on the forget schedule (``_bucket_heap``), pushed
    again when a later report moved its reset further: the tables hold only
    budgets whose reset has not passed.
    """

    cdef cython.pymutex _lock
    # The dispatcher core, borrowed: it owns this limiter and outlives it
    # (no reference cycle for the collector to find).
    cdef PyObject *_core
    cdef bint _closed                 # force_close(): the line and schedule are gone
    cdef double _pause_until          # a global RetryAfter (read unlocked as a hint)
    cdef list _wakeups                # heap of (time, seq, ChatQueue): parked chats
    cdef long long _seq
    cdef object _line                 # deque: chats waiting their turn (global limit)
    cdef Py_ssize_t _line_len
    cdef long long _granted           # starts granted from the line, not yet taken
    cdef _Window _glob
    cdef object _chat_limit, _limit_for
    cdef bint _chat_limits            # chats have windows (chat_limit or limit_for)
    cdef bint _configured             # every start must be admitted
    cdef dict _windows                # chat key -> _Window (outlives the chat's queue)
    cdef dict _expiry                 # per -> deque of _Window, by last start
    cdef long long _paced
    cdef long long _parked
    cdef bint _learned                # a report arrived: budgets may exist
    cdef dict _chat_buckets           # chat key -> _Bucket (scope="chat")
    cdef dict _shared                 # bucket string -> _Bucket
    cdef dict _links                  # chat key -> the shared _Bucket it last reported
    cdef _Bucket _gbucket             # the _Bucket of scope="global", or None
    cdef list _bucket_heap            # heap of (time, seq, _Bucket): when to forget

    def __cinit__(self):
        self._wakeups = []
        self._line = deque()
        self._windows = {}
        self._expiry = {}
        self._chat_buckets = {}
        self._shared = {}
        self._links = {}
        self._bucket_heap = []

    cdef int _configure(self, DispatcherCore core, object pacing) except -1:
        self._core = <PyObject *>core
        self._glob = None
        self._chat_limit = self._limit_for = None
        self._chat_limits = False
        if pacing is not None:
            if pacing.global_limit is not None:
                self._glob = _Window(pacing.global_limit)
            self._chat_limit = pacing.chat_limit
            self._limit_for = pacing.limit_for
            self._chat_limits = pacing.chat_limit is not None or pacing.limit_for is not None
        self._configured = self._glob is not None or self._chat_limits
        return 0

    cdef inline int _need_timer(self, double when) except -1:
        # Make sure the timer looks at its schedules no later than ``when``.
        (<DispatcherCore>self._core)._timer_needed(when)
        return 0

    # -- a chat's window --------------------------------------------------

    cdef _Window window_for(self, ChatQueue q):
        """The chat's live window, made on first use (``limit_for`` runs
        here, outside every lock; its failure is raised to the caller).

        A window outlives the chat's queue until its last start leaves it;
        the timer then forgets it.  Keyed like the chat map (a hash taken
        once, an ``__eq__`` that cannot raise), by a key of its own: the
        queue's key stops equalling others once the queue leaves the map.
        """
        cdef object chat_id = q.chat_id
        cdef object key = q._key
        cdef _Window window
        cdef _Window fresh
        if type(key) is _ChatKey:
            key = _rekey(<_ChatKey>key)
        window = self._windows.get(key)
        if window is not None and not window.dead:
            return window
        limit = self._chat_limit
        if self._limit_for is not None:
            try:
                own = self._limit_for(chat_id)
            except Exception as exc:
                raise TypeError("limit_for(%s) raised %s" % (
                    _safe_repr(chat_id), type(exc).__name__)) from exc
            if own is not None:
                if not isinstance(own, RateLimit):
                    raise TypeError("limit_for(%s) must return a RateLimit or None, got %r"
                                    % (_safe_repr(chat_id), type(own).__name__))
                limit = own
        fresh = _Window(limit, key)
        with self._lock:
            window = self._windows.get(key)
            if window is None or window.dead:
                self._windows[key] = window = fresh
                # On the expiry list from birth: a window whose chat never
                # starts (a cancelled task) is forgotten too.
                fresh.born = monotonic()
                self._expire_later_locked(fresh)
        return window

    # -- one start: admit, then commit or release ---------------------------

    cdef int admit(self, ChatQueue q, _Window window) except -2:
        """May ``q`` start its next task now?  Else park it.

        Called by the chat's owner with ``q._lock`` held.  Returns _START
        (places reserved: ``q._reserved`` says where), _PARK (the chat is on
        the wake-up schedule or in the line; the timer hands it back) or
        _REFETCH (its window was forgotten meanwhile: fetch it again).
        """
        cdef _Window glob
        cdef _Bucket own = None, shared = None, gb = None
        cdef double now, until, t
        cdef int reserved = 0
        with self._lock:
            if self._closed:
                return _START  # force_close(): the core settles it as cancelled
            if window is not None and window.dead:
                q._window = None
                return _REFETCH
            now = monotonic()
            # Time rules first: a retry delay, a global pause, the chat's
            # own window.  A chat that must wait for them waits alone.
            until = q._not_before
            if self._pause_until != 0.0:
                if self._pause_until <= now:
                    self._pause_until = 0.0  # over: back to the fast path
                elif self._pause_until > until:
                    until = self._pause_until
            if window is not None and window.count:
                t = window.next_start(0)
                if t > until:
                    until = t
                    if t > now:
                        q._waited = True
            if self._learned:
                # The learned budgets that cover the chat: its own, the
                # shared bucket it last reported, the global one.
                if self._chat_buckets or self._links:
                    if q._lkey is None:
                        q._lkey = _learned_key(q)
                    if self._chat_buckets:
                        own = self._chat_buckets.get(q._lkey)
                    if self._links:
                        shared = self._links.get(q._lkey)
                gb = self._gbucket
                if own is not None and own.spent(now):
                    q._waited = True
                    if own.reset > until:
                        until = own.reset
                if shared is not None and shared.spent(now):
                    q._waited = True
                    if shared.reset > until:
                        until = shared.reset
                if gb is not None and gb.spent(now):
                    q._waited = True
                    if gb.reset > until:
                        until = gb.reset
            if until > now:
                if q._granted:
                    # Hand the granted start back to the line.
                    q._granted = False
                    self._granted -= 1
                    self._need_timer(now)
                self._park_locked(q, until)
                return _PARK
            q._not_before = 0.0
            # Then the global limit: chats take turns in one line.
            glob = self._glob
            if glob is not None:
                if q._granted:
                    q._granted = False
                    self._granted -= 1
                elif self._line_len or glob.next_start(self._granted) > now:
                    q._waited = True
                    self._line.append(q)
                    self._line_len += 1
                    self._parked += 1
                    self._need_timer(glob.next_start(self._granted))
                    return _PARK
                glob._pending += 1
                reserved = _GLOBAL
            if window is not None and window.count:
                window._pending += 1
                reserved |= _CHAT
            if self._learned:
                if own is not None and own.reset > now:
                    own.pending += 1
                    q._lres_chat = own
                    reserved |= _LEARNED
                if shared is not None and shared.reset > now:
                    shared.pending += 1
                    q._lres_shared = shared
                    reserved |= _LEARNED
                if gb is not None and gb.reset > now:
                    gb.pending += 1
                    q._lres_glob = gb
                    reserved |= _LEARNED
            q._reserved = reserved
            q._stamped = None
            if q._waited:
                q._waited = False
                self._paced += 1
        return _START

    cdef double commit(self, ChatQueue q) except -1.0:
        """The start ``admit`` reserved is being made: stamp it, now.

        Returns the stamp, which the task is called right after.
        """
        cdef double t
        cdef int reserved
        cdef _Window window
        with self._lock:
            t = monotonic()
            reserved = q._reserved
            q._reserved = 0
            if reserved & _LEARNED:
                self._take_learned_locked(q, True)
            if self._closed:
                return t  # force_close() dropped every window
            if reserved & _CHAT:
                window = q._window
                window.commit(t)
                self._expire_later_locked(window)
                q._stamped = window
                q._last_start = t
            if reserved & _GLOBAL:
                self._glob.commit(t)
                self._line_changed_locked()
        return t

    cdef inline int _take_learned_locked(self, ChatQueue q, bint spend) except -1:
        # The learned budgets holding a place for q's start: the start is
        # made (``spend``: one of each budget goes) or given back.
        cdef _Bucket b
        b = q._lres_chat
        if b is not None:
            q._lres_chat = None
            b.pending -= 1
            if spend:
                b.remaining -= 1
        b = q._lres_shared
        if b is not None:
            q._lres_shared = None
            b.pending -= 1
            if spend:
                b.remaining -= 1
        b = q._lres_glob
        if b is not None:
            q._lres_glob = None
            b.pending -= 1
            if spend:
                b.remaining -= 1
        return 0

    cdef int release(self, ChatQueue q) except -1:
        """The start ``admit`` reserved will not be made (the task was
        cancelled, or the dispatcher force-closed, before its call)."""
        cdef int reserved
        cdef _Window window
        with self._lock:
            reserved = q._reserved
            q._reserved = 0
            if reserved & _LEARNED:
                self._take_learned_locked(q, False)
            if self._closed:
                return 0
            if reserved & _CHAT:
                window = q._window
                window.release()
                self._expire_later_locked(window)
            if reserved & _GLOBAL:
                self._glob.release()
                self._line_changed_locked()
        return 0

    cdef int _line_changed_locked(self) except -1:
        # A pending global start was made or given back: the line's next
        # grant may have become possible (it was infinitely far while the
        # pending starts filled the window).  Every change that can make a
        # grant due wakes the timer, which then never sleeps past it.
        if self._line_len:
            self._need_timer(self._glob.next_start(self._granted))
        return 0

    cdef int _expire_later_locked(self, _Window window) except -1:
        # Put the window on the timer's list of windows to forget once
        # their last start has left them (one entry per start, in start
        # order).  The list of each ``per`` is looked up here and dropped by
        # the timer once empty, so that the table does not grow with every
        # distinct ``per`` ever seen.
        expiry = self._expiry.get(window.per)
        if expiry is None:
            expiry = self._expiry[window.per] = deque()
        if not expiry:
            self._need_timer(window.last() + window.per)
        expiry.append(window)
        window.entries += 1
        return 0

    # -- budgets the platform announced ---------------------------------------

    cdef int learn(self, ChatQueue q, long long remaining, double reset_after,
                   object bucket, bint is_global) except -1:
        """A task of ``q`` reported a budget (values checked by the caller).

        O(1): one lock, at most three dict operations; a bucket seen for
        the first time also gets its entry on the forget schedule.
        """
        cdef _Bucket b, old
        cdef double now, reset
        cdef object key
        with self._lock:
            if self._closed:
                return 0
            # Under the lock: a task may report from any thread, even after
            # its end, while the chat's owner admits its next start.
            key = q._lkey
            if key is None:
                key = q._lkey = _learned_key(q)
            if not self._learned:
                self._learned = True
                # From now on every start asks the limiter (a dispatcher
                # that never learns a limit never pays for it).
                (<DispatcherCore>self._core)._limited = True
            now = monotonic()
            reset = now + reset_after
            if bucket is not None:
                b = self._shared.get(bucket)
                if b is None:
                    b = _Bucket(_B_SHARED, bucket)
                    self._shared[bucket] = b
                elif b.reset <= now:
                    # Its reset passed (the timer has not forgotten it yet):
                    # the chats that reported it before are no longer in it.
                    self._unlink_members_locked(b)
                old = self._links.get(key)
                if old is not b:
                    if old is not None:
                        old.members.discard(key)
                    self._links[key] = b
                    b.members.add(key)
            elif is_global:
                b = self._gbucket
                if b is None:
                    b = self._gbucket = _Bucket(_B_GLOBAL, None)
            else:
                b = self._chat_buckets.get(key)
                if b is None:
                    b = _Bucket(_B_CHAT, key)
                    self._chat_buckets[key] = b
            b.remaining = remaining
            b.reset = reset
            if not b.in_heap:
                self._forget_at_locked(b, reset)
        return 0

    cdef int _forget_at_locked(self, _Bucket b, double when) except -1:
        # The bucket's one entry on the forget schedule; the timer is told
        # when it becomes the earliest.
        b.in_heap = True
        self._seq += 1
        entry = (when, self._seq, b)
        _heappush(self._bucket_heap, entry)
        if self._bucket_heap[0] is entry:
            self._need_timer(when)
        return 0

    cdef int _unlink_members_locked(self, _Bucket b) except -1:
        # The chats that reported shared bucket ``b`` leave it.
        cdef dict links = self._links
        for key in b.members:
            if links.get(key) is b:
                del links[key]
        b.members = set()
        if not links:
            links.clear()
        return 0

    cdef int _forget_bucket_locked(self, _Bucket b) except -1:
        # Its reset passed: the budget no longer applies and goes, with the
        # links of the chats that reported it.  Chat keys' __eq__ cannot
        # raise (see _ChatKey); the timer goes on whatever happens.
        cdef dict table = None
        b.dead = True
        try:
            if b.kind == _B_CHAT:
                table = self._chat_buckets
                if table.get(b.key) is b:
                    del table[b.key]
            elif b.kind == _B_SHARED:
                table = self._shared
                if table.get(b.key) is b:
                    del table[b.key]
                self._unlink_members_locked(b)
            elif self._gbucket is b:
                self._gbucket = None
            if table is not None and not table:
                # A dict keeps its largest table after deletions: give back
                # the memory of a burst of chats.
                table.clear()
        except BaseException:
            logger.exception("could not forget a learned rate limit")
        return 0

    cdef int retry_at(self, ChatQueue q, double until, bint is_global,
                      bint refused) except -1:
        """The chat's next attempt may not start before ``until``.

        ``refused``: the platform turned the attempt away (``RetryAfter``),
        so it is not held against the chat's window as well: its stamp goes.
        """
        cdef _Window window
        with self._lock:
            if refused:
                window = q._stamped
                if (window is not None and not window.dead
                        and window.last() == q._last_start):
                    window.pop_newest()
            q._stamped = None
            if until > q._not_before:
                q._not_before = until
            if is_global and until > self._pause_until:
                self._pause_until = until
        return 0

    cdef int return_grant(self, ChatQueue q) except -1:
        """The chat left without using the start the line granted it."""
        with self._lock:
            if q._granted and not self._closed:  # force_close() reset the line
                q._granted = False
                self._granted -= 1
                if self._line_len:
                    self._need_timer(0.0)
        return 0

    cdef int _park_locked(self, ChatQueue q, double until) except -1:
        # Put an owned chat on the wake-up schedule.
        self._seq += 1
        _heappush(self._wakeups, (until, self._seq, q))
        self._parked += 1
        self._need_timer(until)
        return 0

    # -- the timer's side -----------------------------------------------------

    cdef double tick(self, double now, list ready) except? -1.0:
        """Move parked chats whose time came to ``ready``, grant starts from
        the global line, forget stale windows.  Return when to look again."""
        cdef double until = _INF
        cdef double stamp, per
        cdef ChatQueue q
        cdef _Window window
        cdef _Window glob = self._glob
        cdef list wakeups = self._wakeups
        cdef list emptied = None
        cdef list heap
        cdef _Bucket b
        with self._lock:
            while wakeups:
                if <double>wakeups[0][0] > now:
                    until = wakeups[0][0]
                    break
                ready.append(_heappop(wakeups)[2])
                self._parked -= 1
            line = self._line
            if self._line_len:
                if self._pause_until > now:
                    until = min(until, self._pause_until)
                else:
                    while self._line_len and glob.next_start(self._granted) <= now:
                        q = line.popleft()
                        self._line_len -= 1
                        q._granted = True
                        self._granted += 1
                        self._parked -= 1
                        ready.append(q)
                    if self._line_len:
                        # Infinite while pending starts fill the window:
                        # their commit (or release) wakes the timer.
                        until = min(until, glob.next_start(self._granted))
            for per_key, expiry in self._expiry.items():
                # An entry is stale when its window has later ones (it
                # started again since) or a start pending (its commit or
                # release adds a new entry).
                per = per_key
                while expiry:
                    window = expiry[0]
                    if window.entries == 1 and not window._pending:
                        stamp = window.last() + per
                        if stamp > now:
                            until = min(until, stamp)
                            break
                        self._forget_window_locked(window)
                    window.entries -= 1
                    expiry.popleft()
                if not expiry:
                    if emptied is None:
                        emptied = []
                    emptied.append(per_key)
            if emptied is not None:
                for per_key in emptied:
                    del self._expiry[per_key]
            heap = self._bucket_heap
            while heap:
                stamp = heap[0][0]
                if stamp > now:
                    until = min(until, stamp)
                    break
                b = <_Bucket>(_heappop(heap)[2])
                b.in_heap = False
                if b.reset > now:
                    self._forget_at_locked(b, b.reset)  # a later report moved it
                else:
                    self._forget_bucket_locked(b)
        return until

    cdef int _forget_window_locked(self, _Window window) except -1:
        # Its last start left the window: the chat's limit no longer
        # constrains anything, so the window goes (a chat's next start makes
        # a new one).  The chat id's __hash__/__eq__ run here: whatever they
        # do, the timer goes on (the entry is then simply kept).
        window.dead = True
        try:
            if self._windows.get(window.key) is window:
                del self._windows[window.key]
                if not self._windows:
                    # A dict keeps its largest table after deletions: give
                    # back the memory of a burst of chats.
                    self._windows.clear()
        except BaseException:
            logger.exception("could not forget the rate-limit window of a chat")
        return 0

    cdef list cancel_all(self):
        """force_close(): empty the schedule and the line; return the chats
        that were on them (owned by nobody now)."""
        cdef list parked
        cdef _Window window
        with self._lock:
            self._closed = True
            parked = [entry[2] for entry in self._wakeups]
            parked.extend(self._line)
            self._wakeups = []
            self._line.clear()
            self._line_len = 0
            self._parked = self._granted = 0
            self._pause_until = 0.0
            # Nothing starts any more: no window can constrain anything.
            for window in self._windows.values():
                window.dead = True
            self._windows.clear()
            self._expiry.clear()
            self._chat_buckets.clear()
            self._shared.clear()
            self._links.clear()
            self._gbucket = None
            self._bucket_heap = []
        return parked

    cdef tuple counters(self):
        with self._lock:
            return self._paced, self._parked

    cdef dict state(self):
        with self._lock:
            return {"windows": len(self._windows),
                    "expiry": sum([len(e) for e in self._expiry.values()]),
                    "expiry_lists": len(self._expiry),
                    "wakeups": len(self._wakeups), "line": len(self._line),
                    "granted": self._granted, "parked": self._parked,
                    "pending": self._glob._pending if self._glob is not None else 0,
                    "buckets": (len(self._chat_buckets) + len(self._shared)
                                + (self._gbucket is not None)),
                    "links": len(self._links), "bucket_heap": len(self._bucket_heap)}


cdef class _Runner:
    """One worker thread's place in the running registry: the task it runs.

    A worker runs one thread task at a time, so its registry entry is one
    field under a lock of its own.  A start and an end write only here:
    no lock, list or neighbouring task that other workers write.  (With
    one list for all, every start and end wrote the previous task's links,
    an object another worker had just written, and took a lock every
    worker takes: about 15 % of a ``post`` on free-threaded CPython, see
    docs/performance.md.)  The timer and force_close() take the lock only
    when they look, which is seldom.  Made by its worker, so on
    free-threaded CPython its reference count stays that thread's.
    """

    cdef cython.pymutex lock    # guards item
    cdef SendContext item       # the task its worker runs, or None: whoever
                                # takes it out (to None) owns its outcome
    cdef fd_back *back          # objects its worker gives back, not yet
                                # published (free-threaded builds; its
                                # worker's alone: no lock)
    cdef ChatQueue chat         # the chat its worker runs (its worker's
                                # alone; read by running_chat() there)

    def __dealloc__(self):
        # Its worker publishes the block when it exits; this is a backstop.
        fd_back_drop(self.back)


cdef class DispatcherCore:
    """The per-chat queues, the worker loop and the deadline loop.

    ``OutboundDispatcher`` (in ``_dispatcher.py``) adds configuration checks,
    threads and the lifecycle on top of this class.
    """

    # The chat map: chat key -> ChatQueue, in FD_STRIPES parts (_Stripe),
    # and how many chats it holds (atomic; counted as they go in and out).
    cdef list _stripes
    cdef long long _chats
    cdef long long _closed            # atomic
    # configuration (written once, before any task)
    cdef Py_ssize_t _max_inflight
    cdef Py_ssize_t _queue_size
    cdef double _send_timeout
    cdef bint _has_timeout
    cdef double _idle_timeout
    cdef object _on_queued, _on_start, _on_done, _on_rejected, _on_retry, _recover
    cdef LatencyHistogram _histogram  # on_done, when it is one: recorded from C
    cdef object _retry, _retry_on
    cdef int _max_attempts
    cdef double _max_retry_after
    cdef _Limiter _limiter            # pacing (its own lock; see the class)
    cdef object __weakref__
    cdef object _ref                  # a weak reference to itself, for its chat queues
    cdef bint _limited                # every start asks the limiter
    # worker pool; all guarded by _pool_lock
    cdef cython.pymutex _pool_lock
    cdef ChatQueue _ready_head
    cdef ChatQueue _ready_tail
    cdef long long _ready_len         # atomic, so workers may peek without the lock
    cdef list _idle                   # the wakes of idle workers (a stack)
    cdef Py_ssize_t _threads
    cdef bint _searching              # a worker is on its way to the ready list
    cdef bint _stopping
    # Running tasks, where the timer (deadlines) and force_close() find
    # them: a thread task in its worker's _Runner (_runners: _pool_lock),
    # a coroutine task in the running list, oldest first (the deadline
    # schedule of coroutine tasks); the list and the timer's state are
    # guarded by _run_lock.
    cdef list _runners
    cdef cython.pymutex _run_lock
    cdef SendContext _run_head
    cdef SendContext _run_tail
    cdef object _timer_wake
    cdef int _timer_state
    cdef bint _timer_started
    cdef bint _timer_stop
    cdef double _timer_until          # when the sleeping timer wakes by itself
    # Atomic, written with _timer_until: that time in nanoseconds while
    # the timer sleeps until it, else 0.  A worker's start whose deadline
    # is no earlier needs nothing from the timer: it looks at every
    # runner when it wakes (see _register).
    cdef long long _timer_by
    # The earliest need that arrived while the timer was awake (it looks at
    # the limiter outside _run_lock): seen when it decides to sleep.
    cdef double _timer_next
    cdef long long _forced            # atomic; force_close() began: nothing starts
    # Coroutine tasks (asubmit).  Every start takes one of max_inflight
    # slots (_inflight), held until the task ends: a coroutine task in
    # flight holds one but no thread.  With thread tasks only, a worker always
    # finds one (there are at most max_inflight workers); a chat that finds
    # none waits in _slot_waiters (_pool_lock) until an end hands it one.
    cdef bint _async_used
    cdef object _slot_waiters         # deque of ChatQueue; _pool_lock
    cdef long long _slot_waiting      # atomic: its length, peeked unlocked
    cdef dict _handoffs               # ChatQueue -> (loop, when): handed to a loop; _run_lock
    cdef dict _loop_items             # loop -> set of its running coroutine tasks; _run_lock
    # counters (atomic)
    cdef long long _pending
    cdef long long _drain_waiters
    cdef long long _inflight          # slots taken (see above): tasks in flight
    cdef long long _submitted
    cdef long long _rejected
    cdef long long _retried
    cdef long long _counts[5]
    # Callers waiting for room (block=True): how many (atomic), the most
    # allowed, and how many chats have a running task that waits for room
    # (_wait_lock, which also guards every ChatQueue._blocked_on).
    cdef long long _waiting
    cdef Py_ssize_t _max_waiting
    cdef cython.pymutex _wait_lock
    cdef Py_ssize_t _task_waiting
    cdef object _tls                  # per worker thread: its _Runner (running_chat)
    # Objects the workers give back to their creating threads, in blocks
    # (free-threaded builds, see fd_back): a lock-free stack, pushed by a
    # worker per full block, taken whole by submit and post.
    cdef fd_back *_back

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
        self._retry_on = ()
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
            self._retry_on = retry.retry_on
            self._max_attempts = retry.max_attempts
            self._max_retry_after = retry.max_retry_after
        else:
            self._retry_on = ()
            self._max_attempts = 1
            self._max_retry_after = 0.0
        self._limiter._configure(self, pacing)
        # Whether every start must ask the limiter (else only a chat with a
        # pending retry delay or during a global pause does).  Set for good
        # by the first report_limit (_Limiter.learn).
        self._limited = self._limiter._configured

    # ------------------------------------------------------------------ submit

    def submit(self, chat_id, task, *, block=False, timeout=None):
        """Queue ``task`` for ``chat_id``; return a ``Future`` of its result.

        Cost: O(1) — one dict lookup, one lock, one push; a new chat also
        allocates its queue, and a chat without a worker is scheduled.
        Raises ``TypeError`` for bad arguments, ``QueueFull`` when the chat
        already has ``queue_size`` waiting tasks, ``DispatcherClosed`` after
        ``close()``; in each case nothing was queued.

        ``block=True``: when the chat is full, this thread waits for room
        (in turn with the chat's other waiters) instead, at most ``timeout``
        seconds (None: no limit), then ``QueueFull``.  ``QueueFull`` at
        once if ``max_waiting`` callers already wait, or if the wait could
        never end (the caller is the chat's own running task; see
        https://github.com/fastdispatch/fastdispatch/blob/main/docs/dispatcher.md#waiting-for-room);
        ``DispatcherClosed`` if ``close()`` comes first.
        """
        if not callable(task):
            raise TypeError("task must be callable, got %r" % (type(task).__name__,))
        if block or timeout is not None:
            timeout = _checked_wait(timeout)
        future = _new_future()
        waiter = self._enqueue(chat_id, task, future, None, block, None)
        if waiter is not None:
            self._wait_for_room(<_Waiter>waiter, timeout)
        return future

    def post(self, chat_id, task, *, block=False, timeout=None):
        """Like ``submit`` without a Future: the outcome reaches hooks only."""
        if not callable(task):
            raise TypeError("task must be callable, got %r" % (type(task).__name__,))
        if block or timeout is not None:
            timeout = _checked_wait(timeout)
        waiter = self._enqueue(chat_id, task, None, None, block, None)
        if waiter is not None:
            self._wait_for_room(<_Waiter>waiter, timeout)

    async def asubmit(self, chat_id, task, *, block=False, timeout=None):
        """Queue ``task`` for ``chat_id`` and await its result.

        Must be called from a coroutine on a running event loop
        (``RuntimeError`` otherwise).  ``task(sc)`` is called on this loop's
        thread, in a copy of the caller's ``contextvars`` context taken
        now (as ``asyncio.create_task`` does); when it returns an awaitable,
        that runs on this loop, in that context, and the chat stays owned
        until it ends; no thread is held meanwhile.  Returns the task's
        result or raises what ``submit``'s Future would hold (the task's
        exception, ``SendTimeout``, ``TaskDiscarded``, ``Cancelled``);
        ``QueueFull`` and ``DispatcherClosed`` at once.  ``block=True``:
        a full chat makes this coroutine wait for room as ``submit`` does
        (holding no thread).  Cancelling the await while it waits for
        room, or before the task started, skips it; after, the running
        attempt's awaitable is cancelled (whichever attempt it is) and the
        chat goes on.
        """
        global _asyncio, _running_loop
        if _asyncio is None:
            import asyncio as _asyncio_module
            _running_loop = _asyncio_module._get_running_loop
            _asyncio = _asyncio_module
        loop = _running_loop()
        if loop is None:
            raise RuntimeError(
                "asubmit() must be awaited in a coroutine running on an event loop "
                "(e.g. inside asyncio.run()); from a thread without a running loop, "
                "use submit() or post()")
        if not callable(task):
            raise TypeError("task must be callable, got %r" % (type(task).__name__,))
        if block or timeout is not None:
            timeout = _checked_wait(timeout)
        future = loop.create_future()
        self._async_used = True
        item = self._enqueue(chat_id, task, future, loop, block, _copy_context())
        if type(item) is _Waiter:
            waiter = item
            item = (<_Waiter>waiter).item
            await self._await_room(waiter, timeout, future)
        try:
            if future.done():
                # Its task ended in this call (it returned no awaitable):
                # still let the loop run others once, as before the chat
                # started here, so that a loop of such calls cannot starve
                # them.
                await _asyncio.sleep(0)
            return await future
        except _asyncio.CancelledError:
            # The caller cancelled its await: the attempt running now (if
            # any) is cancelled too; one not started yet is skipped.
            if future.cancelled():
                _cancel_aio(item)
            raise

    cdef inline _Stripe _stripe_for(self, object key):
        # The part of the chat map for a key made by _chat_key: its hash
        # (cached for a wrapped chat id, so no user code runs), its bits
        # mixed so that ids that are multiples of FD_STRIPES spread too.
        cdef Py_hash_t h
        cdef size_t i = 0
        if FD_STRIPES > 1:
            if type(key) is _ChatKey:
                h = (<_ChatKey>key)._hash
            else:
                h = hash(key)   # an int or a str
            i = (<size_t>h * <size_t>0x9E3779B97F4A7C15ULL) >> (8 * sizeof(size_t) - FD_STRIPE_BITS)
        return <_Stripe>self._stripes[i]

    cdef object _enqueue(self, object chat_id, object task, object future,
                         object loop, bint block, object ctx):
        # Queue the task; or, when its chat is full and the caller waits
        # (``block``), return the _Waiter it must wait on (else None).
        cdef ChatQueue q
        cdef ChatQueue fresh
        cdef SendContext item
        cdef Py_ssize_t queue_len
        cdef bint start = False
        cdef _Stripe stripe
        cdef dict queues
        cdef Py_ssize_t held
        cdef ChatQueue holder = None
        cdef object waiter = None
        if chat_id is None:
            raise TypeError("chat_id must not be None")
        if FD_HANDBACK:
            self._take_back()
        key = _chat_key(chat_id)
        stripe = self._stripe_for(key)
        queues = stripe.queues
        q = queues.get(key)
        item = _new_item(chat_id, task, future,
                         monotonic() if self._on_done is not None else 0.0, loop, ctx)
        if block:
            holder = self._holder()
        # Count the task as pending *before* looking at ``closed``: then a
        # shutdown() that saw no pending work also made this call see closed.
        FD_ADD(&self._submitted, 1)
        FD_ADD(&self._pending, 1)
        if FD_LOAD(&self._closed):
            self._reject(chat_id, DispatcherClosed("the dispatcher is closed"), False)
        while True:
            if q is None:
                # Allocate only on a miss; setdefault keeps whichever queue
                # another submitter may have installed first.
                fresh = ChatQueue(chat_id, self._queue_size)
                fresh._key = key
                fresh._stripe = stripe
                fresh._core_ref = self._ref
                with stripe.lock:
                    q = queues.setdefault(key, fresh)
                    if q is fresh:
                        FD_ADD(&self._chats, 1)
                        held = len(queues)
                        if held > stripe.high:
                            FD_STORE(&stripe.high, held)
            with q._lock:
                # G5 (docs/guarantees.md): the worker may have removed this very queue
                # from the map while we waited for its lock.  Pushing onto
                # it would give the chat a second queue and a second worker.
                # (_removed is set in the same critical section as the
                # removal: it says whether the map still holds this queue,
                # without running the chat id's __eq__ again.)
                if not q._removed:
                    if q._push(item):
                        queue_len = q._count
                        start = not q._running
                        q._running = True
                    else:
                        queue_len = -1
                        if block:
                            waiter = self._add_waiter_locked(q, item, loop, holder)
                else:
                    queue_len = 0   # orphaned queue: retry from the lookup
            if queue_len:
                break
            q = None  # (only now: q's lock must outlive the with-block)
        if queue_len < 0:
            if block:
                if type(waiter) is _Waiter:
                    return waiter
                self._reject(chat_id, _no_room(chat_id, q.capacity, waiter,
                                               self._max_waiting), False)
            self._reject(chat_id, QueueFull(
                "chat %s already has %d waiting tasks" % (_safe_repr(chat_id), q.capacity)),
                False)
        if start and loop is None:
            self._schedule(q)
        if self._on_queued is not None:
            try:
                self._on_queued(chat_id, queue_len)
            except BaseException as exc:  # the task is queued: submit must return
                self._hook_failed("on_queued", exc)
        if loop is None:
            return None
        if start:
            # asubmit, on ``loop``: the chat it now owns starts here, in this
            # call, as a free asyncio.Lock is taken without a trip through
            # the loop (a hand-off would cost a callback, a lock and an
            # entry the timer must watch, per chat that starts).
            self._drain_chat(q, loop, None)
        return item

    cdef int _reject(self, object chat_id, object exc, bint waited) except -1:
        # ``waited``: a caller that waited for room (not counted as submitted).
        if not waited:
            FD_ADD(&self._submitted, -1)
        FD_ADD(&self._pending, -1)
        FD_ADD(&self._rejected, 1)
        self._maybe_drained()
        if self._on_rejected is not None:
            try:
                self._on_rejected(chat_id, exc)
            except BaseException as hook_exc:
                self._hook_failed("on_rejected", hook_exc)
        raise exc

    # ------------------------------------------------------- waiting for room

    cdef object _add_waiter_locked(self, ChatQueue q, SendContext item, object loop,
                                   ChatQueue holder):
        # With q._lock held, the chat full: enter the caller in the chat's
        # line of waiters and return its _Waiter, or say why it may not wait.
        # A running task that waits holds a max_inflight slot (and, a thread
        # task, its worker) until room comes: refused when room could then
        # never come (its own chat; every slot held by waiting tasks; a
        # cycle of chats whose running tasks wait for each other), and a
        # thread's wait on a running event loop once coroutine tasks exist.
        cdef _Waiter waiter
        cdef int why
        if holder is q:
            return _NO_ROOM_SELF
        if loop is None and self._async_used and _running_loop() is not None:
            return _NO_ROOM_LOOP  # a thread wait would stall the loop coroutine tasks need
        if FD_ADD(&self._waiting, 1) >= self._max_waiting:
            FD_ADD(&self._waiting, -1)
            return _NO_ROOM_MAX
        if holder is not None:
            why = self._block_on(holder, q)
            if why:
                FD_ADD(&self._waiting, -1)
                return why
        FD_ADD(&self._submitted, -1)  # counted once let in
        waiter = _new_waiter(item, q, loop, holder)
        if q._waiters is None:
            q._waiters = deque()
        q._waiters.append(waiter)
        if FD_LOAD(&self._closed):
            # close() may have swept this chat before we came: turn away now.
            q._waiters.remove(waiter)
            if not q._waiters:
                q._waiters = None
            waiter.state = _W_CLOSED
            self._wake_waiter(waiter)
        return waiter

    cdef int _block_on(self, ChatQueue holder, ChatQueue q) except -1:
        # The chat ``holder``'s running task is about to wait for room in
        # ``q``: record it, or return why that wait could never end.
        cdef ChatQueue other
        cdef set seen
        cdef list todo
        with self._wait_lock:
            if holder._blocked_on is None and self._task_waiting + 1 >= self._max_inflight:
                return _NO_ROOM_SLOTS
            seen = set()
            todo = [q]
            while todo:
                other = <ChatQueue>todo.pop()
                if other is holder:
                    return _NO_ROOM_CYCLE
                if other._blocked_on is not None and id(other) not in seen:
                    seen.add(id(other))
                    todo.extend(other._blocked_on)
            if holder._blocked_on is None:
                holder._blocked_on = [q]
                self._task_waiting += 1
            else:
                holder._blocked_on.append(q)
        return 0

    cdef int _unblock(self, ChatQueue holder, ChatQueue q) except -1:
        with self._wait_lock:
            holder._blocked_on.remove(q)
            if not holder._blocked_on:
                holder._blocked_on = None
                self._task_waiting -= 1
        return 0

    cdef int _wake_waiter(self, _Waiter waiter) except -1:
        # Wake a waiter whose state was decided (under its chat's lock).
        if waiter.loop is None:
            waiter.wake.put(None)
        else:
            _on_loop(waiter.loop, _aio_set, waiter.wake, None, None)
        return 0

    cdef int _wake_admitted(self, ChatQueue q) except -1:
        # After q._lock was released: wake the waiters let in meanwhile.
        cdef list woken
        with q._lock:
            woken = q._woken
            q._woken = None
        if woken:
            FD_ADD(&self._submitted, len(woken))
            FD_ADD(&self._waiting, -len(woken))
            for w in woken:
                self._wake_waiter(<_Waiter>w)
        return 0

    cdef int _close_waiters(self) except -1:
        # close(): every caller waiting for room gets DispatcherClosed.
        cdef ChatQueue q
        cdef object waiters
        chats = []
        for stripe in self._stripes:
            chats.extend(list((<_Stripe>stripe).queues.values()))
        for q in chats:
            with q._lock:
                waiters = q._waiters
                q._waiters = None
                if waiters is not None:
                    for w in waiters:
                        (<_Waiter>w).state = _W_CLOSED
            if waiters is not None:
                for w in waiters:
                    self._wake_waiter(<_Waiter>w)
        return 0

    def _wait_for_room(self, _Waiter waiter, timeout):
        # submit/post with block=True: this thread waits for its turn.
        try:
            woken = _sleep(waiter.wake, timeout)
        except BaseException:
            self._end_wait(waiter, False, None)
            raise
        self._end_wait(waiter, not woken, timeout)

    async def _await_room(self, _Waiter waiter, timeout, future):
        # asubmit with block=True: this coroutine waits for its turn.
        timer = None
        if timeout is not None:
            timer = waiter.loop.call_later(timeout, _aio_set, waiter.wake, _TIMED_OUT, None)
        try:
            timed_out = (await waiter.wake) is _TIMED_OUT
        except BaseException:
            # Cancelled: nothing is left behind (a task let in meanwhile is
            # skipped, as a task cancelled before it started).
            try:
                if self._end_wait(waiter, False, None):
                    future.cancel()
            except DispatcherClosed:
                pass  # closed meanwhile: the cancellation is what the caller sees
            raise
        finally:
            if timer is not None:
                timer.cancel()
        self._end_wait(waiter, timed_out, timeout)

    def _end_wait(self, _Waiter waiter, bint timed_out, timeout):
        # The end of a wait for room.  ``timed_out``: the caller gives up
        # because its timeout passed (QueueFull), else it was woken, or it
        # gives up because it was interrupted.  Returns True if its task was
        # let in, else raises QueueFull or DispatcherClosed (or returns
        # False: interrupted).
        cdef ChatQueue q = waiter.q
        cdef SendContext item = waiter.item
        cdef int state
        with q._lock:
            state = waiter.state
            if state == _W_WAITING:
                q._waiters.remove(waiter)
                if not q._waiters:
                    q._waiters = None
                state = waiter.state = _W_GONE
        if waiter.holder is not None:
            self._unblock(waiter.holder, q)
        if state == _W_ADMITTED:
            if self._on_queued is not None and waiter.queue_len:
                try:
                    self._on_queued(item.chat_id, waiter.queue_len)
                except BaseException as exc:
                    self._hook_failed("on_queued", exc)
            return True
        FD_ADD(&self._waiting, -1)
        if state == _W_GONE and not timed_out:
            FD_ADD(&self._pending, -1)
            self._maybe_drained()
            return False
        chat_id = item.chat_id
        item._fn = item._future = None
        self._reject(chat_id, _wait_ended(chat_id, state == _W_CLOSED, timeout), True)

    # ------------------------------------------------ the running task's chat

    def running_chat(self):
        """The chat id of this dispatcher's task that the calling code runs in.

        A thread task: the calling thread is the worker running it; a
        coroutine task: the calling code runs in its call or its awaitable
        (its asyncio Task and what inherits that context).  None anywhere
        else.  A request for that chat made from there would wait for the
        very task making it: plug-ins send it inline instead.
        """
        cdef ChatQueue q = self._holder()
        return None if q is None else q.chat_id

    cdef ChatQueue _holder(self):
        # The chat queue of the running task of this dispatcher that the
        # calling code runs in, or None.
        cdef ChatQueue q
        cdef SendContext item
        runner = getattr(self._tls, "runner", None)
        if runner is not None and (<_Runner>runner).chat is not None:
            return (<_Runner>runner).chat
        found = _current_task.get()
        if found is not None:
            item = <SendContext>found
            q = item._chatq
            if item._fn is not None and q is not None and q._core_ref is self._ref:
                return q
        return None

    cdef int _schedule(self, ChatQueue q) except -1:
        # Put a chat that just got work (and has no worker) on the ready list.
        # When all max_inflight workers are busy the chat simply waits there:
        # it holds no thread (G6, docs/guarantees.md).
        cdef object searcher
        with self._pool_lock:
            self._ready_append(q)
            searcher = self._call_searcher_locked()
        self._send_searcher(searcher)
        return 0

    cdef object _call_searcher_locked(self):
        # With _pool_lock held: if no worker is already on its way to the
        # ready list, send one (an idle one, else a new one under the cap).
        # One at a time: a searcher that finds work calls the next one, so
        # workers are woken as fast as they actually start, not once per
        # chat (with the GIL, a burst of wake-ups is a burst of thread
        # switches that buys nothing).  Returns the idle worker's wake to
        # give a token, _SPAWN to start a new worker, or None.
        if self._searching:
            return None
        if self._idle:
            self._searching = True
            return self._idle.pop()
        if self._threads < self._max_inflight:
            self._searching = True
            self._threads += 1
            return _SPAWN
        return None

    cdef int _send_searcher(self, object searcher) except -1:
        if searcher is None:
            return 0
        if searcher is not _SPAWN:
            searcher.put(None)
        else:
            try:
                self._spawn_worker()
            except BaseException:
                with self._pool_lock:
                    self._threads -= 1
                    self._searching = False
                logger.exception("could not start a worker thread")
        return 0

    cdef inline void _ready_append(self, ChatQueue q):
        # With _pool_lock held.
        q._next_ready = None
        if self._ready_tail is None:
            self._ready_head = q
        else:
            self._ready_tail._next_ready = q
        self._ready_tail = q
        FD_ADD(&self._ready_len, 1)

    cdef inline ChatQueue _ready_popleft(self):
        # With _pool_lock held; the list is not empty.
        cdef ChatQueue q = self._ready_head
        self._ready_head = q._next_ready
        if self._ready_head is None:
            self._ready_tail = None
        q._next_ready = None
        FD_ADD(&self._ready_len, -1)
        return q

    def queue_len(self, chat_id):
        """Number of tasks of ``chat_id`` waiting (the running one excluded)."""
        cdef ChatQueue q
        key = _chat_key(chat_id)
        q = self._stripe_for(key).queues.get(key)
        if q is None:
            return 0
        with q._lock:
            return q._count

    @property
    def active_chats(self):
        """Chats that have waiting or running work."""
        return FD_LOAD(&self._chats)

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

    def _counters(self):
        cdef Py_ssize_t threads
        with self._pool_lock:
            threads = self._threads
        paced, parked = self._limiter.counters()
        return (FD_LOAD(&self._submitted), FD_LOAD(&self._counts[C_COMPLETED]),
                FD_LOAD(&self._counts[C_FAILED]), FD_LOAD(&self._rejected),
                FD_LOAD(&self._counts[C_DISCARDED]), FD_LOAD(&self._counts[C_CANCELLED]),
                FD_LOAD(&self._counts[C_TIMED_OUT]), FD_LOAD(&self._chats),
                FD_LOAD(&self._inflight), threads, FD_LOAD(&self._retried), paced, parked,
                FD_LOAD(&self._waiting))

    def _pacing_state(self):
        """Sizes of the limiter's structures (for tests and debugging)."""
        return self._limiter.state()

    def _pending_count(self):
        return FD_LOAD(&self._pending)

    def _uses_loops(self):
        """Whether coroutine tasks (asubmit) were ever queued."""
        return self._async_used

    def _add_drain_waiter(self, long long n):
        FD_ADD(&self._drain_waiters, n)

    cdef int _maybe_drained(self) except -1:
        if (FD_LOAD(&self._drain_waiters) and not FD_LOAD(&self._pending)
                and not FD_LOAD(&self._chats) and not FD_LOAD(&self._inflight)):
            if FD_HANDBACK:
                self._take_back()
            self._notify_drained()
        return 0

    # ------------------------------------------ giving objects back (see fd_back)

    def __dealloc__(self):
        fd_back_drop(fd_back_take(&self._back))

    cdef inline int _keep(self, _Runner runner, object o) except -1:
        # On ``runner``'s worker, before it drops its last reference to
        # ``o``: keep one to give back to ``o``'s creating thread.
        if o is not None and fd_back_keep(&runner.back, o) == 2:
            fd_back_publish(&self._back, runner.back)
            runner.back = NULL
        return 0

    cdef int _flush(self, _Runner runner) except -1:
        # The worker goes idle (or exits): publish its partial block.  Nothing
        # pending: no submit may come to take the stack, so take it here
        # (dropping those objects queues them to their creators, as without
        # the hand-back; one publishing after this sees the count too).
        if runner.back != NULL:
            fd_back_publish(&self._back, runner.back)
            runner.back = NULL
        if not FD_LOAD(&self._pending):
            self._take_back()
        return 0

    cdef inline int _take_back(self) except -1:
        # Drop everything given back (on a producer: as the objects' owner).
        if fd_back_waiting(&self._back):
            fd_back_drop(fd_back_take(&self._back))
        return 0

    # ----------------------------------------------------------------- workers

    def _worker_main(self):
        """Body of one worker thread: take a ready chat, drain it, repeat."""
        cdef ChatQueue q
        cdef bint searching = True  # a new worker was started as the searcher
        cdef _Runner runner = _Runner()
        wake = _Wake()
        with self._pool_lock:
            self._runners.append(runner)
        self._tls.runner = runner
        try:
            while True:
                q = self._next_chat(wake, searching, runner)
                if q is None:
                    return
                runner.chat = q  # what running_chat() says in this thread meanwhile
                self._drain_chat(q, None, runner)
                runner.chat = q = None  # an idle worker keeps nothing of the chats it ran
                searching = False
        finally:
            with self._pool_lock:
                self._runners.remove(runner)
            if FD_HANDBACK:
                self._flush(runner)

    cdef ChatQueue _next_chat(self, object wake, bint searching, _Runner runner):
        # Return the next ready chat, or None when this worker should exit
        # (idle for idle_timeout, or the dispatcher is stopping).
        # ``searching``: this worker was woken (or started) as the searcher.
        cdef ChatQueue q
        cdef object searcher
        cdef bint found
        while True:
            searcher = None
            q = None
            with self._pool_lock:
                if searching:
                    self._searching = searching = False
                    if FD_LOAD(&self._ready_len) > 1:
                        # More work than this worker: pass the baton on.
                        searcher = self._call_searcher_locked()
                if self._ready_head is not None:
                    q = self._ready_popleft()
                elif self._stopping:
                    self._threads -= 1
                    return None
                else:
                    self._idle.append(wake)
            if q is not None:
                self._send_searcher(searcher)
                return q
            if FD_HANDBACK:
                self._flush(runner)
            if _sleep(wake, self._idle_timeout):
                searching = True
                continue
            with self._pool_lock:
                found = wake in self._idle
                if found:
                    self._idle.remove(wake)
                    self._threads -= 1
            if found:
                return None
            # A waker popped us just as we timed out; take its token.
            _sleep(wake, None)
            searching = True

    cdef int _drain_chat(self, ChatQueue q, object here, _Runner runner) except -1:
        # Run the chat's tasks that belong here (on a worker, ``here`` None
        # and ``runner`` its own: thread tasks; on an event loop, ``runner``
        # None: that loop's coroutine tasks) until
        # the chat is empty, parked, handed to where its next task runs, or
        # left to a coroutine task whose end will go on with it.
        cdef SendContext item
        cdef bint rotate
        cdef int ran
        while True:
            if q._slot_held:
                q._slot_held = False
            elif not self._take_slot(q):
                return 0  # waits for a slot: a task's end hands it one
            if (self._limited or q._not_before != 0.0
                    or self._limiter._pause_until != 0.0):
                found = self._next_paced(q, here)
            else:
                with q._lock:
                    found = self._take_head_here_locked(q, here)
                    if found is None:
                        # G5 (docs/guarantees.md): the empty queue leaves the map while
                        # its lock is held, so a submitter's re-check cannot
                        # miss it.
                        q._running = False
                        if FD_HANDBACK and runner is not None:
                            # Before the map drops them: the queue and its key.
                            self._keep(runner, q)
                            self._keep(runner, q._key)
                        self._remove_locked(q)
            if q._woken is not None:
                self._wake_admitted(q)  # its task took the place of one that left
            if found is None or found is _PARKED_CHAT or found is _AGAIN or found is _ELSEWHERE:
                self._release_slot()
                if found is None:
                    break
                if found is _PARKED_CHAT:
                    return 0
                if found is _ELSEWHERE:
                    target = q._elsewhere
                    q._elsewhere = None
                    if target is _WORKERS:
                        self._schedule(q)
                        return 0
                    if self._hand_to_loop(q, target):
                        return 0
                    self._drop_dead_head(q, target)
                continue
            item = <SendContext>found
            if here is None:
                ran = self._run(item, q, runner)
                if FD_HANDBACK and ran != _RETRYING:
                    self._keep(runner, item)
            else:
                ran = self._start_async(item, q, here)
                if ran == _ASYNC:
                    return 0  # its awaitable's end goes on with the chat (slot kept)
            self._release_slot()
            if ran == _PANICKED:
                return 0  # the task panicked; its chat is gone
            if ran == _DONE and here is None and FD_LOAD(&self._ready_len):
                # Other chats wait for a worker: go to the back of the line
                # so that a busy chat cannot starve quiet ones.
                with q._lock:
                    rotate = q._count != 0
                if rotate:
                    with self._pool_lock:
                        self._ready_append(q)
                    return 0
        if q._granted:
            self._limiter.return_grant(q)
        self._maybe_drained()
        return 0

    cdef object _take_head_here_locked(self, ChatQueue q, object here):
        # With q._lock held: the chat's next task if it runs here, else
        # _ELSEWHERE (q._elsewhere says where), or None when it has none.
        cdef SendContext head
        if self._async_used:
            head = _peek_head(q)
            if head is not None and head._loop is not here:
                q._elsewhere = head._loop if head._loop is not None else _WORKERS
                return _ELSEWHERE
        return _take_head_locked(q)

    cdef int _dispatch(self, ChatQueue q) except -1:
        # An owned chat that no thread or loop is running: give it to
        # whoever runs its next task (the workers, or that task's loop).
        cdef SendContext head = None
        if self._async_used:
            with q._lock:
                head = _peek_head(q)
            if head is not None and head._loop is not None and self._hand_to_loop(q, head._loop):
                return 0
        self._schedule(q)
        return 0

    # ------------------------------------------------------- coroutine tasks

    cdef bint _hand_to_loop(self, ChatQueue q, object loop) except -1:
        # Give an owned chat whose next task is ``loop``'s to that loop.
        # False when the loop is closed or not running: that task can never
        # start there.  A loop that stops before it takes the chat loses it
        # again to the timer (see _check_loops_locked).
        cdef double now
        cdef bint taken
        if loop.is_closed() or not loop.is_running():
            return False
        now = monotonic()
        with self._run_lock:
            self._handoffs[q] = (loop, now)
            self._timer_needed_locked(now + _HANDOFF_CHECK)
        try:
            if _running_loop() is loop:
                loop.call_soon(self._loop_step, q)
            else:
                loop.call_soon_threadsafe(self._loop_step, q)
        except RuntimeError:  # closed meanwhile
            with self._run_lock:
                taken = self._handoffs.pop(q, None) is not None
            return not taken  # else the timer took it back and handed it on
        return True

    def _loop_step(self, ChatQueue q):
        # On the loop a chat was handed to: take it (unless the timer took it
        # back meanwhile) and run its tasks that are this loop's.
        cdef bint mine
        with self._run_lock:
            mine = self._handoffs.pop(q, None) is not None
        if mine:
            self._drain_chat(q, _running_loop(), None)

    cdef int _drop_dead_head(self, ChatQueue q, object loop) except -1:
        # The loop the chat's next task belongs to is closed, or stopped
        # before it could start it: that task never runs.  It fails with
        # Cancelled, and the chat goes on.
        cdef SendContext head
        cdef SendContext item = None
        with q._lock:
            head = _peek_head(q)
            if head is not None and head._loop is loop:
                item = _take_head_locked(q)
        if q._woken is not None:
            self._wake_admitted(q)
        if item is None:
            return 0
        error = Cancelled("the event loop of this coroutine task is closed or stopped "
                          "before the task could start")
        if item._attempt > 1:
            self._settle_started(item, error, C_CANCELLED)
        else:
            self._finish(item, error, C_CANCELLED)
            self._maybe_drained()
        return 0

    cdef bint _take_slot(self, ChatQueue q) except -1:
        # One of the max_inflight slots for the chat's next start, or False
        # (the chat then waits in _slot_waiters, which a task's end serves).
        if FD_ADD(&self._inflight, 1) < self._max_inflight:
            return True
        FD_ADD(&self._inflight, -1)
        with self._pool_lock:
            self._slot_waiters.append(q)
            FD_ADD(&self._slot_waiting, 1)
        # A slot freed between our look and our wait must not be missed.
        if FD_LOAD(&self._inflight) < self._max_inflight:
            self._wake_slot_waiter()
        return False

    cdef inline int _release_slot(self) except -1:
        # The last slot given back may be what a drain() waits for (a
        # worker holds one from before it takes a task until after it has
        # ended it and, for the chat's last one, removed the emptied queue).
        if FD_ADD(&self._inflight, -1) == 1 and FD_LOAD(&self._drain_waiters):
            self._maybe_drained()
        if FD_LOAD(&self._slot_waiting):
            self._wake_slot_waiter()
        return 0

    cdef int _wake_slot_waiter(self) except -1:
        cdef ChatQueue q = None
        with self._pool_lock:
            if self._slot_waiters:
                q = self._slot_waiters.popleft()
                FD_ADD(&self._slot_waiting, -1)
        if q is not None:
            self._dispatch(q)
        return 0

    cdef int _start_async(self, SendContext item, ChatQueue q, object loop) except -1:
        # On ``loop``'s thread: start one attempt of a coroutine task.
        # _ASYNC when the awaitable it returned runs on now (its end goes on
        # with the chat); else it ended at once, and this returns what
        # _run does.
        cdef object future = item._future
        cdef object result = None
        cdef object error = None
        cdef object panic = None
        cdef bint forced = FD_LOAD(&self._forced) != 0
        if forced or future.cancelled():
            if q._reserved:
                self._limiter.release(q)
            error = (Cancelled("the dispatcher was force-closed") if forced
                     else Cancelled("cancelled before it started"))
            if item._attempt == 1:
                self._finish(item, error, C_CANCELLED)
                self._maybe_drained()
            else:
                self._settle_started(item, error, C_CANCELLED)
            return _DONE
        if not self._begin(item, q, None):
            return _DONE
        ctx = item._ctx
        try:
            # In the caller's context (copied at asubmit), never in the
            # context of whoever started the chat's run.
            result = ctx.run(_call_in_context, item)
        except Exception as exc:
            error = exc if type(exc) is not TypeError else _task_call_error(item.chat_id, exc)
        except BaseException as exc:
            error = panic = exc
        if error is None and _is_awaitable(result):
            try:
                if PyCoro_CheckExact(result):
                    aio = ctx.run(loop.create_task, result)
                else:
                    aio = ctx.run(_asyncio.ensure_future, result, loop=loop)
            except Exception as exc:
                error = exc
            else:
                item._aio = aio
                with self._run_lock:
                    item._queue = q
                    items = self._loop_items.get(loop)
                    if items is None:
                        items = self._loop_items[loop] = set()
                        self._timer_needed_locked(<double>monotonic() + _LOOP_CHECK)
                    items.add(item)
                aio.add_done_callback(functools.partial(self._aio_done, item))
                return _ASYNC
        return self._end(item, q, result, error, panic, False, False, None)

    cdef ChatQueue _claim(self, SendContext item):
        # The end of a running coroutine task is handled once: by its loop
        # (_aio_done), or by the timer when that loop was closed first.
        # Returns the task's chat to whoever claims it, else None.
        cdef ChatQueue q
        with self._run_lock:
            q = item._queue
            if q is not None:
                item._queue = None
                items = self._loop_items.get(item._loop)
                if items is not None:
                    items.discard(item)
                    if not items:
                        del self._loop_items[item._loop]
        return q

    def _aio_done(self, SendContext item, aio):
        # On the loop: the awaitable of a coroutine task ended.
        cdef int ran
        cdef ChatQueue q = self._claim(item)
        if q is None:
            return
        loop = item._loop
        item._aio = None
        result = error = panic = None
        cancelled = aio.cancelled()
        if not cancelled:
            error = aio.exception()
            if error is None:
                result = aio.result()
            elif not isinstance(error, Exception):
                panic = error
        ran = self._end(item, q, result, error, panic, cancelled, False, None)
        if ran == _PANICKED:
            self._release_slot()
        else:
            # The chat goes on with the slot its ended task held: giving it
            # back here would wake a chat waiting for one, only for this
            # chat to take it again first (and that chat to wait again).
            q._slot_held = True
            self._drain_chat(q, loop, None)

    cdef int _end_on_closed_loop(self, SendContext item) except -1:
        # The loop of a running coroutine task is closed: its awaitable will
        # never end there.  End it here, and go on with its chat.
        cdef int ran
        cdef ChatQueue q = self._claim(item)
        if q is None:
            return 0
        item._aio = None
        ran = self._end(item, q, None, None, None, True, False, None)
        self._release_slot()
        if ran != _PANICKED:
            self._dispatch(q)
        return 0

    cdef int _cancel_async(self, SendContext item) except -1:
        # A coroutine task past its deadline, or force-closed: cancel its
        # awaitable on its loop (or end it here if that loop is closed).
        try:
            item._loop.call_soon_threadsafe(_cancel_aio, item)
        except RuntimeError:
            self._end_on_closed_loop(item)
        return 0

    cdef double _check_loops_locked(self, double now, list revoked, list dead) except? -1.0:
        # With _run_lock held (the timer): chats handed to a loop that has
        # stopped or closed without taking them go back (to ``revoked``);
        # coroutine tasks of closed loops go to ``dead``.  Returns when to
        # look again.
        cdef double until = _INF
        cdef double at
        for q, entry in list(self._handoffs.items()):
            loop, at = entry
            if now - at < _HANDOFF_CHECK:
                until = min(until, at + _HANDOFF_CHECK)
            elif loop.is_closed() or not loop.is_running():
                del self._handoffs[q]
                revoked.append(q)
            else:
                until = min(until, now + _HANDOFF_CHECK)  # a busy loop: look again
        for loop, items in list(self._loop_items.items()):
            if loop.is_closed():
                dead.extend(items)
            else:
                until = min(until, now + _LOOP_CHECK)
        return until

    # ------------------------------------------------------------------ pacing

    cdef object _next_paced(self, ChatQueue q, object here):
        # The chat's next task if pacing lets it start now; _PARKED_CHAT if
        # the chat was parked (the timer will hand it back: no worker
        # sleeps for a limit); _AGAIN to look again; _ELSEWHERE if it runs
        # on another thread or loop than ``here``; None once the chat is
        # empty and removed.
        cdef _Limiter limiter = self._limiter
        cdef _Window window = q._window
        cdef bint failed = False
        cdef int admitted
        cdef SendContext head
        if limiter._chat_limits and (window is None or window.dead):
            try:
                window = q._window = limiter.window_for(q)
            except BaseException as exc:
                # limit_for, or the chat id's __hash__/__eq__, failed: the
                # task it was asked for fails with that error.
                if self._refuse_head(q, exc):
                    return _AGAIN
                window = None
                failed = True
        with q._lock:
            if q._retry_item is None and q._count == 0:
                q._running = False
                self._remove_locked(q)
                return None
            if failed:
                return _AGAIN  # a task arrived meanwhile: judge it again
            if self._async_used:
                head = _peek_head(q)
                if head._loop is not here:
                    q._elsewhere = head._loop if head._loop is not None else _WORKERS
                    return _ELSEWHERE
            admitted = limiter.admit(q, window)
            if admitted != _START:
                return _AGAIN if admitted == _REFETCH else _PARKED_CHAT
            return _take_head_locked(q)

    cdef bint _refuse_head(self, ChatQueue q, object exc) except -1:
        # The limiter could not judge this chat (limit_for or the chat id's
        # __hash__/__eq__ failed): its next task fails with that error, the
        # chat goes on with the one after.
        cdef SendContext item
        with q._lock:
            item = _take_head_locked(q)
        if q._woken is not None:
            self._wake_admitted(q)
        if item is None:
            return False
        logger.error("chat %s: cannot apply pacing", _safe_repr(q.chat_id), exc_info=exc)
        if not isinstance(exc, Exception):
            exc = TypeError("pacing failed: %r" % (exc,))
        if item._attempt > 1:
            self._settle_started(item, exc, C_FAILED)
        else:
            self._finish(item, exc, C_FAILED)
            self._maybe_drained()
        return True

    cdef int _remove_locked(self, ChatQueue q) except -1:
        # With q._lock held: take q out of the chat map.  A dict never
        # shrinks on deletion, so after a burst of 100k chats its table would
        # keep its peak size for good; when the last chat of its part leaves,
        # reset that part (under its lock, so that no insert can slip in
        # between) if it grew past FD_KEEP_CHATS since its last reset.  A
        # part that stayed smaller keeps its small table and this path takes
        # no lock: a producer inserting into the part held it (on
        # free-threaded CPython the reset's lock was 15 % of the involuntary
        # switches of a post, docs/performance.md).
        cdef _Stripe stripe = q._stripe
        cdef dict queues
        if stripe is None:      # a queue built by hand: never in the map
            q._removed = True
            return 0
        queues = stripe.queues
        if not q._removed:
            q._removed = True
            key = q._key
            if type(key) is _ChatKey:
                (<_ChatKey>key)._removing = True
            if queues.pop(key, None) is not None:
                FD_ADD(&self._chats, -1)
        if not queues and FD_LOAD(&stripe.high) > FD_KEEP_CHATS:
            with stripe.lock:
                if not queues:
                    queues.clear()
                    FD_STORE(&stripe.high, 0)
        return 0

    cdef int _run(self, SendContext item, ChatQueue q, _Runner runner) except -1:
        """Run one attempt of a thread task on ``runner``'s worker: _DONE,
        _PANICKED or _RETRYING."""
        cdef object future = item._future
        cdef object result = None
        cdef object error = None
        cdef object panic = None
        if FD_LOAD(&self._forced):
            # Popped just before force_close() cleared the queue: dropped as
            # a waiting task is (its Future cancelled).  _register re-checks.
            if q._reserved:
                self._limiter.release(q)
            if item._attempt == 1:
                self._finish(item, Cancelled("the dispatcher was force-closed"), C_CANCELLED)
                self._maybe_drained()
            else:
                self._settle_started(item, Cancelled("the dispatcher was force-closed"),
                                     C_CANCELLED)
            return _DONE
        if item._attempt == 1 and future is not None and not _future_start(future):
            if q._reserved:
                self._limiter.release(q)
            self._finish(item, Cancelled("cancelled before it started"), C_CANCELLED)
            return _DONE
        if not self._begin(item, q, runner):
            return _DONE
        try:
            result = item._fn(item)
        except Exception as exc:
            error = exc if type(exc) is not TypeError else _task_call_error(item.chat_id, exc)
        except BaseException as exc:
            error = panic = exc
        if error is None and result is not None and _is_awaitable(result):
            error = _awaitable_error(item, result)
        return self._end(item, q, result, error, panic, False, future is None, runner)

    cdef bint _begin(self, SendContext item, ChatQueue q, _Runner runner) except -1:
        # The start of an attempt, right before its call (on its worker,
        # ``runner`` its own, or on its loop for a coroutine task, ``runner``
        # None): on_start, the start counted
        # (after on_start, so a slow hook cannot squeeze two calls closer
        # than a window allows), the deadline, the running registry.  False
        # when force_close() came first (the task was settled, never runs).
        if self._on_start is not None:
            try:
                self._on_start(item.chat_id)
            except BaseException as exc:
                self._hook_failed("on_start", exc)
        item._chatq = q
        if q._reserved:
            item._t_start = self._limiter.commit(q)
        elif self._has_timeout or self._on_done is not None:
            item._t_start = monotonic()
        if self._has_timeout:
            item._deadline = item._t_start + self._send_timeout
            item._has_deadline = True
        if not self._register(item, runner):
            # force_close() ran since this task left its queue: it never starts.
            self._settle_started(item, Cancelled("the dispatcher was force-closed"),
                                 C_CANCELLED)
            return False
        return True

    cdef int _end(self, SendContext item, ChatQueue q, object result, object error,
                  object panic, bint cancelled, bint posted, _Runner runner) except -1:
        # The end of an attempt: its outcome (unless the deadline or
        # force_close() claimed it first), a retry, or a panic of its chat.
        # ``cancelled``: a coroutine task's awaitable was cancelled;
        # ``posted``: a task given to post() (no Future); ``runner``: as
        # given to _begin.
        cdef int verdict
        cdef list waiting = None
        if panic is not None:
            # The chat is closed before its panicked task's Future is
            # resolved: a task submitted by whoever saw that result goes to a
            # new queue and runs, it is not discarded with the waiting ones.
            waiting = self._close_panicked(q)
        # Whoever takes the task out of the running registry owns its
        # outcome: us, or the timer (deadline) or force_close().
        if self._unregister(item, runner):
            if FD_HANDBACK and runner is not None:
                self._keep(runner, item._future)
            if cancelled:
                self._resolve(item, None, Cancelled("the coroutine task was cancelled"),
                              C_CANCELLED)
            elif panic is not None:
                discarded = TaskDiscarded("the task panicked: %s" % (_safe_repr(panic),))
                discarded.__cause__ = panic
                self._resolve(item, None, discarded, C_FAILED)
            elif error is not None:
                verdict = self._retry_later(item, q, error)
                if verdict == _RETRYING:
                    return _RETRYING
                if verdict == _FORCED:
                    self._resolve(item, None, Cancelled("the dispatcher was force-closed"),
                                  C_CANCELLED)
                elif verdict == _REFUSED:
                    # The retry decision itself failed (a hostile RetryAfter
                    # or retry_on class): the task fails with that error.
                    error = item._error
                    item._error = None
                    self._resolve(item, None, error, C_FAILED)
                else:
                    self._resolve(item, None, error, C_FAILED)
            else:
                self._resolve(item, result, None, C_COMPLETED)
        else:
            # Timed out or force-closed meanwhile: its outcome is settled;
            # report it now that it has returned, from this thread.  Its
            # error was complete before it was set (see _take_from_runners)
            # and whoever claimed it no longer reads the field.
            error = item._error
            if self._on_done is not None:
                self._report(item, error, <double>monotonic() - item._t_start)
            elif posted and FD_LOAD(&item._cancel) == _BY_TIMEOUT:
                self._log_unobserved(item, error)
            item._error = None
        if panic is not None:
            self._panic(q, panic, waiting)
        item._fn = None
        FD_ADD(&self._pending, -1)
        self._maybe_drained()
        return _PANICKED if panic is not None else _DONE

    cdef object _retry_plan(self, SendContext item, object error):
        # G13 (docs/guarantees.md): how long until ``error``'s task may run again, and whether
        # every chat waits (a global RetryAfter): (delay, is_global,
        # refused), or None when it is not retried.  ``error`` is user code
        # (a RetryAfter subclass may carry anything in ``seconds``, a
        # retry_on class may have a hostile __instancecheck__): what this
        # raises fails the task, never the worker.
        cdef double delay
        if isinstance(error, RetryAfter):
            seconds = error.seconds
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
                raise TypeError("RetryAfter.seconds must be a number, got %r"
                                % (type(seconds).__name__,))
            try:
                delay = float(seconds)
            except OverflowError:
                delay = _INF  # an int too large for a float: longer than any cap
            if delay != delay or delay < 0:
                raise ValueError("RetryAfter.seconds must be >= 0, got %r" % (delay,))
            if delay > self._max_retry_after:
                return None
            scope = error.scope
            return (delay, type(scope) is str and scope == "global", True)
        if self._retry_on and isinstance(error, self._retry_on):
            return (self._retry.backoff_delay(item._attempt), False, False)
        return None

    cdef int _retry_later(self, SendContext item, ChatQueue q, object error) except -1:
        # A RetryAfter, or a retry_on error, runs the same task again ahead
        # of every later task of its chat.  Return _RETRYING, _DONE when it
        # is not retried (it fails with ``error``), _FORCED when
        # force_close() came first, or _REFUSED when deciding failed (the
        # error to fail with is then in item._error).
        cdef double delay, until
        cdef int attempt = item._attempt
        cdef bint is_global, refused
        try:
            plan = self._retry_plan(item, error)
        except BaseException as exc:
            logger.error("chat %s: cannot retry the task's %s", _safe_repr(q.chat_id),
                         _safe_repr(type(error)), exc_info=exc)
            if not isinstance(exc, Exception):
                exc = TypeError("retry decision failed: %s" % (_safe_repr(exc),))
            exc.__cause__ = error
            item._error = exc
            return _REFUSED
        if plan is None:
            return _DONE
        delay, is_global, refused = plan
        if attempt >= self._max_attempts:
            return _DONE
        until = <double>monotonic() + delay
        with q._lock:
            # Checked under the queue's lock: force_close() clears the
            # queues under it after setting _forced, so either it sees this
            # retry item or we see _forced.
            if FD_LOAD(&self._forced):
                return _FORCED
            item._attempt = attempt + 1
            item._has_deadline = False
            q._retry_item = item
        self._limiter.retry_at(q, until, is_global, refused)
        FD_ADD(&self._retried, 1)
        if self._on_retry is not None:
            try:
                self._on_retry(item.chat_id, attempt, delay, error)
            except BaseException as exc:
                self._hook_failed("on_retry", exc)
        return _RETRYING

    cdef int _settle_started(self, SendContext item, object error, int outcome) except -1:
        # Resolve a task whose Future is already RUNNING but that will not
        # run (again): force_close() came first, or pacing failed.
        self._resolve(item, None, error, outcome)
        item._fn = None
        FD_ADD(&self._pending, -1)
        self._maybe_drained()
        return 0

    cdef int _resolve(self, SendContext item, object result, object error,
                      int outcome) except -1:
        # Only the owner of the outcome touches (and then drops) the Future.
        # Counted first: whoever sees the Future done sees it counted.
        cdef object future = item._future
        item._future = None
        FD_ADD(&self._counts[outcome], 1)
        if item._loop is not None:
            _on_loop(item._loop, _aio_set, future, result, error)
        elif future is not None:
            _future_finish(future, result, error)
        elif error is not None and outcome == C_FAILED and self._on_done is None:
            self._log_unobserved(item, error)
        if self._on_done is not None:
            self._report(item, error, <double>monotonic() - item._t_start)
        return 0

    cdef int _log_unobserved(self, SendContext item, object error) except -1:
        # A post()ed task that failed, with no on_done hook to see it: as
        # Python reports an exception that ends a thread, once, with its
        # traceback.
        logger.error("task posted for chat %s failed", _safe_repr(item.chat_id),
                     exc_info=(type(error), error, error.__traceback__))
        return 0

    cdef int _finish(self, SendContext item, object error, int outcome) except -1:
        # Settle a task that never started (cancelled, discarded, dropped).
        if item._loop is not None:
            # asubmit's Future: its caller may have cancelled it; else it
            # gets the error on its loop (a Cancelled too: an exception, not
            # a cancellation of the caller's own await).
            if item._future.cancelled():
                outcome = C_CANCELLED
            else:
                _on_loop(item._loop, _aio_set, item._future, None, error)
        elif not _settle(item._future, error):
            outcome = C_CANCELLED
        FD_ADD(&self._counts[outcome], 1)
        if self._on_done is not None:
            self._report(item, error, 0.0)
        item._fn = item._future = None
        FD_ADD(&self._pending, -1)
        return 0

    cdef int _report(self, SendContext item, object error, double run_latency) except -1:
        cdef double start = item._t_start if item._t_start else <double>monotonic()
        if self._histogram is not None:
            if run_latency != 0.0 or error is None:   # a task that started
                self._histogram._record(max(0.0, start - item._t_queued), run_latency)
            return 0
        # tuple.__new__ straight from C: DispatchInfo's own __new__ is a
        # Python function, a third of the cost of reporting a task.
        info = tuple.__new__(DispatchInfo, (item.chat_id, item._queue_len,
                                            max(0.0, start - item._t_queued), run_latency,
                                            error))
        try:
            self._on_done(info)
        except BaseException as exc:
            self._hook_failed("on_done", exc)
        return 0

    cdef list _close_panicked(self, ChatQueue q):
        # G7 (docs/guarantees.md), first step: the chat's waiting tasks are taken out and
        # its queue is removed (returns those tasks, for _panic).
        cdef list waiting
        with q._lock:
            waiting = q._clear()
            # Callers waiting for room in it are let in, to be discarded
            # with the chat's waiting tasks (woken by _panic).
            while q._waiters is not None:
                _admit_locked(q)
                waiting.append(q._pop())
                (<_Waiter>q._woken[len(q._woken) - 1]).queue_len = 0  # (no wraparound here)
            q._running = False
            self._remove_locked(q)
        return waiting

    cdef int _panic(self, ChatQueue q, object exc, list waiting) except -1:
        # G7: the worker survives; the chat's waiting tasks (taken out
        # by _close_panicked) are discarded, each Future resolved, never
        # left pending; then recover(exc) runs.
        chat = _safe_repr(q.chat_id)
        for item in waiting:
            error = TaskDiscarded("a previous task of chat %s panicked" % (chat,))
            error.__cause__ = exc
            self._finish(<SendContext>item, error, C_DISCARDED)
        if q._woken is not None:
            self._wake_admitted(q)
        logger.error("task of chat %s panicked; %d waiting task(s) discarded",
                     chat, len(waiting), exc_info=exc)
        self._call_recover(exc)
        return 0

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

    # -------------------------------------------------- running tasks, deadlines

    cdef bint _register(self, SendContext item, _Runner runner) except -1:
        # Enter a starting task in the running registry (its worker's
        # runner, or for a coroutine task the running list); False,
        # registering nothing, once force_close() has begun (then the task
        # must not start).
        if runner is not None:
            with runner.lock:
                # force_close() stores _forced, then looks at every runner
                # under its lock: it finds this task, or this finds _forced.
                if FD_LOAD(&self._forced):
                    return False
                runner.item = item
            # The timer looks at every runner each time it wakes, and it
            # stores _timer_by (0) before it looks: if it still promises to
            # wake by this deadline, it will see this task by then.
            if item._has_deadline and not (
                    0 < FD_LOAD(&self._timer_by) <= _ns(item._deadline)):
                self._timer_needed(item._deadline)
            return True
        with self._run_lock:
            if FD_LOAD(&self._forced):
                return False
            item._prev = self._run_tail
            item._next = None
            if self._run_tail is None:
                self._run_head = item
            else:
                self._run_tail._next = item
            self._run_tail = item
            item._registered = True
            if item._has_deadline:
                self._timer_needed_locked(item._deadline)
        return True

    cdef int _timer_needed(self, double when) except -1:
        with self._run_lock:
            self._timer_needed_locked(when)
        return 0

    cdef int _timer_needed_locked(self, double when) except -1:
        # With _run_lock held: make sure the timer looks at its schedules no
        # later than ``when`` (starting it on first use, waking it if it
        # sleeps past that, or telling it before it decides to sleep).
        if not self._timer_started:
            self._timer_started = True
            try:
                self._start_timer()
            except BaseException:
                # The OS refused a thread: the next caller tries again.
                self._timer_started = False
                logger.exception("could not start the timer thread")
        elif self._timer_state == _AWAKE:
            if when < self._timer_next:
                self._timer_next = when
        elif when < self._timer_until:
            self._wake_timer_locked()
        return 0

    def _refuse_new_starts(self):
        # force_close(), before it cancels what runs: from now on _register
        # refuses, so no task starts after force_close() returned.
        with self._run_lock:
            FD_STORE(&self._forced, 1)

    cdef inline void _unlink_locked(self, SendContext item):
        if item._prev is None:
            self._run_head = item._next
        else:
            item._prev._next = item._next
        if item._next is None:
            self._run_tail = item._prev
        else:
            item._next._prev = item._prev
        item._prev = item._next = None
        item._registered = False

    cdef bint _unregister(self, SendContext item, _Runner runner):
        # True if this call took the task out (its outcome is ours).
        cdef bint ours
        if runner is not None:
            with runner.lock:
                ours = runner.item is item
                if ours:
                    runner.item = None
            return ours
        with self._run_lock:
            ours = item._registered
            if ours:
                self._unlink_locked(item)
        return ours

    cdef inline void _set_timer_until_locked(self, double until):
        # With _run_lock held: when the timer wakes by itself (_INF: it is
        # awake, or sleeps with nothing to wait for).
        self._timer_until = until
        FD_STORE(&self._timer_by, _ns(until) if until != _INF else 0)

    cdef int _wake_timer_locked(self) except -1:
        # Wake the timer once per sleep (with _run_lock held):
        # the state flag makes sure it never gets two tokens.
        if self._timer_state != _AWAKE:
            self._timer_state = _AWAKE
            self._set_timer_until_locked(_INF)
            self._timer_wake.put(None)
        return 0

    cdef object _timeout_error(self, SendContext item):
        # A task's SendTimeout, its message made before anyone else sees
        # it, outside any lock: the chat id's repr is user code.
        return SendTimeout("chat %s: the task ran past its %ss send_timeout"
                           % (_safe_repr(item.chat_id), self._send_timeout))

    cdef double _take_from_runners(self, double now, bint forced, list taken) except? -1.0:
        # Take the workers' tasks out of their runners, into ``taken`` as
        # (task, error) pairs: those past their deadline (the timer), or
        # all of them (``forced``: force_close()).  Returns the earliest
        # deadline of those left.  Each error is made first, outside the
        # runner's lock (user code: the chat id's repr; a finalizer that an
        # allocation may run), and set on its task as it is taken: its
        # worker, once it finds the task taken, reads it from there; the
        # taker uses its own reference and never reads the field again.
        cdef double until = _INF
        cdef _Runner runner
        cdef SendContext item
        cdef bint took
        with self._pool_lock:
            runners = list(self._runners)
        for r in runners:
            runner = <_Runner>r
            with runner.lock:
                item = runner.item
                if item is not None and not forced and item._deadline > now:
                    if item._deadline < until:
                        until = item._deadline
                    item = None
            if item is None:
                continue
            pair = (item, Cancelled("the dispatcher was force-closed") if forced
                    else self._timeout_error(item))
            with runner.lock:
                took = runner.item is item  # (else it ended meanwhile)
                if took:
                    runner.item = None
                    item._error = (<tuple>pair)[1]
            if took:
                taken.append(pair)
        return until

    cdef int _claim_overdue(self, list overdue, list expired) except -1:
        # The timer: take the coroutine tasks ``overdue`` (past their deadline
        # when it looked) out of the running list, into ``expired`` as
        # (task, error) pairs, unless they ended since; as in
        # _take_from_runners, each error is made first, outside the lock.
        cdef SendContext item
        pairs = [(item, self._timeout_error(item)) for item in overdue]
        with self._run_lock:
            for pair in pairs:
                item = <SendContext>(<tuple>pair)[0]
                if item._registered:
                    self._unlink_locked(item)
                    item._error = (<tuple>pair)[1]
                    expired.append(pair)
        return 0

    def _timer_main(self):
        """Body of the timer thread: deadlines, parked chats, the global line.

        Deadlines: every task gets the same send_timeout.  A worker's task
        is in its runner: the timer looks at each one.  The list of running
        coroutine tasks is ordered by start time, so also by deadline: the
        timer only ever looks at its head.  Pacing (parked chats, the global line,
        windows to forget) is the limiter's ``tick``, run outside _run_lock.
        A need that arrives meanwhile (a deadline registered, a chat parked,
        a start made) is kept in _timer_next, which the timer reads when it
        decides to sleep: it never sleeps past something due.  It sleeps
        until the earliest of these, or until woken by something earlier;
        after idle_timeout seconds with nothing to watch, it ends (the next
        need starts a new one), so that a dispatcher dropped without
        shutdown() is not kept alive by it.
        """
        cdef list expired
        cdef list ready
        cdef list revoked
        cdef list dead
        cdef SendContext item
        cdef double now, until, delay
        cdef bint stop, retry, due
        cdef _Limiter limiter = self._limiter
        while True:
            overdue = []
            expired = []
            ready = []
            revoked = []
            dead = []
            with self._run_lock:
                stop = self._timer_stop
                if not stop:
                    self._timer_next = _INF
                    now = monotonic()
                    until = _INF
                    if self._has_timeout:
                        item = self._run_head
                        while item is not None and item._deadline <= now:
                            overdue.append(item)
                            item = item._next
                        if item is not None:
                            until = item._deadline
                    if self._handoffs or self._loop_items:
                        until = min(until, self._check_loops_locked(now, revoked, dead))
            if stop:
                return
            if overdue:
                self._claim_overdue(overdue, expired)
            if self._has_timeout:
                until = min(until, self._take_from_runners(now, False, expired))
            if not expired:
                until = min(until, limiter.tick(now, ready))
            for pair in expired:
                self._expire(<SendContext>(<tuple>pair)[0], _BY_TIMEOUT, (<tuple>pair)[1])
            for q in ready:
                self._dispatch(<ChatQueue>q)
            for q in revoked:
                self._schedule(<ChatQueue>q)  # a worker drops the task its loop never started
            for item in dead:
                self._end_on_closed_loop(item)
            if expired or ready or revoked or dead:
                continue
            with self._run_lock:
                stop = self._timer_stop
                if self._timer_next < until:
                    until = self._timer_next
                now = monotonic()
                due = until <= now
                if not stop and not due:
                    # About to sleep (only then: a waker releases the wake
                    # lock once per sleep, as the state says).
                    self._set_timer_until_locked(until)
                    self._timer_state = _IDLE if until == _INF else _UNTIL_DEADLINE
            if stop:
                return
            if due:
                continue  # something became due while we looked
            if until == _INF:
                delay = self._idle_timeout
            else:
                # A wait longer than TIMEOUT_MAX raises: wake up
                # earlier and look again (every wait is bounded at its
                # source too).
                delay = until - now
                if delay > _TIMEOUT_MAX_D:
                    delay = _TIMEOUT_MAX_D
            if _sleep(self._timer_wake, delay):
                continue
            with self._run_lock:
                stop = self._timer_state == _IDLE
                if stop:
                    # Nothing to watch for idle_timeout seconds: end, as an
                    # idle worker does (the next task with a deadline starts
                    # a new thread), so that a dispatcher dropped without
                    # shutdown() is not kept alive by this thread.
                    self._timer_state = _AWAKE
                    self._timer_started = False
                retry = self._timer_state != _AWAKE
                if retry:
                    self._timer_state = _AWAKE
                    self._set_timer_until_locked(_INF)
            if stop:
                return
            if not retry:
                # Woken just after the timeout: consume that token.
                _sleep(self._timer_wake, None)

    def _stop_timer(self):
        with self._run_lock:
            self._timer_stop = True
            self._wake_timer_locked()

    cdef int _expire(self, SendContext item, long long reason, object error) except -1:
        # The task is still running (Python cannot stop a thread); we release
        # its Future now (with ``error``, the one set on the task when it
        # was taken) and drop whatever it returns later.
        cdef int outcome = C_TIMED_OUT if reason == _BY_TIMEOUT else C_CANCELLED
        item._cancel_with(reason)
        future = item._future
        item._future = None
        FD_ADD(&self._counts[outcome], 1)
        if item._loop is not None:
            # A coroutine task: its caller hears it on its loop, and its
            # awaitable is cancelled there (its end goes on with the chat).
            _on_loop(item._loop, _aio_set, future, None, error)
            self._cancel_async(item)
        elif future is not None:
            _future_finish(future, None, error)
        # on_done is called by the task's worker once the task returns (see
        # _run): a slow hook here would hold every other deadline, or
        # force_close().
        return 0

    # ---------------------------------------------------------------- lifecycle

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

    def _stop_workers(self):
        """Wake every idle worker so that it exits; stop the timer."""
        with self._pool_lock:
            self._stopping = True
            idle = self._idle
            self._idle = []
        for wake in idle:
            wake.put(None)
        self._stop_timer()
