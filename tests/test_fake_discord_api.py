"""FakeDiscordServer's REST routes over plain HTTP: every route a REST bot uses
announces its bucket in the ``X-RateLimit-*`` headers, and answers its errors
as Discord does (unknown message, a bulk delete of the wrong size, an
interaction acknowledged twice, an unknown route)."""

import http.client
import json

import pytest

from fastdispatch.testing import FakeDiscordServer

CHANNEL = "1234"


@pytest.fixture(scope="module")
def server():
    with FakeDiscordServer("tok", channel_limit=(100, 60.0)) as s:
        yield s


@pytest.fixture(autouse=True)
def fresh(server):
    server.reset()


def call(server, method, path, body=None, auth=True):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = "Bot tok"
    try:
        conn.request(method, "/api/v10/" + path,
                     body=None if body is None else json.dumps(body).encode(), headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, (json.loads(data) if data else None), resp
    finally:
        conn.close()


def test_every_message_route_announces_its_bucket(server):
    status, message, _ = call(server, "POST", "channels/%s/messages" % CHANNEL,
                              {"content": "hi"})
    assert status == 200
    mid = message["id"]
    other = call(server, "POST", "channels/%s/messages" % CHANNEL, {"content": "2"})[1]["id"]
    routes = [("PATCH", "channels/%s/messages/%s" % (CHANNEL, mid), {"content": "edited"}, 200),
              ("GET", "channels/%s/messages/%s" % (CHANNEL, mid), None, 200),
              ("PUT", "channels/%s/messages/%s/reactions/%%F0%%9F%%91%%8D/@me" % (CHANNEL, mid),
               None, 204),
              ("DELETE", "channels/%s/messages/%s/reactions/%%F0%%9F%%91%%8D/@me"
               % (CHANNEL, mid), None, 204),
              ("POST", "channels/%s/typing" % CHANNEL, None, 204),
              ("POST", "channels/%s/messages/bulk-delete" % CHANNEL,
               {"messages": [mid, other, "999"]}, 204)]
    buckets = set()
    for method, path, body, expected in routes:
        status, _, resp = call(server, method, path, body)
        assert status == expected, (method, path)
        assert resp.getheader("X-RateLimit-Limit") == "100", (method, path)
        assert resp.getheader("X-RateLimit-Reset-After") is not None
        buckets.add(resp.getheader("X-RateLimit-Bucket"))
    assert len(buckets) == 5  # one per route (the two reaction routes share theirs)
    assert server.edits() == [(CHANNEL, mid, "edited")]
    assert sorted(server.deleted()) == sorted([(CHANNEL, mid), (CHANNEL, other)])


def test_discords_errors_for_the_new_routes(server):
    assert call(server, "PATCH", "channels/%s/messages/42" % CHANNEL,
                {"content": "x"})[1]["code"] == 10008
    status, answer, resp = call(server, "POST", "channels/%s/messages/bulk-delete" % CHANNEL,
                                {"messages": ["1"]})
    assert status == 400 and answer["code"] == 50035
    assert resp.getheader("X-RateLimit-Bucket")  # an error answer announces it too
    assert call(server, "GET", "users/@me", auth=False)[0] == 401
    assert call(server, "GET", "nothing/here")[0] == 404


def test_an_interaction_is_acknowledged_once_and_its_answer_edited(server):
    interaction = server.make_interaction(CHANNEL, "ask")
    callback = "interactions/%s/%s/callback" % (interaction["id"], interaction["token"])
    assert call(server, "POST", callback, {"type": 4, "data": {"content": "answer"}},
                auth=False)[0] == 204
    status, answer, _ = call(server, "POST", callback, {"type": 4, "data": {"content": "again"}},
                             auth=False)
    assert status == 400 and answer["message"] == "Interaction has already been acknowledged."
    original = "webhooks/%s/%s/messages/@original" % (server.application_id,
                                                      interaction["token"])
    status, edited, resp = call(server, "PATCH", original, {"content": "answer, edited"},
                                auth=False)
    assert status == 200 and edited["content"] == "answer, edited"
    assert resp.getheader("X-RateLimit-Bucket")
    assert [(m.kind, m.content) for m in server.messages(CHANNEL)] == [("response", "answer")]
    assert call(server, "DELETE", original, auth=False)[0] == 204
    assert call(server, "GET", original, auth=False)[0] == 404
    gateway = call(server, "GET", "gateway/bot")[1]
    assert gateway["shards"] == 1 and gateway["url"].startswith("wss://")


HOSTILE = [None, "", "x", -1, 10 ** 30, 1e308, True, [], {}, [1, "a"], {"a": [{}]}, "²" * 3000]


def test_no_body_makes_any_route_fail():
    # every route, hostile JSON in every field it reads: Discord's 4xx or a
    # result, never a 500 (an exception in the server); no limits, to see them all
    with FakeDiscordServer("tok", channel_limit=None, global_limit=None) as server:
        every_route_with_hostile_bodies(server)


def every_route_with_hostile_bodies(server):
    interaction = server.make_interaction(CHANNEL, "ask")
    mid = call(server, "POST", "channels/%s/messages" % CHANNEL, {"content": "t"})[1]["id"]
    app, token = server.application_id, interaction["token"]
    paths = [("POST", "channels/%s/messages" % CHANNEL), ("PATCH", "channels/%s/messages/%s"
                                                          % (CHANNEL, mid)),
             ("POST", "channels/%s/messages/bulk-delete" % CHANNEL),
             ("POST", "interactions/%s/%s/callback" % (interaction["id"], token)),
             ("POST", "webhooks/%s/%s" % (app, token)),
             ("PATCH", "webhooks/%s/%s/messages/@original" % (app, token))]
    for value in HOSTILE:
        for body in ({"content": value, "embeds": value, "messages": value, "type": value,
                      "data": value}, value):
            for method, path in paths:
                status = call(server, method, path, body)[0]
                assert status in (200, 204, 400, 403, 404), (method, path, body, status)
    assert server.stats().get("status_500", 0) == 0
