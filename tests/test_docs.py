"""The documentation's code blocks run: the mechanism, and the rules it relies on.

The blocks themselves are run by Sybil (``conftest.py`` at the top of the
repository; pytest's ``testpaths`` include ``README.md`` and ``docs``).
These tests make sure that mechanism cannot quietly stop working: a page
added to ``docs/`` is picked up and a broken block fails; a Python block
under a language tag Sybil does not run (```` ```py ````) is refused; a skip
says why.  The rules are written down in ``docs/README.md``.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^[ \t]*(```+|~~~+)[ \t]*([^\n`]*)$", re.M)
# Languages shown but never run; "python" runs; "" is output or a diagram.
NOT_RUN = {"", "sh", "bash", "console", "yaml", "promql", "json", "text", "ini", "toml"}
SKIP = re.compile(r"^[ \t]*<!--+\s*skip:\s*(\w+)(.*?)-->", re.M)


def _pages():
    pages = [os.path.join(ROOT, "README.md")]
    docs = os.path.join(ROOT, "docs")
    if os.path.isdir(docs):
        pages += sorted(os.path.join(docs, name) for name in os.listdir(docs)
                        if name.endswith(".md"))
    return [page for page in pages if os.path.exists(page)]


def _needs_checkout():
    if not os.path.exists(os.path.join(ROOT, "conftest.py")) or not os.path.isdir(
            os.path.join(ROOT, "docs")):
        pytest.skip("needs the source checkout (conftest.py, docs/)")


def _fences(text):
    """(line, info string) of each opening fence."""
    opened = None
    for match in FENCE.finditer(text):
        if opened is None:
            opened = match.group(1)
            yield text.count("\n", 0, match.start()) + 1, match.group(2).strip()
        elif match.group(1)[0] == opened[0] and len(match.group(1)) >= len(opened) \
                and not match.group(2).strip():
            opened = None


def test_every_code_block_is_python_that_runs_or_a_language_that_is_not_run():
    _needs_checkout()
    wrong = []
    for page in _pages():
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for line, info in _fences(text):
            language = info.split()[0] if info else ""
            if language != "python" and language not in NOT_RUN:
                wrong.append("%s:%d: ```%s" % (os.path.relpath(page, ROOT), line, info))
            elif language == "python" and info != "python":
                wrong.append("%s:%d: ```%s (the words after python hide it from the suite)"
                             % (os.path.relpath(page, ROOT), line, info))
    assert not wrong, ("blocks the suite would not run: write ```python (runs) or a "
                       "language of %s (see docs/README.md):\n%s"
                       % (sorted(NOT_RUN - {""}), "\n".join(wrong)))


def test_every_skipped_block_says_why():
    _needs_checkout()
    bare = []
    for page in _pages():
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for match in SKIP.finditer(text):
            action, reason = match.group(1), match.group(2).strip()
            # "why", or a condition with its reason: if(cond, reason="why")
            if action in ("next", "start") and not re.fullmatch(
                    r'"[^"]+"|if\(.+,\s*reason="[^"]+"\)', reason):
                bare.append("%s:%d: %s" % (os.path.relpath(page, ROOT),
                                           text.count("\n", 0, match.start()) + 1,
                                           match.group(0)))
    assert not bare, 'write <!-- skip: next "why" -->:\n' + "\n".join(bare)


def test_the_test_run_includes_the_readme_and_every_page_of_docs():
    _needs_checkout()
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        found = re.search(r"^testpaths = \[([^\]]*)\]", f.read(), re.M)
    assert found, "pyproject.toml has no testpaths"
    testpaths = re.findall(r'"([^"]+)"', found.group(1))
    assert "README.md" in testpaths and "docs" in testpaths, testpaths


NEW_PAGE = '''# A page added later

```python
import fastdispatch
answer = 42
```

<!-- skip: next "a sketch" -->

```python
this_name_is_not_defined()
```

```python
assert answer == 41, "the page is wrong"
```

```sh
exit 1
```
'''


def test_a_page_added_to_docs_is_run_and_a_broken_block_fails(tmp_path):
    # A copy of the collection set-up (conftest.py, pyproject.toml's pytest
    # settings) with one new page in docs/: pytest, run as the README's test
    # command runs it (no arguments), must find the page, run its blocks in
    # one namespace, skip the marked one with its reason, and fail on the
    # broken one, naming the page and the line.
    _needs_checkout()
    shutil.copy(os.path.join(ROOT, "conftest.py"), tmp_path / "conftest.py")
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path / "pyproject.toml")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "new.md").write_text(NEW_PAGE)
    (tmp_path / "README.md").write_text("# Nothing to run\n\n```sh\nexit 1\n```\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider"],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    # (the skip comment is an item of its own, and passes)
    assert "1 failed, 2 passed, 1 skipped" in out, out
    assert "docs/new.md:15: AssertionError" in out and "the page is wrong" in out, out
    assert "a sketch" in out, out


# The extra a module of the package needs beyond fastdispatch itself.
EXTRA_OF = {"fastdispatch.telegram": "telegram", "fastdispatch.discord": "discord",
            "fastdispatch.cluster": "cluster", "fastdispatch.metrics": "prometheus",
            "fastdispatch.onebot": "onebot", "fastdispatch.qq": "qq",
            "fastdispatch.integrations.nonebot": "nonebot"}
PY_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```", re.M | re.S)


def test_a_page_says_which_extra_its_first_example_needs_before_showing_it():
    # A reader copies the first example of a page: the page says beforehand
    # which extra that example needs (e.g. pip install 'fastdispatch[telegram]').
    missing = []
    for page in _pages():
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for module, extra in EXTRA_OF.items():
            uses = re.compile(r"^\s*(from %s\b|import %s\b)" % (re.escape(module),
                                                                 re.escape(module)), re.M)
            first = next((m for m in PY_BLOCK.finditer(text) if uses.search(m.group(1))), None)
            if first is not None and "[%s" % extra not in text[:first.start()] \
                    and ",%s" % extra not in text[:first.start()]:
                missing.append("%s: %s (needs [%s])" % (os.path.basename(page), module, extra))
    assert not missing, missing


def test_examples_are_plain_code():
    # What a reader copies must read as code a person writes: no dead
    # branches, no inline __import__.
    tricks = re.compile(r"if False else|__import__\(")
    found = ["%s: %s" % (os.path.basename(page), m.group(0))
             for page in _pages() for m in tricks.finditer(open(page, encoding="utf-8").read())]
    assert not found, found


def test_the_api_reference_builds_without_a_warning(tmp_path):
    # docs/api: Sphinx autodoc over the installed package, as Read the Docs
    # and the GitHub workflow build it; a docstring that does not parse, a
    # duplicate entry, a page left out of the contents all fail here.
    _needs_checkout()
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), os.path.join(ROOT, "docs", "api"),
         str(tmp_path / "html")],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    with open(tmp_path / "html" / "dispatcher.html", encoding="utf-8") as f:
        page = f.read()
    for name in ("OutboundDispatcher.submit", "OutboundDispatcher.post",
                 "OutboundDispatcher.shutdown", "SendContext", "RetryAfter"):
        assert 'id="fastdispatch.%s"' % name in page, name


def test_the_readme_is_a_page_for_users_first():
    # The README is the package index's page: what it is and how to install
    # it come before how to develop it; the two development commands and
    # CI's use of the test command stay exactly as they are.
    _needs_checkout()
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    install = text.index("pip install fastdispatch")
    assert install < text.index("tools/dev.sh") and install < text.index("```python")
    for command in ("bash tools/dev.sh demo", "bash tools/dev.sh test"):
        assert re.search(r"^%s\b" % re.escape(command), text, re.M), command
    assert "docs/bots.md" in text and "docs/api/index.rst" in text
    assert "on both cores" not in text     # read as two CPU cores: say what it means
    assert "VENV=" in text and "PYTHON=" in text and "minutes" in text.split("bash tools/dev.sh test")[1][:200]
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    assert re.search(r"^bash tools/dev.sh test$", ci, re.M)
