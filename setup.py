"""Build script: compiles the dispatcher core when a C compiler is available.

``pip install .`` compiles ``src/fastdispatch/_ringbuf.pyx``.  If Cython or
the compiler is missing or fails, the package is installed without the
extension and ``fastdispatch`` runs on its pure-Python twin (one warning is
printed).  ``FASTDISPATCH_NO_EXTENSIONS=1`` skips the build on purpose;
``FASTDISPATCH_REQUIRE_EXTENSIONS=1`` turns a failed build into an error.
"""

import os
import re
import shutil
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py


def _flag(name):
    return os.environ.get(name, "") not in ("", "0")


class OptionalBuildExt(build_ext):
    """build_ext that falls back to pure Python instead of failing the install.

    It never ships an extension that this build did not compile: whatever an
    earlier build left in ``build/`` (a checkout reinstalled with pip builds
    in place) is removed before compiling, so neither a failed compile nor
    setuptools' "up to date" check can fall back onto an old binary.
    """

    def run(self):
        for ext in self.extensions:
            self._remove_output(ext)
        try:
            super().run()
        except Exception as exc:  # no compiler, no headers, ...
            for ext in self.extensions:
                self._remove_output(ext)
            self._fallback(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._remove_output(ext)
            self._fallback(exc)

    def _remove_output(self, ext):
        path = self.get_ext_fullpath(ext.name)
        if os.path.exists(path):
            os.remove(path)

    def _fallback(self, exc):
        if _flag("FASTDISPATCH_REQUIRE_EXTENSIONS"):
            raise exc
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if len(reason) > 120:
            reason = type(exc).__name__ + ": " + reason[:100] + "..."
        sys.stderr.write(
            "\nWARNING: fastdispatch could not compile its C extension (%s); "
            "installing the pure-Python implementation instead.\n\n" % (reason,))


class FreshBuildPy(build_py):
    """build_py that starts from an empty ``build/lib*/fastdispatch``.

    setuptools copies the package into ``build/`` but never removes what is
    no longer in the sources: a module deleted or renamed since an earlier
    build in the same checkout would still be copied into the wheel.
    """

    def run(self):
        stale = os.path.join(self.build_lib, "fastdispatch")
        if os.path.isdir(stale):
            shutil.rmtree(stale)
        super().run()


def _extensions():
    if _flag("FASTDISPATCH_NO_EXTENSIONS"):
        return []
    macros = []
    if _flag("CYTHON_TRACE"):
        macros.append(("CYTHON_TRACE_NOGIL", "1"))
    try:
        from Cython.Build import cythonize
    except ImportError:
        if _flag("FASTDISPATCH_REQUIRE_EXTENSIONS"):
            raise
        sys.stderr.write("\nWARNING: Cython is not available; installing the "
                         "pure-Python implementation of fastdispatch.\n\n")
        return []
    ext = Extension("fastdispatch._ringbuf", ["src/fastdispatch/_ringbuf.pyx"],
                    define_macros=macros)
    return cythonize([ext], compiler_directives={"language_level": "3"}, quiet=True)


REPOSITORY = "https://github.com/fastdispatch/fastdispatch"


def _readme_for_the_index():
    """README.md for the package's long description, its relative links made absolute.

    In a clone and in the sdist, README.md's links are relative and lead to
    the files beside it (docs/, examples/).  The package index shows the
    text alone, where a relative link leads nowhere: there, each one points
    at the same file in the repository at this version's tag (``v0.1.0``;
    releases are built from ``v*`` tags), images at their raw content.
    """
    with open("README.md", encoding="utf-8") as f:
        text = f.read()
    with open("pyproject.toml", encoding="utf-8") as f:
        version = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)

    def absolute(match):
        bang, label, target = match.groups()
        if bang:
            base = "https://raw.githubusercontent.com/fastdispatch/fastdispatch/v%s/" % version
        else:
            base = "%s/blob/v%s/" % (REPOSITORY, version)
        return "%s[%s](%s%s)" % (bang, label, base, target)

    return re.sub(r"(!?)\[([^\]]*)\]\((?![a-z][a-z0-9+.-]*:|#)([^)\s]+)\)", absolute, text)


setup(ext_modules=_extensions(),
      long_description=_readme_for_the_index(),
      long_description_content_type="text/markdown",
      cmdclass={"build_ext": OptionalBuildExt, "build_py": FreshBuildPy})
