"""fastdispatch's own hot paths, in CPU time: the module to compare two versions with.

Run (the recipe of docs/performance.md, "Did an upgrade make it slower?")::

    python -m pytest --pyargs fastdispatch.bench.suite.bench_compare --benchmark-save=before
    pip install 'fastdispatch==<the new version>'
    python -m pytest --pyargs fastdispatch.bench.suite.bench_compare \\
        --benchmark-compare --benchmark-compare-fail=min:15%

Only fastdispatch is measured here, so a failed comparison can only mean
fastdispatch changed: the baselines (``floor``, ``ThreadPoolExecutor``, the
naive dispatcher) stay in the other modules of the suite, reported beside
fastdispatch and never part of a ``--benchmark-compare-fail`` gate that uses
this module.

Three choices make one build compared with itself pass on a loaded machine
(another CPU-bound process on a two-core machine):

- **CPU time, not wall time.**  Every benchmark here is marked with
  ``timer=time.process_time``: the CPU time the whole process (the calling
  thread and the dispatcher's workers) spent on the round.  Time the
  process spent waiting for a core while something else ran is not counted;
  wall time counted it, and a busy neighbour doubled it.
- **The minimum, not the median.**  Load only ever adds time (cache misses
  after another process ran, a descheduled worker woken again); the fastest
  of many rounds is the one it disturbed least.  Compare ``min``.
- **Short rounds, many of them.**  A round is a few hundred calls (a few
  hundred microseconds of CPU, far above the timer's resolution, with a
  working set that stays in the CPU's caches), and each benchmark takes 100
  to 400 rounds: the more rounds, the likelier one ran undisturbed.

What is left out, and why: 10,000 ``submit`` calls end to end (each
Future's result read).  Its CPU time grows with the machine's load by
itself (the caller and eight workers hand Futures and the GIL to one
another, and every hand-off a busy scheduler delays costs more wake-ups):
one build against itself differed by 22 % with a CPU-bound process and a
compiler beside it.  Its parts are here (``submit`` to busy chats; the
workers' loop in the ``post`` end-to-end run), and the whole is in
``bench_dispatcher``, beside its baselines.

The whole module takes about 30 seconds.  Each benchmark's ``extra_info``
says how many operations a round performs (``ops_per_round``): divide to get
the CPU time per call.
"""

import time

import pytest

import fastdispatch
from fastdispatch.bench import scenarios
from fastdispatch.bench.contenders import compiled_core
from fastdispatch.engine import Engine
from fastdispatch.context import Context
from fastdispatch import rules

from .bench_context import DISPATCHER, EVENT, SENDER

# The installed build's own dispatcher (the compiled core where it is
# installed, else the pure-Python twin), as a user's program gets it.
IMPL = "fastdispatch" if compiled_core() else "fastdispatch-py"

# Calls per round of the submit-side benchmarks: a few hundred microseconds of
# work, whose objects stay in the CPU's caches.  2000 per round (what the
# ratio tables use) left a round's minimum 16 % apart between two runs of one
# build on a loaded machine, the neighbours evicting those objects; 250 per
# round, 400 rounds, kept the minimum steadier.
OPS = 250

cpu_time = pytest.mark.benchmark(timer=time.process_time, group="fastdispatch (CPU time)")


@pytest.fixture(autouse=True)
def _describe(benchmark):
    benchmark.extra_info["fastdispatch"] = fastdispatch.__version__
    benchmark.extra_info["core"] = fastdispatch.IMPLEMENTATION


def _scenario_rounds(benchmark, scenario, rounds, ops=None):
    if ops is not None:
        scenario.ops = ops      # fewer calls per round than the ratio tables use
    benchmark.extra_info["ops_per_round"] = scenario.ops
    try:
        benchmark.pedantic(scenario.run, setup=scenario.prepare, rounds=rounds,
                           warmup_rounds=3)
    finally:
        scenario.close()


@cpu_time
def test_post_to_a_busy_chat(benchmark):
    """``post`` to a chat whose worker is busy: queueing alone."""
    _scenario_rounds(benchmark, scenarios.SubmitToBusyChats(IMPL, post=True), 400, ops=OPS)


@cpu_time
def test_submit_to_a_busy_chat(benchmark):
    """``submit`` to a chat whose worker is busy: queueing plus a Future."""
    _scenario_rounds(benchmark, scenarios.SubmitToBusyChats(IMPL), 400, ops=OPS)


@cpu_time
def test_submit_to_64_queued_chats(benchmark):
    """``submit`` over 64 chats whose queues wait for a worker."""
    _scenario_rounds(benchmark, scenarios.SubmitToBusyChats(IMPL, chats=64), 400, ops=OPS)


@cpu_time
def test_end_to_end_post(benchmark):
    """2,000 no-op tasks posted over 200 chats, run by 8 workers, drained."""
    _scenario_rounds(benchmark, scenarios.EndToEnd(IMPL, tasks=2000, chats=200, post=True), 200)


def _calls(benchmark, fn, *args, iterations, rounds=100):
    benchmark.extra_info["ops_per_round"] = iterations
    benchmark.pedantic(fn, args, iterations=iterations, rounds=rounds, warmup_rounds=3)


@cpu_time
def test_context_create(benchmark):
    """``Context(event, sender=..., dispatcher=...)``, 2000 per round."""
    _calls(benchmark, lambda: Context(EVENT, sender=SENDER, dispatcher=DISPATCHER),
           iterations=2000)


@cpu_time
def test_engine_match_path(benchmark):
    """``Engine.process_event``: a fresh Context, one command rule, a reply (sent inline)."""
    engine = Engine(DISPATCHER)
    engine.on(rules.on_command("ping"))(lambda ctx: ctx.reply_text("pong"))
    _calls(benchmark, engine.process_event, EVENT, SENDER, iterations=500)
