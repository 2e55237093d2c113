# The latency histogram that the compiled core fills from C.
#
# fastdispatch.metrics gives it to the core as on_done when the compiled
# core is in use: the core then records each task's queue and run latency
# with no DispatchInfo and no Python call.  No pure-Python twin: with the
# twin, metrics records through an ordinary on_done hook.

@cython.final
cdef class LatencyHistogram:
    """Queue- and run-latency histograms kept by the compiled core itself.

    ``LatencyHistogram(bounds)`` is an ``on_done`` hook (it takes a
    ``DispatchInfo``), and when a dispatcher on the compiled core is given
    it as its ``on_done``, the core records each task's latencies straight
    into it: no ``DispatchInfo`` is built and no Python code runs per task
    (``fastdispatch.metrics`` uses it; a hook of the user's composed with it
    takes the ordinary path).  Buckets are "less than or equal" to each
    bound, plus one above them all; counts and sums are atomic integers, so
    every worker records without a lock.  Tasks that never started are not
    recorded.  ``snapshot()`` returns the queue-latency bucket counts, then
    the run-latency ones, then the two sums in seconds.
    """

    cdef double *_bounds
    cdef Py_ssize_t _n            # len(bounds); there are _n + 1 buckets per histogram
    cdef long long *_counts       # 2 * (_n + 1) atomic counts
    cdef long long _sums[2]       # atomic nanoseconds: queue, run

    def __cinit__(self, bounds):
        cdef Py_ssize_t i
        values = sorted(float(b) for b in bounds)
        if not values:
            raise ValueError("bounds must not be empty")
        self._n = len(values)
        self._bounds = <double *>PyMem_Malloc(self._n * sizeof(double))
        self._counts = <long long *>PyMem_Malloc(2 * (self._n + 1) * sizeof(long long))
        if self._bounds == NULL or self._counts == NULL:
            raise MemoryError()
        for i in range(self._n):
            self._bounds[i] = values[i]
        for i in range(2 * (self._n + 1)):
            self._counts[i] = 0
        self._sums[0] = self._sums[1] = 0

    def __init__(self, bounds):
        pass  # all done in __cinit__, which even LatencyHistogram.__new__ runs

    def __dealloc__(self):
        PyMem_Free(self._bounds)
        PyMem_Free(self._counts)

    cdef inline Py_ssize_t _bucket(self, double value) noexcept nogil:
        # The first bound >= value (bisect_left), or _n above them all.
        cdef Py_ssize_t lo = 0, hi = self._n, mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if self._bounds[mid] < value:
                lo = mid + 1
            else:
                hi = mid
        return lo

    cdef void _record(self, double queue, double run) noexcept nogil:
        FD_ADD(&self._counts[self._bucket(queue)], 1)
        FD_ADD(&self._counts[self._n + 1 + self._bucket(run)], 1)
        FD_ADD(&self._sums[0], <long long>(queue * 1e9))
        FD_ADD(&self._sums[1], <long long>(run * 1e9))

    def __call__(self, info):
        """Record one ``DispatchInfo`` (the path for any other core or caller)."""
        queue, run, error = info[2], info[3], info[4]
        if run == 0.0 and error is not None:
            return  # never started
        self._record(queue, run)

    @property
    def bounds(self):
        return [self._bounds[i] for i in range(self._n)]

    def snapshot(self):
        """[queue buckets..., run buckets..., queue sum, run sum] (seconds)."""
        cdef Py_ssize_t i
        values = [FD_LOAD(&self._counts[i]) for i in range(2 * (self._n + 1))]
        values.append(FD_LOAD(&self._sums[0]) / 1e9)
        values.append(FD_LOAD(&self._sums[1]) / 1e9)
        return values
