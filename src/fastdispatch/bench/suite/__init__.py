"""The pytest-benchmark suite, shipped with the package: measure, save, compare.

Run it from anywhere, against the installed fastdispatch (it needs
``pip install 'fastdispatch[bench]'``: pytest and pytest-benchmark)::

    python -m pytest --pyargs fastdispatch.bench.suite --benchmark-only

To tell whether a new version of fastdispatch is slower than the one you run
(the recipe of docs/performance.md), compare the module that measures
fastdispatch alone, in CPU time (:mod:`.bench_compare`)::

    python -m pytest --pyargs fastdispatch.bench.suite.bench_compare --benchmark-save=before
    pip install 'fastdispatch==NEW'
    python -m pytest --pyargs fastdispatch.bench.suite.bench_compare \
        --benchmark-compare --benchmark-compare-fail=min:15%

pytest-benchmark keeps the saved runs in ``.benchmarks/`` of the current
directory (``--benchmark-storage`` to put them elsewhere).  The other
modules put fastdispatch beside its baselines (a bare ``Future``,
``ThreadPoolExecutor``, a naive per-chat dispatcher), one group per
workload, and print the ratios against the targets at the end of the run:
read them as ratios within one run; they are not made for
``--benchmark-compare-fail``, whose check would also gate the baselines.
One module per subject (``bench_dispatcher``, ``bench_context``,
``bench_metrics``, ``bench_pacing``, ``bench_telegram``, ``bench_compare``);
``--pyargs fastdispatch.bench.suite.bench_context`` runs one.  The
benchmarks of an extra that is not installed (``prometheus``, ``telegram``)
are skipped.  The workloads are those of ``python -m fastdispatch bench``
(:mod:`fastdispatch.bench.scenarios`); ``conftest.py`` collects the
``bench_*.py`` modules and prints the ratio table at the end of the run.
"""
