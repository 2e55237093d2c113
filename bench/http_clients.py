"""Which HTTP client should TelegramSender use?  Measured, not guessed.

    python bench/http_clients.py [--requests 6000] [--threads 16]

Starts a FakeTelegramServer in a subprocess (so the server's CPU is not
counted against the client), then, for each candidate client, sends
``sendMessage`` calls from ``--threads`` threads over one shared keep-alive
pool and reports throughput and the client process's CPU time per request
(user + system, from ``time.process_time()``).  Every candidate is configured
the way TelegramSender needs it: one pool shared by all threads, no retries
inside the client, a timeout per request, JSON in and out.  The candidates
run in turn, twice each, in alternating order; the better of the two runs is
reported.  The numbers in docs/telegram.md come from this script.
"""

import argparse
import json
import platform
import subprocess
import sys
import threading
import time


def _cpu():
    return time.process_time()  # user + system CPU of this process, every thread


def make_urllib3(base, threads):
    import urllib3

    pool = urllib3.PoolManager(maxsize=threads, block=True, retries=False)

    def call(path, payload):
        r = pool.request("POST", base + path, body=json.dumps(payload).encode(),
                         headers={"Content-Type": "application/json"},
                         timeout=urllib3.Timeout(connect=5.0, read=10.0), retries=False)
        return json.loads(r.data)
    return call, pool.clear


def make_httpx(base, threads):
    import httpx

    client = httpx.Client(limits=httpx.Limits(max_connections=threads,
                                              max_keepalive_connections=threads),
                          timeout=httpx.Timeout(10.0, connect=5.0))

    def call(path, payload):
        r = client.post(base + path, content=json.dumps(payload).encode(),
                        headers={"Content-Type": "application/json"})
        return json.loads(r.content)
    return call, client.close


def make_requests(base, threads):
    import requests
    from requests.adapters import HTTPAdapter

    session = requests.Session()
    adapter = HTTPAdapter(pool_connections=1, pool_maxsize=threads, max_retries=0,
                          pool_block=True)
    session.mount("http://", adapter)

    def call(path, payload):
        r = session.post(base + path, data=json.dumps(payload).encode(),
                         headers={"Content-Type": "application/json"}, timeout=(5.0, 10.0))
        return json.loads(r.content)
    return call, session.close


CLIENTS = {"urllib3": make_urllib3, "httpx": make_httpx, "requests": make_requests}


def run_one(name, base, requests_total, threads):
    call, close = CLIENTS[name](base, threads)
    per_thread = requests_total // threads
    errors = []

    def worker(index):
        try:
            for i in range(per_thread):
                answer = call("/bot1:x/sendMessage", {"chat_id": index * 100000 + i,
                                                       "text": "m%d" % i})
                if not answer.get("ok"):
                    errors.append(answer)
        except Exception as exc:  # reported below
            errors.append(exc)

    call("/bot1:x/getMe", {})  # warm up one connection
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    cpu0, t0 = _cpu(), time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
    close()
    n = per_thread * threads
    if errors:
        raise SystemExit("%s: %d errors, first: %r" % (name, len(errors), errors[0]))
    return {"client": name, "requests": n, "per_s": n / wall, "cpu_us": cpu / n * 1e6}


def start_server():
    proc = subprocess.Popen([sys.executable, "-m", "fastdispatch.testing"],
                            stdout=subprocess.PIPE, text=True)
    base = proc.stdout.readline().strip()
    if not base.startswith("http://127.0.0.1:"):
        proc.kill()
        raise SystemExit("the fake server did not start")
    return proc, base


def measure(requests_total=6000, threads=16, clients=None, rounds=2):
    clients = list(clients or CLIENTS)
    proc, base = start_server()
    try:
        best = {}
        for r in range(rounds):
            order = clients if r % 2 == 0 else clients[::-1]
            for name in order:
                res = run_one(name, base, requests_total, threads)
                if name not in best or res["cpu_us"] < best[name]["cpu_us"]:
                    best[name] = res
        return [best[name] for name in clients]
    finally:
        proc.terminate()
        proc.wait(10)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--requests", type=int, default=6000, help="requests per run")
    parser.add_argument("--threads", type=int, default=16, help="client threads")
    parser.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated")
    args = parser.parse_args(argv)
    rows = measure(args.requests, args.threads, args.clients.split(","))
    base_cpu = min(r["cpu_us"] for r in rows)
    print("%d sendMessage calls from %d threads, one shared pool, server in another "
          "process (%s, Python %s)" % (args.requests, args.threads, platform.machine(),
                                       sys.version.split()[0]))
    print("%-9s %12s %16s %10s" % ("client", "requests/s", "client CPU/req", "CPU ratio"))
    for r in rows:
        print("%-9s %12.0f %13.0f us %9.2fx" % (r["client"], r["per_s"], r["cpu_us"],
                                                r["cpu_us"] / base_cpu))


if __name__ == "__main__":
    main()
