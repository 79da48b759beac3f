"""The jinja2 sandbox chat templates render in (engine/chat_template.py), with bounds.

The sandbox stops attribute escapes but not a template that loops forever or builds a string of
gigabytes, so rendering and compiling also run under bounds:

- time: a trace function on the rendering thread checks a wall-clock deadline (RENDER_SECONDS,
  COMPILE_SECONDS) on every Python call and on every line of the template's own code. jinja2 has
  no timeout of its own, and a template loop with no output never comes back to a streaming
  render loop, so a check there alone would not catch it. This module's own frames are not
  traced: their loops are bounded by the size limit. CPython can swallow what a trace function
  raises, and then drops the trace function, so a watchdog thread stands behind it (_Watchdog).
- size: no single C-level operation may make a value larger than the size limit, checked BEFORE it
  runs, because one `'x' * 10**10` allocates 10 GB in one step that no deadline can interrupt:
  the binary operators (* ** + %), `~`, list/tuple/dict literals (shared references nest
  exponentially: [a, a] of [b, b] ...), every filter, every call of a str/bytes/int method,
  str.format, lipsum, the printed values and the rendered prompt itself. The limit is 1 MiB plus
  8 times the size of what the template is given (messages, tools, ...): a prompt has to fit a
  context window, and 1 MiB is several times the largest windows in characters, but a long
  conversation must never be refused just for being long. All text a render prints, into the
  prompt or into a `{% set %}` capture (which never reaches the streamed output), adds up against
  16 times that limit, which stops a loop that keeps bounded strings without end. Integers are kept under MAX_INT_BITS.
- recursion: a macro (or a recursive loop, or a block) calling itself ends in RecursionError,
  reported like any other failure; the interpreter is unharmed.
- source: at most MAX_SOURCE characters, compiled within COMPILE_SECONDS.
"""
from __future__ import annotations

import ctypes
import functools
import json
import re
import string
import sys
import threading
import time
import types
import weakref
import _weakrefset
from datetime import datetime
from typing import Any, Callable, Mapping

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from memra_engine.errors import TemplateError

RENDER_SECONDS = 2.0          # one render; real templates take milliseconds
COMPILE_SECONDS = 5.0         # compiling the source, once per model load (a 24 KiB template: ~0.6 s)
MIN_SIZE_LIMIT = 1 << 20      # characters: the floor of the size limit (see the module docstring)
INPUT_SIZE_FACTOR = 8         # ... plus this many times the size of the template's inputs
MADE_FACTOR = 16              # all text one render prints (captures too), in size limits
MAX_INT_BITS = 1 << 16        # integers past ~19700 digits are refused (and cannot be printed anyway)
MAX_SOURCE = 256 << 10        # characters of template source (real ones are 1-30 KiB)
MAX_JSON_INDENT = 64


class _RaisedByTemplate(Exception):
    """raise_exception() was called: the template itself rejected the conversation."""


class TooLarge(Exception):
    """An operation would make a value past the size limit (raised before it runs)."""


class OutOfTime(BaseException):
    """The deadline passed. A BaseException so no `except Exception` inside jinja2 swallows it."""


# -- the bounds of one render, per thread -----------------------------------------------------------


