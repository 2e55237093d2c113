"""The report: targets, their verdicts and the tables that print them.

Every figure that matters is a *ratio* of medians within one run, never an
absolute time: the machine may be busy.
"""

import os
import platform
import statistics

from .contenders import _ringbuf
from .scenarios import IO_IDEAL

__all__ = ["RETAINED_BOUND", "TARGETS", "INFO", "HEADER", "ratio_rows",
           "format_table", "scenario_rows", "describe_machine"]

# Columns of every section's table (see fastdispatch.bench).
HEADER = ("measure", "ours", "baseline", "ratio", "target", "")


# "Nothing retained": what is left must not grow with the number of chats.
# A few KiB stay whatever the count (idle workers' wake locks, allocator
# caches); 16 KiB for 100k chats is 0.16 B per chat.
RETAINED_BOUND = 16 * 1024

# (label, group, ours, baseline, kind, op, bound)
#   kind "cost":       median(ours) / median(baseline)       (lower is better)
#   kind "throughput": median(baseline) / median(ours)       (higher is better)
#   kind "ideal":      median(ours) / IO_IDEAL
#   kind "bytes":      the measured value itself (memory group)
TARGETS = (
    ("submit, busy chat / Future() kept", "submit: busy chat",
     "fastdispatch", "floor", "cost", "<=", 1.15),
    ("post, busy chat / Future() kept", "inject: post to a busy chat",
     "fastdispatch", "floor", "cost", "<=", 0.25),
    ("e2e submit throughput / floor", "e2e: submit 10k over 1000 chats",
     "fastdispatch", "floor", "throughput", ">=", 0.6),
    ("e2e submit throughput / ThreadPoolExecutor(8)", "e2e: submit 10k over 1000 chats",
     "fastdispatch", "threadpool", "throughput", ">=", 1.5),
    ("e2e post throughput / ThreadPoolExecutor(8)", "e2e: post 10k over 1000 chats",
     "fastdispatch", "threadpool", "throughput", ">=", 3.0),
    ("e2e submit: Cython / pure-Python twin", "e2e: submit 10k over 1000 chats",
     "fastdispatch", "fastdispatch-py", "throughput", ">=", 1.8),
    ("e2e post: Cython / pure-Python twin", "e2e: post 10k over 1000 chats",
     "fastdispatch", "fastdispatch-py", "throughput", ">=", 1.8),
    ("I/O-bound wall time / ideal", "io: 2000 chats x 5 x 10 ms",
     "fastdispatch", "ideal", "ideal", "<=", 1.3),
    ("bytes per queued post task", "memory", "fastdispatch", "post-bytes",
     "bytes", "<=", 200),
    ("bytes retained after 100k chats drained", "memory", "fastdispatch",
     "retained-bytes", "bytes", "<=", RETAINED_BOUND),
)

# Not targets: context for reading them (the dispatcher as constructed with
# no arguments; the Future's own cost; the naive dispatcher against the pool).
INFO = (
    ("e2e submit / plain Futures' life cycle, no threads", "e2e: submit 10k over 1000 chats",
     "fastdispatch", "futures-only", "throughput", ">=", None),
    ("e2e submit, all defaults / floor", "e2e defaults: submit 10k over 1000 chats",
     "fastdispatch-default", "floor", "throughput", ">=", None),
    ("e2e submit, all defaults / ThreadPoolExecutor(8)",
     "e2e defaults: submit 10k over 1000 chats", "fastdispatch-default", "threadpool",
     "throughput", ">=", None),
    ("e2e post, all defaults / ThreadPoolExecutor(8)",
     "e2e defaults: post 10k over 1000 chats", "fastdispatch-default", "threadpool",
     "throughput", ">=", None),
    ("e2e submit, naive / ThreadPoolExecutor(8)", "e2e: submit 10k over 1000 chats",
     "naive", "threadpool", "throughput", ">=", None),
)


