"""The model factory of an MPI fork-join job: a ``"package.module:function"`` plug-in."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcnb.plugins import PluginError
from hpcnb.supernet.mpi import ForkJoinJob, _load, write_job

FACTORY = textwrap.dedent(
    """
    import torch


    def build(width):
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, width))


    not_a_function = 3
    """
)


def _job_folder(tmp_path: Path, factory: str) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 5))
    job = ForkJoinJob(factory=factory, factory_kwargs={"width": 5}, example_shape=(1, 1, 8, 8))
    x, y = np.zeros((4, 1, 8, 8), np.float32), np.zeros(4, np.int64)
    return write_job(tmp_path / "job", job, model.state_dict(), x, y)


@pytest.fixture
def factory_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A factory module outside the package, importable the way a rank imports it."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "my_fork_join_factory.py").write_text(FACTORY, encoding="utf-8")
    monkeypatch.syspath_prepend(str(plugins))
    return "my_fork_join_factory"


def test_rank_builds_the_model_from_an_outside_factory(tmp_path: Path, factory_module: str):
    folder = _job_folder(tmp_path, f"{factory_module}:build")
    job, model, x, y = _load(folder)
    assert job.factory == f"{factory_module}:build"
    saved = torch.load(folder / "weights.pt", weights_only=True)
    assert torch.equal(model.state_dict()["1.weight"], saved["1.weight"])
    assert x.shape == (4, 1, 8, 8) and y.shape == (4,)


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("no_such_module_for_hpcnb:build", "cannot import"),
        ("{mod}:missing", "no attribute"),
        ("{mod}:not_a_function", "not callable"),
        ("{mod}:", "not callable"),
        ("build", "expected 'package.module:attr'"),
    ],
)
def test_a_bad_factory_names_the_job_file(
    tmp_path: Path, factory_module: str, factory: str, message: str
):
    folder = _job_folder(tmp_path, factory.format(mod=factory_module))
    with pytest.raises(PluginError, match=message) as info:
        _load(folder)
    assert str(folder / "job.json") in str(info.value)
    assert "model factory" in str(info.value)
