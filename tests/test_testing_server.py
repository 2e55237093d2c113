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


def test_unknown_methods_and_paths_are_404_not_found_like_telegram(server):
    assert call(server, "sendInvoice") == (404, {"ok": False, "error_code": 404,
                                                 "description": "Not Found"})
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


def test_retry_after_is_an_integer_of_whole_seconds_rounded_up_by_default():
    # The Bot API types ResponseParameters.retry_after as Integer, and
    # aiogram refuses anything else.
    with FakeTelegramServer(chat_limit=RateLimit(1, per=0.3)) as s:
        assert call(s, "sendMessage", {"chat_id": 1, "text": "a"})[0] == 200
        status, answer = call(s, "sendMessage", {"chat_id": 1, "text": "b"})
        assert status == 429 and answer["parameters"] == {"retry_after": 1}
        assert type(answer["parameters"]["retry_after"]) is int
        assert answer["description"] == "Too Many Requests: retry after 1"
        s.inject("too_many", retry_after=2.2)
        answer = call(s, "sendMessage", {"chat_id": 2, "text": "x"})[1]
        assert answer["parameters"] == {"retry_after": 3}


def test_chat_limit_answers_429_with_the_exact_seconds_when_asked():
    with FakeTelegramServer(chat_limit=RateLimit(2, per=0.5), exact_retry_after=True) as s:
        t0 = time.monotonic()
        assert call(s, "sendMessage", {"chat_id": 1, "text": "a"})[0] == 200
        assert call(s, "sendMessage", {"chat_id": 1, "text": "b"})[0] == 200
        status, answer = call(s, "sendMessage", {"chat_id": 1, "text": "c"})
        assert status == 429 and answer["error_code"] == 429
        retry_after = answer["parameters"]["retry_after"]
        assert 0 < retry_after <= 0.5 + 0.001 and retry_after != int(retry_after)
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
    assert status == 502 and json.loads(body) == {"ok": False, "error_code": 502,
                                                  "description": "Bad Gateway"}
    server.inject("error", status=502, html=True)
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
    assert stats["injected_error"] == 3
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


def test_an_injected_fault_for_one_chat_spares_the_others(server):
    server.inject("too_many", method="sendMessage", chat_id=7, retry_after=3)
    assert raw(server, params={"chat_id": 1, "text": "x"})[0] == 200
    assert raw(server, params={"chat_id": "@chan", "text": "x"})[0] == 200
    status, body = raw(server, params={"chat_id": "7", "text": "x"})  # the string of the id
    assert status == 429 and json.loads(body)["parameters"] == {"retry_after": 3}
    assert raw(server, params={"chat_id": 7, "text": "x"})[0] == 200
    assert [m.text for m in server.messages(7)] == ["x"]


def test_arrival_jitter_reorders_requests_sent_at_once():
    # 20 requests of one chat, each sent once the previous one's bytes are
    # out (not answered): with jitter the record is shuffled, and the
    # server saw several of them at once.
    with FakeTelegramServer(arrival_jitter=(0.0, 0.2), seed=5) as s:
        threads = []
        for i in range(20):
            t = threading.Thread(target=raw, args=(s, "sendMessage",
                                                   {"chat_id": 3, "text": str(i)}))
            t.start()
            threads.append(t)
            time.sleep(0.005)
        for t in threads:
            t.join()
        texts = [m.text for m in s.messages(3)]
        assert sorted(texts, key=int) == [str(i) for i in range(20)]
        assert texts != sorted(texts, key=int)
        assert s.max_in_flight()["3"] > 1
    with pytest.raises(ValueError):
        FakeTelegramServer(arrival_jitter=(0.2, 0.1))


def test_max_in_flight_is_one_for_a_client_that_waits_for_each_answer():
    with FakeTelegramServer(latency=(0.0, 0.01), arrival_jitter=(0.0, 0.01), seed=1) as s:
        s.inject("too_many", chat_id=2)
        s.inject("drop", chat_id=2)
        for i in range(10):
            raw(s, params={"chat_id": 2, "text": str(i)})
            raw(s, "getChat", {"chat_id": -100123})
        raw(s, "getMe")
        assert s.max_in_flight() == {"2": 1, "-100123": 1}
        s.reset()
        assert s.max_in_flight() == {}


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


SUPERGROUP = -1001234567890


