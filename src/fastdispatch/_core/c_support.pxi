# C support for the compiled core: atomics, a spinning mutex, the hand-back.
#
# Atomic integers (the counters and the few flags read without a lock), the
# short spin before a held lock yields on free-threaded CPython, and the
# hand-back of objects to their creating threads on free-threaded builds
# (fd_back).  No pure-Python twin: the twin takes a lock where these are
# atomic, and has no reference counts to hand back.

cdef extern from *:
    """
    #if defined(_MSC_VER)
      #include <intrin.h>
      #define FD_ADD(p, v) _InterlockedExchangeAdd64((volatile __int64 *)(p), (__int64)(v))
      #define FD_LOAD(p) _InterlockedOr64((volatile __int64 *)(p), 0)
      #define FD_STORE(p, v) _InterlockedExchange64((volatile __int64 *)(p), (__int64)(v))
    #else
      #define FD_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_SEQ_CST)
      #define FD_LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
      #define FD_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
    #endif
    """
    long long FD_ADD(long long *p, long long v) nogil
    long long FD_LOAD(long long *p) nogil
    void FD_STORE(long long *p, long long v) nogil

cdef extern from *:
    """
    /* 1: an awaitable (its type has __await__), 0: not, -1: a generator,
       which only inspect.isawaitable can judge (a @types.coroutine one). */
    static int fd_awaitable_kind(PyObject *o) {
        PyTypeObject *t = Py_TYPE(o);
        if (t->tp_as_async != NULL && t->tp_as_async->am_await != NULL) return 1;
        if (PyGen_CheckExact(o)) return -1;
        return 0;
    }
    """
    int fd_awaitable_kind(object o)
    bint PyCoro_CheckExact(object o)

cdef extern from *:
    """
    /* One step of a driven coroutine (see _Driven): send ``value`` into
       ``coro`` with ``ctx`` entered, as ``ctx.run(coro.send, value)`` does
       without its two calls.  A new reference to what the coroutine yielded
       (*returned = 0) or returned (*returned = 1); NULL with the exception
       set when it raised.  Driven coroutines exist from CPython 3.11 on;
       before 3.10 there is no PyIter_Send, and this is never called. */
    static PyObject *fd_drive_send(PyObject *ctx, PyObject *coro, PyObject *value,
                                   int *returned) {
    #if PY_VERSION_HEX >= 0x030A0000
        PyObject *res = NULL;
        PySendResult r;
        if (PyContext_Enter(ctx) < 0) return NULL;
        r = PyIter_Send(coro, value, &res);
        if (PyContext_Exit(ctx) < 0) { Py_XDECREF(res); return NULL; }
        if (r == PYGEN_ERROR) return NULL;
        *returned = (r == PYGEN_RETURN);
        return res;
    #else
        PyErr_SetString(PyExc_RuntimeError, "a driven coroutine needs CPython 3.10 or later");
        return NULL;
    #endif
    }
    """
    object fd_drive_send(object ctx, object coro, object value, int *returned)

cdef extern from *:
    """
    /* How many parts the chat map has (see _Stripe): 1 << FD_STRIPE_BITS. */
    #ifdef Py_GIL_DISABLED
    #define FD_STRIPE_BITS 6
    #else
    #define FD_STRIPE_BITS 0
    #endif
    #define FD_STRIPES ((Py_ssize_t)1 << FD_STRIPE_BITS)
    /* A part of the map that empties is reset (its dict's table freed) only
       if it held more chats than this since its last reset (see
       _remove_locked): a table for this many is about a kilobyte. */
    #define FD_KEEP_CHATS 32
    """
    const Py_ssize_t FD_STRIPES
    const int FD_STRIPE_BITS
    const long long FD_KEEP_CHATS

cdef extern from *:
    """
    /* Free-threaded CPython: every PyMutex of this module (its cython.pymutex
       locks) is taken with a short spin first.  CPython's own PyMutex_Lock
       calls sched_yield() at once when the mutex is held, up to 40 times,
       then parks: with more runnable threads than cores every yield is a
       switch to another thread, for a lock that its holder, running on the
       other core, gives back within tens of nanoseconds (each critical
       section here is a few pointer writes).  FD_SPINS pause-spins hand it
       over without a system call; a holder that is not running makes this
       fall back to CPython's lock (bench/notes/freethreading.md). */
    #if defined(Py_GIL_DISABLED)
      #ifndef FD_SPINS
        #define FD_SPINS 64
      #endif
      #if defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
        #include <intrin.h>
        #define FD_PAUSE() _mm_pause()
      #elif defined(_MSC_VER) && defined(_M_ARM64)
        #include <intrin.h>
        #define FD_PAUSE() __yield()
      #elif defined(__x86_64__) || defined(__i386__)
        #define FD_PAUSE() __builtin_ia32_pause()
      #elif defined(__aarch64__) || defined(__arm__)
        #define FD_PAUSE() __asm__ __volatile__("yield" ::: "memory")
      #else
        #define FD_PAUSE() ((void)0)
      #endif
      static void fd_mutex_lock_parking(PyMutex *m) { PyMutex_Lock(m); }
      static void fd_mutex_lock(PyMutex *m) {
          uint8_t v = _Py_atomic_load_uint8_relaxed(&m->_bits);
          for (int i = 0; i <= FD_SPINS; i++) {
              /* bit 0: locked; bit 1: threads parked (kept as it is) */
              if ((v & 1) == 0 &&
                      _Py_atomic_compare_exchange_uint8(&m->_bits, &v, (uint8_t)(v | 1)))
                  return;
              FD_PAUSE();
              v = _Py_atomic_load_uint8_relaxed(&m->_bits);
          }
          fd_mutex_lock_parking(m);
      }
      #undef PyMutex_Lock
      #define PyMutex_Lock fd_mutex_lock
    #endif
    """

