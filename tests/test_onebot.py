"""fastdispatch.onebot against FakeOneBotServer on 127.0.0.1: the HTTP API
and the forward WebSocket (one connection shared by every thread, answers
matched by echo, reconnected), the retcode mapping, OutcomeUnknown never
retried, chat_of, and a dispatcher paced like Pacing.onebot() meeting no
refusal of the fake's limits (scaled down to milliseconds)."""

import threading
import time

import pytest

pytest.importorskip("websockets")

from fastdispatch import Pacing, RateLimit, RetryPolicy  # noqa: E402
from fastdispatch.onebot import (  # noqa: E402
    OneBotError, OneBotNetworkError, OneBotSender, OutcomeUnknown, chat_of)
from fastdispatch.testing import FakeOneBotServer  # noqa: E402

TOKEN = "s3cret-token"


@pytest.fixture
def server():
    with FakeOneBotServer(access_token=TOKEN, chat_limit=None, global_limit=None) as srv:
        yield srv


@pytest.fixture(params=["http", "websocket"])
def sender(request, server):
    url = server.http_url if request.param == "http" else server.ws_url
    s = OneBotSender(url, access_token=TOKEN, timeout=5.0)
    yield s
    s.close()


def test_send_is_recorded_with_its_text_and_arrival(server, sender):
    before = time.monotonic()
    data = sender.call("send_group_msg", {"group_id": 123, "message": "hi"})
    sender.call("send_msg", {"message_type": "private", "user_id": 7,
                             "message": [{"type": "text", "data": {"text": "a"}},
                                         {"type": "face", "data": {"id": "1"}}]})
    (msg,) = server.messages(("group", 123))
    assert msg.text == "hi" and data == {"message_id": msg.message_id}
    assert before <= msg.at <= time.monotonic()
    assert msg.transport == sender.transport
    assert [m.text for m in server.messages(("private", 7))] == ["a[CQ:face,id=1]"]


def test_retcodes(server, sender):
    server.inject("error", retcode=100)
    with pytest.raises(OneBotError) as info:
        sender.call("send_group_msg", {"group_id": 1, "message": "x"})
    assert info.value.retcode == 100 and "risk control" in str(info.value)
    server.inject("error", retcode=1)  # queued by the implementation: no data
    assert sender.call("send_group_msg", {"group_id": 1, "message": "x"}) is None
    with pytest.raises(OneBotError) as info:
        sender.call("no_such_action", {})
    assert info.value.status in (404, 1404)
    with pytest.raises(OneBotError) as info:
        sender.call("send_group_msg", {"message": "no chat"})
    assert info.value.retcode == 1400
    assert server.messages(("group", 1)) == []


def test_wrong_token_is_refused(server):
    with OneBotSender(server.http_url, access_token="wrong") as s:
        with pytest.raises(OneBotError) as info:
            s.call("get_status")
        assert info.value.status == 403 and "wrong" not in str(info.value)
    with OneBotSender(server.ws_url, access_token="wrong") as s:
        with pytest.raises(OneBotNetworkError):
            s.call("get_status")


def test_no_answer_is_outcome_unknown_and_never_retried(server, sender, make_dispatcher):
    d = make_dispatcher(retry=RetryPolicy(max_attempts=5, backoff=0))
    server.inject("drop_after")  # done, never confirmed (NapCat's late confirmation)
    future = d.submit(("group", 9), lambda sc: sender.call(
        "send_group_msg", {"group_id": 9, "message": "once"}, timeout=0.3))
    with pytest.raises(OutcomeUnknown) as info:
        future.result(10)
    assert isinstance(info.value, TimeoutError)
    assert [m.text for m in server.messages(("group", 9))] == ["once"]
    # The next call on the same connection is answered as usual.
    assert sender.call("send_group_msg", {"group_id": 9, "message": "next"})


def test_delayed_answer_within_the_deadline(server, sender):
    server.inject("delay", seconds=0.2)
    assert sender.call("send_group_msg", {"group_id": 3, "message": "slow"}, timeout=5)


def test_websocket_is_one_connection_shared_and_matched_by_echo(server, tiny_switch_interval):
    with OneBotSender(server.ws_url, access_token=TOKEN) as s:
        results = {}
        errors = []

        def work(t):
            try:
                for i in range(25):
                    text = "%d-%d" % (t, i)
                    results[text] = s.call("send_private_msg", {"user_id": t, "message": text})
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        assert server.stats()["ws_connections"] == 1
        by_text = {m.text: m.message_id for m in server.all_messages()}
        assert len(results) == 200
        assert all(results[text] == {"message_id": by_text[text]} for text in results)


def test_websocket_reconnects_and_a_call_cut_off_is_unknown(server):
    with OneBotSender(server.ws_url, access_token=TOKEN) as s:
        assert s.call("get_status")
        server.inject("drop_after")
        box = []
        t = threading.Thread(target=lambda: box.append(_raises(lambda: s.call(
            "send_group_msg", {"group_id": 4, "message": "cut"}, timeout=10))))
        t.start()
        while not server.messages(("group", 4)):
            time.sleep(0.01)
        assert server.drop_connections() == 1
        t.join(10)
        assert isinstance(box[0], OutcomeUnknown) and "lost" in str(box[0])
        assert s.call("send_group_msg", {"group_id": 4, "message": "again"})
        assert server.stats()["ws_connections"] == 2


