"""One asyncio event loop on its own thread: the bridge to asyncio-only clients.

nats-py (and ``redis.asyncio``) only speak asyncio, while fastdispatch's
callers and dispatcher are threaded.  A process runs one such loop thread;
other threads hand it work with ``run(coro)`` (``run_coroutine_threadsafe``
under the hood) and block on the result.  The thread is a daemon so that a
program that forgets ``close()`` still exits.
"""

import asyncio
import threading

__all__ = ["LoopThread"]


class LoopThread:
    def __init__(self, name):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self):
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def run(self, coro, timeout=None):
        """Run ``coro`` on the loop and wait for its result (from another thread)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("LoopThread.run() called from the loop thread itself")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except BaseException:
            fut.cancel()
            raise

    def submit(self, coro):
        """Schedule ``coro`` on the loop; returns a concurrent.futures.Future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout=5.0):
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)

    @property
    def thread(self):
        return self._thread
