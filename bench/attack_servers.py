"""What one client on the network can do to a bot's web server: ``run_webhook``
with its defaults (8 threads) in a process of its own, attacked four ways.

    python bench/attack_servers.py [PYTHONPATH for the bot; default: the installed package]

1. a 200 MiB header line: how much the server reads, its memory after;
2. ``Content-Length: 200 MiB`` with a wrong secret: the same;
3. 8 clients each sending one header line every 2 s: when ``/healthz``
   answers a ninth client;
4. 1,000 connections that send nothing: how long they take to open, the
   server's threads, when ``/healthz`` answers.

Run it on two versions (one installed, one by path) to compare them; the
figures of the current one are in ``docs/telegram.md`` ("What a client of
the server can do").  Linux only (/proc).
"""
import http.client
import os
import socket
import subprocess
import sys
import threading
import time

BOT = """
import sys
from fastdispatch import Engine
from fastdispatch.telegram import TelegramSender, run_webhook
sys.exit(run_webhook(Engine(), TelegramSender("123:abc", base_url="http://127.0.0.1:1"),
                     port=int(sys.argv[1]), secret_token="s"))
"""
MIB = 1 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0


def thread_count(pid):
    return len(os.listdir("/proc/%d/task" % pid))


def healthz_after(port, limit=45.0):
    """Seconds until GET /healthz answers 200, or None within ``limit``."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=limit)
        try:
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return time.monotonic() - started
        except OSError:
            time.sleep(0.1)
        finally:
            conn.close()
    return None


def start_bot(path):
    port = free_port()
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if path:
        env["PYTHONPATH"] = path
    bot = subprocess.Popen([sys.executable, "-c", BOT, str(port)], env=env,
                           stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            break
        except OSError:
            time.sleep(0.05)
    return bot, port


def stop_bot(bot):
    bot.terminate()
    bot.wait()


def send_until_closed(port, head, total, timeout=20.0):
    """Send ``head`` then up to ``total`` bytes; (bytes sent, first answer line, seconds)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(timeout)
    sent, started, block = 0, time.monotonic(), b"a" * MIB
    try:
        sock.sendall(head)
        sent = len(head)
        while sent < total and time.monotonic() - started < timeout:
            sock.sendall(block)
            sent += len(block)
    except OSError:
        pass
    try:
        sock.settimeout(3)
        answer = sock.recv(200).split(b"\r\n")[0]
    except OSError as exc:
        answer = repr(exc).encode()
    sock.close()
    return sent, answer, time.monotonic() - started


def huge_header(path, label):
    bot, port = start_bot(path)
    base = rss_mib(bot.pid)
    sent, answer, seconds = send_until_closed(port, b"POST /telegram HTTP/1.1\r\nX-A: ",
                                              200 * MIB)
    print("%s huge header: server took %d MiB in %.1f s, answered %r; RSS +%d MiB"
          % (label, sent // MIB, seconds, answer, rss_mib(bot.pid) - base))
    stop_bot(bot)


def huge_body(path, label):
    bot, port = start_bot(path)
    base = rss_mib(bot.pid)
    head = (b"POST /telegram HTTP/1.1\r\nHost: x\r\nX-Telegram-Bot-Api-Secret-Token: wrong\r\n"
            b"Content-Length: %d\r\n\r\n" % (200 * MIB))
    peak, done = [base], threading.Event()

    def watch():
        while not done.wait(0.05):
            peak[0] = max(peak[0], rss_mib(bot.pid))
    threading.Thread(target=watch, daemon=True).start()
    sent, answer, seconds = send_until_closed(port, head, 200 * MIB)
    done.set()
    print("%s huge body (wrong secret): server took %d MiB in %.1f s, answered %r; peak RSS "
          "+%d MiB" % (label, sent // MIB, seconds, answer, peak[0] - base))
    stop_bot(bot)


def slow_clients(path, label):
    bot, port = start_bot(path)
    done = threading.Event()

    def drip():
        try:
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"POST /telegram HTTP/1.1\r\n")
            while not done.wait(2):
                sock.sendall(b"X-Drip: 1\r\n")
        except OSError:
            pass
    for _ in range(8):
        threading.Thread(target=drip, daemon=True).start()
    time.sleep(1)
    seconds = healthz_after(port)
    print("%s 8 slow clients (a header line every 2 s): /healthz answered after %s"
          % (label, "%.1f s" % seconds if seconds is not None else "no answer in 45 s"))
    done.set()
    stop_bot(bot)


def many_clients(path, label):
    bot, port = start_bot(path)
    before = thread_count(bot.pid)
    socks, started = [], time.monotonic()
    for _ in range(1000):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=3))
        except OSError:
            break
    opened = time.monotonic() - started
    time.sleep(1)
    seconds = healthz_after(port)
    print("%s 1000 idle connections: %d opened in %.1f s; server threads %d -> %d; /healthz "
          "after %s" % (label, len(socks), opened, before, thread_count(bot.pid),
                        "%.1f s" % seconds if seconds is not None else "no answer in 45 s"))
    for sock in socks:
        sock.close()
    stop_bot(bot)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else ""
    label = path or "installed"
    for attack in (huge_header, huge_body, slow_clients, many_clients):
        attack(path, label)


if __name__ == "__main__":
    main()
