"""``Pacing.telegram()``'s windows: Telegram's limits plus the margin that
the time between a send's start (where the dispatcher counts it) and its
arrival (where Telegram counts it) needs, scaled by ``speedup`` as
``telegram_limits`` scales the fake server's; and its arguments checked at
the call.  Whether the margin is enough is measured where it matters, in a
flood through each plug-in (``python -m fastdispatch bench flood``), not in
a timed test.
"""

import math

import pytest

from fastdispatch import ChatInfo, Pacing, RateLimit
from fastdispatch.testing import telegram_limits


def same(limit, count, per):
    return limit.count == count and limit.per == pytest.approx(per)


@pytest.mark.parametrize("speedup", [1, 10, 2.5])
def test_each_window_is_the_servers_plus_the_margin(speedup):
    server = telegram_limits(speedup)
    p = Pacing.telegram(speedup=speedup)
    margin = p.chat_limit.per - server["chat_limit"].per
    assert margin == pytest.approx(0.05)
    assert same(p.chat_limit, 1, server["chat_limit"].per + margin)
    # Bot-wide: 15 per half of the server's window (never 31 in one window).
    assert same(p.global_limit, 15, server["global_limit"].per / 2 + margin)
    assert same(p.limit_for(-100123), 20, server["group_limit"].per + margin)
    assert p.limit_for(ChatInfo("g", is_group=True)) == p.limit_for(-1)
    assert p.limit_for(42) is None


def test_margin_zero_is_exactly_the_servers_limits():
    server = telegram_limits(10)
    p = Pacing.telegram(speedup=10, margin=0)
    assert (p.chat_limit, p.limit_for(-5)) == (server["chat_limit"], server["group_limit"])
    assert same(p.global_limit, 15, server["global_limit"].per / 2)


def test_broadcast_raises_the_bot_wide_limit_only():
    p = Pacing.telegram(broadcast=1000, speedup=2, margin=0.0)
    assert p.global_limit == RateLimit(1000, per=0.5)
    assert p.chat_limit == RateLimit(1, per=0.5)


@pytest.mark.parametrize("value, error", [
    (True, TypeError), (False, TypeError), (2.5, TypeError), ("30", TypeError),
    (0, ValueError), (-1, ValueError), (10 ** 7, ValueError)])
def test_a_bad_broadcast_is_refused_by_name(value, error):
    with pytest.raises(error, match="broadcast"):
        Pacing.telegram(broadcast=value)


@pytest.mark.parametrize("value, error", [
    (0, ValueError), (-2, ValueError), (math.inf, ValueError), (math.nan, ValueError),
    (True, TypeError), ("10", TypeError), (None, TypeError)])
def test_a_bad_speedup_is_refused_by_name(value, error):
    with pytest.raises(error, match="speedup"):
        Pacing.telegram(speedup=value)


@pytest.mark.parametrize("value, error", [
    (-0.01, ValueError), (math.inf, ValueError), (True, TypeError), ("0.1", TypeError)])
def test_a_bad_margin_is_refused_by_name(value, error):
    with pytest.raises(error, match="margin"):
        Pacing.telegram(margin=value)
