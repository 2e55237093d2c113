"""The two cores are one design: compared room by room, they have not drifted apart.

The compiled core (``_ringbuf.pyx``, which includes its rooms
``_core/<room>.pxi``) and the pure-Python twin (``_core_py.py``, which imports
``_core/<room>.py``) are cut into the same rooms.  This file reads their
source (nothing is built, imported or run) and fails when they differ in a
way that is not listed below as intended:

1. the rooms: every room in both languages (but those in ``PYX_ONLY_ROOMS``),
   every ``.pxi`` included by ``_ringbuf.pyx``, every ``.py`` room imported
   (directly or through other rooms) by ``_core_py.py``;
2. in each room the same module-level classes and functions, in each class
   the same methods and the same fields (``cdef`` fields / ``__slots__``);
3. the same constants with the same values, and the same sentinels
   (``object()``), each in the same room;
4. no class over 500 lines, no function over 80, in either core;
5. in a compiled room class, ``self.name`` never names a ``cdef`` method or
   field of a room above it: Cython would compile that as a Python
   attribute lookup, which fails when it runs; such a call is written
   ``(<DispatcherCore>self).name(...)``.  In both cores, ``self.name`` in a
   room class names something a room or the dispatcher class of
   ``_dispatcher.py`` defines (the twin's DispatcherCore has no
   ``__slots__``: a misspelt field would otherwise pass unnoticed).

A difference that is meant goes in ``INTENDED`` with its reason, in plain
words; an entry that no longer matches a difference fails too (the table
must not hide a later drift).  The checks take a source directory, so the
self-tests at the end feed them small pairs of files with a deliberate
drift and see each check fail.
"""

import ast
import os
import re
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src", "fastdispatch")

# The wiring (DispatcherCore, in _ringbuf.pyx and _core_py.py) is compared as
# one more room, under this name.
WIRING = "wiring"
CLASS_LINES = 500
FUNCTION_LINES = 80

# Rooms of the compiled core that the twin has no use for.
PYX_ONLY_ROOMS = {
    "c_support": "C plumbing the twin does without: atomic integers, the spinning "
                 "mutex, the free-threaded hand-back of objects to their creating thread",
    "histogram": "the compiled core fills a LatencyHistogram given as on_done from C; "
                 "the twin calls every on_done hook (that one too) with a DispatchInfo",
}

# Classes whose fields the compiled core names with a leading underscore
# where the twin does not (or the other way round): their fields are
# compared with one leading underscore dropped on both sides.
_PRIVATE = ("a cdef field is out of Python's reach whatever its name, and marked private "
            "by its underscore; the twin's fields are plain attributes that other rooms use")
UNDERSCORE_NORMALISED = {
    ("chats", "ChatQueue"): _PRIVATE,
    ("budgets", "_Budgets"): _PRIVATE,
    ("limiter", "_Limiter"): _PRIVATE,
    ("limiter", "_Window"): _PRIVATE,
}

# A constant the compiled core keeps under another name: twin name ->
# (compiled room, compiled name).  Its values are still compared.
RENAMED_CONSTANTS = {
    "_KEEP_CHATS": ("c_support", "FD_KEEP_CHATS"),
}

# Differences that are meant: (room, class or None, name) -> why.  ``room``
# is the file's name in _core/ (or "wiring"); a constant's room is the
# file that defines it.
_HANDBACK = ("the free-threaded hand-back of objects to the thread that made them "
             "(fd_back, c_support.pxi); the twin lets an object die where it is dropped")
_COUNTS = ("the compiled core counts outcomes in one atomic array (_counts, indexed by "
           "C_*); the twin keeps one field per outcome under _count_lock")
_STRIPES = ("the compiled core cuts the chat map in FD_STRIPES parts (64 on free-threaded "
            "CPython), each with its dict, lock and high mark; the twin has one dict, one "
            "lock, one mark: the same protocol per part")
_RING = ("the compiled ring is a list of slots grown lazily, used from C through typed "
         "methods; the twin's is a deque behind the Python-facing push/pop/clear")
_LEARNED_FIELDS = ("the learned budgets that cover a chat: three typed fields, each found "
                   "by its own lookup, in the compiled core (no list per start); one list "
                   "in the twin (_buckets_of_locked, ChatQueue.lres)")
_RUNNERS = ("the compiled core keeps a worker's running task in that worker's _Runner "
            "and coroutine tasks in an intrusive linked list, so that a start or an end "
            "on free-threaded CPython writes nothing another worker writes; the twin keeps "
            "every running task in one OrderedDict (_running) under _run_lock")
_TIMER_BY = ("an atomic copy of the sleeping timer's wake-up time, read by a worker's "
             "start without _run_lock; every start of the twin takes _run_lock anyway")
_FAST_FUTURES = ("the compiled core makes a concurrent.futures.Future, moves it through its "
                 "states and reads its result from C when its layout is the known one; the "
                 "twin uses the public methods")
_READY = ("the compiled ready list is an intrusive linked list through the queues "
          "(no allocation) with an atomic length that workers peek without the lock; the "
          "twin's is a deque under _pool_lock")
_CORE_REF = ("the compiled limiter reaches its core through a borrowed pointer (no "
             "reference cycle) and calls _timer_needed and sets _limited itself; the twin's "
             "is handed those two calls (need_timer, on_learn)")
_NEW = ("the compiled core builds it with __new__ and sets its C fields in one helper "
        "(no __init__ call per submit); the twin's __init__ does the same")
_WINDOW_RING = ("the compiled window keeps its count + 1 newest stamps in a C ring of "
                "doubles; the twin's in a deque with that maxlen")
_DRIVEN_ITER = ("the compiled _Driven is its own iterator (__await__ returns it; each step "
                "sends into the coroutine from C), so that driving a task allocates no "
                "generator; the twin's __await__ is a generator, the fastest in Python")
_WORDING = ("the compiled core words a task's SendTimeout before it claims the task, outside "
            "the locks; the twin claims it with a bare SendTimeout under _run_lock and words "
            "it afterwards (_expired_error)")

