"""docs/guarantees.md names the tests that prove each guarantee: they exist.

The page is where code, docs and tests point for what fastdispatch promises
(``G1``...``Gn``).  A test renamed or removed without the page following
would leave a guarantee pointing at nothing: this test fails then.  It reads
the test files' syntax trees (nothing is imported or run).
"""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "guarantees.md")
NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
HEADING = re.compile(r"^\*\*G(\d+)\. ", re.M)


def _page():
    if not os.path.exists(PAGE):
        pytest.skip("needs the source checkout (docs/guarantees.md)")
    with open(PAGE, encoding="utf-8") as f:
        return f.read()


def _test_names(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.startswith("test_")}


def test_every_test_the_guarantees_page_names_exists():
    text = _page()
    named = NAMED.findall(text)
    assert len(named) > 50, "the page names its tests as `tests/file.py::test_name`"
    names = {}
    missing = []
    for path, name in named:
        if not os.path.exists(os.path.join(ROOT, path)):
            missing.append("%s (no such file)" % path)
            continue
        if path not in names:
            names[path] = _test_names(path)
        if name not in names[path]:
            missing.append("%s::%s" % (path, name))
    assert not missing, "docs/guarantees.md names tests that do not exist: %s" % missing


def test_guarantees_are_numbered_in_order_and_each_has_its_proof():
    text = _page()
    numbers = [int(n) for n in HEADING.findall(text)]
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    sections = HEADING.split(text)[1:]
    for number, body in zip(sections[0::2], sections[1::2]):
        assert "Kept by:" in body and "Proved by:" in body, "G%s" % number
        assert NAMED.search(body), "G%s names no test" % number


def test_every_room_the_guarantees_page_names_exists_in_both_cores():
    text = _page()
    rooms = set(re.findall(r"`_core/(\w+)`", text))
    assert len(rooms) >= 8, "the page names the core's rooms as `_core/<room>`"
    core = os.path.join(ROOT, "src", "fastdispatch", "_core")
    missing = ["_core/%s.%s" % (room, ext) for room in sorted(rooms) for ext in ("py", "pxi")
               if not os.path.exists(os.path.join(core, "%s.%s" % (room, ext)))]
    assert not missing, "docs/guarantees.md names rooms that do not exist: %s" % missing
