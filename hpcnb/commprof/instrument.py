"""Static instrumentation: the ``@kernel`` decorator and its AST pass.

A kernel is a Python function written over an explicit thread id::

    @commprof.kernel
    def jacobi(tid, nthreads, phase, a, b):
        for i in commprof.prange(1, a.shape[0] - 1):   # work-shared loop
            for j in range(1, a.shape[1] - 1):
                b[i, j] = 0.25 * (a[i - 1, j] + a[i + 1, j] + a[i, j - 1] + a[i, j + 1])

The first three parameters are the thread id, the thread count and the barrier phase;
the rest are arrays (any parameter that is subscripted or asked for ``.shape``) and
scalars. The runtime calls the kernel for every phase and thread with a barrier between
phases. ``prange(lo, hi)`` marks a work-shared loop whose iterations a schedule deals to
the threads.

The pass produces two variants compiled by Numba: *native* (``prange`` turned into the
thread's scheduled iterations, nothing else changed) and *instrumented* (additionally
every array load ``a[i, j]`` becomes ``ld2(S, aid, a, i, j)``, every store becomes
``st2(...)``, every loop is wrapped in ``enter(S, rid)`` / ``leave(S, rid)``, where a
region ``rid`` is identified by the loop's source line). Constructs it cannot instrument
raise :class:`InstrumentationError` naming file and line.
"""

from __future__ import annotations

import ast
import builtins
import copy
import inspect
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcnb.codecache import load_generated
from hpcnb.errors import HpcnbError, UnknownNameError
from hpcnb.paths import cache_root

__all__ = ["InstrumentationError", "Kernel", "Region", "kernel", "prange"]

_SHAPE_ATTRS = {"shape", "size", "ndim"}
_NOT_ALLOWED = {
    ast.With: "'with' blocks",
    ast.Try: "'try' blocks",
    ast.FunctionDef: "nested function definitions",
    ast.Lambda: "lambdas",
    ast.Yield: "generators",
    ast.Global: "'global' statements",
    ast.Nonlocal: "'nonlocal' statements",
    ast.ListComp: "comprehensions (hidden loops)",
    ast.GeneratorExp: "generator expressions (hidden loops)",
    ast.DictComp: "comprehensions (hidden loops)",
    ast.SetComp: "comprehensions (hidden loops)",
}


class InstrumentationError(HpcnbError, ValueError):
    """A kernel construct the profiler cannot instrument (message names file and line)."""


def prange(*args: int) -> range:
    """Mark a work-shared loop inside a kernel (plain ``range`` when called from Python)."""
    return range(*args)


@dataclass(frozen=True)
class Region:
    """A profiled code region: the kernel body (id 0) or one loop.

    Attributes:
        rid: Region id (index into the per-region matrices).
        line: Source line of the loop (of the ``def`` for the kernel region).
        parent: Enclosing region id (-1 for the kernel region).
        kind: ``"kernel"``, ``"for"``, ``"prange"`` or ``"while"``.
        text: The loop header as written.
    """

    rid: int
    line: int
    parent: int
    kind: str
    text: str


def _is_prange(node: ast.expr) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Name) and f.id == "prange") or (
        isinstance(f, ast.Attribute) and f.attr == "prange"
    )