def _timed_ratio(kind, group, ours, base, medians):
    """(ours, baseline, ratio) of one timing target in one run, or None."""
    t_ours = medians.get((group, ours))
    if t_ours is None:
        return None
    if kind == "ideal":
        t_base = IO_IDEAL
    else:
        t_base = medians.get((group, base))
        if t_base is None:
            return None
    return t_ours, t_base, (t_base / t_ours if kind == "throughput" else t_ours / t_base)


def ratio_rows(medians, memory=None, include_info=True, retries=()):
    """Evaluate the targets.

    ``medians`` maps (group, impl) -> median seconds; ``memory`` maps
    (impl, "post-bytes" | "retained-bytes") -> bytes.  Returns rows of
    (label, ours, baseline, ratio, bound text, verdict); a target whose
    inputs were not measured is left out.

    ``retries`` are more ``medians`` maps, from groups measured again: a
    target measured in several runs shows its best run, and its verdict
    says in how many runs it was met (``"met (1 of 3 runs)"``).
    """
    rows = []
    for label, group, ours, base, kind, op, bound in TARGETS + (INFO if include_info else ()):
        if kind == "bytes":
            if not memory or (ours, base) not in memory:
                continue
            value = memory[(ours, base)]
            rows.append((label, "%.0f B" % value, "", "%.0f" % value,
                         "%s %g B" % (op, bound), _verdict(value, op, bound)))
            continue
        runs = [r for r in (_timed_ratio(kind, group, ours, base, m)
                            for m in (medians,) + tuple(retries)) if r is not None]
        if not runs:
            continue
        pick = max if op == ">=" else min
        t_ours, t_base, ratio = pick(runs, key=lambda r: r[2])
        bound_text = "" if bound is None else "%s %g" % (op, bound)
        verdict = _verdict(ratio, op, bound)
        if len(runs) > 1 and bound is not None:
            met = sum(_verdict(r[2], op, bound) == "met" for r in runs)
            verdict = "%s (%d of %d runs)" % (verdict, met, len(runs))
        rows.append((label, _fmt_time(t_ours), _fmt_time(t_base), "%.2f" % ratio,
                     bound_text, verdict))
    return rows


def missed_groups(rows):
    """The scenario groups of the timing targets that ``rows`` marks MISSED."""
    verdicts = {row[0]: row[5] for row in rows}
    return sorted({group for label, group, _, _, kind, _, _ in TARGETS
                   if kind != "bytes" and verdicts.get(label, "").startswith("MISSED")})


def _verdict(value, op, bound):
    if bound is None:
        return "(info)"
    ok = value <= bound if op == "<=" else value >= bound
    return "met" if ok else "MISSED"


def _fmt_time(seconds):
    if seconds >= 1:
        return "%.2f s" % seconds
    if seconds >= 1e-3:
        return "%.1f ms" % (seconds * 1e3)
    return "%.0f us" % (seconds * 1e6)


def format_table(header, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = []
    for i, row in enumerate((header,) + tuple(rows)):
        cells = [str(c).ljust(w) if j == 0 else str(c).rjust(w)
                 for j, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def scenario_rows(group, times, ops):
    """Rows (contender, median, per op, vs fastdispatch) for one scenario."""
    medians = {impl: statistics.median(ts) for impl, ts in times.items()}
    ref = medians.get("fastdispatch", medians.get("fastdispatch-default"))
    rows = []
    for impl, m in medians.items():
        rel = "" if ref is None else "%.2f" % (m / ref)
        rows.append((impl, _fmt_time(m), "%.0f ns" % (m / ops * 1e9), rel))
    return rows


def describe_machine():
    core = "cython" if _ringbuf is not None else "python (extension missing)"
    return "core: %s; %s %s; %d CPUs; %s" % (
        core, platform.python_implementation(), platform.python_version(),
        os.cpu_count() or 0, platform.machine())

