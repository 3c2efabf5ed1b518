"""Bounded parameter and grid input: every refusal is one line and exit 2, before any work."""

from __future__ import annotations

import json

import pytest

from _nbutil import make_notebook
from hpcnb.cli import main
from hpcnb.parameters import (
    MAX_DEPTH,
    MAX_VALUE_BYTES,
    ParameterError,
    coerce,
    load_yaml_bounded,
    parse_parameters,
)
from hpcnb.runner import run_notebooks
from hpcnb.sweep import MAX_POINTS, expand_grid, grid_size, load_grid, plan_sweep

PARAMS = (
    "SMOKE: bool = False  # tiny\n"
    "N: int = 1  # a count\n"
    "X: float = 1.0  # a value\n"
    "VALS: list[int] = [1, 2]  # counts\n"
    "RATES: list[float] = [0.5]  # rates\n"
    "SHAPE: tuple[int, ...] = (1, 2)  # a shape\n"
    "WEIGHTS: dict[str, float] = {'a': 1.0}  # weights\n"
    "LABEL: str = 'x'  # a label\n"
)


@pytest.fixture
def nb(tmp_path):
    return make_notebook(
        tmp_path / "bounds.ipynb", PARAMS, "from hpcnb import record\nrecord('b.n', len(LABEL))"
    )


