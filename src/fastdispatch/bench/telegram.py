"""Bench section ``telegram``: TelegramSender on fastdispatch against a user's
naive alternative, over real HTTP to a FakeTelegramServer in another process.

Contenders (the same messages to the same server, in the same run):

- ``fastdispatch``  ``OutboundDispatcher(max_inflight=32)`` submitting
                    ``TelegramSender.send`` (one keep-alive urllib3 pool of 32
                    connections), per-chat order kept;
- ``naive``         what a user writes first: ``requests.post(url, json=...)``
                    per message from a ``ThreadPoolExecutor(32)``: a new
                    connection per message and no per-chat order at all.

The server runs in its own process (``python -m fastdispatch.testing``), so
the client CPU measured here (``time.process_time()`` of this process, user +
system, divided by the messages) is the client's alone.  Figures are ratios
within one run; each contender runs ``rounds`` times (alternating) and the
median is kept.

The paced run sends through a server enforcing Telegram's limits scaled down
(``SPEEDUP``) with the dispatcher's ``Pacing`` set to the same limits, and
compares the wall time with the least time the limits allow (a sliding
window of ``count`` starts per ``per`` seconds lets ``n`` starts finish no
sooner than ``((n - 1) // count) * per``).

It also reports how many requests per second the FakeTelegramServer serves
(another process, 16 client threads, one keep-alive connection each), so
that the tests and the demo know it is not their bottleneck.

``python -m fastdispatch bench --section telegram`` runs this section alone;
the suite's ``bench_telegram`` runs the same workloads under pytest-benchmark.
It needs the ``telegram`` extra (urllib3) and, for the naive baseline,
``requests``; without them the section says what is missing.
"""

import json
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

MESSAGES, CHATS, INFLIGHT = 3000, 300, 32
SPEEDUP = 10.0
PACED_MESSAGES, PACED_CHATS = 1200, 120
TOKEN = "123456:bench"

TITLE = ("Telegram over HTTP (FakeTelegramServer in another process; "
         "ratios within this run)")

TARGETS = (
    # label, key, op, bound
    ("sends/s: fastdispatch / naive requests.post pool", "throughput_ratio", ">=", 2.0),
    ("client CPU per send: naive / fastdispatch", "cpu_ratio", ">=", 2.0),
    ("paced wall time / limit-imposed minimum", "paced_ratio", "<=", 1.1),
)


def _cpu():
    return time.process_time()  # user + system CPU of this process, every thread


def start_server(*args):
    """A FakeTelegramServer in a subprocess; returns (process, base_url)."""
    proc = subprocess.Popen([sys.executable, "-m", "fastdispatch.testing", *args],
                            stdout=subprocess.PIPE, text=True)
    base = proc.stdout.readline().strip()
    if not base.startswith("http://127.0.0.1:"):
        proc.kill()
        raise RuntimeError("the FakeTelegramServer subprocess did not start")
    return proc, base


def stop_server(proc):
    """Stop it; returns its final counters."""
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}


