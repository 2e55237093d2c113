"""fastdispatch.qq against FakeQQServer on 127.0.0.1: the access token's life
cycle, the four targets, the passive-reply rules checked before a request, a
retry after a timeout deduplicated by msg_seq (sent once), and 22009 pausing
only its chat."""

import logging
import threading
import time

import pytest

from fastdispatch import Pacing, RateLimit, RetryPolicy
from fastdispatch.qq import QQNetworkError, QQSender, ReplyWindowExpired
from fastdispatch.testing import FakeQQServer

SECRET = "client-secret-xyz"


@pytest.fixture
def server():
    with FakeQQServer("1024", SECRET) as srv:
        yield srv


@pytest.fixture
def sender(server):
    s = QQSender("1024", SECRET, base_url=server.base_url, timeout=5)
    yield s
    s.close()


class _SC:  # a task's context outside a dispatcher: no deadline
    def remaining(self):
        return None


def test_replies_to_each_target(server, sender):
    g = server.push_group_message("G1", "ping")
    c = server.push_c2c_message("U1", "ping")
    assert sender.reply(_SC(), ("group", "G1"), "pong", msg_id=g).message_id
    sender.reply(_SC(), ("c2c", "U1"), "pong", msg_id=c)
    sender.reply(_SC(), ("channel", "C1"), "pong", msg_id="guild-msg")
    sender.reply(_SC(), ("dms", "D1"), "pong", msg_id="dm-msg")
    (msg,) = server.messages(("group", "G1"))
    assert (msg.text, msg.msg_id, msg.msg_seq) == ("pong", g, 1)
    for chat in (("c2c", "U1"), ("channel", "C1"), ("dms", "D1")):
        assert [m.text for m in server.messages(chat)] == ["pong"]
    assert server.stats()["tokens"] == 1  # fetched once


def test_msg_seq_per_message_and_five_replies_at_most(server, sender):
    g = server.push_group_message("G", "ping")
    for i in range(5):
        sender.reply(_SC(), ("group", "G"), "r%d" % i, msg_id=g)
    requests = server.stats()["requests"]
    with pytest.raises(ReplyWindowExpired):
        sender.reply(_SC(), ("group", "G"), "sixth", msg_id=g)
    assert server.stats()["requests"] == requests  # no request made
    assert [m.msg_seq for m in server.messages(("group", "G"))] == [1, 2, 3, 4, 5]


def test_reply_after_its_window_fails_without_a_request(server, sender):
    old = server.push_group_message("G", "ping", age=301)
    c2c = server.push_c2c_message("U", "ping", age=301)  # c2c's window is 60 min
    requests = server.stats().get("requests", 0)
    with pytest.raises(ReplyWindowExpired) as info:
        sender.reply(_SC(), ("group", "G"), "late", msg_id=old, msg_time=time.time() - 301)
    assert "window" in str(info.value)
    assert server.stats().get("requests", 0) == requests
    sender.reply(_SC(), ("c2c", "U"), "in time", msg_id=c2c, msg_time=time.time() - 301)
    assert server.messages(("group", "G")) == []


def test_retry_after_a_timeout_is_deduplicated(server, make_dispatcher):
    # The sender's own 0.4 s deadline per call (the dispatcher sets none).
    sender = QQSender("1024", SECRET, base_url=server.base_url, timeout=0.4)
    d = make_dispatcher(retry=RetryPolicy(max_attempts=3, backoff=0), send_timeout=None)
    g = server.push_group_message("G", "ping")
    server.inject("delay", seconds=1.0)  # recorded, answered after the client gave up
    attempts = []

    def reply(sc):
        attempts.append(sc.attempt)
        return sender.reply(sc, ("group", "G"), "once", msg_id=g)

    d.submit(("group", "G"), reply).result(20)
    assert attempts == [1, 2]
    assert [m.text for m in server.messages(("group", "G"))] == ["once"]
    assert server.stats()["deduplicated"] == 1
    # The next reply to the same message gets the next msg_seq.
    d.submit(("group", "G"), lambda sc: sender.reply(sc, ("group", "G"), "two",
                                                     msg_id=g)).result(10)
    assert [m.msg_seq for m in server.messages(("group", "G"))] == [1, 2]
    sender.close()


