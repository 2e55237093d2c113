"""The durable outbox (fastdispatch.outbox): order, outcomes, bad input and file faults.

Replies go to a real FakeTelegramServer (or FakeDiscordServer) on
127.0.0.1; every check reads what the server recorded or what the file
holds.  The kill-and-restart tests are in test_outbox_crash.py.
"""

import json
import os
import sqlite3
import shutil
import subprocess
import sys
import tempfile
import threading

import pytest

from fastdispatch import DispatcherClosed
from fastdispatch.discord import DiscordSender
from fastdispatch.outbox import (Outbox, OutboxClosed, OutboxCorrupt, OutboxError,
                                 OutboxLocked)
from fastdispatch.telegram import PlatformError, TelegramSender
from fastdispatch.testing import FakeDiscordServer, FakeTelegramServer

TOKEN = "123456:SECRET-token_value"
DISCORD_TOKEN = "MTEwMDAwMDAwMDAwMDAwMDAwMQ.GhIjKl.SECRET-part_of-the-token-value"


@pytest.fixture
def server():
    with FakeTelegramServer(TOKEN) as srv:
        yield srv


@pytest.fixture
def sender(server):
    with TelegramSender(TOKEN, base_url=server.base_url, pool_size=32) as s:
        yield s


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "replies.db")


class _Silent:
    """A sender for outboxes that send nothing (their dispatcher is closed)."""

    def call(self, method, params, *, timeout=None):
        return None


def texts(server, chat_id):
    return [m.text for m in server.messages(chat_id)]


def message(chat_id, text):
    return {"chat_id": chat_id, "text": text}


def test_send_commits_then_sends(make_dispatcher, server, sender, db):
    d = make_dispatcher()
    with Outbox(db, d, senders={"telegram": sender}, durability="full") as outbox:
        ticket = outbox.send(7, "sendMessage", message(7, "hello"))
        assert ticket.chat_id == 7 and ticket.id == 1
        assert ticket.future.result(timeout=10)["text"] == "hello"
        second = outbox.send(7, "sendMessage", message(7, "again"))
        assert second.id == 2 and second.key != ticket.key
        assert outbox.drain(timeout=10)
        assert outbox.pending() == 0
    assert texts(server, 7) == ["hello", "again"]
    # A sent row is deleted: that is its mark.
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM outbox_rows").fetchone() == (0,)
    conn.close()


