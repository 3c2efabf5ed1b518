"""Tests of the C kernel suite: C profiles under valgrind agree with the Numba profiles."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from hpcnb.commprof.csuite import C_SUITE, compare_case, compile_kernel, kernel_source
from hpcnb.commprof.suite import SUITE
from hpcnb.commprof.valgrind import missing_tools


def _need_tools() -> None:
    if missing_tools():
        pytest.skip(f"{', '.join(missing_tools())} not installed (apt-get install valgrind gcc)")


def test_every_suite_kernel_has_a_c_program_that_compiles() -> None:
    assert set(C_SUITE) == set(SUITE)
    for name in C_SUITE:
        assert "static void kernel(int tid, int nthreads, int phase)" in kernel_source(name)
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed (apt-get install gcc)")
    for name in C_SUITE:
        assert compile_kernel(name).is_file()


@pytest.mark.parametrize("name", ["jacobi", "radix_sort", "pipeline"])
def test_c_profile_matches_numba_profile(name: str) -> None:
    _need_tools()
    r = compare_case(name, 8, 4, seed=1)
    assert r.outputs_match  # same inputs, same results
    assert np.array_equal(r.c_matrix, r.numba_matrix) and r.c_matrix.sum() > 0
    assert r.c_pattern == r.numba_pattern
    assert r.loops_agree


def test_openmp_build_matches_numba_profile() -> None:
    _need_tools()
    r = compare_case("kmeans", 8, 3, seed=2, openmp=True)
    assert r.outputs_match and r.matrices_agree and r.c_pattern == "broadcast"
    assert r.program.nthreads == 3  # the master is worker 0, no extra main thread
