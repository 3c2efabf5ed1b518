"""Compile the package's C programs (cached) and time native runs of programs, interleaved.

:func:`compile_c` builds ``hpcnb/commprof/csrc/<name>.c`` (and the headers it includes
from the same folder) with gcc into ``hpcnb.paths.cache_dir("commprof")``, keyed by the
sources, the flags and :func:`hpcnb.paths.machine_key`. :func:`time_commands` times whole
program runs through :func:`hpcnb.launch.run_bounded` in interleaved rounds
(:func:`hpcnb.timing.interleaved`, wall clock), so a ratio of two programs' rounds carries
the machine's drift on both sides. :func:`marginal_overhead` times a tool's cost per unit of
work from runs at two sizes, so the start-up of the program and of the tool cancels.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path

from hpcnb.errors import HpcnbError, InvalidInputError, MissingFileError
from hpcnb.timing import Timing, interleaved

__all__ = ["CompileError", "compile_c", "compile_sources", "marginal_overhead", "time_commands"]


class CompileError(HpcnbError, RuntimeError):
    """gcc is missing or failed (the message holds its output)."""


def compile_sources(files: Mapping[str, str], main: str, flags: Sequence[str]) -> Path:
    """Compile ``main`` (a key of ``files``, name -> C text) with ``flags``; return the binary.

    The files are written to one folder (so ``#include "x.h"`` finds its siblings); the
    binary is cached by content, flags and machine.

    Args:
        files: File name -> C source text, written side by side.
        main: The file to compile (a key of ``files``).
        flags: gcc flags.

    Raises:
        CompileError: gcc is missing or fails.
    """
    from hpcnb.launch import run_bounded
    from hpcnb.paths import cache_dir, machine_key

    blob = "\0".join([*(f"{k}\0{v}" for k, v in sorted(files.items())), main, *flags])
    key = hashlib.sha256((blob + machine_key()).encode()).hexdigest()[:16]
    out = cache_dir("commprof") / f"bin-{key}" / Path(main).stem
    if out.is_file():
        return out
    if shutil.which("gcc") is None:
        raise CompileError("gcc not found: install it (apt-get install gcc)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            Path(tmp, name).write_text(text)
        part = Path(tmp, out.name + ".bin")
        cmd = ["gcc", *flags, "-I", tmp, str(Path(tmp, main)), "-o", str(part)]
        res = run_bounded(cmd, timeout=120)
        if res.returncode:
            raise CompileError(f"gcc failed on {main} ({' '.join(flags)}):\n{res.stderr[-2000:]}")
        shutil.move(str(part), out)
    return out


def compile_c(
    name: str, flags: Sequence[str] = ("-g", "-O1", "-pthread"), folder: str = "csrc"
) -> Path:
    """Compile the package's ``<folder>/<name>.c`` with the headers beside it.

    Args:
        name: Program name (``"ring"``, ``"false_sharing"``, ``"suite/jacobi"`` ...).
        flags: gcc flags (``-DPAD`` etc. included).
        folder: Folder of the package holding the sources.

    Raises:
        MissingFileError: The package has no such C source.
        CompileError: gcc is missing or fails.
    """
    base = resources.files("hpcnb.commprof").joinpath(folder)
    sub = base
    parts = name.split("/")
    for p in parts[:-1]:
        sub = sub.joinpath(p)
    main = f"{parts[-1]}.c"
    if not sub.joinpath(main).is_file():
        raise MissingFileError(f"no C source {folder}/{name}.c in hpcnb.commprof")
    files = {
        f.name: f.read_text(encoding="utf-8")
        for f in sub.iterdir()
        if f.name == main or f.name.endswith(".h")
    }
    return compile_sources(files, main, flags)


def time_commands(
    commands: Mapping[str, Sequence[str]],
    *,
    repeats: int = 5,
    warmup: int = 1,
    timeout: float = 300.0,
) -> dict[str, Timing]:
    """Wall times of whole program runs, one of each per round, interleaved.

    Args:
        commands: Label -> program and arguments.
        repeats: Timed rounds.
        warmup: Untimed rounds first.
        timeout: Limit of one run (s).

    Returns:
        ``{label: Timing}`` with ``repeats`` samples each.

    Raises:
        LaunchError: A program exits with a non-zero status.
    """
    from hpcnb.launch import run_bounded

    def runner(cmd: Sequence[str]) -> Callable[[], object]:
        return lambda: run_bounded(list(cmd), timeout=timeout, check=True)

    fns = {label: runner(cmd) for label, cmd in commands.items()}
    return interleaved(fns, repeats=repeats, warmup=warmup, clock="wall")


def marginal_overhead(
    native: Callable[[int], object],
    tool: Callable[[int], object],
    native_sizes: tuple[int, int],
    tool_sizes: tuple[int, int],
    *,
    repeats: int = 5,
    warmup: int = 1,
) -> tuple[float, ...]:
    """Per-round slowdown of a tool per unit of work, start-up cancelled.

    Each round runs ``native`` at both of ``native_sizes`` and ``tool`` at both of
    ``tool_sizes`` (interleaved, :func:`hpcnb.timing.interleaved`); the time per unit of
    work is the difference of the two runs over the difference of the sizes, so whatever
    does not grow with the size (process and tool start-up, parsing fixed headers)
    cancels. The tool may run smaller sizes than the native program: the ratio is per
    unit of work either way, assuming work proportional to the size on both sides.

    Args:
        native: ``native(size)`` runs the program natively.
        tool: ``tool(size)`` runs it under the tool (the whole path: trace, parse, replay).
        native_sizes: Two sizes for the native runs, smaller first.
        tool_sizes: Two sizes for the tool runs, smaller first.
        repeats: Timed rounds.
        warmup: Untimed rounds first.

    Returns:
        One ratio ``(tool seconds per unit) / (native seconds per unit)`` per round.

    Raises:
        InvalidInputError: Sizes not increasing, or a round whose native difference is not
            positive (the sizes are too close to measure a difference).
    """
    for sizes in (native_sizes, tool_sizes):
        if not 0 <= sizes[0] < sizes[1]:
            raise InvalidInputError(f"marginal_overhead: sizes {sizes} must be 0 <= small < large")
    fns = {
        "n1": lambda: native(native_sizes[0]),
        "n2": lambda: native(native_sizes[1]),
        "t1": lambda: tool(tool_sizes[0]),
        "t2": lambda: tool(tool_sizes[1]),
    }
    t = interleaved(fns, repeats=repeats, warmup=warmup, clock="wall")
    dn, dt = native_sizes[1] - native_sizes[0], tool_sizes[1] - tool_sizes[0]
    out = []
    for n1, n2, t1, t2 in zip(
        t["n1"].samples, t["n2"].samples, t["t1"].samples, t["t2"].samples, strict=True
    ):
        per_native = (n2 - n1) / dn
        if per_native <= 0:
            raise InvalidInputError(
                f"marginal_overhead: native runs at sizes {native_sizes} took {n1:.4f} s and "
                f"{n2:.4f} s; choose sizes further apart"
            )
        out.append(((t2 - t1) / dt) / per_native)
    return tuple(out)