def test_per_chat_commit_order_with_many_threads(make_dispatcher, server, sender, db,
                                                 tiny_switch_interval):
    d = make_dispatcher(max_inflight=16)
    chats = [1, 2, 3, "@channel"]
    tickets = []  # list.append is atomic: every ticket, from every thread
    with Outbox(db, d, senders={"telegram": sender}, durability="normal",
                window=4) as outbox:
        def producer(k):
            last = {}
            for i in range(60):
                chat = chats[(k + i) % len(chats)]
                t = outbox.send(chat, "sendMessage", message(chat, "%d.%d" % (k, i)))
                # One thread's sends are committed in the order it made them.
                assert t.id > last.get(chat, 0)
                last[chat] = t.id
                tickets.append(t)
        threads = [threading.Thread(target=producer, args=(k,)) for k in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outbox.drain(timeout=60)
    assert len(tickets) == 12 * 60
    for chat in chats:
        committed = sorted((t.id, t.future.result()["text"]) for t in tickets
                           if t.chat_id == chat)
        # The server received the chat's replies exactly in commit order.
        assert texts(server, chat) == [text for _, text in committed]


def test_concurrent_sends_share_commits(make_dispatcher, sender, db):
    d = make_dispatcher()
    threads, each = 8, 40
    with Outbox(db, d, senders={"telegram": sender}, durability="full") as outbox:
        def producer(k):
            for i in range(each):
                outbox.send(k, "sendMessage", message(k, str(i)))
        workers = [threading.Thread(target=producer, args=(k,)) for k in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert outbox.drain(timeout=60)
        # Group commit: the eight callers' rows share fsyncs, about eight
        # rows each (measured: 41-44 batches for 320 rows; two groups of
        # callers taking turns, as before the writer lingered, made 80).
        assert outbox._store.batches <= threads * each / 5


def test_bad_input_is_refused_at_the_call(make_dispatcher, sender, db):
    d = make_dispatcher()
    with Outbox(db, d, senders={"telegram": sender, "other": sender},
                durability="normal") as outbox:
        with pytest.raises(TypeError, match="params must be JSON"):
            outbox.send(1, "sendMessage", {"text": {1, 2}}, sender="telegram")
        with pytest.raises(TypeError, match="params must be JSON"):
            outbox.send(1, "sendMessage", {"ratio": float("nan")}, sender="telegram")
        with pytest.raises(TypeError, match="params must be a dict"):
            outbox.send(1, "sendMessage", "text", sender="telegram")
        with pytest.raises(ValueError, match="sender must be one of"):
            outbox.send(1, "sendMessage", {}, sender="nope")
        with pytest.raises(TypeError, match="sender must be given"):
            outbox.send(1, "sendMessage", {})
        with pytest.raises(TypeError, match="chat_id"):
            outbox.send(1.5, "sendMessage", {}, sender="telegram")
        with pytest.raises(TypeError, match="chat_id"):
            outbox.send(True, "sendMessage", {}, sender="telegram")
        with pytest.raises(ValueError, match="chat_id"):
            outbox.send(1 << 70, "sendMessage", {}, sender="telegram")
        with pytest.raises(TypeError, match="method"):
            outbox.send(1, "", {}, sender="telegram")
        assert outbox.pending() == 0
    with pytest.raises(TypeError, match="senders"):
        Outbox(db, d, senders={})
    with pytest.raises(TypeError, match=r"senders\['x'\]"):
        Outbox(db, d, senders={"x": object()})
    with pytest.raises(ValueError, match="durability"):
        Outbox(db, d, senders={"telegram": sender}, durability="fsync")
    with pytest.raises(TypeError, match="dispatcher"):
        Outbox(db, None, senders={"telegram": sender})
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM outbox_rows").fetchone() == (0,)
    conn.close()


def test_failed_for_good_is_a_dead_letter(make_dispatcher, server, sender, db):
    d = make_dispatcher()
    with Outbox(db, d, senders={"telegram": sender}, durability="normal") as outbox:
        bad = outbox.send(5, "sendMessage", {"chat_id": 5})  # no text: 400
        good = outbox.send(5, "sendMessage", message(5, "after"))
        with pytest.raises(PlatformError):
            bad.future.result(timeout=10)
        good.future.result(timeout=10)
        assert outbox.drain(timeout=10)
        [dead] = outbox.dead_letters()
    assert dead.id == bad.id and dead.chat_id == 5 and dead.params == {"chat_id": 5}
    assert dead.sender == "telegram" and "PlatformError" in dead.error
    assert texts(server, 5) == ["after"]
    # Kept across a restart, and never sent again, until cleared.
    with Outbox(db, d, senders={"telegram": sender}) as outbox:
        assert outbox.restored == 0 and [x.id for x in outbox.dead_letters()] == [bad.id]
        assert outbox.clear_dead_letters([good.id]) == 0  # sent: not a dead letter
        assert outbox.clear_dead_letters() == 1
        assert outbox.dead_letters() == []


def test_cancelled_before_it_started_is_skipped(make_dispatcher, server, sender, db):
    d = make_dispatcher()
    release = threading.Event()
    d.submit(9, lambda sc: release.wait(10))  # holds chat 9
    with Outbox(db, d, senders={"telegram": sender}, durability="normal") as outbox:
        doomed = outbox.send(9, "sendMessage", message(9, "never"))
        kept = outbox.send(9, "sendMessage", message(9, "kept"))
        assert doomed.future.cancel()
        release.set()
        kept.future.result(timeout=10)
        assert outbox.drain(timeout=10)
    assert texts(server, 9) == ["kept"]
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT id, state FROM outbox_rows").fetchall() == [(doomed.id, 3)]
    conn.close()


def test_rows_not_sent_go_first_at_the_next_open(make_dispatcher, server, sender, db):
    closed = make_dispatcher()
    closed.shutdown()
    outbox = Outbox(db, closed, senders={"telegram": sender}, durability="normal")
    old = [outbox.send(3, "sendMessage", message(3, "old %d" % i)) for i in range(5)]
    for t in old:
        with pytest.raises(DispatcherClosed):
            t.future.result(timeout=10)
    assert outbox.close(timeout=10)  # nothing left for this process to do
    with pytest.raises(OutboxClosed):
        outbox.send(3, "sendMessage", message(3, "late"))
    with pytest.raises(OutboxClosed):
        outbox.dead_letters()
    assert texts(server, 3) == []

    d = make_dispatcher()
    with Outbox(db, d, senders={"telegram": sender}, durability="normal") as outbox:
        assert outbox.restored == 5
        new = outbox.send(3, "sendMessage", message(3, "new"))
        assert new.id == 6  # ids are never reused: the keys stay unique
        new.future.result(timeout=10)
        assert outbox.drain(timeout=10)
    assert texts(server, 3) == ["old %d" % i for i in range(5)] + ["new"]


def test_restart_needs_every_sender_of_waiting_rows(make_dispatcher, sender, db):
    closed = make_dispatcher()
    closed.shutdown()
    with Outbox(db, closed, senders={"telegram": sender}, durability="normal") as outbox:
        outbox.send(1, "sendMessage", message(1, "x"))
    with pytest.raises(ValueError, match="missing: telegram"):
        Outbox(db, closed, senders={"other": sender})
    # The refused open released the file.
    Outbox(db, closed, senders={"telegram": sender}).close(timeout=5)


def _set_max_pages(outbox, pages):
    # SQLite's own limit on the file's size: it fails writes with the same
    # SQLITE_FULL a full disk gives.
    store = outbox._store
    with store._conn_lock:
        return store._conn.execute("PRAGMA max_page_count=%d" % pages).fetchone()[0]


def test_a_full_database_raises_at_send_and_loses_nothing_accepted(make_dispatcher, server,
                                                                   sender, db):
    d = make_dispatcher()
    release = threading.Event()
    d.submit(4, lambda sc: release.wait(20))  # holds chat 4: accepted rows wait in the file
    with Outbox(db, d, senders={"telegram": sender}, durability="full") as outbox:
        used = outbox._store._conn.execute("PRAGMA page_count").fetchone()[0]
        _set_max_pages(outbox, used + 2)
        accepted = []
        with pytest.raises(OutboxError, match="full") as info:
            for i in range(200):
                accepted.append(outbox.send(4, "sendMessage", message(4, "x" * 2000 + str(i))))
        assert isinstance(info.value.__cause__, sqlite3.Error)
        assert 0 < len(accepted) < 200
        _set_max_pages(outbox, 1 << 30)
        after = outbox.send(4, "sendMessage", message(4, "after"))
        release.set()
        after.future.result(timeout=20)
        assert outbox.drain(timeout=20)
    got = texts(server, 4)
    assert got == [t.future.result()["text"] for t in accepted] + ["after"]


_FILE_SIZE_CHILD = """
import json, os, resource, signal, sys
from fastdispatch import OutboundDispatcher
from fastdispatch.outbox import Outbox, OutboxError
path = sys.argv[1]
d = OutboundDispatcher()
d.shutdown()  # nothing is sent: every accepted row stays in the file
outbox = Outbox(path, d, senders={"s": type("S", (), {"call": lambda *a, **k: None})()})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
largest = max(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
resource.setrlimit(resource.RLIMIT_FSIZE, (largest + 200000, resource.RLIM_INFINITY))
accepted, error = 0, None
for i in range(10000):
    try:
        outbox.send(1, "sendMessage", {"text": "x" * 1000, "i": i})
    except OutboxError as exc:
        error = str(exc)
        break
    accepted += 1
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
outbox.send(1, "sendMessage", {"text": "after", "i": -1})  # room again: accepted
outbox.close(timeout=10)
print(json.dumps({"accepted": accepted + 1, "error": error}))
"""


@pytest.mark.skipif(not hasattr(os, "setuid"), reason="POSIX resource limits")
def test_a_real_write_error_raises_at_send_and_loses_nothing_accepted(make_dispatcher, db):
    # RLIMIT_FSIZE: the kernel refuses writes past a size, as a full disk
    # refuses them, without root.  In a child: the limit is the process's.
    out = subprocess.run([sys.executable, "-c", _FILE_SIZE_CHILD, db], capture_output=True,
                         text=True, timeout=60, env=_child_env())
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["error"] and "not stored" in result["error"]
    assert result["accepted"] > 1
    closed = make_dispatcher()
    closed.shutdown()
    with Outbox(db, closed, senders={"s": _Silent()}) as outbox:
        assert outbox.restored == result["accepted"]  # every accepted row, and no other


@pytest.mark.skipif(not hasattr(os, "setuid"), reason="POSIX users")
def test_a_read_only_file_is_refused_at_open(sender, make_dispatcher):
    # Not under tmp_path: the unprivileged user below must reach the file.
    top = tempfile.mkdtemp(prefix="outbox-ro-")
    path = os.path.join(top, "replies.db")
    d = make_dispatcher()
    with Outbox(path, d, senders={"telegram": sender}) as outbox:
        outbox.send(1, "sendMessage", message(1, "x")).future.result(timeout=10)
    with open(path, "rb") as f:
        before = f.read()
    os.chmod(path, 0o444)
    os.chmod(top, 0o555)
    # root ignores file modes: the child drops to an unprivileged user
    # (after its imports: the interpreter may live in root's home).
    code = ("import os, sys\n"
            "from fastdispatch import OutboundDispatcher\n"
            "from fastdispatch.outbox import Outbox, OutboxError\n"
            "if os.geteuid() == 0: os.setgid(65534); os.setuid(65534)\n"
            "try:\n"
            "    Outbox(sys.argv[1], OutboundDispatcher(), senders={'t': type('S', (), "
            "{'call': lambda *a, **k: None})()})\n"
            "except OutboxError as exc:\n"
            "    print('refused:', exc)\n")
    try:
        out = subprocess.run([sys.executable, "-c", code, path], capture_output=True,
                             text=True, timeout=60, env=_child_env())
        assert "refused:" in out.stdout and "read-only" in out.stdout, (out.stdout, out.stderr)
        with open(path, "rb") as f:
            assert f.read() == before
    finally:
        os.chmod(top, 0o755)
        shutil.rmtree(top)


def _child_env():
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.abspath(__import__("fastdispatch").__file__)))
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_a_second_open_fails_clearly(make_dispatcher, sender, db):
    d = make_dispatcher()
    first = Outbox(db, d, senders={"telegram": sender}, durability="normal")
    try:
        with pytest.raises(OutboxLocked, match="open in another Outbox"):
            Outbox(db, d, senders={"telegram": sender})
        code = ("import sys\n"
                "from fastdispatch import OutboundDispatcher\n"
                "from fastdispatch.outbox import Outbox, OutboxLocked\n"
                "try:\n"
                "    Outbox(sys.argv[1], OutboundDispatcher(), senders={'t': type('S', (), "
                "{'call': lambda *a, **k: None})()})\n"
                "except OutboxLocked as exc:\n"
                "    print('locked:', exc)\n")
        out = subprocess.run([sys.executable, "-c", code, db], capture_output=True, text=True,
                             timeout=60, env=_child_env())
        assert "locked:" in out.stdout, out.stderr
    finally:
        first.close()
    Outbox(db, d, senders={"telegram": sender}).close()


