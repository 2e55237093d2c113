"""The engine's drain at the end of a run, whatever the platform:
:func:`drain_engine` and the :class:`ShutdownReport` it returns.

The runners (``telegram._run``, ``discord._run``) and the intakes that stop
a run of their own (``WebhookApp.shutdown``) all end the same way: give the
queued replies a deadline, cancel what is left, say what became of them in
one line and an exit status.  It lives apart from the runners so that an
intake can drain without importing the runner that imports it.

An intake that has counts of its own (updates handled, replies refused,
updates left unconfirmed) gives them by a ``_shutdown_counts()`` method;
this module knows no intake class.
"""

import logging
import threading
from time import monotonic
from typing import Any, Callable, List, NamedTuple, Optional

__all__ = ["drain_engine", "ShutdownReport", "check_drain_timeout", "exit_status"]

# The report line's logger: drain_engine is fastdispatch.telegram's API,
# where it began; the Discord runner passes its own.
_log = logging.getLogger("fastdispatch.telegram")


class ShutdownReport(NamedTuple):
    """What a shutdown left behind (logged as one line; :attr:`exit_code`).

    - ``handled``: updates the intake gave to the engine;
    - ``sent``, ``failed``: replies sent, and failed for good (platform
      errors, retries used up, timeouts), over the dispatcher's life;
    - ``dropped``: replies still queued or running at the deadline,
      cancelled (never sent);
    - ``lost``: replies refused (``QueueFull``) for updates that were
      answered all the same (they had other replies queued);
    - ``unconfirmed``: polling only: updates left unconfirmed because their
      replies were dropped; Telegram delivers them again to the next process;
    - ``seconds``: how long the drain took; ``error``: why the intake
      stopped by itself (e.g. 409 Conflict), or None.
    """

    handled: int
    sent: int
    failed: int
    dropped: int
    lost: int
    unconfirmed: int
    seconds: float
    error: Optional[str]

    @property
    def exit_code(self) -> int:
        """0: every reply went out (or failed for good); 1: some were
        dropped or lost; 2: the intake failed."""
        if self.error is not None:
            return 2
        return 1 if self.dropped or self.lost else 0


def check_drain_timeout(drain_timeout):
    """``drain_timeout`` as float seconds, or None; ``ValueError`` otherwise."""
    if drain_timeout is None:
        return None
    if isinstance(drain_timeout, bool) or not isinstance(drain_timeout, (int, float)) or \
            not 0 <= drain_timeout <= 86400:
        raise ValueError("drain_timeout must be None or seconds in [0, 86400], got %r"
                         % (drain_timeout,))
    return float(drain_timeout)


def _dispatcher_counts(dispatcher):
    stats = getattr(dispatcher, "stats", None)
    if not callable(stats):
        return None
    s = stats()
    ended = s.completed + s.failed + s.discarded + s.cancelled + s.timed_out
    return s.completed, s.failed + s.timed_out + s.discarded, s.submitted - ended


def _intake_counts(intake):
    """(handled, lost, unconfirmed) of an intake that keeps them, else zeros."""
    counts = getattr(intake, "_shutdown_counts", None)
    return counts() if callable(counts) else (0, 0, 0)


def _shutdown(engine, timeout, force):
    """``engine.shutdown(timeout)``; with ``force``, on a helper thread, so
    that setting ``force`` stops the wait.  True if it finished."""
    if force is None:
        return bool(engine.shutdown(timeout))
    result: List[bool] = []
    helper = threading.Thread(target=lambda: result.append(bool(engine.shutdown(timeout))),
                              name="fastdispatch-drain", daemon=True)
    helper.start()
    while helper.is_alive() and not force.wait(0.05):
        pass
    helper.join(0 if force.is_set() else None)
    return bool(result and result[0])


def drain_engine(engine: Any, timeout: Optional[float] = 30.0, *, intake: Any = None,
                 on_deadline: Optional[Callable[[], Any]] = None,
                 force: Optional[threading.Event] = None,
                 error: Optional[str] = None, log: Optional[logging.Logger] = None
                 ) -> ShutdownReport:
    """Shut ``engine`` down, giving its queued replies ``timeout`` seconds
    (None: as long as they take); then cancel what is left, log one line
    with the counts and return the :class:`ShutdownReport`.

    ``intake``: the :class:`WebhookApp` or :class:`TelegramPoller` whose
    counts go into the report (stop it first).  ``on_deadline``: called
    when the deadline passed, before anything is cancelled (the poller's
    ``freeze``).  ``force``: an Event that, once set, ends the wait early.
    ``log``: where the line goes (by default ``fastdispatch.telegram``).
    """
    timeout = check_drain_timeout(timeout)
    dispatcher = getattr(engine, "dispatcher", None)
    started = monotonic()
    finished = _shutdown(engine, timeout, force)
    seconds = monotonic() - started
    dropped = 0
    if not finished:
        counts = _dispatcher_counts(dispatcher)
        # Without stats() the number is unknown; at least one was left.
        dropped = counts[2] if counts is not None else 1
        if on_deadline is not None:
            on_deadline()
        force_close = getattr(dispatcher, "force_close", None)
        if callable(force_close):
            force_close()
    counts = _dispatcher_counts(dispatcher)
    sent, failed = (counts[0], counts[1]) if counts is not None else (0, 0)
    handled, lost, unconfirmed = _intake_counts(intake)
    report = ShutdownReport(handled, sent, failed, dropped, lost, unconfirmed, seconds, error)
    deadline = "no deadline" if timeout is None else "the %.1f s deadline" % timeout
    line = ("shutdown: %sreplies: %d sent, %d failed, %d dropped at %s, "
            "%d refused and lost%s; drained in %.1f s -> exit %d" % (
                "" if intake is None else "%d updates handled; " % report.handled,
                report.sent, report.failed, report.dropped, deadline,
                report.lost, "; %d updates left to Telegram to deliver again" % unconfirmed
                if unconfirmed else "", seconds, report.exit_code))
    if error is not None:
        line += " (%s)" % error
    log = _log if log is None else log
    (log.info if report.exit_code == 0 else log.error)(line)
    return report


def exit_status(report: ShutdownReport,
                on_shutdown: Optional[Callable[[ShutdownReport], Any]]) -> int:
    """A runner's last step: ``on_shutdown(report)`` if given; the exit status."""
    if on_shutdown is not None:
        on_shutdown(report)
    return report.exit_code
