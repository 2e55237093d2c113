"""FakeTelegramServer: a product users test their bots against, so it is tested
like one, over real HTTP with the standard library's client."""

import http.client
import json
import subprocess
import sys
import threading
import time

import pytest

from fastdispatch import RateLimit
from fastdispatch.testing import FakeTelegramServer, SentMessage, telegram_limits


def call(server, method, params=None, token="1:x", body=None, content_type="application/json",
         timeout=10, http_method="POST"):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        if body is None:
            body = json.dumps(params or {}).encode()
        conn.request(http_method, "/bot%s/%s" % (token, method), body=body,
                     headers={"Content-Type": content_type})
        resp = conn.getresponse()
        data = resp.read()
        try:
            return resp.status, json.loads(data)
        except ValueError:
            return resp.status, data
    finally:
        conn.close()


@pytest.fixture
def server():
    with FakeTelegramServer() as s:
        yield s


def test_server_listens_on_loopback_on_a_port_the_os_chose():
    with FakeTelegramServer() as s:
        assert s.base_url == "http://127.0.0.1:%d" % s.port and s.port > 0
        assert s._server.server_address[0] == "127.0.0.1"
    with pytest.raises(RuntimeError):
        s.base_url


def test_stop_is_idempotent_and_the_port_is_released(server):
    port = server.port
    server.stop()
    server.stop()
    with pytest.raises(OSError):
        http.client.HTTPConnection("127.0.0.1", port, timeout=2).connect()


def test_any_token_is_accepted_unless_one_is_given():
    with FakeTelegramServer() as s:
        assert call(s, "getMe", token="9:whatever")[0] == 200
    with FakeTelegramServer("5:right") as s:
        assert call(s, "getMe", token="5:right")[0] == 200
        status, answer = call(s, "getMe", token="5:wrong")
        assert status == 401 and answer == {"ok": False, "error_code": 401,
                                             "description": "Unauthorized"}


def test_unknown_methods_and_paths_are_404(server):
    assert call(server, "sendSticker")[0] == 404
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", "/nothing/here")
    assert conn.getresponse().status == 404
    conn.close()


def test_method_names_are_case_insensitive_like_telegrams(server):
    assert call(server, "sendmessage", {"chat_id": 1, "text": "x"})[0] == 200
    assert [m.text for m in server.messages(1)] == ["x"]


def test_sent_messages_are_recorded_per_chat_in_arrival_order_with_times(server):
    before = time.monotonic()
    for i in range(3):
        status, answer = call(server, "sendMessage", {"chat_id": 42, "text": "m%d" % i})
        assert status == 200 and answer["ok"] and answer["result"]["message_id"] == i + 1
        assert answer["result"]["chat"]["id"] == 42
    call(server, "sendMessage", {"chat_id": "-100", "text": "group"})
    got = server.messages("42")
    assert [m.text for m in got] == ["m0", "m1", "m2"]
    assert all(isinstance(m, SentMessage) and before <= m.at <= time.monotonic() for m in got)
    assert got[0].at <= got[1].at <= got[2].at
    assert server.messages(42) == got  # int or str, the same chat
    assert set(server.chats()) == {"42", "-100"}
    assert [m.text for m in server.all_messages()] == ["m0", "m1", "m2", "group"]
    assert server.stats()["sent"] == 4


def test_bad_send_message_arguments_are_400(server):
    assert call(server, "sendMessage", {"chat_id": 1})[1]["description"] == \
        "Bad Request: message text is empty"
    assert call(server, "sendMessage", {"text": "x"})[1]["description"] == \
        "Bad Request: chat_id is empty"
    assert call(server, "sendMessage", {"chat_id": 1, "text": "x" * 4097})[0] == 400
    assert call(server, "sendMessage", {"chat_id": "not a chat", "text": "x"})[0] == 400
    assert server.all_messages() == []


def test_form_encoded_and_query_string_parameters_work_too(server):
    assert call(server, "sendMessage", body=b"chat_id=7&text=form",
                content_type="application/x-www-form-urlencoded")[0] == 200
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", "/bot1:x/sendMessage?chat_id=7&text=query")
    assert conn.getresponse().status == 200
    conn.close()
    assert [m.text for m in server.messages(7)] == ["form", "query"]


