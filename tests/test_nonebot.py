"""fastdispatch.integrations.nonebot with the real NoneBot2 and its OneBot v11
adapter, against FakeOneBotServer on 127.0.0.1: the example bot
(examples/nonebot_bot.py) in a child process, 20 groups, two replies to each
message, limits scaled to a quarter (Pacing.onebot()'s windows x 0.25, the
fake's the same): every reply arrives, in the order the bot made them, never
two at once in a group, none refused; a risk-control failure of one group
leaves the others going; SIGTERM mid-backlog loses nothing.

NoneBot2 and its adapters come with the test extra on 3.10 to 3.14, and must
be there: a missing install fails.  They are skipped where the extra's
markers leave them out, and on a free-threaded CPython where they are not
installed: the OneBot adapter needs msgpack, which has no free-threaded
wheel for 3.13 (``tools/dev.sh freethreaded`` leaves them out there)."""

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig

import pytest

if not (3, 10) <= sys.version_info[:2] < (3, 15):
    pytest.skip("NoneBot2 is not installed on Python %d.%d by the test extra"
                % sys.version_info[:2], allow_module_level=True)
if sysconfig.get_config_var("Py_GIL_DISABLED") and (
        importlib.util.find_spec("nonebot") is None
        or importlib.util.find_spec("nonebot.adapters.onebot") is None):
    pytest.skip("NoneBot2 or its OneBot adapter is not installed: on free-threaded "
                "CPython the adapter's msgpack may have no wheel (tools/dev.sh "
                "freethreaded leaves them out there)", allow_module_level=True)

import nonebot.adapters.onebot.v11  # noqa: E402,F401  (must be there: fails if not)
import websockets  # noqa: E402,F401

from fastdispatch.integrations.nonebot import _rate_limit_wait, call_chat  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "nonebot_bot.py")


