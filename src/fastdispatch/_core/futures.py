"""Moving a task's ``concurrent.futures.Future`` through its states.

A Future is settled exactly once, by whoever takes the task's outcome
(G7, docs/guarantees.md): ``_future_start`` moves it to RUNNING unless the
caller cancelled it first, ``_future_finish`` to FINISHED, ``_settle``
resolves one that never started, and ``_notify_cancelled`` lets a
cancelled Future's waiters go.  In the twin these are the public methods;
the compiled core makes the same state changes from C.
"""

from concurrent.futures._base import (
    CANCELLED as _CANCELLED, CANCELLED_AND_NOTIFIED as _CANCELLED_AND_NOTIFIED, PENDING
    as _PENDING)

from .._errors import Cancelled


def _settle(future, exc):
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


def _future_start(future):
    """``future.set_running_or_notify_cancel()``: False if it was cancelled.

    The caller holds the Future too and may have moved it on itself
    (``set_running_or_notify_cancel()``, ``set_result()``): only a
    cancellation skips the task; anything else leaves it to run (whatever
    it returns is then dropped).
    """
    state = future._state
    if state == _CANCELLED_AND_NOTIFIED:
        return False
    if state == _PENDING or state == _CANCELLED:
        try:
            return future.set_running_or_notify_cancel()
        except RuntimeError:  # moved on by the caller meanwhile
            return not future.cancelled()
    return True


def _future_finish(future, result, error):
    """``set_result(result)``, or ``set_exception(error)`` if it is not None.

    A Future the caller already resolved (or cancelled) keeps what it has:
    the worker, the timer thread and the chat go on.
    """
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except Exception:  # InvalidStateError
        pass


def _notify_cancelled(future):
    # concurrent.futures.wait() and as_completed() see a cancelled Future
    # only once set_running_or_notify_cancel() has moved it on to
    # CANCELLED_AND_NOTIFIED, as an executor does for each one it drops.
    # The worker does that for a task it pops; this is for the others.
    if future._state == _CANCELLED:
        future.set_running_or_notify_cancel()
