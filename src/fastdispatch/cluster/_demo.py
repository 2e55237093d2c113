"""``python -m fastdispatch.cluster demo``: the kill test, on one machine.

It starts ``nats-server -js`` and ``redis-server`` on free loopback ports,
three worker processes (``python -m fastdispatch.cluster worker``) with a
sender that only records what it sends, publishes thousands of messages over
a hundred and more chats, kills one worker with SIGKILL mid-run, waits until
every message was sent, stops the others with SIGTERM and prints the
verification made from the sender's own record (``_verify.py``).

``LocalCluster`` (the servers plus worker processes) is what the test suite
uses too.
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse

from ..pacing import RateLimit
from ._servers import NatsServer, RedisServer
from ._verify import read_file_records, verify

__all__ = ["LocalCluster", "make_sender", "main"]


def make_sender():
    """The demo's sender: sleeps like a platform call, appends a line per send.

    ``FD_DEMO_RECORD`` is the directory; ``FD_DEMO_LATENCY`` the simulated
    answer time.  One ``os.write`` per line on an O_APPEND file: a line that
    was written survives a SIGKILL of the process.
    """
    directory = os.environ["FD_DEMO_RECORD"]
    latency = float(os.environ.get("FD_DEMO_LATENCY", "0.005"))
    pid = os.getpid()
    fd = os.open(os.path.join(directory, "send-%d.log" % pid),
                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def send(sc, chat_id, payload, key):
        start = time.time()
        time.sleep(latency)
        end = time.time()
        os.write(fd, ("%s %s %.6f %.6f %d %s\n" % (urllib.parse.quote(chat_id, safe=""),
                                                     payload.decode(), start, end,
                                                     pid, key)).encode())
    return send


class LocalCluster:
    """NATS + Redis on loopback and any number of worker processes.

    ``worker_args``: extra CLI options for every worker; ``env``: extra
    environment (e.g. the sender's settings).  Worker output goes to
    ``<workdir>/worker-<n>.log``.
    """

    def __init__(self, *, stream="fastdispatch", sender, worker_args=(), env=None,
                 workdir=None, start_nats=True, start_redis=True):
        self.workdir = workdir or tempfile.mkdtemp(prefix="fastdispatch-cluster-")
        self.stream = stream
        self.sender = sender
        self.worker_args = list(worker_args)
        self.env = dict(os.environ, **(env or {}))
        self.nats = NatsServer(data_dir=os.path.join(self.workdir, "nats"))
        self.redis = RedisServer(data_dir=os.path.join(self.workdir, "redis"))
        os.makedirs(self.nats.data_dir, exist_ok=True)
        os.makedirs(self.redis.data_dir, exist_ok=True)
        self.workers = []
        self._logs = []
        try:
            if start_nats:
                self.nats.start()
            if start_redis:
                self.redis.start()
        except BaseException:
            self.close()
            raise

    def spawn_worker(self, *extra):
        n = len(self.workers)
        log_path = os.path.join(self.workdir, "worker-%d.log" % n)
        log = open(log_path, "ab")
        cmd = [sys.executable, "-m", "fastdispatch.cluster", "worker",
               "--nats", self.nats.url, "--redis", self.redis.url, "--stream", self.stream,
               "--sender", self.sender] + self.worker_args + list(extra)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=self.env)
        proc.log_path = log_path
        self.workers.append(proc)
        self._logs.append(log)
        return proc

    def worker_log(self, proc):
        with open(proc.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def kill(self, proc):
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def terminate(self, proc, timeout=60):
        """SIGTERM and wait; returns the exit code."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None

    def close(self):
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in self._logs:
            log.close()
        self.nats.stop()
        self.redis.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def wait_for(predicate, timeout, interval=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def _count_lines(directory):
    """Lines in the record files (cheap: no parsing)."""
    n = 0
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), "rb") as f:
            n += f.read().count(b"\n")
    return n


def _limit(text):
    count, per = text.split("/")
    return RateLimit(int(count), per=float(per))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fastdispatch.cluster demo",
                                description="The kill test on one machine.")
    p.add_argument("--messages", type=int, default=6000)
    p.add_argument("--chats", type=int, default=150)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--global-limit", default="250/1")
    p.add_argument("--chat-limit", default="10/1")
    p.add_argument("--latency", type=float, default=0.005, help="simulated send time (s)")
    p.add_argument("--ack-wait", type=float, default=2.0)
    p.add_argument("--kill-at", type=float, default=0.4,
                   help="kill one worker when this share of the messages was sent")
    args = p.parse_args(argv)
    global_limit, chat_limit = _limit(args.global_limit), _limit(args.chat_limit)

    from ._producer import ClusterProducer

    record = tempfile.mkdtemp(prefix="fastdispatch-demo-record-")
    env = {"FD_DEMO_RECORD": record, "FD_DEMO_LATENCY": str(args.latency)}
    worker_args = ["--global-limit", args.global_limit, "--chat-limit", args.chat_limit,
                   "--ack-wait", str(args.ack_wait), "--fetch-timeout", "1",
                   "--log-level", "WARNING"]
    print("starting nats-server -js, redis-server and %d workers ..." % args.workers)
    with LocalCluster(stream="demo", sender="fastdispatch.cluster._demo:make_sender",
                      worker_args=worker_args, env=env) as cluster:
        producer = ClusterProducer(nats_url=cluster.nats.url, stream="demo",
                                   ack_wait=args.ack_wait)
        workers = [cluster.spawn_worker() for _ in range(args.workers)]
        expected = {}
        t0 = time.monotonic()
        for i in range(args.messages):
            chat = "chat%d" % (i % args.chats)
            seq = expected.get(chat, 0)
            expected[chat] = seq + 1
            producer.publish(chat, str(seq).encode())
        print("published %d messages to %d chats in %.1f s (global limit %s, chat limit %s)"
              % (args.messages, args.chats, time.monotonic() - t0, args.global_limit,
                 args.chat_limit))
        victim = workers[0]
        wait_for(lambda: _count_lines(record) >= args.messages * args.kill_at, 600, 0.5)
        cluster.kill(victim)
        print("kill -9 worker pid %d after %d sends" % (victim.pid,
                                                         len(read_file_records(record))))

        def all_sent():
            if _count_lines(record) < args.messages:
                return False
            return len({(r.chat, r.seq) for r in read_file_records(record)}) >= args.messages
        finished = wait_for(all_sent, max(120.0, 3 * args.messages / global_limit.count), 0.5)
        codes = [cluster.terminate(w) for w in workers[1:]]
        producer.close()
        print("every message sent: %s; SIGTERM -> exit codes %s" % (finished, codes))
        verdict = verify(read_file_records(record), expected, global_limit=global_limit,
                         chat_limit=chat_limit, crashed_pids={victim.pid})
        for line in verdict.lines():
            print("  " + line)
        return 0 if verdict.ok and finished and all(c == 0 for c in codes) else 1