INTENDED = {
    # bookkeeping
    ("bookkeeping", "_Bookkeeping", "__dealloc__"): _HANDBACK,
    ("bookkeeping", "_Bookkeeping", "_flush"): _HANDBACK,
    ("bookkeeping", "_Bookkeeping", "_keep"): _HANDBACK,
    ("bookkeeping", "_Bookkeeping", "_take_back"): _HANDBACK,
    ("bookkeeping", "_Bookkeeping", "_back"): _HANDBACK,
    ("bookkeeping", "_Bookkeeping", "_count"): _COUNTS,
    ("bookkeeping", "_Bookkeeping", "_count_lock"):
        "the twin's counters are guarded by one lock; the compiled core's are atomic integers",
    ("bookkeeping", "_Bookkeeping", "__weakref__"):
        "a cdef class must declare __weakref__ to be weakly referenced (_ref); a Python "
        "class has it",
    ("bookkeeping", "_Bookkeeping", "_chats"):
        "the striped chat map counts its chats in an atomic counter; the twin's one dict "
        "has a len()",
    ("bookkeeping", "_Bookkeeping", "_has_timeout"):
        "send_timeout is a C double in the compiled core, so whether there is one is a "
        "flag of its own; the twin's send_timeout is None when there is none",
    ("bookkeeping", "_Bookkeeping", "_histogram"):
        "the compiled core records a LatencyHistogram on_done hook from C (room "
        "histogram); the twin calls it as any other hook",
    # budgets
    ("budgets", None, "_spent_until"): _LEARNED_FIELDS,
    ("budgets", "_Budgets", "_own_locked"): _LEARNED_FIELDS,
    ("budgets", "_Budgets", "_shared_locked"): _LEARNED_FIELDS,
    ("budgets", "_Budgets", "_buckets_of_locked"): _LEARNED_FIELDS,
    ("budgets", "_Budgets", "_core"): _CORE_REF,
    ("budgets", "_Budgets", "_need_timer"): _CORE_REF,
    ("budgets", "_Budgets", "need_timer"): _CORE_REF,
    ("budgets", "_Budgets", "on_learn"): _CORE_REF,
    # chats
    ("chats", None, "_Stripe"): _STRIPES,
    ("chats", "_ChatMap", "_stripe_for"): _STRIPES,
    ("chats", "_ChatMap", "_stripes"): _STRIPES,
    ("chats", "_ChatMap", "_queues"): _STRIPES,
    ("chats", "_ChatMap", "_map_lock"): _STRIPES,
    ("chats", "_ChatMap", "_map_high"): _STRIPES,
    ("chats", "ChatQueue", "_stripe"): _STRIPES,
    ("chats", None, "_wrap_chat_id"):
        "the slow path of _chat_key, kept apart so that the inline fast path stays small; "
        "inline in the twin's _chat_key",
    ("chats", None, "_new_waiter"): _NEW,
    ("chats", "_Waiter", "__init__"): _NEW,
    ("chats", "_ChatKey", "__init__"): _NEW,
    ("chats", "ChatQueue", "_lres_chat"): _LEARNED_FIELDS,
    ("chats", "ChatQueue", "_lres_shared"): _LEARNED_FIELDS,
    ("chats", "ChatQueue", "_lres_glob"): _LEARNED_FIELDS,
    ("chats", "ChatQueue", "lres"): _LEARNED_FIELDS,
    ("chats", "ChatQueue", "_next_ready"): _READY,
    ("chats", "RingBuffer", "_init"): _RING,
    ("chats", "RingBuffer", "_grow"): _RING,
    ("chats", "RingBuffer", "_push"): _RING,
    ("chats", "RingBuffer", "_pop"): _RING,
    ("chats", "RingBuffer", "_clear"): _RING,
    ("chats", "RingBuffer", "_slots"): _RING,
    ("chats", "RingBuffer", "_size"): _RING,
    ("chats", "RingBuffer", "_head"): _RING,
    ("chats", "RingBuffer", "_count"): _RING,
    ("chats", "RingBuffer", "_items"): _RING,
    # constants
    # deadlines
    ("deadlines", None, "_Runner"): _RUNNERS,
    ("deadlines", "_Deadlines", "_runners"): _RUNNERS,
    ("deadlines", "_Deadlines", "_run_head"): _RUNNERS,
    ("deadlines", "_Deadlines", "_run_tail"): _RUNNERS,
    ("deadlines", "_Deadlines", "_unlink_locked"): _RUNNERS,
    ("deadlines", "_Deadlines", "_take_from_runners"): _RUNNERS,
    ("deadlines", "_Deadlines", "_claim_overdue"): _RUNNERS,
    ("deadlines", "_Deadlines", "_running"): _RUNNERS,
    ("deadlines", "_Deadlines", "_timer_by"): _TIMER_BY,
    ("deadlines", "_Deadlines", "_set_timer_until_locked"): _TIMER_BY,
    ("deadlines", "_Deadlines", "_timeout_error"): _WORDING,
    ("deadlines", "_Deadlines", "_expired_error"): _WORDING,
    # futures
    ("futures", None, "_LeanCondition"): _FAST_FUTURES,
    ("futures", None, "_new_future"): _FAST_FUTURES,
    ("futures", None, "_future_layout_is_known"): _FAST_FUTURES,
    ("futures", None, "_future_result"): _FAST_FUTURES,
    # items
    ("items", None, "_is_awaitable"):
        "asks C for the kind of awaitable first (fd_awaitable_kind); the twin calls "
        "inspect.isawaitable",
    ("items", "SendContext", "_is_cancelled"):
        "the cancelled property's body as a C method, for check() and wait(); the twin "
        "reads the property",
    ("items", "SendContext", "_has_deadline"):
        "the deadline is a C double, so whether there is one is a flag; the twin's "
        "_deadline is None when there is none",
    ("items", "SendContext", "_prev"): _RUNNERS,
    ("items", "SendContext", "_next"): _RUNNERS,
    ("items", "SendContext", "_registered"): _RUNNERS,
    ("items", None, "_new_aio_future"):
        "makes asyncio's own Future directly where the loop keeps asyncio's create_future "
        "(no Python frame per Future); in the twin that test would cost what it saves",
    ("items", "_Driven", "__next__"): _DRIVEN_ITER,
    ("items", "_Driven", "send"): _DRIVEN_ITER,
    ("items", "_Driven", "throw"): _DRIVEN_ITER,
    ("items", "_Driven", "close"): _DRIVEN_ITER,
    ("items", "_Driven", "_step"): _DRIVEN_ITER,
    # limiter
    ("limiter", "_Limiter", "_configure"):
        "the compiled limiter is made with its core and configured in place; the twin's "
        "_configure makes a new _Limiter",
    ("limiter", "_Limiter", "_line_len"):
        "the global line's length as a C integer, tested at every admit; the twin tests "
        "the deque",
    ("limiter", "_Window", "__dealloc__"): _WINDOW_RING,
    ("limiter", "_Window", "_at"): _WINDOW_RING,
    ("limiter", "_Window", "_cap"): _WINDOW_RING,
    ("limiter", "_Window", "_head"): _WINDOW_RING,
    ("limiter", "_Window", "_len"): _WINDOW_RING,
    # pool
    ("pool", "_Pool", "_ready_append"): _READY,
    ("pool", "_Pool", "_ready_popleft"): _READY,
    ("pool", "_Pool", "_ready_head"): _READY,
    ("pool", "_Pool", "_ready_tail"): _READY,
    ("pool", "_Pool", "_ready_len"): _READY,
    ("pool", "_Pool", "_ready"): _READY,
    ("pool", "_Pool", "_slot_waiting"):
        "the length of _slot_waiters as an atomic integer, peeked without _pool_lock at "
        "every slot given back; the twin tests the deque",
    # wiring
    (WIRING, "DispatcherCore", "_learning"): _CORE_REF,
}


