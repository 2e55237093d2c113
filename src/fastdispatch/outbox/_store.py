"""The outbox's file: one SQLite database in WAL mode, and the one thread that writes it.

Why one writer thread.  SQLite allows one writer at a time, and a commit
that is durable costs an ``fsync``, which takes longer than everything
else a reply does (the repository's ``bench/outbox.py`` measures it).  A
writer per caller would pay that fsync per reply and queue on SQLite's
lock; the writer thread instead takes every row that callers handed it
while it was busy with the last commit and commits them together (group
commit): with N callers waiting, each pays 1/N of an fsync.  Marks (a row
sent, failed for good, cancelled) ride in the same transactions.  A caller
that is alone (nothing being written, nobody waiting, no group lately)
commits in its own thread instead: handing its row to the writer and being
woken by it would cost two thread switches and nothing would be grouped.

Why the stdlib ``sqlite3``.  The commit's fsync is the whole cost of a
durable write: a faster binding (apsw) saves under a microsecond per row of
a large transaction and nothing on a one-row one, which is not worth a
dependency (the comparison: the repository's
``bench/notes/figures-behind-the-code.md``).

Locking.  ``locking_mode=EXCLUSIVE``: the connection takes SQLite's
exclusive file lock at its first write (at open) and keeps it until it
closes.  A second ``Outbox`` on the same file, in this process or another,
fails at open (``OutboxLocked``); the operating system drops the lock when
the process dies, so a crashed bot restarts without clean-up; it works
wherever SQLite does (no ``fcntl`` on Windows).  In exclusive mode WAL
needs no shared-memory file either.

Corruption.  ``PRAGMA quick_check`` runs at open; a file that is not a
database, or fails the check, raises ``OutboxCorrupt`` and is left as it
is: never emptied, never recreated.
"""

import logging
import os
import sqlite3
import threading
import time
import uuid

__all__ = ["Store", "OutboxError", "OutboxLocked", "OutboxCorrupt", "OutboxClosed",
           "PENDING", "DEAD", "CANCELLED"]

_log = logging.getLogger("fastdispatch.outbox")

PENDING, DEAD, CANCELLED = 0, 2, 3
_MARKS_DELAY = 0.002  # seconds marks alone wait for company before their commit
_MAX_LINGER = 0.002  # the longest a batch waits for the callers of the last ones
_SCHEMA_VERSION = "1"


class OutboxError(Exception):
    """Base class of the outbox's own errors.  ``send`` raises it (with the
    SQLite error as ``__cause__``) when the row could not be committed
    (a full disk, a read-only file, an I/O error): nothing was accepted."""


class OutboxLocked(OutboxError):
    """Another ``Outbox`` (in this process or another) has the file open."""


class OutboxCorrupt(OutboxError):
    """The file is not an outbox database, or SQLite's integrity check
    failed.  The file is left untouched."""


class OutboxClosed(OutboxError):
    """``send`` after ``close()``."""


_CREATE = (
    "CREATE TABLE IF NOT EXISTS outbox_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # chat: an INTEGER or TEXT chat id, as given; state: PENDING, DEAD or
    # CANCELLED (a row that was sent is deleted: that is its mark).
    "CREATE TABLE IF NOT EXISTS outbox_rows (id INTEGER PRIMARY KEY, chat NOT NULL, "
    "sender TEXT NOT NULL, method TEXT NOT NULL, params TEXT NOT NULL, "
    "state INTEGER NOT NULL DEFAULT 0, error TEXT)",
)


class Batch:
    """The rows one group commit writes, and the callers waiting for it.

    ``event`` is set once the transaction ended; ``error`` is then the
    ``OutboxError`` every caller of the batch raises, or None."""

    __slots__ = ("rows", "threads", "event", "error")

    def __init__(self):
        self.rows = []
        self.threads = set()  # the callers' thread idents
        self.event = threading.Event()
        self.error = None


