"""FakeDiscordServer as the real REST clients see it: discord.py's ``Client``
(``login`` and the REST calls a bot makes without a gateway) and hikari's
``RESTApp``, both from the ``test`` extra, pointed at the fake: log in, send,
edit, type, react, upload, delete one and many, answer an interaction and edit
the answer, with the rate-limit headers honoured (no 429 met) and a 429 retried
after its ``retry_after``.

hikari supports Python 3.11+ (the extra's marker): on older Pythons its tests
are skipped; a library that should be installed and is not fails.
"""

import asyncio
import io
import sys

import pytest

from fastdispatch.testing import FakeDiscordServer

# discord.py imports audioop for voice, which 3.11-3.12 warn about
pytestmark = pytest.mark.filterwarnings("ignore:'audioop' is deprecated:DeprecationWarning")

CHANNEL = 1234567890123
TOKEN = "fake-discord-token"


def need_hikari():
    if sys.version_info < (3, 11):
        pytest.skip("hikari is not installed on Python < 3.11 by the test extra")
    import hikari  # noqa: F401 - should be there: an ImportError fails the test


@pytest.fixture
def server():
    # a small bucket, so that the headers decide when the clients may go on
    with FakeDiscordServer(TOKEN, channel_limit=(3, 0.3), global_limit=(50, 1.0)) as s:
        yield s


def run(coro):
    return asyncio.run(coro)


class DiscordPy:
    """discord.py's REST side: ``Client.login`` without connecting a gateway."""

    def __init__(self, server):
        import discord
        import discord.http

        self.discord, self.server = discord, server
        self.saved = discord.http.Route.BASE
        discord.http.Route.BASE = server.api_url

    async def __aenter__(self):
        self.client = self.discord.Client(intents=self.discord.Intents.none())
        await self.client.login(TOKEN)
        self.channel = self.client.get_partial_messageable(CHANNEL)
        return self

    async def __aexit__(self, *exc):
        await self.client.close()
        self.discord.http.Route.BASE = self.saved

    async def me(self):
        return self.client.user.id

    async def send(self, text):
        return (await self.channel.send(text)).id

    async def edit(self, message_id, text):
        message = self.channel.get_partial_message(message_id)
        return (await message.edit(content=text)).content

    async def typing(self):
        await self.channel.typing()

    async def react(self, message_id, emoji, add=True):
        message = self.channel.get_partial_message(message_id)
        if add:
            await message.add_reaction(emoji)
        else:
            await message.remove_reaction(emoji, self.client.user)

    async def upload(self, text, data, filename):
        message = await self.channel.send(text, file=self.discord.File(io.BytesIO(data),
                                                                       filename))
        return message.id, [(a.filename, a.size) for a in message.attachments]

    async def delete(self, message_id):
        await self.channel.get_partial_message(message_id).delete()

    async def delete_many(self, ids):
        await self.client.http.delete_messages(CHANNEL, ids)

    async def interaction(self, interaction):
        # discord.py answers interactions it received from the gateway; the
        # REST part of it is the webhook of the interaction's token
        webhook = self.discord.Webhook.partial(int(interaction["application_id"]),
                                               interaction["token"], client=self.client)
        followup = await webhook.send("follow-up", wait=True)
        edited = await webhook.edit_message(followup.id, content="follow-up, edited")
        return followup.id, edited.content


