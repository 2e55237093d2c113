"""The fake platform servers against hostile and clumsy clients: bodies framed
by ``Content-Length`` or ``Transfer-Encoding: chunked`` under one size limit,
a bounded request head, one deadline per request (not per read), a bound on
connections (and so threads), and a control endpoint that a web page open in
a browser cannot drive (cross-site requests, DNS rebinding).

Every test talks to a real server over real sockets; the timing ones use
sub-second deadlines and check what the server recorded or answered, not how
long something took.
"""

import http.client
import json
import socket
import threading
import time

import pytest

from fastdispatch.testing import FakeDiscordServer, FakeTelegramServer


def raw(server, data, *, read=True, timeout=5.0):
    """Send ``data`` on a fresh connection; the whole answer (until closed or
    timeout) as bytes."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    try:
        sock.sendall(data)
        if not read:
            return b""
        return recv_all(sock)
    finally:
        sock.close()


def recv_all(sock):
    chunks = []
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except (socket.timeout, ConnectionResetError):
        pass
    return b"".join(chunks)


def status_of(answer):
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def chunked(body, size=7):
    out = b""
    for i in range(0, len(body), size):
        part = body[i:i + size]
        out += b"%x\r\n%s\r\n" % (len(part), part)
    return out + b"0\r\n\r\n"


def post_head(path, extra=b""):
    return (b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n" + extra)


@pytest.fixture(scope="module")
def server():
    with FakeTelegramServer(max_body=4096, max_header=2048, request_timeout=0.5,
                            idle_timeout=5.0, max_connections=8, control=True) as s:
        yield s


@pytest.fixture(autouse=True)
def clean(server):
    server.reset()


# -- bodies ---------------------------------------------------------------------------

def test_a_chunked_body_is_read_and_the_keep_alive_connection_stays_usable(server):
    body = json.dumps({"chat_id": 5, "text": "chunked"}).encode()
    request = post_head(b"/bot1:x/sendMessage", b"Transfer-Encoding: chunked\r\n\r\n") \
        + chunked(body)
    plain = post_head(b"/bot1:x/sendMessage", b"Content-Length: %d\r\nConnection: close\r\n\r\n"
                      % len(b'{"chat_id":5,"text":"after"}')) + b'{"chat_id":5,"text":"after"}'
    answer = raw(server, request + plain)  # two requests on one connection
    assert answer.count(b"HTTP/1.1 200 OK") == 2
    assert [m.text for m in server.messages(5)] == ["chunked", "after"]


def test_a_chunked_body_over_the_limit_is_413_and_the_connection_closed(server):
    big = json.dumps({"chat_id": 5, "text": "x" * 5000}).encode()
    answer = raw(server, post_head(b"/bot1:x/sendMessage", b"Transfer-Encoding: chunked\r\n\r\n")
                 + chunked(big, 1000))
    assert status_of(answer) == 413 and b"Connection: close" in answer
    assert server.messages(5) == []


def test_a_declared_body_over_the_limit_is_refused_unread(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        sock.sendall(post_head(b"/bot1:x/sendMessage", b"Content-Length: 100000000\r\n\r\n"))
        answer = recv_all(sock)  # answered before any of the body was sent
    finally:
        sock.close()
    assert status_of(answer) == 413


@pytest.mark.parametrize("framing", [
    b"Content-Length: 12\r\nTransfer-Encoding: chunked\r\n",   # both: smuggling
    b"Content-Length: \xc2\xb2\r\n",                             # not ASCII digits
    b"Content-Length: +12\r\n",
    b"Content-Length: 12\r\nContent-Length: 13\r\n",
    b"Transfer-Encoding: gzip, chunked\r\n",
])
def test_ambiguous_or_malformed_framing_is_400_and_closes(server, framing):
    answer = raw(server, post_head(b"/bot1:x/getMe", framing + b"\r\n") + b"{}" + b"x" * 10)
    assert status_of(answer) == 400 and b"Connection: close" in answer


def test_a_malformed_chunk_is_400(server):
    answer = raw(server, post_head(b"/bot1:x/getMe", b"Transfer-Encoding: chunked\r\n\r\n")
                 + b"zz\r\n{}\r\n0\r\n\r\n")
    assert status_of(answer) == 400


# -- heads ------------------------------------------------------------------------------

def test_a_request_head_over_the_limit_is_431(server):
    answer = raw(server, b"GET /bot1:x/getMe HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 + b"X-Pad: " + b"a" * 4000 + b"\r\n\r\n")
    assert status_of(answer) == 431
    endless = raw(server, b"GET /" + b"a" * 10000)  # no end of line at all
    assert status_of(endless) == 431
    assert server.stats()["status_431"] == 2


# -- slow clients: one deadline per request ----------------------------------------------

def test_a_client_dripping_its_head_is_cut_off_at_the_request_deadline(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sent, answer = 0, b""
    try:
        sock.sendall(b"GET /bot1:x/getMe HTTP/1.1\r\n")
        # each header line well within any per-read timeout, for 3 s in all
        for i in range(30):
            time.sleep(0.1)
            try:
                sock.sendall(b"X-Slow-%d: 1\r\n" % i)
                sent += 1
            except OSError:
                break
        answer = recv_all(sock)
    finally:
        sock.close()
    assert status_of(answer) == 408
    assert sent < 30  # the server closed the connection mid-drip
    assert server.stats()["status_408"] == 1


def test_a_client_that_never_sends_its_body_is_cut_off(server):
    answer = raw(server, post_head(b"/bot1:x/sendMessage", b"Content-Length: 50\r\n\r\n{"))
    assert answer == b"" or status_of(answer) in (408, None)
    assert server.messages(5) == []
    assert call(server, "getMe")[0] == 200


# -- many clients ------------------------------------------------------------------------

def test_many_idle_connections_cannot_keep_a_client_out(server):
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5)
            for _ in range(3 * server.max_connections)]
    try:
        # every one of them is served or refused, none blocks the next client
        for _ in range(3):
            assert call(server, "getMe")[0] == 200
        stats = server.stats()
        assert stats.get("evicted_connections", 0) + stats.get("refused_connections", 0) \
            >= 2 * server.max_connections
    finally:
        for sock in idle:
            sock.close()


def test_busy_connections_are_bounded_and_the_excess_is_answered_503(server):
    # max_connections slow requests hold every thread; one more client is
    # refused at once (503, or a reset if its request came after the close)
    # instead of queueing without end
    server.inject("delay", server.max_connections, method="getMe", seconds=2.0)
    held = [threading.Thread(target=call, args=(server, "getMe"))
            for _ in range(server.max_connections)]
    for t in held:
        t.start()
    deadline = time.monotonic() + 5
    while server.stats().get("requests", 0) < server.max_connections and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        status, _ = call(server, "sendMessage", {"chat_id": 8, "text": "over"})
        assert status in (503, None)
    finally:
        for t in held:
            t.join(10)
    assert server.stats()["refused_connections"] == 1
    assert server.messages(8) == []
    assert call(server, "getMe")[0] == 200


def test_many_huge_and_slow_clients_at_once_leave_the_server_answering(server):
    stop = threading.Event()

    def huge():
        while not stop.is_set():
            try:
                raw(server, post_head(b"/bot1:x/sendMessage", b"Content-Length: 999999\r\n\r\n")
                    + b"x" * 8192, timeout=2)
            except OSError:
                pass

    def slow():
        while not stop.is_set():
            try:
                raw(server, b"GET /bot1:x/getMe HTTP/1.1\r\n", timeout=2)
            except OSError:
                pass

    threads = [threading.Thread(target=f) for f in (huge, huge, slow, slow, slow)]
    for t in threads:
        t.start()
    answered = []
    try:
        for i in range(20):
            status, answer = call(server, "sendMessage", {"chat_id": 9, "text": str(i)})
            if status == 200:
                answered.append(str(i))
            else:
                assert status in (503, None), answer  # the bound, said at once
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert len(answered) >= 15
    assert [m.text for m in server.messages(9)] == answered  # nothing else got through


# -- the control endpoint ------------------------------------------------------------------

def control(server, action, body=b"{}", headers=None):
    sent = {"Content-Type": "application/json"}
    sent.update(headers or {})
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request("POST", "/control/" + action, body=body, headers=sent)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_the_control_endpoint_obeys_a_local_json_request(server):
    status, answer = control(server, "push_message", json.dumps(
        {"chat_id": 3, "text": "hi"}).encode())
    assert status == 200 and answer["ok"]
    assert server.pending_updates() == 1


@pytest.mark.parametrize("headers, status", [
    ({"Content-Type": "text/plain"}, 415),                      # a browser's simple request
    ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
    ({"Content-Type": "multipart/form-data; boundary=x"}, 415),
    ({"Content-Type": ""}, 415),
    ({"Origin": "http://evil.example"}, 403),                    # cross-site
    ({"Origin": "null"}, 403),
    ({"Sec-Fetch-Site": "cross-site"}, 403),
    ({"Host": "evil.example:%(port)d"}, 403),                   # DNS rebinding
    ({"Host": "127.0.0.1:1"}, 403),
])
def test_the_control_endpoint_refuses_what_a_web_page_could_send(server, headers, status):
    headers = {k: v % {"port": server.port} if "%" in v else v for k, v in headers.items()}
    got, answer = control(server, "push_message",
                          json.dumps({"chat_id": 3, "text": "evil"}).encode(), headers)
    assert got == status and not answer["ok"]
    assert server.pending_updates() == 0


def test_the_control_endpoint_accepts_its_own_origin_and_localhost(server):
    port = server.port
    assert control(server, "stats", headers={"Origin": "http://127.0.0.1:%d" % port})[0] == 200
    assert control(server, "stats", headers={"Host": "localhost:%d" % port})[0] == 200


def test_the_discord_fake_has_the_same_guards():
    with FakeDiscordServer(control=True, max_body=1024, request_timeout=0.5) as discord:
        assert control(discord, "public_key")[0] == 200
        assert control(discord, "public_key", headers={"Content-Type": "text/plain"})[0] == 415
        answer = raw(discord, b"POST /api/v10/channels/1/messages HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bot t\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + chunked(b'{"content": "hi"}'))
        assert status_of(answer) == 200
        assert [m.content for m in discord.messages("1")] == ["hi"]


def call(server, method, params=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("POST", "/bot1:x/" + method, body=json.dumps(params or {}).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (ConnectionError, http.client.HTTPException) as exc:
        return None, repr(exc).encode()
    finally:
        conn.close()


def test_an_http_method_the_server_does_not_serve_is_501(server):
    answer = raw(server, b"BREW /bot1:x/getMe HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert status_of(answer) == 501
