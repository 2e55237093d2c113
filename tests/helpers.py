"""Helpers the test files share, written once: ``from helpers import wait_until``.

``tests/`` is not a package; pytest puts this directory on ``sys.path`` for
the test files it collects here (its default "prepend" import mode), so they
import this module by its name, whether the package under test is installed
or taken from ``src/``.

- :func:`wait_until`: a bound on a hang, not a timed assertion: correct code
  gets there long before the timeout, whatever the machine's load;
- :func:`free_port` and :func:`listening`: for a server the test starts on
  127.0.0.1;
- :func:`max_in_window`: the most start times within any window of a rate
  limit, to check pacing on what the tasks recorded.
"""

import socket
import time

__all__ = ["wait_until", "free_port", "listening", "max_in_window"]


def wait_until(predicate, timeout=60.0, what="the condition", interval=0.005):
    """Wait until ``predicate()`` is true and return True; raise
    AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("%s did not happen within %g s" % (what, timeout))
        time.sleep(interval)
    return True


def free_port():
    """A TCP port free on 127.0.0.1 now (for a server started after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    """Whether something accepts connections on 127.0.0.1:``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def max_in_window(times, per, tolerance=0.0):
    """The largest number of ``times`` within any window ``(t - (per -
    tolerance), t]``."""
    times = sorted(times)
    best = j = 0
    for i, t in enumerate(times):
        while times[j] + (per - tolerance) <= t:
            j += 1
        best = max(best, i - j + 1)
    return best