# ----------------------------------------------------------------- reading

def _short(path):
    # _core/<room>.pxi, or the file's own name for the wiring.
    parent = os.path.basename(os.path.dirname(path))
    name = os.path.basename(path)
    return parent + "/" + name if parent == "_core" else name


def _where(d):
    return "%s:%d" % (_short(d.path), d.start)


class _Def:
    """A class, function, method or field found in a source file."""

    def __init__(self, name, kind, path, start, end=None):
        self.name = name
        self.kind = kind      # class, def, cdef or cpdef
        self.path = path
        self.start = start    # 1-based line numbers
        self.end = end if end is not None else start
        self.methods = {}
        self.fields = None    # a class's cdef fields, or its __slots__ (a set)
        self.base = None
        self.self_refs = []   # (line, name, method): self.<name> in its methods
        self.attrs = set()    # names assigned in a twin class's body (but __slots__)
        self.cdef = False     # a cdef class (compiled core)

    @property
    def lines(self):
        return self.end - self.start + 1


class _Source:
    """What one room file defines: classes, functions, constants, sentinels."""

    def __init__(self, path):
        self.path = path
        self.label = _short(path)
        self.classes = {}
        self.functions = {}
        self.constants = {}   # name -> (value, line)
        self.sentinels = {}   # name -> line
        self.imports = set()  # rooms imported (twin only)
        self.includes = []    # .pxi files included (compiled only)
        self.defines = {}     # C macro -> the set of its values (compiled only)


def _scan(text):
    """Each line of ``text`` as (indent, kind, code).

    ``kind`` is ``code``, ``blank``, ``comment`` or ``cont`` (the line starts
    inside brackets, a triple-quoted string or after a backslash);
    ``code`` is the line with comments cut and string contents blanked.
    """
    out = []
    depth = 0
    quote = None
    backslash = False
    for line in text.split("\n"):
        stripped = line.strip()
        if depth or quote or backslash:
            kind = "cont"
        elif not stripped:
            kind = "blank"
        elif stripped.startswith("#"):
            kind = "comment"
        else:
            kind = "code"
        code = []
        i, n = 0, len(line)
        while i < n:
            c = line[i]
            if quote:
                if line.startswith(quote, i):
                    code.append(quote)
                    quote = None
                    i += 3
                else:
                    step = 2 if c == "\\" else 1
                    code.append(" " * step)
                    i += step
                continue
            if c == "#":
                break
            if line.startswith('"""', i) or line.startswith("'''", i):
                quote = line[i:i + 3]
                code.append(quote)
                i += 3
                continue
            if c in "\"'":
                j = i + 1
                while j < n and line[j] != c:
                    j += 2 if line[j] == "\\" else 1
                code.append(c + " " * (min(j, n) - i - 1) + c)
                i = j + 1
                continue
            if c in "([{":
                depth += 1
            elif c in ")]}":
                depth = max(0, depth - 1)
            code.append(c)
            i += 1
        code = "".join(code)
        backslash = not quote and code.rstrip().endswith("\\")
        out.append((len(line) - len(line.lstrip()), kind, code))
    return out


def _block_end(lines, start):
    """The last line (0-based) of the block whose header is line ``start``."""
    indent = lines[start][0]
    end = start
    for j in range(start + 1, len(lines)):
        ind, kind, _ = lines[j]
        if kind == "code" and ind <= indent:
            break
        if kind in ("code", "cont"):
            end = j
    return end


_FUNC = re.compile(r"^(?:async\s+)?def\s+(\w+)\s*\(")
_CFUNC = re.compile(r"^(cdef|cpdef)\s+(?!class\b|enum\b|extern\b|struct\b|union\b)"
                    r"[^=(]*?\b(\w+)\s*\(")
_CLASS = re.compile(r"^(?:cdef\s+)?class\s+(\w+)\s*(?:\(\s*([\w.]+)[^)]*\))?\s*:")
_CFIELD = re.compile(r"^cdef\s+(?!class\b|enum\b|extern\b)(?:(?:readonly|public)\s+)?(.+)$")
_NAME = re.compile(r"\**\s*(\w+)\s*(?:\[[^\]]*\])?\s*$")
_SELF = re.compile(r"(?<![\w.])self\.(\w+)")


def _function_at(code):
    """(name, kind) if a line of code opens a def/cdef/cpdef function."""
    m = _FUNC.match(code)
    if m:
        return m.group(1), "def"
    m = _CFUNC.match(code)
    if m and ("=" not in code or code.index("(") < code.index("=")):
        return m.group(2), m.group(1)
    return None


def _field_names(code):
    # ``cdef long long _a, _b[5]`` -> [_a, _b]; the type is what precedes
    # the first name.
    m = _CFIELD.match(code.strip())
    if m is None or "(" in code or "=" in code:
        return []
    parts = m.group(1).split(",")
    names = []
    first = _NAME.search(parts[0])
    if first:
        names.append(first.group(1))
    for part in parts[1:]:
        m2 = _NAME.match(part.strip())
        if m2:
            names.append(m2.group(1))
    return names


