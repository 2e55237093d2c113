"""Kill -9 a bot process mid-run, three times, restart it: no accepted reply is lost.

A child process (outbox_crash_child.py) sends replies to many chats through
an Outbox to a FakeTelegramServer in this process, which records every
arrival.  The child is killed with SIGKILL when the server has received a
random share of the replies (the kill point is read from the server's
record, not a clock), three times, then restarted until it finishes.

Checked per chat, from the server's record:

- every accepted reply arrived (the one reply per sending thread that was
  being sent at a kill may not have been accepted: it may be missing);
- order: a chat's replies never skip ahead, and go back only at a restart
  (the replies in flight at the kill are sent again), by at most the
  outbox's window;
- duplicates are counted, and for each kill are at most the number of
  replies the outbox found not done at the next open (``restored``).

``python tests/test_outbox_crash.py`` runs the full size (20,000 replies to
500 chats) and prints the figures.
"""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from fastdispatch.testing import FakeTelegramServer

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL and SIGTERM: POSIX")

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "outbox_crash_child.py")
TOKEN = "123456:SECRET-token_value"
THREADS = 8
WINDOW = 8  # the Outbox default: most replies of a chat whose outcome is not yet durable


def _child_env():
    import fastdispatch
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.abspath(fastdispatch.__file__)))
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _last_logged(path):
    with open(path, "rb") as f:
        lines = [line for line in f.read().split(b"\n")[:-1] if line]
    return int(lines[-1]) if lines else None


def run_crash_scenario(workdir, *, chats, per_chat, kills=3, durability="full", seed=None,
                       timeout=600.0):
    """Run, kill and restart the child; return the figures (raises on a broken promise)."""
    rng = random.Random(seed)
    total = chats * per_chat
    db = os.path.join(workdir, "replies.db")
    logdir = os.path.join(workdir, "logs")
    os.makedirs(logdir)
    args = [sys.executable, CHILD, db, "", logdir, str(THREADS), str(chats), str(per_chat),
            durability]
    deadline = time.monotonic() + timeout
    uncertain = set()  # (chat, seq): being sent at a kill, maybe never accepted
    arrivals_at_kill = []
    with FakeTelegramServer(TOKEN, latency=(0.002, 0.02),
                            arrival_jitter=(0.0, 0.01), seed=seed) as server:
        args[3] = server.base_url
        points = sorted(rng.uniform(0.1, 0.85) for _ in range(kills))
        for share in points:
            child = subprocess.Popen(args, env=_child_env())
            target = max(int(share * total), server.stats()["sent"] + 1)
            while server.stats()["sent"] < target and child.poll() is None:
                assert time.monotonic() < deadline, "the child made no progress"
                time.sleep(0.005)
            assert child.poll() is None, "the child ended before its kill (exit %r)" \
                % child.returncode
            child.send_signal(signal.SIGKILL)
            child.wait()
            arrivals_at_kill.append(server.stats()["sent"])
            for t in range(THREADS):
                path = os.path.join(logdir, "%d.log" % t)
                n = _last_logged(path) if os.path.exists(path) else None
                if n is not None:
                    own = [c for c in range(chats) if c % THREADS == t]
                    uncertain.add((own[n % len(own)], n // len(own)))
        child = subprocess.Popen(args, env=_child_env())
        code = child.wait(timeout=max(1.0, deadline - time.monotonic()))
        assert code == 0, "the last run failed (exit %r)" % code
        record = {c: [int(m.text.split(":")[1]) for m in server.messages(c)]
                  for c in range(chats)}
    with open(os.path.join(logdir, "restored.log")) as f:
        restored = [int(line) for line in f.read().split()]
    return check_record(record, per_chat, uncertain, restored, kills, arrivals_at_kill)


def check_record(record, per_chat, uncertain, restored, kills, arrivals_at_kill):
    duplicates = 0
    regressions = 0
    for chat, seqs in record.items():
        highest = -1
        previous = None
        for seq in seqs:
            # Never ahead: a reply arrives only after every accepted one
            # before it in its chat (an unaccepted one may be missing).
            expected = highest + 1
            while (chat, expected) in uncertain and seq > expected:
                expected += 1
            assert seq <= expected, "chat %d: %d arrived before %d" % (chat, seq, highest + 1)
            if previous is not None and seq <= previous:
                # A restart resends what was in flight: at most the window.
                regressions += 1
                assert highest - seq < WINDOW, \
                    "chat %d went back from %d to %d" % (chat, highest, seq)
            highest = max(highest, seq)
            previous = seq
        missing = set(range(per_chat)) - set(seqs)
        assert all((chat, s) in uncertain for s in missing), \
            "chat %d: accepted replies never sent: %s" % (chat, sorted(missing)[:10])
        duplicates += len(seqs) - len(set(seqs))
    assert len(restored) == kills + 1 and restored[0] == 0
    # Each repeat is of a row the next open found not done.
    assert duplicates <= sum(restored[1:]), (duplicates, restored)
    assert regressions <= kills * len(record)
    return {"replies": sum(len(s) for s in record.values()), "duplicates": duplicates,
            "restored": restored[1:], "regressions": regressions,
            "uncertain": len(uncertain), "arrivals_at_kill": arrivals_at_kill}


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_sigkill_three_times_loses_no_accepted_reply(tmp_path, durability):
    # "normal" is not synced, but a killed process's writes are in the
    # operating system's cache: only a machine's crash loses them.
    figures = run_crash_scenario(str(tmp_path), chats=100, per_chat=30, seed=1,
                                 durability=durability)
    assert figures["replies"] >= 100 * 30 - figures["uncertain"]


@pytest.mark.stress
def test_sigkill_with_500_chats(tmp_path, soak_factor):
    # 3,000 replies in CI; FASTDISPATCH_SOAK=1: 60,000 (the full size,
    # 20,000, is python tests/test_outbox_crash.py).
    run_crash_scenario(str(tmp_path), chats=500, per_chat=6 * soak_factor, seed=2,
                       timeout=600.0 * soak_factor)


if __name__ == "__main__":
    import tempfile
    for run in range(int(sys.argv[1]) if len(sys.argv) > 1 else 1):
        with tempfile.TemporaryDirectory() as tmp:
            started = time.monotonic()
            result = run_crash_scenario(tmp, chats=500, per_chat=40, seed=run)
            result["seconds"] = round(time.monotonic() - started, 1)
            print(result)
