"""Code generation: straight-line Winograd transforms as Numba CPU and ``numba.cuda`` kernels.

One set of optimised expressions (:class:`~hpcnb.winograd.opcount.TransformPrograms`)
is rendered into loop bodies by :func:`input_body` and :func:`output_body`. The index
computation of the drivers and the tile bodies are written once (:func:`render_module`);
a Python-syntax target (:class:`PythonTarget`: :data:`CPU_TARGET`, :data:`CUDA_TARGET`)
supplies only what differs: its imports, the drivers' decorator, how a work item is
bound, what a driver does with its tile, and extra functions. A C-syntax target
(:mod:`~hpcnb.winograd.opencl`) renders the same expression lines with its own constants
and declarations. The module text is written to a cache folder under the hpcnb cache
root and imported, so that Numba's on-disk cache (``cache=True``) keeps the compiled
machine code between sessions; a cached file is compared with the generated text before it is used,
a Numba cache entry that does not load is dropped and compiled again, and a cache folder
that cannot be written is replaced by a private temporary one (:mod:`hpcnb.codecache`).

Kernels (NCHW, tile ``p`` of ``P = N·tiles_h·tiles_w`` covers outputs
``[th·m, th·m + m) x [tw·m, tw·m + m)`` of image ``p // (tiles_h·tiles_w)``):

* ``in_tile`` / ``out_tile``: the straight-line transform of one tile;
* ``input_transform(x, V, pad, tiles_h, tiles_w, p0, p1, channel_major)``: ``V[ab, c, q]``
  is the transformed ``n x n`` patch of channel ``c`` of tile ``p0 + q`` (zero padding
  and image borders handled by a scratch patch or bounds checks);
* ``output_transform(Mt, out, tiles_h, tiles_w, p0, channel_major)``: inverse transform
  of each ``(k, tile)``, writing only the outputs inside the image (border tiles);
* CUDA only: ``batched_gemm(U, V, Mt)``: ``Mt[ab] = U[ab] @ V[ab]`` for every ``ab < n²``
  (on the CPU the products are a BLAS or Numba batched GEMM, see ``hpcnb.winograd.conv``);
* CPU only, the fused path (:func:`_cpu_vector_functions`, :mod:`~hpcnb.winograd.fused`):
  ``fused_<schedule>_<gemm>(x, U, out, pad, tiles_h, tiles_w, block, parts)`` run the
  whole layer block by block (gather + input transform vectorised across tiles, the
  ``n²`` GEMMs by BLAS or the generated micro-kernel, output transform + scatter).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import ModuleType

import numpy as np

from hpcnb.codecache import load_generated, source_digest
from hpcnb.paths import cache_root
from hpcnb.winograd.config import WinogradError
from hpcnb.winograd.opcount import TransformPrograms, transform_programs
from hpcnb.winograd.slp import LinearProgram

__all__ = [
    "CPU_TARGET",
    "CUDA_TARGET",
    "PythonTarget",
    "constants_of",
    "cpu_kernels",
    "cpu_source",
    "cuda_kernels",
    "cuda_source",
    "input_body",
    "kernel_cache_dir",
    "load_module",
    "output_body",
    "python_constant",
    "render_module",
    "render_program",
    "source_excerpt",
    "target_kernels",
]

ConstFmt = Callable[[Fraction], str]
_CODEGEN_VERSION = "14"


def kernel_cache_dir() -> Path:
    """Return the cache root of the generated Winograd kernels (the folder is not created).

    This is the one cache root of hpcnb, :func:`hpcnb.paths.cache_root` (``$HPCNB_CACHE``,
    else the user cache folder); the kernels live in its ``winograd/generated`` folder.
    """
    return cache_root()


def constants_of(progs: TransformPrograms) -> list[Fraction]:
    """All distinct constant magnitudes (other than 1) used by the input/output programs."""
    out: set[Fraction] = set()
    for prog in (progs.input, progs.output, progs.kernel):
        for d in prog.definitions:
            out.update(c for c, _ in d.groups if c != 1)
    return sorted(out)


def python_constant(c: Fraction) -> str:
    """Name of the module-level constant holding ``c`` in a Python-syntax target (``K1_2``)."""
    return f"K{c.numerator}_{c.denominator}"


def source_excerpt(source: str, first: str, lines: int) -> str:
    """``lines`` lines of ``source`` from the one starting with ``first``, each stripped.

    Args:
        source: Generated text.
        first: The text where the excerpt starts (e.g. the first input-transform line).
        lines: Number of lines.

    Raises:
        WinogradError: ``first`` does not occur in ``source``.
    """
    start = source.find(first)
    if start < 0:
        raise WinogradError(f"source_excerpt: {first[:60]!r} is not in the generated source")
    return "\n".join(ln.strip() for ln in source[start:].splitlines()[:lines])


def render_program(
    prog: LinearProgram,
    inputs: list[str],
    outputs: list[str],
    tmp: str,
    const: ConstFmt,
    decl: str = "",
    end: str = "",
) -> list[str]:
    """Render one 1-D program as straight-line assignments.

    Args:
        prog: The program.
        inputs: Names bound to the program's inputs.
        outputs: Names to assign the program's outputs to.
        tmp: Prefix making temporaries unique within the kernel.
        const: Renders a constant magnitude (e.g. a global name or ``0.5f``).
        decl: Declaration prefix of each assignment (``"float "`` in C, empty in Python).
        end: Statement terminator (``";"`` in C).

    Returns:
        Source lines (no indentation).
    """
    names = dict(zip(prog.inputs, inputs, strict=True))
    for o, name in zip(prog.outputs, outputs, strict=True):
        names[o] = name
    for d in prog.definitions:
        if d.target not in names:
            names[d.target] = f"{tmp}{d.target}"
    lines = []
    for d in prog.definitions:
        parts: list[tuple[int, str]] = []
        for c, terms in d.groups:
            if c == 1:
                parts.extend((s, names[v]) for s, v in terms)
                continue
            sign = -1 if all(s < 0 for s, _ in terms) else 1
            inner = ""
            for i, (s, v) in enumerate(terms):
                s *= sign
                inner += ("-" if s < 0 else "") if i == 0 else (" - " if s < 0 else " + ")
                inner += names[v]
            body = f"({inner})" if len(terms) > 1 else inner
            parts.append((sign, f"{const(c)} * {body}"))
        expr = ""
        for i, (s, text) in enumerate(parts):
            expr += (("-" if s < 0 else "") if i == 0 else (" - " if s < 0 else " + ")) + text
        lines.append(f"{decl}{names[d.target]} = {expr}{end}")
    return lines


def _nested_2d(
    prog: LinearProgram,
    sizes: tuple[int, int],
    names: tuple[str, str, str],
    tags: tuple[str, str],
    const: ConstFmt,
    decl: str,
    end: str,
) -> list[str]:
    """A 1-D program applied to the columns of ``src``, then to the rows of the result.

    Args:
        prog: The 1-D program (``k`` inputs, ``l`` outputs).
        sizes: ``(k, l)``.
        names: Prefixes of the ``k x k`` inputs, the ``l x k`` intermediates and the
            ``l x l`` outputs (locals named ``<prefix>_<row>_<col>``).
        tags: Prefixes of the temporaries of the column and the row passes.
        const: Renders a constant magnitude.
        decl: Declaration prefix of each assignment.
        end: Statement terminator.
    """
    k, l = sizes
    src, mid, dst = names
    lines: list[str] = []
    for j in range(k):
        ins = [f"{src}_{i}_{j}" for i in range(k)]
        outs = [f"{mid}_{a}_{j}" for a in range(l)]
        lines += render_program(prog, ins, outs, f"{tags[0]}{j}_", const, decl, end)
    for a in range(l):
        ins = [f"{mid}_{a}_{j}" for j in range(k)]
        outs = [f"{dst}_{a}_{b}" for b in range(l)]
        lines += render_program(prog, ins, outs, f"{tags[1]}{a}_", const, decl, end)
    return lines


def input_body(
    progs: TransformPrograms, const: ConstFmt, decl: str = "", end: str = ""
) -> list[str]:
    """Nested 2-D input transform ``v = BT d B`` on locals ``d_i_j`` -> ``v_a_b``.

    Args:
        progs: Optimised programs of one ``F(m, r)``; their input program is applied to the
            columns of the ``n x n`` tile ``d``, then to the rows.
        const, decl, end: The target's syntax: a function rendering a constant magnitude
            (:func:`python_constant`, or a C literal), the declaration prefix of each assignment
            (``"const float "`` in C) and the statement terminator (``";"`` in C).
    """
    n = progs.transform.n
    return _nested_2d(progs.input, (n, n), ("d", "s", "v"), ("ic", "ir"), const, decl, end)


def output_body(
    progs: TransformPrograms, const: ConstFmt, decl: str = "", end: str = ""
) -> list[str]:
    """Nested 2-D output transform ``y = AT M A`` on locals ``m_a_b`` -> ``y_i_j``.

    Args:
        progs: Optimised programs of one ``F(m, r)``; their output program is applied to the
            columns of the ``n x n`` products, then to the rows of the result.
        const, decl, end: The target's syntax, as for :func:`input_body`.
    """
    n, m = progs.transform.n, progs.transform.m
    return _nested_2d(progs.output, (n, m), ("m", "u", "y"), ("oc", "or"), const, decl, end)


def _indent(lines: list[str], k: int) -> list[str]:
    return [" " * k + ln for ln in lines]


def _load_m_lines(n: int) -> list[str]:
    """Locals ``m_a_b`` loaded from the products ``Mt[ab, k, q]`` of filter ``k``, tile ``q``."""
    return [f"m_{a}_{b} = Mt[{a * n + b}, k, q]" for a in range(n) for b in range(n)]


def _tile_lines(progs: TransformPrograms, checked: bool) -> dict[str, list[str]]:
    """Bodies of the per-tile code (Python syntax, shared by CPU and CUDA).

    ``checked``: loads and stores test the image bounds (``H``, ``W``, ``Ho``, ``Wo``)
    instead of relying on a scratch patch.
    """
    n, m = progs.transform.n, progs.transform.m
    const = python_constant
    if checked:
        load = [f"rv{i} = 0 <= h0 + {i} < H" for i in range(n)]
        load += [f"cv{j} = 0 <= w0 + {j} < W" for j in range(n)]
        load += [
            f"d_{i}_{j} = x[b, c, h0 + {i}, w0 + {j}] if rv{i} and cv{j} else ZERO"
            for i in range(n)
            for j in range(n)
        ]
    else:
        load = [f"d_{i}_{j} = x[b, c, h0 + {i}, w0 + {j}]" for i in range(n) for j in range(n)]
    store_v = [f"V[{a * n + b}, vc, q] = v_{a}_{b}" for a in range(n) for b in range(n)]
    if checked:
        store = []
        for i in range(m):
            for j in range(m):
                store += [f"if oh + {i} < Ho and ow + {j} < Wo:"]
                store += [f"    out[b, ko, oh + {i}, ow + {j}] = y_{i}_{j}"]
    else:
        store = [f"out[b, ko, oh + {i}, ow + {j}] = y_{i}_{j}" for i in range(m) for j in range(m)]
    return {
        "input": load + input_body(progs, const) + store_v,
        "output": _load_m_lines(n) + output_body(progs, const) + store,
    }


def _index_lines(kind: str, m: int) -> list[str]:
    """From the work item ``idx`` to channel (or filter), tile, image and tile origin."""
    ch, count, h, w, shift = (
        ("c", "C", "h0", "w0", " - pad") if kind == "input" else ("k", "K", "oh", "ow", "")
    )
    return [
        "if channel_major:",
        f"    {ch} = idx // nt",
        f"    q = idx - {ch} * nt",
        "else:",
        f"    q = idx // {count}",
        f"    {ch} = idx - q * {count}",
        *_origin_lines(h, w, m, shift),
    ]


def _origin_lines(h: str, w: str, m: int, shift: str) -> list[str]:
    """From tile ``p0 + q`` to its image ``b`` and the origin ``(h, w)`` (``shift``: padding)."""
    return [
        "p = p0 + q",
        "b = p // tpi",
        "rem = p - b * tpi",
        f"{h} = (rem // tiles_w) * {m}{shift}",
        f"{w} = (rem % tiles_w) * {m}{shift}",
    ]


# signature, set-up lines and number of work items of the two transform drivers
_DRIVERS: dict[str, tuple[str, list[str], str]] = {
    "input": (
        "input_transform(x, V, pad, tiles_h, tiles_w, p0, p1, channel_major)",
        ["C = x.shape[1]", "H = x.shape[2]", "W = x.shape[3]", "nt = p1 - p0"],
        "C * nt",
    ),
    "output": (
        "output_transform(Mt, out, tiles_h, tiles_w, p0, channel_major)",
        ["K = out.shape[1]", "Ho = out.shape[2]", "Wo = out.shape[3]", "nt = Mt.shape[2]"],
        "K * nt",
    ),
}


@dataclass(frozen=True)
class PythonTarget:
    """What one Python-syntax target supplies; the index code and tile bodies are shared.

    Attributes:
        key: Short name in the cached file's name (``"cpu"``, ``"cuda"``).
        name: Named in the generated module's docstring.
        imports: Import lines of the module.
        decorator: Decorator of the two transform drivers.
        launch: ``launch(total)`` -> ``(lines, indent)``: the lines that bind ``idx`` to
            one of ``total`` work items, and the indentation of the driver body under them.
        tails: ``tails(progs)`` -> ``{"input": lines, "output": lines}``: what each driver
            does with its tile once ``b``, the channel, ``q`` and the origin are known.
        before: ``before(progs)`` -> source lines placed before the drivers.
        after: ``after(progs)`` -> source lines placed after the drivers.
    """

    key: str
    name: str
    imports: tuple[str, ...]
    decorator: str
    launch: Callable[[str], tuple[list[str], int]]
    tails: Callable[[TransformPrograms], dict[str, list[str]]]
    before: Callable[[TransformPrograms], list[str]] = lambda progs: []
    after: Callable[[TransformPrograms], list[str]] = lambda progs: []


def _driver(progs: TransformPrograms, kind: str, target: PythonTarget) -> list[str]:
    sig, setup, total = _DRIVERS[kind]
    head, indent = target.launch(total)
    inner = _indent(_index_lines(kind, progs.transform.m) + target.tails(progs)[kind], indent)
    body = [*setup, "tpi = tiles_h * tiles_w", *head, *inner]
    return [target.decorator, f"def {sig}:", *_indent(body, 4)]


def render_module(progs: TransformPrograms, target: PythonTarget, dtype: str = "float32") -> str:
    """Return the source of a module with ``target``'s kernels of ``progs``.

    Args:
        progs: Optimised programs of one ``F(m, r)``.
        target: What the target supplies (:data:`CPU_TARGET`, :data:`CUDA_TARGET`).
        dtype: ``"float32"`` or ``"float64"`` (type of the constants).

    Returns:
        Module source text.
    """
    n, m = progs.transform.n, progs.transform.m
    tr = progs.transform
    src = [
        f'"""Generated {target.name} Winograd kernels for {tr.name},',
        f"points {list(map(str, tr.points))} and infinity.",
        "",
        f"Input transform {progs.input.cost} (adds, mults) per 1-D application,",
        f"output transform {progs.output.cost}. Do not edit: made by hpcnb.winograd.codegen.",
        '"""',
        "",
        *target.imports,
        "",
        *[f"{python_constant(c)} = np.{dtype}({float(c)!r})" for c in constants_of(progs)],
        f"ZERO = np.{dtype}(0.0)",
        f"N_TILE = {n}",
        f"M_TILE = {m}",
    ]
    blocks = [
        target.before(progs),
        _driver(progs, "input", target),
        _driver(progs, "output", target),
        target.after(progs),
    ]
    for block in blocks:
        if block:
            src += ["", "", *block]
    return "\n".join(src) + "\n"