def _run(*args, timeout=600):
    # 200 ms of the 250 ms windows for the trip: a paced call runs when the
    # bot's event loop gets to it, which on a machine with a load average of
    # 14 on two cores was 150 ms late for 2 of 119 replies in one run of
    # five (a bot without the line still bursts past it: the test below).
    proc = subprocess.run([sys.executable, EXAMPLE, "--scale", "0.25", "--messages", "3",
                           "--tolerance", "0.2", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in os.environ.items() if k != "ONEBOT_WS_URLS"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stdout + proc.stderr
    return proc.returncode, json.loads(lines[-1]), proc


def test_every_reply_in_order_paced_and_one_group_failing():
    """20 groups x 3 messages x 2 replies, group 3's first reply refused by
    risk control."""
    code, result, proc = _run("--risk-control-group", "3")
    assert result["groups_wrong"] == 0 and result["replies"] == result["expected"] == 119
    assert result["concurrent"] == 0 and result["limit_refusals"] == 0
    assert "ActionFailed" in proc.stdout + proc.stderr  # reached the handler as NoneBot's own
    assert code == 0, proc.stdout + proc.stderr[-3000:]


def test_sigterm_mid_backlog_loses_nothing():
    """SIGTERM once 30 of 120 replies arrived: the shutdown sends the rest.
    This run checks the drain, not the pacing: the fake's windows are shrunk
    to nothing (tolerance = the window), because NoneBot's own shutdown
    stalled its event loop for ~200 ms in one run of six here, which made
    two paced calls run late and reach the fake together."""
    code, result, proc = _run("--sigterm-after", "30", "--tolerance", "0.25")
    assert result["sent_at_sigterm"] < result["expected"]
    assert result["replies"] == result["expected"] == 120 and result["groups_wrong"] == 0
    assert result["concurrent"] == 0 and result["bot_exit"] == 0
    assert code == 0, proc.stdout + proc.stderr[-3000:]


def test_the_same_bot_without_the_line_fails_the_check():
    code, result, proc = _run("--groups", "5", "--messages", "2", "--without-fastdispatch")
    assert code == 1 and result["limit_refusals"] > 0 and result["groups_wrong"] > 0


def test_called_before_the_adapters_says_so():
    script = ("import nonebot\n"
              "nonebot.init(driver='~none')\n"
              "from fastdispatch.integrations.nonebot import use_fastdispatch\n"
              "try:\n"
              "    use_fastdispatch()\n"
              "except RuntimeError as exc:\n"
              "    print('refused:', exc)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600)
    assert "refused:" in out.stdout and "register_adapter" in out.stdout, out.stderr


@pytest.mark.parametrize("adapter, api, data, chat", [
    ("OneBot V11", "send_msg", {"message_type": "group", "group_id": 1, "user_id": 2},
     ("group", 1)),
    ("OneBot V11", "get_login_info", {}, None),
    ("QQ", "post_group_messages", {"group_openid": "G"}, ("group", "G")),
    ("QQ", "post_c2c_messages", {"openid": "U"}, ("c2c", "U")),
    ("QQ", "post_messages", {"channel_id": "C"}, ("channel", "C")),
    ("QQ", "post_dms_messages", {"guild_id": "D"}, ("dms", "D")),
    ("QQ", "post_group_files", {"group_openid": "G"}, ("group", "G")),
    ("QQ", "get_guild", {"guild_id": "D"}, None),
    ("Telegram", "send_message", {"chat_id": "-100"}, -100),
    ("Discord", "create_message", {"channel_id": 5}, 5),
])
def test_call_chat(adapter, api, data, chat):
    assert call_chat(adapter, api, data) == chat


def test_rate_limit_answers():
    class RateLimitException(Exception):
        pass

    class ActionFailed(Exception):
        code = 22009

    class Flood(Exception):
        retry_after = 3

    assert _rate_limit_wait(RateLimitException()) == 1.0
    assert _rate_limit_wait(ActionFailed()) == 1.0
    assert _rate_limit_wait(Flood()) == 3.0
    assert _rate_limit_wait(ValueError()) is None


QQ_BOT = r'''
import asyncio, json, sys
import nonebot
base = sys.argv[1]
nonebot.init(driver="~httpx", qq_api_base=base + "/", qq_auth_base=base + "/app/getAppAccessToken")
from nonebot.adapters.qq import ActionFailed, Adapter, Bot
from nonebot.adapters.qq.config import BotInfo
nonebot.get_driver().register_adapter(Adapter)
if sys.argv[4] == "nested":  # an API whose call makes another call of its chat
    own_call_api = Adapter._call_api

    async def nested(self, bot, api, **data):
        if data.get("content") == "outer":
            await bot.call_api("post_messages", channel_id="CH", content="inner",
                               msg_id="guild-msg")
        return await own_call_api(self, bot, api, **data)
    Adapter._call_api = nested
from fastdispatch.integrations.nonebot import use_fastdispatch
use_fastdispatch(queue_size=int(sys.argv[3]))
bot = Bot(nonebot.get_adapter(Adapter), "1024", BotInfo(id="1024", secret="secret"))
ids = json.loads(sys.argv[2])

async def reply(chat, text, seq):
    try:
        await bot.post_group_messages(group_openid=chat, msg_type=0, content=text,
                                      msg_id=ids[chat], msg_seq=seq)
        return "ok"
    except ActionFailed as exc:
        return "%s %s" % (type(exc).__name__, exc.code)

async def post(text):
    await bot.post_messages(channel_id="CH", content=text, msg_id="guild-msg")
    return "ok"

async def main():
    if sys.argv[4] == "channel-flood":
        calls = [post("c%d" % i) for i in range(12)]
    elif sys.argv[4] == "nested":
        calls = [asyncio.wait_for(post("outer"), 30)]
    else:
        calls = [reply(chat, "%s%d" % (chat.lower(), i), i + 1)
                 for i in range(2) for chat in ("A", "B", "C")]
    print(json.dumps(await asyncio.gather(*calls, return_exceptions=True), default=repr))

asyncio.run(main())
'''


def test_qq_adapter_22009_pauses_only_its_chat_and_errors_stay_nonebots():
    pytest.importorskip("nonebot.adapters.qq")
    pytest.importorskip("httpx")
    from fastdispatch.testing import FakeQQServer
    with FakeQQServer("1024", "secret") as fake:
        ids = {chat: fake.push_group_message(chat, "ping") for chat in "ABC"}
        fake.inject("too_many", chat=("group", "A"))
        fake.inject("error", chat=("group", "C"), status=400, code=11255)
        out = subprocess.run([sys.executable, "-c", QQ_BOT, fake.base_url, json.dumps(ids),
                              "64", "replies"], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr[-3000:]
        results = json.loads(out.stdout.strip().splitlines()[-1])
        # a0, b0, c0, a1, b1, c1: A's 22009 was waited out and sent again;
        # C's refusal reached the caller as the adapter's ActionFailed.
        assert results == ["ok", "ok", "ActionFailed 11255", "ok", "ok", "ok"]
        a = fake.messages(("group", "A"))
        b = fake.messages(("group", "B"))
        assert [m.text for m in a] == ["a0", "a1"] and [m.text for m in b] == ["b0", "b1"]
        assert b[-1].at < a[0].at  # B did not wait for A's pause
        assert fake.stats()["too_fast"] == 1


def test_a_full_chat_makes_the_handler_wait_never_queue_full():
    """12 calls at once to one channel with room for 1 waiting: every one is
    sent, in the order made; none raises QueueFull into the bot."""
    pytest.importorskip("nonebot.adapters.qq")
    from fastdispatch.testing import FakeQQServer
    with FakeQQServer("1024", "secret") as fake:
        out = subprocess.run([sys.executable, "-c", QQ_BOT, fake.base_url, "{}", "1",
                              "channel-flood"], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr[-3000:]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == ["ok"] * 12
        assert [m.text for m in fake.messages(("channel", "CH"))] == \
            ["c%d" % i for i in range(12)]


def test_a_call_made_inside_a_running_call_of_its_chat_is_sent_at_once():
    """An adapter API that makes another call of the same chat while it runs:
    queued behind itself it would wait forever; it is made inline."""
    pytest.importorskip("nonebot.adapters.qq")
    from fastdispatch.testing import FakeQQServer
    with FakeQQServer("1024", "secret") as fake:
        out = subprocess.run([sys.executable, "-c", QQ_BOT, fake.base_url, "{}", "64",
                              "nested"], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr[-3000:]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == ["ok"]
        assert [m.text for m in fake.messages(("channel", "CH"))] == ["inner", "outer"]
