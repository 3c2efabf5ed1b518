"""Running the generated ``numba.cuda`` kernels: on a GPU, or in Numba's CUDA simulator.

:data:`CUDA_BACKEND` is the ``"cuda"`` target of
:func:`~hpcnb.winograd.backend.conv2d_winograd`: it launches the three generated kernels
(input transform, batched products, output transform) for one convolution, chooses its
tile size by measuring on a GPU or, without one, by the ptxas-based model of
:mod:`~hpcnb.winograd.ptx`, and reports its PTX resources per architecture. Without a GPU
the kernels run in Numba's simulator, which must be enabled (``NUMBA_ENABLE_CUDASIM=1``)
before ``numba.cuda`` is first imported; :func:`validate_in_simulator` therefore starts a
fresh Python process with that variable set and compares the results to ``F.conv2d``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import replace
from typing import Any

import numpy as np

from hpcnb.errors import InvalidStateError
from hpcnb.launch import run_bounded
from hpcnb.winograd.backend import (
    Backend,
    TileChoice,
    check_conv_args,
    conv2d_winograd,
    register_backend,
    sweep_tiles,
)
from hpcnb.winograd.codegen import (
    cuda_kernels,
    cuda_source,
    input_body,
    python_constant,
    source_excerpt,
)
from hpcnb.winograd.config import WinogradConfig, WinogradError
from hpcnb.winograd.conv import filter_transform
from hpcnb.winograd.opcount import transform_programs
from hpcnb.winograd.ptx import (
    ARCHS,
    compile_kernel,
    cuda_toolkit,
    kernel_signatures,
    model_choice,
    model_time,
    ptx_arithmetic,
)

__all__ = [
    "CUDA_BACKEND",
    "DEFAULT_SIM_CASES",
    "simulator_active",
    "validate_in_simulator",
]

# (N, C, K, H, W, r, padding, m): small enough for the simulator (one Python thread each)
DEFAULT_SIM_CASES: tuple[tuple[int, ...], ...] = (
    (1, 2, 3, 6, 7, 3, 1, 2),
    (2, 3, 2, 7, 5, 3, 0, 4),
    (1, 2, 2, 6, 6, 5, 2, 2),
)


def simulator_active() -> bool:
    """True when Numba's CUDA simulator is enabled in this process."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def _run(
    x: np.ndarray, w: np.ndarray, padding: int, config: WinogradConfig, threads_per_block: int = 64
) -> np.ndarray:
    """The CUDA target's ``run`` (:class:`~hpcnb.winograd.backend.Backend`): three launches."""
    from numba import cuda

    if config.storage != "fp32":
        raise WinogradError(
            f"the CUDA target computes in fp32 only, got storage={config.storage!r}"
        )
    Ho, Wo = check_conv_args(x.shape, w.shape, padding)
    N, C, _H, _W = x.shape
    K, _, r, _ = w.shape
    m, n = config.m, config.m + r - 1
    kern = cuda_kernels(m, r, config.points)
    U = filter_transform(w, m, config.points, dtype=np.float32)
    tiles_h, tiles_w = math.ceil(Ho / m), math.ceil(Wo / m)
    P = N * tiles_h * tiles_w
    d_x = cuda.to_device(x)
    d_U = cuda.to_device(U)
    d_V = cuda.device_array((n * n, C, P), dtype=np.float32)
    d_M = cuda.device_array((n * n, K, P), dtype=np.float32)
    d_out = cuda.device_array((N, K, Ho, Wo), dtype=np.float32)
    order = config.channel_major

    def blocks(total: int) -> int:
        return (total + threads_per_block - 1) // threads_per_block

    kern.input_transform[blocks(C * P), threads_per_block](
        d_x, d_V, padding, tiles_h, tiles_w, 0, P, order
    )
    kern.batched_gemm[blocks(n * n * K * P), threads_per_block](d_U, d_V, d_M)
    kern.output_transform[blocks(K * P), threads_per_block](d_M, d_out, tiles_h, tiles_w, 0, order)
    return d_out.copy_to_host()


def _available() -> bool:
    from numba import cuda

    return bool(cuda.is_available())


def _default_config(r: int) -> WinogradConfig:
    """The CUDA target's untuned configuration: ``m = 2`` (small tiles, few registers)."""
    return WinogradConfig(m=2)


def _excerpt(m: int, r: int, lines: int, archs: tuple[str, ...] = ("sm_90",)) -> dict[str, str]:
    """The first input-transform lines of the generated module, and of its PTX per arch.

    The PTX excerpts (the first floating-point instructions) need the CUDA toolkit and
    are left out without it.
    """
    progs = transform_programs(m, r)
    first = input_body(progs, python_constant)[0]
    out = {"numba.cuda": source_excerpt(cuda_source(progs), first, lines)}
    if cuda_toolkit() is not None:
        out.update({f"PTX {arch}": ptx_arithmetic(m, r, arch, lines) for arch in archs})
    return out


