"""Deadlines and the timer thread (G9).

The running registry holds every task that runs now, in start order, so
also in deadline order (every task gets the same ``send_timeout``).  The
timer thread (``fastdispatch-deadlines``), started on first need, sleeps
until the earliest thing due: a deadline, a parked chat's turn (the
limiter's ``tick``), an event loop to check.  A task past its deadline is
taken out of the registry by whoever gets there first, the timer or the
task's own end: the taker owns its outcome.  ``_run_lock`` guards the
registry and the timer's sleep state; ``_forced`` (force_close) stops
every new start.
"""

from time import monotonic

from .._errors import _safe_repr, SendTimeout

from .constants import (
    _AWAKE, _BY_TIMEOUT, _IDLE, _INF, _sleep, _TIMEOUT_MAX, _TIMER_AGAIN, _TIMER_STOP,
    _UNTIL_DEADLINE, C_CANCELLED, C_TIMED_OUT, logger)
from .futures import _future_finish
from .items import _aio_set, _on_loop
from .waiting import _WaitingRoom


class _Deadlines(_WaitingRoom):
    """The running registry and the timer thread."""

    __slots__ = ("_run_lock", "_running", "_timer_wake", "_timer_state", "_timer_started",
                 "_timer_stop", "_timer_until", "_timer_next", "_forced", "_handoffs",
                 "_loop_items")

    def _register(self, item):
        # Enter a starting task in the running registry; False, registering
        # nothing, once force_close() has begun (then the task must not start).
        with self._run_lock:
            if self._forced:
                return False
            self._running[item] = None
            if item._deadline is not None:
                self._timer_needed_locked(item._deadline)
        return True

    def _refuse_new_starts(self):
        # force_close(), before it cancels what runs: from now on _register
        # refuses, so no task starts after force_close() returned.
        with self._run_lock:
            self._forced = True

    def _unregister(self, item):
        with self._run_lock:
            return self._running.pop(item, 0) is None

    def _timer_needed(self, when):
        with self._run_lock:
            self._timer_needed_locked(when)

    def _timer_needed_locked(self, when):
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

    def _wake_timer_locked(self):
        # Wake the sleeping timer (with _run_lock held): one token per
        # sleep, as the state flag says.
        if self._timer_state != _AWAKE:
            self._timer_state = _AWAKE
            self._timer_until = _INF
            self._timer_wake.put(None)

    def _timer_main(self):
        """Body of the timer thread: deadlines, parked chats, the global line.

        Deadlines: the registry is ordered by start time and every task gets
        the same send_timeout, so it is also ordered by deadline: the timer
        only ever looks at its head.  Pacing (parked chats, the global line,
        windows to forget) is the limiter's ``tick``, run outside _run_lock.
        A need that arrives meanwhile (a deadline registered, a chat parked,
        a start made) is kept in _timer_next, which the timer reads when it
        decides to sleep: it never sleeps past something due.  It sleeps
        until the earliest of these, or until woken by something earlier;
        after idle_timeout seconds with nothing to watch, it ends (the next
        need starts a new one), so that a dispatcher dropped without
        shutdown() is not kept alive by it.
        """
        while True:
            until = self._timer_round()
            if until == _TIMER_STOP:
                return
            if until != _TIMER_AGAIN and not self._timer_sleep(until):
                return

    def _timer_round(self):
        # One look at everything the timer watches, acting on what is due.
        # Returns when to look next (_INF: nothing to watch), _TIMER_AGAIN
        # when it acted (which may have made more due), or _TIMER_STOP.
        expired = []
        ready = []
        revoked = []
        dead = []
        with self._run_lock:
            if self._timer_stop:
                return _TIMER_STOP
            self._timer_next = _INF
            now = monotonic()
            until = _INF
            if self._send_timeout is not None:
                running = self._running
                for item in running:
                    if item._deadline > now:
                        until = item._deadline
                        break
                    expired.append(item)
                for i, item in enumerate(expired):
                    del running[item]
                    error = item._error = SendTimeout()  # see _expired_error
                    expired[i] = (item, error)
            if self._handoffs or self._loop_items:
                until = min(until, self._check_loops_locked(now, revoked, dead))
        if not expired:
            until = min(until, self._limiter.tick(now, ready))
        for item, error in expired:
            self._expire(item, _BY_TIMEOUT, error)
        for q in ready:
            self._dispatch(q)
        for q in revoked:
            self._schedule(q)  # a worker drops the task its loop never started
        for item in dead:
            self._end_on_closed_loop(item)
        if expired or ready or revoked or dead:
            return _TIMER_AGAIN
        return until

    def _timer_sleep(self, until):
        # Sleep until ``until`` or a wake-up.  False: the thread ends (the
        # dispatcher stopped it, or it had nothing to watch for idle_timeout).
        with self._run_lock:
            if self._timer_stop:
                return False
            until = min(until, self._timer_next)
            now = monotonic()
            if until <= now:
                return True  # something became due while we looked
            # About to sleep (only then: a waker gives one token per sleep,
            # as the state says).
            self._timer_until = until
            self._timer_state = _IDLE if until == _INF else _UNTIL_DEADLINE
        # A wait longer than TIMEOUT_MAX raises: wake up earlier and look
        # again (every wait is bounded at its source too).
        delay = self._idle_timeout if until == _INF else min(until - now, _TIMEOUT_MAX)
        if _sleep(self._timer_wake, delay):
            return True
        with self._run_lock:
            if self._timer_state == _IDLE:
                # Nothing to watch for idle_timeout seconds: end, as an
                # idle worker does (the next task with a deadline starts
                # a new thread), so that a dispatcher dropped without
                # shutdown() is not kept alive by this thread.
                self._timer_state = _AWAKE
                self._timer_started = False
                return False
            if self._timer_state != _AWAKE:
                self._timer_state = _AWAKE
                self._timer_until = _INF
                return True
        # Woken just after the timeout: consume that token.
        _sleep(self._timer_wake, None)
        return True

    def _stop_timer(self):
        with self._run_lock:
            self._timer_stop = True
            self._wake_timer_locked()

    def _expire(self, item, reason, error):
        # The task is still running (Python cannot stop a thread); we release
        # its Future now (with ``error``, the one set on the task when it
        # was taken: not read back from the task, whose worker, woken by the
        # cancel, clears it) and drop whatever it returns later.
        item._cancel_with(reason)
        error = self._expired_error(item, error)
        outcome = C_TIMED_OUT if reason == _BY_TIMEOUT else C_CANCELLED
        future = item._future
        item._future = None
        self._count(outcome)
        if item._loop is not None:
            # A coroutine task: its caller hears it on its loop, and its
            # awaitable is cancelled there (its end goes on with the chat).
            _on_loop(item._loop, _aio_set, future, None, error)
            self._cancel_async(item)
        elif future is not None:
            _future_finish(future, None, error)

    def _expired_error(self, item, error):
        # ``error`` was made when the task was claimed (under _run_lock, so
        # that its worker finds it); a SendTimeout gets its message here,
        # outside any lock (the chat id's repr is user code), by whichever of
        # its claimer and its worker comes first.
        if isinstance(error, SendTimeout) and not error.args:
            error.args = ("chat %s: the task ran past its %ss send_timeout"
                          % (_safe_repr(item.chat_id), self._send_timeout),)
        return error
