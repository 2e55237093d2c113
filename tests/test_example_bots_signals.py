"""The framework example bots, stopped by SIGTERM or SIGINT with replies still
queued, exit 0 and lose no reply; started again, they answer what is left.

``examples/ptb_bot.py``, ``examples/aiogram_bot.py`` and
``examples/telebot_bot.py`` each run in a subprocess on their real-token
path (``TELEGRAM_BOT_TOKEN`` and ``TELEGRAM_API_URL``, as a user runs them
against a self-hosted Bot API server), here pointed at a FakeTelegramServer
in this process that enforces Telegram's limits (``telegram_limits``, 20
times faster).  On that path the bots pace at Telegram's real speed
(``Pacing.telegram()``, which the examples take from no setting: one reply a
second in a private chat), so a backlog of 10 private chats x 8 messages and
a group x 20 takes them about 8 s.  When the server has recorded 40 replies
and every update has been fetched, 60 replies are still queued in the bot
(at one a second per chat, for seconds: no race with the signal), and the
signal comes then.  Right after it each private chat sends one more message,
as users do while a bot restarts, which the stopping bot may or may not have
fetched; once it has exited each sends another, which only a second process
can answer.  The first process must exit 0; a second one, started on the
same server, must answer what is left, confirm it, and exit 0 on SIGTERM.

What "no reply lost, none twice" means with ``getUpdates``: Telegram forgets
an update only when a later ``getUpdates`` asks from an offset above its id
(a confirmation); until then it hands the update again to whoever asks.  So
when the first process has exited, the updates the server still holds
(``pending_updates()``: those from the last confirmed offset on, the last
ones pushed) are the only ones a second process is given, and the only ones
that may be answered twice: once by the first process (it fetched and
answered the update and exited before confirming it) and once by the
second.  The checks, on the server's record split at the first process's
exit:

- every update the first process confirmed was answered by it exactly once,
  and never again (a confirmed update without its reply is lost for good);
- every update the server still held then (and every one pushed after) was
  answered by the second process exactly once, and by the first at most
  once;
- in each chat, the first replies to its updates follow the order of its
  updates, and so does each process's own sequence of replies.  Not for
  pyTelegramBotAPI: the threaded ``TeleBot`` runs one chat's handlers on
  several threads at once, so its replies keep the order the handlers made
  them in (``examples/telebot_bot.py`` says so), which need not be the
  updates'; its chats are checked for every reply, none twice.

No late message goes to the group: a group that got 20 messages within a
minute may get no other for up to a minute (Telegram's limit, which the bots
keep), longer than the examples' 30 s drain deadline, so whether it is
answered in time would depend on which process the update reached.
"""

import os
import pathlib
import signal
import sys
import time

import pytest

from fastdispatch.testing import FakeTelegramServer, telegram_limits

from helpers import Process, library, wait_until

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
BOTS = {"ptb_bot": "ptb", "aiogram_bot": "aiogram", "telebot_bot": "telebot"}
IN_UPDATE_ORDER = {"ptb_bot", "aiogram_bot"}  # see the module's docstring
TOKEN = "123456:ABC-signals"
PRIVATE, PER_CHAT = range(1, 11), 8
GROUP, IN_GROUP, MEMBER = -4200, 20, 77
CHATS = list(PRIVATE) + [GROUP]
BEFORE_SIGNAL = 40  # replies recorded when the signal comes (of 100)


@pytest.fixture
def bots():
    made = []

    def start(name, server):
        env = dict(os.environ, TELEGRAM_BOT_TOKEN=TOKEN, TELEGRAM_API_URL=server.base_url)
        made.append(Process([sys.executable, str(EXAMPLES / (name + ".py"))], env))
        return made[-1]

    yield start
    for bot in made:
        bot.close()


