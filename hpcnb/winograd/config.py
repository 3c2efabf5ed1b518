"""How one Winograd convolution is run: :class:`WinogradConfig` and the default configuration.

The configuration is plain data shared by every back-end (:mod:`~hpcnb.winograd.backend`),
the tuner (:mod:`~hpcnb.winograd.autotune`) and the wisdom store
(:mod:`~hpcnb.winograd.wisdom`); it imports none of them.

Example:
    >>> from hpcnb.winograd.config import WinogradConfig, default_config
    >>> default_config(3) == WinogradConfig(m=4, points="accurate")
    True
    >>> WinogradConfig(m=2, threads=1).block_tiles  # 0: all tiles in one block
    0
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcnb.winograd.transforms import WinogradError, validate_mr

__all__ = ["GEMMS", "SCHEDULES", "STORAGE", "WinogradConfig", "WinogradError", "default_config"]

GEMMS: tuple[str, ...] = ("blas", "numba")
STORAGE: tuple[str, ...] = ("fp32", "fp16")
SCHEDULES: tuple[str, ...] = ("auto", "tiles", "stages")


@dataclass(frozen=True)
class WinogradConfig:
    """How one convolution is run.

    Attributes:
        m: Outputs per tile side (``F(m x m, r x r)``).
        block_tiles: Tiles transformed and multiplied per block (0: chosen from the layer,
            see :func:`~hpcnb.winograd.conv.fused_plan`; unfused path: all at once).
        channel_major: Loop order of the unfused transforms (channel outer vs tile outer).
        threads: Numba and BLAS threads (0: leave the current settings).
        gemm: ``"blas"`` (OpenBLAS sgemm) or ``"numba"`` (generated register-blocked loop).
        points: Point set of the transforms.
        storage: ``"fp32"`` or ``"fp16"`` (transformed tensors rounded to half precision;
            fp16 always runs the unfused path).
        fused: One generated kernel per block of tiles (gather + input transform, the
            ``n²`` GEMMs, output transform + scatter) instead of three passes over
            whole-layer buffers.
        schedule: Parallel schedule of the fused path: ``"tiles"`` (one block per thread,
            private scratch), ``"stages"`` (blocks in sequence, each stage parallel) or
            ``"auto"`` (tiles when there are enough blocks for every thread).
    """

    m: int = 4
    block_tiles: int = 0
    channel_major: bool = True
    threads: int = 0
    gemm: str = "blas"
    points: str = "default"
    storage: str = "fp32"
    fused: bool = True
    schedule: str = "auto"

    def __post_init__(self) -> None:
        """Check every field.

        Raises:
            WinogradError: A field out of range, with its name (a ``ValueError``).
        """
        validate_mr(self.m, 1)
        if not isinstance(self.block_tiles, int) or self.block_tiles < 0:
            raise WinogradError(
                f"WinogradConfig.block_tiles must be an int >= 0, got {self.block_tiles!r}"
            )
        if not isinstance(self.threads, int) or self.threads < 0:
            raise WinogradError(f"WinogradConfig.threads must be an int >= 0, got {self.threads!r}")
        if self.gemm not in GEMMS:
            raise WinogradError(f"WinogradConfig.gemm must be one of {GEMMS}, got {self.gemm!r}")
        if self.schedule not in SCHEDULES:
            raise WinogradError(
                f"WinogradConfig.schedule must be one of {SCHEDULES}, got {self.schedule!r}"
            )
        if not isinstance(self.fused, bool):
            raise WinogradError(f"WinogradConfig.fused must be a bool, got {self.fused!r}")
        if self.storage not in STORAGE:
            raise WinogradError(
                f"WinogradConfig.storage must be one of {STORAGE}, got {self.storage!r}"
            )


def default_config(r: int) -> WinogradConfig:
    """Untuned default: fused, ``m = 4`` with the accurate points for ``r <= 3``, else 2.

    ``F(4x4, 3x3)`` with the points ``0, -1, 1, 2, -1/2`` keeps the fp32 error of the
    ResNet layers near 4e-6 of the output's scale (the default points: about 1.2e-5 at
    256 channels); ``F(6x6, 3x3)`` does fewer multiplications but errs by about 2e-5.
    """
    return WinogradConfig(m=4, points="accurate") if r <= 3 else WinogradConfig(m=2)