def _cpu_tile_functions(progs: TransformPrograms) -> list[str]:
    bodies = _tile_lines(progs, checked=False)
    return [
        "@numba.njit(cache=True)",
        "def in_tile(x, b, c, h0, w0, V, vc, q):",
        *_indent(bodies["input"], 4),
        "",
        "",
        "@numba.njit(cache=True)",
        "def out_tile(Mt, k, q, out, b, ko, oh, ow):",
        *_indent(bodies["output"], 4),
    ]


def _cpu_tails(progs: TransformPrograms) -> dict[str, list[str]]:
    """Whole tiles straight from the image, border tiles through a scratch patch."""
    n, m = progs.transform.n, progs.transform.m
    return {
        "input": [
            f"if h0 >= 0 and w0 >= 0 and h0 + {n} <= H and w0 + {n} <= W:",
            "    in_tile(x, b, c, h0, w0, V, c, q)",
            "else:",
            f"    patch = np.zeros((1, 1, {n}, {n}), dtype=x.dtype)",
            f"    for i in range(max(0, -h0), min({n}, H - h0)):",
            f"        for j in range(max(0, -w0), min({n}, W - w0)):",
            "            patch[0, 0, i, j] = x[b, c, h0 + i, w0 + j]",
            "    in_tile(patch, 0, 0, 0, 0, V, c, q)",
        ],
        "output": [
            f"if oh + {m} <= Ho and ow + {m} <= Wo:",
            "    out_tile(Mt, k, q, out, b, k, oh, ow)",
            "else:",
            f"    patch = np.empty((1, 1, {m}, {m}), dtype=out.dtype)",
            "    out_tile(Mt, k, q, patch, 0, 0, 0, 0)",
            f"    for i in range(min({m}, Ho - oh)):",
            f"        for j in range(min({m}, Wo - ow)):",
            "            out[b, k, oh + i, ow + j] = patch[0, 0, i, j]",
        ],
    }


