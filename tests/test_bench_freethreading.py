"""bench/freethreading.py: its child measures, its verdicts read the figures.

The free-threaded comparison is a design benchmark of the repository (it
needs a second interpreter), not part of the package: these tests run from
a checkout and are skipped where ``bench/`` is absent (a copy of ``tests/``
beside an installed wheel).  The figures themselves are not asserted (a
shared machine is noisy); what is tested is that the child that each
interpreter runs really measures on this one (every contender, every round,
the switch counts), that the verdicts compare the right runs against the
right targets, and that without both kinds of interpreter the script says
what it is missing instead of a verdict.
"""

import os
import subprocess
import sys
import sysconfig

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
BENCH_SCRIPT = os.path.join(BENCH, "freethreading.py")
if not os.path.isfile(BENCH_SCRIPT):
    pytest.skip("needs the source checkout's bench/", allow_module_level=True)
sys.path.insert(0, BENCH)
try:
    import freethreading as ft
finally:
    sys.path.remove(BENCH)

FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def test_the_child_measures_every_contender_on_this_interpreter():
    (figures,) = ft.measure([(sys.executable, {})], rounds=2, turns=1)
    assert figures["python"] == sys.executable
    assert figures["free_threaded_build"] is FREE_THREADED
    assert set(figures["per_task"]) == {"floor", "submit-1", "submit-2", "post-1", "post-2"}
    assert all(t > 0 for t in figures["per_task"].values())
    assert set(figures["two_vs_one"]) == {"submit", "post"}
    assert all(n >= 0 for n in figures["switches"].values())


def test_the_script_runs_the_workload_with_the_max_inflight_it_is_given():
    r = subprocess.run([sys.executable, BENCH_SCRIPT, "--python", sys.executable, "--rounds", "1",
                        "--turns", "1", "--max-inflight", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "compiled core, max_inflight=2;" in r.stdout, r.stdout
    if not FREE_THREADED:   # one GIL build named: no verdict, what is missing instead
        assert "(not measured: needs a free-threaded CPython; name one with --python)" in r.stdout
    bad = subprocess.run([sys.executable, BENCH_SCRIPT, "--python", sys.executable,
                          "--max-inflight", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--max-inflight must be at least 1" in bad.stderr


def test_the_child_builds_its_dispatchers_with_the_max_inflight_it_is_given():
    (figures,) = ft.measure([(sys.executable, {})], rounds=1, turns=1, threads=3)
    assert figures["max_inflight"] == [3]


def test_a_child_that_fails_names_the_interpreter():
    with pytest.raises(RuntimeError, match="is fastdispatch installed there"):
        ft._child(sys.executable, {"PYTHONPATH": "", "PYTHONNOUSERSITE": "1",
                                   "FASTDISPATCH_NO_EXTENSIONS": "1"}, 1)


def _figures(build, free_threaded, gil, submit, post, two, switches):
    return {"python": "/x/" + build, "build": build, "free_threaded_build": free_threaded,
            "gil": gil,
            "per_task": {"floor": 1e-6, "submit-1": submit, "submit-2": submit / two,
                         "post-1": post, "post-2": post},
            "two_vs_one": {"submit": two, "post": 1.0},
            "switches": {"submit-1": switches, "post-1": switches}}


def test_the_verdicts_compare_gil_off_with_the_first_gil_build():
    figures = [
        _figures("3.13.5t", True, True, 9e-6, 9e-6, 1.0, 5000),     # GIL on: not compared
        _figures("3.13.5t", True, False, 4e-6, 2e-6, 1.8, 40),
        _figures("3.11.7", False, True, 5e-6, 1e-6, 1.0, 5),
        _figures("3.12.0", False, True, 1e-6, 9e-6, 1.0, 0),        # not the first GIL build
    ]
    rows = {row[0].split(" (")[0]: row for row in ft.rows_for(figures)}
    submit = rows["submit + wait, per task"]
    assert submit[1:] == ("4.00 us", "5.00 us", "0.80x", "<= 1.00x", "met")
    assert rows["submit + wait, per task"][0].endswith("(3.13.5t / 3.11.7)")
    assert rows["post, per task"][3:] == ("2.00x", "<= 1.00x", "MISSED")
    assert rows["2 producers / 1, submit + wait, throughput"][-1] == "met"
    switches = rows["involuntary context switches / 10,000 tasks"]
    assert switches[1:3] == ("40", "5") and switches[-1] == "met"     # 40 <= 10 x 5
    figures[1]["switches"]["submit-1"] = 51
    rows = {row[0]: row for row in ft.rows_for(figures)}
    assert rows["involuntary context switches / 10,000 tasks"][-1] == "MISSED"


def test_without_both_kinds_of_interpreter_the_verdicts_say_what_they_miss():
    gil_only = [_figures("3.11.7", False, True, 5e-6, 1e-6, 1.0, 5)]
    (row,) = ft.rows_for(gil_only)
    assert "not measured: needs a free-threaded CPython;" in row[0] and row[-1] == "(info)"
    ft_only = [_figures("3.13.5t", True, False, 4e-6, 2e-6, 1.8, 40),
               _figures("3.13.5t", True, True, 9e-6, 9e-6, 1.0, 5000)]
    (row,) = ft.rows_for(ft_only)
    assert "not measured: needs a GIL build;" in row[0] and row[-1] == "(info)"
    assert ft.rows_for([])[0][0].startswith("(not measured: needs a free-threaded CPython "
                                            "and a GIL build")


def test_a_free_threaded_interpreter_is_measured_with_the_gil_off_and_on():
    runs = ft.interpreters([sys.executable])
    if FREE_THREADED:
        assert runs == [(sys.executable, {"PYTHON_GIL": "0"}), (sys.executable, {"PYTHON_GIL": "1"})]
    else:
        assert runs == [(sys.executable, {})]