def test_delete_typing_administrators_and_restrict_are_recorded(server):
    call(server, "sendMessage", {"chat_id": -7, "text": "x"})
    assert call(server, "deleteMessage", {"chat_id": -7, "message_id": 1})[1]["result"] is True
    assert call(server, "deleteMessage", {"chat_id": -7, "message_id": 1})[1]["description"] \
        == "Bad Request: message to delete not found"
    assert server.deleted == [("-7", 1)]
    assert call(server, "sendChatAction", {"chat_id": 3, "action": "typing"})[0] == 200
    assert call(server, "sendChatAction", {"chat_id": 3, "action": "dancing"})[0] == 400
    assert server.chat_actions == [("3", "typing")]
    server.set_chat_administrators(-7, [{"id": 10, "is_bot": False, "first_name": "A"},
                                        {"id": 11, "is_bot": False, "first_name": "B"}])
    admins = call(server, "getChatAdministrators", {"chat_id": -7}, token="77:x")[1]["result"]
    assert [(a["status"], a["user"]["id"]) for a in admins] == [
        ("creator", 10), ("administrator", 11), ("administrator", 77)]  # the bot last
    assert call(server, "getChatAdministrators", {"chat_id": 3})[0] == 400
    perms = {"can_send_messages": False}
    assert call(server, "restrictChatMember", {"chat_id": SUPERGROUP, "user_id": 10,
                                               "until_date": 99, "permissions": perms})[0] == 200
    for chat in (3, -7):  # a private chat, a basic group: Telegram restricts in supergroups only
        assert call(server, "restrictChatMember", {"chat_id": chat, "user_id": 10,
                                                   "permissions": perms})[1]["description"] \
            == "Bad Request: method is available only for supergroups"
    assert server.restrictions == [(str(SUPERGROUP), 10, 99, perms)]


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
        assert proc.stdout.readline().strip() == base + "/control"
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


# -- answers as the Bot API documents them ---------------------------------------

def test_get_me_is_the_bot_of_the_token():
    with FakeTelegramServer() as s:
        me = call(s, "getMe", token="7012345678:AAF-secret")[1]["result"]
        assert me["id"] == 7012345678 and me["is_bot"] is True
        assert isinstance(me["first_name"], str) and isinstance(me["username"], str)
        assert all(isinstance(me[k], bool) for k in (
            "can_join_groups", "can_read_all_group_messages", "supports_inline_queries"))
        assert call(s, "getMe", token="55:other")[1]["result"]["id"] == 55


@pytest.mark.parametrize("token", ["no-colon", "abc:def", "12:", ":x"])
def test_a_token_that_is_not_a_bot_token_is_unauthorized(server, token):
    assert call(server, "getMe", token=token) == (401, {"ok": False, "error_code": 401,
                                                        "description": "Unauthorized"})


def test_sent_messages_carry_from_chat_and_an_integer_date(server):
    before = int(time.time())
    for chat, kind in ((42, "private"), (-4123, "group"), (SUPERGROUP, "supergroup")):
        message = call(server, "sendMessage", {"chat_id": chat, "text": "hi"},
                       token="99:x")[1]["result"]
        assert message["from"]["id"] == 99 and message["from"]["is_bot"] is True
        assert message["chat"]["id"] == chat and message["chat"]["type"] == kind
        assert type(message["date"]) is int and before <= message["date"] <= time.time() + 1
        assert type(message["message_id"]) is int and message["text"] == "hi"


def multipart(fields, boundary="----fastdispatch-test"):
    parts = []
    for name, value in fields.items():
        if isinstance(value, tuple):
            filename, data = value
            parts.append(b'--%s\r\nContent-Disposition: form-data; name="%s"; filename="%s"\r\n'
                         b"Content-Type: application/octet-stream\r\n\r\n%s\r\n"
                         % (boundary.encode(), name.encode(), filename.encode(), data))
        else:
            parts.append(b'--%s\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n'
                         % (boundary.encode(), name.encode(), str(value).encode()))
    return b"".join(parts) + b"--%s--\r\n" % boundary.encode(), \
        "multipart/form-data; boundary=%s" % boundary


def test_multipart_form_data_bodies_are_accepted_as_the_bot_api_does(server):
    body, ctype = multipart({"chat_id": 7, "text": "multi\u00e9part",
                             "attachment": ("a.bin", b"\x00\x01")})
    status, answer = call(server, "sendMessage", body=body, content_type=ctype)
    assert status == 200 and answer["result"]["text"] == "multi\u00e9part"
    perms = json.dumps({"can_send_messages": False})
    body, ctype = multipart({"chat_id": SUPERGROUP, "user_id": 5, "permissions": perms})
    assert call(server, "restrictChatMember", body=body, content_type=ctype)[0] == 200
    assert server.restrictions[-1][3] == {"can_send_messages": False}
    assert call(server, "sendMessage", body=b"--x\r\nbroken",
                content_type="multipart/form-data; boundary=zzz")[0] == 400


