"""OpenCL C kernels from the same optimised expressions, run through pyopencl (e.g. on PoCL).

:func:`opencl_source` renders the transform programs of one ``F(m, r)`` with C syntax
(``float t = ...;`` and ``0.5f`` constants) into three kernels that mirror the CUDA ones:
input transform (one work-item per channel × tile, bounds-checked loads for padding and
borders), batched products (one work-item per ``(ab, k, tile)``) and output transform.
:data:`OPENCL_BACKEND`, the ``"opencl"`` target of
:func:`~hpcnb.winograd.backend.conv2d_winograd`, runs them on an OpenCL device, by default
PoCL's CPU device; it chooses its tile size by timing every ``m``
(:func:`~hpcnb.winograd.backend.sweep_tiles`).
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import numpy as np

from hpcnb.timing import median_time
from hpcnb.winograd.backend import (
    Backend,
    BackendUnavailableError,
    check_conv_args,
    register_backend,
)
from hpcnb.winograd.codegen import input_body, output_body, source_excerpt
from hpcnb.winograd.config import WinogradConfig, WinogradError
from hpcnb.winograd.conv import filter_transform
from hpcnb.winograd.opcount import TransformPrograms, transform_programs

__all__ = [
    "OPENCL_BACKEND",
    "OpenCLWinograd",
    "cl_constant",
    "opencl_device",
    "opencl_source",
]


def cl_constant(c: Fraction) -> str:
    """Render a constant as an OpenCL ``float`` literal (exact value rounded once)."""
    return f"{float(c)!r}f"


def opencl_source(progs: TransformPrograms) -> str:
    """Return OpenCL C source of the three kernels of one ``F(m, r)``.

    Args:
        progs: Optimised programs (the same objects the Numba and CUDA kernels use).

    Returns:
        Program source text.
    """
    n, m = progs.transform.n, progs.transform.m
    tr = progs.transform
    decl, end = "const float ", ";"
    src = [
        f"// Generated OpenCL Winograd kernels for {tr.name}, points "
        f"{', '.join(map(str, tr.points))} and infinity (hpcnb.winograd.opencl).",
        "__kernel void input_transform(__global const float* x, __global float* V,",
        "    const int C, const int H, const int W, const int pad,",
        "    const int tiles_h, const int tiles_w, const int P) {",
        "  const int idx = get_global_id(0);",
        "  if (idx >= C * P) return;",
        "  const int c = idx / P;",
        "  const int q = idx - c * P;",
        "  const int tpi = tiles_h * tiles_w;",
        "  const int b = q / tpi;",
        "  const int rem = q - b * tpi;",
        f"  const int h0 = (rem / tiles_w) * {m} - pad;",
        f"  const int w0 = (rem % tiles_w) * {m} - pad;",
        "  __global const float* xc = x + (long)(b * C + c) * H * W;",
    ]
    src += [f"  const int rv{i} = (h0 + {i} >= 0) && (h0 + {i} < H);" for i in range(n)]
    src += [f"  const int cv{j} = (w0 + {j} >= 0) && (w0 + {j} < W);" for j in range(n)]
    src += [
        f"  const float d_{i}_{j} = (rv{i} && cv{j}) ? xc[(h0 + {i}) * W + w0 + {j}] : 0.0f;"
        for i in range(n)
        for j in range(n)
    ]
    src += ["  " + ln for ln in input_body(progs, cl_constant, decl, end)]
    src += [
        f"  V[((long){a * n + b} * C + c) * P + q] = v_{a}_{b};" for a in range(n) for b in range(n)
    ]
    src += ["}", ""]
    src += [
        "__kernel void batched_gemm(__global const float* U, __global const float* V,",
        "    __global float* M, const int T, const int K, const int C, const int P) {",
        "  const int idx = get_global_id(0);",
        "  if (idx >= T * K * P) return;",
        "  const int t = idx / (K * P);",
        "  const int rest = idx - t * K * P;",
        "  const int k = rest / P;",
        "  const int p = rest - k * P;",
        "  __global const float* u = U + ((long)t * K + k) * C;",
        "  __global const float* v = V + (long)t * C * P + p;",
        "  float acc = 0.0f;",
        "  for (int c = 0; c < C; ++c) acc += u[c] * v[(long)c * P];",
        "  M[idx] = acc;",
        "}",
        "",
        "__kernel void output_transform(__global const float* M, __global float* out,",
        "    const int K, const int Ho, const int Wo, const int tiles_h, const int tiles_w,",
        "    const int P) {",
        "  const int idx = get_global_id(0);",
        "  if (idx >= K * P) return;",
        "  const int k = idx / P;",
        "  const int q = idx - k * P;",
        "  const int tpi = tiles_h * tiles_w;",
        "  const int b = q / tpi;",
        "  const int rem = q - b * tpi;",
        f"  const int oh = (rem / tiles_w) * {m};",
        f"  const int ow = (rem % tiles_w) * {m};",
        "  __global float* o = out + (long)(b * K + k) * Ho * Wo;",
    ]
    src += [
        f"  const float m_{a}_{b} = M[((long){a * n + b} * K + k) * P + q];"
        for a in range(n)
        for b in range(n)
    ]
    src += ["  " + ln for ln in output_body(progs, cl_constant, decl, end)]
    for i in range(m):
        for j in range(m):
            src.append(
                f"  if (oh + {i} < Ho && ow + {j} < Wo) o[(oh + {i}) * Wo + ow + {j}] = y_{i}_{j};"
            )
    src += ["}", ""]
    return "\n".join(src)


def opencl_device():
    """Return ``(context, queue)`` on an OpenCL CPU device (PoCL), or None when absent."""
    try:
        import pyopencl as cl
    except ImportError:
        return None
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        return None
    devices = [d for p in platforms for d in p.get_devices() if d.type & cl.device_type.CPU]
    if not devices:
        devices = [d for p in platforms for d in p.get_devices()]
    if not devices:
        return None
    ctx = cl.Context(devices=[devices[0]])
    return ctx, cl.CommandQueue(ctx)


@lru_cache(maxsize=1)
def _shared_device():
    """The device of :func:`opencl_device`, set up once per process (None when absent)."""
    return opencl_device()


@lru_cache(maxsize=32)
def _program(ctx, m: int, r: int, points: str):
    import pyopencl as cl

    return cl.Program(ctx, opencl_source(transform_programs(m, r, points))).build()


def _default_config(r: int) -> WinogradConfig:
    """The OpenCL target's untuned configuration: ``m = 2``."""
    return WinogradConfig(m=2)


