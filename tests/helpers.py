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
  limit, to check pacing on what the tasks recorded;
- :class:`Process`: a bot (or server) in a subprocess, for real signals,
  its output kept for the failure message;
- :func:`library`: the Telegram framework a test needs, skipped on the
  Pythons the test extra does not install it on.
"""

import socket
import subprocess
import sys
import tempfile
import time

import pytest

__all__ = ["wait_until", "free_port", "listening", "max_in_window", "Process", "library",
           "LIBRARIES"]


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


class Process:
    """``cmd`` in a subprocess with ``env``, its output (stdout and stderr)
    going to a file read by :attr:`log`.  :meth:`wait` fails with that
    output if the process has not exited in time; :meth:`close` (always
    call it: a fixture's teardown) kills one still running."""

    def __init__(self, cmd, env):
        self.out = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.out, stderr=subprocess.STDOUT)

    def signal(self, signum):
        self.proc.send_signal(signum)

    def wait(self, timeout=90):
        """The exit code (the process is killed and the test fails after
        ``timeout`` seconds)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("the process did not exit within %g s:\n%s"
                                 % (timeout, self.log)) from None

    @property
    def log(self):
        self.out.seek(0)
        return self.out.read()

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.out.close()


#: name -> (module, the Pythons the test extra installs it on: [low, high))
LIBRARIES = {
    "ptb": ("telegram", (3, 10), (4, 0)),
    "aiogram": ("aiogram", (3, 10), (3, 15)),
    "telebot": ("telebot", (3, 11), (4, 0)),
}


def library(name):
    """Skip the test on a Python the test extra does not install the
    framework ``name`` (a key of :data:`LIBRARIES`) on; import it (an
    ImportError where it should be installed fails the test)."""
    module, low, high = LIBRARIES[name]
    if not low <= sys.version_info[:2] < high:
        pytest.skip("%s is not installed on Python %d.%d by the test extra"
                    % (module, *sys.version_info[:2]))
    __import__(module)
