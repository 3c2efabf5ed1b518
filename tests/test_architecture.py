"""Architecture rules of the package (ARCHITECTURE.md), checked on the source.

* no import cycle between the modules of ``hpcnb``, counting imports inside functions;
* dependencies point one way: the foundation (``hpcnb.data`` included) knows no technique and
  nothing of the centre; the centre (``hpcnb.ir``, ``hpcnb.models``) knows no technique and
  no edge module;
* every sub-package shows a narrow face (``__all__`` under 20 names);
* every error raised on purpose is an ``HpcnbError`` (no raise of a built-in exception);
* no function is longer than 100 lines;
* ``import hpcnb.batchsim`` does not load matplotlib.
"""

from __future__ import annotations

import ast
import importlib
import re
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
    "hpcnb.stats",
    "hpcnb.plugins",
    "hpcnb.cachefile",
    "hpcnb.argtypes",
}
CENTRE = ("hpcnb.ir", "hpcnb.models")
EDGE = ("hpcnb.runner", "hpcnb.cli", "hpcnb.sweep", "hpcnb.report", "hpcnb.status", "hpcnb.site")


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


def _foundation(module: str) -> bool:
    return module in FOUNDATION or module == "hpcnb.data" or module.startswith("hpcnb.data.")


def test_dependencies_point_one_way():
    graph = _graph()
    wrong = []
    for source, target in graph.edges:
        lower = _foundation(source) or source.startswith(CENTRE)
        if lower and _technique(target):
            wrong.append(f"{source} -> {target}")
        if lower and target.startswith(EDGE):
            wrong.append(f"{source} -> {target}")
        if _foundation(source) and target.startswith(CENTRE):
            wrong.append(f"{source} -> {target}")
    assert not wrong, "lower layers import upwards: " + ", ".join(sorted(wrong))


def test_data_and_models_are_checked_as_lower_layers():
    assert any(_foundation(m) for m in MODULES if m.startswith("hpcnb.data."))
    assert [m for m in MODULES if m.startswith("hpcnb.models.")]
    assert _technique("hpcnb.models.zoo") is None and _foundation("hpcnb.data.registry")


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


#: Built-in exceptions a module may raise itself: control flow, not errors of hpcnb.
ALLOWED_BUILTIN_RAISES = {"NotImplementedError", "SystemExit", "KeyboardInterrupt", "StopIteration"}


def _builtin_raises(path: Path) -> list[tuple[int, str]]:
    """``(line, name)`` of each raise of a built-in exception class in ``path``."""
    import builtins

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        cls = getattr(builtins, exc.id, None) if isinstance(exc, ast.Name) else None
        builtin = isinstance(cls, type) and issubclass(cls, BaseException)
        if builtin and isinstance(exc, ast.Name) and exc.id not in ALLOWED_BUILTIN_RAISES:
            found.append((node.lineno, exc.id))
    return found


def test_errors_raised_on_purpose_derive_from_the_base():
    sites = [
        f"{path.relative_to(ROOT.parent)}:{line} raise {name}"
        for path in MODULES.values()
        for line, name in _builtin_raises(path)
    ]
    assert not sites, f"{len(sites)} raise sites of built-in exceptions: " + "; ".join(sites[:20])


def test_raise_site_check_sees_built_ins(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from hpcnb.errors import InvalidInputError\n"
        "def f(x):\n"
        "    if x == 1:\n        raise ValueError('bad')\n"
        "    if x == 2:\n        raise InvalidInputError('bad')\n"
        "    try:\n        pass\n    except OSError:\n        raise\n"
        "    raise NotImplementedError\n"
    )
    assert _builtin_raises(source) == [(4, "ValueError")]


MAX_FUNCTION_LINES = 100


def test_no_function_is_longer_than_a_screenful_or_two():
    long = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(
                        f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name} {lines}"
                    )
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: " + "; ".join(long)


_ARG_ENTRY = re.compile(r"^(\*{0,2}\w+(?:, \*{0,2}\w+)*)(?: \([^)]*\))?: ")


def _documented_names(doc: str) -> set[str]:
    """Names of the entries of a Google-style ``Args:`` section (``a, b: ...`` names both)."""
    names: set[str] = set()
    lines = doc.splitlines()
    if "Args:" not in [line.strip() for line in lines]:
        return names
    start = [line.strip() for line in lines].index("Args:") + 1
    indent = None
    for line in lines[start:]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        if depth < indent:
            break
        match = _ARG_ENTRY.match(line.strip()) if depth == indent else None
        if match:
            names |= {n.lstrip("*") for n in match.group(1).split(", ")}
    return names