def test_the_bot_may_delete_incoming_messages_where_the_bot_api_allows(server):
    private = server.update(server.push_message(5, "mine"))["message"]["message_id"]
    assert call(server, "deleteMessage", {"chat_id": 5, "message_id": private})[1] == {
        "ok": True, "result": True}
    group = server.update(server.push_message(-4123, "in a group"))["message"]["message_id"]
    assert call(server, "deleteMessage", {"chat_id": -4123, "message_id": group})[0] == 200
    assert server.deleted == [("5", private), ("-4123", group)]
    with FakeTelegramServer(bot_is_admin=False) as s:  # a plain member of the group
        incoming = s.update(s.push_message(-4123, "x"))["message"]["message_id"]
        assert call(s, "deleteMessage", {"chat_id": -4123, "message_id": incoming})[1][
            "description"] == "Bad Request: message can't be deleted"
        own = call(s, "sendMessage", {"chat_id": -4123, "text": "y"})[1]["result"]["message_id"]
        assert call(s, "deleteMessage", {"chat_id": -4123, "message_id": own})[0] == 200
        admins = call(s, "getChatAdministrators", {"chat_id": -4123})[1]["result"]
        assert [a["user"]["id"] for a in admins] == [1]


def test_edit_message_text_edits_the_bots_own_messages_only(server):
    sent = call(server, "sendMessage", {"chat_id": 8, "text": "v1"}, token="31:x")[1]["result"]
    status, answer = call(server, "editMessageText", {"chat_id": 8, "message_id":
                                                      sent["message_id"], "text": "v2"})
    edited = answer["result"]
    assert status == 200 and edited["text"] == "v2" and edited["message_id"] == sent["message_id"]
    assert type(edited["edit_date"]) is int and edited["from"]["id"] == 31
    assert server.edits == [("8", sent["message_id"], "v2")]
    assert call(server, "editMessageText", {"chat_id": 8, "message_id": sent["message_id"],
                                            "text": "v2"})[1]["description"].startswith(
        "Bad Request: message is not modified")
    assert call(server, "editMessageText", {"chat_id": 8, "message_id": 999, "text": "x"})[1][
        "description"] == "Bad Request: message to edit not found"
    incoming = server.update(server.push_message(8, "theirs"))["message"]["message_id"]
    assert call(server, "editMessageText", {"chat_id": 8, "message_id": incoming, "text": "x"})[
        1]["description"] == "Bad Request: message can't be edited"
    assert [m.text for m in server.messages(8)] == ["v1"]  # the record is what arrived


def test_get_chat_answers_a_chat_full_info_with_its_required_fields(server):
    for chat, kind in ((5, "private"), (-4123, "group"), (SUPERGROUP, "supergroup")):
        info = call(server, "getChat", {"chat_id": chat})[1]["result"]
        assert info["id"] == chat and info["type"] == kind
        assert type(info["accent_color_id"]) is int and type(info["max_reaction_count"]) is int
        assert set(info["accepted_gift_types"]) >= {"unlimited_gifts", "limited_gifts",
                                                    "unique_gifts", "premium_subscription"}


def test_chat_members_carry_every_field_the_bot_api_requires(server):
    server.set_chat_administrators(SUPERGROUP, [{"id": 10, "first_name": "A"},
                                                {"id": 11, "first_name": "B"}])
    owner, admin, bot = call(server, "getChatAdministrators", {"chat_id": SUPERGROUP})[1]["result"]
    assert owner == {"status": "creator", "is_anonymous": False,
                     "user": {"id": 10, "first_name": "A", "is_bot": False}}
    required = ("can_be_edited", "is_anonymous", "can_manage_chat", "can_delete_messages",
                "can_manage_video_chats", "can_restrict_members", "can_promote_members",
                "can_change_info", "can_invite_users", "can_post_stories", "can_edit_stories",
                "can_delete_stories")
    for member in (admin, bot):
        assert member["status"] == "administrator"
        assert all(type(member[k]) is bool for k in required)
    assert bot["user"]["is_bot"] is True


