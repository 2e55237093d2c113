"""A bot process stopped by real signals loses no reply.

Each test runs ``tests/telegram_bot_process.py`` (or gunicorn with
``examples/gunicorn.conf.py``) in a subprocess against a FakeTelegramServer
in this process whose answers are slowed down, so replies are queued in the
bot when the signal comes.  Checked on the server's record: what arrived,
what Telegram still holds, what was delivered again.
"""

import os
import pathlib
import re
import signal
import subprocess
import sys
import urllib.request

import pytest

from fastdispatch.telegram import TelegramSender
from fastdispatch.testing import FakeTelegramServer

from helpers import Process, free_port, wait_until

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

HERE = pathlib.Path(__file__).resolve().parent
BOT = HERE / "telegram_bot_process.py"
GUNICORN_CONF = HERE.parent / "examples" / "gunicorn.conf.py"
TOKEN = "123:shutdown"


def bot_process(server, mode, **env):
    """One bot process (``helpers.Process``) of ``telegram_bot_process.py``
    in ``mode``, or gunicorn serving it."""
    full = dict(os.environ, BOT_BASE_URL=server.base_url,
                **{k: str(v) for k, v in env.items()})
    if mode == "gunicorn":
        cmd = [sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF), "--chdir",
               str(HERE), "telegram_bot_process:application"]
    else:
        cmd = [sys.executable, str(BOT), mode]
    return Process(cmd, full)


@pytest.fixture
def bots():
    made = []

    def make(server, mode, **env):
        bot = bot_process(server, mode, **env)
        made.append(bot)
        return bot

    yield make
    for bot in made:
        bot.close()


def metric(port, name):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return -1
    m = re.search(r"^%s (\d+)" % re.escape(name), text, re.M)
    return int(m.group(1)) if m else -1


def replies_per_update(server):
    """update text -> number of replies that arrived for it (first reply /0)."""
    counts = {}
    for m in server.all_messages():
        text, k = m.text.rsplit(" /", 1)
        if k == "0":
            counts[text] = counts.get(text, 0) + 1
    return counts


def dropped_in(log):
    m = re.search(r"(\d+) dropped at the", log)
    assert m, log
    return int(m.group(1))


# -- polling -------------------------------------------------------------------

def start_polling_bot(bots, server, updates, replies, drain):
    for i in range(updates):
        server.push_message(1 + i % 10, "u%d" % i)
    port = free_port()
    bot = bots(server, "polling", BOT_REPLIES=replies, BOT_DRAIN_TIMEOUT=drain,
               BOT_HEALTH_PORT=port)
    handled = 'fastdispatch_telegram_updates_total{outcome="handled"}'
    wait_until(lambda: metric(port, handled) == updates, what="the bot to handle every update")
    queued = metric(port, "fastdispatch_telegram_replies_pending")
    return bot, queued


def test_sigterm_lets_a_polling_bot_send_its_300_queued_replies_and_exit_0(bots):
    with FakeTelegramServer(latency=0.05) as server:
        bot, queued = start_polling_bot(bots, server, 100, 3, 60)
        bot.signal(signal.SIGTERM)
        code = bot.wait()
        arrived, left = len(server.all_messages()), server.pending_updates()
    assert queued >= 150, "the scenario needs replies queued at the signal: %d" % queued
    assert code == 0, bot.log
    assert arrived == 300 and left == 0  # every reply sent, every update confirmed
    assert dropped_in(bot.log) == 0


def test_a_polling_bot_past_its_deadline_exits_1_and_its_updates_come_again(bots):
    with FakeTelegramServer(latency=0.05) as server:
        bot, queued = start_polling_bot(bots, server, 100, 3, 0.5)
        bot.signal(signal.SIGTERM)
        code = bot.wait()
        dropped = dropped_in(bot.log)
        arrived = len(server.all_messages())
        left = server.pending_updates()
        # The next process answers what the first one dropped.
        second = bots(server, "polling", BOT_REPLIES=3)
        wait_until(lambda: len(replies_per_update(server)) == 100,
                   what="every update answered")
        second.signal(signal.SIGTERM)
        assert second.wait() == 0, second.log
    assert code == 1, bot.log
    assert dropped > 0 and arrived + dropped >= 300 and left > 0
    assert "updates left to Telegram to deliver again" in bot.log


def test_sigkill_then_restart_answers_every_update_at_least_once(bots):
    updates = 200
    with FakeTelegramServer(latency=0.05) as server:
        for i in range(updates):
            server.push_message(1 + i % 10, "u%d" % i)
        first = bots(server, "polling", BOT_REPLIES=1)
        wait_until(lambda: len(server.all_messages()) >= 40, what="replies before the kill")
        first.signal(signal.SIGKILL)
        first.wait()
        before = len(server.all_messages())
        second = bots(server, "polling", BOT_REPLIES=1)
        wait_until(lambda: len(replies_per_update(server)) == updates, what="every update")
        second.signal(signal.SIGTERM)
        assert second.wait() == 0, second.log
        counts = replies_per_update(server)
    duplicates = sum(n - 1 for n in counts.values())
    assert before < updates and set(counts) == {"u%d" % i for i in range(updates)}
    # At most one getUpdates window (limit=100) is handled a second time.
    assert duplicates <= 100, duplicates


