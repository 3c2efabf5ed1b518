"""Tests of the portable Winograd targets: PTX for several architectures, OpenCL, one generator."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hpcnb.winograd import conv2d_winograd, transform_programs
from hpcnb.winograd.backend import get_backend
from hpcnb.winograd.codegen import cpu_source, cuda_source, input_body, output_body, python_constant
from hpcnb.winograd.opencl import cl_constant, opencl_device, opencl_source
from hpcnb.winograd.ptx import ARCHS, compile_kernel, cuda_toolkit, occupancy

needs_toolkit = pytest.mark.skipif(
    cuda_toolkit() is None, reason="CUDA toolkit (ptxas + libNVVM) not found; set CUDA_HOME"
)
_DEVICE = opencl_device()
needs_opencl = pytest.mark.skipif(
    _DEVICE is None, reason="no OpenCL device: install Debian pocl-opencl-icd (PoCL)"
)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.getbasetemp().parent / "hpcnb_winograd_cache"
    monkeypatch.setenv("HPCNB_CACHE", str(cache))


def test_all_targets_render_one_expression_set():
    progs = transform_programs(4, 3)
    sources = {
        "cpu": (cpu_source(progs), python_constant, "", ""),
        "cuda": (cuda_source(progs), python_constant, "", ""),
        "opencl": (opencl_source(progs), cl_constant, "const float ", ";"),
    }
    targets = {}
    for name, (src, const, decl, end) in sources.items():
        lines = input_body(progs, const, decl, end) + output_body(progs, const, decl, end)
        for line in lines:
            assert line in src, (name, line)
        targets[name] = [re.split(r"\s*=", ln.removeprefix(decl))[0] for ln in lines]
    assert targets["cpu"] == targets["cuda"] == targets["opencl"]
    n_defs = len(progs.input.definitions) * 2 * progs.transform.n
    assert len(input_body(progs, python_constant)) == n_defs


def test_occupancy_model():
    a100 = ARCHS["sm_80"]
    assert occupancy(a100, 32, 0, 128) == 1.0
    assert occupancy(a100, 64, 0, 128) == 0.5
    assert occupancy(a100, 255, 0, 256) == pytest.approx(0.125)  # 1 block of 8 warps
    assert occupancy(ARCHS["sm_75"], 32, 48 * 1024, 128) == pytest.approx(0.125)


@needs_toolkit
@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_ptx_compiles_for_each_architecture(arch):
    ptx, res = compile_kernel(2, 3, "input_transform", arch)
    assert f".target {arch}" in ptx
    assert res.registers > 0 and res.spill_stores == 0
    assert 0 < res.occupancy <= 1


@needs_toolkit
def test_all_kernels_compile_and_model_choice_without_gpu():
    for kernel in ("batched_gemm", "output_transform"):
        _, res = compile_kernel(2, 3, kernel, "sm_90")
        assert res.registers > 0
    from numba import cuda

    if cuda.is_available():
        pytest.skip("a GPU is present: the CUDA target measures instead of modelling")
    (choice,) = get_backend("cuda").tile_choices((1, 16, 16, 14), ms=(2, 4), archs=("sm_90",))
    assert (
        not choice.measured and choice.best_m in (2, 4) and choice.target.startswith("CUDA sm_90")
    )
    assert set(choice.seconds) == set(choice.detail) == {2, 4}


@needs_opencl
def test_opencl_kernels_match_torch():
    rng = np.random.default_rng(5)
    for N, C, K, H, W, r, pad, m in [
        (1, 3, 5, 9, 11, 3, 1, 2),
        (2, 67, 4, 7, 6, 3, 1, 4),
        (3, 2, 3, 10, 9, 5, 2, 2),
    ]:
        x = rng.standard_normal((N, C, H, W), dtype=np.float32)
        w = rng.standard_normal((K, C, r, r), dtype=np.float32)
        y = conv2d_winograd(x, w, m=m, padding=pad, target="opencl")
        ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=pad).numpy()
        assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max() * 2
    (choice,) = get_backend("opencl").tile_choices((1, 4, 4, 8), ms=(2, 4), reps=1)
    assert choice.measured and choice.target == "OpenCL" and set(choice.seconds) == {2, 4}


def test_portability_table_makes_no_value_for_a_target_that_cannot_run():
    from hpcnb.winograd.backend import backends
    from hpcnb.winograd.portability import portability_table

    table = portability_table(
        2, 3, (1, 2, 2, 6), threads=1, reps=2, options={"cuda": {"archs": ()}}
    )
    runs = [b.name for b in backends() if b.available()]
    assert list(table.attrs["measured"]) == runs and "cpu" in runs
    for b in backends():
        (row,) = table[table["name"] == b.name].to_dict("records")
        assert row["target"] == b.title
        if b.available():
            assert row["compiled"] and row["time_kind"] == "measured"
            assert row["max_rel_error"] <= 1e-5 and row["time_ms"] > 0
        else:
            assert not row["compiled"] and row["time_kind"] == "not run"
            assert np.isnan(row["time_ms"]) and row["requirement"] == b.requirement
    ocl = table[table["name"] == "opencl"]
    assert (ocl["time_kind"].iloc[0] == "measured") == (opencl_device() is not None)
    assert set(table.attrs["round_ratios"]) == set(runs) - {"cpu"}
    assert all(len(r) == 2 for r in table.attrs["round_ratios"].values())


@needs_toolkit
def test_portability_table_adds_the_ptx_rows_of_the_cuda_target():
    from hpcnb.winograd.portability import portability_table

    table = portability_table(
        2,
        3,
        (1, 2, 2, 6),
        threads=1,
        reps=1,
        options={"cuda": {"archs": ("sm_80",), "sim_error": 1e-7}},
    )
    ptx = table[table["time_kind"] == "modelled"]
    assert list(ptx["target"]) == ["CUDA sm_80 (A100-SXM)"] and list(ptx["name"]) == ["cuda"]
    assert ptx["compiled"].all() and ptx["max_rel_error"].iloc[0] == 1e-7
    assert ptx["registers"].iloc[0] > 0 and 0 < ptx["occupancy"].iloc[0] <= 1


def test_source_excerpts_come_from_every_target():
    from hpcnb.winograd.portability import source_excerpts

    progs = transform_programs(2, 3)
    first = input_body(progs, python_constant)[0]
    ex = source_excerpts(2, 3, k=3, options={"cuda": {"archs": ()}})
    assert list(ex) == ["Numba CPU", "numba.cuda", "OpenCL C"]
    assert ex["Numba CPU"] == ex["numba.cuda"] and ex["Numba CPU"].splitlines()[0] == first
    assert ex["OpenCL C"].startswith("const float ") and len(ex["OpenCL C"].splitlines()) == 3
    assert list(source_excerpts(2, 3, targets=["opencl"])) == ["OpenCL C"]


def test_every_target_runs_through_the_one_call():
    import inspect

    import hpcnb.winograd as wino
    from hpcnb.winograd.backend import backend_names, get_backend

    assert set(backend_names()) >= {"cpu", "cuda", "opencl"}
    params = inspect.signature(wino.conv2d_winograd).parameters
    assert list(params)[:4] == ["x", "w", "padding", "config"]
    assert params["target"].kind is params["m"].kind is inspect.Parameter.KEYWORD_ONLY
    assert len(wino.__all__) <= 16 and not [
        n for n in wino.__all__ if n.startswith("conv2d_winograd_")
    ]
    for name in backend_names():
        b = get_backend(name)
        assert b.name == name and b.title and callable(b.run)
        assert b.default_config(3).m >= 1 and isinstance(b.available(), bool)


def test_a_new_target_is_one_registration():
    from hpcnb.winograd import (
        Backend,
        WinogradConfig,
        conv2d_winograd,
        register_backend,
        winograd_reference,
    )
    from hpcnb.winograd.backend import TARGETS, BackendUnavailableError

    seen: list[WinogradConfig] = []

    def run(x, w, padding, config):
        seen.append(config)
        return winograd_reference(x, w, config.m, padding, config.points)

    try:
        register_backend(Backend("numpy_test", run, lambda r: WinogradConfig(m=2)))
        with pytest.raises(ValueError, match="registered already"):
            register_backend(Backend("cpu", run, lambda r: WinogradConfig(m=2)))
        x, w = torch.randn(2, 3, 7, 6), torch.randn(4, 3, 3, 3)
        y = conv2d_winograd(x, w, 1, target="numpy_test")
        assert isinstance(y, torch.Tensor) and seen == [WinogradConfig(m=2)]
        torch.testing.assert_close(y, F.conv2d(x, w, padding=1), rtol=0, atol=1e-4)
        y = conv2d_winograd(x.numpy(), w.numpy(), 1, WinogradConfig(m=4), target="numpy_test", m=3)
        assert isinstance(y, np.ndarray) and seen[-1] == WinogradConfig(m=3)
        with pytest.raises(ValueError, match="unknown Winograd target 'nowhere'"):
            conv2d_winograd(x, w, 1, target="nowhere")
        with pytest.raises(ValueError, match="config must be"):
            conv2d_winograd(x, w, 1, {"m": 2}, target="numpy_test")
        with pytest.raises(ValueError, match="keeps no tuned configurations"):
            conv2d_winograd(x, w, 1, "wisdom", target="numpy_test")
        absent = Backend("absent", run, lambda r: WinogradConfig(), lambda: False, "a unicorn")
        register_backend(absent)
        with pytest.raises(BackendUnavailableError, match="a unicorn"):
            conv2d_winograd(x, w, 1, target="absent")
        with pytest.raises(BackendUnavailableError, match="a unicorn"):
            absent.tile_choices((1, 3, 4, 7), ms=(2,))
        assert issubclass(BackendUnavailableError, RuntimeError)
        # a target without its own tuning routine is timed at every tile size
        (choice,) = get_backend("numpy_test").tile_choices((1, 2, 2, 6), ms=(2, 3), reps=1)
        assert choice.measured and choice.best_m in (2, 3) and set(choice.seconds) == {2, 3}
    finally:
        TARGETS.unregister("numpy_test")
        TARGETS.unregister("absent")
    assert "numpy_test" not in TARGETS


def test_cuda_target_without_a_gpu_says_what_to_set():
    from numba import cuda

    from hpcnb.winograd import conv2d_winograd

    if cuda.is_available():
        pytest.skip("a GPU (or the simulator) is present")
    x, w = np.ones((1, 1, 5, 5), np.float32), np.ones((1, 1, 3, 3), np.float32)
    with pytest.raises(RuntimeError, match="NUMBA_ENABLE_CUDASIM"):
        conv2d_winograd(x, w, 1, target="cuda")


def test_cpu_target_keeps_the_transformed_filters_of_a_weight():
    from hpcnb.winograd import conv2d_winograd
    from hpcnb.winograd.conv import CPU_BACKEND

    w = torch.randn(2, 3, 3, 3)
    opts = CPU_BACKEND.prepare(w, CPU_BACKEND.default_config(3))
    assert opts["U"] is CPU_BACKEND.prepare(w, CPU_BACKEND.default_config(3))["U"]
    x = torch.randn(1, 3, 6, 6)
    torch.testing.assert_close(
        conv2d_winograd(x, w, 1), F.conv2d(x, w, padding=1), rtol=0, atol=1e-4
    )