class _Analyzer(ast.NodeVisitor):
    """Validate a kernel, find array parameters and number the loop regions."""

    def __init__(self, fn: ast.FunctionDef, file: str, params: list[str]) -> None:
        self.file = file
        self.params = params
        self.arrays: set[str] = set()
        self.regions: list[Region] = [Region(0, fn.lineno, -1, "kernel", f"def {fn.name}")]
        self.loop_rid: dict[int, int] = {}
        self._stack = [0]
        self._depth_prange = 0
        self.locals: set[str] = set()
        self.names: set[str] = set()
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Name)
                and node.value.id in params[3:]
            ):
                self.arrays.add(node.value.id)
            if (
                isinstance(node, ast.Attribute)
                and node.attr in _SHAPE_ATTRS
                and isinstance(node.value, ast.Name)
                and node.value.id in params[3:]
            ):
                self.arrays.add(node.value.id)

    def fail(self, node: ast.AST, what: str) -> None:
        raise InstrumentationError(
            f"{self.file}:{getattr(node, 'lineno', '?')}: cannot instrument {what}"
        )

    def generic_visit(self, node: ast.AST) -> None:
        for bad, what in _NOT_ALLOWED.items():
            if isinstance(node, bad):
                self.fail(node, what)
        super().generic_visit(node)

    def _loop(self, node: ast.For | ast.While, kind: str) -> None:
        if node.orelse:
            self.fail(node, "a loop with an 'else' clause")
        rid = len(self.regions)
        header = ast.unparse(node).splitlines()[0]
        self.regions.append(Region(rid, node.lineno, self._stack[-1], kind, header))
        self.loop_rid[id(node)] = rid
        self._stack.append(rid)
        self.generic_visit(node)
        self._stack.pop()

    def visit_For(self, node: ast.For) -> None:
        if _is_prange(node.iter):
            if self._depth_prange:
                self.fail(node, "a prange nested inside another prange")
            if not isinstance(node.target, ast.Name):
                self.fail(node, "a prange loop whose target is not a single name")
            if node.iter.keywords or not 1 <= len(node.iter.args) <= 2:  # type: ignore[attr-defined]
                self.fail(node, "prange with a step or keywords (use prange(hi) or prange(lo, hi))")
            self._depth_prange += 1
            self._loop(node, "prange")
            self._depth_prange -= 1
        else:
            self._loop(node, "for")

    def visit_While(self, node: ast.While) -> None:
        self._loop(node, "while")

    def visit_Return(self, node: ast.Return) -> None:
        if len(self._stack) > 1:
            self.fail(node, "'return' inside a loop (the region exit hook would be skipped)")
        if node.value is not None:
            self.fail(node, "'return' with a value (kernels write their results to arrays)")

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store):
            if node.id in self.arrays or node.id in self.params[:3]:
                self.fail(node, f"an assignment to parameter '{node.id}'")
            self.locals.add(node.id)
        else:
            self.names.add(node.id)
            if node.id in self.arrays:
                self.fail(
                    node,
                    f"a whole-array use of '{node.id}' (only element accesses a[i], "
                    f"'{node.id}.shape' and len({node.id}) are allowed)",
                )

    def visit_Subscript(self, node: ast.Subscript) -> None:
        base = node.value
        if isinstance(base, ast.Name) and base.id in self.arrays:
            idx = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if any(isinstance(x, ast.Slice) for x in idx):
                self.fail(node, f"a slice of '{base.id}' (access single elements)")
            if not 1 <= len(idx) <= 3:
                self.fail(node, f"a {len(idx)}-d index of '{base.id}' (1 to 3 indices)")
            for x in idx:
                self.visit(x)
            return
        if isinstance(base, ast.Attribute) and base.attr == "shape":
            self.visit(base)
            self.visit(node.slice)
            return
        name = ast.unparse(base)
        self.fail(node, f"a subscript of '{name}', which is not an array argument of the kernel")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in self.arrays:
            if node.attr not in _SHAPE_ATTRS:
                self.fail(node, f"'{node.value.id}.{node.attr}' (whole-array operation)")
            return
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if (
            isinstance(node.func, ast.Name)
            and node.func.id == "len"
            and len(node.args) == 1
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in self.arrays
        ):
            return
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) != 1 and any(isinstance(t, ast.Subscript) for t in node.targets):
            self.fail(node, "a chained assignment to array elements")
        t = node.targets[0]
        if isinstance(t, ast.Tuple) and any(isinstance(e, ast.Subscript) for e in t.elts):
            self.fail(node, "tuple unpacking into array elements")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if isinstance(node.target, ast.Subscript):
            self.fail(node, "an annotated assignment to an array element")
        self.generic_visit(node)