def _plan(messages, chats):
    return [(str(10000 + i % chats), "m%d" % (i // chats)) for i in range(messages)]


def run_fastdispatch(base, messages=MESSAGES, chats=CHATS, inflight=INFLIGHT, pacing=None,
                     retry=None):
    from .. import OutboundDispatcher
    from ..platform import ChatInfo, SendRequest, TextMessage
    from ..telegram import TelegramSender

    sender = TelegramSender(TOKEN, base_url=base, pool_size=inflight)
    sender.get_me()  # one connection up, as for the other contender's import
    d = OutboundDispatcher(max_inflight=inflight, queue_size=messages, pacing=pacing,
                           retry=retry)
    requests_ = [SendRequest(ChatInfo(c), TextMessage(t)) for c, t in _plan(messages, chats)]
    cpu0, t0 = _cpu(), time.perf_counter()
    futures = [d.submit(r.target.id, lambda sc, r=r: sender.send(sc, r)) for r in requests_]
    d.shutdown()
    wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
    sender.close()
    failed = sum(1 for f in futures if f.exception() is not None)
    return {"wall": wall, "cpu": cpu, "n": messages, "failed": failed}


def run_naive(base, messages=MESSAGES, chats=CHATS, threads=INFLIGHT):
    import requests

    url = "%s/bot%s/sendMessage" % (base, TOKEN)
    requests.post("%s/bot%s/getMe" % (base, TOKEN), json={}, timeout=10)

    def send(chat, text):
        r = requests.post(url, json={"chat_id": chat, "text": text}, timeout=30)
        return r.json()["ok"]

    plan = _plan(messages, chats)
    cpu0, t0 = _cpu(), time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(send, c, t) for c, t in plan]
    wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
    failed = sum(1 for f in futures if f.exception() is not None or not f.result())
    return {"wall": wall, "cpu": cpu, "n": messages, "failed": failed}


def min_time(n, count, per):
    return ((n - 1) // count) * per if n > 0 else 0.0


def run_paced(messages=PACED_MESSAGES, chats=PACED_CHATS, speedup=SPEEDUP):
    """Paced run against a server with Telegram's limits / speedup (its
    windows shortened by a fifth for the jitter between a paced start and the
    request's arrival; see docs/telegram.md)."""
    from .. import Pacing, RateLimit, RetryPolicy

    per = 1.0 / speedup
    chat_limit, global_limit = RateLimit(1, per=per), RateLimit(30, per=per)
    proc, base = start_server("--chat-limit", "1/%r" % per, "--global-limit", "30/%r" % per,
                              "--tolerance", repr(0.2 * per), "--exact-retry-after")
    try:
        res = run_fastdispatch(base, messages, chats, INFLIGHT,
                               pacing=Pacing(global_limit=global_limit, chat_limit=chat_limit),
                               retry=RetryPolicy(max_attempts=10))
    finally:
        stats = stop_server(proc)
    bound = max(min_time(messages, 30, per), min_time(-(-messages // chats), 1, per))
    res.update(bound=bound, too_many=stats.get("too_many", 0))
    return res


def server_rate(requests_total=6000, threads=16):
    """Requests/s the FakeTelegramServer (another process) serves."""
    import urllib3

    proc, base = start_server()
    try:
        pool = urllib3.connection_from_url(base, maxsize=threads, block=True, retries=False)
        per_thread = requests_total // threads
        body = b'{"chat_id": 1, "text": "x"}'
        headers = {"Content-Type": "application/json"}

        def worker():
            for _ in range(per_thread):
                pool.urlopen("POST", "/bot1:x/sendMessage", body=body, headers=headers)

        ts = [threading.Thread(target=worker) for _ in range(threads)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return per_thread * threads / (time.perf_counter() - t0)
    finally:
        stop_server(proc)


def measure(rounds=3, progress=None):
    """Run everything; returns a dict of figures (medians) and ratios."""
    say = progress or (lambda msg: None)
    results = {"fastdispatch": [], "naive": []}
    proc, base = start_server()
    try:
        for r in range(rounds):
            order = ("fastdispatch", "naive") if r % 2 == 0 else ("naive", "fastdispatch")
            for name in order:
                say("telegram: %s round %d/%d" % (name, r + 1, rounds))
                run = run_fastdispatch if name == "fastdispatch" else run_naive
                results[name].append(run(base))
    finally:
        stop_server(proc)
    figures = {}
    for name, runs in results.items():
        figures[name] = {
            "sends_per_s": statistics.median(x["n"] / x["wall"] for x in runs),
            "cpu_us": statistics.median(x["cpu"] / x["n"] * 1e6 for x in runs),
            "failed": sum(x["failed"] for x in runs),
        }
    runs = []
    for r in range(rounds):
        say("telegram: paced run %d/%d" % (r + 1, rounds))
        runs.append(run_paced())
    runs.sort(key=lambda x: x["wall"] / x["bound"])
    paced = runs[len(runs) // 2]
    say("telegram: FakeTelegramServer requests/s")
    figures["paced"] = paced
    figures["server_rate"] = server_rate()
    figures["throughput_ratio"] = (figures["fastdispatch"]["sends_per_s"]
                                   / figures["naive"]["sends_per_s"])
    figures["cpu_ratio"] = figures["naive"]["cpu_us"] / figures["fastdispatch"]["cpu_us"]
    figures["paced_ratio"] = paced["wall"] / paced["bound"]
    return figures


def missing_dependencies():
    """What this section needs and cannot import (empty when all is there)."""
    missing = []
    for name in ("urllib3", "requests"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    return missing


def run(quick, progress):
    """The section's rows: (measure, ours, baseline, ratio, target, verdict)."""
    missing = missing_dependencies()
    if missing:
        return [("skipped: needs %s (pip install 'fastdispatch[telegram]' requests)"
                 % " and ".join(missing), "", "", "", "", "")]
    f = measure(1 if quick else 3, progress)
    fd, naive, paced = f["fastdispatch"], f["naive"], f["paced"]
    values = {
        "throughput_ratio": ("%.0f/s" % fd["sends_per_s"], "%.0f/s" % naive["sends_per_s"]),
        "cpu_ratio": ("%.0f us" % fd["cpu_us"], "%.0f us" % naive["cpu_us"]),
        "paced_ratio": ("%.2f s" % paced["wall"], "%.2f s" % paced["bound"]),
    }
    rows = []
    for label, key, op, bound in TARGETS:
        ours, base = values[key]
        value = f[key]
        ok = value >= bound if op == ">=" else value <= bound
        rows.append((label, ours, base, "%.2f" % value, "%s %g" % (op, bound),
                     "met" if ok else "MISSED"))
    rows.append(("429s met in the paced run (retried in order)", "%d" % paced["too_many"],
                 "", "", "", "(info)"))
    rows.append(("FakeTelegramServer requests/s (16 threads, keep-alive)",
                 "%.0f/s" % f["server_rate"], "", "", "", "(info)"))
    failed = fd["failed"] + naive["failed"] + paced["failed"]
    if failed:
        rows.append(("sends that failed (should be 0)", "%d" % failed, "", "", "", "MISSED"))
    return rows
