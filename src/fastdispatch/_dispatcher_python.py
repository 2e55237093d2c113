"""``OutboundDispatcher`` on the pure-Python core (``_core_py``): the class
``fastdispatch`` exports when the extension is not built or
``FASTDISPATCH_NO_EXTENSIONS`` is set.

Its twin on the compiled core is ``_dispatcher_cython.py``; what both are
made of is in ``_dispatcher.py``.
"""

from ._core_py import DispatcherCore
from ._dispatcher import _DOCSTRING, _Lifecycle

__all__ = ["OutboundDispatcher"]


class OutboundDispatcher(_Lifecycle, DispatcherCore):
    __doc__ = _DOCSTRING
    __module__ = "fastdispatch"   # where users find it (and pickle finds the class)
