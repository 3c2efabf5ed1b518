"""Build hook: ship ``notebooks/*.ipynb`` inside the wheel as ``hpcnb/_notebooks/``.

The checkout's ``notebooks/`` folder stays the one source of the notebooks; every
other setting lives in ``pyproject.toml``. An editable install copies nothing, since
it reads the notebooks from the checkout.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

NOTEBOOKS = Path(__file__).resolve().parent / "notebooks"


class BuildPyWithNotebooks(build_py):
    """``build_py`` that also copies the notebooks into the built package."""

    def run(self) -> None:
        """Build the package, then add ``hpcnb/_notebooks/*.ipynb`` to it."""
        super().run()
        if getattr(self, "editable_mode", False):
            return
        sources = sorted(NOTEBOOKS.glob("*.ipynb"))
        if not sources:
            raise SystemExit(f"{NOTEBOOKS}: no notebooks to ship in the wheel")
        target = Path(self.build_lib) / "hpcnb" / "_notebooks"
        if target.exists():
            shutil.rmtree(target)  # a notebook removed from the checkout leaves the wheel too
        target.mkdir(parents=True)
        for source in sources:
            shutil.copyfile(source, target / source.name)


setup(cmdclass={"build_py": BuildPyWithNotebooks})
