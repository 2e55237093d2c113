"""``python -m fastdispatch bench``: run the registered sections and print their tables.

``--help`` reads the registry (:data:`fastdispatch.bench.SECTIONS`) and
imports no section: the sections load when they run.
"""

import argparse
import importlib
import sys
import time

from . import QUICK_SCALE, RUNS, SECTIONS

__all__ = ["main"]


NOISE_NOTE = """\
Each ratio is the median of same-round ratios (both sides measured in the
same round, so a busy machine slows both); every run made is counted (%d
here, --runs), none is measured again or picked: "met (2 of 3 runs)" says
how many runs' medians met the target.  Steadier figures: the
pytest-benchmark suite (more rounds: python -m pytest --pyargs
fastdispatch.bench.suite --benchmark-only) and, in the repository,
bench/instructions.py (instruction counts, no timing noise)."""


def _progress_printer():
    t0 = time.perf_counter()

    def progress(msg):
        sys.stderr.write("  [%4.0f s] %s\n" % (time.perf_counter() - t0, msg))
        sys.stderr.flush()

    return progress


def estimate(names, quick):
    """(low, high) seconds for a run of the sections ``names`` on a two-core machine."""
    low = high = 0
    for name in names:
        full, fast = SECTIONS[name]
        lo, hi = fast if quick else full
        low, high = low + lo, high + hi
    return low, high


def span(low, high):
    """``"8-30 s"``; a section that takes a second at most: ``"under 1 s"``."""
    return "under 1 s" if high <= 1 else "%d-%d s" % (low, high)


def estimates_text():
    """The time each section takes, for ``--help``: the one place these are stated.

    The figures are the registry's (:data:`fastdispatch.bench.SECTIONS`);
    the README and the documentation refer here instead of quoting them.
    """
    lines = ["time on two cores (the upper end on a busy machine; with --quick in parentheses):"]
    full, quick = estimate(SECTIONS, False), estimate(SECTIONS, True)
    lines.append("  %-13s %-11s (%s)" % ("all sections", span(*full), span(*quick)))
    for name in SECTIONS:
        full, quick = estimate([name], False), estimate([name], True)
        lines.append("  %-13s %-11s (%s)" % (name, span(*full), span(*quick)))
    return "\n".join(lines)


def load_sections(names=tuple(SECTIONS)):
    """The section modules, in registry order."""
    return [importlib.import_module("." + name, __package__) for name in names]


def main(argv=None):
    """``python -m fastdispatch bench [--quick] [--section NAME]``;
    ``python -m fastdispatch bench flood [...]``: the plug-ins under a flood
    (:mod:`fastdispatch.bench.flood`, a few minutes; not a section)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["flood"]:
        from .flood import main as flood_main
        return flood_main(argv[1:])
    names = list(SECTIONS)
    parser = argparse.ArgumentParser(
        prog="python -m fastdispatch bench",
        description="Measure fastdispatch against a thread pool, a naive per-chat "
                    "dispatcher, its pure-Python twin and the cost of a bare Future; "
                    "print medians and the target ratios.",
        epilog=estimates_text() + "\n\npython -m fastdispatch bench flood --help: the "
               "Telegram plug-ins under a flood (about a minute per bot)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="fewer rounds (x%g): a first look, noisier" % QUICK_SCALE)
    parser.add_argument("--section", action="append", choices=names, metavar="NAME",
                        help="run only this section (repeatable; one of: %s)" % ", ".join(names))
    parser.add_argument("--rounds-scale", type=float, default=1.0, metavar="X",
                        help="multiply the dispatcher section's number of rounds "
                             "(default 1.0)")
    parser.add_argument("--runs", type=int, default=RUNS, metavar="N",
                        help="measure the dispatcher section N times; every run is "
                             "reported, none is picked (default %d)" % RUNS)
    parser.add_argument("--details", action="store_true",
                        help="also print every contender's median per scenario")
    args = parser.parse_args(argv)
    if args.rounds_scale <= 0:
        parser.error("--rounds-scale must be > 0, got %g" % args.rounds_scale)
    if args.runs < 1:
        parser.error("--runs must be >= 1, got %d" % args.runs)

    from . import dispatcher
    from .contenders import _ringbuf
    from .report import HEADER, describe_machine, format_table

    print("fastdispatch bench -- %s" % describe_machine())
    if _ringbuf is None:
        print("WARNING: the compiled core is missing; 'fastdispatch' below is the "
              "pure-Python twin.")
    chosen = [name for name in names if name in (args.section or names)]
    low, high = estimate(chosen, args.quick)
    quick_low, quick_high = estimate(chosen, True)
    sys.stdout.flush()
    sys.stderr.write("estimated time: %.0f-%.0f s on two cores (the upper end on a busy "
                     "machine)%s; progress below\n"
                     % (low * args.rounds_scale, high * args.rounds_scale,
                        "" if args.quick else "; --quick: %.0f-%.0f s"
                        % (quick_low * args.rounds_scale, quick_high * args.rounds_scale)))
    progress = _progress_printer()
    t0 = time.perf_counter()
    sections = load_sections(chosen)
    for section in sections:
        progress("section: %s" % section.TITLE)
        if section is dispatcher:
            rows = section.run(args.quick, progress, rounds_scale=args.rounds_scale,
                               details=args.details, runs=args.runs)
        else:
            rows = section.run(args.quick, progress)
        print("\n" + section.TITLE)
        print(format_table(getattr(section, "HEADER", HEADER), rows))
    if dispatcher in sections:
        print("\n" + NOISE_NOTE % args.runs)
    print("\n(%.0f s)" % (time.perf_counter() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