def _connect(path, durability):
    try:
        conn = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise OutboxError("cannot open the outbox file %r: %s" % (path, exc)) from exc
    try:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        # The first statement that reads the file: a file that is not a
        # database fails here, a locked one too.
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        check = [r[0] for r in conn.execute("PRAGMA quick_check(20)")]
        if check != ["ok"]:
            raise OutboxCorrupt("the outbox file %r is damaged (SQLite's quick_check: %s); "
                                "it was left as it is: restore it from a copy, or move it "
                                "aside to start an empty outbox" % (path, "; ".join(check)))
        if mode.lower() != "wal":
            raise OutboxError("the outbox file %r cannot be put in WAL mode (journal_mode "
                              "is %r)" % (path, mode))
        conn.execute("PRAGMA synchronous=%s" % ("FULL" if durability == "full" else "NORMAL"))
        conn.execute("BEGIN IMMEDIATE")  # the exclusive lock, taken now and kept
        for statement in _CREATE:
            conn.execute(statement)
        meta = dict(conn.execute("SELECT key, value FROM outbox_meta"))
        if not meta:
            meta = {"schema": _SCHEMA_VERSION, "instance": uuid.uuid4().hex[:8], "next_id": "1"}
            conn.executemany("INSERT INTO outbox_meta VALUES (?, ?)", sorted(meta.items()))
        conn.execute("COMMIT")
    except OutboxError:
        conn.close()
        raise
    except sqlite3.Error as exc:
        conn.close()
        text = str(exc)
        if "locked" in text or "busy" in text:
            raise OutboxLocked("the outbox file %r is open in another Outbox (this process or "
                               "another): one file serves one process at a time" % (path,)) \
                from exc
        if "not a database" in text or "malformed" in text or "corrupt" in text:
            raise OutboxCorrupt("the outbox file %r is not a readable outbox database (%s); "
                                "it was left as it is" % (path, text)) from exc
        folder = os.path.dirname(os.path.abspath(path))
        if "readonly" in text or not os.access(folder, os.W_OK) or (
                os.path.exists(path) and not os.access(path, os.W_OK)):
            raise OutboxError("the outbox file %r is read-only (or its folder is: SQLite "
                              "writes a -wal file beside it); an outbox that cannot write "
                              "could accept nothing" % (path,)) from exc
        raise OutboxError("cannot open the outbox file %r: %s" % (path, text)) from exc
    if meta.get("schema") != _SCHEMA_VERSION or not str(meta.get("next_id", "")).isdigit() \
            or not meta.get("instance"):
        conn.close()
        raise OutboxCorrupt("the outbox file %r holds outbox tables this version does not "
                            "know (meta %r); it was left as it is" % (path, meta))
    return conn, meta