def _undocumented_arguments(path: Path) -> list[str]:
    """Public functions of ``path`` with two or more arguments not all named under ``Args:``."""
    found: list[str] = []

    def visit(node: ast.AST, public: bool, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, public and not child.name.startswith("_"), True)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                if not public or child.name.startswith("_"):
                    continue
                decorators = {
                    d.id if isinstance(d, ast.Name) else getattr(d, "attr", "")
                    for d in child.decorator_list
                }
                if decorators & {"property", "overload", "setter"}:
                    continue
                a = child.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
                if in_class and names[:1] in (["self"], ["cls"]):
                    names = names[1:]
                documented = _documented_names(ast.get_docstring(child) or "")
                if len(names) >= 2 and not set(names) <= documented:
                    found.append(f"{child.name}({', '.join(names)})")

    visit(ast.parse(path.read_text(encoding="utf-8")), True, False)
    return found


def test_public_functions_document_their_arguments():
    missing = [
        f"{path.relative_to(ROOT.parent)}: {name}"
        for path in MODULES.values()
        for name in _undocumented_arguments(path)
    ]
    assert not missing, f"{len(missing)} without a complete Args: section: " + "; ".join(
        missing[:15]
    )


def test_argument_check_sees_a_missing_entry(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        'def f(a, b):\n    """Do.\n\n    Args:\n        a: The a.\n    """\n'
        'def g(a, b):\n    """Do.\n\n    Args:\n        a: The a.\n        b: The b.\n    """\n'
        "def _h(a, b):\n    pass\n"
        'def k(tid, phase, x):\n    """Do.\n\n    Args:\n        tid, phase: The convention.\n'
        '        x (array): The x.\n\n    Returns:\n        b: not an argument.\n    """\n'
        'def m(a, b):\n    """Do.\n\n    Args:\n        a: The a.\n\n    Returns:\n'
        '        b: not an argument.\n    """\n'
    )
    assert _undocumented_arguments(source) == ["f(a, b)", "m(a, b)"]


#: A module of a user's own, outside the package: one scheduler, one draft, one Winograd target.
USER_PLUGINS = '''
from dataclasses import dataclass

import numpy as np

from hpcnb.batchsim.policies import FCFS
from hpcnb.speculative.contracts import DraftSpec
from hpcnb.speculative.drafts import NgramDraft
from hpcnb.winograd import Backend, WinogradConfig
from hpcnb.winograd.numerics import winograd_reference


class StubbornFCFS(FCFS):
    """FCFS under another name."""


@dataclass(frozen=True)
class TinyDraftSpec(DraftSpec):
    max_n: int = 2

    def build(self, head_model):
        return NgramDraft(max_n=self.max_n, name="tiny")


def _run(x, w, padding, config):
    return winograd_reference(x, w, config.m, padding, config.points, np.float32)


BACKEND = Backend("user_numpy", _run, lambda r: WinogradConfig(m=2), label="user NumPy")
'''


@pytest.fixture
def user_plugins(tmp_path, monkeypatch):
    (tmp_path / "arch_user_plugins.py").write_text(USER_PLUGINS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "arch_user_plugins"
    sys.modules.pop("arch_user_plugins", None)


def test_extension_points_load_from_a_module_outside_the_package(user_plugins):
    import numpy as np
    import torch

    from hpcnb.batchsim import make_scheduler
    from hpcnb.speculative.contracts import DraftSpec
    from hpcnb.winograd import conv2d_winograd

    scheduler = make_scheduler(f"{user_plugins}:StubbornFCFS")
    assert type(scheduler).__name__ == "StubbornFCFS"
    assert not Path(sys.modules[user_plugins].__file__).is_relative_to(ROOT)

    draft = DraftSpec.from_json({"kind": f"{user_plugins}:TinyDraftSpec", "max_n": 3})
    assert type(draft).__name__ == "TinyDraftSpec" and draft.build(None).name == "tiny"
    assert draft.to_json()["kind"] == f"{user_plugins}:TinyDraftSpec"  # what a rank receives

    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((1, 2, 8, 8)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((3, 2, 3, 3)).astype(np.float32))
    y = conv2d_winograd(x, w, padding=1, target=f"{user_plugins}:BACKEND")
    ref = torch.nn.functional.conv2d(x, w, padding=1)
    assert float((torch.as_tensor(y) - ref).abs().max()) < 1e-3