def _vec_lines(sig: str, loads: list[str], body: list[str], stores: list[str]) -> list[str]:
    """A Numba function ``sig`` running a straight-line tile body for each tile ``q < L``."""
    head = ["@numba.njit(cache=True)", f"def {sig}:", "    for q in range(L):"]
    return head + _indent([*loads, *body, *stores], 8)


def _in_vec_lines(progs: TransformPrograms) -> list[str]:
    """``in_vec(D, V, c, L)``: the input transform of ``L`` gathered tiles of channel ``c``."""
    n = progs.transform.n
    loads = [f"d_{i}_{j} = D[{i * n + j}, q]" for i in range(n) for j in range(n)]
    stores = [f"V[{a * n + b}, c, q] = v_{a}_{b}" for a in range(n) for b in range(n)]
    return _vec_lines("in_vec(D, V, c, L)", loads, input_body(progs, python_constant), stores)


def _out_vec_lines(progs: TransformPrograms) -> list[str]:
    """``out_vec(Mt, k, Y, L)``: the output transform of filter ``k`` for ``L`` tiles."""
    n, m = progs.transform.n, progs.transform.m
    loads = _load_m_lines(n)
    stores = [f"Y[{i * m + j}, q] = y_{i}_{j}" for i in range(m) for j in range(m)]
    return _vec_lines("out_vec(Mt, k, Y, L)", loads, output_body(progs, python_constant), stores)