def _tune(
    shape: tuple[int, int, int, int],
    *,
    ms: tuple[int, ...],
    reps: int,
    seed: int,
    archs: tuple[str, ...] = tuple(ARCHS),
) -> list[TileChoice]:
    """Choose ``m``: measured on a real GPU, else modelled per architecture.

    Without a GPU (or in the simulator) every architecture of ``archs`` gets
    :func:`~hpcnb.winograd.ptx.model_choice` (ptxas occupancy and a roofline), which
    needs the CUDA toolkit.
    """
    if _available() and not simulator_active():
        from numba import cuda

        choice = sweep_tiles(CUDA_BACKEND, shape, ms=ms, reps=reps, seed=seed)
        return [replace(choice, target=f"numba.cuda on {cuda.get_current_device().name}")]
    out = []
    for arch in archs:
        res = model_choice(shape, arch, ms)
        est = res["estimates"]
        out.append(
            TileChoice(
                target=f"CUDA {arch} ({ARCHS[arch].gpu})",
                best_m=res["best_m"],
                seconds={m: e["model_s"] for m, e in est.items()},
                measured=False,
                detail={m: f"occupancy {e['occupancy']:.2f}" for m, e in est.items()},
            )
        )
    return out


def _resources(
    m: int,
    r: int,
    shape: tuple[int, int, int, int],
    *,
    archs: tuple[str, ...] = ("sm_75", "sm_80", "sm_90"),
    sim_error: float | None = None,
) -> list[dict[str, Any]]:
    """One portability row per architecture: ptxas resources and the modelled time.

    ``sim_error`` is the largest relative error of the same source in the simulator
    (:func:`validate_in_simulator`); None when it was not run.
    """
    if cuda_toolkit() is None:
        return [
            {"target": f"CUDA {arch} (no toolkit)", "compiled": False, "time_kind": "-"}
            for arch in archs
        ]
    rows = []
    for arch in archs:
        res = [compile_kernel(m, r, k, arch)[1] for k in kernel_signatures()]
        occ = min(x.occupancy for x in res)
        rows.append(
            {
                "target": f"CUDA {arch} ({ARCHS[arch].gpu})",
                "compiled": True,
                "max_rel_error": sim_error if sim_error is not None else np.nan,
                "time_ms": 1e3 * model_time(m, r, shape, ARCHS[arch], occ),
                "time_kind": "modelled",
                "registers": max(x.registers for x in res),
                "spills": sum(x.spill_stores + x.spill_loads for x in res),
                "occupancy": occ,
            }
        )
    return rows


CUDA_BACKEND = register_backend(
    Backend(
        "cuda",
        _run,
        _default_config,
        _available,
        "a CUDA GPU, or NUMBA_ENABLE_CUDASIM=1 set before numba.cuda is first imported",
        label="numba.cuda",
        excerpt=_excerpt,
        tune=_tune,
        resources=_resources,
    )
)
"""The ``numba.cuda`` target (a GPU, or Numba's CUDA simulator): one thread per channel and
tile in the transforms, per output element in the batched products, the filters
transformed on the host in float64; options of ``run``: ``threads_per_block`` (64)."""


def _check_cases(cases: list[tuple[int, ...]], seed: int) -> list[dict]:
    """Run the CUDA kernels on ``cases`` and compare with ``F.conv2d`` (in this process)."""
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(seed)
    out = []
    for N, C, K, H, W, r, pad, m in cases:
        x = rng.standard_normal((N, C, H, W), dtype=np.float32)
        w = rng.standard_normal((K, C, r, r), dtype=np.float32)
        y = conv2d_winograd(x, w, pad, WinogradConfig(m=m), target="cuda")
        ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=pad).numpy()
        rel = float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30))
        out.append({"case": [N, C, K, H, W, r, pad, m], "max_rel_error": rel})
    return out


def validate_in_simulator(
    cases: tuple[tuple[int, ...], ...] = DEFAULT_SIM_CASES, seed: int = 0, timeout: float = 300
) -> list[dict]:
    """Run the generated CUDA kernels in a subprocess under ``NUMBA_ENABLE_CUDASIM=1``.

    Args:
        cases: ``(N, C, K, H, W, r, padding, m)`` tuples (keep them small).
        seed: Seed of the random data.
        timeout: Seconds before the subprocess is abandoned.

    Returns:
        One dict per case with ``case`` and ``max_rel_error`` (vs ``F.conv2d``, relative to
        the output's largest magnitude).

    Raises:
        InvalidStateError: The subprocess fails (its stderr is included; a
            ``RuntimeError``).
    """
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    payload = json.dumps({"cases": [list(c) for c in cases], "seed": seed})
    # run through the package (not ``-m``, which would execute this module a second time)
    code = (
        "import sys; from hpcnb.winograd.cuda import _simulator_main; _simulator_main(sys.argv[1])"
    )
    proc = run_bounded([sys.executable, "-c", code, payload], env=env, timeout=timeout)
    if proc.returncode != 0:
        raise InvalidStateError(
            f"CUDA simulator run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _simulator_main(payload: str) -> None:  # pragma: no cover - runs in the subprocess
    """Check the cases of ``payload`` (JSON) in the simulator and print the results."""
    args = json.loads(payload)
    print(json.dumps(_check_cases([tuple(c) for c in args["cases"]], args["seed"])))
