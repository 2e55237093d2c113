"""The design benchmarks of this directory: collect ``bench_*.py``.

    python -m pytest bench/ --benchmark-only

These measure the data structures the core was built on against the
alternatives (``bench_deadlines.py``, ``bench_wakeups.py``); the suite that
measures fastdispatch itself ships with the package
(``python -m pytest --pyargs fastdispatch.bench.suite``).
"""

import pytest


def pytest_collect_file(file_path, parent):
    if (file_path.suffix == ".py" and file_path.name.startswith("bench_")
            and not parent.session.isinitpath(file_path)):
        return pytest.Module.from_parent(parent, path=file_path)
    return None
