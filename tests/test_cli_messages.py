"""What the command lines and the example print is plain and true.

``python -m fastdispatch.testing --help`` states each default once, in words
("no limit", not "None"); the demo's summary agrees with its numbers ("1
send", not "1 sends"); ``examples/echo_bot.py`` says why the events it did
not handle were not handled, and the reasons add up.
"""

import os
import re
import subprocess
import sys

import pytest

from fastdispatch import _demo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_fake_server_help_states_each_default_once_in_words():
    out = subprocess.run([sys.executable, "-m", "fastdispatch.testing", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "None" not in text
    options = re.split(r"\s(?=--[a-z-]+ [A-Z])", text.split("options:", 1)[1])
    for option in options:
        if option.startswith("--") and not option.startswith("--help"):
            assert option.count("(default:") == 1, option
        if option.startswith("--token"):
            assert "(default: any" in option, option


@pytest.mark.parametrize("n, words", [
    (1, ("1 send reached", "it left", "its paced start", "retried it in order")),
    (3, ("3 sends reached", "they left", "their paced start", "retried them in order")),
])
def test_demo_note_on_late_sends_agrees_with_its_count(n, words):
    note = _demo.jitter_note(n, 0.02)
    for phrase in words:
        assert phrase in note, note
    assert "20 ms" in note


def test_demo_counts_are_singular_for_one():
    assert _demo._count(1, "send") == "1 send"
    assert _demo._count(0, "send") == "0 sends"
    assert _demo._count(1, "retry", "retries") == "1 retry"
    assert _demo._count(2, "retry", "retries") == "2 retries"


def test_a_one_chat_demo_says_chat_not_chats():
    out = subprocess.run(
        [sys.executable, "-m", "fastdispatch", "demo", "--messages", "5", "--chats", "1",
         "--producers", "1", "--speedup", "50"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "5 messages to 1 chat (0 groups) from 1 producer thread" in out.stdout
    assert "(1 chat checked on the server's record, 0 duplicates)" in out.stdout


def test_echo_bot_says_why_events_were_not_handled():
    script = os.path.join(ROOT, "examples", "echo_bot.py")
    if not os.path.exists(script):
        pytest.skip("examples/ is not part of this copy of the tests")
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    summary = re.search(r"events:\s+(\d+) from .*: (\d+) handled, (\d+) not\n\s+\((\d+) matched "
                        r"no rule \(\"just chatting\"\), (\d+) /stats refused by its cooldown",
                        out.stdout)
    assert summary, out.stdout
    events, handled, unhandled, no_rule, cooldown = map(int, summary.groups())
    assert handled + unhandled == events == 1440
    assert no_rule + cooldown == unhandled and no_rule > 0 and cooldown > 0
    assert "per-chat order: held" in out.stdout
