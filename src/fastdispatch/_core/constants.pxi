# The core's constants: sentinels, outcome and state codes, the wake-up.
#
# The compiled twin of _core/constants.py, whose docstring explains this
# room; included by _ringbuf.pyx.  What differs here: the same names and
# values as constants.py (enums here, so that C compares them).

logger = logging.getLogger("fastdispatch")

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
    # What _timer_round returns instead of a time: look again at once, or end.
    _TIMER_AGAIN = 0
    _TIMER_STOP = -1
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
# asyncio's own Future type and BaseEventLoop.create_future (set with _asyncio):
# a loop that keeps that create_future gets its Futures made directly.
cdef object _AioFuture = None
cdef object _base_create_future = None

# What _call_searcher_locked returns when a new worker thread must start.
cdef object _SPAWN = object()

# The coroutine task whose code runs in this context (set in the task's own
# context when it starts; see DispatcherCore.running_chat).
_current_task = contextvars.ContextVar("fastdispatch_current_task", default=None)

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

# The largest budget kept: more than any platform announces, far from overflow.


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


# Wake-ups.  An idle worker, the timer and a thread waiting for room sleep
# on a wake of their own (a SimpleQueue), in which a waker puts one token.
# Not a Lock that the waker releases: on free-threaded CPython, acquiring a
# held Lock spins first and only then sleeps, and the wait of a thread
# going idle is seldom short; SimpleQueue.get sleeps at once.
cdef inline bint _sleep(object wake, object timeout) except -1:
    # Take a token: True if one came, False after ``timeout`` seconds
    # (None: wait for one).
    try:
        wake.get(True, timeout)
    except _Empty:
        return False
    return True