def test_malformed_json_and_unknown_content_types_are_400(server):
    assert call(server, "sendMessage", body=b"{not json")[0] == 400
    assert call(server, "sendMessage", body=b"[1, 2]")[0] == 400
    assert call(server, "sendMessage", body=b"x", content_type="text/plain")[0] == 400


def test_oversized_bodies_are_refused_unread():
    with FakeTelegramServer(max_body=1000) as s:
        status, answer = call(s, "sendMessage", body=b"{" + b" " * 2000 + b"}")
        assert status == 413
        assert call(s, "getMe")[0] == 200  # and the server is fine


def test_chat_limit_answers_429_with_the_seconds_until_the_window_has_room():
    with FakeTelegramServer(chat_limit=RateLimit(2, per=0.5)) as s:
        t0 = time.monotonic()
        assert call(s, "sendMessage", {"chat_id": 1, "text": "a"})[0] == 200
        assert call(s, "sendMessage", {"chat_id": 1, "text": "b"})[0] == 200
        status, answer = call(s, "sendMessage", {"chat_id": 1, "text": "c"})
        assert status == 429 and answer["error_code"] == 429
        retry_after = answer["parameters"]["retry_after"]
        assert 0 < retry_after <= 0.5 + 0.001
        assert answer["description"].startswith("Too Many Requests: retry after")
        # another chat is not limited by this chat's window
        assert call(s, "sendMessage", {"chat_id": 2, "text": "x"})[0] == 200
        time.sleep(max(0.0, t0 + 0.5 - time.monotonic()) + 0.01)
        assert call(s, "sendMessage", {"chat_id": 1, "text": "c"})[0] == 200
        assert [m.text for m in s.messages(1)] == ["a", "b", "c"]  # the refused one is not kept
        assert s.stats()["too_many"] == 1


def test_groups_have_their_own_limit_and_everything_counts_bot_wide():
    with FakeTelegramServer(chat_limit=(1, 10.0), group_limit=(3, 10.0),
                            global_limit=(5, 10.0)) as s:
        statuses = [call(s, "sendMessage", {"chat_id": -5, "text": "g%d" % i})[0]
                    for i in range(4)]
        assert statuses == [200, 200, 200, 429]
        assert call(s, "sendMessage", {"chat_id": 1, "text": "p"})[0] == 200
        assert call(s, "sendMessage", {"chat_id": 1, "text": "p"})[0] == 429
        assert call(s, "sendMessage", {"chat_id": 2, "text": "p"})[0] == 200
        status, answer = call(s, "sendMessage", {"chat_id": 3, "text": "p"})
        assert status == 429 and answer["parameters"]["retry_after"] > 9  # bot-wide: 5 in 10 s


def test_refused_sends_do_not_use_up_the_window():
    with FakeTelegramServer(chat_limit=(1, 0.3)) as s:
        assert call(s, "sendMessage", {"chat_id": 1, "text": "a"})[0] == 200
        for _ in range(5):
            assert call(s, "sendMessage", {"chat_id": 1, "text": "x"})[0] == 429
        time.sleep(0.32)
        assert call(s, "sendMessage", {"chat_id": 1, "text": "b"})[0] == 200


def test_telegram_limits_scale_every_window():
    limits = telegram_limits(20)
    assert limits == {"chat_limit": RateLimit(1, per=0.05), "group_limit": RateLimit(20, per=3.0),
                      "global_limit": RateLimit(30, per=0.05)}
    assert telegram_limits()["group_limit"] == RateLimit(20, per=60.0)
    with pytest.raises(ValueError):
        telegram_limits(0)


