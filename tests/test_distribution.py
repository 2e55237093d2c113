"""What a user gets from the sdist and the wheel: links that lead somewhere, a benchmark suite.

- README.md's links are relative: in a clone and in the sdist they lead to
  the files beside it, and the sdist carries each of them.  On the package
  index the text stands alone, so the long description (built by setup.py)
  points each link at the same file in the repository at this version's tag.
- The pytest-benchmark suite ships in the package: from an installed wheel,
  in a directory that is not the source tree, ``pytest --pyargs
  fastdispatch.bench.suite`` collects every module, saves a run and compares
  the next one with it.

A copy of the checkout is built with ``python -m build`` (the sdist, then
the wheel from the sdist, as a release is) without the C extension, so that
nothing is compiled; the wheel is installed with the ``bench`` extra into a
fresh virtual environment.  Builds and installs from the package index:
about a minute.
"""

import email
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPOSITORY = "https://github.com/fastdispatch/fastdispatch"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# What MANIFEST.in puts in the sdist, copied so that the build happens
# outside the checkout (no build/ or egg-info left in it).
SDIST_INPUTS = ("setup.py", "pyproject.toml", "README.md", "MANIFEST.in", "conftest.py",
                "src", "tests", "docs", "examples", "bench", "tools")


def _needs_checkout():
    if not os.path.exists(os.path.join(ROOT, "setup.py")):
        pytest.skip("needs the source checkout (setup.py)")


def _version():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        return re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)


def _relative(target):
    return not re.match(r"[a-z][a-z0-9+.-]*:|#", target)


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """{"sdist": path, "wheel": path}, built from a copy of the checkout."""
    _needs_checkout()
    pytest.importorskip("build")
    src = tmp_path_factory.mktemp("checkout")
    ignore = shutil.ignore_patterns("*.c", "*.so", "*.pyd", "__pycache__", "*.egg-info",
                                    "build", ".venv*", ".benchmarks")
    for name in SDIST_INPUTS:
        path = os.path.join(ROOT, name)
        if os.path.isdir(path):
            shutil.copytree(path, str(src / name), ignore=ignore)
        elif os.path.exists(path):
            shutil.copy(path, str(src / name))
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, FASTDISPATCH_NO_EXTENSIONS="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("FASTDISPATCH_REQUIRE_EXTENSIONS", None)
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(src)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (sdist,) = out.glob("fastdispatch-*.tar.gz")
    (wheel,) = out.glob("fastdispatch-*.whl")
    return {"sdist": sdist, "wheel": wheel}


def _readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_readme_links_to_this_project_are_relative_and_lead_to_its_files():
    _needs_checkout()
    text = _readme()
    for target in LINK.findall(text):
        assert not target.startswith(REPOSITORY), (
            "%s: link to the file itself (a relative link works in a clone, in the sdist "
            "and, rewritten by setup.py, on the package index)" % target)
        if _relative(target):
            path = target.split("#", 1)[0]
            assert os.path.exists(os.path.join(ROOT, path)), target


def test_the_sdist_carries_the_readme_and_every_file_it_links_to(dist):
    with tarfile.open(str(dist["sdist"])) as tar:
        names = tar.getnames()
        top = names[0].split("/", 1)[0]
        readme = tar.extractfile("%s/README.md" % top).read().decode("utf-8")
    assert readme == _readme()
    targets = [t.split("#", 1)[0] for t in LINK.findall(readme) if _relative(t)]
    assert targets, "README.md links to no file of the project"
    # A link to a folder ("examples/") is the folder's entry in the archive.
    missing = [t for t in targets if "%s/%s" % (top, t.rstrip("/")) not in names]
    assert not missing, "the sdist lacks what README.md links to: %s" % missing


def _index_links(description):
    version = _version()
    links = LINK.findall(description)
    assert links
    relative = [t for t in links if _relative(t)]
    assert not relative, "relative links on the package index lead nowhere: %s" % relative
    for target in links:
        for base in ("%s/blob/v%s/" % (REPOSITORY, version),
                     "https://raw.githubusercontent.com/fastdispatch/fastdispatch/v%s/" % version):
            if target.startswith(base):
                path = target[len(base):].split("#", 1)[0]
                assert os.path.exists(os.path.join(ROOT, path)), target
                break
        else:
            assert not target.startswith(REPOSITORY), (
                "%s: not at the tag of version %s" % (target, version))


def test_the_index_page_links_each_file_at_this_versions_tag(dist):
    with tarfile.open(str(dist["sdist"])) as tar:
        top = tar.getnames()[0].split("/", 1)[0]
        pkg_info = email.message_from_bytes(tar.extractfile("%s/PKG-INFO" % top).read())
    with zipfile.ZipFile(str(dist["wheel"])) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(zf.read(name))
    for meta in (pkg_info, metadata):
        assert meta["Description-Content-Type"] == "text/markdown"
        description = meta.get_payload()
        assert "## In 30 seconds" in description and "pip install fastdispatch" in description
        _index_links(description)


def test_the_benchmark_suite_runs_from_an_installed_wheel_outside_the_source_tree(
        dist, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    if not python.exists():
        python = venv / "Scripts" / "python.exe"
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    for name in ("PYTHONPATH", "FASTDISPATCH_NO_EXTENSIONS"):
        env.pop(name, None)
    proc = subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                           "%s[bench]" % dist["wheel"]],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    work = tmp_path / "elsewhere"        # no checkout, no pytest settings here
    work.mkdir()
    store = tmp_path / "saved"

    def pytest_(*args):
        return subprocess.run([str(python), "-m", "pytest", "-p", "no:cacheprovider",
                               "--pyargs", "fastdispatch.bench.suite", *args],
                              cwd=str(work), env=env, capture_output=True, text=True,
                              timeout=600)

    where = subprocess.run([str(python), "-c", "import fastdispatch.bench.suite as s; "
                            "print(s.__file__)"], cwd=str(work), env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(venv)) and not where.startswith(ROOT), where

    listed = pytest_("--collect-only", "-q", "-rs")
    assert listed.returncode == 0, listed.stdout[-3000:] + listed.stderr[-2000:]
    for module in ("bench_dispatcher", "bench_context", "bench_pacing"):
        assert "%s.py::" % module in listed.stdout, (module, listed.stdout[-3000:])
    # The benchmarks of extras not installed are there, and say what they need.
    assert "prometheus_client" in listed.stdout and "urllib3" in listed.stdout, \
        listed.stdout[-2000:]

    subset = ("-k", "create_context or ring and fastdispatch-py")
    first = pytest_(*subset, "--benchmark-only", "--benchmark-save=before",
                    "--benchmark-storage=file://%s" % store)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert "2 passed" in first.stdout, first.stdout[-2000:]
    assert list(store.rglob("0001_before.json")), sorted(store.rglob("*"))
    second = pytest_(*subset, "--benchmark-only", "--benchmark-compare",
                     "--benchmark-storage=file://%s" % store)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    assert "0001_before" in second.stdout and "(NOW)" in second.stdout, second.stdout[-3000:]
