"""``Outbox``: replies written to a file before they are sent, sent in per-chat order.

The path of one reply::

    send() --row--> writer thread --group commit--> feeder thread --submit--> dispatcher
      ^ returns once committed                        (per-chat lanes)          | worker: sender
                                                                                v
    feeder <--marked-- writer thread <--mark (sent / dead / cancelled)-- Future callback

Threads.  The writer thread (``_store.Store``) owns the database.  The
feeder thread owns the lanes: one per chat with replies not yet finished,
holding the rows committed but not yet handed to the dispatcher, in commit
order, and counting those handed over whose mark is not yet durable
(``out``).  Only the feeder submits to the dispatcher, and it handles the
rows in the order the writer committed them, so a chat's rows reach the
dispatcher in commit order however many threads call ``send``; the
dispatcher keeps that order to the platform.  The feeder is a thread of its
own (not the writer) so that a dispatcher hook that blocks, even one that
calls ``send``, never stops commits.

At most ``window`` rows of a chat are out at once: a crash can repeat at
most that many of a chat's replies (those sent, or being sent, whose mark
was not yet durable).  Rows restored at open enter their lanes before the
feeder starts, so they go before any new row of their chat.
"""

import collections
import json
import logging
import numbers
import queue
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any, Dict, Hashable, List, NamedTuple, Optional

from .._errors import Cancelled, DispatcherClosed, QueueFull
from ._senders import bind_sender
from ._store import CANCELLED, DEAD, OutboxClosed, Store

__all__ = ["Outbox", "Ticket", "DeadLetter"]

_log = logging.getLogger("fastdispatch.outbox")

_MAX_CHAT_ID = 1 << 63
_SKIPPED = object()  # a task's result when its ticket was cancelled before it ran
_STOP = object()


class Ticket(NamedTuple):
    """What ``send`` returns once the reply is durable.

    ``id``: the row's number in the file (grows with every reply);
    ``key``: its idempotency key (the same at every attempt and across
    restarts); ``future``: resolves with the sender's result once sent, or
    with the error it failed with for good.  ``future.cancel()`` before the
    send started skips it (the row is marked cancelled)."""

    id: int
    key: str
    chat_id: Any
    future: "Future[Any]"


class DeadLetter(NamedTuple):
    """A reply that failed for good: the row as stored, and its error."""

    id: int
    chat_id: Any
    sender: str
    method: str
    params: Dict[str, Any]
    error: str


class _Row:
    __slots__ = ("id", "chat_id", "sender", "method", "params", "future", "started")

    def __init__(self, chat_id, sender, method, params, id=None):
        self.id = id
        self.chat_id = chat_id
        self.sender = sender
        self.method = method
        self.params = params  # JSON text
        self.future = Future()
        self.started = False


class _Lane:
    __slots__ = ("waiting", "out", "blocked")

    def __init__(self):
        self.waiting = collections.deque()
        self.out = 0
        self.blocked = None  # the DispatcherClosed / Cancelled that stopped this chat


def _settle(future, result=None, error=None):
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except InvalidStateError:  # cancelled by its caller meanwhile
        pass


def _check_chat_id(chat_id):
    if isinstance(chat_id, str):
        return chat_id
    if isinstance(chat_id, numbers.Integral) and not isinstance(chat_id, bool):
        value = int(chat_id)
        if -_MAX_CHAT_ID <= value < _MAX_CHAT_ID:
            return value
        raise ValueError("chat_id must fit in 64 bits, got %r" % (value,))
    raise TypeError("chat_id must be an int or a str (it is stored in the outbox file), "
                    "got %r" % (type(chat_id).__name__,))


