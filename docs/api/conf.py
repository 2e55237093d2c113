"""Sphinx configuration: the API reference, generated from the docstrings.

Build it (the ``docs`` extra installs Sphinx)::

    pip install '.[docs,telegram,discord,cluster,prometheus,otel]'
    python -m sphinx -W --keep-going -b html docs/api docs/api/_build

``-W`` turns every warning into an error: a docstring that does not parse,
a reference to a name that does not exist, a page outside the table of
contents.  The guides are the Markdown pages beside this directory.
"""

import fastdispatch

project = "fastdispatch"
author = "the fastdispatch authors"
copyright = "the fastdispatch authors"
release = fastdispatch.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",     # the reference, from the docstrings
    "sphinx.ext.napoleon",    # Google-style "Args:" sections where docstrings use them
    "sphinx.ext.viewcode",    # a link from each entry to its source
]

autodoc_default_options = {
    "members": True,
    "undoc-members": False,
    "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_typehints = "description"
autodoc_class_signature = "mixed"
# The docstrings write ``code`` in double backquotes (reST literals) and
# name other objects with :class: and :meth:.
default_role = "literal"
nitpicky = False

exclude_patterns = ["_build"]
html_theme = "alabaster"
html_title = "fastdispatch %s API reference" % release
