"""Compiling the generated ``numba.cuda`` kernels for real GPU architectures without a GPU.

``numba.cuda.compile_ptx`` lowers each generated kernel to PTX for a chosen compute
capability (it needs libNVVM from the CUDA toolkit, not a driver); ``ptxas -v`` assembles
the PTX and reports registers, shared memory, stack and spills. From those and each
architecture's limits, :func:`occupancy` gives the theoretical occupancy, and
:func:`model_choice` picks a tile size for a layer by a documented roofline model
(:func:`model_time`); the ``"cuda"`` target (:mod:`~hpcnb.winograd.cuda`) uses it to tune
without a GPU and measures when a GPU is present.

The CUDA 13 toolkit no longer targets Volta (``sm_70``): its libNVVM rejects
``compute_70``, so the oldest architecture compiled here is Turing (``sm_75``).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hpcnb.errors import InvalidStateError
from hpcnb.winograd.backend import BackendUnavailableError
from hpcnb.winograd.codegen import cuda_kernels
from hpcnb.winograd.config import WinogradError
from hpcnb.winograd.opcount import transform_programs

__all__ = [
    "ARCHS",
    "ArchSpec",
    "KernelResources",
    "compile_kernel",
    "compile_targets",
    "cuda_toolkit",
    "kernel_signatures",
    "model_choice",
    "model_time",
    "occupancy",
    "ptx_arithmetic",
]


@dataclass(frozen=True)
class ArchSpec:
    """Per-SM limits and a representative GPU of one architecture (public data sheets).

    Attributes:
        cc: Compute capability.
        gpu: Representative GPU.
        max_threads_sm: Resident threads per SM.
        max_blocks_sm: Resident blocks per SM.
        regs_sm: 32-bit registers per SM.
        smem_sm: Shared memory per SM (bytes).
        fp32_tflops: Peak fp32 throughput of the representative GPU.
        bandwidth_gbs: DRAM bandwidth of the representative GPU.
    """

    cc: tuple[int, int]
    gpu: str
    max_threads_sm: int
    max_blocks_sm: int
    regs_sm: int
    smem_sm: int
    fp32_tflops: float
    bandwidth_gbs: float

    @property
    def sm(self) -> str:
        """``sm_XY`` name."""
        return f"sm_{self.cc[0]}{self.cc[1]}"


ARCHS: dict[str, ArchSpec] = {
    "sm_75": ArchSpec((7, 5), "T4", 1024, 16, 65536, 65536, 8.1, 320.0),
    "sm_80": ArchSpec((8, 0), "A100-SXM", 2048, 32, 65536, 167936, 19.5, 1555.0),
    "sm_90": ArchSpec((9, 0), "H100-SXM", 2048, 32, 65536, 233472, 67.0, 3350.0),
}


@dataclass(frozen=True)
class KernelResources:
    """``ptxas -v`` report of one kernel for one architecture.

    Attributes:
        kernel: Kernel name.
        arch: ``sm_XY``.
        registers: Registers per thread.
        shared_bytes: Static shared memory per block.
        stack_bytes: Stack frame per thread.
        spill_stores: Spill store bytes.
        spill_loads: Spill load bytes.
        ptx_lines: Lines of PTX.
        occupancy: Theoretical occupancy at the block size used.
    """

    kernel: str
    arch: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int
    ptx_lines: int
    occupancy: float


def cuda_toolkit() -> Path | None:
    """Return the CUDA toolkit folder holding ``ptxas`` and libNVVM, or None."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    ptxas = shutil.which("ptxas")
    if ptxas:
        candidates.append(str(Path(ptxas).resolve().parent.parent))
    for c in candidates:
        if c and (Path(c) / "bin" / "ptxas").exists() and (Path(c) / "nvvm").is_dir():
            return Path(c)
    return None


def kernel_signatures(dtype: str = "float32") -> dict[str, tuple]:
    """Numba signatures of the three generated kernels (C-contiguous arrays, int64 sizes)."""
    from numba import types

    f = getattr(types, dtype)
    i = types.int64
    return {
        "input_transform": (f[:, :, :, ::1], f[:, :, ::1], i, i, i, i, i, types.boolean),
        "batched_gemm": (f[:, :, ::1], f[:, :, ::1], f[:, :, ::1]),
        "output_transform": (f[:, :, ::1], f[:, :, :, ::1], i, i, i, types.boolean),
    }


