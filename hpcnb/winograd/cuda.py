"""Running the generated ``numba.cuda`` kernels: on a GPU, or in Numba's CUDA simulator.

:func:`conv2d_winograd_cuda` launches the three generated kernels (input transform,
batched products, output transform) for one convolution. Without a GPU the kernels run
in Numba's simulator, which must be enabled (``NUMBA_ENABLE_CUDASIM=1``) before
``numba.cuda`` is first imported; :func:`validate_in_simulator` therefore starts a fresh
Python process with that variable set and compares the results to ``F.conv2d``.
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

from hpcnb.launch import run_bounded
from hpcnb.winograd.backend import Backend, check_conv_args, convolve, register_backend
from hpcnb.winograd.codegen import cuda_kernels
from hpcnb.winograd.config import WinogradConfig, WinogradError
from hpcnb.winograd.conv import filter_transform

__all__ = [
    "CUDA_BACKEND",
    "DEFAULT_SIM_CASES",
    "conv2d_winograd_cuda",
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


CUDA_BACKEND = register_backend(
    Backend(
        "cuda",
        _run,
        _default_config,
        _available,
        "a CUDA GPU, or NUMBA_ENABLE_CUDASIM=1 set before numba.cuda is first imported",
    )
)
"""The ``numba.cuda`` target (a GPU, or Numba's CUDA simulator)."""


def conv2d_winograd_cuda(
    x, w, padding: int = 0, config: WinogradConfig | None = None, *, m: int | None = None,
    threads_per_block: int = 64,
):  # fmt: skip
    """Winograd convolution with the generated ``numba.cuda`` kernels.

    One thread per channel and tile in the transforms, per output element in the batched
    products; the filters are transformed on the host in float64.

    Args:
        x: Input ``(N, C, H, W)``, a ``torch.Tensor`` or NumPy array (copied as float32).
        w: Filters ``(K, C, r, r)``.
        padding: Zero padding on every side.
        config: Configuration; the CUDA kernels use its ``m``, ``points`` and
            ``channel_major`` (None: ``WinogradConfig(m=2)``).
        m: Outputs per tile side; overrides the configuration's ``m``.
        threads_per_block: CUDA block size.

    Returns:
        ``(N, K, Ho, Wo)`` float32, a tensor when ``x`` is one, else an array.

    Raises:
        BackendUnavailableError: Neither a GPU nor the simulator is available (a
            ``RuntimeError``).
    """
    return convolve(x, w, padding, config, target="cuda", m=m, threads_per_block=threads_per_block)


def _check_cases(cases: list[tuple[int, ...]], seed: int) -> list[dict]:
    """Run the CUDA kernels on ``cases`` and compare with ``F.conv2d`` (in this process)."""
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(seed)
    out = []
    for N, C, K, H, W, r, pad, m in cases:
        x = rng.standard_normal((N, C, H, W), dtype=np.float32)
        w = rng.standard_normal((K, C, r, r), dtype=np.float32)
        y = conv2d_winograd_cuda(x, w, pad, WinogradConfig(m=m))
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
        RuntimeError: When the subprocess fails (its stderr is included).
    """
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    payload = json.dumps({"cases": [list(c) for c in cases], "seed": seed})
    # run through the package (not ``-m``, which would execute this module a second time)
    code = (
        "import sys; from hpcnb.winograd.cuda import _simulator_main; _simulator_main(sys.argv[1])"
    )
    proc = run_bounded([sys.executable, "-c", code, payload], env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"CUDA simulator run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _simulator_main(payload: str) -> None:  # pragma: no cover - runs in the subprocess
    """Check the cases of ``payload`` (JSON) in the simulator and print the results."""
    args = json.loads(payload)
    print(json.dumps(_check_cases([tuple(c) for c in args["cases"]], args["seed"])))