class _Rewriter(ast.NodeTransformer):
    """Rewrite prange loops (both variants) and accesses/loops into hooks (instrumented)."""

    def __init__(
        self, an: _Analyzer, params: list[str], hooks: bool, sampled: bool = False
    ) -> None:
        self.an = an
        self.aid = {p: k for k, p in enumerate(q for q in params[3:] if q in an.arrays)}
        self.tid, self.nth = params[0], params[1]
        self.hooks = hooks
        # sampled variant: _cp_sld*/_cp_sst* hooks that get the word sample's threshold and
        # the array's element base as locals (read once at kernel entry, see _sampled_prologue)
        self.sampled = sampled
        self.lead = 6 if sampled else 3  # hook arguments before the indices
        self.counter = 0

    @staticmethod
    def _call(name: str, args: list[ast.expr]) -> ast.Call:
        return ast.Call(func=ast.Name(name, ast.Load()), args=args, keywords=[])

    def _hook(self, kind: str, args: list[ast.expr], value: ast.expr | None = None) -> ast.Call:
        prefix = "_cp_s" if self.sampled else ""
        tail = [] if value is None else [value]
        return self._call(f"{prefix}{kind}{len(args) - self.lead}", [*args, *tail])

    def _hook_args(self, node: ast.Subscript) -> list[ast.expr]:
        name = node.value.id  # type: ignore[attr-defined]
        idx = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        idx = [self.visit(x) for x in idx]
        aid = self.aid[name]
        state: list[ast.expr] = [ast.Name("_cp_S", ast.Load())]
        if self.sampled:
            state += [ast.Name(n, ast.Load()) for n in ("_cp_t", "_cp_m", f"_cp_b{aid}")]
        return [*state, ast.Constant(aid), node.value, *idx]

    def _is_array(self, node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id in self.aid
        )

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        if self.hooks and self._is_array(node) and isinstance(node.ctx, ast.Load):
            return self._hook("ld", self._hook_args(node))
        return self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> Any:
        if self.hooks and self._is_array(node.targets[0]):
            args = self._hook_args(node.targets[0])  # type: ignore[arg-type]
            value = self.visit(node.value)
            call = self._hook("st", args, value)
            return ast.copy_location(ast.Expr(call), node)
        return self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        if not (self.hooks and self._is_array(node.target)):
            return self.generic_visit(node)
        args = self._hook_args(node.target)  # type: ignore[arg-type]
        out: list[ast.stmt] = []
        for k in range(self.lead, len(args)):
            tmp = f"_cp_i{self.counter}"
            self.counter += 1
            out.append(ast.Assign([ast.Name(tmp, ast.Store())], args[k], lineno=node.lineno))
            args[k] = ast.Name(tmp, ast.Load())
        load = self._hook("ld", list(args))
        value = ast.BinOp(load, node.op, self.visit(node.value))
        out.append(ast.Expr(self._hook("st", args, value)))
        return [ast.copy_location(s, node) for s in out]

    def _wrap(self, node: ast.stmt, loop: ast.stmt | list[ast.stmt]) -> list[ast.stmt]:
        body = loop if isinstance(loop, list) else [loop]
        if not self.hooks:
            return body
        rid = ast.Constant(self.an.loop_rid[id(node)])
        s = ast.Name("_cp_S", ast.Load())
        return [
            ast.Expr(self._call("enter", [s, rid])),
            *body,
            ast.Expr(self._call("leave", [s, copy.copy(rid)])),
        ]

    def visit_For(self, node: ast.For) -> Any:
        key = id(node)
        if not _is_prange(node.iter):
            node = self.generic_visit(node)  # type: ignore[assignment]
            self.an.loop_rid[id(node)] = self.an.loop_rid[key]
            return self._wrap(node, node)
        args = [self.visit(a) for a in node.iter.args]  # type: ignore[attr-defined]
        lo, hi = (ast.Constant(0), args[0]) if len(args) == 1 else (args[0], args[1])
        k = self.counter
        self.counter += 1
        it, kk, vlo, vhi = f"_cp_it{k}", f"_cp_k{k}", f"_cp_lo{k}", f"_cp_hi{k}"
        tid, nth, tgt = self.tid, self.nth, node.target.id  # type: ignore[attr-defined]
        body: list[ast.stmt] = []
        for b in (self.visit(s) for s in node.body):
            body.extend(b if isinstance(b, list) else [b])
        # static blocks: a plain range (vectorisable); other schedules: the iteration list
        tmpl = ast.parse(
            f"if _cp_sched[0] == 0:\n"
            f"    for {tgt} in range({vlo} + (({vhi} - {vlo}) * {tid}) // {nth},"
            f" {vlo} + (({vhi} - {vlo}) * ({tid} + 1)) // {nth}):\n"
            f"        pass\n"
            f"else:\n"
            f"    {it} = sched_iters(_cp_sched, {tid}, {nth}, {vlo}, {vhi})\n"
            f"    for {kk} in range({it}.shape[0]):\n"
            f"        {tgt} = {it}[{kk}]\n"
        ).body[0]
        assert isinstance(tmpl, ast.If)
        tmpl.body[0].body = body  # type: ignore[attr-defined]
        tmpl.orelse[1].body.extend(copy.deepcopy(body))  # type: ignore[attr-defined]
        setup = [
            ast.Assign([ast.Name(vlo, ast.Store())], lo, lineno=node.lineno),
            ast.Assign([ast.Name(vhi, ast.Store())], hi, lineno=node.lineno),
        ]
        for n in ast.walk(tmpl):
            if hasattr(n, "lineno"):
                n.lineno = node.lineno
        self.an.loop_rid[id(tmpl)] = self.an.loop_rid[key]
        return [*setup, *self._wrap(node, tmpl)]

    def visit_While(self, node: ast.While) -> Any:
        key = id(node)
        node = self.generic_visit(node)  # type: ignore[assignment]
        self.an.loop_rid[id(node)] = self.an.loop_rid[key]
        return self._wrap(node, node)


