import nbformat
import pytest

from conftest import NOTEBOOKS
from hpcnb.parameters import (
    Parameter,
    ParameterError,
    choices,
    coerce,
    notebook_parameters,
    parse_parameters,
    validate_overrides,
)

CELL = """\
SMOKE: bool = False  # tiny inputs for CI
SEED: int = 0  # RNG seed
RATE: float = 0.5  # a rate
NAME: str = "x"  # a name
SIZES: list[int] = [1, 2]  # sizes
"""


def test_parse_parameters_reads_types_defaults_comments():
    params = parse_parameters(CELL)
    assert [p.name for p in params] == ["SMOKE", "SEED", "RATE", "NAME", "SIZES"]
    assert params[2] == Parameter("RATE", "float", 0.5, "a rate")
    assert params[4].type == "list[int]" and params[4].default == [1, 2]


@pytest.mark.parametrize("source", ["x = 1", "X: int", "X: int = foo()", "print(1)", "X: int = (1"])
def test_parse_parameters_rejects_non_literals(source):
    with pytest.raises(ParameterError, match="line 1"):
        parse_parameters(source)


@pytest.mark.parametrize(
    ("name", "raw", "expected"),
    [
        ("SMOKE", "true", True),
        ("SMOKE", "0", False),
        ("SEED", "42", 42),
        ("RATE", "3", 3.0),
        ("RATE", 2, 2.0),
        ("NAME", "7", "7"),
        ("SIZES", "[3, 4]", [3, 4]),
    ],
)
def test_coerce_valid(name, raw, expected):
    param = {p.name: p for p in parse_parameters(CELL)}[name]
    value = coerce(param, raw)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    ("name", "raw"),
    [("SMOKE", "maybe"), ("SEED", "1.5"), ("SEED", True), ("RATE", "fast"), ("SIZES", "3")],
)
def test_coerce_invalid_names_parameter(name, raw):
    param = {p.name: p for p in parse_parameters(CELL)}[name]
    with pytest.raises(ParameterError, match=name):
        coerce(param, raw)


def test_validate_overrides_lists_valid_names():
    params = parse_parameters(CELL)
    with pytest.raises(ParameterError) as info:
        validate_overrides(params, {"NO_SUCH": "1"}, "nb.ipynb")
    message = str(info.value)
    assert "NO_SUCH" in message and "SEED: int" in message and "nb.ipynb" in message


def test_notebook_parameters_requires_exactly_one_cell(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("A: int = 1  # a")]
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(ParameterError, match="found 0"):
        notebook_parameters(path)
    nb.cells[0].metadata["tags"] = ["parameters"]
    nbformat.write(nb, path)
    assert notebook_parameters(path)[0].name == "A"


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e999"])
def test_float_parameters_must_be_finite(text):
    from hpcnb.parameters import Parameter, coerce

    param = Parameter("MPI_TIMEOUT_S", "float", 60.0, "seconds")
    with pytest.raises(ParameterError, match="not finite"):
        coerce(param, text)
    with pytest.raises(ParameterError):
        coerce(param, float(text))
    assert coerce(param, "2.5") == 2.5 and coerce(param, 3) == 3.0


