"""Which WebSocket client should OneBotSender use for the forward WebSocket?

    python bench/onebot_ws_clients.py [--calls 20000] [--threads 4]
    python bench/onebot_ws_clients.py --instructions   (needs valgrind; ~2 minutes)
    (pip install websockets websocket-client)

Starts a FakeOneBotServer (no limits) in a subprocess, so that the server's
CPU is not counted against the client, then, for each candidate, makes
``send_group_msg`` calls from ``--threads`` threads over ONE shared
connection, the way OneBotSender does: each call sends a frame with its own
``echo`` and waits for its answer, which a reader thread hands over.  It
reports the client process's CPU time per call (user + system) and calls per
second.  Candidates run in turn, twice each, alternating; the better run of
each is reported.  On a shared machine those CPU times move with the
neighbours' load; ``--instructions`` counts the client process's
instructions instead (valgrind callgrind, every thread, one calling thread):
the run with 1,200 calls minus the run with 200, divided by 1,000.  The
figures in docs/onebot.md come from this script.
"""

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

SERVER = ("import sys, time\n"
          "from fastdispatch.testing import FakeOneBotServer\n"
          "with FakeOneBotServer(chat_limit=None, global_limit=None) as s:\n"
          "    print(s.ws_url, flush=True)\n"
          "    sys.stdin.read()\n")


def websockets_sync(url):
    from websockets.sync.client import connect
    conn = connect(url, compression=None, ping_interval=None)
    conn.__enter__()
    return conn.send, conn.recv, conn.close


def websocket_client(url):
    import websocket
    conn = websocket.create_connection(url)
    lock = threading.Lock()  # websocket-client's send is not safe from many threads

    def send(frame):
        with lock:
            conn.send(frame)
    return send, conn.recv, conn.close


def run(make, url, calls, threads):
    send, recv, close = make(url)
    waiting = {}
    lock = threading.Lock()  # guards waiting
    echoes = itertools.count()

    def reader():
        while True:
            try:
                data = json.loads(recv())
            except Exception:
                return
            with lock:
                event = waiting.pop(data.get("echo"), None)
            if event is not None:
                event.set()

    threading.Thread(target=reader, daemon=True).start()  # events: no echo, ignored

    def worker(n):
        for _ in range(n):
            echo = "e%d" % next(echoes)
            event = threading.Event()
            with lock:
                waiting[echo] = event
            send(json.dumps({"action": "send_group_msg", "echo": echo,
                             "params": {"group_id": 1, "message": "hi"}}))
            if not event.wait(30):
                raise RuntimeError("no answer")

    workers = [threading.Thread(target=worker, args=(calls // threads,))
               for _ in range(threads)]
    cpu, wall = time.process_time(), time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    close()
    n = calls // threads * threads
    return cpu / n * 1e6, n / wall


CANDIDATES = (("websockets (sync)", websockets_sync), ("websocket-client", websocket_client))


def instructions(name, url, calls):
    """The client process's instructions for ``calls`` calls (callgrind)."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(["valgrind", "--tool=callgrind",
                               "--callgrind-out-file=" + os.path.join(tmp, "cg.out"),
                               sys.executable, __file__, "--child", name, "--url", url,
                               "--calls", str(calls), "--threads", "1"],
                              capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode or not found:
        raise SystemExit("callgrind failed for %s:\n%s" % (name, proc.stderr[-2000:]))
    return int(found.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--url", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run(dict(CANDIDATES)[args.child], args.url, args.calls, args.threads)
        return
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        if args.instructions:
            for name, _ in CANDIDATES:
                per_call = (instructions(name, url, 1200) - instructions(name, url, 200)) / 1000
                print("%-20s %8.0f instructions per call (client process)" % (name, per_call))
            return
        best = {}
        for _ in range(2):
            for name, make in CANDIDATES:
                cpu, rate = run(make, url, args.calls, args.threads)
                if name not in best or cpu < best[name][0]:
                    best[name] = (cpu, rate)
        for name, (cpu, rate) in best.items():
            print("%-20s %6.1f us client CPU per call   %7.0f calls/s" % (name, cpu, rate))
    finally:
        server.stdin.close()
        server.wait(30)


if __name__ == "__main__":
    main()