def _ptxas_report(text: str) -> dict[str, int]:
    out = {"registers": 0, "shared_bytes": 0, "stack_bytes": 0, "spill_stores": 0, "spill_loads": 0}
    if m := re.search(r"Used (\d+) registers", text):
        out["registers"] = int(m.group(1))
    if m := re.search(r"(\d+) bytes smem", text):
        out["shared_bytes"] = int(m.group(1))
    if m := re.search(
        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text
    ):
        out["stack_bytes"], out["spill_stores"], out["spill_loads"] = map(int, m.groups())
    return out


def occupancy(spec: ArchSpec, registers: int, shared_bytes: int, threads_per_block: int) -> float:
    """Theoretical occupancy (active warps / maximum warps) of a kernel on one SM.

    Registers are allocated per warp in units of 256; the resident blocks are limited by
    registers, shared memory, threads and the block limit.

    Args:
        spec: Architecture limits.
        registers: Registers per thread (from ptxas).
        shared_bytes: Shared memory per block.
        threads_per_block: Block size.

    Returns:
        Occupancy in [0, 1].
    """
    warps = math.ceil(threads_per_block / 32)
    regs_warp = math.ceil(max(registers, 1) * 32 / 256) * 256
    by_regs = spec.regs_sm // (regs_warp * warps)
    by_smem = spec.smem_sm // shared_bytes if shared_bytes else spec.max_blocks_sm
    by_threads = spec.max_threads_sm // threads_per_block
    blocks = min(by_regs, by_smem, by_threads, spec.max_blocks_sm)
    return blocks * warps / (spec.max_threads_sm // 32)


@lru_cache(maxsize=256)
def compile_kernel(
    m: int, r: int, kernel: str, arch: str, points: str = "default", threads_per_block: int = 128
) -> tuple[str, KernelResources]:
    """Compile one generated kernel to PTX for ``arch`` and assemble it with ``ptxas -v``.

    Args:
        m: Outputs per tile.
        r: Filter size.
        kernel: ``input_transform``, ``batched_gemm`` or ``output_transform``.
        arch: Key of :data:`ARCHS`.
        points: Point set.
        threads_per_block: Block size for the occupancy figure.

    Returns:
        ``(ptx text, resources)``.

    Raises:
        BackendUnavailableError: The CUDA toolkit is missing (a ``RuntimeError``).
        InvalidStateError: ptxas fails (a ``RuntimeError``).
        WinogradError: An unknown kernel or architecture (a ``ValueError``).
    """
    home = cuda_toolkit()
    if home is None:
        raise BackendUnavailableError("CUDA toolkit (ptxas + libNVVM) not found; set CUDA_HOME")
    os.environ.setdefault("CUDA_HOME", str(home))
    if arch not in ARCHS:
        raise WinogradError(f"arch={arch!r}: expected one of {sorted(ARCHS)}")
    sigs = kernel_signatures()
    if kernel not in sigs:
        raise WinogradError(f"kernel={kernel!r}: expected one of {sorted(sigs)}")
    from numba import cuda

    spec = ARCHS[arch]
    mod = cuda_kernels(m, r, points)
    ptx, _ = cuda.compile_ptx(getattr(mod, kernel).py_func, sigs[kernel], cc=spec.cc)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        proc = subprocess.run(
            [
                str(home / "bin" / "ptxas"),
                f"-arch={arch}",
                "-v",
                str(src),
                "-o",
                str(Path(tmp) / "k.cubin"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    if proc.returncode != 0:
        raise InvalidStateError(f"ptxas failed for {kernel} on {arch}: {proc.stderr[-2000:]}")
    rep = _ptxas_report(proc.stdout + proc.stderr)
    occ = occupancy(spec, rep["registers"], rep["shared_bytes"], threads_per_block)
    return ptx, KernelResources(kernel, arch, ptx_lines=ptx.count("\n"), occupancy=occ, **rep)


def compile_targets(
    cases: tuple[tuple[int, int], ...], archs: tuple[str, ...] = ("sm_75", "sm_80", "sm_90")
):
    """Resource table of every kernel of every ``F(m, r)`` on every architecture.

    Args:
        cases: ``(m, r)`` pairs.
        archs: Architectures (keys of :data:`ARCHS`).

    Returns:
        ``pandas.DataFrame``: one row per (F, kernel, arch) with the ptxas figures.
    """
    import pandas as pd

    rows = []
    for m, r in cases:
        for kernel in kernel_signatures():
            for arch in archs:
                _, res = compile_kernel(m, r, kernel, arch)
                rows.append({"F": f"F({m},{r})", **res.__dict__})
    return pd.DataFrame(rows)


def model_time(
    m: int, r: int, shape: tuple[int, int, int, int], spec: ArchSpec, occ: float
) -> float:
    """Roofline estimate (s) of one layer: max(flops / effective peak, bytes / bandwidth).

    The compute roof is scaled by ``min(1, occ / 0.5)`` (latency is taken as hidden from
    about 50 % occupancy on).

    Args:
        m: Outputs per tile.
        r: Filter size.
        shape: ``(N, C, K, H)`` of a square, padding-preserving layer.
        spec: The architecture.
        occ: The lowest occupancy of the layer's kernels.
    """
    N, C, K, H = shape
    n = m + r - 1
    tiles = N * math.ceil(H / m) ** 2
    progs = transform_programs(m, r)
    flops = float(tiles * (C * 2 * n * progs.input.ops + K * (n + m) * progs.output.ops))
    flops += 2.0 * n * n * K * C * tiles
    nbytes = 4.0 * (N * C * H * H + 2 * n * n * C * tiles + 2 * n * n * K * tiles + N * K * H * H)
    nbytes += 4.0 * n * n * K * C
    efficiency = min(1.0, occ / 0.5)  # latency hidden from ~50 % occupancy on
    return max(
        flops / (spec.fp32_tflops * 1e12 * max(efficiency, 1e-3)),
        nbytes / (spec.bandwidth_gbs * 1e9),
    )


def model_choice(
    shape: tuple[int, int, int, int], arch: str, ms: tuple[int, ...] = (2, 4, 6), r: int = 3
) -> dict:
    """Model-based tile choice for a CUDA target without a GPU to measure on.

    Every kernel's occupancy comes from its ptxas report; the layer time is a roofline
    estimate whose compute roof is scaled by the lowest kernel occupancy (below 50 %).

    Args:
        shape: ``(N, C, K, H)`` of a square, padding-preserving layer.
        arch: Key of :data:`ARCHS`.
        ms: Tile sizes to consider.
        r: Filter size.

    Returns:
        Dict with ``best_m``, ``arch`` and per-m ``model_s``/``occupancy``.
    """
    spec = ARCHS[arch]
    est = {}
    for m in ms:
        occ = min(compile_kernel(m, r, k, arch)[1].occupancy for k in kernel_signatures())
        est[m] = {"model_s": model_time(m, r, shape, spec, occ), "occupancy": occ}
    best = min(est, key=lambda k: est[k]["model_s"])
    return {"arch": arch, "best_m": best, "estimates": est, "measured": False}


def ptx_arithmetic(m: int, r: int, arch: str, lines: int, kernel: str = "input_transform") -> str:
    """The first floating-point instructions of one generated kernel's PTX for ``arch``.

    Args:
        m: Outputs per tile.
        r: Filter size.
        arch: Key of :data:`ARCHS`.
        lines: Instructions shown.
        kernel: ``input_transform``, ``batched_gemm`` or ``output_transform``.

    Raises:
        BackendUnavailableError: The CUDA toolkit is missing (a ``RuntimeError``).
    """
    ptx, _ = compile_kernel(m, r, kernel, arch)
    ops = ("add.f32", "sub.f32", "mul.f32", "fma.rn.f32")
    arith = [ln.strip() for ln in ptx.splitlines() if ln.strip().startswith(ops)]
    return "\n".join(arith[:lines])
