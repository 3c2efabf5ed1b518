"""The Winograd wisdom store: per-machine tuned configurations in one validated JSON file.

Like FFTW's wisdom, the file keeps, per machine (:func:`hpcnb.paths.machine_key`) and layer
shape (:func:`shape_key`), the configuration the tuner (:mod:`~hpcnb.winograd.autotune`)
measured fastest, with every measurement. Nothing reads it behind the user's back: the
convolution consults it only when asked (``conv2d_winograd(x, w, config="wisdom")``, see
:func:`lookup_wisdom`). This module imports neither the convolution nor the tuner; both
import it.

The wisdom file lives under the hpcnb cache root (:func:`hpcnb.paths.cache_root`, e.g.
``~/.cache/hpcnb/winograd_wisdom.json``), never in the repository; ``$HPCNB_WISDOM`` or the
``path`` argument override it.

The file is a cache, so a broken one never stops a computation: :func:`read_wisdom`
validates it (the schema below, finite positive times, no unknown fields, at most
:data:`MAX_WISDOM_BYTES` = 16 MiB or ``$HPCNB_WISDOM_MAX_BYTES``) and ignores a file that
does not validate with a :class:`WisdomWarning` naming the file and the first problem;
the next :func:`~hpcnb.winograd.autotune.autotune` replaces it. :func:`write_wisdom`
writes atomically (a private temporary file, then ``os.replace``), so a concurrent reader
sees the old or the new file, never half of one. :func:`store_entry` merges under the
file's lock (:func:`hpcnb.cachefile.locked`, the sibling file ``<name>.lock``): it reads the
file again inside the lock, adds its entry and writes, so processes tuning at once keep
every entry each of them stored. A wisdom that cannot be written (read-only folder, full
disk) gives one :class:`WisdomWarning` and the tuned result is returned uncached.

Schema (format 1)::

    {"format": 1,
     "machines": {"<machine key>": {"<shape key>": {
         "best": <config>, "best_s": <s>, "default_s": <s>,
         "trials": [{"config": <config>, "seconds": <s>}, ...],
         "final": [{"config": <config>, "seconds": <s>}, ...],   # optional
         "torch_s": <s>,              # optional: torch's conv2d in the final rounds
         "measured_at": "<ISO 8601 time>"}}}}                    # optional

where the shape key is :func:`shape_key`'s, ``<config>`` holds fields of
:class:`~hpcnb.winograd.config.WinogradConfig` (with an ``m`` valid for the key's ``r``) and
``<s>`` is a finite number of seconds > 0. The machine key is
:func:`hpcnb.paths.machine_key`'s (``"<CPU model> | <n> cores | <arch>"``); entries under
any other key stay in the file but never match, so this machine is simply tuned again.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "wisdom.json"
    >>> read_wisdom(path)
    {'format': 1, 'machines': {}}
    >>> lookup_wisdom((1, 3, 8, 8), (4, 3, 3, 3), 1, path=path) is None
    True
    >>> shape_key((1, 3, 8, 8), (4, 3, 3, 3), 1)
    'N1_C3_H8_W8_K4_r3_p1'
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from dataclasses import fields
from pathlib import Path

from hpcnb.cachefile import CacheWarning, best_effort, locked, write_private_atomic
from hpcnb.errors import HpcnbError
from hpcnb.paths import cache_root, machine_key
from hpcnb.winograd.config import WinogradConfig, WinogradError
from hpcnb.winograd.transforms import POINT_SETS, validate_mr

__all__ = [
    "MAX_WISDOM_BYTES",
    "WisdomWarning",
    "lookup_wisdom",
    "read_wisdom",
    "shape_key",
    "stored_entry",
    "store_entry",
    "wisdom_path",
    "write_wisdom",
]

_FORMAT = 1


def wisdom_path(path: str | os.PathLike | None = None) -> Path:
    """Return the wisdom file: ``path``, else ``$HPCNB_WISDOM``, else the user cache folder."""
    if path is not None:
        return Path(path)
    env = os.environ.get("HPCNB_WISDOM")
    if env:
        return Path(env)
    return cache_root() / "winograd_wisdom.json"


def shape_key(x_shape: tuple, w_shape: tuple, padding: int) -> str:
    """Key of a layer: ``N{N}_C{C}_H{H}_W{W}_K{K}_r{r}_p{padding}``.

    Args:
        x_shape: Input shape ``(N, C, H, W)``.
        w_shape: Filter shape ``(K, C, r, r)``.
        padding: Zero padding.
    """
    N, C, H, W = (int(v) for v in x_shape)
    K, _, r, _ = (int(v) for v in w_shape)
    return f"N{N}_C{C}_H{H}_W{W}_K{K}_r{r}_p{int(padding)}"


MAX_WISDOM_BYTES = 16 * 2**20
"""Default largest wisdom file read (bytes); a larger one is ignored with a warning.

