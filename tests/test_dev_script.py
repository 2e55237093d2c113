"""``tools/dev.sh`` compiles only when what the build reads changed, and says so.

Runs the script on a copy of the checkout with its own virtual environment:
the first call builds, a second one with nothing changed does not, a command
that needs more extras installs their dependencies without compiling the
package again, and a change to a source file builds again.  The demo
installs no test extras.  Two builds of the package and one install of the
test extras: about three minutes on two cores.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig

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


def _compiled_core(venv_python):
    """(path, size, mtime_ns, inode) of the installed compiled core."""
    out = subprocess.run(
        [str(venv_python), "-c", "import os, fastdispatch._ringbuf as m; st = os.stat(m.__file__); "
         "print(m.__file__, st.st_size, st.st_mtime_ns, st.st_ino)"],
        capture_output=True, text=True, check=True).stdout.split()
    return out[0], int(out[1]), int(out[2]), int(out[3])


def test_dev_script_compiles_only_when_the_sources_changed(tmp_path):
    if not os.path.exists(os.path.join(ROOT, "tools", "dev.sh")) or shutil.which("bash") is None:
        pytest.skip("needs the source checkout and bash")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    _copy_checkout(checkout)

    first = _dev(checkout, "demo", "--help")
    assert "building fastdispatch" in first and "first build" in first
    assert "compiling the C core" in first

    second = _dev(checkout, "demo", "--help")
    assert "building" not in second and "up to date" in second

    # The demo installed the package without the test extras.
    venv_python = checkout / "venv" / "bin" / "python"
    if not venv_python.exists():
        venv_python = checkout / "venv" / "Scripts" / "python.exe"
    probe = subprocess.run([str(venv_python), "-c", "import pytest"], capture_output=True)
    assert probe.returncode != 0, "the demo installed the test extras"
    core = _compiled_core(venv_python)

    if sysconfig.get_config_var("Py_GIL_DISABLED") and importlib.util.find_spec("nacl") is None:
        # `test` installs the [discord] extra: PyNaCl (cffi) has no wheel for
        # this free-threaded CPython; `dev.sh freethreaded` leaves it out.
        pytest.skip("dev.sh test needs PyNaCl, which has no wheel for this interpreter")

    # `test` after `demo`: the test extras are missing, the sources are not
    # changed.  Only the extras' dependencies are installed; the package is
    # not built again (it used to be: a minute of compiling).
    third = _dev(checkout, "test", "--version")    # pytest --version: needs no tests
    assert "compiling" not in third and "building" not in third, third
    assert "nothing is compiled" in third and "[test," in third
    assert _compiled_core(venv_python) == core, "the compiled core was installed again"
    subprocess.run([str(venv_python), "-c", "import pytest, pytest_benchmark"], check=True)

    fourth = _dev(checkout, "demo", "--help")      # every extra it needs is there
    assert "up to date" in fourth and "nothing is compiled" not in fourth
    assert _compiled_core(venv_python) == core

    with open(checkout / "src" / "fastdispatch" / "_errors.py", "a") as f:
        f.write("\n# a change\n")
    fifth = _dev(checkout, "demo", "--help")
    assert "building fastdispatch" in fifth and "sources changed" in fifth
    assert "compiling the C core" in fifth


def _interpreter_other_than(python):
    """Another CPython of this machine (3.9 to 3.13), or None."""
    mine = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"],
                          capture_output=True, text=True).stdout
    import glob
    candidates = [shutil.which("python3.%d" % minor) for minor in (12, 11, 13, 10, 9)]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3.*[0-9]")))
    for other in candidates:
        if other and subprocess.run(
                [other, "-c", "import sys; print(sys.version_info[:2])"],
                capture_output=True, text=True).stdout not in ("", mine):
            return other
    return None


def test_dev_script_honours_python_once_a_venv_exists(tmp_path):
    # .venv made with one interpreter, then PYTHON names another: the script
    # uses (and makes) a venv of that interpreter, .venv-X.Y, and says so; an
    # explicit VENV of another interpreter is made again, saying so.
    if not os.path.exists(os.path.join(ROOT, "tools", "dev.sh")) or shutil.which("bash") is None:
        pytest.skip("needs the source checkout and bash")
    other = _interpreter_other_than(sys.executable)
    if other is None:
        pytest.skip("needs a second CPython on PATH (python3.9 ... python3.13)")
    checkout = tmp_path / "checkout"
    (checkout / "tools").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "tools", "dev.sh"), checkout / "tools" / "dev.sh")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(checkout / ".venv")],
                   check=True)
    # PIP_NO_INDEX: the venv's own pip stays (no download to upgrade it).
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1")
    env.pop("VENV", None)

    def run(**extra):
        proc = subprocess.run(["bash", "tools/dev.sh", "venv"], cwd=str(checkout),
                              env=dict(env, **extra), capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
        version = subprocess.run([os.path.join(str(checkout), proc.stdout.strip()), "-c",
                                  "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        return proc, version

    other_version = subprocess.run([other, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    proc, version = run(PYTHON=other)
    assert version == other_version
    assert proc.stdout.strip().startswith(".venv-%s/" % other_version)
    assert "uses .venv-%s" % other_version in proc.stderr and "VENV=" in proc.stderr
    proc, version = run(PYTHON=sys.executable)          # .venv's own: .venv itself
    assert proc.stdout.strip().startswith(".venv/")
    proc, version = run(PYTHON=other, VENV=".venv")      # asked for by name: made again
    assert version == other_version and proc.stdout.strip().startswith(".venv/")
    assert "making .venv again" in proc.stderr
