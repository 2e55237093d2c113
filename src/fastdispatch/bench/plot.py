"""``--plot``: throughput against the number of chats and of producer threads.

Needs matplotlib (``pip install 'fastdispatch[plot]'``); draws the picture
in the repository's ``docs/throughput.png``
(https://github.com/fastdispatch/fastdispatch/blob/main/docs/throughput.png).
"""

import statistics

from .contenders import THREADS
from .scenarios import PRODUCERS, TASKS, EndToEnd, time_rounds

__all__ = ["CHAT_SWEEP", "SWEEP_IMPLS", "run_sweeps", "plot"]

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
        raise SystemExit("--plot needs matplotlib: pip install 'fastdispatch[plot]'")
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