class Bounds:
    def __init__(self, limit: int, seconds: float | None):
        self.limit = limit
        self.made_limit = limit * MADE_FACTOR
        self.made = 0
        self.seconds = seconds
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.steps = 0
        self._sizes: dict[int, tuple[Any, int]] = {}   # id -> (the object, kept alive; its size)

    def size(self, value: Any, stop: int | None = None) -> int:
        """Characters `value` takes as text, roughly (str() of a container is at least this long);
        counts stop a little past `stop` (default: the limit), so a huge value costs little."""
        if type(value) is str:
            return len(value)
        stop = self.limit if stop is None else stop
        if isinstance(value, (str, bytes, bytearray)):
            return len(value)
        if isinstance(value, bool) or value is None or isinstance(value, float):
            return 1
        if isinstance(value, int):
            return value.bit_length() * 3 // 10 + 1
        if isinstance(value, Namespace):   # mutable through {% set ns.x %}: never cached
            return 2 + self.size(object.__getattribute__(value, "_Namespace__attrs"), stop)
        if not isinstance(value, (list, tuple, dict, set, frozenset)):
            return 1   # Undefined, macros, loop objects, ...: their str() is short or checked elsewhere
        cached = self._sizes.get(id(value))
        if cached is not None and cached[0] is value:
            return cached[1]
        total = 2
        items = value.items() if isinstance(value, dict) else value
        for item in items:
            total += self.size(item, stop - total) + 2
            if total > stop:
                return total   # partial: not cached
            self.steps += 1
            if not self.steps % 4096:   # this code is not traced: keep the deadline here too
                self.check_deadline()
        self.remember(value, total)
        return total

    def remember(self, value: Any, size: int) -> None:
        if len(self._sizes) > 4096:
            self._sizes.clear()
        self._sizes[id(value)] = (value, size)

    def check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise OutOfTime()

    def refuse_over(self, size: int, what: str) -> None:
        if size > self.limit:
            raise TooLarge(f"{what} would be {count_text(size)} characters, over the limit of {count_text(self.limit)}")

    def check(self, value: Any, what: str) -> Any:
        """A value made by the template: bounded (checked after it was made, for the operations
        whose result is at most a few times their checked inputs)."""
        if isinstance(value, str):
            self.refuse_over(len(value), what)
        elif isinstance(value, (list, tuple, dict, set, frozenset, Namespace, bytes, bytearray)):
            self.refuse_over(self.size(value), what)
        return value

    def printed(self, size: int) -> None:
        """Text printed by {{ }}, into the prompt or into a {% set %} / {% filter %} / macro capture:
        adds up against made_limit. Strings only computed are not counted: one kept in a variable
        replaces the last (live memory stays bounded), so a template may build its prompt up with
        `ns.text ~ piece` even when that copies quadratically."""
        self.made += size
        if self.made > self.made_limit:
            raise TooLarge(f"the template printed more than {count_text(self.made_limit)} characters in all")

    def tick(self) -> None:
        # on every traced event: a clock read costs less than the trace call itself, and checking
        # only every Nth event lets N slow steps (each a C call over a big list) run past
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise OutOfTime()


_local = threading.local()


def _bounds() -> Bounds:
    # outside a render or a compile (jinja2 folding constants elsewhere): sizes only, no deadline
    return getattr(_local, "bounds", None) or Bounds(MIN_SIZE_LIMIT, None)


_THIS_FILE = _bounds.__code__.co_filename
# weakref callbacks run wherever the collector frees an object, and what they raise is swallowed
# ('Exception ignored in'): the deadline is never raised in them (_Watchdog is the backstop for
# the finalizers no file name gives away)
_UNTICKED = {_THIS_FILE, weakref.__file__, _weakrefset.__file__}


def count_text(n: int) -> str:
    return f"{n / (1 << 20):.1f} Mi" if n >= 1 << 20 else str(n)


class _Watchdog:
    """The deadline's backstop. A trace function that raises is removed, and CPython swallows an
    exception raised inside a finalizer (a __del__, or a generator closed on its deallocation:
    'Exception ignored in ...'), so one OutOfTime raised there leaves the block with no deadline
    at all. If the block is still running GRACE_S past its deadline, this thread raises OutOfTime
    in it asynchronously (PyThreadState_SetAsyncExc), again every RETRY_S (one of those may land
    in a finalizer too), at most MAX_SENDS times. After stop() nothing more is sent; one sent just
    before is received by Bounded.__exit__."""

    GRACE_S = 0.25
    RETRY_S = 0.05
    MAX_SENDS = 40

    def __init__(self, seconds: float):
        self._thread_id = threading.get_ident()
        self._lock = threading.Lock()
        self._active = True
        self._stopped = threading.Event()
        threading.Thread(target=self._watch, args=(seconds,), name="memra-template-deadline", daemon=True).start()

    def _watch(self, seconds: float) -> None:
        if self._stopped.wait(seconds + self.GRACE_S):
            return
        for _ in range(self.MAX_SENDS):
            with self._lock:
                if not self._active:
                    return
                _set_async_exc(self._thread_id, OutOfTime)
            if self._stopped.wait(self.RETRY_S):
                return

    def stop(self) -> None:
        """No OutOfTime is sent after this; one sent before arrives at the caller's next Python
        call at the latest (clearing it instead, SetAsyncExc with NULL, hangs Python 3.11 when
        a trace function is set)."""
        with self._lock:
            self._active = False
        self._stopped.set()


