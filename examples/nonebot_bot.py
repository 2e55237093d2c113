"""A NoneBot2 bot on OneBot v11 whose every reply goes through fastdispatch.

The bot is NoneBot's own: the OneBot v11 adapter over a forward WebSocket,
one matcher that answers each group message with two replies, and the one
line ``use_fastdispatch()`` after the adapter is registered.

    ONEBOT_WS_URLS='["ws://127.0.0.1:3001"]' python examples/nonebot_bot.py --bot

runs it against your implementation (NapCat, Lagrange.OneBot, LLOneBot).
With no implementation configured it checks itself against a
FakeOneBotServer:

    python examples/nonebot_bot.py [--groups 20] [--messages 10] [--scale 1]
                                   [--sigterm-after N] [--risk-control-group G]

starts the fake (limits: ``Pacing.onebot()``'s, their windows multiplied by
``--scale``), runs the bot in a child process, pushes ``--messages``
messages into each of ``--groups`` groups, and exits 0 only if every
group's replies arrived, in order, never two at once in a group, and none
was refused by the fake's limits.  ``--sigterm-after N`` stops the bot with
SIGTERM once N replies arrived: its shutdown must still send every reply.
``--without-fastdispatch`` runs the same bot without the line, for
comparison.  ``--risk-control-group G`` makes the fake refuse group G's first reply
(``retcode`` 100): the bot logs NoneBot's ``ActionFailed`` and the other
groups go on.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time


def run_bot(scale, with_fastdispatch=True):
    """The bot (a child process when checked against the fake)."""
    import nonebot
    from nonebot import on_message
    from nonebot.adapters.onebot.v11 import ActionFailed, Adapter, Bot, GroupMessageEvent
    from nonebot.log import logger

    from fastdispatch import Pacing, RateLimit
    from fastdispatch.integrations.nonebot import use_fastdispatch

    nonebot.init(driver="~none+~websockets")
    nonebot.get_driver().register_adapter(Adapter)
    pacing = None
    if scale != 1.0:  # the fake's limits scaled down: the same pacing, scaled
        p = Pacing.onebot()
        pacing = {Adapter.get_name(): Pacing(
            global_limit=RateLimit(p.global_limit.count, per=p.global_limit.per * scale),
            chat_limit=RateLimit(p.chat_limit.count, per=p.chat_limit.per * scale))}
    if with_fastdispatch:
        # The one line.  drain_timeout: room for this example's whole backlog
        # (400 replies at Pacing.onebot()'s 2/s: 200 s) when it is stopped.
        use_fastdispatch(pacing=pacing, drain_timeout=300)

    @on_message().handle()
    async def reply(bot: Bot, event: GroupMessageEvent):
        text = event.get_plaintext()
        for suffix in ("a", "b"):
            try:
                await bot.send(event, "%s-%s" % (text, suffix))
            except ActionFailed as exc:
                logger.warning("reply %s-%s refused: %r" % (text, suffix, exc))

    nonebot.run()


def in_order(got, expected):
    """Every expected reply arrived once, in the order the bot made them:
    each message's first reply before its second, and the messages' first
    (and second) replies in the order the messages came (NoneBot runs each
    message's handler concurrently, so the first replies of later messages
    may come before the second of earlier ones)."""
    if sorted(got) != sorted(expected):
        return False
    for suffix in ("-a", "-b"):
        mine = [t for t in got if t.endswith(suffix)]
        if mine != [t for t in expected if t.endswith(suffix)]:
            return False
    return all(got.index(t[:-1] + "a") < got.index(t) for t in got
               if t.endswith("-b") and t[:-1] + "a" in got)


def check(args):
    """Run the bot against a FakeOneBotServer and check what arrived."""
    from fastdispatch import Pacing, RateLimit
    from fastdispatch.testing import FakeOneBotServer

    p = Pacing.onebot()
    limits = dict(chat_limit=RateLimit(p.chat_limit.count, per=p.chat_limit.per * args.scale),
                  global_limit=RateLimit(p.global_limit.count,
                                         per=p.global_limit.per * args.scale),
                  # 100 ms for a busy event loop: a paced call starts on
                  # time but runs when NoneBot's loop gets to it (measured:
                  # up to ~60 ms while it takes in a round of 20 messages).
                  tolerance=min(0.1, p.chat_limit.per * args.scale * 0.5)
                  if args.tolerance is None else args.tolerance)
    groups = [1000 + g for g in range(args.groups)]
    expected = {g: ["m%d-%s" % (i, s) for i in range(args.messages) for s in "ab"]
                for g in groups}
    stopped = False
    with FakeOneBotServer(**limits) as fake:
        env = dict(os.environ, ONEBOT_WS_URLS=json.dumps([fake.ws_url]),
                   LOG_LEVEL="WARNING")
        bot = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--bot",
                                "--scale", repr(args.scale)]
                               + (["--without-fastdispatch"] if args.without_fastdispatch
                                  else []), env=env)
        try:
            deadline = time.monotonic() + 300  # a loaded machine imports NoneBot slowly
            while fake.stats()["ws_connections"] == 0:
                if bot.poll() is not None or time.monotonic() > deadline:
                    print("the bot did not connect")
                    return 1
                time.sleep(0.05)
            # One message first: the bot's first reply pays NoneBot's
            # start-up costs, which would delay it past its paced start.
            # What it sent then is not counted (the record starts after it).
            fake.push_group_message(999, 42, "warm-up")
            while fake.stats().get("requests", 0) < 2:
                if bot.poll() is not None or time.monotonic() > deadline:
                    print("the bot did not answer")
                    return 1
                time.sleep(0.01)
            time.sleep(0.5)
            fake.reset()
            if args.risk_control_group is not None:
                fake.inject("error", chat=("group", groups[args.risk_control_group]),
                            retcode=100)
                expected[groups[args.risk_control_group]].remove("m0-a")
            for i in range(args.messages):  # a round of messages every 50 ms
                for g in groups:
                    fake.push_group_message(g, 42, "m%d" % i)
                time.sleep(0.05)
            total = sum(len(v) for v in expected.values())
            stopped, sent_at_signal = False, None
            # Wait while calls keep coming (a bot that stopped calling for 5 s
            # will not send the rest).
            seen, last_change = -1, time.monotonic()
            while fake.stats()["sent"] < total and time.monotonic() - last_change < 5:
                if fake.stats().get("requests", 0) != seen:
                    seen, last_change = fake.stats().get("requests", 0), time.monotonic()
                if args.sigterm_after is not None and not stopped and \
                        fake.stats()["sent"] >= args.sigterm_after:
                    bot.send_signal(signal.SIGTERM)
                    stopped, sent_at_signal = True, fake.stats()["sent"]
                if bot.poll() is not None:
                    break
                time.sleep(0.01)
        finally:
            if bot.poll() is None and not stopped:  # a second SIGTERM: NoneBot's force quit
                bot.send_signal(signal.SIGTERM)
            code = bot.wait(60)
        stats = fake.stats()
        got = {g: [m.text for m in fake.messages(("group", g))] for g in groups}
        wrong = {g: texts for g, texts in got.items() if not in_order(texts, expected[g])}
    print(json.dumps({"replies": stats["sent"], "expected": total,
                      "sent_at_sigterm": sent_at_signal,
                      "groups_wrong": len(wrong), "concurrent": stats["concurrent"],
                      "limit_refusals": stats["limit_refusals"], "bot_exit": code}))
    for g, got in list(wrong.items())[:3]:
        print("group %d: got %r" % (g, got[:12]))
    ok = not wrong and stats["concurrent"] == 0 and stats["limit_refusals"] == 0 \
        and code == 0
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bot", action="store_true",
                        help="run only the bot (ONEBOT_WS_URLS names the implementation)")
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply the limits' windows (0.05: twenty times faster)")
    parser.add_argument("--tolerance", type=float, default=None, metavar="SECONDS",
                        help="what the fake allows between a paced start and its arrival "
                             "(default: 0.1, at most half a window)")
    parser.add_argument("--sigterm-after", type=int, default=None, metavar="N")
    parser.add_argument("--risk-control-group", type=int, default=None, metavar="G")
    parser.add_argument("--without-fastdispatch", action="store_true",
                        help="the same bot without the line, for comparison")
    args = parser.parse_args()
    if args.bot or os.environ.get("ONEBOT_WS_URLS"):
        run_bot(args.scale, not args.without_fastdispatch)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
