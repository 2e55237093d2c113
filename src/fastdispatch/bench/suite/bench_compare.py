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
(another CPU-bound process on a two-core machine; the trials are in the
repository's ``bench/notes/bench-command.md``):

- **CPU time, not wall time.**  Each benchmark's marker sets its timer:
  ``time.thread_time`` (the calling thread's CPU time) where the work is
  the caller's (``post``, ``submit``, a Context, the match path), so that no
  other thread's moment of work falls into a round; ``time.process_time``
  (the whole process, workers included) for the end-to-end run.  Time spent
  waiting for a core while something else ran is not counted; wall time
  counted it, and a busy neighbour doubled it.
- **The minimum, not the median.**  Load only ever adds time (cache misses
  after another process ran, a descheduled worker woken again); the fastest
  of many rounds is the one it disturbed least.  Compare ``min``.
- **Enough work per round, and rounds spread over seconds.**  A round is
  thousands of calls (a few milliseconds of CPU), far above the timer's
  resolution, and each benchmark takes 200 to 1000 rounds, about two seconds
  of work: a neighbour's burst (on a machine whose two CPUs share one core,
  a busy sibling slows every instruction by half) rarely covers all of them,
  where a benchmark of a fraction of a second can run inside one burst.

What is left out, and why: 10,000 ``submit`` calls end to end (each
Future's result read).  Its CPU time grows with the machine's load by
itself (the caller and eight workers hand Futures and the GIL to one
another, and every hand-off a busy scheduler delays costs more wake-ups),
so one build against itself differs by more than the gate allows.  Its
parts are here (``submit`` to busy chats; the
workers' loop in the ``post`` end-to-end run), and the whole is in
``bench_dispatcher``, beside its baselines.

The whole module takes about a minute.  Each benchmark's ``extra_info``
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

GROUP = "fastdispatch (CPU time)"
# The calling thread's CPU time: where the work is in the calling thread
# (queueing, a Context, the match path), no other thread's can blur it.
thread_cpu = pytest.mark.benchmark(timer=time.thread_time, group=GROUP)
# The whole process's: the end-to-end run's work is on the worker threads.
process_cpu = pytest.mark.benchmark(timer=time.process_time, group=GROUP)


@pytest.fixture(autouse=True)
def _describe(benchmark):
    benchmark.extra_info["fastdispatch"] = fastdispatch.__version__
    benchmark.extra_info["core"] = fastdispatch.IMPLEMENTATION


def _scenario_rounds(benchmark, scenario, rounds):
    benchmark.extra_info["ops_per_round"] = scenario.ops
    try:
        benchmark.pedantic(scenario.run, setup=scenario.prepare, rounds=rounds,
                           warmup_rounds=3)
    finally:
        scenario.close()


@thread_cpu
def test_post_to_a_busy_chat(benchmark):
    """2000 ``post`` calls to a chat whose worker is busy: queueing alone."""
    _scenario_rounds(benchmark, scenarios.SubmitToBusyChats(IMPL, post=True), 1000)


@thread_cpu
def test_submit_to_a_busy_chat(benchmark):
    """2000 ``submit`` calls to a chat whose worker is busy: queueing plus a Future."""
    _scenario_rounds(benchmark, scenarios.SubmitToBusyChats(IMPL), 600)


@thread_cpu
def test_submit_to_64_queued_chats(benchmark):
    """2000 ``submit`` calls over 64 chats whose queues wait for a worker."""
    _scenario_rounds(benchmark, scenarios.SubmitToBusyChats(IMPL, chats=64), 600)


@process_cpu
def test_end_to_end_post(benchmark):
    """10,000 no-op tasks posted over 1000 chats, run by 8 workers, drained."""
    _scenario_rounds(benchmark, scenarios.EndToEnd(IMPL, post=True), 200)


def _calls(benchmark, fn, *args, iterations, rounds):
    benchmark.extra_info["ops_per_round"] = iterations
    benchmark.pedantic(fn, args, iterations=iterations, rounds=rounds, warmup_rounds=3)


@thread_cpu
def test_context_create(benchmark):
    """``Context(event, sender=..., dispatcher=...)``, 2000 per round."""
    _calls(benchmark, lambda: Context(EVENT, sender=SENDER, dispatcher=DISPATCHER),
           iterations=2000, rounds=1000)


@thread_cpu
def test_engine_match_path(benchmark):
    """``Engine.process_event``: a fresh Context, one command rule, a reply (sent inline)."""
    engine = Engine(DISPATCHER)
    engine.on(rules.on_command("ping"))(lambda ctx: ctx.reply_text("pong"))
    _calls(benchmark, engine.process_event, EVENT, SENDER, iterations=500, rounds=500)