def _cache_dir() -> Path:
    """Return the folder of generated kernel modules: ``<cache root>/commprof`` (not created).

    The cache root is :func:`hpcnb.paths.cache_root` (``$HPCNB_CACHE``, else the user cache
    folder). :func:`hpcnb.codecache.load_generated` creates it, or runs the kernels from a
    private temporary folder when it cannot be written.
    """
    return cache_root() / "commprof"


def _hooks_digest() -> str:
    """Short hash of the source of :mod:`hpcnb.commprof.hooks`."""
    import hashlib

    import hpcnb.commprof.hooks as hooks_module

    return hashlib.sha256(Path(hooks_module.__file__).read_bytes()).hexdigest()[:16]


def _resolve_global(name: str, value: object, file: str, line: int) -> str:
    if isinstance(value, types.ModuleType):
        return f"import {value.__name__} as {name}"
    if isinstance(value, bool | int | float):
        return f"{name} = {value!r}"
    mod = getattr(value, "__module__", None)
    qual = getattr(value, "__qualname__", getattr(value, "__name__", None))
    if mod and mod != "__main__" and qual and "." not in qual:
        return f"from {mod} import {qual} as {name}"
    raise InstrumentationError(
        f"{file}:{line}: cannot instrument the use of global '{name}' ({type(value).__name__}):"
        " kernels may use modules, numbers and importable functions only"
    )


