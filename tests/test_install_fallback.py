"""An install without a working compiler never ships a compiled core it did not build,
and no build ships a module that the sources no longer have.

A checkout reinstalled with pip builds in place, in ``build/``.  After a
build with a compiler, ``build/`` holds a compiled ``_ringbuf``; a later
install with ``CC=false`` used to print the fallback warning and still copy
that old binary into the wheel (``IMPLEMENTATION == "cython"`` with stale
code).  Here a fake "old" binary is planted where setuptools puts the
extension, newer than every source so that an "up to date" check would keep
it, and a wheel is built with ``CC=false``.

Builds a wheel with pip (isolated build environment from the package index):
about 20 seconds.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _copy_checkout(dest):
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        if os.path.exists(os.path.join(ROOT, name)):
            shutil.copy(os.path.join(ROOT, name), dest / name)
    shutil.copytree(os.path.join(ROOT, "src"), dest / "src",
                    ignore=shutil.ignore_patterns("*.c", "*.so", "*.pyd", "__pycache__"))


def test_compiler_failure_never_ships_an_old_compiled_core(tmp_path):
    if not os.path.exists(os.path.join(ROOT, "setup.py")):
        pytest.skip("needs the source checkout (setup.py)")
    if sys.platform == "win32":
        pytest.skip("CC=false does not stop MSVC")
    src = tmp_path / "checkout"
    src.mkdir()
    _copy_checkout(src)
    # Where setuptools builds the extension: build/lib.<platform>-<cache tag>/
    # (with a "t" after the tag on a free-threaded build).
    build_lib = src / "build" / ("lib.%s-%s%s" % (
        sysconfig.get_platform(), sys.implementation.cache_tag,
        "t" if sysconfig.get_config_var("Py_GIL_DISABLED") else ""))
    stale = build_lib / "fastdispatch" / ("_ringbuf" + sysconfig.get_config_var("EXT_SUFFIX"))
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an extension compiled by an earlier build")
    future = 4102444800   # 2100-01-01: newer than every source
    os.utime(stale, (future, future))
    # And a module an earlier build copied that the sources no longer have.
    removed = build_lib / "fastdispatch" / "_renamed_since.py"
    removed.write_text("raise ImportError('a module from an earlier build')\n")

    env = dict(os.environ, CC="false", CXX="false", PIP_DISABLE_PIP_VERSION_CHECK="1")
    for name in ("FASTDISPATCH_REQUIRE_EXTENSIONS", "FASTDISPATCH_NO_EXTENSIONS"):
        env.pop(name, None)
    wheels = tmp_path / "wheels"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(wheels), "."],
        cwd=str(src), env=env, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]

    # The build really used the directory where the old binary was planted.
    assert (build_lib / "fastdispatch" / "__init__.py").exists(), sorted(
        p.name for p in (src / "build").iterdir())
    assert "installing the pure-Python implementation instead" in output
    (wheel,) = wheels.glob("fastdispatch-*.whl")
    with zipfile.ZipFile(str(wheel)) as zf:
        names = zf.namelist()
    assert "fastdispatch/_core_py.py" in names
    assert "fastdispatch/_renamed_since.py" not in names
    assert [n for n in names if "_ringbuf" in n and n.endswith((".so", ".pyd"))] == []
    assert not stale.exists()
