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
