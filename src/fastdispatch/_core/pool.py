"""The worker pool: threads, slots and the ready list (G3, G6).

A chat with work and no owner waits on the ready list, holding no
thread.  One idle worker at a time is sent to it (the searcher: a worker
that finds work sends the next), or a new thread while fewer than
``max_inflight`` exist.  A worker owns the chat it took and runs its
tasks one by one (``_drain_chat``), asking the limiter before each start
(``_next_paced``), until the chat is empty or must wait.  Every start
takes one of ``max_inflight`` slots (the global cap, G3); a coroutine
task holds its slot but no thread, and a chat that finds no slot waits
for one (``_slot_waiters``).  ``_pool_lock`` guards the ready list, the
idle stack, the thread count and the slot waiters.
"""

from .chats import _peek_head, _take_head_locked
from .constants import (
    _AGAIN, _ASYNC, _DONE, _ELSEWHERE, logger, _PANICKED, _PARKED_CHAT, _REFETCH,
    _sleep, _SPAWN, _START, _Wake, _WORKERS)
from .outcomes import _Outcomes


class _Pool(_Outcomes):
    """Workers, slots and the ready list: the global cap."""

    __slots__ = ("_ready", "_idle", "_searching", "_stopping", "_slot_waiters")

    def _schedule(self, q):
        # Put a chat that just got work (and has no worker) on the ready list.
        # When all max_inflight workers are busy the chat simply waits there:
        # it holds no thread (G6, docs/guarantees.md).
        with self._pool_lock:
            self._ready.append(q)
            searcher = self._call_searcher_locked()
        self._send_searcher(searcher)

    def _call_searcher_locked(self):
        # With _pool_lock held: if no worker is already on its way to the
        # ready list, send one (an idle one, else a new one under the cap).
        # One at a time: a searcher that finds work calls the next one, so
        # workers are woken as fast as they actually start, not once per
        # chat (with the GIL, a burst of wake-ups is a burst of thread
        # switches that buys nothing).  Returns the idle worker's wake to
        # give a token, _SPAWN to start a new worker, or None.
        if self._searching:
            return None
        if self._idle:
            self._searching = True
            return self._idle.pop()
        if self._threads < self._max_inflight:
            self._searching = True
            self._threads += 1
            return _SPAWN
        return None

    def _send_searcher(self, searcher):
        if searcher is None:
            return
        if searcher is not _SPAWN:
            searcher.put(None)
        else:
            try:
                self._spawn_worker()
            except BaseException:
                with self._pool_lock:
                    self._threads -= 1
                    self._searching = False
                logger.exception("could not start a worker thread")

    def _worker_main(self):
        """Body of one worker thread: take a ready chat, drain it, repeat."""
        wake = _Wake()
        searching = True  # a new worker was started as the searcher
        tls = self._tls
        while True:
            q = self._next_chat(wake, searching)
            if q is None:
                return
            tls.chat = q  # what running_chat() says in this thread meanwhile
            self._drain_chat(q)
            tls.chat = q = None  # an idle worker keeps nothing of the chats it ran
            searching = False

    def _next_chat(self, wake, searching):
        # Return the next ready chat, or None when this worker should exit
        # (idle for idle_timeout, or the dispatcher is stopping).
        # ``searching``: this worker was woken (or started) as the searcher.
        while True:
            searcher = None
            with self._pool_lock:
                if searching:
                    self._searching = searching = False
                    if len(self._ready) > 1:
                        # More work than this worker: pass the baton on.
                        searcher = self._call_searcher_locked()
                if self._ready:
                    q = self._ready.popleft()
                elif self._stopping:
                    self._threads -= 1
                    return None
                else:
                    q = None
                    self._idle.append(wake)
            if q is not None:
                self._send_searcher(searcher)
                return q
            if _sleep(wake, self._idle_timeout):
                searching = True
                continue
            with self._pool_lock:
                if wake in self._idle:
                    self._idle.remove(wake)
                    self._threads -= 1
                    return None
            # A waker popped us just as we timed out; take its token.
            _sleep(wake, None)
            searching = True

    def _drain_chat(self, q, here=None):
        # Run the chat's tasks that belong here (on a worker, ``here`` None:
        # thread tasks; on an event loop: that loop's coroutine tasks) until
        # the chat is empty, parked, handed to where its next task runs, or
        # left to a coroutine task whose end will go on with it.
        while True:
            if q.slot_held:
                q.slot_held = False
            elif not self._take_slot(q):
                return  # waits for a slot: a task's end hands it one
            if self._limited or q.not_before or self._limiter.pause_until:
                item = self._next_paced(q, here)
            else:
                with q.lock:
                    item = self._take_head_here_locked(q, here)
                    if item is None:
                        # G5 (docs/guarantees.md): the empty queue leaves the map while
                        # its lock is held, so a submitter's re-check cannot
                        # miss it.
                        q.running = False
                        self._remove_locked(q)
            if q.woken is not None:
                self._wake_admitted(q)  # its task took the place of one that left
            if item is None or item is _PARKED_CHAT or item is _AGAIN or item is _ELSEWHERE:
                self._release_slot()
                if item is None:
                    break
                if item is _PARKED_CHAT:
                    return
                if item is _ELSEWHERE:
                    target, q.elsewhere = q.elsewhere, None
                    if target is _WORKERS:
                        self._schedule(q)
                        return
                    if self._hand_to_loop(q, target):
                        return
                    self._drop_dead_head(q, target)
                continue
            if here is None:
                ran = self._run(item, q)
            else:
                ran = self._start_async(item, q, here)
                if ran == _ASYNC:
                    return  # its awaitable's end goes on with the chat (slot kept)
            self._release_slot()
            if ran == _PANICKED:
                return  # the task panicked; its chat is gone
            if ran == _DONE and here is None and self._ready and q._items:
                # Other chats wait for a worker: go to the back of the line
                # so that a busy chat cannot starve quiet ones.
                with self._pool_lock:
                    self._ready.append(q)
                return
        if q.granted:
            self._limiter.return_grant(q)
        self._maybe_drained()

    def _dispatch(self, q):
        # An owned chat that no thread or loop is running: give it to
        # whoever runs its next task (the workers, or that task's loop).
        if self._async_used:
            with q.lock:
                head = _peek_head(q)
            if head is not None and head._loop is not None and self._hand_to_loop(q, head._loop):
                return
        self._schedule(q)

    def _take_slot(self, q):
        # One of the max_inflight slots for the chat's next start, or False
        # (the chat then waits in _slot_waiters, which a task's end serves).
        with self._count_lock:
            if self._inflight < self._max_inflight:
                self._inflight += 1
                return True
        with self._pool_lock:
            self._slot_waiters.append(q)
        # A slot freed between our look and our wait must not be missed.
        with self._count_lock:
            free = self._inflight < self._max_inflight
        if free:
            self._wake_slot_waiter()
        return False

    def _release_slot(self):
        # The last slot given back may be what a drain() waits for (a
        # worker holds one from before it takes a task until after it has
        # ended it and, for the chat's last one, removed the emptied queue).
        with self._count_lock:
            self._inflight -= 1
            last = self._inflight == 0
        if last and self._drain_waiters:
            self._maybe_drained()
        if self._slot_waiters:
            self._wake_slot_waiter()

    def _wake_slot_waiter(self):
        with self._pool_lock:
            q = self._slot_waiters.popleft() if self._slot_waiters else None
        if q is not None:
            self._dispatch(q)

    def _next_paced(self, q, here=None):
        # The chat's next task if pacing lets it start now; _PARKED_CHAT if the
        # chat was parked (the timer will hand it back: no worker sleeps
        # for a limit); _AGAIN to look again; _ELSEWHERE if it runs on
        # another thread or loop than ``here``; None once the chat is empty
        # and removed.
        limiter = self._limiter
        window = q.window
        failed = False
        if limiter.chat_limits and (window is None or window.dead):
            try:
                window = q.window = limiter.window_for(q)
            except BaseException as exc:
                # limit_for, or the chat id's __hash__/__eq__, failed: the
                # task it was asked for fails with that error.
                if self._refuse_head(q, exc):
                    return _AGAIN
                window, failed = None, True
        with q.lock:
            if q.retry_item is None and not q._items:
                q.running = False
                self._remove_locked(q)
                return None
            if failed:
                return _AGAIN  # a task arrived meanwhile: judge it again
            if self._async_used:
                head = _peek_head(q)
                if head._loop is not here:
                    q.elsewhere = head._loop if head._loop is not None else _WORKERS
                    return _ELSEWHERE
            admitted = limiter.admit(q, window)
            if admitted != _START:
                return _AGAIN if admitted == _REFETCH else _PARKED_CHAT
            return _take_head_locked(q)

    def _stop_workers(self):
        """Wake every idle worker so that it exits; stop the timer."""
        with self._pool_lock:
            self._stopping = True
            idle, self._idle = self._idle, []
        for wake in idle:
            wake.put(None)
        self._stop_timer()
