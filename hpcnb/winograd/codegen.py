"""Code generation: straight-line Winograd transforms as Numba CPU and ``numba.cuda`` kernels.

One set of optimised expressions (:class:`~hpcnb.winograd.opcount.TransformPrograms`)
is rendered into loop bodies by :func:`input_body` and :func:`output_body`; a target only
supplies the kernel header, the index computation and the syntax of constants. The
module text is written to a cache folder under the hpcnb cache root and imported, so
that Numba's on-disk cache (``cache=True``) keeps the compiled machine code between
sessions; a cached file is compared with the generated text before it is used
(:mod:`hpcnb.codecache`).

Kernels (NCHW, tile ``p`` of ``P = N·tiles_h·tiles_w`` covers outputs
``[th·m, th·m + m) x [tw·m, tw·m + m)`` of image ``p // (tiles_h·tiles_w)``):

* ``in_tile`` / ``out_tile``: the straight-line transform of one tile;
* ``input_transform(x, V, pad, tiles_h, tiles_w, p0, p1, channel_major)``: ``V[ab, c, q]``
  is the transformed ``n x n`` patch of channel ``c`` of tile ``p0 + q`` (zero padding
  and image borders handled by a scratch patch or bounds checks);
* ``output_transform(Mt, out, tiles_h, tiles_w, p0, channel_major)``: inverse transform
  of each ``(k, tile)``, writing only the outputs inside the image (border tiles);
* CUDA only: ``batched_gemm(U, V, Mt)``: ``Mt[ab] = U[ab] @ V[ab]`` for every ``ab < n²``
  (on the CPU the products are a BLAS or Numba batched GEMM, see ``hpcnb.winograd.conv``).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from types import ModuleType

from hpcnb.codecache import deprecated_cache_env, load_generated, source_digest
from hpcnb.paths import cache_root
from hpcnb.winograd.opcount import TransformPrograms, transform_programs
from hpcnb.winograd.slp import LinearProgram

__all__ = [
    "cache_dir",
    "constants_of",
    "cpu_kernels",
    "cpu_source",
    "cuda_kernels",
    "cuda_source",
    "input_body",
    "load_module",
    "output_body",
    "render_program",
]

ConstFmt = Callable[[Fraction], str]
_CODEGEN_VERSION = "7"


def cache_dir() -> Path:
    """Return the cache root of the Winograd code (generated kernels, wisdom file).

    This is the one cache root of hpcnb, :func:`hpcnb.paths.cache_root` (``$HPCNB_CACHE``,
    else the user cache folder). ``$HPCNB_CACHE_DIR``, the variable of older versions, is
    a deprecated alias still honoured (with a ``FutureWarning``) when ``$HPCNB_CACHE`` is
    unset. The folder is not created.
    """
    return deprecated_cache_env("HPCNB_CACHE_DIR") or cache_root()


def constants_of(progs: TransformPrograms) -> list[Fraction]:
    """All distinct constant magnitudes (other than 1) used by the input/output programs."""
    out: set[Fraction] = set()
    for prog in (progs.input, progs.output, progs.kernel):
        for d in prog.definitions:
            out.update(c for c, _ in d.groups if c != 1)
    return sorted(out)


def _const_name(c: Fraction) -> str:
    return f"K{c.numerator}_{c.denominator}"


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


def input_body(
    progs: TransformPrograms, const: ConstFmt, decl: str = "", end: str = ""
) -> list[str]:
    """Nested 2-D input transform ``v = BT d B`` on locals ``d_i_j`` -> ``v_a_b``."""
    n = progs.transform.n
    lines: list[str] = []
    for j in range(n):
        ins = [f"d_{i}_{j}" for i in range(n)]
        outs = [f"s_{a}_{j}" for a in range(n)]
        lines += render_program(progs.input, ins, outs, f"ic{j}_", const, decl, end)
    for a in range(n):
        ins = [f"s_{a}_{j}" for j in range(n)]
        outs = [f"v_{a}_{b}" for b in range(n)]
        lines += render_program(progs.input, ins, outs, f"ir{a}_", const, decl, end)
    return lines


def output_body(
    progs: TransformPrograms, const: ConstFmt, decl: str = "", end: str = ""
) -> list[str]:
    """Nested 2-D output transform ``y = AT M A`` on locals ``m_a_b`` -> ``y_i_j``."""
    n, m = progs.transform.n, progs.transform.m
    lines: list[str] = []
    for b in range(n):
        ins = [f"m_{a}_{b}" for a in range(n)]
        outs = [f"u_{i}_{b}" for i in range(m)]
        lines += render_program(progs.output, ins, outs, f"oc{b}_", const, decl, end)
    for i in range(m):
        ins = [f"u_{i}_{b}" for b in range(n)]
        outs = [f"y_{i}_{j}" for j in range(m)]
        lines += render_program(progs.output, ins, outs, f"or{i}_", const, decl, end)
    return lines


def _indent(lines: list[str], k: int) -> list[str]:
    return [" " * k + ln for ln in lines]


def _tile_lines(progs: TransformPrograms, checked: bool) -> dict[str, list[str]]:
    """Bodies of the per-tile functions (Python syntax, shared by CPU and CUDA)."""
    n, m = progs.transform.n, progs.transform.m
    const = _const_name
    if checked:
        load = [f"rv{i} = 0 <= h0 + {i} < x.shape[2]" for i in range(n)]
        load += [f"cv{j} = 0 <= w0 + {j} < x.shape[3]" for j in range(n)]
        load += [
            f"d_{i}_{j} = x[b, c, h0 + {i}, w0 + {j}] if rv{i} and cv{j} else ZERO"
            for i in range(n)
            for j in range(n)
        ]
    else:
        load = [f"d_{i}_{j} = x[b, c, h0 + {i}, w0 + {j}]" for i in range(n) for j in range(n)]
    store_v = [f"V[{a * n + b}, vc, q] = v_{a}_{b}" for a in range(n) for b in range(n)]
    load_m = [f"m_{a}_{b} = Mt[{a * n + b}, k, q]" for a in range(n) for b in range(n)]
    if checked:
        store = []
        for i in range(m):
            for j in range(m):
                store += [f"if oh + {i} < out.shape[2] and ow + {j} < out.shape[3]:"]
                store += [f"    out[b, ko, oh + {i}, ow + {j}] = y_{i}_{j}"]
    else:
        store = [f"out[b, ko, oh + {i}, ow + {j}] = y_{i}_{j}" for i in range(m) for j in range(m)]
    return {
        "input": load + input_body(progs, const) + store_v,
        "output": load_m + output_body(progs, const) + store,
    }


def _consts(progs: TransformPrograms, dtype: str) -> list[str]:
    return [f"{_const_name(c)} = np.{dtype}({float(c)!r})" for c in constants_of(progs)] + [
        f"ZERO = np.{dtype}(0.0)"
    ]


def _header(progs: TransformPrograms, target: str) -> list[str]:
    tr = progs.transform
    return [
        f'"""Generated {target} Winograd kernels for {tr.name},',
        f"points {list(map(str, tr.points))} and infinity.",
        "",
        f"Input transform {progs.input.cost} (adds, mults) per 1-D application,",
        f"output transform {progs.output.cost}. Do not edit: made by hpcnb.winograd.codegen.",
        '"""',
        "",
    ]


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
    n, m = progs.transform.n, progs.transform.m
    bodies = _tile_lines(progs, checked=False)
    src = [*_header(progs, "Numba CPU"), "import numba", "import numpy as np", ""]
    src += [*_consts(progs, dtype), f"N_TILE = {n}", f"M_TILE = {m}", "", ""]
    src += ["@numba.njit(cache=True)", "def in_tile(x, b, c, h0, w0, V, vc, q):"]
    src += [*_indent(bodies["input"], 4), "", ""]
    src += ["@numba.njit(cache=True)", "def out_tile(Mt, k, q, out, b, ko, oh, ow):"]
    src += [*_indent(bodies["output"], 4), "", ""]
    src += [
        "@numba.njit(parallel=True, cache=True)",
        "def input_transform(x, V, pad, tiles_h, tiles_w, p0, p1, channel_major):",
        "    C = x.shape[1]",
        "    H = x.shape[2]",
        "    W = x.shape[3]",
        "    nt = p1 - p0",
        "    tpi = tiles_h * tiles_w",
        "    for idx in numba.prange(C * nt):",
        "        if channel_major:",
        "            c = idx // nt",
        "            q = idx - c * nt",
        "        else:",
        "            q = idx // C",
        "            c = idx - q * C",
        "        p = p0 + q",
        "        b = p // tpi",
        "        rem = p - b * tpi",
        f"        h0 = (rem // tiles_w) * {m} - pad",
        f"        w0 = (rem % tiles_w) * {m} - pad",
        f"        if h0 >= 0 and w0 >= 0 and h0 + {n} <= H and w0 + {n} <= W:",
        "            in_tile(x, b, c, h0, w0, V, c, q)",
        "        else:",
        f"            patch = np.zeros((1, 1, {n}, {n}), dtype=x.dtype)",
        f"            for i in range(max(0, -h0), min({n}, H - h0)):",
        f"                for j in range(max(0, -w0), min({n}, W - w0)):",
        "                    patch[0, 0, i, j] = x[b, c, h0 + i, w0 + j]",
        "            in_tile(patch, 0, 0, 0, 0, V, c, q)",
        "",
        "",
        "@numba.njit(parallel=True, cache=True)",
        "def output_transform(Mt, out, tiles_h, tiles_w, p0, channel_major):",
        "    K = out.shape[1]",
        "    Ho = out.shape[2]",
        "    Wo = out.shape[3]",
        "    nt = Mt.shape[2]",
        "    tpi = tiles_h * tiles_w",
        "    for idx in numba.prange(K * nt):",
        "        if channel_major:",
        "            k = idx // nt",
        "            q = idx - k * nt",
        "        else:",
        "            q = idx // K",
        "            k = idx - q * K",
        "        p = p0 + q",
        "        b = p // tpi",
        "        rem = p - b * tpi",
        f"        oh = (rem // tiles_w) * {m}",
        f"        ow = (rem % tiles_w) * {m}",
        f"        if oh + {m} <= Ho and ow + {m} <= Wo:",
        "            out_tile(Mt, k, q, out, b, k, oh, ow)",
        "        else:",
        f"            patch = np.empty((1, 1, {m}, {m}), dtype=out.dtype)",
        "            out_tile(Mt, k, q, patch, 0, 0, 0, 0)",
        f"            for i in range(min({m}, Ho - oh)):",
        f"                for j in range(min({m}, Wo - ow)):",
        "                    out[b, k, oh + i, ow + j] = patch[0, 0, i, j]",
    ]
    return "\n".join(src) + "\n"


