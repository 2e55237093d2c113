"""The pytest-benchmark suite, shipped with the package: measure, save, compare.

Run it from anywhere, against the installed fastdispatch (it needs
``pip install 'fastdispatch[bench]'``: pytest and pytest-benchmark)::

    python -m pytest --pyargs fastdispatch.bench.suite --benchmark-only --benchmark-save=before
    pip install --upgrade fastdispatch
    python -m pytest --pyargs fastdispatch.bench.suite --benchmark-only --benchmark-compare

pytest-benchmark keeps the saved runs in ``.benchmarks/`` of the current
directory (``--benchmark-storage`` to put them elsewhere) and
``--benchmark-compare`` (the latest saved run, or ``=NNNN``) prints each
benchmark beside it; ``--benchmark-compare-fail=median:10%`` makes a
slowdown fail the run.  One module per subject (``bench_dispatcher``,
``bench_context``, ``bench_metrics``, ``bench_pacing``, ``bench_telegram``);
``--pyargs fastdispatch.bench.suite.bench_context`` runs one.  The
benchmarks of an extra that is not installed (``prometheus``, ``telegram``)
are skipped.  The workloads are those of ``python -m fastdispatch bench``
(:mod:`fastdispatch.bench.scenarios`); ``conftest.py`` collects the
``bench_*.py`` modules and prints the ratio table at the end of the run.
"""
