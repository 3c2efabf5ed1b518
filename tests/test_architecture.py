"""Architecture rules of the package (ARCHITECTURE.md), checked on the source.

* no import cycle between the modules of ``hpcnb``, counting imports inside functions;
* dependencies point one way: the foundation knows no technique, ``ir`` knows no technique;
* every sub-package shows a narrow face (``__all__`` under 20 names);
* ``import hpcnb.batchsim`` does not load matplotlib.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1] / "hpcnb"
TECHNIQUES = {"batchsim", "commprof", "perfmodel", "pruning", "speculative", "supernet", "winograd"}
FOUNDATION = {
    "hpcnb.errors",
    "hpcnb.paths",
    "hpcnb.timing",
    "hpcnb.records",
    "hpcnb.claims",
    "hpcnb.history",
    "hpcnb.progress",
    "hpcnb.launch",
    "hpcnb.codecache",
    "hpcnb.parameters",
}


def _module_names() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _module_names()


def _imports(name: str, path: Path) -> set[str]:
    """Modules of hpcnb that ``name`` imports anywhere in its source (lazy imports too)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                keep = len(base) - node.level + (1 if is_package else 0)
                module = ".".join(base[:keep] + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            # "import hpcnb.a.b" loads hpcnb.a.b, whose parents are packages on the way
            if target in MODULES and target != name:
                found.add(target)
    return found


def _graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for name, path in MODULES.items():
        graph.add_node(name)
        for target in _imports(name, path):
            graph.add_edge(name, target)
    return graph


def test_no_import_cycle():
    cycles = [sorted(c) for c in nx.strongly_connected_components(_graph()) if len(c) > 1]
    assert not cycles, f"import cycles between modules: {cycles}"


def _technique(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in TECHNIQUES else None


def test_dependencies_point_one_way():
    graph = _graph()
    wrong = []
    for source, target in graph.edges:
        if (source in FOUNDATION or source.startswith("hpcnb.ir")) and _technique(target):
            wrong.append(f"{source} -> {target}")
        if source.startswith("hpcnb.ir") and target.startswith(("hpcnb.runner", "hpcnb.cli")):
            wrong.append(f"{source} -> {target}")
    assert not wrong, "lower layers import techniques: " + ", ".join(sorted(wrong))


def test_import_graph_sees_lazy_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from hpcnb.records import record\n    import hpcnb.paths\n")
    assert _imports("hpcnb.fake", source) == {"hpcnb.records", "hpcnb.paths"}


PACKAGES = sorted({name for name, path in MODULES.items() if path.name == "__init__.py"})


@pytest.mark.parametrize("package", [p for p in PACKAGES if p != "hpcnb"])
def test_sub_package_faces_are_narrow(package):
    module = importlib.import_module(package)
    names = getattr(module, "__all__", None)
    assert names is not None, f"{package} names no public API (__all__)"
    assert len(names) < 20, f"{package} exports {len(names)} names: keep the face under 20"
    assert len(set(names)) == len(names), f"{package}.__all__ repeats a name"
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing, f"{package}.__all__ names what it does not define: {missing}"


def test_batchsim_import_does_not_load_plotting():
    code = (
        "import sys, hpcnb.batchsim\n"
        "heavy = [m for m in ('matplotlib', 'pandas') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "", f"import hpcnb.batchsim loads {out.stdout.strip()}"


def test_every_module_says_what_it_is_for():
    missing = []
    for name, path in MODULES.items():
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        if not doc or not doc.splitlines()[0].strip().endswith("."):
            missing.append(name)
    assert not missing, f"modules without a one-line docstring summary: {missing}"