def test_a_group_migrates_to_a_supergroup_on_demand(server):
    assert call(server, "sendMessage", {"chat_id": -4123, "text": "before"})[0] == 200
    new = server.migrate_chat(-4123)
    assert new == -1000000004123 and server.migrations() == {"-4123": str(new)}
    for method, params in (("sendMessage", {"text": "x"}), ("sendChatAction",
                                                             {"action": "typing"})):
        status, answer = call(server, method, dict(params, chat_id=-4123))
        assert (status, answer) == (400, {
            "ok": False, "error_code": 400,
            "description": "Bad Request: group chat was upgraded to a supergroup chat",
            "parameters": {"migrate_to_chat_id": new}})
    assert call(server, "sendMessage", {"chat_id": new, "text": "after"})[1]["result"][
        "chat"] == {"id": new, "type": "supergroup", "title": "Group %d" % new}
    assert [m.text for m in server.messages(-4123)] == ["before"]
    assert [m.text for m in server.messages(new)] == ["after"]
    assert call(server, "getChat", {"chat_id": new})[1]["result"]["migrate_from_chat_id"] \
        == -4123
    service = [u["message"] for u in call(server, "getUpdates")[1]["result"]]
    assert [m.get("migrate_to_chat_id") for m in service] == [new, None]
    assert [m.get("migrate_from_chat_id") for m in service] == [None, -4123]
    with pytest.raises(ValueError, match="basic group"):
        server.migrate_chat(new)  # a supergroup does not migrate
    with pytest.raises(ValueError):
        server.migrate_chat(-4123)  # nor does a group twice


def test_a_group_can_migrate_after_a_number_of_messages(server):
    new = server.migrate_chat(-55, -1009999999999, after=3)
    statuses = [call(server, "sendMessage", {"chat_id": -55, "text": str(i)})[0]
                for i in range(5)]
    assert statuses == [200, 200, 200, 400, 400] and new == -1009999999999
    assert [m.text for m in server.messages(-55)] == ["0", "1", "2"]


# -- control from outside the process ---------------------------------------------

def control(base, action, **args):
    conn = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=10)
    try:
        conn.request("POST", "/control/" + action, body=json.dumps(args).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_the_control_endpoint_is_off_unless_asked(server):
    assert call(server, "getMe")[0] == 200
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("POST", "/control/stats", body=b"{}")
    assert conn.getresponse().status == 404  # not a Bot API path either
    conn.close()


def test_the_command_line_server_is_controlled_over_http_from_another_process():
    proc = subprocess.Popen([sys.executable, "-m", "fastdispatch.testing", "--chat-limit", "5/60"],
                            stdout=subprocess.PIPE, text=True)
    try:
        base = proc.stdout.readline().strip()
        assert proc.stdout.readline().strip() == base + "/control"
        # push an update; a long poll started before it returns it
        results = []
        poll = threading.Thread(target=lambda: results.append(
            call_url(base, "getUpdates", {"timeout": 10})))
        poll.start()
        time.sleep(0.3)
        status, answer = control(base, "push_message", chat_id=42, text="/start")
        assert status == 200 and isinstance(answer["result"], int)
        poll.join(10)
        assert results[0]["result"][0]["message"]["text"] == "/start"
        assert control(base, "update", update_id=answer["result"])[1]["result"]["message"][
            "chat"]["id"] == 42
        # inject a fault; read a chat's record
        assert control(base, "inject", fault="error", status=503)[0] == 200
        assert call_url(base, "sendMessage", {"chat_id": 42, "text": "a"})["error_code"] == 503
        assert call_url(base, "sendMessage", {"chat_id": 42, "text": "b"})["ok"]
        record = control(base, "messages", chat_id=42)[1]["result"]
        assert [(m["chat_id"], m["message_id"], m["text"]) for m in record] == [("42", 2, "b")]
        assert control(base, "stats")[1]["result"]["injected_error"] == 1
        # migrate a group; reset
        assert control(base, "migrate_chat", chat_id=-77)[1]["result"] == -1000000000077
        assert call_url(base, "sendMessage", {"chat_id": -77, "text": "x"})["parameters"] == {
            "migrate_to_chat_id": -1000000000077}
        assert control(base, "reset")[0] == 200
        assert control(base, "all_messages")[1]["result"] == []
        # mistakes are answered, not fatal
        assert control(base, "explode")[0] == 404
        assert control(base, "inject", fault="nonsense")[0] == 400
        assert control(base, "messages", nonsense=1)[0] == 400
        assert call_url(base, "getMe")["ok"]
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def call_url(base, method, params=None):
    conn = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=15)
    try:
        conn.request("POST", "/bot1:x/" + method, body=json.dumps(params or {}).encode(),
                     headers={"Content-Type": "application/json"})
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()
