"""Which threaded WSGI server should ``run_webhook`` embed?  Measured, not guessed.

    python bench/webhook_servers.py [--requests 6000] [--clients 16] [--threads 8]

Each candidate serves the real ``webhook_app`` (an ``Engine`` whose one
handler queues a reply on a dispatcher with a no-op sender) in a process of
its own; ``--clients`` threads of this process POST Telegram updates to it
over keep-alive connections, as Telegram does (up to ``max_connections``
at once, 40 by default).  Reported: requests per second and the server
processes' CPU time per request (user + system, read from /proc, every
process of the server counted: gunicorn's master and worker).  Every
candidate runs with ``--threads`` request threads; each runs twice, in
alternating order, and the better run is reported.  Linux only (/proc).

Candidates: waitress, cheroot (CherryPy's server), gunicorn with its gthread
worker (1 worker process), and the stdlib's ``wsgiref`` with
``ThreadingMixIn`` as a reference (not a production server).  The numbers in
docs/telegram.md come from this script.
"""

import argparse
import http.client
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

APP = textwrap.dedent('''
    import logging
    from fastdispatch import Engine, OutboundDispatcher, SendResult
    from fastdispatch.telegram import webhook_app

    class NoopSender:
        def send(self, sc, request):
            return SendResult("1")

    engine = Engine(OutboundDispatcher(max_inflight=8, queue_size=100000))

    @engine.on()
    def echo(ctx):
        ctx.reply_text(ctx.event.text)

    app = webhook_app(engine, NoopSender(), secret_token="bench")
''')

SERVE = {
    "waitress": "import waitress, bench_app; waitress.serve(bench_app.app, host='127.0.0.1', "
                "port={port}, threads={threads}, _quiet=True)",
    "cheroot": "import bench_app; from cheroot import wsgi; "
               "s = wsgi.Server(('127.0.0.1', {port}), bench_app.app, numthreads={threads}); "
               "s.start()",
    "wsgiref": "import bench_app; from socketserver import ThreadingMixIn; "
               "from wsgiref.simple_server import WSGIServer, WSGIRequestHandler, make_server\n"
               "class S(ThreadingMixIn, WSGIServer): daemon_threads = True\n"
               "class H(WSGIRequestHandler):\n"
               "    def log_message(self, *a): pass\n"
               "make_server('127.0.0.1', {port}, bench_app.app, server_class=S, "
               "handler_class=H).serve_forever()",
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name, port, threads, workdir):
    env = dict(os.environ, PYTHONPATH=workdir + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if name == "gunicorn":
        cmd = [sys.executable, "-m", "gunicorn", "-k", "gthread", "-w", "1",
               "--threads", str(threads), "-b", "127.0.0.1:%d" % port, "--log-level",
               "warning", "--keep-alive", "30", "bench_app:app"]
    else:
        cmd = [sys.executable, "-c", SERVE[name].format(port=port, threads=threads)]
    proc = subprocess.Popen(cmd, env=env, cwd=workdir, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("%s did not start" % name)


def cpu_of_tree(pid):
    """User + system seconds of ``pid`` and its live children, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == pid or int(fields[1]) == pid:   # fields[1]: the parent's pid
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def client(port, count, errors):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json",
               "X-Telegram-Bot-Api-Secret-Token": "bench"}
    for update_id, chat in count:
        body = json.dumps({"update_id": update_id, "message": {
            "message_id": update_id, "chat": {"id": chat, "type": "private"},
            "from": {"id": chat, "is_bot": False, "first_name": "A"}, "text": "hi"}})
        conn.request("POST", "/", body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            errors.append(response.status)
    conn.close()


def run_one(name, requests, clients, threads, workdir):
    port = free_port()
    proc = start(name, port, threads, workdir)
    try:
        time.sleep(0.5)  # let gunicorn's worker boot past its imports
        work = [[] for _ in range(clients)]
        for i in range(requests):
            work[i % clients].append((i + 1, 1000 + i % 300))
        errors = []
        before = cpu_of_tree(proc.pid)
        started = time.perf_counter()
        pool = [threading.Thread(target=client, args=(port, w, errors)) for w in work]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        elapsed = time.perf_counter() - started
        cpu = cpu_of_tree(proc.pid) - before
    finally:
        proc.terminate()
        proc.wait(30)
    return {"rps": requests / elapsed, "cpu_us": cpu / requests * 1e6, "errors": len(errors)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--only", nargs="*", default=["waitress", "cheroot", "gunicorn",
                                                      "wsgiref"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        with open(os.path.join(workdir, "bench_app.py"), "w") as f:
            f.write(APP)
        best = {}
        for round_ in range(2):
            order = args.only if round_ == 0 else list(reversed(args.only))
            for name in order:
                r = run_one(name, args.requests, args.clients, args.threads, workdir)
                print("  %-9s run %d: %6.0f req/s, %5.0f us server CPU/request, %d errors"
                      % (name, round_ + 1, r["rps"], r["cpu_us"], r["errors"]), flush=True)
                if name not in best or r["rps"] > best[name]["rps"]:
                    best[name] = r
    versions = {}
    for name in ("waitress", "cheroot", "gunicorn"):
        try:
            versions[name] = __import__(name).__version__
        except (ImportError, AttributeError):
            from importlib.metadata import version
            versions[name] = version(name)
    print("\n%d updates POSTed from %d keep-alive clients, %d server threads; Python %s, %s"
          % (args.requests, args.clients, args.threads, platform.python_version(),
             platform.machine()))
    print("| server | requests/s | server CPU per request |")
    print("|---|---:|---:|")
    for name in args.only:
        r = best[name]
        label = "%s %s" % (name, versions.get(name, "(stdlib)"))
        print("| %s | %s | %.0f µs |" % (label, format(round(r["rps"]), ","), r["cpu_us"]))


if __name__ == "__main__":
    main()