def _papermill_view(path):
    """papermill's reading of a notebook: name -> (type, literal default, comment)."""
    import ast

    import papermill

    found = papermill.inspect_notebook(str(path))
    return {
        name: (p["inferred_type_name"], ast.literal_eval(p["default"]), p["help"])
        for name, p in found.items()
    }


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_papermill_agrees_on_project_notebooks(path):
    params = notebook_parameters(path)
    # papermill's line pattern drops a Literal[...] annotation without a word
    ours = {p.name: (p.type, p.default, p.comment) for p in params if choices(p) is None}
    theirs = _papermill_view(path)
    assert list(theirs) == list(ours)
    for name, (kind, default, comment) in ours.items():
        assert theirs[name] == (kind, default, comment), name
        assert type(theirs[name][1]) is type(default), name


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('TAG: str = "a#b"  # a tag', ("str", "a#b", "a tag")),
        ("SIZES: tuple[int, ...] = (1, 2)  # sizes", ("tuple[int, ...]", (1, 2), "sizes")),
        ("OUT: str | None = None  # output", ("str | None", None, "output")),
        ('DATA: Literal["a", "b"] = "a"  # data', ("Literal['a', 'b']", "a", "data")),
    ],
)
def test_project_parser_reads_what_papermill_misreads(tmp_path, line, expected):
    """The lines that the module docstring gives as the reason to keep the ast parser."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "P"}
    nb.cells = [nbformat.v4.new_code_cell(line, metadata={"tags": ["parameters"]})]
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    (param,) = notebook_parameters(path)
    assert (param.type, param.default, param.comment) == expected
    import papermill

    seen = papermill.inspect_notebook(str(path))
    if param.name in seen:
        got = seen[param.name]
        assert (got["inferred_type_name"], got["default"], got["help"]) != (
            param.type,
            repr(param.default),
            param.comment,
        )


def _literal_notebook(tmp_path, body):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "P"}
    nb.cells = [
        nbformat.v4.new_code_cell(body, metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("print(DATASET)"),
    ]
    path = tmp_path / "lit.ipynb"
    nbformat.write(nb, path)
    return path


def test_literal_choices_are_checked_and_listed(tmp_path):
    body = (
        "from typing import Literal\n\n"
        'DATASET: Literal["digits", "cifar10"] = "digits"  # data set\n'
        "K: Literal[1, 2, 4] = 2  # width\n"
    )
    params = notebook_parameters(_literal_notebook(tmp_path, body))
    assert [choices(p) for p in params] == [("digits", "cifar10"), (1, 2, 4)]
    assert validate_overrides(params, {"DATASET": "cifar10", "K": "4"}) == {
        "DATASET": "cifar10",
        "K": 4,
    }
    with pytest.raises(ParameterError, match="not one of the choices 'digits', 'cifar10'"):
        validate_overrides(params, {"DATASET": "cifar"})
    with pytest.raises(ParameterError, match="choices 1, 2, 4"):
        validate_overrides(params, {"K": "3"})
    with pytest.raises(ParameterError, match="choices"):
        validate_overrides(params, {"K": True})  # a bool is not the int 1


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ('from typing import Literal\nD: Literal["a", "b"] = "c"  # d', "not one of its choices"),
        ("import os\nA: int = 1  # a", "expected 'NAME: type = literal"),
        ("from typing import Any\nA: int = 1  # a", "expected 'NAME: type = literal"),
    ],
)
def test_parameters_cell_allows_only_the_literal_import(body, match):
    with pytest.raises(ParameterError, match=match):
        parse_parameters(body, "nb.ipynb")


def test_run_refuses_a_choice_before_a_kernel_starts(tmp_path):
    import subprocess
    import sys

    body = 'from typing import Literal\n\nDATASET: Literal["digits", "cifar10"] = "digits"  # d\n'
    path = _literal_notebook(tmp_path, body)
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcnb",
            "run",
            str(path),
            "-p",
            "DATASET",
            "cifar",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "'digits', 'cifar10'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not list(out.glob("*.ipynb"))  # nothing was executed


def test_run_passes_a_valid_choice_without_papermill_warnings(tmp_path):
    import json
    import subprocess
    import sys

    body = 'from typing import Literal\n\nDATASET: Literal["digits", "cifar10"] = "digits"  # d\n'
    path = _literal_notebook(tmp_path, body)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "hpcnb", "run", str(path), "-p", "DATASET", "cifar10"]
    proc = subprocess.run(
        [*command, "--out", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "unknown parameter" not in proc.stderr + proc.stdout
    executed = json.loads((out / "lit.ipynb").read_text())
    printed = "".join(
        "".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", [])
    )
    assert "cifar10" in printed