def _number(node):
    """The value of a numeric constant expression, or None."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _number(node.operand)
        return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
    if isinstance(node, ast.BinOp):
        a, b = _number(node.left), _number(node.right)
        if a is None or b is None:
            return None
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.LShift: lambda: a << b, ast.BitOr: lambda: a | b}
        op = ops.get(type(node.op))
        return op() if op else None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "float" and len(node.args) == 1
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return float(node.args[0].value)
    return None


def _is_sentinel(node):
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "object" and not node.args and not node.keywords)


def _expr(text):
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None


def read_pyx(path):
    """A compiled-core file (.pyx or .pxi), read line by line."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    raw = text.split("\n")
    lines = _scan(text)
    src = _Source(path)
    i = 0
    while i < len(lines):
        indent, kind, code = lines[i]
        if kind != "code" or indent:
            i += 1
            continue
        end = _block_end(lines, i)
        stripped = code.strip()
        m = _CLASS.match(stripped)
        func = _function_at(stripped)
        if m:
            cls = _Def(m.group(1), "class", path, i + 1, end + 1)
            cls.base = m.group(2)
            cls.cdef = stripped.startswith("cdef")
            cls.fields = set()
            _read_class_body(lines, i, end, cls, path)
            src.classes[cls.name] = cls
        elif func:
            src.functions[func[0]] = _Def(func[0], func[1], path, i + 1, end + 1)
        elif stripped.startswith("cdef enum"):
            for j in range(i + 1, end + 1):
                if lines[j][1] == "code" and "=" in lines[j][2]:
                    name, value = lines[j][2].split("=", 1)
                    number = _number(_expr(value))
                    if number is not None:
                        src.constants[name.strip()] = (number, j + 1)
        elif stripped.startswith("cdef extern"):
            for j in range(i + 1, end + 1):
                d = re.match(r"\s*#define\s+(\w+)\s+(-?\d+)\s*$", raw[j])
                if d:
                    src.defines.setdefault(d.group(1), set()).add(int(d.group(2)))
        elif stripped.startswith("include "):
            src.includes.append(_expr(raw[i].strip()[len("include "):]).value)
        elif "=" in stripped and not stripped.startswith(("@", "if ", "from ", "import ")):
            # ``cdef TYPE NAME = value`` or ``NAME = value``
            # (the raw text, cut where the scan found a comment: strings intact)
            text = "\n".join(raw[k][:len(lines[k][2])] for k in range(i, end + 1))
            target, value = text.split("=", 1)
            name = target.split()[-1] if target.split() else ""
            value_node = _expr(value)
            if re.match(r"^\w+$", name) and value_node is not None:
                if _is_sentinel(value_node):
                    src.sentinels[name] = i + 1
                else:
                    number = _number(value_node)
                    if number is not None:
                        src.constants[name] = (number, i + 1)
        i = end + 1
    return src


def _read_class_body(lines, start, end, cls, path):
    inner = None
    current = None
    for j in range(start + 1, end + 1):
        indent, kind, code = lines[j]
        if kind == "code" and inner is None:
            inner = indent
        if kind == "code" and indent == inner:
            stripped = code.strip()
            func = _function_at(stripped)
            if func:
                current = _Def(func[0], func[1], path, j + 1, _block_end(lines, j) + 1)
                cls.methods[func[0]] = current
                continue
            if stripped.startswith("cdef "):
                for name in _field_names(stripped):
                    cls.fields.add(name)
                current = None
                continue
        if current is not None and kind in ("code", "cont") and j < current.end:
            for m in _SELF.finditer(code):
                cls.self_refs.append((j + 1, m.group(1), current.name))


def read_py(path, wiring=False):
    """A twin file, read with ``ast`` (``wiring``: _core_py.py, whose rooms are
    imported from ``._core``)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    src = _Source(path)
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            cls = _Def(node.name, "class", path, node.lineno, node.end_lineno)
            if node.bases:
                cls.base = ast.unparse(node.bases[0])
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    cls.methods[item.name] = _Def(item.name, "def", path, item.lineno,
                                                  item.end_lineno)
                    cls.self_refs.extend(
                        (n.lineno, n.attr, item.name) for n in ast.walk(item)
                        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                        and n.value.id == "self")
                elif (isinstance(item, ast.Assign) and len(item.targets) == 1
                      and isinstance(item.targets[0], ast.Name)
                      and item.targets[0].id == "__slots__"):
                    cls.fields = set(ast.literal_eval(item.value))
                elif isinstance(item, ast.Assign):
                    cls.attrs.update(t.id for t in item.targets if isinstance(t, ast.Name))
            if cls.fields is None:
                cls.fields = set()
            src.classes[node.name] = cls
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            src.functions[node.name] = _Def(node.name, "def", path, node.lineno,
                                            node.end_lineno)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            pairs = [(target, value)]
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                pairs = list(zip(target.elts, value.elts))
            for t, v in pairs:
                if not isinstance(t, ast.Name):
                    continue
                if _is_sentinel(v):
                    src.sentinels[t.id] = node.lineno
                elif _number(v) is not None:
                    src.constants[t.id] = (_number(v), node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            module = node.module or ""
            if wiring and module.startswith("_core."):
                src.imports.add(module.split(".", 1)[1])
            elif wiring and module == "_core" or not wiring and not module:
                src.imports.update(a.name for a in node.names)
            elif not wiring and "." not in module:
                src.imports.add(module)
    return src


class Cores:
    """Both cores of a source directory, room by room."""

    def __init__(self, src):
        self.src = src
        core = os.path.join(src, "_core")
        self.pyx_wiring = read_pyx(os.path.join(src, "_ringbuf.pyx"))
        self.py_wiring = read_py(os.path.join(src, "_core_py.py"), wiring=True)
        self.pxi_files = sorted(f[:-4] for f in os.listdir(core) if f.endswith(".pxi"))
        self.py_files = sorted(f[:-3] for f in os.listdir(core)
                               if f.endswith(".py") and f != "__init__.py")
        self.pyx = {room: read_pyx(os.path.join(core, room + ".pxi"))
                    for room in self.pxi_files}
        self.py = {room: read_py(os.path.join(core, room + ".py")) for room in self.py_files}
        self.pyx[WIRING] = self.pyx_wiring
        self.py[WIRING] = self.py_wiring
        self.dispatcher = os.path.join(src, "_dispatcher.py")

    def py_reached(self):
        """The twin's rooms that _core_py.py imports, directly or through rooms."""
        seen = set()
        todo = list(self.py_wiring.imports)
        while todo:
            room = todo.pop()
            if room in seen or room not in self.py:
                seen.add(room)
                continue
            seen.add(room)
            todo.extend(self.py[room].imports)
        return seen

    def pyx_class(self, name):
        for room, src in self.pyx.items():
            if name in src.classes:
                return room, src.classes[name]
        return None, None


class _Drift:
    """Collects differences, and which entries of the table were used."""

    def __init__(self, intended):
        self.intended = intended
        self.used = set()
        self.problems = []

    def differ(self, key, message):
        if key in self.intended:
            self.used.add(key)
        else:
            self.problems.append(message)

    def stale(self, keys):
        for key in sorted(k for k in keys if k not in self.used):
            self.problems.append(
                "INTENDED lists %r, but the two cores agree there now: remove the entry"
                % (key,))


# ------------------------------------------------------------------ checks

