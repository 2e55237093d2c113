"""The documentation's code blocks are tests: every ```python block runs.

pytest's ``testpaths`` include ``README.md`` and ``docs/``; Sybil collects
each ```python block of a Markdown file it visits as one test, and runs a
file's blocks in order in one namespace, as a reader would type them.  A
block that is not meant to run (part of a larger program, or one that needs
a real platform or a bot token) is preceded by a skip comment that says why,
``<!-- skip: next "needs a bot token" -->``, and is reported as skipped with
that reason.  Blocks in other languages (``sh``, ``yaml``, ``promql``, output
shown as plain text) are never run.  The rules for writing such blocks are in
``docs/README.md``.

Sybil was chosen over pytest-markdown-docs, pytest-codeblocks and phmdoctest
(see the commit that added this file): blocks of one file share a namespace
as they do for a reader, a skip carries its reason into pytest's report, an
invisible block can check a result without cluttering the page, and it
collects Markdown only, through this hook, with no flag to pass.
"""

from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(), SkipParser()],
    patterns=["*.md"],
).pytest()
