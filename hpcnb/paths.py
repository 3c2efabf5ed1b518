"""The one cache root of hpcnb.

Everything hpcnb caches (downloaded data, measured timing tables, compiled kernels) lives
under :func:`cache_root`: the folder named by ``HPCNB_CACHE`` when set, else the platform's
user cache folder for ``hpcnb`` (``~/.cache/hpcnb`` on Linux,
``~/Library/Caches/hpcnb`` on macOS).
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcnb.errors import InvalidInputError

__all__ = ["CACHE_ENV", "cache_dir", "cache_root", "machine_key"]

CACHE_ENV = "HPCNB_CACHE"


def cache_root() -> Path:
    """Return the cache root (``$HPCNB_CACHE`` or the user cache folder), not created."""
    value = os.environ.get(CACHE_ENV)
    if value:
        return Path(value).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("hpcnb", appauthor=False))


def cache_dir(name: str) -> Path:
    """Return ``cache_root() / name`` (created).

    Args:
        name: A sub-folder name such as ``"data"``.

    Raises:
        ValueError: ``name`` is empty or leaves the cache root.
    """
    if not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise InvalidInputError(
            f"cache folder name {name!r} must be a relative path inside the cache"
        )
    path = cache_root() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def machine_key() -> str:
    """Return a short description of this machine for caches of measurements.

    Timings do not travel between machines: the key holds the CPU model, the number of
    logical cores and the architecture (``"AMD EPYC 7B13 | 2 cores | x86_64"``).
    """
    import platform

    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                model = line.split(":", 1)[1].strip()
                break
    if not model:
        model = platform.processor() or platform.machine()
    return f"{model} | {os.cpu_count()} cores | {platform.machine()}"