def check_rooms(cores, pyx_only=PYX_ONLY_ROOMS):
    """1. The same rooms in both languages; all included, all imported."""
    problems = []
    included = [os.path.splitext(os.path.basename(p))[0]
                for p in cores.pyx_wiring.includes]
    for room in cores.pxi_files:
        if room not in included:
            problems.append("_core/%s.pxi is not included by _ringbuf.pyx: add "
                            "`include \"_core/%s.pxi\"` there (or delete the file)"
                            % (room, room))
    for room in included:
        if room not in cores.pxi_files:
            problems.append("_ringbuf.pyx includes _core/%s.pxi, which does not exist"
                            % (room,))
    reached = cores.py_reached()
    for room in cores.py_files:
        if room not in reached:
            problems.append("_core/%s.py is not imported by _core_py.py, directly or "
                            "through another room: the twin does not use it" % (room,))
    for room in sorted(reached - set(cores.py_files)):
        problems.append("_core_py.py imports the room %r, which has no _core/%s.py"
                        % (room, room))
    for room in cores.pxi_files:
        if room in pyx_only:
            if room in cores.py_files:
                problems.append("PYX_ONLY_ROOMS lists %r, but _core/%s.py exists: "
                                "compare it (remove the entry)" % (room, room))
        elif room not in cores.py_files:
            problems.append("room %r: _core/%s.pxi has no twin _core/%s.py (write it, or "
                            "list the room in PYX_ONLY_ROOMS with the reason)"
                            % (room, room, room))
    for room in cores.py_files:
        if room not in cores.pxi_files:
            problems.append("room %r: _core/%s.py has no compiled _core/%s.pxi"
                            % (room, room, room))
    for room in sorted(set(pyx_only) - set(cores.pxi_files)):
        problems.append("PYX_ONLY_ROOMS lists %r, which is no room of the compiled core"
                        % (room,))
    return problems


def _paired_rooms(cores):
    return [room for room in cores.pyx if room in cores.py]


def _compare_names(drift, room, cls, what, pyx_names, py_names, files, normalise=False):
    def key_of(name):
        return name[1:] if normalise and name.startswith("_") and not name.startswith("__") \
            else name
    pyx_keys = {key_of(n): n for n in pyx_names}
    py_keys = {key_of(n): n for n in py_names}
    place = "room %r" % (room,) if cls is None else "%s (room %r)" % (cls, room)
    for k in sorted(set(pyx_keys) - set(py_keys)):
        name = pyx_keys[k]
        drift.differ((room, cls, name),
                     "%s: %s %r is in the compiled core only (%s): add it to the twin, or "
                     "list (%r, %r, %r) in INTENDED with the reason"
                     % (place, what, name, files[0], room, cls, name))
    for k in sorted(set(py_keys) - set(pyx_keys)):
        name = py_keys[k]
        drift.differ((room, cls, name),
                     "%s: %s %r is in the twin only (%s): add it to the compiled core, or "
                     "list (%r, %r, %r) in INTENDED with the reason"
                     % (place, what, name, files[1], room, cls, name))


def check_shapes(cores, intended=INTENDED, normalised=UNDERSCORE_NORMALISED):
    """2. Per room the same classes and functions; per class the same methods and fields."""
    drift = _Drift(intended)
    for room in _paired_rooms(cores):
        pyx, py = cores.pyx[room], cores.py[room]
        files = (pyx.label, py.label)
        _compare_names(drift, room, None, "module-level class or function",
                       set(pyx.classes) | set(pyx.functions),
                       set(py.classes) | set(py.functions), files)
        for name in sorted(set(pyx.classes) & set(py.classes)):
            a, b = pyx.classes[name], py.classes[name]
            methods = set(a.methods)
            if "__cinit__" in methods and "__init__" not in methods:
                # A cdef class is set up in __cinit__, a Python class in __init__.
                methods = methods - {"__cinit__"} | {"__init__"}
            _compare_names(drift, room, name, "method", methods, b.methods, files)
            _compare_names(drift, room, name, "field", a.fields, b.fields, files,
                           normalise=(room, name) in normalised)
    drift.stale({k for k in intended if not _is_constant_key(cores, k)})
    return drift.problems


def _is_constant_key(cores, key):
    room, cls, name = key
    if cls is not None:
        return False
    for side in (cores.pyx, cores.py):
        src = side.get(room)
        if src is not None and (name in src.constants or name in src.sentinels):
            return True
    return False


def _all_constants(sources):
    found = {}
    for room, src in sources.items():
        for name, (value, line) in src.constants.items():
            found.setdefault(name, (value, room, "%s:%d" % (src.label, line)))
    return found


def _all_sentinels(sources):
    found = {}
    for room, src in sources.items():
        for name in src.sentinels:
            found.setdefault(name, room)
    return found


def check_constants(cores, intended=INTENDED, renamed=RENAMED_CONSTANTS):
    """3. The same constants with the same values, the same sentinels."""
    drift = _Drift(intended)
    pyx = _all_constants(cores.pyx)
    py = _all_constants(cores.py)
    for py_name, (room, c_name) in renamed.items():
        values = cores.pyx.get(room, _Source("")).defines.get(c_name, set())
        if py_name not in py:
            drift.problems.append("RENAMED_CONSTANTS lists %r, which the twin does not "
                                  "define" % (py_name,))
        elif len(values) != 1:
            drift.problems.append("RENAMED_CONSTANTS: %s has no single value in _core/%s.pxi "
                                  "(%s)" % (c_name, room, sorted(values)))
        else:
            pyx[py_name] = (values.pop(), room, "_core/%s.pxi (%s)" % (room, c_name))
    for name in sorted(set(pyx) | set(py)):
        if name in pyx and name in py:
            (a, room_a, where_a), (b, room_b, where_b) = pyx[name], py[name]
            if a != b or type(a) is not type(b):
                drift.problems.append(
                    "constant %s is %r in the compiled core (%s) but %r in the twin (%s): "
                    "give both the same value" % (name, a, where_a, b, where_b))
            elif room_a != room_b and name not in renamed:
                drift.problems.append(
                    "constant %s is in room %r in the compiled core (%s) but in room %r in "
                    "the twin (%s): keep it in the same room" % (name, room_a, where_a,
                                                                room_b, where_b))
            continue
        value, room, where = pyx[name] if name in pyx else py[name]
        side = "compiled core" if name in pyx else "twin"
        drift.differ((room, None, name),
                     "constant %s = %r is in the %s only (%s): define it in both, or "
                     "list (%r, None, %r) in INTENDED with the reason"
                     % (name, value, side, where, room, name))
    pyx_s, py_s = _all_sentinels(cores.pyx), _all_sentinels(cores.py)
    for name in sorted(set(pyx_s) & set(py_s)):
        if pyx_s[name] != py_s[name]:
            drift.problems.append(
                "sentinel %s is in room %r in the compiled core but in room %r in the twin: "
                "keep it in the same room" % (name, pyx_s[name], py_s[name]))
    for name in sorted(set(pyx_s) ^ set(py_s)):
        room = pyx_s.get(name) or py_s.get(name)
        side = "compiled core" if name in pyx_s else "twin"
        drift.differ((room, None, name),
                     "sentinel %s = object() is in the %s only (room %r): define it in both, "
                     "or list (%r, None, %r) in INTENDED with the reason"
                     % (name, side, room, room, name))
    drift.stale({k for k in intended if _is_constant_key(cores, k)})
    return drift.problems


