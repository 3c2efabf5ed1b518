"""Tests of the portable Winograd targets: PTX for several architectures, OpenCL, one generator."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hpcnb.winograd import transform_programs
from hpcnb.winograd.codegen import _const_name, cpu_source, cuda_source, input_body, output_body
from hpcnb.winograd.opencl import cl_constant, conv2d_winograd_opencl, opencl_device, opencl_source
from hpcnb.winograd.ptx import ARCHS, compile_kernel, cuda_toolkit, occupancy, tune_cuda

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
        "cpu": (cpu_source(progs), _const_name, "", ""),
        "cuda": (cuda_source(progs), _const_name, "", ""),
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
    assert len(input_body(progs, _const_name)) == n_defs


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
    choice = tune_cuda((1, 16, 16, 14), "sm_90", ms=(2, 4))
    assert not choice["measured"] and choice["best_m"] in (2, 4)
    assert set(choice["estimates"]) == {2, 4}


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
        y = conv2d_winograd_opencl(x, w, m=m, padding=pad)
        ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=pad).numpy()
        assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max() * 2


def test_portability_table_makes_no_opencl_value_without_a_device():
    from hpcnb.winograd.portability import portability_table

    table = portability_table(2, 3, (1, 2, 2, 6), threads=1, reps=2, archs=())
    ocl = table[table["target"].str.startswith("OpenCL")]
    assert len(ocl) == 1 and table.attrs["opencl_ran"] == (opencl_device() is not None)
    if opencl_device() is None:
        assert not ocl["compiled"].iloc[0] and ocl["time_kind"].iloc[0] == "not run"
        assert np.isnan(ocl["time_ms"].iloc[0]) and table.attrs["opencl_vs_numba_rounds"] == ()
    else:
        assert len(table.attrs["opencl_vs_numba_rounds"]) == 2


def test_every_target_has_the_one_signature():
    import inspect

    from hpcnb.winograd import conv2d_winograd, conv2d_winograd_cuda
    from hpcnb.winograd.backend import backend_names

    for fn in (conv2d_winograd, conv2d_winograd_cuda, conv2d_winograd_opencl):
        params = inspect.signature(fn).parameters
        assert list(params)[:5] == ["x", "w", "padding", "config", "m"], fn.__name__
        assert params["m"].kind is inspect.Parameter.KEYWORD_ONLY
    assert set(backend_names()) >= {"cpu", "cuda", "opencl"}


def test_a_new_target_is_one_registration(monkeypatch):
    from hpcnb.winograd import Backend, WinogradConfig, register_backend, winograd_reference
    from hpcnb.winograd import backend as table
    from hpcnb.winograd.backend import BackendUnavailableError, convolve

    monkeypatch.setattr(table, "_BACKENDS", dict(table._BACKENDS))  # leave the table as it was
    seen: list[WinogradConfig] = []

    def run(x, w, padding, config):
        seen.append(config)
        return winograd_reference(x, w, config.m, padding, config.points)

    register_backend(Backend("numpy_test", run, lambda r: WinogradConfig(m=2)))
    with pytest.raises(ValueError, match="registered already"):
        register_backend(Backend("cpu", run, lambda r: WinogradConfig(m=2)))
    x, w = torch.randn(2, 3, 7, 6), torch.randn(4, 3, 3, 3)
    y = convolve(x, w, 1, target="numpy_test")
    assert isinstance(y, torch.Tensor) and seen == [WinogradConfig(m=2)]
    torch.testing.assert_close(y, F.conv2d(x, w, padding=1), rtol=0, atol=1e-4)
    y = convolve(x.numpy(), w.numpy(), 1, WinogradConfig(m=4), target="numpy_test", m=3)
    assert isinstance(y, np.ndarray) and seen[-1] == WinogradConfig(m=3)
    with pytest.raises(ValueError, match="not registered"):
        convolve(x, w, 1, target="nowhere")
    with pytest.raises(ValueError, match="config must be"):
        convolve(x, w, 1, {"m": 2}, target="numpy_test")
    register_backend(Backend("absent", run, lambda r: WinogradConfig(), lambda: False, "a unicorn"))
    with pytest.raises(BackendUnavailableError, match="a unicorn"):
        convolve(x, w, 1, target="absent")
    assert issubclass(BackendUnavailableError, RuntimeError)


def test_cuda_target_without_a_gpu_says_what_to_set():
    from numba import cuda

    from hpcnb.winograd import conv2d_winograd_cuda

    if cuda.is_available():
        pytest.skip("a GPU (or the simulator) is present")
    x, w = np.ones((1, 1, 5, 5), np.float32), np.ones((1, 1, 3, 3), np.float32)
    with pytest.raises(RuntimeError, match="NUMBA_ENABLE_CUDASIM"):
        conv2d_winograd_cuda(x, w, 1)
