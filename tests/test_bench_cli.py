"""``python -m fastdispatch bench``: sections by convention, progress, honest verdicts.

The benchmark's numbers are not asserted here (machines are shared and
noisy); what is tested is that every registered section follows the
convention of ``fastdispatch.bench``, that the command says how long it
will take and what it is doing, and that a target measured in several runs
reports how many of them met it.
"""

import importlib
import inspect
import subprocess
import sys
import types

import pytest

from fastdispatch import bench
from fastdispatch.bench import cli, report


@pytest.mark.parametrize("name", bench.SECTIONS)
def test_every_registered_section_follows_the_convention(name):
    section = importlib.import_module("fastdispatch.bench." + name)
    assert isinstance(section.TITLE, str) and section.TITLE
    params = list(inspect.signature(section.run).parameters)
    assert params[:2] == ["quick", "progress"]
    if hasattr(section, "ESTIMATE"):
        (full_lo, full_hi), (quick_lo, quick_hi) = section.ESTIMATE
        assert 0 < quick_lo <= quick_hi and 0 < full_lo <= full_hi and quick_hi <= full_hi
    header = getattr(section, "HEADER", report.HEADER)
    assert len(header) >= 2


def _fake_section(rows):
    calls = []

    def run(quick, progress):
        calls.append(quick)
        progress("step one of the fake section")
        return rows

    return types.SimpleNamespace(__name__="fastdispatch.bench.fake", TITLE="Fake section",
                                 ESTIMATE=((20, 40), (5, 10)), run=run), calls


def test_the_command_estimates_its_time_and_reports_progress(monkeypatch, capsys):
    section, calls = _fake_section([("a measure", "1 ms", "2 ms", "0.50", "<= 1", "met")])
    monkeypatch.setattr(cli, "load_sections", lambda names=None: [section])
    assert cli.main(["--quick"]) == 0
    out, err = capsys.readouterr()
    assert calls == [True]
    assert "estimated time: 5-10 s" in err
    assert "step one of the fake section" in err and "s] " in err
    assert "Fake section" in out and "a measure" in out


def test_a_target_measured_again_says_how_many_runs_met_it():
    group = "e2e: post 10k over 1000 chats"
    first = {(group, "fastdispatch"): 0.030, (group, "threadpool"): 0.060}   # 2.0: missed
    second = {(group, "fastdispatch"): 0.015, (group, "threadpool"): 0.060}  # 4.0: met
    rows = report.ratio_rows(first, include_info=False)
    (row,) = [r for r in rows if r[0] == "e2e post throughput / ThreadPoolExecutor(8)"]
    assert row[3:] == ("2.00", ">= 3", "MISSED")
    assert report.missed_groups(rows) == [group]
    rows = report.ratio_rows(first, include_info=False, retries=[second])
    (row,) = [r for r in rows if r[0] == "e2e post throughput / ThreadPoolExecutor(8)"]
    assert row[3:] == ("4.00", ">= 3", "met (1 of 2 runs)")
    assert report.missed_groups(rows) == []


def test_bench_quick_runs_every_section_and_prints_the_targets():
    proc = subprocess.run(
        [sys.executable, "-m", "fastdispatch", "bench", "--quick", "--retries", "0"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "estimated time:" in proc.stderr
    for section in cli.load_sections():
        assert section.TITLE in proc.stdout
    for label, *_ in report.TARGETS:
        assert label in proc.stdout
    assert "measured again" in proc.stdout    # the note on noise


def test_bench_rejects_bad_arguments():
    for args in (["--retries", "-1"], ["--rounds-scale", "0"], ["--section", "nope"]):
        proc = subprocess.run([sys.executable, "-m", "fastdispatch", "bench", *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "usage:" in proc.stderr, args
