"""``python -m fastdispatch bench``: run the registered sections and print their tables."""

import argparse
import importlib
import sys
import time

from . import SECTIONS
from .contenders import _ringbuf
from .report import HEADER, describe_machine, format_table

__all__ = ["main"]


def _progress(msg):
    sys.stderr.write("  " + msg + "\n")
    sys.stderr.flush()


def load_sections(names=SECTIONS):
    """The section modules, in registry order."""
    return [importlib.import_module("." + name, __package__) for name in names]


def main(argv=None):
    """``python -m fastdispatch bench [--quick] [--section NAME] [--plot FILE.png]``."""
    parser = argparse.ArgumentParser(
        prog="python -m fastdispatch bench",
        description="Measure fastdispatch against a thread pool, a naive per-chat "
                    "dispatcher, its pure-Python twin and the cost of a bare Future; "
                    "print medians and the target ratios.")
    parser.add_argument("--quick", action="store_true",
                        help="fewer rounds: a first look, noisier")
    parser.add_argument("--section", action="append", choices=SECTIONS, metavar="NAME",
                        help="run only this section (repeatable; one of: %s)"
                             % ", ".join(SECTIONS))
    parser.add_argument("--plot", metavar="FILE.png",
                        help="also sweep chats and producer threads and draw the "
                             "throughput (needs matplotlib)")
    parser.add_argument("--rounds-scale", type=float, default=1.0, metavar="X",
                        help="multiply the dispatcher section's number of rounds "
                             "(default 1.0)")
    parser.add_argument("--details", action="store_true",
                        help="also print every contender's median per scenario")
    args = parser.parse_args(argv)
    if args.rounds_scale <= 0:
        parser.error("--rounds-scale must be > 0, got %g" % args.rounds_scale)
    if args.plot:
        try:
            import matplotlib  # type: ignore[import-not-found]  # noqa: F401  (fail early)
        except ImportError:
            parser.error("--plot needs matplotlib: pip install 'fastdispatch[plot]'")

    print("fastdispatch bench -- %s" % describe_machine())
    if _ringbuf is None:
        print("WARNING: the compiled core is missing; 'fastdispatch' below is the "
              "pure-Python twin.")
    t0 = time.perf_counter()
    for section in load_sections(args.section or SECTIONS):
        _progress("section: %s" % section.TITLE)
        if section.__name__.endswith(".dispatcher"):
            rows = section.run(args.quick, _progress, rounds_scale=args.rounds_scale,
                               details=args.details)
        else:
            rows = section.run(args.quick, _progress)
        print("\n" + section.TITLE)
        print(format_table(getattr(section, "HEADER", HEADER), rows))
    if args.plot:
        from .plot import plot, run_sweeps
        by_chats, by_producers = run_sweeps(max(3, int(round(3 * args.rounds_scale))), _progress)
        plot(by_chats, by_producers, args.plot)
        print("\nplot written to %s" % args.plot)
    print("\n(%.0f s)" % (time.perf_counter() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
