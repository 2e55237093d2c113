"""The report: targets, their verdicts and the tables that print them.

Every figure that matters is a *ratio* of medians within one run, never an
absolute time: the machine may be busy.
"""

import os
import platform
import statistics

from .contenders import _ringbuf
from .scenarios import IO_IDEAL

__all__ = ["RETAINED_BOUND", "TARGETS", "INFO", "HEADER", "ratio_rows", "round_maps",
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


def round_maps(times):
    """One ``{(group, impl): seconds}`` map per round index, from ``time_rounds``
    results (``group -> (impl -> round times, ops)``): the rounds' own figures,
    so that a ratio can be taken within one round."""
    count = max((len(ts) for t, _ in times.values() for ts in t.values()), default=0)
    return [{(group, impl): ts[k] for group, (t, _) in times.items()
             for impl, ts in t.items() if k < len(ts)} for k in range(count)]


def ratio_rows(medians, memory=None, include_info=True, runs=()):
    """Evaluate the targets.

    ``medians`` maps (group, impl) -> median seconds; ``memory`` maps
    (impl, "post-bytes" | "retained-bytes") -> bytes.  Returns rows of
    (label, ours, baseline, ratio, bound text, verdict); a target whose
    inputs were not measured is left out.

    ``runs``: every run made, each a list of per-round maps (see
    :func:`round_maps`).  Then a target's ratio is the median of its
    same-round ratios over all of them (never a best run), the ratio cell
    also lists each run's median, and with several runs the verdict says in
    how many the target was met (``"met (1 of 3 runs)"``).
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
        measured = _timed_ratio(kind, group, ours, base, medians)
        if measured is None:
            continue
        t_ours, t_base, ratio = measured
        per_run = [[r[2] for r in (_timed_ratio(kind, group, ours, base, m) for m in rounds)
                    if r is not None] for rounds in runs]
        per_run = [ratios for ratios in per_run if ratios]
        ratio_text = "%.2f" % ratio
        if per_run:
            ratio = statistics.median([r for ratios in per_run for r in ratios])
            ratio_text = "%.2f (runs: %s)" % (ratio, " ".join(
                "%.2f" % statistics.median(ratios) for ratios in per_run))
        bound_text = "" if bound is None else "%s %g" % (op, bound)
        verdict = _verdict(ratio, op, bound)
        if len(per_run) > 1 and bound is not None:
            met = sum(_verdict(statistics.median(r), op, bound) == "met" for r in per_run)
            verdict = "%s (%d of %d runs)" % (verdict, met, len(per_run))
        rows.append((label, _fmt_time(t_ours), _fmt_time(t_base), ratio_text,
                     bound_text, verdict))
    return rows


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