def check_sizes(cores, class_lines=CLASS_LINES, function_lines=FUNCTION_LINES):
    """4. No class over 500 lines, no function or method over 80."""
    problems = []
    for side in (cores.pyx, cores.py):
        for src in side.values():
            for cls in src.classes.values():
                if cls.lines > class_lines:
                    problems.append("%s: class %s is %d lines (at most %d): move a concern "
                                    "into a room of its own"
                                    % (_where(cls), cls.name, cls.lines, class_lines))
                for m in cls.methods.values():
                    if m.lines > function_lines:
                        problems.append("%s: %s.%s is %d lines (at most %d): cut it in steps"
                                        % (_where(m), cls.name, m.name, m.lines,
                                           function_lines))
            for f in src.functions.values():
                if f.lines > function_lines:
                    problems.append("%s: %s is %d lines (at most %d): cut it in steps"
                                    % (_where(f), f.name, f.lines, function_lines))
    return problems


def subclass_names(path):
    """Names the dispatcher classes define on top of the core: the methods and
    ``self.x = ...`` attributes of each class built on ``DispatcherCore`` in
    ``_dispatcher.py`` or its per-core modules (``_dispatcher_*.py``), and of
    its bases defined there (``_Lifecycle``)."""
    folder = os.path.dirname(path)
    classes = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith("_dispatcher") and name.endswith(".py"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                tree = ast.parse(f.read(), name)
            classes.update({node.name + "@" + name: node for node in ast.walk(tree)
                            if isinstance(node, ast.ClassDef)})
    by_name = {}
    for key, node in classes.items():
        by_name.setdefault(node.name, []).append(node)
    todo = [node for node in classes.values()
            if any(ast.unparse(b).endswith("DispatcherCore") for b in node.bases)]
    names = set()
    seen = set()
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for b in node.bases:
            if isinstance(b, ast.Name) and b.id in by_name:
                todo.extend(by_name[b.id])
        for item in ast.walk(node):
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item in node.body:
                names.add(item.name)
            elif (isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store)
                  and isinstance(item.value, ast.Name) and item.value.id == "self"):
                names.add(item.attr)
    return names


def check_upward_calls(cores):
    """5. A compiled class never reaches a cdef method or field above it as self.name."""
    problems = []
    classes = {}
    for room, src in cores.pyx.items():
        for cls in src.classes.values():
            classes[cls.name] = (room, cls)
    subclass = subclass_names(cores.dispatcher) if os.path.exists(cores.dispatcher) else set()

    def ancestors(name):
        chain = []
        while name in classes:
            chain.append(name)
            name = classes[name][1].base
        return chain

    def members(cls):
        return set(cls.methods) | set(cls.fields)

    for name, (room, cls) in sorted(classes.items()):
        if not cls.cdef:
            continue  # a Python class: every attribute is looked up when it runs
        below = set()
        for a in ancestors(name):
            below |= members(classes[a][1])
        above = [(other, classes[other]) for other in classes
                 if other != name and name in ancestors(other)]
        in_core = "DispatcherCore" in [o for o, _ in above] or name == "DispatcherCore"
        for line, attr, method in cls.self_refs:
            if attr in below:
                continue
            owners = [(o, r, c) for o, (r, c) in above if attr in members(c)]
            where = "%s:%d (%s.%s)" % (_short(cls.path), line, name, method)
            if owners:
                o, r, c = owners[0]
                member = c.methods.get(attr)
                if member is not None and member.kind != "cdef":
                    continue  # a def or cpdef method: a Python lookup finds it
                problems.append(
                    "%s: self.%s names a cdef %s of %s, a room above (room %r): write "
                    "(<DispatcherCore>self).%s, or move it down"
                    % (where, attr, "method" if member is not None else "field", o, r, attr))
            elif not (in_core and attr in subclass):
                problems.append(
                    "%s: self.%s is defined by no class of %s's line, nor (for the core) by "
                    "the dispatcher class in _dispatcher.py" % (where, attr, name))
    return problems


def check_twin_names(cores):
    """5, the twin: ``self.name`` in a room class of the core is defined somewhere
    in the core's line of rooms, or by the dispatcher class of ``_dispatcher.py``."""
    classes = {}
    for src in cores.py.values():
        for cls in src.classes.values():
            classes[cls.name] = cls
    line = []
    name = "DispatcherCore"
    while name in classes and name not in line:
        line.append(name)
        name = classes[name].base
    known = set()
    for name in line:
        cls = classes[name]
        known |= set(cls.methods) | cls.fields | cls.attrs
    if os.path.exists(cores.dispatcher):
        known |= subclass_names(cores.dispatcher)
    problems = []
    for name in line:
        cls = classes[name]
        for lineno, attr, method in cls.self_refs:
            if attr not in known and not attr.startswith("__"):
                problems.append(
                    "%s:%d (%s.%s): self.%s is defined by no room of the twin's core, nor by "
                    "the dispatcher class in _dispatcher.py: misspelt, or missing from a "
                    "room's __slots__" % (_short(cls.path), lineno, name, method, attr))
    return problems


# ------------------------------------------------------------ the real cores

def _cores():
    if not os.path.exists(os.path.join(SRC, "_core_py.py")) or \
            not os.path.exists(os.path.join(SRC, "_ringbuf.pyx")):
        pytest.skip("needs the source checkout (src/fastdispatch/_ringbuf.pyx, _core/)")
    return Cores(SRC)


def _report(problems):
    return "\n".join(["the two cores drifted apart (tests/test_core_rooms.py explains "
                      "each check):"] + ["- " + p for p in problems])


def test_both_cores_have_the_same_rooms():
    problems = check_rooms(_cores())
    assert not problems, _report(problems)


def test_rooms_define_the_same_classes_methods_and_fields():
    problems = check_shapes(_cores())
    assert not problems, _report(problems)


def test_constants_and_sentinels_have_the_same_values():
    problems = check_constants(_cores())
    assert not problems, _report(problems)


def test_no_class_over_500_lines_no_function_over_80():
    problems = check_sizes(_cores())
    assert not problems, _report(problems)