def _set_async_exc(thread_id: int, exc: type[BaseException]) -> None:
    """Raise exc in the thread thread_id when it next checks for pending calls (a Python call,
    a loop's backward jump)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc))


def _arrive() -> None:
    """Does nothing: calling it is a check for pending calls, where an OutOfTime sent to this
    thread is raised."""


class Bounded:
    """Run a block under bounds: the trace function that keeps the deadline, on this thread only,
    and the watchdog behind it."""

    def __init__(self, bounds: Bounds):
        self.bounds = bounds

    def __enter__(self) -> Bounds:
        self._previous_bounds = getattr(_local, "bounds", None)
        self._previous_trace = sys.gettrace()
        _local.bounds = self.bounds
        tick = self.bounds.tick

        def local(frame, event, arg):
            # never on an 'exception' event: CPython clears the error after tracing the
            # StopIteration that ends a loop over a Python iterator (jinja2's LoopContext), so an
            # OutOfTime raised there would vanish, and with it this trace function
            if event != "exception":
                tick()
            return local

        def trace(frame, event, arg):
            # every call ticks; line events (the loops) only in the template's own code, which
            # keeps rendering fast: a loop inside a filter is over a size-checked input. This
            # module's own code is not traced (its loops are bounded by the size limit), so the
            # deadline never fires inside a check or inside __exit__ below.
            filename = frame.f_code.co_filename
            if filename in _UNTICKED:
                return None
            tick()
            return local if filename == "<template>" else None

        # the watchdog's thread starts before the trace function: the deadline must not pass
        # inside threading's own locks
        self._watchdog = _Watchdog(self.bounds.seconds) if self.bounds.seconds is not None else None
        sys.settrace(trace)
        return self.bounds

    def __exit__(self, *exc) -> None:
        sys.settrace(self._previous_trace)   # a debugger's or coverage's trace function comes back
        while self._watchdog is not None:
            try:
                self._watchdog.stop()
                _arrive()
                break
            except OutOfTime:   # sent just before stop() took the lock: the block is over anyway
                pass
        _local.bounds = self._previous_bounds


# -- checks before an operation runs -------------------------------------------------------------------

_PERCENT_SPEC = re.compile(r"%(?:\(([^)]*)\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?(.)", re.S)


def _width(n: str, b: Bounds) -> int:
    return int(n) if len(n) < 10 else b.limit + 1


def _check_percent(fmt: str, args: Any, b: Bounds) -> None:
    """`fmt % args`: the format's text, plus each conversion's width or precision and the value
    it prints (a repr may be a few times longer: the result is checked again after)."""
    total, index = len(fmt), 0
    for key, width, precision, conversion in _PERCENT_SPEC.findall(fmt):
        for n in (width, precision):
            if n == "*":
                raise TooLarge("'*' widths in % formatting are not supported")
            if n:
                total += _width(n, b)
        if conversion == "%":
            continue
        if key and isinstance(args, Mapping):
            total += b.size(args.get(key))
        elif isinstance(args, tuple):
            total += b.size(args[index]) if index < len(args) else 0
            index += 1
        else:
            total += b.size(args)
        b.refuse_over(total, "a % format")


def _check_format(fmt: str, args: tuple, kwargs: Mapping, b: Bounds) -> None:
    """str.format / format_map: as for %; a nested {} inside a format spec is refused."""
    total, index = len(fmt), 0
    for _literal, field, spec, _conversion in string.Formatter().parse(fmt):
        if field is None:
            continue
        if spec and "{" in spec:
            raise TooLarge("nested fields in a format spec are not supported")
        for n in re.findall(r"\d+", spec or ""):
            total += _width(n, b)
        first = re.split(r"[.\[]", field, maxsplit=1)[0]
        if first == "":
            value = args[index] if index < len(args) else None
            index += 1
        elif first.isdigit():
            value = args[int(first)] if int(first) < len(args) else None
        else:
            value = kwargs.get(first) if isinstance(kwargs, Mapping) else None
        total += b.size(value)
        b.refuse_over(total, "str.format")


def _int_over(n: Any, b: Bounds) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > b.limit


def _check_str_method(text: str | bytes, name: str, args: tuple, kwargs: Mapping, b: Bounds) -> None:
    if name in ("center", "ljust", "rjust", "zfill") and args:
        b.refuse_over(max(len(text), args[0] if isinstance(args[0], int) else 0), f"str.{name}")
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tab, int):
            b.refuse_over(len(text) + text.count("\t" if isinstance(text, str) else b"\t") * max(tab, 0),
                          "str.expandtabs")
    elif name == "replace" and len(args) >= 2:
        old, new = args[0], args[1]
        if isinstance(old, (str, bytes)) and isinstance(new, (str, bytes)):
            n = text.count(old) if old else len(text) + 1
            if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
                n = min(n, args[2])
            b.refuse_over(len(text) + n * max(len(new) - len(old), 0), "str.replace")
    elif name == "join" and args:
        items = args[0]
        count = len(items) if isinstance(items, (str, list, tuple, dict, set, frozenset)) else 1
        b.refuse_over(b.size(items) + len(text) * count, "str.join")
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((b.size(v) for v in args[0].values()), default=1)
        b.refuse_over(len(text) * max(longest, 1), "str.translate")


def _check_binop(op: str, left: Any, right: Any, b: Bounds) -> int | None:
    """Refuses an operation whose result would be too large; returns the result's size when it
    is a repeated or joined sequence (so the result need not be walked again)."""
    ints = isinstance(left, int) and isinstance(right, int)
    if op == "**":
        if ints and right > 0 and abs(left) > 1 and abs(left).bit_length() * right > MAX_INT_BITS:
            raise TooLarge(f"{_short(left)} ** {_short(right)} is too large a number")
    elif op == "*":
        if ints:
            if abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS:
                raise TooLarge("the product is too large a number")
            return
        seq, n = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(n, int) and isinstance(seq, (str, bytes, list, tuple)) and n > 0:
            size = b.size(seq) * n
            b.refuse_over(size, f"repeating a {type(seq).__name__} {_short(n)} times")
            return size
    elif op == "+":
        if not ints and isinstance(left, (str, bytes, list, tuple)):
            size = b.size(left) + b.size(right)
            b.refuse_over(size, "the sum")
            return size
    elif op == "%":
        if isinstance(left, str):
            _check_percent(left, right, b)
    return None


def _short(n: Any) -> str:
    text = str(n) if not isinstance(n, int) or n.bit_length() < 64 else f"an integer of {n.bit_length()} bits"
    return text if len(text) <= 40 else text[:37] + "..."


# -- the filters, each checked ------------------------------------------------------------------------


def _guard_filter(name: str, func: Callable) -> Callable:
    """The filter with its inputs and its result bounded, and the few whose arguments set the size
    of what they make (center's width, indent's width, ...) estimated before they run."""
    skip = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(func)   # keeps jinja_pass_arg (pass_context, pass_environment, ...)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        b = _bounds()
        real = args[skip:]
        value, params = (real[0] if real else None), list(real[1:]) + list(kwargs.values())
        b.refuse_over(b.size(value), f"the input of |{name}")
        for p in params:
            if _int_over(p, b):
                raise TooLarge(f"|{name}({_short(p)}) is over the size limit of {count_text(b.limit)}")
            b.refuse_over(b.size(p), f"an argument of |{name}")
        text = value if isinstance(value, str) else str(value) if name in ("center", "indent", "wordwrap") else ""
        if name == "center":
            width = real[1] if len(real) > 1 else kwargs.get("width", 80)
            b.refuse_over(max(len(text), width if isinstance(width, int) else 0), "|center")
        elif name == "indent":
            width = real[1] if len(real) > 1 else kwargs.get("width", 4)
            w = len(str(width)) if not isinstance(width, int) else max(width, 0)
            b.refuse_over(len(text) + (text.count("\n") + 1) * w, "|indent")
        elif name == "wordwrap":   # (s, width, break_long_words, wrapstring, ...)
            wrap = kwargs.get("wrapstring") or (real[3] if len(real) > 3 else None) or "\n"
            b.refuse_over(len(text) * (1 + len(str(wrap))), "|wordwrap")
        elif name == "replace" and len(real) >= 3:
            _check_str_method(str(value), "replace", tuple(real[1:]), {}, b)
        elif name == "join":
            if not isinstance(value, (str, list, tuple, dict)):   # a generator (|map, |select): count it
                value = list(value)
                args = args[:skip] + (value,) + args[skip + 1:]
            sep = real[1] if len(real) > 1 else kwargs.get("d", "")
            count = len(value)
            b.refuse_over(b.size(value) + count * b.size(sep), "|join")
        elif name == "format":
            _check_percent(str(value), tuple(real[1:]) or kwargs, b)
        elif name == "sum":
            items = list(value) if value is not None else []
            value = items
            args = args[:skip] + (items,) + args[skip + 1:]
            start = kwargs.get("start", real[2] if len(real) > 2 else 0)   # (iterable, attribute, start)
            attribute = kwargs.get("attribute", real[1] if len(real) > 1 else None)
            numbers = isinstance(start, (int, float)) and (
                attribute is not None or all(isinstance(x, (int, float)) for x in items))
            if not numbers:   # lists added up: quadratic, in one C call
                b.refuse_over((len(items) + 1) * (b.size(items) + b.size(start)), "|sum")
        return b.check(func(*args, **kwargs), f"the result of |{name}")

    return guarded


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson HTML-escapes <, > and &, which would corrupt prompts. The pure-Python
    # iterencode makes the text in small pieces, so a huge indent is stopped on the way.
    if isinstance(indent, int) and indent > MAX_JSON_INDENT or isinstance(indent, str) and len(indent) > MAX_JSON_INDENT:
        raise TooLarge(f"tojson indent is over {MAX_JSON_INDENT}")
    b = _bounds()
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    pieces, total = [], 0
    for piece in encoder.iterencode(value):
        total += len(piece)
        b.refuse_over(total, "tojson")
        pieces.append(piece)
        if not len(pieces) % 4096:   # this module is not traced: keep the deadline here
            b.check_deadline()
    return "".join(pieces)


def _raise_exception(message: str) -> None:
    raise _RaisedByTemplate(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _one_line(text: Any) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= 300 else line[:297] + "..."


# -- the environment ----------------------------------------------------------------------------------


class _BoundedCodeGenerator(CodeGenerator):
    """`~` and list/tuple/dict literals go through the environment, which checks their size."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.memra_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        self.write("environment.memra_literal(")
        super().visit_List(node, frame)
        self.write(")")

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self.write("environment.memra_literal(")
        super().visit_Dict(node, frame)
        self.write(")")

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        if node.ctx != "load":   # an assignment target: {% for a, b in ... %}
            return super().visit_Tuple(node, frame)
        self.write("environment.memra_literal(")
        super().visit_Tuple(node, frame)
        self.write(")")


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """The stock sandbox answers `x.__class__` with an undefined value that only fails when used,
    so `{{ x.__class__ }}` would quietly print nothing. Refuse the access itself instead. And
    every operation that could make a huge value in one step is checked first (see the module
    docstring)."""

    code_generator_class = _BoundedCodeGenerator
    # intercepted operators are also never folded at compile time ('x' * 10**10 would be)
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is not allowed")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        b = _bounds()
        if operator == "+" and type(left) is str and type(right) is str:   # the common case, fast
            n = len(left) + len(right)
            b.refuse_over(n, "the sum")
            return left + right
        size = _check_binop(operator, left, right, b)
        result = self.binop_table[operator](left, right)
        if size is not None and isinstance(result, (list, tuple)):
            b.remember(result, size)   # [x] * 100000: known without walking 100000 items
            return result
        return b.check(result, f"the result of {operator}")

    def memra_concat(self, parts: tuple) -> str:
        b = _bounds()
        total = 0
        for part in parts:
            total += b.size(part, b.limit - total)
            b.refuse_over(total, "the ~ concatenation")
        return b.check("".join(map(str, parts)), "the ~ concatenation")

    def memra_literal(self, value: Any) -> Any:
        b = _bounds()
        b.refuse_over(b.size(value), f"a {type(value).__name__} literal")
        return value

    def memra_finalize(self, value: Any) -> Any:
        b = _bounds()
        size = b.size(value)
        b.refuse_over(size, "printing a value")
        b.printed(size)
        return value

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        b = _bounds()
        owner = getattr(__obj, "__self__", None)
        if isinstance(__obj, types.BuiltinMethodType) and isinstance(owner, (str, bytes, bytearray, int)):
            for a in list(args) + list(kwargs.values()):
                if _int_over(a, b):   # a width, a length, a tab size, to_bytes' length
                    raise TooLarge(f"{type(owner).__name__}.{__obj.__name__}({_short(a)}) is over the size limit")
            if isinstance(owner, (str, bytes, bytearray)):
                if __obj.__name__ == "join" and args and not isinstance(args[0], (str, list, tuple, dict)):
                    args = (list(args[0]),) + args[1:]   # a generator: count what it gives first
                _check_str_method(owner, __obj.__name__, args, kwargs, b)
        elif __obj is _LIPSUM:
            for a in list(args) + list(kwargs.values()):
                if isinstance(a, int) and a > 1000:
                    raise TooLarge(f"lipsum({_short(a)}) is too long")
        return b.check(super().call(__context, __obj, *args, **kwargs), "the result of a call")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt, is_map = value.__self__, value.__name__ == "format_map"

        @functools.wraps(wrapper)
        def checked(*args: Any, **kwargs: Any) -> str:
            b = _bounds()
            _check_format(fmt, () if is_map else args, args[0] if is_map and args else kwargs, b)
            return b.check(wrapper(*args, **kwargs), "str.format")

        return checked


_LIPSUM = jinja2.Environment().globals["lipsum"]


class _GenerationTag(jinja2.ext.Extension):
    """transformers' {% generation %}...{% endgeneration %}, which marks the assistant's text for
    its training masks: here it renders its body, in its own scope as transformers' does."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _NoImports(jinja2.BaseLoader):
    """{% import %}, {% include %} and {% extends %} would reach outside the one template string."""

    def get_source(self, environment: jinja2.Environment, template: str):
        raise SecurityError(f"templates may not import, include or extend {template!r}")


def make_environment() -> jinja2.Environment:
    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationTag],
                         loader=_NoImports())
    env.finalize = env.memra_finalize
    for name, func in list(env.filters.items()):
        env.filters[name] = _guard_filter(name, func)
    env.filters["tojson"] = _tojson   # bounds itself
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def failure(e: BaseException, seconds: float | None) -> TemplateError:
    """The one-line TemplateError for whatever stopped a compile or a render."""
    if isinstance(e, OutOfTime):
        return TemplateError(f"chat template stopped: it ran longer than {seconds:g} s")
    if isinstance(e, _RaisedByTemplate):
        return TemplateError(f"chat template error: {_one_line(e)}")
    if isinstance(e, SecurityError):
        return TemplateError(f"chat template refused: {_one_line(e)}")
    if isinstance(e, TooLarge):
        return TemplateError(f"chat template stopped: {_one_line(e)}")
    if isinstance(e, (RecursionError, MemoryError)):
        what = "recursed too deeply" if isinstance(e, RecursionError) else "ran out of memory"
        return TemplateError(f"chat template stopped: it {what}")
    if isinstance(e, jinja2.TemplateSyntaxError):
        return TemplateError(f"chat template has a syntax error at line {e.lineno}: {_one_line(e.message)}")
    return TemplateError(f"chat template failed: {type(e).__name__}: {_one_line(e)}")