# -- webhook: run_webhook and gunicorn -----------------------------------------------------

def start_webhook_bot(bots, server, mode, updates, drain, chats=15):
    """A webhook bot with ``updates`` accepted over ``chats`` chats.

    15 chats under Pacing.telegram() (1 reply/s each) need 20 s for 300
    replies: however slowly a loaded machine delivers the updates, most
    replies are still queued when they all have been accepted.
    """
    port = free_port()
    url = "http://127.0.0.1:%d/hook" % port
    if mode in ("gunicorn", "waitress"):
        if mode == "gunicorn":
            bot = bots(server, "gunicorn", BIND="127.0.0.1:%d" % port, DRAIN_TIMEOUT=drain)
        else:
            bot = bots(server, "waitress", BOT_PORT=port, BOT_DRAIN_TIMEOUT=drain)
        TelegramSender(TOKEN, base_url=server.base_url).call(
            "setWebhook", {"url": url, "secret_token": "s3cret"})
    else:
        bot = bots(server, "webhook", BOT_PORT=port, BOT_WEBHOOK_URL=url,
                   BOT_DRAIN_TIMEOUT=drain)
    for i in range(updates):
        server.push_message(1 + i % chats, "u%d" % i)
    wait_until(lambda: server.stats().get("webhook_delivered", 0) == updates,
               what="every update accepted (200)")
    return bot, port


def have(module):
    try:
        __import__(module)
    except ImportError:
        return False
    return True


WEBHOOK_MODES = ["webhook"] + [
    pytest.param(server, marks=pytest.mark.skipif(not have(server),
                                                  reason="%s is not installed" % server))
    for server in ("gunicorn", "waitress")]


@pytest.mark.parametrize("mode", WEBHOOK_MODES)
def test_sigterm_lets_a_webhook_bot_send_its_300_queued_replies_and_exit_0(bots, mode):
    with FakeTelegramServer(latency=0.05) as server:
        bot, _ = start_webhook_bot(bots, server, mode, 300, 60)
        queued = 300 - len(server.all_messages())
        bot.signal(signal.SIGTERM)
        code = bot.wait()
        arrived = len(server.all_messages())
    assert queued >= 150, "the scenario needs replies queued at the signal: %d" % queued
    assert code == 0, bot.log
    assert arrived == 300 and dropped_in(bot.log) == 0


@pytest.mark.parametrize("mode", WEBHOOK_MODES)
def test_a_webhook_bot_past_its_deadline_exits_non_zero_and_logs_the_count(bots, mode):
    with FakeTelegramServer(latency=0.05) as server:
        bot, _ = start_webhook_bot(bots, server, mode, 300, 0.5)
        bot.signal(signal.SIGTERM)
        code = bot.wait()
        arrived = len(server.all_messages())
    dropped = dropped_in(bot.log)
    assert code == 1, bot.log
    assert dropped > 0 and arrived < 300 and arrived + dropped >= 300


def test_updates_posted_during_a_shutdown_get_503_and_the_next_process_answers_them(bots):
    with FakeTelegramServer(latency=0.1) as server:
        server.webhooks.backoff = 0.2
        server.webhooks.max_backoff = 0.5
        first, port = start_webhook_bot(bots, server, "webhook", 60, 60)
        first.signal(signal.SIGTERM)
        wait_until(lambda: "stopping intake" in first.log, what="the drain to begin")
        late = {server.push_message(1 + i % 30, "u%d" % i) for i in range(60, 70)}
        wait_until(lambda: any(a.status == 503 for a in server.webhooks.attempts()),
                   what="a 503 during the drain")
        assert first.wait() == 0, first.log
        assert len(server.all_messages()) == 60  # the first process took none of the ten
        second = bots(server, "webhook", BOT_PORT=port, BOT_DRAIN_TIMEOUT=30)
        wait_until(lambda: len(replies_per_update(server)) == 70, what="every update answered")
        second.signal(signal.SIGTERM)
        assert second.wait() == 0, second.log
        counts = replies_per_update(server)
        refused = {a.update_id for a in server.webhooks.attempts() if a.status == 503}
    assert all(n == 1 for n in counts.values())  # none lost, none twice
    assert refused and refused <= late  # only the updates that came during the drain


def test_the_webhook_example_stops_cleanly_on_sigterm(tmp_path):
    script = HERE.parent / "examples" / "telegram_webhook_bot.py"
    if not script.exists():
        pytest.skip("examples/ is not part of this copy of the tests")
    with FakeTelegramServer() as server:
        port = free_port()
        env = dict(os.environ, TELEGRAM_BOT_TOKEN=TOKEN, TELEGRAM_API_URL=server.base_url,
                   WEBHOOK_URL="http://127.0.0.1:%d/telegram" % port, PORT=str(port))
        out = tmp_path / "out.txt"
        with open(out, "w") as f:
            proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=f,
                                    stderr=subprocess.STDOUT)
        try:
            server.push_message(5, "/echo over the hook")
            wait_until(lambda: len(server.messages(5)) == 1, what="the echo")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, out.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [m.text for m in server.messages(5)] == ["over the hook"]
    assert "shutdown: 1 updates handled" in out.read_text()