class Hikari:
    def __init__(self, server):
        import hikari

        self.hikari, self.server = hikari, server

    async def __aenter__(self):
        self.app = self.hikari.RESTApp(url=self.server.api_url)
        await self.app.start()
        self.acquired = self.app.acquire(TOKEN, self.hikari.TokenType.BOT)
        self.rest = await self.acquired.__aenter__()
        return self

    async def __aexit__(self, *exc):
        await self.acquired.__aexit__(*exc)
        await self.app.close()

    async def me(self):
        info = await self.rest.fetch_gateway_bot_info()
        assert info.shard_count == 1
        return int((await self.rest.fetch_my_user()).id)

    async def send(self, text):
        return int((await self.rest.create_message(CHANNEL, text)).id)

    async def edit(self, message_id, text):
        return (await self.rest.edit_message(CHANNEL, message_id, text)).content

    async def typing(self):
        await self.rest.trigger_typing(CHANNEL)

    async def react(self, message_id, emoji, add=True):
        if add:
            await self.rest.add_reaction(CHANNEL, message_id, emoji)
        else:
            await self.rest.delete_my_reaction(CHANNEL, message_id, emoji)

    async def upload(self, text, data, filename):
        message = await self.rest.create_message(CHANNEL, text,
                                                 attachment=self.hikari.Bytes(data, filename))
        return int(message.id), [(a.filename, a.size) for a in message.attachments]

    async def delete(self, message_id):
        await self.rest.delete_message(CHANNEL, message_id)

    async def delete_many(self, ids):
        await self.rest.delete_messages(CHANNEL, ids)

    async def interaction(self, interaction):
        hikari = self.hikari
        app, token = int(interaction["application_id"]), interaction["token"]
        await self.rest.create_interaction_response(
            int(interaction["id"]), token, hikari.ResponseType.MESSAGE_CREATE, "answer")
        original = await self.rest.edit_interaction_response(app, token, "answer, edited")
        assert original.content == "answer, edited"
        followup = await self.rest.execute_webhook(app, token, "follow-up")
        edited = await self.rest.edit_webhook_message(app, token, followup.id,
                                                      "follow-up, edited")
        return int(followup.id), edited.content


LIBRARIES = {"discord.py": DiscordPy, "hikari": Hikari}


def client(name, server):
    if name == "hikari":
        need_hikari()
    return LIBRARIES[name](server)


@pytest.mark.parametrize("name", list(LIBRARIES))
def test_the_client_logs_in_and_runs_a_rest_bot(name, server):
    async def bot():
        async with client(name, server) as c:
            assert await c.me() == int(server.application_id)
            first = await c.send("hello")
            assert await c.edit(first, "hello, edited") == "hello, edited"
            await c.typing()
            await c.react(first, "👍")
            await c.react(first, "🎉")
            await c.react(first, "👍", add=False)
            uploaded, attachments = await c.upload("a file", b"\x00\x01" * 500, "data.bin")
            assert attachments == [("data.bin", 1000)]
            second = await c.send("two")
            await c.delete_many([uploaded, second])
            await c.delete(first)
            return first, uploaded, second

    first, uploaded, second = run(bot())
    channel = str(CHANNEL)
    assert [m.content for m in server.messages(CHANNEL)] == ["hello", "a file", "two"]
    assert server.edits() == [(channel, str(first), "hello, edited")]
    assert server.reactions(CHANNEL, first) == ["🎉"]
    assert sorted(server.deleted()) == sorted(
        [(channel, str(uploaded)), (channel, str(second)), (channel, str(first))])
    assert [t[0] for t in server.typing()] == [channel]
    stats = server.stats()
    assert stats.get("too_many", 0) == 0 and stats.get("status_404", 0) == 0, stats


@pytest.mark.parametrize("name", list(LIBRARIES))
def test_the_client_honours_the_bucket_headers_and_retries_a_429(name, server):
    server.inject("too_many", retry_after=0.2)  # the first message meets a 429

    async def bot():
        async with client(name, server) as c:
            for i in range(8):  # the bucket holds 3 per 0.3 s
                await c.send("m%d" % i)

    run(bot())
    assert [m.content for m in server.messages(CHANNEL)] == ["m%d" % i for i in range(8)]
    stats = server.stats()
    # the injected one only: every later wait came from the headers
    assert stats["injected_too_many"] == 1 and stats.get("too_many", 0) == 0, stats


@pytest.mark.parametrize("name", list(LIBRARIES))
def test_an_interaction_is_answered_and_its_messages_edited(name, server):
    interaction = server.make_interaction(CHANNEL, "ask", text="why?")

    async def bot():
        async with client(name, server) as c:
            return await c.interaction(interaction)

    followup, content = run(bot())
    assert content == "follow-up, edited"
    messages = server.messages(CHANNEL)
    assert messages[-1].message_id == str(followup) and messages[-1].kind == "followup"
    assert (str(CHANNEL), str(followup), "follow-up, edited") in server.edits()
