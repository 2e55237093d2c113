"""Checks of a cluster run, made from the sender's own record of its sends.

A record is ``(chat, seq, start, end, pid, key)``: one finished send, ``seq``
being the message's place in its chat's publish order and ``start``/``end``
wall-clock times (all processes run on one machine, one clock).  ``verify``
answers what a user of the cluster cares about: was anything lost, did a
chat ever go out of order or have two sends at once, how many duplicates
(and were they all redeliveries after a crash), did any window of the global
or per-chat limit hold more sends than allowed, and what throughput that
gave.
"""

import glob
import os
import urllib.parse
from collections import defaultdict
from typing import NamedTuple

__all__ = ["Record", "read_file_records", "parse_record", "verify", "Verdict"]


class Record(NamedTuple):
    """One finished send, as the sender recorded it."""

    chat: str
    seq: int
    start: float
    end: float
    pid: int
    key: str


def parse_record(line):
    """``chat seq start end pid key``; the chat id percent-encoded (any id fits one field)."""
    chat, seq, start, end, pid, key = line.split()
    return Record(urllib.parse.unquote(chat), int(seq), float(start), float(end), int(pid), key)


def read_file_records(directory):
    records = []
    for path in sorted(glob.glob(os.path.join(directory, "send-*.log"))):
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    records.append(parse_record(line))
    return records


def _max_in_window(starts, per):
    """Most starts that fall within any window of ``per`` seconds (starts sorted)."""
    best, lo = 0, 0
    for hi, t in enumerate(starts):
        while t - starts[lo] >= per:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


class Verdict:
    """The result of :func:`verify`; ``ok`` is True when every guarantee held."""

    def __init__(self):
        self.sent = self.expected = 0
        self.missing = []             # (chat, seq)
        self.order_violations = []    # (chat, previous seq, seq)
        self.overlaps = []            # (chat, seq a, seq b)
        self.duplicates = []          # (chat, seq, sends)
        self.duplicates_not_after_crash = []
        self.global_max = self.chat_max = None
        self.global_limit = self.chat_limit = None
        self.throughput = None
        self.duration = 0.0
        self.longest_gap = None       # (seconds, chat, seq after the gap)

    @property
    def ok(self):
        return not (self.missing or self.order_violations or self.overlaps
                    or self.duplicates_not_after_crash
                    or any(d[2] > 2 for d in self.duplicates)
                    or (self.global_limit and self.global_max > self.global_limit.count)
                    or (self.chat_limit and self.chat_max > self.chat_limit.count))

    def lines(self):
        out = ["sends recorded:      %d for %d messages" % (self.sent, self.expected),
               "missing:             %d" % len(self.missing),
               "order violations:    %d" % len(self.order_violations),
               "overlapping sends:   %d (two sends of one chat at once)" % len(self.overlaps),
               "duplicates:          %d (each a redelivery after the crash: %s)"
               % (len(self.duplicates), "yes" if not self.duplicates_not_after_crash else "NO")]
        if self.global_limit is not None:
            out.append("global limit:        at most %d sends in any %gs window (limit %d)"
                       % (self.global_max, self.global_limit.per, self.global_limit.count))
        if self.chat_limit is not None:
            out.append("per-chat limit:      at most %d sends in any %gs window (limit %d)"
                       % (self.chat_max, self.chat_limit.per, self.chat_limit.count))
        if self.throughput is not None:
            rate = "%.1f sends/s over %.1f s" % (self.throughput, self.duration)
            if self.global_limit is not None:
                rate += " = %.2fx the global limit" % (
                    self.throughput / (self.global_limit.count / self.global_limit.per))
            out.append("throughput:          " + rate)
        if self.longest_gap is not None:
            out.append("longest chat gap:    %.2f s (chat %s, before message %d; a killed "
                       "worker's chats wait about ack_wait)" % self.longest_gap)
        out.append("verdict:             %s" % ("OK" if self.ok else "FAILED"))
        return out


def verify(records, expected, *, global_limit=None, chat_limit=None, crashed_pids=()):
    """Check ``records`` against ``expected`` (chat -> number of messages, seq 0..n-1)."""
    v = Verdict()
    v.global_limit, v.chat_limit = global_limit, chat_limit
    v.sent = len(records)
    v.expected = sum(expected.values())
    by_chat = defaultdict(list)
    for r in records:
        by_chat[r.chat].append(r)
    chat_max = 0
    for chat, count in expected.items():
        sends = sorted(by_chat.get(chat, ()), key=lambda r: (r.start, r.end))
        seen = defaultdict(list)
        previous = None
        for r in sends:
            seen[r.seq].append(r)
            if previous is not None:
                if r.seq < previous.seq or (r.seq > previous.seq + 1):
                    v.order_violations.append((chat, previous.seq, r.seq))
                if r.start < previous.end:
                    v.overlaps.append((chat, previous.seq, r.seq))
            elif r.seq != 0:
                v.order_violations.append((chat, None, r.seq))
            if previous is not None and (v.longest_gap is None
                                         or r.start - previous.end > v.longest_gap[0]):
                v.longest_gap = (r.start - previous.end, chat, r.seq)
            previous = r
        for seq in range(count):
            if seq not in seen:
                v.missing.append((chat, seq))
        for seq, rs in seen.items():
            if len(rs) > 1:
                v.duplicates.append((chat, seq, len(rs)))
                if rs[0].pid not in crashed_pids:
                    v.duplicates_not_after_crash.append((chat, seq, [r.pid for r in rs]))
        if chat_limit is not None and sends:
            chat_max = max(chat_max, _max_in_window([r.start for r in sends], chat_limit.per))
    for chat in by_chat:
        if chat not in expected:
            v.order_violations.append((chat, None, "unexpected chat"))
    starts = sorted(r.start for r in records)
    if global_limit is not None:
        v.global_max = _max_in_window(starts, global_limit.per)
    if chat_limit is not None:
        v.chat_max = chat_max
    if len(starts) > 1:
        v.duration = starts[-1] - starts[0]
        v.throughput = (len(starts) - 1) / v.duration if v.duration > 0 else None
    return v
