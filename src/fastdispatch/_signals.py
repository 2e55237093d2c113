"""Signal handlers that never wait for a lock: :class:`SignalRelay`.

A Python signal handler runs in the main thread between two of its
bytecodes, which may be inside a critical section the main thread holds: an
Event's own (the main thread waiting in ``stop.wait(0.2)`` for that very
signal), logging's, a lock of the caller's.  A handler that sets an Event,
logs, or calls a worker's ``stop()`` may then wait for a lock its own thread
holds, and the process hangs until it is killed.  This is not a corner
case: a main thread that loops on ``Event.wait``, or calls a function inside
``with lock:``, is caught holding that lock by a fair share of the signals
it receives (how often, on which builds: the repository's
``bench/notes/figures-behind-the-code.md``).

So the handler :class:`SignalRelay` installs only puts the signal number on
a ``queue.SimpleQueue``, whose ``put`` is reentrant (CPython makes that
promise for signal handlers and finalizers), and a thread of the relay's
own runs the reaction: it may take any lock, set any Event, log.  The
Telegram runners and the fake servers' command line stop through it; the
cluster worker's ``stop()`` takes no lock at all (a flag and asyncio's
``call_soon_threadsafe``), so its handlers call it directly.
"""

import logging
import queue
import signal
import threading
from typing import Callable, Dict, Iterable, Optional

__all__ = ["SignalRelay"]

_log = logging.getLogger("fastdispatch.signals")


class SignalRelay:
    """``on_signal(signum)`` for each of ``signals`` that arrives, called in
    the relay's thread, in the order the signals were handled.

    :meth:`install` (from the main thread, where Python runs signal
    handlers; elsewhere it installs nothing and returns False) and
    :meth:`restore` (the previous handlers back; the signals handled before
    it still reach ``on_signal``, then the thread ends).
    """

    def __init__(self, on_signal: Callable[[int], object],
                 signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
                 name: str = "fastdispatch-signals") -> None:
        if not callable(on_signal):
            raise TypeError("on_signal must be callable")
        self._on_signal = on_signal
        self._signals = tuple(signals)
        self._name = name
        self._arrived: "queue.SimpleQueue[Optional[int]]" = queue.SimpleQueue()
        self._previous: Dict[int, object] = {}
        self._thread: Optional[threading.Thread] = None

    def _handle(self, signum: int, frame: object) -> None:
        # The only thing done in the handler: SimpleQueue.put takes no lock
        # a Python thread can hold.
        self._arrived.put(signum)

    def install(self) -> bool:
        """Install the handlers and start the relay's thread; False (and
        nothing installed) outside the main thread or if already installed."""
        if self._thread is not None or threading.current_thread() is not threading.main_thread():
            return False
        thread = threading.Thread(target=self._relay, name=self._name, daemon=True)
        thread.start()
        self._thread = thread
        try:
            for signum in self._signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        except BaseException:
            self.restore()
            raise
        return True

    def restore(self, timeout: float = 5.0) -> None:
        """Put the previous handlers back, let the relay hand on what already
        arrived (up to ``timeout`` seconds) and end its thread.  Idempotent."""
        thread = self._thread
        if thread is None:
            return
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._arrived.put(None)
        if thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None

    def _relay(self) -> None:
        while True:
            signum = self._arrived.get()
            if signum is None:
                return
            try:
                self._on_signal(signum)
            except Exception:  # a reaction that fails must not end the relay
                _log.exception("reacting to signal %s failed", signum)