#: Generated with every kernel module: the borrowed-state intrinsic and the sampled hooks.
#: ``_cp_borrow`` clears the reference-count handle (meminfo) of each array of a tuple, so
#: that passing the state tuple to a kernel call costs no atomic reference-count updates
#: (the caller keeps the arrays alive). The sampled hooks test the word sample first
#: (``(base + flat) * FIB < t``, the threshold ``t`` and the array's base being locals of
#: the kernel) and touch the profiler state only for sampled words; ``m > 0`` indexes the
#: exact shadow by the compact id ``((h >> 32) * m) >> 32`` of the hash ``h``.
_SAMPLED_HOOKS = """from numba.core import cgutils as _cp_cgutils
from numba.extending import intrinsic as _cp_intrinsic
from hpcnb.commprof.hooks import _FIB, _at2, _at3, _wrap, record_access

_cp_hot = njit(cache=True, _nrt=False)


@_cp_intrinsic
def _cp_borrow(typingctx, tup):
    def codegen(context, builder, sig, args):
        out = args[0]
        for k, ty in enumerate(sig.args[0]):
            ary = context.make_array(ty)(context, builder, value=builder.extract_value(out, k))
            ary.meminfo = _cp_cgutils.get_null_value(ary.meminfo.type)
            out = builder.insert_value(out, ary._getvalue(), k)
        return out

    return tup(tup), codegen


@_cp_hot
def _cp_hit(S, m, h, e, aid, flat, is_write):
    isz = S[3][aid]
    x = np.int64(e) if m == 0 else np.int64(((h >> np.uint64(32)) * m) >> np.uint64(32))
    record_access(S, x, S[2][aid] + flat * isz, isz, is_write)


@_cp_hot
def _cp_sld1(S, t, m, b, aid, a, i):
    i = _wrap(i, a.shape[0])
    e = b + np.uint64(i)
    if e * _FIB < t:
        _cp_hit(S, m, e * _FIB, e, aid, i, False)
    return a[i]


@_cp_hot
def _cp_sld2(S, t, m, b, aid, a, i, j):
    i, j, flat = _at2(a, i, j)
    e = b + np.uint64(flat)
    if e * _FIB < t:
        _cp_hit(S, m, e * _FIB, e, aid, flat, False)
    return a[i, j]


@_cp_hot
def _cp_sld3(S, t, m, b, aid, a, i, j, k):
    i, j, k, flat = _at3(a, i, j, k)
    e = b + np.uint64(flat)
    if e * _FIB < t:
        _cp_hit(S, m, e * _FIB, e, aid, flat, False)
    return a[i, j, k]


@_cp_hot
def _cp_sst1(S, t, m, b, aid, a, i, v):
    i = _wrap(i, a.shape[0])
    a[i] = v
    e = b + np.uint64(i)
    if e * _FIB < t:
        _cp_hit(S, m, e * _FIB, e, aid, i, True)


@_cp_hot
def _cp_sst2(S, t, m, b, aid, a, i, j, v):
    i, j, flat = _at2(a, i, j)
    a[i, j] = v
    e = b + np.uint64(flat)
    if e * _FIB < t:
        _cp_hit(S, m, e * _FIB, e, aid, flat, True)


@_cp_hot
def _cp_sst3(S, t, m, b, aid, a, i, j, k, v):
    i, j, k, flat = _at3(a, i, j, k)
    a[i, j, k] = v
    e = b + np.uint64(flat)
    if e * _FIB < t:
        _cp_hit(S, m, e * _FIB, e, aid, flat, True)
"""


def _sampled_prologue(body: list[ast.stmt], n_arrays: int) -> list[ast.stmt]:
    """Read the sampled variant's locals from ``_cp_P`` at kernel entry (after a docstring).

    ``_cp_P`` (uint64) holds the sample threshold, the compact-shadow multiplier and the
    element base of each array: loop-invariant values the hooks then get in registers.
    """
    names = ["_cp_t", "_cp_m", *(f"_cp_b{k}" for k in range(n_arrays))]
    pro = ast.parse("\n".join(f"{n} = _cp_P[{k}]" for k, n in enumerate(names))).body
    doc = (
        1
        if body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
        else 0
    )
    return [*body[:doc], *pro, *body[doc:]]


