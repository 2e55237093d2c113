"""A Discord echo bot over HTTP interactions: signed commands in, replies out
as follow-ups, paced by the limits Discord announces.

Run against Discord (needs ``pip install 'fastdispatch[discord]'``, an
application with a ``/echo`` slash command that has a string option, and
this server reachable over HTTPS at the application's Interactions Endpoint
URL):

    DISCORD_BOT_TOKEN=... DISCORD_PUBLIC_KEY=<hex> python examples/discord_echo_bot.py

It serves on port 8080 (``PORT``) until Ctrl-C.  Without
``DISCORD_BOT_TOKEN`` the same bot runs against a local
``FakeDiscordServer`` (on 127.0.0.1, with Discord's limits): the fake signs
and POSTs 30 ``/echo`` commands in three channels, the script prints what
each channel received and exits with status 0 only if every reply arrived,
in order.
"""

import os
import sys
import threading
import time
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from fastdispatch import Engine, OutboundDispatcher, Pacing, RetryPolicy, rules
from fastdispatch.discord import DiscordSender, interactions_app


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def make_engine():
    # The bot-wide 50/s; each channel's limit is learned from the answers.
    engine = Engine(OutboundDispatcher(max_inflight=32, pacing=Pacing.discord(),
                                       retry=RetryPolicy()))

    @engine.on(rules.on_command("echo"), block=True)
    def echo(ctx):
        ctx.reply_text(ctx.ext.get(rules.Command).args or "(nothing to echo)")

    return engine


def serve(app, port):
    httpd = make_server("0.0.0.0" if port else "127.0.0.1", port, app,
                        server_class=ThreadingWSGIServer, handler_class=QuietHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def run_real(token, public_key):
    engine = make_engine()
    sender = DiscordSender(token)
    httpd = serve(interactions_app(engine, sender, public_key=public_key),
                  int(os.environ.get("PORT", "8080")))
    print("serving interactions on port %d; Ctrl-C to stop" % httpd.server_port)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    httpd.shutdown()
    engine.shutdown(timeout=30)
    return 0


def run_local():
    from fastdispatch.testing import FakeDiscordServer

    with FakeDiscordServer() as server, \
            DiscordSender("local-token", base_url=server.api_url) as sender:
        engine = make_engine()
        httpd = serve(interactions_app(engine, sender, public_key=server.public_key), 0)
        url = "http://127.0.0.1:%d/interactions" % httpd.server_port
        channels = ["1001", "1002", "1003"]
        for i in range(10):
            for channel in channels:
                status, answer = server.post_interaction(
                    url, server.make_interaction(channel, "echo", text="message %d" % i))
                assert (status, answer) == (200, {"type": 5}), (status, answer)
        deadline = time.monotonic() + 60
        while len(server.all_messages()) < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        httpd.shutdown()
        engine.shutdown(timeout=10)
        ok = True
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