def raw(server, method="sendMessage", params=None):
    """One request; returns (status, body) or the exception the client saw."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request("POST", "/bot1:x/" + method, body=json.dumps(params or {}).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (OSError, http.client.HTTPException) as exc:
        return exc
    finally:
        conn.close()


def test_injected_faults_answer_as_described(server):
    send = {"chat_id": 9, "text": "t"}
    server.inject("error")
    status, body = raw(server, params=send)
    assert status == 500 and json.loads(body)["error_code"] == 500
    server.inject("error", status=502)
    status, body = raw(server, params=send)
    assert status == 502 and body.startswith(b"<html>")
    server.inject("too_many", retry_after=7)
    status, body = raw(server, params=send)
    assert status == 429 and json.loads(body)["parameters"]["retry_after"] == 7
    assert server.messages(9) == []
    server.inject("drop")
    assert isinstance(raw(server, params=send), http.client.RemoteDisconnected)
    assert server.messages(9) == []
    server.inject("drop_after")
    assert isinstance(raw(server, params=send), http.client.RemoteDisconnected)
    assert len(server.messages(9)) == 1  # it arrived; only the answer was lost
    server.inject("garbage")
    status, body = raw(server, params=send)
    assert status == 200 and body == b"<<not json>>"
    server.inject("truncate")
    assert isinstance(raw(server, params=send), http.client.IncompleteRead)
    server.inject("delay", seconds=0.2)
    t0 = time.monotonic()
    assert raw(server, params=send)[0] == 200
    assert time.monotonic() - t0 >= 0.2
    assert len(server.messages(9)) == 4
    stats = server.stats()
    assert stats["injected_error"] == 2
    assert all(stats["injected_" + f] == 1 for f in (
        "too_many", "drop", "drop_after", "garbage", "truncate", "delay"))


def test_injected_faults_apply_to_their_method_only_and_in_order(server):
    server.inject("error", 2, method="getMe")
    assert raw(server, "sendMessage", {"chat_id": 1, "text": "x"})[0] == 200
    assert raw(server, "getMe")[0] == 500
    assert raw(server, "getMe")[0] == 500
    assert raw(server, "getMe")[0] == 200
    server.inject("too_many", method=None)
    assert raw(server, "getMe")[0] == 429
    with pytest.raises(ValueError):
        server.inject("explode")


def test_random_fault_rates_are_seeded_and_about_right():
    def run():
        with FakeTelegramServer(seed=3) as s:
            s.set_fault_rates(error=0.2, too_many=0.2)
            return [raw(s, params={"chat_id": 1, "text": "x"})[0] for _ in range(200)]
    first = run()
    assert first == run()
    assert 20 <= first.count(500) <= 60 and 20 <= first.count(429) <= 60
    with pytest.raises(ValueError):
        FakeTelegramServer().set_fault_rates(error=0.7, drop=0.7)


def test_latency_delays_the_answer_not_the_arrival():
    with FakeTelegramServer(latency=0.2) as s:
        t0 = time.monotonic()
        assert raw(s, params={"chat_id": 1, "text": "x"})[0] == 200
        assert time.monotonic() - t0 >= 0.2
        assert s.messages(1)[0].at - t0 < 0.15


def test_get_updates_returns_queued_updates_and_an_offset_confirms_them(server):
    first = server.push_message(5, "hello")
    second = server.push_update({"callback_query": {"id": "1"}})
    assert second == first + 1
    status, answer = call(server, "getUpdates")
    assert [u["update_id"] for u in answer["result"]] == [first, second]
    assert answer["result"][0]["message"]["text"] == "hello"
    assert answer["result"][0]["message"]["chat"] == {"id": 5, "type": "private",
                                                      "first_name": "Test"}
    # not confirmed yet: delivered again
    assert len(call(server, "getUpdates")[1]["result"]) == 2
    assert len(call(server, "getUpdates", {"offset": second})[1]["result"]) == 1
    assert call(server, "getUpdates", {"offset": second + 1})[1]["result"] == []
    assert server.pending_updates() == 0


def test_get_updates_limit_and_negative_offset(server):
    ids = [server.push_message(1, str(i)) for i in range(5)]
    assert [u["update_id"] for u in call(server, "getUpdates", {"limit": 2})[1]["result"]] \
        == ids[:2]
    assert [u["update_id"] for u in call(server, "getUpdates", {"offset": -1})[1]["result"]] \
        == ids[-1:]


def test_a_long_poll_waits_for_an_update_and_returns_when_it_comes(server):
    threading.Timer(0.3, server.push_message, args=(5, "late")).start()
    t0 = time.monotonic()
    status, answer = call(server, "getUpdates", {"timeout": 10})
    assert 0.25 <= time.monotonic() - t0 < 5
    assert answer["result"][0]["message"]["text"] == "late"


def test_a_long_poll_without_updates_ends_after_its_timeout(server):
    t0 = time.monotonic()
    assert call(server, "getUpdates", {"timeout": 1})[1]["result"] == []
    assert 0.9 <= time.monotonic() - t0 < 5


def test_a_second_get_updates_terminates_the_first_with_409(server):
    results = []
    t = threading.Thread(target=lambda: results.append(
        call(server, "getUpdates", {"timeout": 10})))
    t.start()
    time.sleep(0.3)
    call(server, "getUpdates", {"timeout": 0})
    server.push_message(1, "wake")
    t.join(5)
    assert results and results[0][0] == 409


def test_get_updates_is_409_while_a_webhook_is_set(server):
    assert call(server, "setWebhook", {"url": "https://example.invalid/hook"})[1]["result"]
    assert call(server, "getUpdates")[0] == 409
    call(server, "deleteWebhook")
    assert call(server, "getUpdates")[0] == 200


def test_stop_ends_a_long_poll_at_once():
    s = FakeTelegramServer().start()
    results = []
    t = threading.Thread(target=lambda: results.append(call(s, "getUpdates", {"timeout": 30})))
    t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    s.stop()
    t.join(10)
    assert not t.is_alive() and time.monotonic() - t0 < 5


def test_delete_typing_administrators_and_restrict_are_recorded(server):
    call(server, "sendMessage", {"chat_id": -7, "text": "x"})
    assert call(server, "deleteMessage", {"chat_id": -7, "message_id": 1})[1]["result"] is True
    assert call(server, "deleteMessage", {"chat_id": -7, "message_id": 1})[0] == 400
    assert server.deleted == [("-7", 1)]
    assert call(server, "sendChatAction", {"chat_id": 3, "action": "typing"})[0] == 200
    assert call(server, "sendChatAction", {"chat_id": 3, "action": "dancing"})[0] == 400
    assert server.chat_actions == [("3", "typing")]
    server.set_chat_administrators(-7, [{"id": 10, "is_bot": False, "first_name": "A"},
                                        {"id": 11, "is_bot": False, "first_name": "B"}])
    admins = call(server, "getChatAdministrators", {"chat_id": -7})[1]["result"]
    assert [(a["status"], a["user"]["id"]) for a in admins] == [("creator", 10),
                                                                 ("administrator", 11)]
    assert call(server, "getChatAdministrators", {"chat_id": 3})[0] == 400
    perms = {"can_send_messages": False}
    assert call(server, "restrictChatMember", {"chat_id": -7, "user_id": 10,
                                               "until_date": 99, "permissions": perms})[0] == 200
    assert call(server, "restrictChatMember", {"chat_id": 3, "user_id": 10,
                                               "permissions": perms})[0] == 400
    assert server.restrictions == [("-7", 10, 99, perms)]


def test_reset_forgets_the_record_limits_and_faults():
    with FakeTelegramServer(chat_limit=(1, 60.0)) as s:
        call(s, "sendMessage", {"chat_id": 1, "text": "a"})
        s.inject("error", 5)
        s.reset()
        assert s.all_messages() == [] and s.stats()["sent"] == 0
        assert call(s, "sendMessage", {"chat_id": 1, "text": "b"})[0] == 200


def test_connections_are_kept_alive(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    for i in range(20):
        conn.request("POST", "/bot1:x/sendMessage",
                     body=json.dumps({"chat_id": 1, "text": str(i)}).encode(),
                     headers={"Content-Type": "application/json"})
        assert conn.getresponse().read()
    conn.close()
    assert server.stats()["connections"] == 1


def test_bad_constructor_arguments_raise_naming_the_argument():
    with pytest.raises(TypeError, match="chat_limit"):
        FakeTelegramServer(chat_limit=5)
    with pytest.raises(ValueError, match="tolerance"):
        FakeTelegramServer(tolerance=-1)
    with pytest.raises(ValueError, match="max_body"):
        FakeTelegramServer(max_body=0)
    with pytest.raises(ValueError, match="latency"):
        FakeTelegramServer(latency=-1)
    with pytest.raises(ValueError, match="latency"):
        FakeTelegramServer(latency=(0.2, 0.1))


def test_command_line_serves_until_terminated():
    proc = subprocess.Popen([sys.executable, "-m", "fastdispatch.testing", "--chat-limit", "1/60"],
                            stdout=subprocess.PIPE, text=True)
    try:
        base = proc.stdout.readline().strip()
        assert base.startswith("http://127.0.0.1:")
        conn = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=5)
        for expected in (200, 429):
            conn.request("POST", "/bot1:x/sendMessage", body=b'{"chat_id": 1, "text": "x"}',
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            assert resp.status == expected
        conn.close()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    if sys.platform != "win32":  # terminate() is a SIGTERM only on POSIX
        assert proc.returncode == 0 and json.loads(out)["sent"] == 1