def test_compiled_rooms_reach_rooms_above_through_dispatchercore():
    problems = check_upward_calls(_cores())
    assert not problems, _report(problems)


def test_twin_rooms_use_only_names_the_core_defines():
    problems = check_twin_names(_cores())
    assert not problems, _report(problems)


# ------------------------------------------------- the checks catch drift

# A small pair of cores: a constants room, two room classes and the wiring.
_PAIR = {
    "_ringbuf.pyx": (
        'include "_core/consts.pxi"\n'
        'include "_core/hall.pxi"\n'
        'include "_core/door.pxi"\n'
        "\n"
        "cdef class DispatcherCore(_Door):\n"
        "    def __cinit__(self):\n"
        "        self._n = 0\n"),
    "_core/consts.pxi": (
        "cdef enum:\n"
        "    _ONE = 1\n"
        "    _TWO = 2  # a comment\n"
        "cdef double _INF = float(\"inf\")\n"
        "cdef object _MARK = object()\n"),
    "_core/hall.pxi": (
        "cdef class _Hall:\n"
        '    """The room below."""\n'
        "\n"
        "    cdef int _n\n"
        "\n"
        "    cdef int _tick(self) except -1:\n"
        "        self._n += 1\n"
        "        self._notify_drained()\n"
        "        return 0\n"),
    "_core/door.pxi": (
        "cdef class _Door(_Hall):\n"
        "    cdef int _open(self) except -1:\n"
        "        self._tick()\n"
        "        return 0\n"),
    "_core_py.py": (
        "from ._core.door import _Door\n"
        "\n"
        "class DispatcherCore(_Door):\n"
        "    def __init__(self):\n"
        "        self._n = 0\n"),
    "_core/__init__.py": "",
    "_core/consts.py": (
        "_ONE, _TWO = 1, 2\n"
        "_INF = float(\"inf\")\n"
        "_MARK = object()\n"),
    "_core/hall.py": (
        "from .consts import _ONE\n"
        "\n"
        "class _Hall:\n"
        "    __slots__ = ('_n',)\n"
        "\n"
        "    def _tick(self):\n"
        "        self._n += 1\n"
        "        self._notify_drained()\n"),
    "_core/door.py": (
        "from .hall import _Hall\n"
        "\n"
        "class _Door(_Hall):\n"
        "    __slots__ = ()\n"
        "\n"
        "    def _open(self):\n"
        "        self._tick()\n"),
    "_dispatcher.py": (
        "class _Lifecycle:\n"
        "    def _notify_drained(self):\n"
        "        pass\n"
        "\n"
        "def build(core):\n"
        "    class OutboundDispatcher(_Lifecycle, core.DispatcherCore):\n"
        "        pass\n"
        "    return OutboundDispatcher\n"),
}


def _pair(tmp_path, edits=()):
    """The small pair in ``tmp_path``; ``edits``: file -> new text, or None to delete it."""
    files = dict(_PAIR)
    for name, text in dict(edits).items():
        if text is None:
            files.pop(name)
        else:
            files[name] = text
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return Cores(str(tmp_path))


def _all(cores, intended=None):
    intended = {} if intended is None else intended
    return (check_rooms(cores, pyx_only={}) + check_shapes(cores, intended, {})
            + check_constants(cores, intended, {}) + check_sizes(cores)
            + check_upward_calls(cores) + check_twin_names(cores))


def _one(problems, *words):
    assert len(problems) == 1, problems
    for word in words:
        assert word in problems[0], problems[0]


def test_check_passes_a_pair_without_drift(tmp_path):
    assert _all(_pair(tmp_path)) == []


def test_check_finds_a_room_missing_or_not_wired(tmp_path):
    problems = check_rooms(_pair(tmp_path / "a", {"_core/door.py": None}), {})
    assert any("room 'door'" in p and "no twin" in p for p in problems), problems
    cores = _pair(tmp_path / "b", {"_ringbuf.pyx": _PAIR["_ringbuf.pyx"].replace(
        'include "_core/door.pxi"\n', "")})
    _one(check_rooms(cores, {}), "door.pxi is not included")
    cores = _pair(tmp_path / "c", {"_core/extra.py": "X = 1\n",
                                   "_core/extra.pxi": "cdef int X\n"})
    problems = check_rooms(cores, {})
    assert len(problems) == 2, problems
    assert "extra.pxi is not included" in problems[0], problems
    assert "extra.py is not imported" in problems[1], problems
    _one(check_rooms(_pair(tmp_path / "d"), {"hall": "why"}), "PYX_ONLY_ROOMS", "'hall'")


def test_check_finds_a_method_or_field_on_one_side_and_honours_the_table(tmp_path):
    hall = _PAIR["_core/hall.py"] + "\n    def _tock(self):\n        pass\n"
    cores = _pair(tmp_path / "a", {"_core/hall.py": hall})
    _one(check_shapes(cores, {}, {}), "_Hall", "'_tock'", "twin only", "_core/hall.py")
    assert check_shapes(cores, {("hall", "_Hall", "_tock"): "why"}, {}) == []
    _one(check_shapes(_pair(tmp_path / "b"), {("hall", "_Hall", "_tock"): "why"}, {}),
         "agree there now")
    hall = _PAIR["_core/hall.pxi"].replace("cdef int _n\n", "cdef int _n, _m[4]\n")
    _one(check_shapes(_pair(tmp_path / "c", {"_core/hall.pxi": hall}), {}, {}),
         "field '_m'", "compiled core only")
    cores = _pair(tmp_path / "d", {"_core/hall.py": _PAIR["_core/hall.py"].replace(
        "('_n',)", "('n',)")})
    assert len(check_shapes(cores, {}, {})) == 2
    assert check_shapes(cores, {}, {("hall", "_Hall"): "why"}) == []
    consts = _PAIR["_core/consts.py"] + "def _helper():\n    pass\n"
    _one(check_shapes(_pair(tmp_path / "e", {"_core/consts.py": consts}), {}, {}),
         "room 'consts'", "'_helper'")


