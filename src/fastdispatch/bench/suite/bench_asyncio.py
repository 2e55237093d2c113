"""asubmit against the asyncio code users write, in pytest-benchmark.

Run:  python -m pytest --pyargs fastdispatch.bench.suite.bench_asyncio --benchmark-only

The contenders and the workload are those of ``python -m fastdispatch bench
--section asyncio`` (:mod:`fastdispatch.bench.asyncio`): 1,000 chats x 10
coroutine tasks (``await asyncio.sleep(0)``), one ``gather``, at
max_inflight 100 and 1,000.  Each round is one fresh event loop running the
whole workload (wall time, not CPU: pytest-benchmark's timer).  The ratio to
read is median(contender) / median(``lock+semaphore``) within a group:
``lock+semaphore`` is the asyncio floor (``FLOOR``), the per-chat
``asyncio.Lock`` + global ``asyncio.Semaphore`` code users write by hand.
"""

import asyncio

import pytest

from fastdispatch.bench.asyncio import CONTENDERS

CHATS, PER_CHAT = 1000, 10


@pytest.mark.parametrize("max_inflight", [100, 1000])
@pytest.mark.parametrize("name", list(CONTENDERS))
def test_asyncio_contender(benchmark, name, max_inflight):
    benchmark.group = "asyncio: %d chats x %d, max_inflight %d" % (CHATS, PER_CHAT, max_inflight)
    jobs = [i % CHATS for i in range(CHATS * PER_CHAT)]
    contender = CONTENDERS[name]
    benchmark.pedantic(lambda: asyncio.run(contender(jobs, max_inflight, None)),
                       rounds=7, warmup_rounds=1)