class Updates(list):
    """The messages pushed, in order: (chat, text); the texts are "u<n>"."""

    def push(self, server, chat):
        text = "u%d" % len(self)
        server.push_message(chat, text, user_id=MEMBER if chat < 0 else None)
        self.append((chat, text))
        return text

    def of(self, chat):
        return [text for c, text in self if c == chat]


def answered(server, chat):
    """The texts of the updates that the replies in ``chat`` answer, in arrival order."""
    return [m.text[len("echo: "):] for m in server.messages(chat)]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("name", list(BOTS))
def test_an_example_bot_stopped_mid_backlog_loses_no_reply_and_a_restart_answers_the_rest(
        bots, name, signum):
    library(BOTS[name])
    if not EXAMPLES.exists():
        pytest.skip("examples/ is not part of this copy of the tests")
    updates = Updates()
    with FakeTelegramServer(**telegram_limits(20)) as server:
        for _ in range(PER_CHAT):
            for chat in PRIVATE:
                updates.push(server, chat)
        for _ in range(IN_GROUP):
            updates.push(server, GROUP)
        backlog = len(updates)
        sent = lambda: server.stats().get("sent", 0)  # noqa: E731
        first = bots(name, server)
        wait_until(lambda: server.pending_updates() == 0 and sent() >= BEFORE_SIGNAL,
                   timeout=90, what="every update fetched and %d replies" % BEFORE_SIGNAL,
                   interval=0.01)
        before = sent()
        first.signal(signum)
        signalled = time.monotonic()
        for chat in PRIVATE:
            updates.push(server, chat)
        code = first.wait(60)
        took = time.monotonic() - signalled
        held = server.pending_updates()
        # The server holds the updates from the last confirmed offset on: the last pushed.
        for_second = {text for _, text in updates[len(updates) - held:]}
        by_first = {chat: answered(server, chat) for chat in CHATS}
        assert before <= backlog - 40, "the signal must come with replies queued: %d" % before
        assert code == 0, first.log
        lost = [text for chat in CHATS for text in updates.of(chat)
                if text not in by_first[chat] and text not in for_second]
        assert not lost, "confirmed to Telegram, never answered: %s\n%s" % (lost, first.log)
        for chat in PRIVATE:
            for_second.add(updates.push(server, chat))
        second = bots(name, server)
        every = {text for _, text in updates}
        wait_until(lambda: server.pending_updates() == 0 and every <= {
            m.text[len("echo: "):] for m in server.all_messages()},
            timeout=90, what="every update answered and confirmed", interval=0.05)
        second.signal(signal.SIGTERM)
        signalled = time.monotonic()
        second_code = second.wait(60)
        second_took = time.monotonic() - signalled
        left = server.pending_updates()
        by_second = {chat: answered(server, chat)[len(by_first[chat]):] for chat in CHATS}
    twice = sum(len(by_first[chat]) + len(by_second[chat]) - len(updates.of(chat))
                for chat in CHATS)
    print("\n%s %s: %d replies before the signal; exit %d after %.1f s with %d replies, "
          "%d updates unconfirmed; the restart sent %d replies, exit %d after %.1f s; "
          "%d answered twice" % (name, signum.name, before, code, took,
                                 sum(map(len, by_first.values())), held,
                                 sum(map(len, by_second.values())), second_code, second_took,
                                 twice))
    assert second_code == 0 and left == 0, second.log
    for chat in CHATS:
        mine, one, two = updates.of(chat), by_first[chat], by_second[chat]
        for text in mine:
            if text in for_second:
                assert two.count(text) == 1 and one.count(text) <= 1, (chat, text, one, two)
            else:
                assert one.count(text) == 1 and text not in two, (chat, text, one, two)
        assert set(one + two) <= set(mine), (chat, one, two)
        if name in IN_UPDATE_ORDER:
            order = mine.index
            assert one == sorted(one, key=order) and two == sorted(two, key=order), (one, two)
            assert list(dict.fromkeys(one + two)) == mine, (chat, one, two)