def test_check_finds_a_constant_with_another_value_or_a_missing_sentinel(tmp_path):
    cores = _pair(tmp_path / "a", {"_core/consts.py": _PAIR["_core/consts.py"].replace(
        "1, 2", "1, 3")})
    _one(check_constants(cores, {}, {}), "_TWO is 2", "but 3")
    cores = _pair(tmp_path / "b", {"_core/consts.py": _PAIR["_core/consts.py"].replace(
        "_MARK = object()\n", "")})
    _one(check_constants(cores, {}, {}), "sentinel _MARK", "compiled core only")
    cores = _pair(tmp_path / "b2", {
        "_core/consts.py": _PAIR["_core/consts.py"].replace("_MARK = object()\n", ""),
        "_core/hall.py": _PAIR["_core/hall.py"] + "\n_MARK = object()\n"})
    _one(check_constants(cores, {}, {}), "sentinel _MARK", "'consts'", "'hall'")
    cores = _pair(tmp_path / "c", {"_core/consts.pxi": _PAIR["_core/consts.pxi"].replace(
        "    _TWO = 2  # a comment\n", "    _TWO = 2\n    _THREE = 3\n")})
    problems = check_constants(cores, {}, {})
    _one(problems, "_THREE = 3", "compiled core only")
    assert check_constants(cores, {("consts", None, "_THREE"): "why"}, {}) == []


def test_check_finds_a_class_or_function_too_long(tmp_path):
    body = "".join("        x = %d\n" % i for i in range(78))
    door = _PAIR["_core/door.py"] + "\n    def _long(self):\n        # 80 lines\n" + body
    assert check_sizes(_pair(tmp_path / "a", {"_core/door.py": door})) == []
    door += "\n        return x\n"   # the blank line inside counts: 82
    _one(check_sizes(_pair(tmp_path / "b", {"_core/door.py": door})),
         "_Door._long is 82 lines")
    body = "".join("    cdef int _f%d(self) except -1:\n        return 0\n\n" % i
                   for i in range(167))
    hall = _PAIR["_core/hall.pxi"] + body
    problems = check_sizes(_pair(tmp_path / "c", {"_core/hall.pxi": hall}))
    _one(problems, "class _Hall is 509 lines", "_core/hall.pxi:1")


def test_check_finds_self_reaching_a_cdef_method_of_a_room_above(tmp_path):
    hall = _PAIR["_core/hall.pxi"].replace("self._notify_drained()",
                                           "self._open()")
    _one(check_upward_calls(_pair(tmp_path / "a", {"_core/hall.pxi": hall})),
         "self._open", "_Door", "room 'door'", "(<DispatcherCore>self)._open")
    hall = _PAIR["_core/hall.pxi"].replace("self._notify_drained()",
                                           "(<DispatcherCore>self)._open()")
    assert check_upward_calls(_pair(tmp_path / "b", {"_core/hall.pxi": hall})) == []
    hall = _PAIR["_core/hall.pxi"].replace("self._notify_drained()",
                                           "self._notify_drained()  # self._open()")
    assert check_upward_calls(_pair(tmp_path / "c", {"_core/hall.pxi": hall})) == []
    hall = _PAIR["_core/hall.pxi"].replace("self._notify_drained()", "self._nowhere()")
    _one(check_upward_calls(_pair(tmp_path / "d", {"_core/hall.pxi": hall})),
         "self._nowhere is defined by no class")


def test_check_finds_a_misspelt_name_in_the_twin(tmp_path):
    hall = _PAIR["_core/hall.py"].replace("self._n += 1", "self._nn = 1")
    _one(check_twin_names(_pair(tmp_path / "a", {"_core/hall.py": hall})),
         "_core/hall.py:7 (_Hall._tick): self._nn")
    door = _PAIR["_core/door.py"].replace("self._tick()", "self._notify_drained()")
    assert check_twin_names(_pair(tmp_path / "b", {"_core/door.py": door})) == []


def _real_copy(tmp_path):
    if not os.path.exists(os.path.join(SRC, "_ringbuf.pyx")):
        pytest.skip("needs the source checkout (src/fastdispatch/_ringbuf.pyx, _core/)")
    for name in os.listdir(SRC):
        if name in ("_ringbuf.pyx", "_core_py.py") or (
                name.startswith("_dispatcher") and name.endswith(".py")):
            shutil.copy(os.path.join(SRC, name), tmp_path / name)
    shutil.copytree(os.path.join(SRC, "_core"), tmp_path / "_core",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _edit(path, old, new):
    text = path.read_text(encoding="utf-8")
    assert old in text, old
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_check_finds_drift_planted_in_the_real_cores(tmp_path):
    src = _real_copy(tmp_path)
    _edit(src / "_core" / "constants.py", "_ASYNC = 5", "_ASYNC = 4")
    _edit(src / "_core" / "deadlines.pxi", "(<DispatcherCore>self)._dispatch(", "self._dispatch(")
    _edit(src / "_core" / "outcomes.py", "    def _panic(", "    def _panicked(")
    cores = Cores(str(src))
    _one(check_constants(cores), "_ASYNC is 5", "but 4")
    _one(check_upward_calls(cores), "self._dispatch", "room 'pool'")
    problems = check_shapes(cores)
    assert len(problems) == 2, problems
    assert "'_panic' is in the compiled core only" in problems[0], problems
    assert "'_panicked' is in the twin only" in problems[1], problems


_PUBLIC_DEF = re.compile(r'^( +)(?:async\s+)?def ([a-z]\w*)\([^)]*\)[^:]*:\s*\n\1    (?:r?"""(.*?)""")?',
                         re.M | re.S)


def public_docstrings(text):
    """{method name: its docstring, whitespace folded} for the public ``def``s of a room."""
    return {m.group(2): " ".join((m.group(3) or "").split()) for m in _PUBLIC_DEF.finditer(text)}


def test_public_methods_say_the_same_in_both_cores():
    # What a user reads in help() is the same whichever core was built.
    if not os.path.isdir(os.path.join(SRC, "_core")):
        pytest.skip("needs the source checkout (src/fastdispatch/_core/)")
    differ = []
    for name in sorted(os.listdir(os.path.join(SRC, "_core"))):
        if not name.endswith(".pxi"):
            continue
        twin = os.path.join(SRC, "_core", name[:-4] + ".py")
        if not os.path.exists(twin):
            continue
        with open(os.path.join(SRC, "_core", name), encoding="utf-8") as f:
            compiled = public_docstrings(f.read())
        with open(twin, encoding="utf-8") as f:
            pure = public_docstrings(f.read())
        differ += ["_core/%s: %s" % (name[:-4], method) for method in sorted(set(compiled) & set(pure))
                   if compiled[method] != pure[method]]
    assert not differ, ("a public method's docstring differs between the two cores "
                        "(make them the same): %s" % differ)


def test_public_docstring_check_sees_a_difference():
    one = 'class A:\n    def submit(self, x):\n        """Queue it."""\n        return 1\n'
    two = 'class A:\n    def submit(self, x):\n        """Queue it now."""\n        return 1\n'
    assert public_docstrings(one) == {"submit": "Queue it."}
    assert public_docstrings(one) != public_docstrings(two)