def _cpu_vector_functions(progs: TransformPrograms) -> list[str]:
    """The fused path: the tile transforms applied to a vector of tiles, then the rest.

    ``in_vec(D, V, c, L)`` and ``out_vec(Mt, k, Y, L)`` run the straight-line tile bodies
    for each tile ``q < L`` with ``q`` innermost, so every load and store is unit-stride in
    ``q`` and the loop vectorises across tiles; gather, scatter, the GEMMs and the drivers
    come from :func:`~hpcnb.winograd.fused.fused_functions` (layout and schedules there).
    """
    from hpcnb.winograd.fused import fused_functions

    n, m = progs.transform.n, progs.transform.m
    return [
        *_in_vec_lines(progs),
        "",
        "",
        *_out_vec_lines(progs),
        "",
        "",
        *fused_functions(n, m),
    ]


CPU_TARGET = PythonTarget(
    key="cpu",
    name="Numba CPU",
    imports=("import numba", "import numpy as np"),
    decorator="@numba.njit(parallel=True, cache=True)",
    launch=lambda total: ([f"for idx in numba.prange({total}):"], 4),
    tails=_cpu_tails,
    before=_cpu_tile_functions,
    after=_cpu_vector_functions,
)
"""Numba CPU: small non-parallel tile functions (``in_tile``, ``out_tile``) called from
``prange`` drivers (the unfused path, border tiles through a zero-filled scratch patch),
and the fused path of :func:`_cpu_vector_functions` (``fused_<schedule>_<gemm>``)."""


