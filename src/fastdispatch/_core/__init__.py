"""The dispatcher core's rooms, each in two languages.

``<room>.py`` is the pure-Python room, imported by ``_core_py.py``, and its
docstring explains the room; ``<room>.pxi`` is the same room for the
compiled core, included by ``_ringbuf.pyx``.  ``c_support.pxi`` (atomics,
locks and the free-threaded hand-back, in C) and ``histogram.pxi`` (the
latency histogram the compiled core records into from C) have no twin.
Nothing here is public: ``fastdispatch`` exports what users import.
"""