cdef extern from *:
    """
    /* Free-threaded CPython: objects a worker gives back to the thread that
       made them.  CPython counts the references an object's creating
       thread holds apart from the others' (biased reference counting); a
       worker dropping the last reference to a producer's object (a task's
       SendContext and its Future, an emptied chat's queue and its key)
       queues that object to the producer's thread under a mutex per
       creating thread, which the producer then merges: with several
       workers that mutex is where they meet.  Instead, the
       worker takes a reference of its own to such an object before it
       drops its last one (so its drop never queues), keeps it in a block
       of its own (FD_BACK_SLOTS per block, no atomics), and publishes the
       full block on one lock-free stack of the core (one compare-and-swap
       per block); the next submit or post takes the whole stack (one
       exchange) and drops each object as its owner, without a queue
       (bench/notes/freethreading.md).  On a GIL build all of it compiles
       away. */
    #ifndef FD_BACK_SLOTS
      #define FD_BACK_SLOTS 30
    #endif
    typedef struct fd_back {
        struct fd_back *next;
        int n;
        PyObject *objs[FD_BACK_SLOTS];
    } fd_back;
    #if defined(Py_GIL_DISABLED)
      #define FD_HANDBACK 1
      /* Keep a new reference to ``o`` in ``*cur`` (allocating a block when
         there is none).  0: not kept (this thread owns ``o``, or nobody
         does, or no memory: dropping it here queues nothing, or the usual
         way); 1: kept; 2: kept and the block is full (publish it). */
      static int fd_back_keep(fd_back **cur, PyObject *o) {
          uintptr_t tid = _Py_atomic_load_uintptr_relaxed(&o->ob_tid);
          fd_back *b = *cur;
          if (tid == 0 || tid == _Py_ThreadId())
              return 0;
          if (b == NULL) {
              b = (fd_back *)PyMem_RawMalloc(sizeof(fd_back));
              if (b == NULL)
                  return 0;
              b->next = NULL;
              b->n = 0;
              *cur = b;
          }
          Py_INCREF(o);
          b->objs[b->n++] = o;
          return b->n == FD_BACK_SLOTS ? 2 : 1;
      }
      static void fd_back_publish(fd_back **head, fd_back *b) {
          fd_back *old = (fd_back *)_Py_atomic_load_ptr_relaxed(head);
          do {
              b->next = old;
          } while (!_Py_atomic_compare_exchange_ptr(head, &old, b));
      }
      static int fd_back_waiting(fd_back **head) {
          return _Py_atomic_load_ptr_relaxed(head) != NULL;
      }
      static fd_back *fd_back_take(fd_back **head) {
          return (fd_back *)_Py_atomic_exchange_ptr(head, NULL);
      }
    #else
      #define FD_HANDBACK 0
      static int fd_back_keep(fd_back **cur, PyObject *o) { return 0; }
      static void fd_back_publish(fd_back **head, fd_back *b) { }
      static int fd_back_waiting(fd_back **head) { return 0; }
      static fd_back *fd_back_take(fd_back **head) { return NULL; }
    #endif
    /* Drop every object of a chain of blocks, and the blocks. */
    static void fd_back_drop(fd_back *b) {
        while (b != NULL) {
            fd_back *next = b->next;
            for (int i = 0; i < b->n; i++)
                Py_DECREF(b->objs[i]);
            PyMem_RawFree(b);
            b = next;
        }
    }
    """
    ctypedef struct fd_back
    const bint FD_HANDBACK
    int fd_back_keep(fd_back **cur, object o)
    void fd_back_publish(fd_back **head, fd_back *b)
    bint fd_back_waiting(fd_back **head)
    fd_back *fd_back_take(fd_back **head)
    void fd_back_drop(fd_back *b)

cdef object _allocate_lock = threading.Lock


cdef object _Event = threading.Event
cdef object _TIMEOUT_MAX = threading.TIMEOUT_MAX
cdef double _TIMEOUT_MAX_D = threading.TIMEOUT_MAX

cdef inline long long _ns(double t) noexcept nogil:
    # A monotonic time in whole nanoseconds, at least 1 (so that 0 can mean
    # "none"); times past 2**62 ns (146 years) are all that.
    if t >= 4611686018.0:
        return 1LL << 62
    if t < 1e-9:
        return 1
    return <long long>(t * 1e9)

cdef extern from *:
    """
    /* d.get(key) for a dict that other threads change without a lock this
       thread holds (the chat map, a limiter's windows), as a reference
       taken in the lookup itself: Cython's d.get() looks the value up
       borrowed and increments it afterwards, and on free-threaded CPython a
       worker can remove the entry and drop the object's last reference in
       between (the increment then lands on freed memory, or on the object
       made next in it).  None when absent; NULL with an exception set. */
    static PyObject *fd_dict_get(PyObject *d, PyObject *key) {
        PyObject *v;
    #if PY_VERSION_HEX >= 0x030D0000 && !defined(PYPY_VERSION)
        if (PyDict_GetItemRef(d, key, &v) < 0)
            return NULL;
    #else
        v = PyDict_GetItemWithError(d, key);
        if (v == NULL && PyErr_Occurred())
            return NULL;
        Py_XINCREF(v);
    #endif
        if (v == NULL) {
            Py_INCREF(Py_None);
            return Py_None;
        }
        return v;
    }
    """
    object fd_dict_get(dict d, object key)
