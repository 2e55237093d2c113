"""``tools/dev.sh`` builds only when what the build reads changed, and says so.

Runs the script on a copy of the checkout with its own virtual environment:
the first call builds, a second one with nothing changed does not, and a
change to a source file builds again.  The demo installs no test extras.
Two builds of the package: about a minute on two cores.
"""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _copy_checkout(dest):
    for name in ("setup.py", "pyproject.toml", "README.md", "MANIFEST.in"):
        if os.path.exists(os.path.join(ROOT, name)):
            shutil.copy(os.path.join(ROOT, name), dest / name)
    ignore = shutil.ignore_patterns("*.c", "*.so", "*.pyd", "__pycache__", "*.egg-info")
    shutil.copytree(os.path.join(ROOT, "src"), dest / "src", ignore=ignore)
    shutil.copytree(os.path.join(ROOT, "tools"), dest / "tools", ignore=ignore)


def _dev(checkout, *args):
    env = dict(os.environ, VENV=str(checkout / "venv"), PYTHON=sys.executable,
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("FASTDISPATCH_NO_EXTENSIONS", None)
    proc = subprocess.run(["bash", "tools/dev.sh", *args], cwd=str(checkout), env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stderr


def test_dev_script_builds_only_when_the_sources_changed(tmp_path):
    if not os.path.exists(os.path.join(ROOT, "tools", "dev.sh")) or shutil.which("bash") is None:
        pytest.skip("needs the source checkout and bash")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    _copy_checkout(checkout)

    first = _dev(checkout, "demo", "--help")
    assert "building fastdispatch" in first and "first build" in first

    second = _dev(checkout, "demo", "--help")
    assert "building" not in second and "up to date" in second

    # The demo installed the package without the test extras.
    venv_python = checkout / "venv" / "bin" / "python"
    if not venv_python.exists():
        venv_python = checkout / "venv" / "Scripts" / "python.exe"
    probe = subprocess.run([str(venv_python), "-c", "import pytest"], capture_output=True)
    assert probe.returncode != 0, "the demo installed the test extras"

    with open(checkout / "src" / "fastdispatch" / "_errors.py", "a") as f:
        f.write("\n# a change\n")
    third = _dev(checkout, "demo", "--help")
    assert "building fastdispatch" in third and "sources changed" in third
