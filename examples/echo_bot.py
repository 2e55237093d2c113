"""A threaded echo bot: events arrive on several threads, replies keep per-chat order.

Run:  python examples/echo_bot.py

Four "connection" threads feed events for 24 chats into one Engine.  The
handlers reply through the engine's dispatcher to a fake, in-process platform
that takes a little while per send (like a real API) and checks, for every
chat, that replies arrive in the order the events were handled and that two
sends to one chat never overlap.  The script prints a short summary (events
handled, and why the others were not) and exits with status 0 only if every
check held.
"""

import random
import sys
import threading
import time

from fastdispatch import ChatInfo, Engine, Event, OutboundDispatcher, SenderInfo, SendResult, rules

THREADS = 4
CHATS_PER_THREAD = 6
EVENTS_PER_CHAT = 60


class FakePlatform:
    """Stands in for a chat platform's API.

    Every reply ends with ``#<n>``, the number of the event it answers; per
    chat these must arrive strictly increasing.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._last = {}  # chat id -> number of the last reply delivered
        self._busy = set()  # chats with a send in progress
        self.delivered = 0
        self.most_at_once = 0
        self.problems = []

    def send(self, sc, request):
        chat = request.target.id
        number = int(request.message.text.rsplit("#", 1)[1])
        with self._lock:
            if chat in self._busy:
                self.problems.append(f"{chat}: two sends at once")
            self._busy.add(chat)
            self.most_at_once = max(self.most_at_once, len(self._busy))
        time.sleep(random.uniform(0.0, 0.002))  # the network round trip
        with self._lock:
            self._busy.discard(chat)
            if number <= self._last.get(chat, -1):
                self.problems.append(f"{chat}: reply #{number} after #{self._last[chat]}")
            self._last[chat] = number
            self.delivered += 1
        return SendResult(message_id=f"{chat}/{number}")


def build_engine(replies):
    """The bot: three commands and a greeting."""
    engine = Engine(OutboundDispatcher(max_inflight=16, queue_size=EVENTS_PER_CHAT))

    def reply(ctx, text):
        replies.append(ctx.reply_text(text))

    @engine.on(rules.on_command("echo"), block=True)
    def echo(ctx):
        reply(ctx, ctx.ext.get(rules.Command).args)

    @engine.on(rules.on_command("stats"), rules.on_cooldown(60, key="chat"), block=True)
    def stats(ctx):
        # At most once a minute per chat; a refused /stats spends nothing.
        number = ctx.message_content.rsplit("#", 1)[1]
        reply(ctx, f"{ctx.event.chat.name}: all good #{number}")

    @engine.on(rules.on_keyword("hello", "hi "), priority=1, block=True)
    def greet(ctx):
        reply(ctx, f"hello, {ctx.event.sender.display_name}! {ctx.message_content}")

    return engine


def connection(engine, platform, chats, handled, unhandled, seed):
    """One platform connection: delivers its chats' events in order.

    Every event that no handler took is noted in ``unhandled`` with the
    reason: a chat message that matches no rule, or a ``/stats`` refused by
    its cooldown (the first ``/stats`` of each chat is answered, the others
    within the minute are not).
    """
    rng = random.Random(seed)
    texts = ["/echo {}", "hello bot {}", "/stats {}", "just chatting {}", "hi there {}"]
    for n in range(EVENTS_PER_CHAT):
        for chat in chats:
            user = SenderInfo(f"{chat.id}-user{n % 3}", display_name=f"user{n % 3}")
            text = rng.choice(texts).format(f"#{n}")
            event = Event("fake", chat, user, text=text, message_id=f"{chat.id}/{n}")
            ran = engine.process_event(event, platform)
            handled.extend(ran)
            if not ran:
                unhandled.append(STATS_COOLDOWN if text.startswith("/stats") else NO_RULE)


NO_RULE = 'matched no rule ("just chatting")'
STATS_COOLDOWN = "/stats refused by its cooldown (one per chat per minute)"


def main():
    platform = FakePlatform()
    replies, handled, unhandled = [], [], []
    engine = build_engine(replies)
    threads = []
    for t in range(THREADS):
        chats = [ChatInfo(f"chat-{t}-{c}", is_group=c % 2 == 1, name=f"chat {t}.{c}")
                 for c in range(CHATS_PER_THREAD)]
        threads.append(threading.Thread(target=connection,
                                        args=(engine, platform, chats, handled, unhandled, t)))
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    finished = engine.shutdown(timeout=60)
    elapsed = time.perf_counter() - started

    failed = [f for f in replies if not f.done() or f.exception() is not None]
    events = THREADS * CHATS_PER_THREAD * EVENTS_PER_CHAT
    why = ", ".join(f"{unhandled.count(reason)} {reason}" for reason in (NO_RULE, STATS_COOLDOWN))
    print(f"events:  {events} from {THREADS} threads across "
          f"{THREADS * CHATS_PER_THREAD} chats: {len(handled)} handled, {len(unhandled)} not")
    print(f"         ({why})")
    print(f"replies: {platform.delivered} delivered, {len(failed)} failed, "
          f"at most {platform.most_at_once} sends at once, {elapsed:.2f}s")
    ok = (finished and not failed and not platform.problems
          and platform.delivered == len(handled) and len(handled) + len(unhandled) == events)
    for problem in platform.problems[:10]:
        print("  " + problem)
    print("per-chat order: " + ("held" if ok else "BROKEN"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
