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
import subprocess
import sys

import numpy as np

from hpcnb.winograd.codegen import cuda_kernels
from hpcnb.winograd.conv import check_conv_args, filter_transform

__all__ = ["DEFAULT_SIM_CASES", "conv2d_winograd_cuda", "simulator_active", "validate_in_simulator"]

# (N, C, K, H, W, r, padding, m): small enough for the simulator (one Python thread each)
DEFAULT_SIM_CASES: tuple[tuple[int, ...], ...] = (
    (1, 2, 3, 6, 7, 3, 1, 2),
    (2, 3, 2, 7, 5, 3, 0, 4),
    (1, 2, 2, 6, 6, 5, 2, 2),
)


def simulator_active() -> bool:
    """True when Numba's CUDA simulator is enabled in this process."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def conv2d_winograd_cuda(
    x: np.ndarray, w: np.ndarray, m: int = 2, padding: int = 0, points: str = "default",
    threads_per_block: int = 64,
) -> np.ndarray:  # fmt: skip
    """Winograd convolution with the generated ``numba.cuda`` kernels.

    Args:
        x: Input ``(N, C, H, W)``.
        w: Filters ``(K, C, r, r)``.
        m: Outputs per tile side.
        padding: Zero padding.
        points: Point set.
        threads_per_block: CUDA block size.

    Returns:
        ``(N, K, Ho, Wo)`` float32.

    Raises:
        RuntimeError: When neither a GPU nor the simulator is available.
    """
    from numba import cuda

    if not cuda.is_available():
        raise RuntimeError(
            "conv2d_winograd_cuda: no CUDA GPU; set NUMBA_ENABLE_CUDASIM=1 before importing "
            "numba.cuda to use the simulator"
        )
    Ho, Wo = check_conv_args(x.shape, w.shape, padding)
    N, C, _H, _W = x.shape
    K, _, r, _ = w.shape
    n = m + r - 1
    kern = cuda_kernels(m, r, points)
    U = filter_transform(w, m, points, dtype=np.float32)
    tiles_h, tiles_w = math.ceil(Ho / m), math.ceil(Wo / m)
    P = N * tiles_h * tiles_w
    d_x = cuda.to_device(np.ascontiguousarray(x, np.float32))
    d_U = cuda.to_device(U)
    d_V = cuda.device_array((n * n, C, P), dtype=np.float32)
    d_M = cuda.device_array((n * n, K, P), dtype=np.float32)
    d_out = cuda.device_array((N, K, Ho, Wo), dtype=np.float32)

    def blocks(total: int) -> int:
        return (total + threads_per_block - 1) // threads_per_block

    kern.input_transform[blocks(C * P), threads_per_block](
        d_x, d_V, padding, tiles_h, tiles_w, 0, P, True
    )
    kern.batched_gemm[blocks(n * n * K * P), threads_per_block](d_U, d_V, d_M)
    kern.output_transform[blocks(K * P), threads_per_block](d_M, d_out, tiles_h, tiles_w, 0, True)
    return d_out.copy_to_host()


def _check_cases(cases: list[tuple[int, ...]], seed: int) -> list[dict]:
    """Run the CUDA kernels on ``cases`` and compare with ``F.conv2d`` (in this process)."""
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(seed)
    out = []
    for N, C, K, H, W, r, pad, m in cases:
        x = rng.standard_normal((N, C, H, W), dtype=np.float32)
        w = rng.standard_normal((K, C, r, r), dtype=np.float32)
        y = conv2d_winograd_cuda(x, w, m=m, padding=pad)
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
    proc = subprocess.run(
        [sys.executable, "-m", "hpcnb.winograd.cuda", payload],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"CUDA simulator run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":  # pragma: no cover - runs in the simulator subprocess
    args = json.loads(sys.argv[1])
    print(json.dumps(_check_cases([tuple(c) for c in args["cases"]], args["seed"])))