def _drivers(own: list[str], arrays: list[str]) -> str:
    """Source of the drivers ``drive_native``, ``drive_instr``, ``drive_samp``, ``drive_parallel``.

    The profiling drivers borrow the state tuple and the arrays (``_cp_borrow``) before the
    phase loop.

    Args:
        own: The kernel's own parameters.
        arrays: Its array parameters.
    """
    u = "".join(", " + p for p in own)
    arr = "".join(p + ", " for p in arrays)
    loop = """    ctl = _cp_S[0]
    for phase in range(nphases):
        ctl[6] = phase
        for r in range(nthreads):
            tid = order[phase, r]
            ctl[0] = tid
            ctl[1] = 0
            ctl[2] = 0
"""
    borrow = f"    ({arr}) = _cp_borrow(({arr}))\n" if arrays else ""
    return f"""
@njit(cache=True)
def drive_native(nthreads, nphases, order, _cp_sched{u}):
    for phase in range(nphases):
        for r in range(nthreads):
            _cp_native(order[phase, r], nthreads, phase, _cp_sched{u})


@njit(cache=True)
def drive_instr(nthreads, nphases, order, _cp_sched{u}, _cp_S):
    _cp_S = _cp_borrow(_cp_S)
{borrow}{loop}            _cp_instr(tid, nthreads, phase, _cp_sched{u}, _cp_S)


@njit(cache=True)
def drive_samp(nthreads, nphases, order, _cp_sched{u}, _cp_S, _cp_P):
    _cp_S = _cp_borrow(_cp_S)
    ({arr}_cp_P,) = _cp_borrow(({arr}_cp_P,))
{loop}            _cp_samp(tid, nthreads, phase, _cp_sched{u}, _cp_S, _cp_P)


@njit(cache=True, parallel=True)
def drive_parallel(nthreads, nphases, _cp_sched{u}):
    for phase in range(nphases):
        for tid in _cp_prange(nthreads):
            _cp_native(tid, nthreads, phase, _cp_sched{u})
"""