def test_refused_connection_is_a_retryable_network_error():
    with FakeOneBotServer() as srv:
        http_url, ws_url = srv.http_url, srv.ws_url
    for url in (http_url, ws_url):
        with OneBotSender(url, connect_timeout=2) as s:
            with pytest.raises(OneBotNetworkError) as info:
                s.call("get_status", timeout=2)
            assert isinstance(info.value, ConnectionError)


def test_events_reach_on_event(server):
    got = []
    with OneBotSender(server.ws_url, access_token=TOKEN, on_event=got.append) as s:
        s.call("get_status")
        mid = server.push_group_message(55, 66, "hello")
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert got[0]["meta_event_type"] == "lifecycle"
    assert (got[1]["group_id"], got[1]["user_id"], got[1]["raw_message"],
            got[1]["message_id"]) == (55, 66, "hello", mid)


@pytest.mark.parametrize("action, params, chat", [
    ("send_group_msg", {"group_id": 1}, ("group", 1)),
    ("send_group_msg", {"group_id": "12"}, ("group", 12)),
    ("send_private_msg", {"user_id": 2}, ("private", 2)),
    ("send_msg", {"message_type": "group", "group_id": 3, "user_id": 4}, ("group", 3)),
    ("send_msg", {"message_type": "private", "group_id": 3, "user_id": 4}, ("private", 4)),
    ("send_msg", {"group_id": 3, "user_id": 4}, ("group", 3)),
    ("send_msg", {"user_id": 4}, ("private", 4)),
    ("send_group_forward_msg", {"group_id": 5}, ("group", 5)),
    ("send_private_forward_msg", {"user_id": 6}, ("private", 6)),
    ("send_group_msg_async", {"group_id": 7}, ("group", 7)),
    ("set_group_ban", {"group_id": 8, "user_id": 9}, ("group", 8)),
    ("get_group_info", {"group_id": 8}, None),
    ("delete_msg", {"message_id": 1}, None),
    ("send_group_msg", {"group_id": True}, None),
    ("send_group_msg", {}, None),
    (None, {}, None),
])
def test_chat_of(action, params, chat):
    assert chat_of(action, params) == chat


def test_pacing_onebot_is_the_fake_default():
    p = Pacing.onebot()
    srv = FakeOneBotServer()
    assert (p.chat_limit, p.global_limit) == (srv.chat_limit, srv.global_limit)
    assert p.chat_limit == RateLimit(1, per=1.0) and p.global_limit == RateLimit(2, per=1.0)


def _scaled(limit, k):
    return RateLimit(limit.count, per=limit.per * k)


def test_paced_dispatcher_meets_no_refusal(make_dispatcher):
    """Pacing.onebot() scaled by k: the dispatcher's own start stamps keep
    both windows exactly; the fake (the same limits, scaled, allowing 90 %
    of a window for the trip) refuses nothing; every send arrives, in order
    per chat, never two at once in a chat; a risk-control failure of one
    chat leaves the others going."""
    k = 0.05
    p = Pacing.onebot()
    chat_limit, global_limit = _scaled(p.chat_limit, k), _scaled(p.global_limit, k)
    with FakeOneBotServer(chat_limit=chat_limit, global_limit=global_limit,
                          tolerance=k * 0.9, latency=0.002) as srv, \
            OneBotSender(srv.ws_url) as s:
        d = make_dispatcher(pacing=Pacing(global_limit=global_limit, chat_limit=chat_limit))
        srv.inject("error", chat=("group", 3), retcode=100)
        futures, starts = {}, []
        for i in range(4):
            for g in range(10):
                def task(sc, g=g, i=i):
                    starts.append((sc.started, g))
                    return s.call("send_group_msg", {"group_id": g, "message": "%d" % i},
                                  timeout=sc.remaining())
                futures[g, i] = d.submit(("group", g), task)
        errors = {key: f.exception(60) for key, f in futures.items()}
        assert [key for key, e in errors.items() if e is not None] == [(3, 0)]
        assert errors[3, 0].retcode == 100
        stats = srv.stats()
        assert stats["limit_refusals"] == 0 and stats["concurrent"] == 0
        for g in range(10):
            expected = ["1", "2", "3"] if g == 3 else ["0", "1", "2", "3"]
            assert [m.text for m in srv.messages(("group", g))] == expected
    eps = 1e-6
    times = sorted(t for t, _ in starts)
    assert all(b - a >= global_limit.per - eps for a, b in zip(times, times[2:]))
    for g in range(10):
        mine = sorted(t for t, chat in starts if chat == g)
        assert all(b - a >= chat_limit.per - eps for a, b in zip(mine, mine[1:]))


def _raises(fn):
    try:
        fn()
    except BaseException as exc:
        return exc
    return None


def test_command_line_serves_both_fakes():
    import json
    import signal
    import subprocess
    import sys
    import urllib.request
    for flag, first in (("--onebot", "ws://"), ("--qq", "http://")):
        proc = subprocess.Popen([sys.executable, "-m", "fastdispatch.testing", flag],
                                stdout=subprocess.PIPE, text=True)
        try:
            url = proc.stdout.readline().strip()
            control = proc.stdout.readline().strip()
            assert url.startswith(first) and control.endswith("/control")
            action = "push_group_message" if flag == "--onebot" else "push_c2c_message"
            body = {"group_id": 1, "user_id": 2, "text": "hi"} if flag == "--onebot" \
                else {"openid": "U", "text": "hi"}
            request = urllib.request.Request(control + "/" + action,
                                             data=json.dumps(body).encode(), method="POST",
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as answer:
                assert json.load(answer)["ok"] is True
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0 and json.loads(out.strip().splitlines()[-1])
