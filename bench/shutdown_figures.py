"""What a bot loses when its process is stopped: SIGTERM and SIGKILL, measured.

    python bench/shutdown_figures.py [--python PATH] [--api run|poller]

An echo bot runs in a subprocess (``--python``: the interpreter whose
fastdispatch is measured) against a FakeTelegramServer in this process whose
answers take 200 ms (polling) or 50 ms (webhook), so replies queue up in the
bot's dispatcher (``max_inflight=4``: 5 s and 3.75 s of replies).  Three scenarios:

- **polling, SIGTERM**: 100 updates queued for ``getUpdates``; SIGTERM once
  10 replies have arrived; then a second bot process runs until every
  update is answered (or 20 s), and gets SIGTERM too.
- **polling, SIGKILL**: the same with SIGKILL for the first process.
- **webhook, SIGTERM**: 300 updates POSTed to the bot's webhook (each
  answered 200 before the signal), then SIGTERM.

Printed per scenario: updates answered (by the first process, and in all),
replies lost for good, duplicates, exit codes.  ``--api poller`` runs the
bot the way ``examples/telegram_echo_bot.py`` did before the run helpers
(TelegramPoller, ``engine.shutdown(30)`` on KeyboardInterrupt; the webhook
app behind waitress with 8 threads); ``--api run`` uses ``run_polling`` and
``run_webhook``.  docs/telegram.md quotes the figures.
"""

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

BOT = textwrap.dedent('''
    import os, sys, time
    from fastdispatch import Engine, OutboundDispatcher, RetryPolicy
    from fastdispatch.telegram import TelegramPoller, TelegramSender, webhook_app

    sender = TelegramSender("1:bench", base_url=os.environ["BASE_URL"])
    engine = Engine(OutboundDispatcher(max_inflight=4, queue_size=1000, retry=RetryPolicy()))

    @engine.on()
    def echo(ctx):
        ctx.reply_text("echo %s" % ctx.event.text)

    api, mode = sys.argv[1], sys.argv[2]
    if api == "run":
        from fastdispatch.telegram import run_polling, run_webhook
        if mode == "polling":
            sys.exit(run_polling(engine, sender, poll_timeout=1, drain_timeout=30))
        sys.exit(run_webhook(engine, sender, port=int(os.environ["PORT"]), url_path="/",
                             secret_token="bench", drain_timeout=30))
    if mode == "polling":   # the example before the run helpers: Ctrl-C only
        poller = TelegramPoller(sender, engine, poll_timeout=1).start()
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        finally:
            poller.stop(timeout=5)
            engine.shutdown(timeout=30)
        sys.exit(0)
    import waitress
    waitress.serve(webhook_app(engine, sender, secret_token="bench"), host="127.0.0.1",
                   port=int(os.environ["PORT"]), threads=8, _quiet=True)
''')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_bot(python, script, api, mode, server, port=None):
    env = dict(os.environ, BASE_URL=server.base_url, PORT=str(port or 0))
    env.pop("PYTHONPATH", None)
    return subprocess.Popen([python, script, api, mode], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def answered(server, n, first_id):
    """update numbers answered at least once, and duplicate replies."""
    counts = {}
    for m in server.all_messages():
        k = int(m.text.rsplit("#", 1)[1])
        counts[k] = counts.get(k, 0) + 1
    return len(counts), sum(c - 1 for c in counts.values())


def polling(python, script, api, sig):
    from fastdispatch.testing import FakeTelegramServer

    with FakeTelegramServer(latency=0.2) as server:
        for i in range(100):
            server.push_message(1 + i % 10, "m #%d" % i)
        bot = start_bot(python, script, api, "polling", server)
        deadline = time.monotonic() + 30
        while len(server.all_messages()) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        bot.send_signal(sig)
        try:
            out, _ = bot.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            bot.kill()
            out, _ = bot.communicate()
        first, _ = answered(server, 100, 0)
        code1 = bot.returncode
        bot = start_bot(python, script, api, "polling", server)
        time.sleep(3)  # past its start-up: the signal must find the handlers installed
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and answered(server, 100, 0)[0] < 100:
            time.sleep(0.2)
        time.sleep(0.5)
        bot.send_signal(signal.SIGTERM if api == "run" else signal.SIGINT)
        try:
            bot.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            bot.kill()
            bot.communicate()
        total, dups = answered(server, 100, 0)
    return {"first": first, "total": total, "lost": 100 - total, "duplicates": dups,
            "exit": code1, "exit2": bot.returncode}


def webhook(python, script, api):
    from fastdispatch.testing import FakeTelegramServer

    with FakeTelegramServer(latency=0.05) as server:
        port = free_port()
        bot = start_bot(python, script, api, "webhook", server, port)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        statuses = {}
        for i in range(300):
            body = json.dumps({"update_id": 1 + i, "message": {
                "message_id": i, "chat": {"id": 1 + i % 30, "type": "private"},
                "from": {"id": 1 + i % 30, "is_bot": False, "first_name": "A"},
                "text": "m #%d" % i}})
            conn.request("POST", "/", body=body, headers={
                "Content-Type": "application/json",
                "X-Telegram-Bot-Api-Secret-Token": "bench"})
            r = conn.getresponse()
            r.read()
            statuses[r.status] = statuses.get(r.status, 0) + 1
        conn.close()
        queued_at_signal = 300 - len(server.all_messages())
        bot.send_signal(signal.SIGTERM)
        try:
            bot.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            bot.kill()
            bot.communicate()
        total, dups = answered(server, 300, 0)
    return {"accepted": statuses.get(200, 0), "queued_at_signal": queued_at_signal,
            "total": total, "lost": 300 - total, "exit": bot.returncode}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--api", choices=("run", "poller"), default="run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "bot.py")
        with open(script, "w") as f:
            f.write(BOT)
        for name, sig in (("SIGTERM", signal.SIGTERM), ("SIGKILL", signal.SIGKILL)):
            r = polling(args.python, script, args.api, sig)
            print("polling, %s after 10 of 100 replies: %d answered by the first process "
                  "(exit %s); after a restart %d of 100 answered, %d never (duplicates %d; "
                  "second exit %s)" % (name, r["first"], r["exit"], r["total"], r["lost"],
                                       r["duplicates"], r["exit2"]), flush=True)
        r = webhook(args.python, script, args.api)
        print("webhook, SIGTERM after 300 updates answered 200 (%d accepted, %d replies still "
              "queued): %d replies arrived, %d lost, exit %s"
              % (r["accepted"], r["queued_at_signal"], r["total"], r["lost"], r["exit"]))


if __name__ == "__main__":
    main()