def test_a_corrupt_file_is_said_and_left_alone(make_dispatcher, sender, tmp_path):
    d = make_dispatcher()
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not an SQLite database " * 200)
    before = junk.read_bytes()
    with pytest.raises(OutboxCorrupt, match="left as it is"):
        Outbox(str(junk), d, senders={"telegram": sender})
    assert junk.read_bytes() == before

    damaged = tmp_path / "damaged.db"
    closed = make_dispatcher()
    closed.shutdown()
    with Outbox(str(damaged), closed, senders={"telegram": sender}) as outbox:
        for i in range(300):
            outbox.send(i, "sendMessage", message(i, "y" * 500))
    data = bytearray(damaged.read_bytes())
    page = 4096
    assert len(data) > 4 * page
    data[2 * page + 100: 3 * page] = b"\xa5" * (page - 100)  # a b-tree page overwritten
    damaged.write_bytes(bytes(data))
    with pytest.raises(OutboxCorrupt, match="damaged|not a readable"):
        Outbox(str(damaged), d, senders={"telegram": sender})
    assert damaged.read_bytes() == bytes(data)


class _NonceServer(FakeDiscordServer):
    """FakeDiscordServer that also records each Create Message's nonce."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.nonces = []

    def _content(self, data, *args, **kwargs):
        if data.get("nonce") is not None:  # a Create Message (an edit has no nonce)
            self.nonces.append((data.get("nonce"), data.get("enforce_nonce")))
        return super()._content(data, *args, **kwargs)


def test_discord_sends_carry_the_row_key_as_nonce(make_dispatcher, db):
    d = make_dispatcher()
    with _NonceServer(DISCORD_TOKEN) as srv, \
            DiscordSender(DISCORD_TOKEN, base_url=srv.api_url) as discord:
        with Outbox(db, d, senders={"discord": discord}, durability="normal") as outbox:
            channel = "1100000000000000099"
            path = "POST /channels/%s/messages" % channel
            tickets = [outbox.send(channel, path, {"content": "m%d" % i}) for i in range(3)]
            for t in tickets:
                assert t.future.result(timeout=10)["content"].startswith("m")
            with pytest.raises(ValueError, match="HTTP verb"):
                outbox.send(channel, "sendMessage", {"content": "x"})
        assert srv.nonces == [(t.key, True) for t in tickets]
        assert all(len(t.key) <= 25 for t in tickets)  # Discord's limit for a nonce
        assert [m.content for m in srv.messages(channel)] == ["m0", "m1", "m2"]


def test_a_hook_that_sends_through_the_outbox_does_not_stop_it(make_dispatcher, server,
                                                                sender, db):
    from fastdispatch import DispatcherHooks
    box = {}
    nested = []

    def on_queued(chat_id, queue_len):
        # Runs on the outbox's feeder thread (it submits): a send from
        # here waits for a commit, which the writer thread makes alone.
        if chat_id == 1:
            nested.append(box["outbox"].send(2, "sendMessage", message(2, "from the hook")))

    d = make_dispatcher(hooks=DispatcherHooks(on_queued=on_queued))
    with Outbox(db, d, senders={"telegram": sender}, durability="normal") as outbox:
        box["outbox"] = outbox
        outbox.send(1, "sendMessage", message(1, "first")).future.result(timeout=10)
        assert len(nested) == 1 and nested[0].future.result(timeout=10)
        assert outbox.drain(timeout=10)
    assert texts(server, 1) == ["first"] and texts(server, 2) == ["from the hook"]


class _Panicking:
    """A sender whose first call raises a BaseException (a panic)."""

    def __init__(self, sender):
        self.sender = sender
        self.calls = 0

    def call(self, method, params, *, timeout=None):
        self.calls += 1
        if self.calls == 1:
            raise KeyboardInterrupt("hostile sender")
        return self.sender.call(method, params, timeout=timeout)


def test_a_panicking_sender_makes_a_dead_letter_and_the_outbox_goes_on(make_dispatcher,
                                                                        server, sender, db):
    from fastdispatch import TaskDiscarded
    recovered = []
    d = make_dispatcher(recover=recovered.append)
    with Outbox(db, d, senders={"telegram": _Panicking(sender)},
                durability="normal") as outbox:
        first = outbox.send(6, "sendMessage", message(6, "panics"))
        with pytest.raises(TaskDiscarded):
            first.future.result(timeout=10)
        later = outbox.send(6, "sendMessage", message(6, "later"))
        later.future.result(timeout=10)
        assert outbox.drain(timeout=10)
        assert [x.id for x in outbox.dead_letters()] == [first.id]
        assert "TaskDiscarded" in outbox.dead_letters()[0].error
    assert texts(server, 6) == ["later"]
    assert len(recovered) == 1 and isinstance(recovered[0], KeyboardInterrupt)


def test_a_full_chat_queue_holds_rows_back_in_order(make_dispatcher, server, sender, db):
    # queue_size=1: the dispatcher refuses (QueueFull) most of the window;
    # the outbox keeps those rows and hands them over as room frees.
    d = make_dispatcher(queue_size=1)
    server.latency = 0.005
    with Outbox(db, d, senders={"telegram": sender}, durability="normal") as outbox:
        tickets = [outbox.send(8, "sendMessage", message(8, str(i))) for i in range(40)]
        for t in tickets:
            t.future.result(timeout=30)
        assert outbox.drain(timeout=30)
    assert texts(server, 8) == [str(i) for i in range(40)]