def _one_line_refusal(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    parts = ["&a0 [" + ", ".join(["1"] * width) + "]"]
    for i in range(1, levels):
        parts.append(f"&a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "[" + ", ".join(parts) + "]"


def test_yaml_aliases_are_refused_in_values_and_grids(nb, tmp_path, capsys):
    bomb = _alias_bomb()
    assert len(bomb) < 500  # a few hundred bytes that would expand to 9**9 elements
    _one_line_refusal(
        capsys,
        ["run", str(nb), "-p", "VALS", bomb, "--out", str(tmp_path / "o")],
        "VALS",
        "aliases",
    )
    assert not (tmp_path / "o").exists()
    grid = tmp_path / "g.yaml"
    grid.write_text(f"VALS: {bomb}\n")
    _one_line_refusal(capsys, ["sweep", str(nb), "--grid", str(grid)], "aliases")
    grid.write_text("base: &b [1, 2]\nN: *b\n")
    _one_line_refusal(capsys, ["sweep", str(nb), "--grid", str(grid)], "aliases")


def test_deep_nesting_is_one_line_not_a_recursion_error(nb, tmp_path, capsys):
    deep = "[" * 50_000 + "]" * 50_000
    _one_line_refusal(capsys, ["run", str(nb), "-p", "VALS", deep], "nested deeper", str(MAX_DEPTH))
    grid = tmp_path / "g.yaml"
    grid.write_text(f"VALS: {deep}\n")
    _one_line_refusal(capsys, ["sweep", str(nb), "--grid", str(grid)], "nested deeper")
    ok = "[" * (MAX_DEPTH - 1) + "1" + "]" * (MAX_DEPTH - 1)
    assert load_yaml_bounded(ok, "v") is not None


def test_grid_files_that_are_not_text_or_not_files(nb, tmp_path, capsys):
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"N: [1]\n\xff\xfe\x00garbage")
    _one_line_refusal(capsys, ["sweep", str(nb), "--grid", str(binary)], "not UTF-8")
    folder = tmp_path / "adir"
    folder.mkdir()
    _one_line_refusal(capsys, ["sweep", str(nb), "--grid", str(folder)], "is a folder")
    _one_line_refusal(
        capsys, ["sweep", str(nb), "--grid", str(tmp_path / "none.yaml")], "cannot be read"
    )
    big = tmp_path / "big.yaml"
    big.write_text("N: [" + ", ".join(["1"] * 600_000) + "]\n")
    _one_line_refusal(capsys, ["sweep", str(nb), "--grid", str(big)], "bytes")


def test_unknown_names_are_checked_before_any_point_is_formed(nb, tmp_path, monkeypatch, capsys):
    import hpcnb.sweep as sweep_module

    formed = []
    monkeypatch.setattr(sweep_module.itertools, "product", lambda *a: formed.append(a) or iter(()))
    grid = tmp_path / "g.yaml"
    grid.write_text("".join(f"U{i}: [{', '.join(str(v) for v in range(9))}]\n" for i in range(9)))
    assert len(grid.read_bytes()) < 300  # 9 ** 9 = 387 million points if formed
    _one_line_refusal(
        capsys,
        ["sweep", str(nb), "--grid", str(grid)],
        "unknown grid parameter",
        "U0",
        "valid: SMOKE",
    )
    assert formed == []


def test_the_number_of_points_is_counted_and_capped(nb, tmp_path, capsys):
    grid = {"N": list(range(100)), "X": [float(v) for v in range(100)], "VALS": [[1]] * 100}
    assert grid_size(grid) == 1_000_000
    with pytest.raises(ParameterError, match=r"1000000 points \(100 N x 100 X x 100 VALS\)"):
        plan_sweep(nb, grid)
    path = tmp_path / "g.yaml"
    path.write_text(json.dumps({"N": list(range(40)), "X": [float(v) for v in range(30)]}))
    _one_line_refusal(
        capsys, ["sweep", str(nb), "--grid", str(path)], "1200 points", f"--max-points {MAX_POINTS}"
    )
    _one_line_refusal(
        capsys, ["sweep", str(nb), "--grid", str(path), "--max-points", "1199"], "1200 points"
    )
    _, points = plan_sweep(nb, load_grid(path), max_points=1200)
    assert len(points) == 1200 and points[-1] == {"N": 39, "X": 29.0}
    with pytest.raises(ParameterError, match="no values"):
        expand_grid({"N": []})


def test_a_sweep_parses_the_notebook_once_and_checks_each_value_once(nb, monkeypatch):
    import hpcnb.sweep as sweep_module

    calls = []
    real = sweep_module.notebook_parameters
    monkeypatch.setattr(sweep_module, "notebook_parameters", lambda p: calls.append(p) or real(p))
    _, points = plan_sweep(nb, {"N": list(range(20)), "X": [0.5, 1.5]}, smoke=True)
    assert len(calls) == 1 and len(points) == 40
    assert all(p["SMOKE"] is True and isinstance(p["X"], float) for p in points)
    with pytest.raises(ParameterError, match="parameter N: 'x'"):
        plan_sweep(nb, {"N": [1, "x"]})


@pytest.mark.parametrize(
    ("name", "text", "reason"),
    [
        ("VALS", '["a", null, {"x": 1}]', "element 0: str where int is declared"),
        ("VALS", "[1, true]", "element 1: a bool is not an int"),
        ("VALS", "[1, 2.5]", "element 1: float where int is declared"),
        ("RATES", "[0.5, .nan]", "element 1: not finite"),
        ("RATES", "[.inf]", "element 0: not finite"),
        ("SHAPE", "[1, x]", "element 1: str where int is declared"),
        ("WEIGHTS", "{a: .nan}", "['a']: not finite"),
        ("WEIGHTS", "{1: 2.0}", "key 1: int where str is declared"),
        ("VALS", "3", "int where a list is declared"),
    ],
)
def test_container_elements_are_checked(name, text, reason):
    param = {p.name: p for p in parse_parameters(PARAMS)}[name]
    with pytest.raises(ParameterError, match=name) as info:
        coerce(param, text)
    assert reason in str(info.value)


def test_valid_containers_get_their_declared_types():
    params = {p.name: p for p in parse_parameters(PARAMS)}
    assert coerce(params["RATES"], "[1, 2.5]") == [1.0, 2.5]
    assert coerce(params["SHAPE"], "[3, 4, 5]") == (3, 4, 5)
    assert coerce(params["WEIGHTS"], "{b: 2}") == {"b": 2.0}
    opt = parse_parameters("M: int | None = None  # optional\n")[0]
    assert coerce(opt, "null") is None and coerce(opt, "4") == 4
    with pytest.raises(ParameterError, match="M"):
        coerce(opt, "[1]")


def test_nan_in_a_list_never_reaches_the_run_folder(nb, tmp_path, capsys):
    _one_line_refusal(
        capsys,
        ["run", str(nb), "-p", "RATES", "[.nan]", "--out", str(tmp_path / "o")],
        "RATES",
        "not finite",
    )
    assert not (tmp_path / "o").exists()


def test_oversized_values_are_refused_and_large_ones_reach_the_kernel(nb, tmp_path, capsys):
    huge = "y" * (MAX_VALUE_BYTES + 1)
    _one_line_refusal(capsys, ["run", str(nb), "-p", "LABEL", huge], "LABEL", "over the limit")
    big = "z" * (200 * 1024)  # over the 128 KiB a single command-line argument may hold
    (result,) = run_notebooks(
        [nb], {"LABEL": big}, out=tmp_path / "run", progress=False, timeout=300
    )
    assert result.ok, result.error
    assert result.records == {"b.n": float(len(big))}