def test_22009_pauses_only_its_chat(server, sender, make_dispatcher):
    d = make_dispatcher(pacing=Pacing.qq())
    ids = {chat: server.push_group_message(chat, "ping") for chat in ("A", "B")}
    server.inject("too_many", chat=("group", "A"))
    done = {}

    def reply(chat, text):
        def task(sc):
            result = sender.reply(sc, ("group", chat), text, msg_id=ids[chat])
            done[text] = time.monotonic()
            return result
        return task
    fa = [d.submit(("group", "A"), reply("A", "a%d" % i)) for i in range(2)]
    fb = [d.submit(("group", "B"), reply("B", "b%d" % i)) for i in range(2)]
    for f in fa + fb:
        f.result(20)
    assert server.stats()["too_fast"] == 1
    assert [m.text for m in server.messages(("group", "A"))] == ["a0", "a1"]
    assert [m.text for m in server.messages(("group", "B"))] == ["b0", "b1"]
    # A waited its second (RetryAfter 1 s); B did not wait for it.
    assert max(done["b0"], done["b1"]) < done["a0"]


def test_expired_token_is_refreshed_once_and_never_logged(server, sender, caplog):
    g = server.push_group_message("G", "ping")
    with caplog.at_level(logging.DEBUG):
        sender.reply(_SC(), ("group", "G"), "one", msg_id=g)
        assert server.expire_tokens() == 1
        sender.reply(_SC(), ("group", "G"), "two", msg_id=g)
    assert server.stats()["tokens"] == 2 and server.stats()["unauthorized"] == 1
    assert "fake-token" not in caplog.text and SECRET not in caplog.text
    assert SECRET not in repr(sender)


def test_one_token_fetch_for_many_threads(server):
    with QQSender("1024", SECRET, base_url=server.base_url) as s:
        ids = [server.push_c2c_message("U%d" % i) for i in range(16)]
        threads = [threading.Thread(target=s.reply, args=(_SC(), ("c2c", "U%d" % i), "x"),
                                    kwargs={"msg_id": ids[i]}) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert server.stats()["tokens"] == 1 and server.stats()["sent"] == 16


def test_token_refreshed_before_expiry():
    with FakeQQServer("1024", SECRET, token_ttl=60.5) as srv, \
            QQSender("1024", SECRET, base_url=srv.base_url) as s:
        ids = [srv.push_c2c_message("U") for _ in range(2)]
        s.reply(_SC(), ("c2c", "U"), "a", msg_id=ids[0])
        time.sleep(0.6)  # now within a minute of expiry: refreshed before the call
        s.reply(_SC(), ("c2c", "U"), "b", msg_id=ids[1])
        assert srv.stats()["tokens"] == 2 and srv.stats().get("unauthorized", 0) == 0


def test_bad_arguments_raise_at_the_call(sender):
    with pytest.raises(ValueError, match="target"):
        sender.reply(_SC(), ("guild", "x"), "t", msg_id="m")
    with pytest.raises(ValueError, match="msg_id"):
        sender.reply(_SC(), ("group", "G"), "t", msg_id="")
    with pytest.raises(ValueError, match="app_id"):
        QQSender("abc", SECRET)


def test_lost_answer_is_a_retryable_network_error():
    with FakeQQServer("1024", SECRET) as srv:
        url = srv.base_url
    with QQSender("1024", SECRET, base_url=url, connect_timeout=2, timeout=2) as s:
        with pytest.raises(QQNetworkError) as info:
            s.reply(_SC(), ("group", "G"), "x", msg_id="m")
        assert isinstance(info.value, ConnectionError)


def test_pacing_qq():
    assert Pacing.qq().chat_limit == RateLimit(5, per=1.0)
