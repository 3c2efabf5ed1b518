"""Where the notebooks are found, ``hpcnb notebooks``, and a wheel that works on its own."""

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from hpcnb import runner
from hpcnb.cli import main
from hpcnb.errors import HpcnbError
from hpcnb.runner import (
    NOTEBOOKS_ENV,
    NotebooksNotFoundError,
    copy_notebooks,
    default_notebooks,
    notebooks_dir,
)

ROOT = Path(__file__).resolve().parents[1]
CHECKOUT_NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))


def _source_version() -> str:
    tree = ast.parse((ROOT / "hpcnb" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError("hpcnb/__init__.py sets no __version__")


def _one_notebook(folder: Path, stem: str = "x") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.ipynb"
    shutil.copyfile(ROOT / "notebooks" / "00_tour.ipynb", path)
    return path


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(NOTEBOOKS_ENV, raising=False)


def test_checkout_notebooks_are_found_from_any_directory(no_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert notebooks_dir() == ROOT / "notebooks"
    assert [p.name for p in default_notebooks()] == CHECKOUT_NOTEBOOKS


def test_environment_folder_comes_first(tmp_path, monkeypatch):
    mine = _one_notebook(tmp_path / "mine", "99_mine")
    monkeypatch.setenv(NOTEBOOKS_ENV, str(mine.parent))
    assert notebooks_dir() == mine.parent
    assert default_notebooks() == [mine]


def test_environment_folder_that_is_missing_is_one_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(NOTEBOOKS_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(NotebooksNotFoundError, match=r"HPCNB_NOTEBOOKS=.*nowhere: no such folder"):
        notebooks_dir()
    assert issubclass(NotebooksNotFoundError, HpcnbError)
    assert issubclass(NotebooksNotFoundError, FileNotFoundError)
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HPCNB_NOTEBOOKS" in err and "nowhere" in err


def test_packaged_copy_is_the_last_place(no_env, tmp_path, monkeypatch):
    packaged = _one_notebook(tmp_path / "_notebooks", "00_packaged").parent
    monkeypatch.setattr(runner, "packaged_notebooks_dir", lambda: packaged)
    assert notebooks_dir() == ROOT / "notebooks"  # the source tree wins
    monkeypatch.setattr(runner, "_source_tree_notebooks", lambda: None)
    assert notebooks_dir() == packaged
    monkeypatch.setattr(runner, "packaged_notebooks_dir", lambda: None)
    with pytest.raises(NotebooksNotFoundError, match="no notebooks found"):
        notebooks_dir()


def test_source_tree_has_no_packaged_copy():
    # The wheel build adds hpcnb/_notebooks/; the checkout keeps notebooks/ as the only copy.
    assert runner.packaged_notebooks_dir() is None
    assert not (ROOT / "hpcnb" / "_notebooks").exists()


def test_notebooks_command_copies_and_refuses_to_overwrite(no_env, tmp_path, capsys):
    out = tmp_path / "deep" / "out"
    assert main(["notebooks", str(out)]) == 0
    assert f"copied {len(CHECKOUT_NOTEBOOKS)} notebook(s)" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == CHECKOUT_NOTEBOOKS
    tour = out / "00_tour.ipynb"
    assert tour.read_bytes() == (ROOT / "notebooks" / "00_tour.ipynb").read_bytes()

    tour.write_text("my edits")
    assert main(["notebooks", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists" in err and "--force" in err
    assert tour.read_text() == "my edits"  # nothing was overwritten

    assert main(["notebooks", str(out), "--force"]) == 0
    assert tour.read_bytes() == (ROOT / "notebooks" / "00_tour.ipynb").read_bytes()


def test_notebooks_command_rejects_a_file_and_the_source_folder(no_env, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert main(["notebooks", str(a_file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a folder" in err
    with pytest.raises(FileExistsError, match="read from"):
        copy_notebooks(ROOT / "notebooks", force=True)


def test_only_one_version_number():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'dynamic = ["version"]' in pyproject
    assert 'version = { attr = "hpcnb.__version__" }' in pyproject
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0


def test_dependency_ranges_hold_the_locked_versions():
    requirement = pytest.importorskip("packaging.requirements").Requirement

    def norm(name: str) -> str:
        return name.lower().replace("_", "-")

    lock = {}
    for line in (ROOT / "requirements.lock").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            lock[norm(name)] = version.strip()
    assert lock["torch"] == "2.13.0"
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for text in deps["dependencies"]:
        req = requirement(text)
        assert "==" not in text, f"{text}: a range belongs in pyproject.toml, the pin in the lock"
        assert norm(req.name) in lock, f"{req.name} is not in requirements.lock"
        assert req.specifier.contains(lock[norm(req.name)]), f"{text} excludes the locked version"


def _copy_source(dest: Path) -> Path:
    """Copy the checkout without its environment, build outputs and run folders."""
    top = {".git", ".venv", "build", "dist", "papermill_runs", ".pytest_cache", ".ruff_cache"}

    def skip(folder: str, names: list[str]) -> set[str]:
        dropped = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
        return dropped | (top & set(names) if Path(folder) == ROOT else set())

    return Path(shutil.copytree(ROOT, dest, ignore=skip))


@pytest.mark.slow
def test_wheel_runs_the_tour_outside_the_checkout(tmp_path):
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools")
    source = _copy_source(tmp_path / "src")
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-q",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        cwd=tmp_path,
        timeout=120,
    )
    (wheel,) = wheels.glob("hpcnb-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        shipped = sorted(Path(n).name for n in zf.namelist() if n.startswith("hpcnb/_notebooks/"))
    assert shipped == CHECKOUT_NOTEBOOKS

    # A fresh virtual environment: the wheel is its only hpcnb; the dependencies, already
    # installed beside the running interpreter, are reached through a .pth line (no network).
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    venv_python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "hpcnb-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv_python),
            "install",
            "--no-deps",
            "--no-compile",
            "--disable-pip-version-check",
            "-q",
            str(wheel),
        ],
        check=True,
        cwd=tmp_path,
        timeout=120,
    )
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (NOTEBOOKS_ENV, "PYTHONPATH")}
    env["HPCNB_CACHE"] = str(tmp_path / "cache")
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    def hpcnb(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(venv / "bin" / "hpcnb"), *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    where = subprocess.run(
        [
            str(venv_python),
            "-c",
            "import hpcnb, hpcnb.runner as r; print(hpcnb.__file__); print(r.notebooks_dir())",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    assert Path(where[0]).is_relative_to(site)  # not the checkout's package
    assert Path(where[1]) == site / "hpcnb" / "_notebooks"

    version = hpcnb("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"hpcnb {_source_version()}"
    listing = hpcnb("list")
    assert listing.returncode == 0, listing.stderr
    assert all(Path(n).stem in listing.stdout for n in CHECKOUT_NOTEBOOKS)

    copied = hpcnb("notebooks", "nb")
    assert copied.returncode == 0, copied.stderr
    assert sorted(p.name for p in (work / "nb").iterdir()) == CHECKOUT_NOTEBOOKS
    again = hpcnb("notebooks", "nb")
    assert again.returncode == 2 and again.stderr.count("\n") == 1

    run = hpcnb("run", "nb/00_tour.ipynb", "--smoke", "--no-progress", "--out", "runs", timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    status = json.loads((work / "runs" / "run.json").read_text())
    assert status["00_tour"]["status"] == "ok"
