"""The picture of docs/performance.md: throughput against the number of chats and of producer threads.

    python bench/plot.py docs/throughput.png [--rounds 3]

Sweeps the end-to-end workload of ``fastdispatch.bench.scenarios`` (10,000
no-op tasks with Futures) over 1 to 10,000 chats with one producer, and
over 1, 2, 4 and 8 producer threads with 1,000 chats, for each contender
of the bench command, and draws both.  Needs matplotlib (``pip install
matplotlib``); about 40 s on an idle two-core machine.
"""

import argparse
import statistics
import sys
import time

from fastdispatch.bench.contenders import THREADS
from fastdispatch.bench.scenarios import PRODUCERS, TASKS, EndToEnd, time_rounds

CHAT_SWEEP = (1, 10, 100, 1_000, 10_000)
SWEEP_IMPLS = ("fastdispatch", "fastdispatch-py", "naive", "threadpool", "floor")


def _silent(msg):
    pass


def run_sweeps(rounds=3, progress=_silent):
    """Throughput (tasks/s) against chats and against producer threads."""
    by_chats, by_producers = {}, {}
    for label, points, make in (
            ("chats", CHAT_SWEEP, lambda impl, x: EndToEnd(impl, chats=x)),
            ("producers", PRODUCERS, lambda impl, x: EndToEnd(impl, producers=x))):
        out = by_chats if label == "chats" else by_producers
        for x in points:
            progress("sweep: %s = %d" % (label, x))
            scenarios = {impl: make(impl, x) for impl in SWEEP_IMPLS}
            try:
                times = time_rounds(scenarios, rounds)
            finally:
                for scenario in scenarios.values():
                    scenario.close()
            for impl, ts in times.items():
                out.setdefault(impl, []).append((x, TASKS / statistics.median(ts)))
    return by_chats, by_producers


_PLOT_STYLE = {
    "fastdispatch": dict(color="#1f77b4", marker="o", lw=2.2),
    "fastdispatch-py": dict(color="#1f77b4", marker="o", ls="--", mfc="white"),
    "naive": dict(color="#d62728", marker="s"),
    "threadpool": dict(color="#7f7f7f", marker="^"),
    "floor": dict(color="black", ls=":", lw=1.2),
}
_PLOT_LABELS = {
    "fastdispatch": "fastdispatch (Cython core)",
    "fastdispatch-py": "fastdispatch (pure-Python twin)",
    "naive": "naive: lock + dict + deque + pool",
    "threadpool": "ThreadPoolExecutor(8), no per-chat order",
    "floor": "floor: Future created, set, read (1 thread)",
}


def plot(by_chats, by_producers, path):
    try:
        import matplotlib  # type: ignore[import-not-found]
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found]
    except ImportError:
        raise SystemExit("bench/plot.py needs matplotlib: pip install matplotlib")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    for impl in SWEEP_IMPLS:
        style = _PLOT_STYLE[impl]
        for ax, series in ((left, by_chats), (right, by_producers)):
            xs, ys = zip(*series[impl])
            if impl == "floor":
                level = statistics.median(ys)
                ax.axhline(level / 1e3, label=_PLOT_LABELS[impl], **style)
            else:
                ax.plot(xs, [y / 1e3 for y in ys], label=_PLOT_LABELS[impl], **style)
    left.set_xscale("log")
    left.set_xticks(CHAT_SWEEP)
    left.set_xticklabels([str(x) for x in CHAT_SWEEP])
    left.set_xlabel("chats (10,000 tasks spread round-robin)")
    left.set_ylabel("throughput, thousand tasks/s (higher is better)")
    left.set_title("Throughput vs. number of chats (1 producer)")
    right.set_xticks(PRODUCERS)
    right.set_xlabel("producer threads (10,000 tasks over 1,000 chats)")
    right.set_title("Throughput vs. producer threads")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False, fontsize=9)
    fig.suptitle("No-op tasks with Futures, %d worker threads each; median of rounds"
                 % THREADS, fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", metavar="FILE.png", help="where to write the picture")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed rounds per contender and point (default 3)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        import matplotlib  # type: ignore[import-not-found]  # noqa: F401  (fail early)
    except ImportError:
        parser.error("needs matplotlib: pip install matplotlib")
    t0 = time.perf_counter()

    def progress(msg):
        sys.stderr.write("  [%4.0f s] %s\n" % (time.perf_counter() - t0, msg))

    by_chats, by_producers = run_sweeps(args.rounds, progress)
    plot(by_chats, by_producers, args.path)
    print("plot written to %s" % args.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