def _cuda_tails(progs: TransformPrograms) -> dict[str, list[str]]:
    """The tile bodies inlined, with bounds-checked loads and stores."""
    bodies = _tile_lines(progs, checked=True)
    return {"input": ["vc = c", *bodies["input"]], "output": ["ko = k", *bodies["output"]]}


def _cuda_gemm(progs: TransformPrograms) -> list[str]:
    return [
        "@cuda.jit",
        "def batched_gemm(U, V, Mt):",
        "    T = U.shape[0]",
        "    K = U.shape[1]",
        "    C = U.shape[2]",
        "    P = V.shape[2]",
        "    idx = cuda.grid(1)",
        "    if idx >= T * K * P:",
        "        return",
        "    t = idx // (K * P)",
        "    rest = idx - t * K * P",
        "    k = rest // P",
        "    p = rest - k * P",
        "    acc = ZERO",
        "    for c in range(C):",
        "        acc += U[t, k, c] * V[t, c, p]",
        "    Mt[t, k, p] = acc",
    ]


CUDA_TARGET = PythonTarget(
    key="cuda",
    name="numba.cuda",
    imports=("import numpy as np", "from numba import cuda"),
    decorator="@cuda.jit",
    launch=lambda total: (["idx = cuda.grid(1)", f"if idx >= {total}:", "    return"], 0),
    tails=_cuda_tails,
    after=_cuda_gemm,
)
"""``numba.cuda``: one thread per work item, tile bodies inlined (no device-function calls,
so ``numba.cuda.compile_ptx`` needs no GPU driver), plus the batched products."""


