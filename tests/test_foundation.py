import os
import subprocess
import sys

import numpy as np
import pytest

from hpcnb.cli import main
from hpcnb.data import DataNotFoundError, data_path, digits, text_corpus
from hpcnb.timing import compare, median_time, pinned_threads, set_threads
from hpcnb.tour import smooth_numba, smooth_numba_parallel, smooth_numpy


def test_import_from_another_cwd(tmp_path):
    code = "import hpcnb, hpcnb.cli; print(hpcnb.__version__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "0.1.0"
    out = subprocess.run(
        [sys.executable, "-m", "hpcnb", "--help"], cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 0 and "sweep" in out.stdout


def test_cli_list_shows_tour_parameters(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert "00_tour" in text and "SMOKE: bool = False  # tiny inputs for CI" in text


def test_stencil_versions_agree_and_check_input():
    x = np.random.default_rng(0).standard_normal(1001)
    np.testing.assert_allclose(smooth_numba(x, 7), smooth_numpy(x, 7), rtol=0, atol=1e-12)
    assert smooth_numpy(x, 0)[5] == x[5]
    y = smooth_numpy(np.array([0.0, 4.0, 0.0]), 1)
    assert y.tolist() == [0.0, 2.0, 0.0]
    with pytest.raises(ValueError, match="1-D"):
        smooth_numba(np.zeros((2, 2)), 1)
    with pytest.raises(ValueError, match="steps"):
        smooth_numpy(x, -1)


@pytest.mark.parametrize("threads", [1, 2])
def test_threaded_stencil_agrees_with_numpy_and_numba(threads):
    x = np.random.default_rng(1).standard_normal(1003)
    with pinned_threads(threads, torch=False, blas=False):
        for chunks in (None, 1, 3, 7, 1001, 5000):  # 5000 > interior: capped at one per element
            out = smooth_numba_parallel(x, 9, chunks)
            np.testing.assert_allclose(out, smooth_numpy(x, 9), rtol=0, atol=1e-12)
            np.testing.assert_array_equal(out, smooth_numba(x, 9))
    assert smooth_numba_parallel(np.array([0.0, 4.0, 0.0]), 1).tolist() == [0.0, 2.0, 0.0]
    np.testing.assert_array_equal(smooth_numba_parallel(x, 0), x)
    with pytest.raises(ValueError, match="chunks"):
        smooth_numba_parallel(x, 1, 0)
    with pytest.raises(ValueError, match="1-D"):
        smooth_numba_parallel(np.zeros(2), 1)


def test_timing_helpers():
    calls = []
    t = median_time(lambda: calls.append(1), repeats=3, warmup=2)
    assert len(calls) == 5 and len(t.samples) == 3 and t.minimum <= t.median
    a, b, ratio = compare(lambda: sum(range(20000)), lambda: None, repeats=3)
    assert ratio == pytest.approx(a.median / b.median)
    with pytest.raises(ValueError):
        median_time(lambda: None, repeats=0)
    with pytest.raises(ValueError):
        set_threads(0)


def test_digits_split_is_reproducible_and_disjoint():
    a, b = digits(seed=3), digits(seed=3)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    total = len(a.y_train) + len(a.y_val) + len(a.y_test)
    assert total == 1797 and a.x_train.shape[1:] == (1, 8, 8)
    assert a.x_train.dtype == np.float32 and a.x_train.max() <= 1.0
    with pytest.raises(ValueError, match="fraction"):
        digits(val_fraction=0.6, test_fraction=0.5)


def test_text_corpus_is_prose():
    text = text_corpus(max_chars=5000)
    assert len(text) == 5000 and text.count(" ") > 500
    assert text == text_corpus(max_chars=5000)


def test_data_path_errors_name_the_variable(monkeypatch, tmp_path):
    monkeypatch.delenv("HPCNB_DATA", raising=False)
    with pytest.raises(DataNotFoundError, match="HPCNB_DATA"):
        data_path("swf/x.swf")
    monkeypatch.setenv("HPCNB_DATA", str(tmp_path))
    with pytest.raises(DataNotFoundError, match=r"x\.swf"):
        data_path("swf/x.swf")
    (tmp_path / "f.txt").write_text("1")
    assert data_path("f.txt") == tmp_path / "f.txt"
    monkeypatch.setenv("HPCNB_DATA", str(tmp_path / "missing"))
    with pytest.raises(DataNotFoundError, match="not a directory"):
        data_path("f.txt")


def test_shared_data_found_through_env():
    value = os.environ.get("HPCNB_DATA")
    if not value:
        pytest.skip("real data absent: set HPCNB_DATA to a folder like ../shared/data")
    assert os.path.isdir(value)


def test_cli_imports_technique_modules_only_when_used(tmp_path):
    code = (
        "import sys, contextlib, io\n"
        "from hpcnb.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['list'])\n"
        "print('torch' in sys.modules, 'hpcnb.batchsim.cli' in sys.modules)\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    main(['batchsim', 'schedulers'])\n"
        "print('easy' in out.getvalue(), 'hpcnb.batchsim.cli' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["False", "False", "True", "True"]


def test_every_public_error_derives_from_the_one_base():
    import importlib
    import inspect
    import pkgutil

    import hpcnb
    from hpcnb.errors import HpcnbError

    offenders = []
    for info in pkgutil.walk_packages(hpcnb.__path__, "hpcnb."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, Exception)
                and not issubclass(obj, Warning)
                and obj.__module__ == info.name
                and not name.startswith("_")
                and not issubclass(obj, HpcnbError)
            ):
                offenders.append(f"{info.name}.{name}")
    assert offenders == []