A tuned shape takes a few kilobytes, so 16 MiB holds thousands of them. Override it for
the process with ``$HPCNB_WISDOM_MAX_BYTES`` or per call with ``read_wisdom(max_bytes=...)``.
"""


def _max_bytes() -> int:
    value = os.environ.get("HPCNB_WISDOM_MAX_BYTES")
    if value:
        try:
            limit = int(value)
            if limit > 0:
                return limit
        except ValueError:
            pass
        warnings.warn(
            f"$HPCNB_WISDOM_MAX_BYTES={value[:40]!r} is not a positive integer: "
            f"using {MAX_WISDOM_BYTES}",
            WisdomWarning,
            stacklevel=3,
        )
    return MAX_WISDOM_BYTES


class WisdomWarning(CacheWarning):
    """A wisdom file was ignored (it does not validate) or could not be written."""


class _WisdomError(HpcnbError):
    """Internal: the wisdom file does not validate; the message says where and why."""


def _empty() -> dict:
    return {"format": _FORMAT, "machines": {}}


def _reject_constant(name: str) -> float:
    raise _WisdomError(f"non-finite number {name} (JSON allows finite numbers only)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _WisdomError(f"number {text[:40]} is out of range (not finite as a float)")
    return value


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _WisdomError(f"duplicate key {k[:80]!r}")
        out[k] = v
    return out


def _where(path: str, key: str) -> str:
    return f"{path}[{key[:80]!r}]"


def _check_keys(obj: object, path: str, required: set[str], optional: set[str]) -> dict:
    if not isinstance(obj, dict):
        raise _WisdomError(f"{path}: expected an object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - required - optional)
    if unknown:
        raise _WisdomError(f"{path}: unknown field {unknown[0][:80]!r}")
    missing = sorted(required - set(obj))
    if missing:
        raise _WisdomError(f"{path}: missing field {missing[0]!r}")
    return obj


def _check_seconds(value: object, path: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _WisdomError(f"{path}: expected a number of seconds, got {type(value).__name__}")
    try:
        ok = math.isfinite(value) and value > 0
    except OverflowError:  # an integer beyond the float range
        ok = False
    if not ok:
        raise _WisdomError(f"{path}: expected a finite number of seconds > 0, got {value!r:.40}")


_TYPES: dict[str, type] = {"int": int, "bool": bool, "str": str}
_CONFIG_TYPES = {
    f.name: _TYPES[f.type if isinstance(f.type, str) else f.type.__name__]
    for f in fields(WinogradConfig)
}


def _check_config(obj: object, path: str, r: int) -> None:
    cfg = _check_keys(obj, path, set(), set(_CONFIG_TYPES))
    for k, v in cfg.items():
        want = _CONFIG_TYPES[k]
        if not isinstance(v, want) or (want is int and isinstance(v, bool)):
            got = type(v).__name__
            raise _WisdomError(f"{_where(path, k)}: expected {want.__name__}, got {got}")
    if cfg.get("points", "default") not in POINT_SETS:
        raise _WisdomError(f"{_where(path, 'points')}: expected one of {POINT_SETS}")
    try:
        validate_mr(WinogradConfig(**cfg).m, r)
    except (ValueError, TypeError) as exc:
        raise _WisdomError(f"{path}: {exc}") from None


def _check_timings(obj: object, path: str, r: int) -> None:
    if not isinstance(obj, list):
        raise _WisdomError(f"{path}: expected a list, got {type(obj).__name__}")
    for i, t in enumerate(obj):
        item = _check_keys(t, f"{path}[{i}]", {"config", "seconds"}, set())
        _check_config(item["config"], f"{path}[{i}]['config']", r)
        _check_seconds(item["seconds"], f"{path}[{i}]['seconds']")


_SHAPE_KEY = re.compile(
    r"N[0-9]{1,9}_C[0-9]{1,9}_H[0-9]{1,9}_W[0-9]{1,9}_K[0-9]{1,9}_r([0-9]{1,2})_p[0-9]{1,9}"
)


def _validate(data: object) -> dict:
    top = _check_keys(data, "top level", {"format", "machines"}, set())
    if top["format"] != _FORMAT or isinstance(top["format"], bool):
        raise _WisdomError(f"format {top['format']!r:.40}: this version reads format {_FORMAT}")
    machines = top["machines"]
    if not isinstance(machines, dict):
        raise _WisdomError(f"'machines': expected an object, got {type(machines).__name__}")
    for mk, shapes in machines.items():
        mpath = _where("machines", mk)
        if not isinstance(shapes, dict):
            raise _WisdomError(f"{mpath}: expected an object, got {type(shapes).__name__}")
        for sk, entry in shapes.items():
            epath = _where(mpath, sk)
            match = _SHAPE_KEY.fullmatch(sk)
            if match is None:
                raise _WisdomError(f"{epath}: not a shape key like 'N1_C64_H56_W56_K64_r3_p1'")
            r = int(match.group(1))
            e = _check_keys(
                entry,
                epath,
                {"best", "best_s", "default_s", "trials"},
                {"final", "measured_at", "torch_s"},
            )
            _check_config(e["best"], _where(epath, "best"), r)
            _check_seconds(e["best_s"], _where(epath, "best_s"))
            _check_seconds(e["default_s"], _where(epath, "default_s"))
            _check_timings(e["trials"], _where(epath, "trials"), r)
            _check_timings(e.get("final", []), _where(epath, "final"), r)
            if "torch_s" in e:
                _check_seconds(e["torch_s"], _where(epath, "torch_s"))
            if not isinstance(e.get("measured_at", ""), str):
                raise _WisdomError(f"{_where(epath, 'measured_at')}: expected a string")
    return top


def _parse(path: Path, max_bytes: int) -> dict:
    """Read and validate ``path``; raise :class:`_WisdomError` saying what is wrong."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        raise _WisdomError(f"unreadable ({exc.strerror or exc})") from None
    if len(raw) > max_bytes:
        raise _WisdomError(
            f"larger than the limit of {max_bytes} bytes (see $HPCNB_WISDOM_MAX_BYTES)"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _WisdomError(f"not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(
            text,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
            object_pairs_hook=_unique_keys,
        )
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise _WisdomError(f"not valid JSON ({where}): {exc.msg}") from None
    except RecursionError:
        raise _WisdomError("JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise _WisdomError(f"not valid JSON: {exc}") from None
    return _validate(data)


def read_wisdom(path: str | os.PathLike | None = None, *, max_bytes: int | None = None) -> dict:
    """Return the validated content of the wisdom file, or an empty wisdom.

    A missing file is an empty wisdom. A file that does not validate (not JSON, truncated,
    unknown or missing fields, ``machines`` not an object, wrong types, non-finite or
    non-positive times, larger than ``max_bytes``, unreadable) is ignored: the result is
    an empty wisdom and a :class:`WisdomWarning` names the file and the first problem.
    This function never raises for the file's content.

    Args:
        path: Wisdom file (default :func:`wisdom_path`).
        max_bytes: Largest file read (default ``$HPCNB_WISDOM_MAX_BYTES``, else
            :data:`MAX_WISDOM_BYTES`).

    Returns:
        ``{"format": 1, "machines": {machine key: {shape key: entry}}}`` (see the module
        docstring for the schema).
    """
    wp = wisdom_path(path)
    limit = _max_bytes() if max_bytes is None else int(max_bytes)
    if not wp.exists() and not wp.is_symlink():
        return _empty()
    try:
        return _parse(wp, limit)
    except _WisdomError as exc:
        warnings.warn(
            f"wisdom file {wp}: ignored, {exc}; the next autotune() replaces it",
            WisdomWarning,
            stacklevel=2,
        )
        return _empty()


def write_wisdom(data: dict, path: str | os.PathLike | None = None) -> Path:
    """Write a wisdom (as returned by :func:`read_wisdom`) atomically.

    The JSON goes to a temporary file next to the wisdom file, which then replaces it
    (``os.replace``): a concurrent reader sees the old or the new file, never a part.

    Args:
        data: The wisdom; it must validate (the schema of the module docstring).
        path: Wisdom file (default :func:`wisdom_path`).

    Returns:
        The path written.

    Raises:
        WinogradError: ``data`` does not validate (nothing is written; a ``ValueError``).
        OSError: The file cannot be written.
    """
    wp = wisdom_path(path)
    try:
        _validate(data)
    except _WisdomError as exc:
        raise WinogradError(f"wisdom for {wp} does not validate: {exc}") from None
    write_private_atomic(wp, json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n")
    return wp


def stored_entry(data: dict, shape: str) -> dict | None:
    """Return this machine's entry for ``shape`` in a wisdom, or None.

    Args:
        data: A wisdom as returned by :func:`read_wisdom`.
        shape: A key of :func:`shape_key`.
    """
    return data["machines"].get(machine_key(), {}).get(shape)


def lookup_wisdom(
    x_shape: tuple, w_shape: tuple, padding: int, path: str | os.PathLike | None = None
) -> WinogradConfig | None:
    """Return the tuned configuration for this machine and shape, or None.

    Args:
        x_shape: Input shape.
        w_shape: Filter shape.
        padding: Zero padding.
        path: Wisdom file (default :func:`wisdom_path`).

    Returns:
        The stored best configuration, or None when the shape was not tuned here.
    """
    entry = stored_entry(read_wisdom(path), shape_key(x_shape, w_shape, padding))
    return None if entry is None else WinogradConfig(**entry["best"])


def store_entry(shape: str, entry: dict, path: str | os.PathLike | None = None) -> None:
    """Store this machine's ``entry`` for ``shape``, keeping the rest of the file.

    The merge runs under the wisdom file's lock (:func:`hpcnb.cachefile.locked`): the file
    is read again inside it, so entries another process stored meanwhile are kept, and
    written atomically. A file that cannot be written (read-only folder, full disk, a lock
    held for too long) gives a :class:`WisdomWarning`, not an error: the wisdom is a cache.

    Args:
        shape: A key of :func:`shape_key`.
        entry: The entry (schema of the module docstring).
        path: Wisdom file (default :func:`wisdom_path`).
    """
    wp = wisdom_path(path)
    with best_effort(wp, "wisdom file", category=WisdomWarning), locked(wp):
        data = read_wisdom(wp)
        data["machines"].setdefault(machine_key(), {})[shape] = entry
        try:
            write_wisdom(data, wp)
        except ValueError as exc:
            warnings.warn(
                f"wisdom file {wp}: not written ({exc}); the result is returned but not stored",
                WisdomWarning,
                stacklevel=3,
            )