class Kernel:
    """A kernel with its native and instrumented Numba variants (see module docstring).

    Attributes:
        name: The function name.
        file: Source file of the kernel.
        params: All parameter names (tid, nthreads, phase, then the kernel's own).
        arrays: Names of array parameters in parameter order (array id = position).
        regions: The loop regions, region 0 being the kernel body.
        native_source: Generated Python source of the native variant.
        instrumented_source: Generated Python source of the instrumented variant.
    """

    def __init__(self, fn: Callable[..., None]) -> None:
        self.py_func = fn
        self.name = fn.__name__
        self.file = inspect.getsourcefile(fn) or "<unknown>"
        lines, start = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
        ast.increment_lineno(tree, start - 1)
        fdef = tree.body[0]
        if not isinstance(fdef, ast.FunctionDef):
            raise InstrumentationError(f"{self.file}:{start}: @kernel expects a function")
        fdef.decorator_list = []
        a = fdef.args
        if a.vararg or a.kwarg or a.kwonlyargs or a.defaults or a.posonlyargs:
            raise InstrumentationError(
                f"{self.file}:{fdef.lineno}: kernel parameters must be plain positional names"
            )
        self.params = [p.arg for p in a.args]
        if len(self.params) < 3:
            raise InstrumentationError(
                f"{self.file}:{fdef.lineno}: a kernel takes (tid, nthreads, phase, ...), "
                f"got {len(self.params)} parameter(s)"
            )
        an = _Analyzer(fdef, self.file, self.params)
        for stmt in fdef.body:
            an.visit(stmt)
        self.arrays = [p for p in self.params[3:] if p in an.arrays]
        self.regions = list(an.regions)
        self._region_by_line = {r.line: r.rid for r in self.regions}
        gen = self._generate(fdef, an, fn)
        self.native_source, self.instrumented_source, self._module_source = gen
        self._module: types.ModuleType | None = None

    def region_id(self, line: int) -> int:
        """Return the region id of the loop at source ``line``.

        Args:
            line: Source line of the loop's header.

        Raises:
            UnknownNameError: The kernel has no loop at ``line``.
        """
        if line not in self._region_by_line:
            raise UnknownNameError(f"kernel {self.name} has no loop at line {line}")
        return self._region_by_line[line]

    def _generate(
        self, fdef: ast.FunctionDef, an: _Analyzer, fn: Callable[..., None]
    ) -> tuple[str, str, str]:
        variants = []
        orig = dict(an.loop_rid)
        for hooks, sampled, suffix in (
            (False, False, "native"),
            (True, False, "instr"),
            (True, True, "samp"),
        ):
            f = copy.deepcopy(fdef)
            an.loop_rid = {id(n2): orig[id(n1)] for n1, n2 in _loops_pair(fdef, f)}
            f = _Rewriter(an, self.params, hooks, sampled).visit(f)
            f.name = f"_cp_{suffix}"
            extra = [ast.arg("_cp_sched")]
            f.args.args = f.args.args[:3] + extra + f.args.args[3:]
            if hooks:
                f.args.args.append(ast.arg("_cp_S"))
            if sampled:
                f.args.args.append(ast.arg("_cp_P"))
                f.body = _sampled_prologue(f.body, len(self.arrays))
            # the sampled variant is inlined into its driver: a kernel call then passes no
            # state tuple, which costs more than the sampled hooks in kernels of few accesses
            deco = "_cp_njit_inline" if sampled else "_cp_njit"
            f.decorator_list = [ast.Name(deco, ast.Load())]
            ast.fix_missing_locations(f)
            variants.append(ast.unparse(f))
        known = set(self.params) | an.locals | set(dir(builtins)) | {"prange"}
        header = [
            "# generated by hpcnb.commprof from " + self.name,
            # the hooks are compiled into this module: a change to them must change its name
            # (and so Numba's on-disk cache of it)
            "# hooks " + _hooks_digest(),
            "import numpy as np",
            "from numba import njit, prange as _cp_prange",
            "from hpcnb.commprof.hooks import ld1, ld2, ld3, st1, st2, st3, enter, leave",
            "from hpcnb.commprof.hooks import sched_iters",
            "_cp_njit = njit(cache=True)",
            '_cp_njit_inline = njit(cache=True, inline="always")',
            _SAMPLED_HOOKS,
        ]
        for name in sorted(an.names - known):
            if name not in fn.__globals__:
                raise InstrumentationError(f"{self.file}:{fdef.lineno}: unknown name '{name}'")
            value = fn.__globals__[name]
            if getattr(value, "__name__", None) == "prange" or value is prange:
                continue
            header.append(_resolve_global(name, value, self.file, fdef.lineno))
        drivers = _drivers(self.params[3:], self.arrays)
        module = "\n".join(header) + "\n\n\n" + "\n\n\n".join(variants) + "\n\n" + drivers
        return variants[0], variants[1], module

    def compiled(self) -> types.ModuleType:
        """Return the generated module (``drive_native``, ``drive_instr``, ``drive_parallel``).

        The source is written to a cache folder (``<cache root>/commprof``, see
        :func:`hpcnb.paths.cache_root`) as ``cp_<name>_<sha256>.py`` so that Numba's on-disk
        cache applies. A file found there is compared with the generated source first; one
        that differs (say, a line appended to it) is rewritten with a
        :class:`~hpcnb.codecache.CodeCacheWarning`, and only the generated source runs
        (:func:`hpcnb.codecache.load_generated`). A Numba cache entry that cannot be
        loaded is dropped and compiled again, and a cache folder that cannot be written is
        replaced by a private temporary one, each with a warning.
        """
        if self._module is None:
            self._module = load_generated(
                self._module_source,
                _cache_dir(),
                f"cp_{self.name}",
                module_prefix="_hpcnb_commprof_gen.",
            )
        return self._module

    def __call__(self, *args: Any) -> None:
        """Call the plain Python function (one thread, one phase)."""
        self.py_func(*args)

    def __repr__(self) -> str:
        return f"Kernel({self.name}, arrays={self.arrays}, regions={len(self.regions)})"


def _loops_pair(a: ast.AST, b: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    la = [n for n in ast.walk(a) if isinstance(n, ast.For | ast.While)]
    lb = [n for n in ast.walk(b) if isinstance(n, ast.For | ast.While)]
    return list(zip(la, lb, strict=True))


def kernel(fn: Callable[..., None]) -> Kernel:
    """Decorate a kernel ``f(tid, nthreads, phase, *arrays_and_scalars)`` for profiling.

    Raises:
        InstrumentationError: For constructs that cannot be instrumented, naming file and line.
    """
    return Kernel(fn)
