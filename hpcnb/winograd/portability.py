"""One ``F(m, r)`` generated for every target, side by side: sources, resources, correctness, time.

Targets: Numba CPU (measured), OpenCL C on an OpenCL CPU device such as PoCL (measured),
and ``numba.cuda`` compiled to PTX for several architectures (resources from ``ptxas``,
correctness from Numba's CUDA simulator running the same source, time *modelled* unless
a GPU is present).
"""

from __future__ import annotations

import numpy as np

from hpcnb.timing import interleaved, ratios
from hpcnb.winograd.codegen import _const_name, cpu_kernels, cpu_source, cuda_source, input_body
from hpcnb.winograd.config import WinogradConfig
from hpcnb.winograd.conv import filter_transform, winograd_numpy
from hpcnb.winograd.numerics import relative_error
from hpcnb.winograd.opcount import transform_programs
from hpcnb.winograd.opencl import OpenCLWinograd, cl_constant, opencl_device, opencl_source

__all__ = ["portability_table", "source_excerpts"]


def _excerpt(src: str, first: str, k: int) -> str:
    start = src.index(first)
    return "\n".join(ln.strip() for ln in src[start:].splitlines()[:k])


def source_excerpts(
    m: int, r: int, k: int = 4, archs: tuple[str, ...] = ("sm_90",)
) -> dict[str, str]:
    """First ``k`` lines of the input-transform arithmetic in each target's source.

    Args:
        m: Outputs per tile.
        r: Filter size.
        k: Lines per excerpt.
        archs: CUDA architectures whose PTX is excerpted (skipped without the toolkit).

    Returns:
        ``{target: text}``; PTX excerpts show the first floating-point instructions.
    """
    progs = transform_programs(m, r)
    py_first = input_body(progs, _const_name)[0]
    cl_first = input_body(progs, cl_constant, "const float ", ";")[0]
    out = {
        "Numba CPU": _excerpt(cpu_source(progs), py_first, k),
        "numba.cuda": _excerpt(cuda_source(progs), py_first, k),
        "OpenCL C": _excerpt(opencl_source(progs), cl_first, k),
    }
    from hpcnb.winograd.ptx import compile_kernel, cuda_toolkit

    if cuda_toolkit() is not None:
        for arch in archs:
            ptx, _ = compile_kernel(m, r, "input_transform", arch)
            ops = ("add.f32", "sub.f32", "mul.f32", "fma.rn.f32")
            arith = [ln.strip() for ln in ptx.splitlines() if ln.strip().startswith(ops)]
            out[f"PTX {arch}"] = "\n".join(arith[:k])
    return out


def portability_table(
    m: int,
    r: int,
    shape: tuple[int, int, int, int],
    *,
    threads: int,
    reps: int = 3,
    archs: tuple[str, ...] = ("sm_75", "sm_80", "sm_90"),
    sim_error: float | None = None,
    seed: int = 0,
):
    """Correctness, resources and time of ``F(m, r)`` on every target for one layer.

    Args:
        m: Outputs per tile.
        r: Filter size.
        shape: ``(N, C, K, H)`` of a square layer with padding ``(r - 1) // 2``.
        threads: Threads for the Numba CPU kernels (PoCL uses its own pool).
        reps: Timed interleaved rounds (Numba CPU and OpenCL).
        archs: CUDA architectures to compile.
        sim_error: Largest relative error of the same CUDA source in the simulator (from
            :func:`~hpcnb.winograd.cuda.validate_in_simulator`); None if not run.
        seed: Seed of the data.

    Returns:
        ``pandas.DataFrame`` with one row per target: ``target``, ``compiled``,
        ``max_rel_error``, ``time_ms``, ``time_kind`` (measured / modelled / -),
        ``registers``, ``spills``, ``occupancy``. Without an OpenCL device the OpenCL row
        says ``compiled`` False and ``time_kind`` "not run" (no value is made up).
        ``attrs["opencl_ran"]`` tells whether an OpenCL device ran, and
        ``attrs["opencl_vs_numba_rounds"]`` holds the per-round time ratios OpenCL / Numba
        CPU (both timed in ``reps`` interleaved rounds; empty without a device).
    """
    import pandas as pd
    import torch
    import torch.nn.functional as F

    from hpcnb.winograd.ptx import (
        ARCHS,
        _model_time,
        compile_kernel,
        cuda_toolkit,
        kernel_signatures,
    )

    N, C, K, H = shape
    pad = (r - 1) // 2
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, H), dtype=np.float32)
    w = rng.standard_normal((K, C, r, r), dtype=np.float32)
    ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=pad).numpy().astype(np.float64)
    rows = []
    cfg = WinogradConfig(m=m, threads=threads)
    cpu_kernels(m, r)
    U = filter_transform(w, m, dtype=np.float32)
    y = winograd_numpy(x, w, pad, cfg, U=U)
    fns = [lambda: winograd_numpy(x, w, pad, cfg, U=U)]
    dev = opencl_device()
    if dev is not None:
        plan = OpenCLWinograd(x.shape, w, pad, WinogradConfig(m=m), dev)
        fns.append(lambda: plan(x))
    # Numba CPU and OpenCL timed in interleaved rounds after a warm-up round
    timings = interleaved(fns, repeats=reps, warmup=1)
    t_numba = timings[0].median
    rows.append({"target": "Numba CPU", "compiled": True, "max_rel_error": relative_error(y, ref),
                 "time_ms": 1e3 * t_numba, "time_kind": "measured"})  # fmt: skip
    ratio_rounds: tuple[float, ...] = ()
    if dev is None:
        rows.append({"target": "OpenCL (absent)", "compiled": False, "time_kind": "not run"})
    else:
        name = f"OpenCL {dev[0].devices[0].name.strip()[:30]}"
        err = relative_error(plan(x), ref)
        ratio_rounds = ratios(timings[1], timings[0])
        t_ocl = timings[1].median
        rows.append({"target": name, "compiled": True, "max_rel_error": err,
                     "time_ms": 1e3 * t_ocl, "time_kind": "measured"})  # fmt: skip
    have_toolkit = cuda_toolkit() is not None
    for arch in archs:
        if not have_toolkit:
            rows.append(
                {"target": f"CUDA {arch} (no toolkit)", "compiled": False, "time_kind": "-"}
            )
            continue
        res = [compile_kernel(m, r, k, arch)[1] for k in kernel_signatures()]
        occ = min(x.occupancy for x in res)
        rows.append({
            "target": f"CUDA {arch} ({ARCHS[arch].gpu})", "compiled": True,
            "max_rel_error": sim_error if sim_error is not None else np.nan,
            "time_ms": 1e3 * _model_time(m, r, shape, ARCHS[arch], occ), "time_kind": "modelled",
            "registers": max(x.registers for x in res),
            "spills": sum(x.spill_stores + x.spill_loads for x in res), "occupancy": occ,
        })  # fmt: skip
    table = pd.DataFrame(rows)
    table.attrs["opencl_ran"] = dev is not None
    table.attrs["opencl_vs_numba_rounds"] = ratio_rounds
    return table
