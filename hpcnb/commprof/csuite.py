"""The kernel suite in C: compile, run under valgrind, and compare with the Numba profiles.

Each of the 11 suite kernels (:mod:`hpcnb.commprof.kernels`) is also written in C
(``csrc/suite/<name>.c``, one ordinary program each, on the small harness
``csrc/suite/csuite.h``): the same phases with a barrier after each, the same static
blocks for the loops the Numba kernels write as ``prange``, the same accesses. A program
reads its arrays from raw files written from the Numba suite's inputs (same generator,
same seed) and writes its results back, so the two runs can be checked against each
other. Built with ``gcc -g -O1 -pthread`` the main thread creates T workers (worker ``t``
is profile thread ``t + 1``); with ``-fopenmp`` one parallel region runs the phases (worker
``t`` is thread ``t``, the master being worker 0).

:func:`compare_case` profiles both and compares the workers' whole-kernel matrix on the
kernel's arrays, the patterns, and the patterns of
the loops that carry communication. Accesses made by the harness's serial code
(:data:`HARNESS_SERIAL`: reading the input, writing the results) do not count: the Numba
inputs have no writer and its results are read by nobody.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from hpcnb.commprof.analysis import classify_pattern, inclusive, loop_tree
from hpcnb.commprof.native import compile_c, time_commands
from hpcnb.commprof.runtime import KernelArg, Profile
from hpcnb.commprof.suite import SUITE, check_result, suite_case
from hpcnb.commprof.valgrind import ProgramProfile, TraceError, parse_trace, run_program
from hpcnb.timing import Timing

__all__ = [
    "C_SUITE",
    "CaseComparison",
    "compare_case",
    "compile_kernel",
    "kernel_profile",
    "time_kernels",
    "kernel_matrix",
    "kernel_source",
    "restrict",
]


def kernel_source(name: str) -> str:
    """The C source of suite kernel ``name``."""
    suite_case(name)  # names the known kernels when unknown
    folder = resources.files("hpcnb.commprof").joinpath("csrc", "suite")
    return folder.joinpath(f"{name}.c").read_text(encoding="utf-8")


def compile_kernel(name: str, openmp: bool = False, defines: Sequence[str] = ()) -> Path:
    """Compile suite kernel ``name`` with ``gcc -g -O1`` (``-pthread`` or ``-fopenmp``).

    Cached under ``hpcnb.paths.cache_dir("commprof")`` by source, flags and machine.

    Args:
        name: Suite kernel.
        openmp: Build with ``-fopenmp`` instead of ``-pthread``.
        defines: Extra gcc flags such as ``-DCS_ALIGN``.

    Raises:
        CompileError: gcc is missing or fails.
    """
    suite_case(name)  # names the known kernels when unknown
    flags = ("-g", "-O1", "-fopenmp" if openmp else "-pthread", *defines)
    return compile_c(f"suite/{name}", flags)


def _write_inputs(name: str, args: Sequence[KernelArg], folder: Path) -> list[str]:
    """Write the kernel's arrays as ``<param>.bin``; return the program's extra arguments."""
    k = suite_case(name).kernel
    argv: list[str] = []
    for param, value in zip(k.params[3:], args, strict=True):
        if param in k.arrays:
            a = np.ascontiguousarray(value)
            a.tofile(folder / f"{param}.bin")
            argv += [str(d) for d in a.shape]
        else:
            argv.append(repr(float(value)) if isinstance(value, float) else str(int(value)))
    return argv


def restrict(
    pp: ProgramProfile, objects: list[str], exclude_functions: set[str] | None = None
) -> Profile:
    """A copy of the profile with only some accesses, its exact matrices replayed afresh.

    Args:
        pp: The program's profile.
        objects: Names of the objects whose accesses are kept.
        exclude_functions: Drop the accesses made by code of these functions.
    """
    from hpcnb.commprof.shadow import replay_exact

    tr = pp.profile.trace
    assert tr is not None
    owner = pp.object_of_element()
    idx = [k for k, o in enumerate(pp.objects) if o.name in objects]
    keep = np.isin(owner[tr[:, 2]], idx)
    if exclude_functions:
        keep &= ~pp.rows_in(exclude_functions)
    sub = tr[keep]
    p = Profile(
        kernel=pp.profile.kernel,
        regions=pp.profile.regions,
        nthreads=pp.profile.nthreads,
        exact=pp.profile.exact,
        exact_bytes=pp.profile.exact_bytes,
        signature=None,
        accesses=np.zeros_like(pp.profile.accesses),
        trace=sub,
        n_elements=pp.profile.n_elements,
        itemsizes=pp.profile.itemsizes,
    )
    if len(sub):
        np.add.at(p.accesses, (sub[:, 1], sub[:, 4]), 1)
    p.exact = replay_exact(p)
    p.exact_bytes = pp.word_bytes * p.exact
    return p


def kernel_matrix(p: Profile, workers: slice) -> np.ndarray:
    """Whole-program matrix of a restricted profile among the worker threads.

    Args:
        p: The profile (of :func:`restrict`).
        workers: The worker threads' rows and columns.
    """
    return p.exact.sum(axis=0)[workers, workers]


@dataclass
class CaseComparison:
    """The C and Numba profiles of one suite kernel, compared.

    Attributes:
        name: Kernel name.
        openmp: Whether the C program was built with OpenMP.
        c_matrix: Workers' matrix on the kernel's arrays, C under valgrind.
        numba_matrix: Whole-kernel matrix of the Numba profile.
        c_pattern: Pattern of ``c_matrix``.
        numba_pattern: Pattern of ``numba_matrix``.
        truth: The suite's ground-truth pattern.
        c_loop_patterns: Sorted patterns of the C loops with events (phase loop excluded).
        numba_loop_patterns: Sorted patterns of the Numba loops with events.
        outputs_match: The C program's results equal the Numba run's.
        program: The C profile.
    """

    name: str
    openmp: bool
    c_matrix: np.ndarray
    numba_matrix: np.ndarray
    c_pattern: str
    numba_pattern: str
    truth: str
    c_loop_patterns: list[str]
    numba_loop_patterns: list[str]
    outputs_match: bool
    program: ProgramProfile

    @property
    def matrices_agree(self) -> bool:
        """Whether the C and Numba matrices are equal."""
        return bool(np.array_equal(self.c_matrix, self.numba_matrix))

    @property
    def loops_agree(self) -> bool:
        """Whether the loops with events have the same patterns in C and in Numba."""
        return self.c_loop_patterns == self.numba_loop_patterns


def _outputs_match(folder: Path, name: str, args: Sequence[KernelArg]) -> bool:
    k = suite_case(name).kernel
    ok = True
    for param, value in zip(k.params[3:], args, strict=True):
        out = folder / f"{param}.out"
        if param in k.arrays and out.is_file():
            a = np.asarray(value)
            got = np.fromfile(out, dtype=a.dtype).reshape(a.shape)
            ok &= bool(np.allclose(got, a, rtol=1e-9, atol=1e-12))
    return ok


def _loop_patterns(p: Profile, workers: slice, skip: set[int]) -> list[str]:
    out = []
    for node in loop_tree(p.regions, p.exact, p.accesses):
        if node.region.rid in skip or node.inclusive == 0:
            continue
        out.append(classify_pattern(node.matrix[workers, workers]))
    return sorted(out)


def compare_case(
    name: str,
    size: int,
    nthreads: int,
    seed: int = 0,
    *,
    openmp: bool = False,
    timeout: float = 600.0,
) -> CaseComparison:
    """Profile suite kernel ``name`` in C under valgrind and in Numba; compare them.

    Args:
        name: Suite kernel.
        size: Problem-size unit (as :func:`hpcnb.commprof.suite.profile_case`).
        nthreads: Threads (workers).
        seed: Input seed.
        openmp: Build the C program with ``-fopenmp`` instead of ``-pthread``.
        timeout: Limit of the valgrind run (s).

    Raises:
        CompileError: gcc is missing or fails.
        TraceError: valgrind fails, or the trace lacks the harness's input arrays.
    """
    from hpcnb.commprof.runtime import profile

    c = suite_case(name)
    args, nphases = c.make(size, nthreads, seed)
    original = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    exe = compile_kernel(name, openmp)
    with tempfile.TemporaryDirectory(prefix=f"csuite-{name}-") as tmp:
        folder = Path(tmp)
        extra = _write_inputs(name, args, folder)
        run = run_program([str(exe), str(nthreads), str(nphases), tmp, *extra], timeout=timeout)
        wb = max(np.asarray(a).itemsize for a in args if isinstance(a, np.ndarray))
        pp = parse_trace(run, word_bytes=wb)
        np_prof = profile(c.kernel, args, nthreads=nthreads, nphases=nphases, schedule=c.schedule)
        ok = _outputs_match(folder, name, args) and check_result(name, args, original)
    arrays = [p for p in c.kernel.params[3:] if p in c.kernel.arrays]
    _name_arrays(pp, name, arrays)
    sub = restrict(pp, arrays, HARNESS_SERIAL)
    workers = slice(0, nthreads) if openmp else slice(1, nthreads + 1)
    cm = kernel_matrix(sub, workers)
    nm = inclusive(np_prof.regions, np_prof.exact)[0]
    phase_loops = _phase_loops(pp)
    return CaseComparison(
        name=name,
        openmp=openmp,
        c_matrix=cm,
        numba_matrix=nm,
        c_pattern=classify_pattern(cm),
        numba_pattern=classify_pattern(nm),
        truth=c.pattern,
        c_loop_patterns=_loop_patterns(sub, workers, {0, *phase_loops}),
        numba_loop_patterns=_loop_patterns(np_prof, slice(0, nthreads), {0}),
        outputs_match=ok,
        program=pp,
    )


def _phase_loops(pp: ProgramProfile) -> set[int]:
    """Regions of the harness's loops (the phase loop and thread start/join), not the kernel's."""
    out = set()
    for lp in pp.binary.loops:
        if lp.file == "csuite.h":
            out.add(lp.index + 1)
    return out


#: Suite kernels that have a C version (all of them).
C_SUITE = tuple(SUITE)
#: Functions of the harness that run serially around the kernel (input and output).
HARNESS_SERIAL = {"main", "cs_init", "cs_load", "cs_save"}


def kernel_profile(
    name: str,
    args: Sequence[KernelArg],
    nphases: int,
    nthreads: int,
    *,
    defines: Sequence[str] = (),
    timeout: float = 600.0,
) -> Profile:
    """The C kernel's accesses to its own arrays under valgrind, workers numbered from 0.

    The profile keeps the accesses to the kernel's arrays made outside the harness's serial
    code (:func:`restrict`), and renumbers the worker threads ``0 .. nthreads - 1`` (the
    main thread of a pthreads build runs only that serial code), so its metrics compare
    with those of the Numba kernel. Its trace has one phase: the valgrind path does not
    see the harness's barriers.

    Args:
        name: Suite kernel.
        args: The kernel's own arguments (written to the program's input files).
        nphases: Barrier phases.
        nthreads: Worker threads.
        defines: Extra gcc flags of the build.
        timeout: Limit of the valgrind run (s).

    Raises:
        CompileError: gcc is missing or fails.
        TraceError: valgrind fails, or the trace lacks the harness's input arrays.
    """
    from hpcnb.commprof.shadow import replay_exact

    c = suite_case(name)
    exe = compile_kernel(name, defines=defines)
    with tempfile.TemporaryDirectory(prefix=f"csuite-{name}-") as tmp:
        extra = _write_inputs(name, args, Path(tmp))
        run = run_program([str(exe), str(nthreads), str(nphases), tmp, *extra], timeout=timeout)
    wb = max(np.asarray(a).itemsize for a in args if isinstance(a, np.ndarray))
    pp = parse_trace(run, word_bytes=wb)
    arrays = [p for p in c.kernel.params[3:] if p in c.kernel.arrays]
    _name_arrays(pp, name, arrays)
    sub = restrict(pp, arrays, HARNESS_SERIAL)
    assert sub.trace is not None
    tr = sub.trace.copy()
    tr[:, 0] -= 1  # worker t was profile thread t + 1
    if len(tr) and tr[:, 0].min() < 0:
        raise TraceError(
            f"{name}: the main thread accesses the kernel's arrays outside {HARNESS_SERIAL}"
        )
    sub.trace, sub.nthreads = tr, nthreads
    sub.exact = replay_exact(sub)
    sub.exact_bytes = pp.word_bytes * sub.exact
    return sub


def _name_arrays(pp: ProgramProfile, name: str, arrays: Sequence[str]) -> None:
    """Name the heap objects the harness loaded after the kernel's array parameters."""
    loaded = [o for o in pp.objects if o.kind == "heap" and "csuite.h" in o.site]
    if len(loaded) != len(arrays):
        raise TraceError(
            f"{name}: expected {len(arrays)} input arrays loaded by the harness, "
            f"found {len(loaded)} heap objects from csuite.h"
        )
    names = {o.name: a for o, a in zip(loaded, arrays, strict=True)}
    pp.objects = [
        type(o)(names.get(o.name, o.name), o.kind, o.site, o.address, o.size, o.first)
        for o in pp.objects
    ]


def time_kernels(
    name: str,
    variants: dict[str, tuple[Sequence[KernelArg], int, Sequence[str]]],
    nthreads: int,
    *,
    repeats: int = 7,
    warmup: int = 1,
) -> dict[str, Timing]:
    """Native wall times of C builds of one kernel, whole program runs, interleaved.

    Args:
        name: Suite kernel.
        variants: Label -> (kernel arguments, phases, extra gcc flags) of each build.
        nthreads: Worker threads.
        repeats: Timed rounds.
        warmup: Untimed rounds first.

    Raises:
        CompileError: gcc is missing or fails.
        LaunchError: A program exits with a non-zero status.
    """
    with tempfile.TemporaryDirectory(prefix=f"csuite-time-{name}-") as tmp:
        cmds = {}
        for label, (args, nphases, defines) in variants.items():
            folder = Path(tmp, label)
            folder.mkdir()
            extra = _write_inputs(name, args, folder)
            exe = compile_kernel(name, defines=defines)
            cmds[label] = [str(exe), str(nthreads), str(nphases), str(folder), *extra]
        return time_commands(cmds, repeats=repeats, warmup=warmup)