class Outbox:
    """A durable outbox in front of an ``OutboundDispatcher``.

    ``Outbox(path, dispatcher, *, senders, durability="full", window=8)``

    - ``path``: the SQLite file (created if missing).  One process at a
      time: a second ``Outbox`` on it raises ``OutboxLocked``.
    - ``senders``: ``{name: sender}``; a row names its sender, so a file
      outlives the objects (a restarted bot passes the same names).
    - ``durability``: ``"full"`` (``send`` returns once the row is
      fsync'd: survives a power cut) or ``"normal"`` (once it is in the
      file: survives a crash of the process, not of the machine).
    - ``window``: most replies of one chat handed to the dispatcher whose
      outcome is not yet durable: the most a crash can repeat per chat.
    """

    def __init__(self, path: Any, dispatcher: Any, *, senders: Dict[str, Any],
                 durability: str = "full", window: int = 8) -> None:
        if not callable(getattr(dispatcher, "submit", None)):
            raise TypeError("dispatcher must be an OutboundDispatcher, got %r"
                            % (type(dispatcher).__name__,))
        if not isinstance(senders, dict) or not senders:
            raise TypeError("senders must be a non-empty dict {name: sender}")
        for name in senders:
            if not isinstance(name, str) or not name:
                raise TypeError("senders' names must be non-empty str, got %r" % (name,))
        if durability not in ("full", "normal"):
            raise ValueError("durability must be 'full' or 'normal', got %r" % (durability,))
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError("window must be a positive int, got %r" % (window,))
        self.dispatcher = dispatcher
        self.durability = durability
        self.window = window
        self._senders = dict(senders)
        bound = {name: bind_sender(name, s) for name, s in senders.items()}
        self._calls = {name: b[0] for name, b in bound.items()}
        self._checks = {name: b[1] for name, b in bound.items()}
        self._only_sender = next(iter(senders)) if len(senders) == 1 else None
        self._events: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._lanes: Dict[Any, _Lane] = {}  # the feeder thread's alone
        self._stalled: Dict[Any, _Lane] = {}  # lanes whose chat queue was full
        # _idle guards _unfinished (rows accepted or restored whose outcome
        # is not yet durable; drain() waits on it) and _closed (set once by
        # close(); send() reads it unlocked: a send racing close() is
        # either refused or stored, and a stored row is sent at the next
        # open at the latest).
        self._idle = threading.Condition(threading.Lock())
        self._unfinished = 0
        self._closed = False
        self._store = Store(path, durability, self._committed, self._marked)
        self.path = self._store.path
        try:
            restored = [_Row(chat, sender, method, params, id=row_id)
                        for row_id, chat, sender, method, params in self._store.load_pending()]
            unknown = sorted({r.sender for r in restored} - set(self._calls))
            if unknown:
                raise ValueError("senders must name every sender of the replies waiting in "
                                 "%r; missing: %s" % (self.path, ", ".join(unknown)))
        except BaseException:
            self._store.close()
            raise
        self.restored = len(restored)  # rows found not sent at open
        if restored:
            self._committed(restored)
        self._feeder = threading.Thread(target=self._feed, name="fastdispatch-outbox-feeder",
                                        daemon=True)
        self._feeder.start()
        self._store.start()

    def __repr__(self) -> str:
        return "Outbox(%r, durability=%r)" % (self.path, self.durability)

    @property
    def senders(self) -> Dict[str, Any]:
        """The senders by name (a copy)."""
        return dict(self._senders)

    # -- the public calls ----------------------------------------------------

    def send(self, chat_id: Hashable, method: str, params: Dict[str, Any], *,
             sender: Optional[str] = None) -> Ticket:
        """Store the reply, then send it through the dispatcher in the
        chat's order.  Returns once the row is committed (``durability``);
        raises ``OutboxError`` if it could not be (nothing is then sent),
        ``TypeError``/``ValueError`` for bad arguments."""
        if self._closed:
            raise OutboxClosed("the outbox is closed")
        chat_id = _check_chat_id(chat_id)
        if not isinstance(method, str) or not method:
            raise TypeError("method must be a non-empty str, got %r" % (method,))
        if sender is None:
            if self._only_sender is None:
                raise TypeError("sender must be given: this outbox has the senders %s"
                                % ", ".join(map(repr, sorted(self._senders))))
            sender = self._only_sender
        elif sender not in self._calls:
            raise ValueError("sender must be one of %s, got %r"
                             % (", ".join(map(repr, sorted(self._senders))), sender))
        self._checks[sender](method)
        if not isinstance(params, dict):
            raise TypeError("params must be a dict (a JSON object), got %r"
                            % (type(params).__name__,))
        try:
            text = json.dumps(params, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as exc:
            raise TypeError("params must be JSON (str keys; str, number, bool, None, list and "
                            "dict values; no NaN): %s" % (exc,)) from None
        row = _Row(chat_id, sender, method, text)
        self._store.commit(row)
        return Ticket(row.id, self._key(row), chat_id, row.future)

    def dead_letters(self) -> List[DeadLetter]:
        """Every reply that failed for good, oldest first, with its error."""
        return [DeadLetter(row_id, chat, sender, method, json.loads(params), error)
                for row_id, chat, sender, method, params, error in self._store.dead_letters()]

    def clear_dead_letters(self, ids: Optional[List[int]] = None) -> int:
        """Delete dead letters from the file: those whose ``id`` is in
        ``ids``, or all of them (and the cancelled replies with them);
        returns how many dead letters went.  The file keeps both until
        then."""
        if ids is not None:
            ids = [i for i in ids if isinstance(i, int) and not isinstance(i, bool)]
            return self._store.clear((DEAD,), ids)
        count = self._store.clear((DEAD,))
        self._store.clear((CANCELLED,))
        return count

    def pending(self) -> int:
        """Replies accepted (or restored at open) whose outcome is not yet durable."""
        with self._idle:
            return self._unfinished

    def drain(self, timeout: Optional[float] = None) -> bool:
        """Wait until every reply accepted so far was sent (or failed, or
        was cancelled) and marked so in the file; False if ``timeout``
        seconds passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._unfinished == 0, timeout)

    def close(self, timeout: Optional[float] = None) -> bool:
        """Refuse new replies, wait up to ``timeout`` seconds for those
        accepted (:meth:`drain`), then close the file.  Replies still
        waiting stay in it and are sent at the next open.  Returns what
        :meth:`drain` returned.  The dispatcher is not closed: close it
        after the outbox."""
        with self._idle:
            if self._closed:
                return self._unfinished == 0
            self._closed = True
        drained = self.drain(timeout)
        self._store.close()
        self._events.put((_STOP,))
        self._feeder.join()
        return drained

    def __enter__(self) -> "Outbox":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- called by the writer thread -----------------------------------------

    def _committed(self, rows):
        with self._idle:
            self._unfinished += len(rows)
        self._events.put(("committed", rows))

    def _marked(self, rows):
        self._events.put(("marked", rows))
        with self._idle:
            self._unfinished -= len(rows)
            if self._unfinished == 0:
                self._idle.notify_all()

    def _left(self, row, error):
        """``row`` stays in the file for the next open: this process is done with it."""
        _settle(row.future, error=error)
        with self._idle:
            self._unfinished -= 1
            if self._unfinished == 0:
                self._idle.notify_all()

    # -- the feeder thread ------------------------------------------------------

    def _key(self, row):
        return "%s-%d" % (self._store.instance, row.id)

    def _feed(self):
        events = self._events
        while True:
            try:
                event = events.get(timeout=0.02) if self._stalled else events.get()
            except queue.Empty:
                event = ("retry",)
            kind = event[0]
            if kind is _STOP:
                return
            try:
                if kind == "committed":
                    for row in event[1]:
                        lane = self._lanes.get(row.chat_id)
                        if lane is None:
                            lane = self._lanes[row.chat_id] = _Lane()
                        lane.waiting.append(row)
                    for row in event[1]:
                        self._pump(row.chat_id)
                elif kind == "stopped":
                    self._stopped(event[1], event[2])
                elif kind == "marked":
                    for row in event[1]:
                        self._lanes[row.chat_id].out -= 1
                    for row in event[1]:
                        self._pump(row.chat_id)
                else:  # retry the lanes whose chat queue was full
                    stalled, self._stalled = self._stalled, {}
                    for chat_id in stalled:
                        self._pump(chat_id)
            except Exception:  # a bug: logged; the feeder goes on
                _log.exception("the outbox feeder failed on %r", kind)

    def _pump(self, chat_id):
        """Hand the chat's next rows to the dispatcher, up to the window."""
        lane = self._lanes.get(chat_id)
        if lane is None:
            return
        while lane.waiting and lane.out < self.window:
            row = lane.waiting[0]
            if lane.blocked is not None:
                lane.waiting.popleft()
                self._left(row, lane.blocked)
                continue
            try:
                future = self.dispatcher.submit(chat_id, self._task(row))
            except QueueFull:
                self._stalled[chat_id] = lane
                return
            except DispatcherClosed as exc:
                lane.blocked = exc
                continue
            lane.waiting.popleft()
            lane.out += 1
            future.add_done_callback(lambda f, row=row: self._finished(row, f))
        if not lane.waiting and lane.out == 0:
            del self._lanes[chat_id]

    def _task(self, row):
        call = self._calls[row.sender]
        key = self._key(row)

        def send_reply(sc):
            if not row.started:
                if not row.future.set_running_or_notify_cancel():
                    return _SKIPPED
                row.started = True
            return call(sc, row.method, json.loads(row.params), key)
        return send_reply

    def _finished(self, row, future):
        """The dispatcher's Future of ``row`` resolved (on the thread that
        resolved it): mark the row, settle its ticket."""
        error = None if future.cancelled() else future.exception()
        if error is None and not future.cancelled():
            result = future.result()
            if result is _SKIPPED:
                self._store.mark(row, CANCELLED)
            else:
                self._store.mark(row, None)
                _settle(row.future, result)
        elif future.cancelled() or isinstance(error, (Cancelled, DispatcherClosed)):
            # Stopped by the dispatcher's shutdown, not by the platform: the
            # row stays pending (sent at the next open), and so do the
            # chat's later rows, behind it: the feeder blocks the lane.
            self._events.put(("stopped", row, error or DispatcherClosed(
                "the dispatcher cancelled the send")))
        else:
            self._store.mark(row, DEAD, "%s: %s" % (type(error).__name__, error))
            _settle(row.future, error=error)

    def _stopped(self, row, error):
        lane = self._lanes[row.chat_id]
        if lane.blocked is None:
            lane.blocked = error
        self._left(row, lane.blocked)