def cuda_source(progs: TransformPrograms, dtype: str = "float32") -> str:
    """Return the source of a module with ``numba.cuda`` kernels of ``progs``.

    One thread per ``(channel, tile)`` in the transforms and per ``(ab, k, tile)`` in the
    batched products; the tile bodies are the same generated lines as on the CPU, with
    bounds-checked loads and stores instead of a scratch patch, inlined into the kernels
    (no device-function calls, so ``numba.cuda.compile_ptx`` needs no GPU driver).

    Args:
        progs: Optimised programs of one ``F(m, r)``.
        dtype: ``"float32"`` or ``"float64"``.

    Returns:
        Module source text.
    """
    n, m = progs.transform.n, progs.transform.m
    bodies = _tile_lines(progs, checked=True)
    src = [*_header(progs, "numba.cuda"), "import numpy as np", "from numba import cuda", ""]
    src += [*_consts(progs, dtype), f"N_TILE = {n}", f"M_TILE = {m}", "", ""]
    src += [
        "@cuda.jit",
        "def input_transform(x, V, pad, tiles_h, tiles_w, p0, p1, channel_major):",
        "    C = x.shape[1]",
        "    nt = p1 - p0",
        "    tpi = tiles_h * tiles_w",
        "    idx = cuda.grid(1)",
        "    if idx >= C * nt:",
        "        return",
        "    if channel_major:",
        "        c = idx // nt",
        "        q = idx - c * nt",
        "    else:",
        "        q = idx // C",
        "        c = idx - q * C",
        "    p = p0 + q",
        "    b = p // tpi",
        "    rem = p - b * tpi",
        f"    h0 = (rem // tiles_w) * {m} - pad",
        f"    w0 = (rem % tiles_w) * {m} - pad",
        "    vc = c",
        *_indent(bodies["input"], 4),
        "",
        "",
        "@cuda.jit",
        "def output_transform(Mt, out, tiles_h, tiles_w, p0, channel_major):",
        "    K = out.shape[1]",
        "    nt = Mt.shape[2]",
        "    tpi = tiles_h * tiles_w",
        "    idx = cuda.grid(1)",
        "    if idx >= K * nt:",
        "        return",
        "    if channel_major:",
        "        k = idx // nt",
        "        q = idx - k * nt",
        "    else:",
        "        q = idx // K",
        "        k = idx - q * K",
        "    p = p0 + q",
        "    b = p // tpi",
        "    rem = p - b * tpi",
        f"    oh = (rem // tiles_w) * {m}",
        f"    ow = (rem % tiles_w) * {m}",
        "    ko = k",
        *_indent(bodies["output"], 4),
        "",
        "",
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
    return "\n".join(src) + "\n"


_LOADED: dict[str, ModuleType] = {}


def load_module(source: str, stem: str) -> ModuleType:
    """Write ``source`` to the cache folder (content-addressed), verify it and import it.

    The file is ``<cache_dir()>/winograd/generated/hpcnb_wino_<stem>_<sha256>.py``; a file
    found there that differs from ``source`` is rewritten with a
    :class:`~hpcnb.codecache.CodeCacheWarning`, and only ``source`` itself runs (see
    :func:`hpcnb.codecache.load_generated`).

    Args:
        source: Module text.
        stem: Readable part of the file name.

    Returns:
        The imported module (memoised per content hash).
    """
    key = f"hpcnb_wino_{stem}_{source_digest(source)}"
    if key not in _LOADED:
        folder = cache_dir() / "winograd" / "generated"
        _LOADED[key] = load_generated(source, folder, f"hpcnb_wino_{stem}")
    return _LOADED[key]


def _stem(m: int, r: int, points: str | tuple, dtype: str, level: str) -> str:
    ptag = points if isinstance(points, str) else "custom"
    return f"m{m}_r{r}_{ptag}_{dtype}_{level}_v{_CODEGEN_VERSION}"


def cpu_kernels(
    m: int, r: int, points: str | tuple = "default", dtype: str = "float32", level: str = "searched"
) -> ModuleType:
    """Generate (or reuse) and import the Numba CPU kernels of ``F(m, r)``.

    Args:
        m: Outputs per tile.
        r: Filter size.
        points: Point set.
        dtype: ``"float32"`` or ``"float64"``.
        level: Optimisation level of the transforms (``"naive"``, ``"paired"``, ``"searched"``).

    Returns:
        Module with ``input_transform``, ``batched_gemm``, ``output_transform`` and
        ``SOURCE`` (the generated text).
    """
    progs = transform_programs(m, r, points, level)
    src = cpu_source(progs, dtype)
    mod = load_module(src, "cpu_" + _stem(m, r, points, dtype, level))
    mod.SOURCE = src
    mod.PROGRAMS = progs
    return mod


def cuda_kernels(
    m: int, r: int, points: str | tuple = "default", dtype: str = "float32", level: str = "searched"
) -> ModuleType:
    """Generate and import the ``numba.cuda`` kernels of ``F(m, r)`` (GPU or simulator).

    Args:
        m: Outputs per tile.
        r: Filter size.
        points: Point set.
        dtype: ``"float32"`` or ``"float64"``.
        level: Optimisation level of the transforms.

    Returns:
        Module with the three CUDA kernels and ``SOURCE``.
    """
    progs = transform_programs(m, r, points, level)
    src = cuda_source(progs, dtype)
    mod = load_module(src, "cuda_" + _stem(m, r, points, dtype, level))
    mod.SOURCE = src
    mod.PROGRAMS = progs
    return mod
