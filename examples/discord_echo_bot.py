"""A Discord echo bot over HTTP interactions: signed commands in, replies out
as follow-ups, paced by the limits Discord announces.

Run against Discord (needs ``pip install 'fastdispatch[discord,webhook]'``,
an application with a ``/echo`` slash command that has a string option, and
this server reachable over HTTPS at the application's Interactions Endpoint
URL, e.g. through a proxy that terminates TLS):

    DISCORD_BOT_TOKEN=... DISCORD_PUBLIC_KEY=<hex> python examples/discord_echo_bot.py

It serves ``/interactions`` on port 8080 (``PORT``) of every network the
machine is on (Discord must reach it), ``/healthz`` and ``/metrics`` on
127.0.0.1:8081 only, until SIGTERM or Ctrl-C; then it drains the replies
and exits 0 if every one went out.  Without ``DISCORD_BOT_TOKEN`` the same
bot runs against a local ``FakeDiscordServer`` (on 127.0.0.1, with
Discord's limits): the fake signs and POSTs 30 ``/echo`` commands in three
channels, the script prints what each channel received and exits with
status 0 only if every reply arrived, in order.
"""

import os
import socket
import sys
import threading
import time

from fastdispatch import Engine, OutboundDispatcher, Pacing, RetryPolicy, rules
from fastdispatch.discord import DiscordSender, run_interactions


def make_engine():
    # The bot-wide 50/s; each channel's limit is learned from the answers.
    engine = Engine(OutboundDispatcher(max_inflight=32, pacing=Pacing.discord(),
                                       retry=RetryPolicy()))

    @engine.on(rules.on_command("echo"), block=True)
    def echo(ctx):
        ctx.reply_text(ctx.ext.get(rules.Command).args or "(nothing to echo)")

    return engine


def run_real(token, public_key):
    return run_interactions(make_engine(), DiscordSender(token), public_key=public_key,
                            listen="0.0.0.0", port=int(os.environ.get("PORT", "8080")),
                            health_port=8081)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_local():
    from fastdispatch.testing import FakeDiscordServer

    with FakeDiscordServer() as server, \
            DiscordSender("local-token", base_url=server.api_url) as sender:
        engine = make_engine()
        port, stop, codes = _free_port(), threading.Event(), []
        bot = threading.Thread(target=lambda: codes.append(run_interactions(
            engine, sender, public_key=server.public_key, port=port, stop=stop,
            drain_timeout=10)))
        bot.start()
        url = "http://127.0.0.1:%d/interactions" % port
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the server listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        channels = ["1001", "1002", "1003"]
        for i in range(10):
            for channel in channels:
                status, answer = server.post_interaction(
                    url, server.make_interaction(channel, "echo", text="message %d" % i))
                assert (status, answer) == (200, {"type": 5}), (status, answer)
        deadline = time.monotonic() + 60
        while len(server.all_messages()) < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        bot.join()
        ok = codes == [0]
        for channel in channels:
            got = [m.content for m in server.messages(channel)]
            print("channel %s: %s" % (channel, ", ".join(got)))
            ok = ok and got == ["message %d" % i for i in range(10)]
        print("429s met: %d (channel buckets: %d)" % (
            server.stats().get("too_many", 0), server.stats().get("too_many_channel", 0)))
        print("every reply arrived, in order" if ok else "MISSING OR OUT OF ORDER")
        return 0 if ok else 1


if __name__ == "__main__":
    token = os.environ.get("DISCORD_BOT_TOKEN")
    if token:
        sys.exit(run_real(token, os.environ["DISCORD_PUBLIC_KEY"]))
    sys.exit(run_local())
