"""``python -m fastdispatch demo``: the Telegram path end to end, and a CLI that guides."""

import subprocess
import sys

import pytest


def demo(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "fastdispatch", "demo", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_demo_delivers_in_order_through_http_with_injected_429s_and_5xx():
    out = demo("--messages", "400", "--chats", "40", "--speedup", "20",
               "--inject-429", "0.05", "--inject-5xx", "0.05")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "TelegramSender -> HTTP -> FakeTelegramServer" in out.stdout
    assert "delivered       400 / 400  (0 failed)" in out.stdout
    assert "per-chat order  OK" in out.stdout and "0 duplicates" in out.stdout
    assert "injected)" in out.stdout and "all checks passed" in out.stdout
    assert "5xx received" in out.stdout and "all injected, 5.0% of sends" in out.stdout
    assert "retries " in out.stdout and "in all)" not in out.stdout


def test_demo_without_injected_faults_says_why_no_5xx_came():
    out = demo("--messages", "60", "--chats", "6", "--speedup", "20")
    assert out.returncode == 0, out.stdout + out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if "5xx received" in ln]
    assert line.split()[2] == "0" and "--inject-5xx" in line and "injected;" not in line
    assert "sends tried again after a 429 or a 5xx" in out.stdout


def test_demo_help_shows_plain_descriptions_and_defaults():
    out = demo("--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "``" not in text and ":class:" not in text
    assert "messages in all (at least one per chat) (default: 2000)" in text
    assert "(default: 64)" in text
    for option in ("--max-inflight", "--latency-ms", "--inject-429", "--speedup"):
        assert option in out.stdout


@pytest.mark.parametrize("args,complaint", [
    (["--max-inflight", "0"], "--max-inflight: must be at least 1"),
    (["--latency-ms", "-5"], "--latency-ms: must be in [0"),
    (["--messages", "10", "--chats", "1000"], "every chat gets at least one message"),
    (["--chats", "2", "--producers", "3", "--messages", "5"], "--producers (3)"),
    (["--inject-429", "0.8", "--inject-5xx", "0.8"], "add up to at most 1"),
    (["--speedup", "0"], "--speedup"),
    (["--messages", "many"], "is not an integer"),
])
def test_bad_demo_arguments_are_usage_errors_not_tracebacks(args, complaint):
    out = demo(*args)
    assert out.returncode == 2
    assert complaint in out.stderr and "Traceback" not in out.stderr


def test_demo_serves_its_metrics_while_it_runs():
    """``--metrics-port``: a real Prometheus exposition of the run, scraped over HTTP."""
    import re
    import urllib.request
    pytest.importorskip("prometheus_client")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastdispatch", "demo", "--messages", "300", "--chats", "30",
         "--speedup", "20", "--metrics-port", "0", "--metrics-linger", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        lingering = False
        for line in proc.stdout:
            found = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", line)
            if found and url is None:
                url = found.group(1)
            if "metrics stay up" in line:
                lingering = True
                break
        assert url and lingering, "the demo did not announce its metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    completed = re.search(r'^fastdispatch_tasks_total\{dispatcher="demo",outcome="completed"\} '
                          r'(\S+)$', text, re.M)
    assert completed and float(completed.group(1)) == 300.0, text[:2000]
    for family in ("fastdispatch_paced_total", "fastdispatch_queue_latency_seconds_bucket",
                   "fastdispatch_parked_chats", "fastdispatch_inflight"):
        assert family in text


def test_metrics_port_must_be_a_port():
    out = demo("--metrics-port", "70000")
    assert out.returncode == 2 and "--metrics-port" in out.stderr


def test_top_level_help_lists_every_command_and_imports_nothing_heavy():
    # What --help loads beyond the package itself (which every command imports).
    code = ("import sys, fastdispatch; before = set(sys.modules); "
            "from fastdispatch.__main__ import main; main(['--help']); "
            "print('HEAVY', sorted(m for m in set(sys.modules) - before "
            "if m != 'fastdispatch.__main__'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout
    commands = out.stdout.split("commands:")[1]
    for command in ("demo", "bench", "cluster", "testing"):
        assert "\n  %s " % command in commands, command
    for command in ("cluster", "testing"):      # and each one runs from there
        sub = subprocess.run([sys.executable, "-m", "fastdispatch", command, "--help"],
                             capture_output=True, text=True, timeout=60)
        assert sub.returncode == 0 and "usage: python -m fastdispatch." + command in sub.stdout


def test_cluster_demo_without_the_extra_prints_the_hint_not_a_traceback():
    # As on a machine without the cluster extra: its Python packages and
    # servers are not found (find_spec and find_executable say so).
    code = """
import importlib.util, sys
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name in ("nats", "redis") else real(name, *a)
from fastdispatch.cluster import _servers
def nowhere(name, hint, packaged=None):
    raise _servers.ServerNotFound(name + " not found")
_servers.find_executable = nowhere
from fastdispatch.cluster.__main__ import main
sys.exit(main(["demo"]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) <= 3, out.stderr
    assert "nats-py, redis, nats-server and redis-server" in out.stderr
    assert "pip install 'fastdispatch[cluster]'" in out.stderr
