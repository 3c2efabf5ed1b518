import nbformat
import pytest

from conftest import NOTEBOOKS
from hpcnb.parameters import (
    Parameter,
    ParameterError,
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
    [("SMOKE", "true", True), ("SMOKE", "0", False), ("SEED", "42", 42), ("RATE", "3", 3.0),
     ("RATE", 2, 2.0), ("NAME", "7", "7"), ("SIZES", "[3, 4]", [3, 4])],
)  # fmt: skip
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
    ours = {p.name: (p.type, p.default, p.comment) for p in notebook_parameters(path)}
    theirs = _papermill_view(path)
    assert list(theirs) == list(ours)
    for name, (kind, default, comment) in ours.items():
        assert theirs[name] == (kind, default, comment), name
        assert type(theirs[name][1]) is type(default), name


@pytest.mark.parametrize(
    ("line", "expected"),
    [('TAG: str = "a#b"  # a tag', ("str", "a#b", "a tag")),
     ("SIZES: tuple[int, ...] = (1, 2)  # sizes", ("tuple[int, ...]", (1, 2), "sizes")),
     ("OUT: str | None = None  # output", ("str | None", None, "output"))],
)  # fmt: skip
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