def cpu_source(progs: TransformPrograms, dtype: str = "float32") -> str:
    """Return the source of a Python module with the Numba CPU kernels of ``progs``.

    The straight-line tile code sits in two small non-parallel functions (``in_tile``,
    ``out_tile``), which keeps Numba's compile time low; the parallel drivers send
    border tiles through a zero-filled scratch patch.

    Args:
        progs: Optimised programs of one ``F(m, r)``.
        dtype: ``"float32"`` or ``"float64"`` (type of the constants).

    Returns:
        Module source text.
    """
    return render_module(progs, CPU_TARGET, dtype)


def cuda_source(progs: TransformPrograms, dtype: str = "float32") -> str:
    """Return the source of a module with ``numba.cuda`` kernels of ``progs``.

    One thread per ``(channel, tile)`` in the transforms and per ``(ab, k, tile)`` in the
    batched products; the tile bodies are the same generated lines as on the CPU, with
    bounds-checked loads and stores instead of a scratch patch, inlined into the kernels.

    Args:
        progs: Optimised programs of one ``F(m, r)``.
        dtype: ``"float32"`` or ``"float64"``.

    Returns:
        Module source text.
    """
    return render_module(progs, CUDA_TARGET, dtype)


_LOADED: dict[str, ModuleType] = {}

#: LLVM's limit on the run-time alias checks its loop vectoriser may add: raised for the
#: tile loops (:func:`wide_vectoriser`), LLVM's default otherwise.
VECTORISER_CHECKS = 4096
DEFAULT_VECTORISER_CHECKS = 128


@contextlib.contextmanager
def wide_vectoriser() -> Iterator[None]:
    """Let LLVM vectorise the generated tile loops compiled inside the block.

    A generated transform loop reads ``n²`` rows of one array and writes ``n²`` rows of
    another, one element per tile each; LLVM cannot prove that the rows do not overlap, so
    vectorising across tiles needs a run-time check per pair of streams (1296 for
    ``F(4,3)``), more than its default limit of 128 allows (the loop then runs one tile at
    a time, 2-6x slower). The limit is a process-wide LLVM option, raised only while the
    tile loops compile: raised for a whole driver, LLVM spends about six times longer
    compiling it. It changes which loops are vectorised, never what any loop computes.
    """
    import llvmlite.binding as llvm

    llvm.set_option("hpcnb", f"-vectorize-memory-check-threshold={VECTORISER_CHECKS}")
    try:
        yield
    finally:
        llvm.set_option("hpcnb", f"-vectorize-memory-check-threshold={DEFAULT_VECTORISER_CHECKS}")


def _compile_tile_loops(mod: ModuleType, dtype: str) -> None:
    """Compile ``in_vec`` and ``out_vec`` of a CPU module under :func:`wide_vectoriser`.

    For the signatures the drivers call them with (the channel or filter index is an
    ``int64`` in a ``range`` loop and a ``uint64`` in a ``prange`` loop), so that the
    drivers, compiled later with LLVM's default limit, link the vectorised loops; entries
    in Numba's on-disk cache are loaded instead of compiled.
    """
    import numba

    f = numba.from_dtype(np.dtype(dtype))
    with wide_vectoriser():
        for idx in (numba.int64, numba.uint64):
            mod.in_vec.compile((f[:, ::1], f[:, :, ::1], idx, numba.int64))
            mod.out_vec.compile((f[:, :, ::1], idx, f[:, ::1], numba.int64))


