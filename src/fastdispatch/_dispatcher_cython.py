"""``OutboundDispatcher`` on the compiled core (``_ringbuf``): the class
``fastdispatch`` exports unless the extension is not built or
``FASTDISPATCH_NO_EXTENSIONS`` is set.

Its twin on the pure-Python core is ``_dispatcher_python.py``; what both are
made of is in ``_dispatcher.py``.  Importing this module raises ImportError
where the extension is not built.
"""

from ._dispatcher import _DOCSTRING, _HideCythonNames, _Lifecycle
from ._ringbuf import DispatcherCore

__all__ = ["OutboundDispatcher"]


class OutboundDispatcher(_Lifecycle, DispatcherCore, metaclass=_HideCythonNames):
    __doc__ = _DOCSTRING
    __module__ = "fastdispatch"   # where users find it (and pickle finds the class)