class Store:
    """The database and its writer thread.

    Callers hand rows to :meth:`commit` (it blocks until they are durable)
    and marks to :meth:`mark`; the writer thread commits both in groups and
    reports each committed group to ``on_committed(rows)`` and each
    committed set of marks to ``on_marked(rows)`` (called on the writer
    thread; they must not block).
    """

    def __init__(self, path, durability, on_committed, on_marked):
        self.path = os.fspath(path)
        self.durability = durability
        self._conn, meta = _connect(self.path, durability)
        self.instance = meta["instance"]
        self._next_id = int(meta["next_id"])
        self._on_committed = on_committed
        self._on_marked = on_marked
        # _lock guards _batch, _marks and _closing: what callers hand the
        # writer and whether it should stop.  _wake (on _lock) wakes it.
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._batch = Batch()
        self._marks = []
        self._closing = False
        self._thread = None
        # Lingering (under _lock): the callers of the last two batches, and
        # half the last commit's duration.  See _linger.
        self._expected = 0
        self._linger = 0.0
        self._writing = False  # (under _lock) a commit is being written
        self.solo = True  # a lone caller may commit in its own thread (commit)
        self._conn_lock = threading.Lock()  # guards _conn: the writer's transactions, reads
        self.batches = 0  # group commits that stored rows (read by the tests)

    def load_pending(self):
        """Every PENDING row, oldest first: ``(id, chat, sender, method, params)``."""
        return self._conn.execute(
            "SELECT id, chat, sender, method, params FROM outbox_rows WHERE state = ? "
            "ORDER BY id", (PENDING,)).fetchall()

    def dead_letters(self):
        with self._conn_lock:
            if self._thread is not None and not self._thread.is_alive():
                raise OutboxClosed("the outbox is closed")
            return self._conn.execute(
                "SELECT id, chat, sender, method, params, error FROM outbox_rows "
                "WHERE state = ? ORDER BY id", (DEAD,)).fetchall()

    def clear(self, states, ids=None):
        """Delete the rows in ``states`` (all, or those of ``ids``); their count."""
        marks = ",".join("?" * len(states))
        with self._conn_lock:
            if self._thread is not None and not self._thread.is_alive():
                raise OutboxClosed("the outbox is closed")
            if ids is None:
                cursor = self._conn.execute(
                    "DELETE FROM outbox_rows WHERE state IN (%s)" % marks, tuple(states))
                return cursor.rowcount
            count = 0
            for row_id in ids:
                count += self._conn.execute(
                    "DELETE FROM outbox_rows WHERE id = ? AND state IN (%s)" % marks,
                    (row_id,) + tuple(states)).rowcount
            return count

    def start(self):
        self._thread = threading.Thread(target=self._run, name="fastdispatch-outbox-writer",
                                        daemon=True)
        self._thread.start()

    # -- callers ------------------------------------------------------------

    def commit(self, row):
        """Queue ``row`` for the next group commit and wait for it; raise
        the batch's error.  ``row.id`` is set once it returns."""
        with self._lock:
            if self._closing:
                raise OutboxClosed("the outbox is closed")
            if self.solo and not self._writing and not self._batch.rows \
                    and self._expected <= 1:
                # Alone: nothing being written, nobody waiting, no group
                # lately.  Commit here rather than wake the writer and be
                # woken by it (two thread switches per send).
                self._writing = True
                marks, self._marks = self._marks, []
                batch = None
            else:
                batch = self._batch
                batch.rows.append(row)
                batch.threads.add(threading.get_ident())
                if len(batch.rows) == 1 or len(batch.threads) == self._expected:
                    self._wake.notify()
        if batch is None:
            return self._commit_alone(row, marks)
        while not batch.event.wait(1.0):
            if not self._thread.is_alive():  # bounded: the writer cannot vanish unseen
                raise OutboxError("the outbox's writer thread has stopped; the reply was not "
                                  "stored")
        if batch.error is not None:
            raise batch.error
        return row

    def _commit_alone(self, row, marks):
        batch = Batch()
        batch.rows.append(row)
        try:
            with self._conn_lock:
                self._write(batch, marks)
        except BaseException:
            _log.exception("the outbox failed to write")
            if batch.error is None:
                batch.error = OutboxError("the outbox failed to write; the reply was not stored")
        finally:
            with self._lock:
                self._writing = False
                if self._batch.rows or self._marks or self._closing:
                    self._wake.notify()
        if batch.error is not None:
            raise batch.error
        return row

    def mark(self, row, state, error=None):
        """Record that ``row`` is finished: sent (``state=None``: the row is
        deleted), DEAD with ``error``, or CANCELLED."""
        with self._lock:
            self._marks.append((row, state, error))
            if len(self._marks) == 1:
                self._wake.notify()

    def close(self):
        """Write what was handed over, stop the writer, close the file."""
        with self._lock:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        with self._conn_lock:  # after a lone caller's commit still being written
            self._conn.close()

    # -- the writer thread ----------------------------------------------------

    def _linger_locked(self):
        """Wait (a little) for the callers the last commit released.

        N threads that each send again as soon as their commit returns
        would otherwise split into two groups taking turns: while one
        group's commit is being synced, the other's rows arrive and make
        the next batch alone (N/2 rows per fsync).  So before a commit the
        writer waits until every thread that sent in the last two batches
        has a row in this one, at most half the last commit's duration
        (and ``_MAX_LINGER``): a thread that does not send again costs
        that wait once."""
        batch = self._batch
        if not batch.rows or self._closing or len(batch.threads) >= self._expected:
            return
        deadline = time.perf_counter() + self._linger
        while len(batch.threads) < self._expected and not self._closing:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            self._wake.wait(remaining)

    def _run(self):
        previous = set()
        while True:
            with self._lock:
                while not self._batch.rows and not self._marks and not self._closing:
                    self._wake.wait()
                if not self._batch.rows and not self._closing and len(self._marks) < 256:
                    # Marks alone can wait a moment, to ride with the next
                    # rows (a send notifies) or with more marks.
                    self._wake.wait(_MARKS_DELAY)
                self._linger_locked()
                batch, self._batch = self._batch, Batch()
                marks, self._marks = self._marks, []
                closing = self._closing
                self._writing = True
            if batch.rows or marks:
                started = time.perf_counter()
                try:
                    with self._conn_lock:
                        self._write(batch, marks)
                except BaseException:  # never leave a caller waiting
                    _log.exception("the outbox writer failed")
                    if batch.error is None:
                        batch.error = OutboxError("the outbox writer failed")
                batch.event.set()
                with self._lock:
                    self._writing = False
                    if batch.rows:
                        self._expected = len(batch.threads | previous)
                        self._linger = min(_MAX_LINGER, (time.perf_counter() - started) / 2)
                if batch.rows:
                    previous = batch.threads
            else:
                with self._lock:
                    self._writing = False
            if closing:
                with self._lock:
                    if not self._batch.rows and not self._marks:
                        return

    def _write(self, batch, marks):
        conn = self._conn
        rows = batch.rows
        first = self._next_id
        for i, row in enumerate(rows):
            row.id = first + i
        try:
            # Marks alone need not be fsync'd: losing one in a power cut
            # only sends that reply again.  The next FULL commit syncs them.
            relaxed = not rows and self.durability == "full"
            if relaxed:
                conn.execute("PRAGMA synchronous=NORMAL")
            try:
                conn.execute("BEGIN IMMEDIATE")
                if rows:
                    conn.executemany(
                        "INSERT INTO outbox_rows (id, chat, sender, method, params) "
                        "VALUES (?, ?, ?, ?, ?)",
                        [(r.id, r.chat_id, r.sender, r.method, r.params) for r in rows])
                    conn.execute("UPDATE outbox_meta SET value = ? WHERE key = 'next_id'",
                                 (str(first + len(rows)),))
                self._write_marks(marks)
                conn.execute("COMMIT")
            finally:
                if relaxed:
                    conn.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error as exc:
            self._rollback()
            if rows:
                batch.error = _write_error(self.path, exc)
                if marks:  # the marks alone may still fit
                    return self._write(Batch(), marks)
            else:
                _log.warning("the outbox could not record %d finished replies (%s); "
                             "retrying", len(marks), exc)
                with self._lock:
                    self._marks[:0] = marks
                    closing = self._closing
                if closing:
                    _log.error("closing: %d finished replies stay pending and will be "
                               "sent again at the next open", len(marks))
                    with self._lock:
                        self._marks = []
                else:
                    threading.Event().wait(0.05)
            return None
        self._next_id = first + len(rows)
        if rows:
            self.batches += 1
            self._on_committed(rows)
        if marks:
            self._on_marked([m[0] for m in marks])
        return None

    def _write_marks(self, marks):
        done = [(m[0].id,) for m in marks if m[1] is None]
        kept = [(m[1], m[2], m[0].id) for m in marks if m[1] is not None]
        if done:
            self._conn.executemany("DELETE FROM outbox_rows WHERE id = ?", done)
        if kept:
            self._conn.executemany("UPDATE outbox_rows SET state = ?, error = ? WHERE id = ?",
                                   kept)

    def _rollback(self):
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # no transaction was open


def _write_error(path, exc):
    text = str(exc)
    if "full" in text:
        what = "the disk or the database is full"
    elif "readonly" in text or "read-only" in text:
        what = "the outbox file is read-only"
    else:
        what = text
    error = OutboxError("the reply was not stored, and will not be sent (%s: %s)"
                        % (what, path))
    error.__cause__ = exc
    return error
