"""TelegramSender on fastdispatch beside a user's naive alternative, over real HTTP.

Run:  python -m pytest --pyargs fastdispatch.bench.suite.bench_telegram --benchmark-only

The workloads live in ``fastdispatch.bench.telegram`` (shared with the bench
command's ``telegram`` section).  A FakeTelegramServer runs in another process, so the timings are
the client's.  Groups:

- ``telegram: 3000 sends to 300 chats``  ``fastdispatch`` (OutboundDispatcher,
  32 in flight, TelegramSender's keep-alive pool; per-chat order) against
  ``naive`` (``requests.post`` per message from ``ThreadPoolExecutor(32)``;
  no order, a connection per message).  Read the ratio of the medians.
- ``telegram: paced 1200 sends, limits / 10``  against a server enforcing
  Telegram's limits scaled down, with matching ``Pacing``;
  ``extra_info['ratio_to_minimum']`` is wall time / the least time the limits
  allow (target <= 1.1).
"""

import pytest

pytest.importorskip("urllib3")      # the telegram extra
pytest.importorskip("requests")     # the naive contender

from fastdispatch.bench import telegram as tg  # noqa: E402


@pytest.fixture(scope="module")
def server():
    proc, base = tg.start_server()
    yield base
    tg.stop_server(proc)


@pytest.mark.parametrize("contender", ["fastdispatch", "naive"])
def test_telegram_sends(benchmark, server, contender):
    benchmark.group = "telegram: %d sends to %d chats" % (tg.MESSAGES, tg.CHATS)
    benchmark.name = contender
    run = tg.run_fastdispatch if contender == "fastdispatch" else tg.run_naive
    cpu = []

    def once():
        result = run(server)
        assert result["failed"] == 0
        cpu.append(result["cpu"] / result["n"])

    benchmark.pedantic(once, rounds=3, warmup_rounds=1)
    benchmark.extra_info["client_cpu_us_per_send"] = round(1e6 * sorted(cpu)[len(cpu) // 2], 1)


def test_telegram_paced(benchmark):
    benchmark.group = "telegram: paced %d sends, limits / %g" % (tg.PACED_MESSAGES, tg.SPEEDUP)
    benchmark.name = "fastdispatch"
    ratios = []

    def once():
        result = tg.run_paced()
        assert result["failed"] == 0
        ratios.append(result["wall"] / result["bound"])

    benchmark.pedantic(once, rounds=3, warmup_rounds=0)
    benchmark.extra_info["ratio_to_minimum"] = round(sorted(ratios)[len(ratios) // 2], 3)