def load_module(source: str, stem: str) -> ModuleType:
    """Write ``source`` to the cache folder (content-addressed), verify it and import it.

    The file is ``<kernel_cache_dir()>/winograd/generated/hpcnb_wino_<stem>_<sha256>.py``; a file
    found there that differs from ``source`` is rewritten with a
    :class:`~hpcnb.codecache.CodeCacheWarning`, and only ``source`` itself runs (see
    :func:`hpcnb.codecache.load_generated`). A Numba cache entry of its functions that
    cannot be loaded is dropped with a warning and compiled again; when that folder cannot
    be written, the module runs (with a warning) from a private temporary folder removed
    at exit, so its machine code is compiled in every session.

    Args:
        source: Module text.
        stem: Readable part of the file name.

    Returns:
        The imported module (memoised per content hash).
    """
    key = f"hpcnb_wino_{stem}_{source_digest(source)}"
    if key not in _LOADED:
        folder = kernel_cache_dir() / "winograd" / "generated"
        _LOADED[key] = load_generated(source, folder, f"hpcnb_wino_{stem}")
    return _LOADED[key]


def _stem(m: int, r: int, points: str | tuple, dtype: str, level: str) -> str:
    ptag = points if isinstance(points, str) else "custom"
    return f"m{m}_r{r}_{ptag}_{dtype}_{level}_v{_CODEGEN_VERSION}"


def target_kernels(
    target: PythonTarget,
    m: int,
    r: int,
    points: str | tuple = "default",
    dtype: str = "float32",
    level: str = "searched",
) -> ModuleType:
    """Generate (or reuse) and import ``target``'s kernels of ``F(m, r)``.

    Args:
        target: What the target supplies (:data:`CPU_TARGET`, :data:`CUDA_TARGET`).
        m: Outputs per tile.
        r: Filter size.
        points: Point set.
        dtype: ``"float32"`` or ``"float64"``.
        level: Optimisation level of the transforms (``"naive"``, ``"paired"``, ``"searched"``).

    Returns:
        The module, with ``SOURCE`` (the generated text) and ``PROGRAMS`` set (memoised per
        arguments: rendering the text takes milliseconds, a convolution call may not).
    """
    key = (kernel_cache_dir(), target, m, r, points, dtype, level)
    if key not in _KERNELS:
        progs = transform_programs(m, r, points, level)
        src = render_module(progs, target, dtype)
        mod = load_module(src, f"{target.key}_" + _stem(m, r, points, dtype, level))
        vars(mod).update(SOURCE=src, PROGRAMS=progs)
        if hasattr(mod, "in_vec"):
            _compile_tile_loops(mod, dtype)
        _KERNELS[key] = mod
    return _KERNELS[key]


_KERNELS: dict[tuple, ModuleType] = {}


def cpu_kernels(
    m: int, r: int, points: str | tuple = "default", dtype: str = "float32", level: str = "searched"
) -> ModuleType:
    """The Numba CPU kernels of ``F(m, r)``: :func:`target_kernels` of :data:`CPU_TARGET`.

    The module holds ``in_tile``, ``out_tile``, ``input_transform`` and
    ``output_transform`` (the unfused path, whose products are a BLAS or Numba batched
    GEMM in :mod:`hpcnb.winograd.conv`), and the fused drivers ``fused_<schedule>_<gemm>``
    (:func:`~hpcnb.winograd.fused.driver_name`).

    Args:
        m, r, points, dtype, level: The kernels' ``F(m, r)`` (outputs per tile, filter size),
            point set, dtype (``"float32"`` or ``"float64"``) and transform optimisation level,
            as for :func:`target_kernels`.
    """
    return target_kernels(CPU_TARGET, m, r, points, dtype, level)


def cuda_kernels(
    m: int, r: int, points: str | tuple = "default", dtype: str = "float32", level: str = "searched"
) -> ModuleType:
    """The ``numba.cuda`` kernels of ``F(m, r)``: :func:`target_kernels` of :data:`CUDA_TARGET`.

    The module holds ``input_transform``, ``batched_gemm`` and ``output_transform`` (run
    on a GPU or in Numba's simulator).

    Args:
        m, r, points, dtype, level: As for :func:`cpu_kernels`.
    """
    return target_kernels(CUDA_TARGET, m, r, points, dtype, level)
