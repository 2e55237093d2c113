"""The core's constants: sentinels, outcome and state codes, the wake-up.

Every room imports its codes from here, so that each is defined once per
core; the compiled core's ``constants.pxi`` has the same names with the
same values (tests/test_core_rooms.py compares them).
"""

import contextvars
import logging
from queue import Empty as _Empty, SimpleQueue
import threading


logger = logging.getLogger("fastdispatch")

_allocate_lock = threading.Lock

_NOT_CANCELLED, _BY_TIMEOUT, _BY_FORCE = 0, 1, 2

# The timer thread's state: awake, asleep until the registry head's deadline,
# or asleep with nothing to wait for (a task start must wake it).
_AWAKE, _UNTIL_DEADLINE, _IDLE = 0, 1, 2
# What _timer_round returns instead of a time: look again at once, or end.
_TIMER_AGAIN, _TIMER_STOP = 0, -1

# What _call_searcher_locked returns when a new worker thread must start.
_SPAWN = object()

# Outcome counters, indexes into _Bookkeeping._counts.
C_COMPLETED, C_FAILED, C_DISCARDED, C_CANCELLED, C_TIMED_OUT = 0, 1, 2, 3, 4

# What _run returns: the task ended, it panicked, or it will run again.
_DONE, _PANICKED, _RETRYING, _FORCED, _REFUSED = 0, 1, 2, 3, 4

# What _start_async returns when the task's awaitable now runs on its loop.
_ASYNC = 5

# How often the timer looks at event loops that hold work of this
# dispatcher: a chat handed to a loop that stopped before it took the chat
# is taken back (its task never starts there); the coroutine tasks of a
# closed loop are ended (they can never end there).
_HANDOFF_CHECK = 0.1

_LOOP_CHECK = 0.5

# The chat map is reset when it empties only if it held more chats than
# this since its last reset (see _remove_locked; FD_KEEP_CHATS in the C twin).
_KEEP_CHATS = 32

# Where a chat's next task runs when it is not an event loop's.
_WORKERS = object()

# asyncio, imported by the first asubmit() (a thread-only program never
# pays for it).
_asyncio = None

# What _next_paced returns besides a task: parked, or look again.
_PARKED_CHAT, _AGAIN = object(), object()

# ... or: the chat's next task runs elsewhere (ChatQueue.elsewhere says where).
_ELSEWHERE = object()

_INF = float("inf")

_TIMEOUT_MAX = threading.TIMEOUT_MAX

# The coroutine task whose code runs in this context (set in the task's own
# context when it starts; see DispatcherCore.running_chat).
_current_task = contextvars.ContextVar("fastdispatch_current_task", default=None)

# A caller waiting for room (_Waiter.state): still waiting, let in (its task
# is in the chat's queue), woken by close(), or gone (timed out, cancelled).
_W_WAITING, _W_ADMITTED, _W_CLOSED, _W_GONE = 0, 1, 2, 3

# Why a caller that asked to wait may not (_add_waiter_locked; _errors._no_room
# says it with the same codes).
_NO_ROOM_MAX, _NO_ROOM_SELF, _NO_ROOM_SLOTS, _NO_ROOM_CYCLE, _NO_ROOM_LOOP = 1, 2, 3, 4, 5

# What a waiting asubmit's wake-up Future holds when its timeout passed.
_TIMED_OUT = object()

# Which windows hold a place for a chat's admitted start (ChatQueue.reserved):
# its own window, the global one, learned budgets (ChatQueue.lres says which).
_CHAT, _GLOBAL, _LEARNED = 1, 2, 4

# What a learned budget covers (_Bucket.kind).
_B_CHAT, _B_SHARED, _B_GLOBAL = 0, 1, 2

# What _Limiter.admit returns.
_START, _PARK, _REFETCH = 1, 0, -1


# Wake-ups.  An idle worker, the timer and a thread waiting for room sleep
# on a wake of their own (a SimpleQueue), in which a waker puts one token.
# Not a Lock that the waker releases: on free-threaded CPython, acquiring a
# held Lock spins first and only then sleeps, and the wait of a thread
# going idle is seldom short; SimpleQueue.get sleeps at once.
_Wake = SimpleQueue


def _sleep(wake, timeout):
    # Take a token: True if one came, False after ``timeout`` seconds
    # (None: wait for one).
    try:
        wake.get(True, timeout)
    except _Empty:
        return False
    return True