class OpenCLWinograd:
    """A Winograd convolution plan on one OpenCL device (buffers and filters prepared).

    Args:
        x_shape: Input shape ``(N, C, H, W)``.
        w: Filters ``(K, C, r, r)`` (transformed once, in float64, then stored as float32).
        padding: Zero padding.
        config: Configuration; the OpenCL kernels use its ``m`` and ``points`` (None:
            ``WinogradConfig(m=2)``).
        device: ``(context, queue)``; default :func:`opencl_device` (set up once).

    Raises:
        BackendUnavailableError: When no OpenCL device exists (a ``RuntimeError``).
        WinogradError: A configuration the OpenCL kernels cannot run (fp16 storage).
    """

    def __init__(
        self,
        x_shape: tuple,
        w: np.ndarray,
        padding: int = 0,
        config: WinogradConfig | None = None,
        device: tuple | None = None,
    ):
        import pyopencl as cl

        dev = device or _shared_device()
        if dev is None:
            raise BackendUnavailableError(f"no OpenCL device ({_REQUIREMENT})")
        config = config or _default_config(w.shape[2])
        if config.storage != "fp32":
            raise WinogradError(
                f"the OpenCL target computes in fp32 only, got storage={config.storage!r}"
            )
        m = config.m
        self.ctx, self.queue = dev
        self.Ho, self.Wo = check_conv_args(tuple(x_shape), w.shape, padding)
        self.N, self.C, self.H, self.W = (int(v) for v in x_shape)
        self.K, _, self.r, _ = w.shape
        self.m, self.n, self.padding = m, m + self.r - 1, padding
        self.tiles_h, self.tiles_w = math.ceil(self.Ho / m), math.ceil(self.Wo / m)
        self.P = self.N * self.tiles_h * self.tiles_w
        self.prog = _program(self.ctx, m, self.r, config.points)
        mf = cl.mem_flags
        U = filter_transform(w, m, config.points, dtype=np.float32)
        nn = self.n * self.n
        self.U = cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=U)
        self.V = cl.Buffer(self.ctx, mf.READ_WRITE, 4 * nn * self.C * self.P)
        self.M = cl.Buffer(self.ctx, mf.READ_WRITE, 4 * nn * self.K * self.P)
        self.x = cl.Buffer(self.ctx, mf.READ_ONLY, 4 * self.N * self.C * self.H * self.W)
        self.out = cl.Buffer(self.ctx, mf.WRITE_ONLY, 4 * self.N * self.K * self.Ho * self.Wo)
        # kernel objects of this plan's own (a program is shared by the plans of one F(m, r))
        self.knl_in = cl.Kernel(self.prog, "input_transform")
        self.knl_gemm = cl.Kernel(self.prog, "batched_gemm")
        self.knl_out = cl.Kernel(self.prog, "output_transform")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Convolve ``x`` (shape as planned) and return ``(N, K, Ho, Wo)`` float32."""
        import pyopencl as cl

        i32 = np.int32
        cl.enqueue_copy(self.queue, self.x, np.ascontiguousarray(x, np.float32))
        nn = self.n * self.n
        sizes_in = (self.C, self.H, self.W, self.padding, self.tiles_h, self.tiles_w, self.P)
        self.knl_in(self.queue, (self.C * self.P,), None, self.x, self.V, *map(i32, sizes_in))
        sizes_gemm = (nn, self.K, self.C, self.P)
        self.knl_gemm(
            self.queue, (nn * self.K * self.P,), None, self.U, self.V, self.M, *map(i32, sizes_gemm)
        )
        sizes_out = (self.K, self.Ho, self.Wo, self.tiles_h, self.tiles_w, self.P)
        self.knl_out(self.queue, (self.K * self.P,), None, self.M, self.out, *map(i32, sizes_out))
        y = np.empty((self.N, self.K, self.Ho, self.Wo), dtype=np.float32)
        cl.enqueue_copy(self.queue, y, self.out)
        self.queue.finish()
        return y

    def time(self, x: np.ndarray, reps: int = 3) -> float:
        """Median wall time (s) of one call after a warm-up call.

        Args:
            x: Input of the planned shape.
            reps: Timed calls (median).
        """
        return median_time(lambda: self(x), repeats=reps, warmup=1).median


def _run(
    x: np.ndarray,
    w: np.ndarray,
    padding: int,
    config: WinogradConfig,
    device: tuple | None = None,
) -> np.ndarray:
    """The OpenCL target's ``run`` (:class:`~hpcnb.winograd.backend.Backend`): a one-shot plan."""
    return OpenCLWinograd(x.shape, w, padding, config, device)(x)


def _plan(
    x_shape: tuple[int, ...], w: np.ndarray, padding: int, config: WinogradConfig
) -> OpenCLWinograd:
    """The OpenCL target's plan: device buffers and transformed filters set up once."""
    return OpenCLWinograd(x_shape, w, padding, config)


def _excerpt(m: int, r: int, lines: int) -> dict[str, str]:
    """The first input-transform lines of the generated OpenCL C program."""
    progs = transform_programs(m, r)
    first = input_body(progs, cl_constant, "const float ", ";")[0]
    return {"OpenCL C": source_excerpt(opencl_source(progs), first, lines)}


_REQUIREMENT = "install pocl-opencl-icd for PoCL's CPU device"
OPENCL_BACKEND = register_backend(
    Backend(
        "opencl",
        _run,
        _default_config,
        lambda: _shared_device() is not None,
        _REQUIREMENT,
        label="OpenCL",
        excerpt=_excerpt,
        plan=_plan,
    )
)
"""The OpenCL target (PoCL's CPU device by default; option of ``run``: ``device``, a
``(context, queue)`` pair). For repeated calls on one shape, :class:`OpenCLWinograd`
keeps the device buffers and the transformed filters."""
