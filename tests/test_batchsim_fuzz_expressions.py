"""Hostile inputs for the expression evaluator and the ElastiSim reader (issue 18).

Regression tests for the concrete cases of the issue, and Hypothesis fuzzing
(derandomized, so CI sees the same examples every run): the evaluator and the reader
raise only their documented errors (:class:`ExpressionError`, :class:`WorkloadError`),
within a time and a memory bound per input. The bounds are generous multiples of what
the inputs need (milliseconds to a second under tracemalloc, a few MB) so that a loaded
two-core CI machine does not make them flaky; the failures they guard against took
tens of seconds, gigabytes or a RecursionError.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcnb.batchsim import check_invariants, simulate
from hpcnb.batchsim.elastisim import ElastiSimLimits, WorkloadError, read_elastisim
from hpcnb.batchsim.engine import SimulationError
from hpcnb.batchsim.expressions import (
    ExpressionError,
    ExpressionLimits,
    evaluate,
    parse_expression,
)
from hpcnb.batchsim.inputs import json_depth
from hpcnb.batchsim.jobs import RunContext
from hpcnb.batchsim.scheduler import FCFS
from hpcnb.errors import HpcnbError

TIME_BOUND_S = 60.0  # per input, under tracemalloc: inputs take ms to ~1 s; bounds runaway work
# on a loaded 2-core machine, not speed
MEMORY_BOUND_B = 200 * 2**20  # tracemalloc peak per input


def bounded(call: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """Run ``call`` under tracemalloc; assert the time and memory bounds.

    Returns:
        The result (or ``None``) and the exception raised (or ``None``).
    """
    tracemalloc.start()
    start = time.perf_counter()
    result: Any = None
    error: BaseException | None = None
    try:
        result = call()
    except Exception as exc:  # the caller checks the type
        error = exc
    finally:
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < TIME_BOUND_S, f"took {elapsed:.2f} s"
    assert peak < MEMORY_BOUND_B, f"peak {peak / 2**20:.0f} MiB"
    return result, error


# -- expressions: the cases of the issue ------------------------------------------------


def test_expression_error_is_a_project_error_with_a_1_based_position():
    with pytest.raises(ExpressionError) as info:
        evaluate("(-8)^0.5")
    assert isinstance(info.value, HpcnbError) and isinstance(info.value, ValueError)
    assert info.value.position == 5 and info.value.expression == "(-8)^0.5"
    assert "complex result" in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("(" * 10_000 + "1" + ")" * 10_000, "nested deeper than 256"),
        ("1?" * 5_000 + "1" + ":0" * 5_000, "nested deeper than 256"),
        ("x ? 1 : " * 5_000 + "0", "nested deeper than 256"),
        ("1e308 * 10", "overflow"),
        ("10 ^ 400", "overflow"),
        ("1e999", "too large"),
        ("9" * 400, "too large"),
        ("ceil(1e308 * 1e308)", "overflow"),
        ("log(0)", "math domain error"),
        ("1 % 0", "1.0 % 0.0"),
        ("0 ^ -1", "0.0 ^ -1.0"),
        ("sqrt(-1)", "math domain error"),
        ("x" * 70_000, "at most 65,536"),
    ],
)
def test_expression_hostile_cases_raise_expression_error(text, message):
    _, error = bounded(lambda: evaluate(text, {"x": 1}))
    assert isinstance(error, ExpressionError), error
    assert message in str(error)
    assert 1 <= error.position <= len(text) + 1


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("-" * 10_000 + "1", 1.0),
        ("-" * 10_001 + "1", -1.0),
        ("!" * 9_999 + "0", 1.0),
        ("+".join(["1"] * 20_000), 20_000.0),
        ("1^" * 2_000 + "2", 1.0),
        ("max(" + ", ".join(["1"] * 10_000) + ")", 1.0),
    ],
)
def test_expression_long_chains_evaluate_without_recursion(text, value):
    result, error = bounded(lambda: evaluate(text))
    assert error is None and result == value


@pytest.mark.parametrize("bad", [[1], {"a": 1}, None, True, b"1", 10**400, math.nan, math.inf])
def test_expression_non_text_inputs(bad):
    with pytest.raises(ExpressionError, match="expected a"):
        evaluate(bad)


@pytest.mark.parametrize("value", [[1], {"a": 1}, "3", 10**400, None, 1j])
def test_expression_non_numeric_variables(value):
    with pytest.raises(ExpressionError, match="variable 'x'") as info:
        evaluate("1 + x", {"x": value})
    assert info.value.position == 5
    with pytest.raises(ExpressionError, match="mapping"):
        evaluate("1 + x", [1])  # type: ignore[arg-type]


def test_expression_limits_are_overridable():
    with pytest.raises(ExpressionError, match="nested deeper than 2"):
        evaluate("((1))+(((2)))", limits=ExpressionLimits(max_depth=2))
    assert evaluate("((1))", limits=ExpressionLimits(max_depth=2)) == 1
    with pytest.raises(ExpressionError, match="at most 5"):
        evaluate("1 + 2 + 3", limits=ExpressionLimits(max_length=5))
    deep = "(" * 1_000 + "1" + ")" * 1_000
    assert evaluate(deep, limits=ExpressionLimits(max_depth=1_000)) == 1
    with pytest.raises(ValueError, match="max_depth"):
        ExpressionLimits(max_depth=0)


def test_expression_short_circuit_and_semantics():
    env = {"x": 0.0}
    assert evaluate("x == 0 || 1/x", env) == 1 and evaluate("x != 0 && 1/x", env) == 0
    assert evaluate("x ? 1/x : 7", env) == 7 and evaluate("1 ? 2 ? 3 : 4 : 5") == 3
    assert evaluate("0 ? 1 : 0 ? 2 : 3") == 3 and evaluate("2^-3*4") == 0.5
    assert evaluate("!0 + 1") == 2 and evaluate("-2^2") == -4 and evaluate("8/2/2") == 2
    with pytest.raises(ExpressionError, match="unexpected '<'"):
        evaluate("1 < 2 < 3")
    assert evaluate("(1 < 2) < 3") == 1


def test_800_kb_expression_fails_fast_and_tokenizes_in_linear_time():
    text = "+".join(["1"] * 400_000)  # 800 KB
    _, error = bounded(lambda: evaluate(text))
    assert isinstance(error, ExpressionError) and "at most 65,536" in str(error)
    assert len(str(error)) < 1_000  # the message shows a window, not 800 KB
    # with the length limit lifted, the work grows linearly: 8x the text, ~8x the time
    wide = ExpressionLimits(max_length=10**7)

    def best(n: int) -> float:
        source = "+".join(["1"] * n) + "+'"  # a bad character at the very end
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            with pytest.raises(ExpressionError, match="unexpected character"):
                parse_expression(source, limits=wide)
            times.append(time.perf_counter() - t0)
        return min(times)

    small, large = best(25_000), best(200_000)
    assert large / small < 30, (small, large)  # quadratic would be ~64


# -- expressions: fuzzing ---------------------------------------------------------------

_TOKENS = [
    "1",
    "0",
    "2.5",
    "1e3",
    "1e400",
    ".5",
    "x",
    "y",
    "num_nodes",
    "min",
    "max",
    "log",
    "sqrt",
    "ceil",
    "abs",
    "__import__",
    "open",
    "(",
    ")",
    ",",
    "+",
    "-",
    "*",
    "/",
    "%",
    "^",
    "?",
    ":",
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "&&",
    "||",
    "!",
    " ",
    ".",
    "[",
    "]",
    "'",
    "\n",
    "é",
    "\x00",
    "𝑥",
]

_FUZZ = settings(
    max_examples=300,
    deadline=timedelta(seconds=TIME_BOUND_S),
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


@_FUZZ
@given(st.lists(st.sampled_from(_TOKENS), max_size=60))
def test_fuzz_token_soup(tokens):
    text = "".join(tokens)
    result, error = bounded(lambda: evaluate(text, {"x": 1.5, "y": -2, "num_nodes": 4}))
    assert error is None or isinstance(error, ExpressionError), repr(error)
    if error is None:
        assert isinstance(result, float)
    else:
        assert 1 <= error.position <= len(text) + 1 and error.expression == text


@_FUZZ
@given(st.text(max_size=80))
def test_fuzz_arbitrary_text(text):
    _, error = bounded(lambda: evaluate(text, {"x": 1.0}))
    assert error is None or isinstance(error, ExpressionError), repr(error)


@_FUZZ
@given(
    st.one_of(
        st.integers(min_value=-(10**400), max_value=10**400),
        st.floats(allow_nan=True, allow_infinity=True),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
        st.none(),
        st.booleans(),
        st.binary(max_size=5),
    ),
    st.one_of(st.floats(), st.integers(), st.text(max_size=3), st.lists(st.floats(), max_size=2)),
)
def test_fuzz_non_text_and_variables(value, variable):
    _, error = bounded(lambda: evaluate(value))
    assert error is None or isinstance(error, ExpressionError), repr(error)
    _, error = bounded(lambda: evaluate("x * 2 + 1", {"x": variable}))
    assert error is None or isinstance(error, ExpressionError), repr(error)


# Expression trees rendered with the fewest parentheses the grammar needs, compared with
# a reference tree walker: the compiler must agree with the grammar's precedence and
# associativity, and the evaluator with its semantics (short-circuits, errors).
_LEVEL = {
    "||": 1,
    "&&": 2,
    "==": 3,
    "!=": 3,
    "<": 3,
    "<=": 3,
    ">": 3,
    ">=": 3,
    "+": 4,
    "-": 4,
    "*": 5,
    "/": 5,
    "%": 5,
    "^": 7,
}
_ATOM = 8


class _ReferenceError(Exception):
    """The reference evaluator hit an error the evaluator must report."""


def _level(node: tuple) -> int:
    kind = node[0]
    if kind == "bin":
        return _LEVEL[node[1]]
    return {"cond": 0, "un": 6}.get(kind, _ATOM)


def _wrap(text: str, needed: bool) -> str:
    return f"({text})" if needed else text


def _render(node: tuple) -> str:
    kind = node[0]
    if kind == "num":
        return repr(node[1])
    if kind == "var":
        return node[1]
    if kind == "call":
        return f"{node[1]}({', '.join(_render(a) for a in node[2])})"
    if kind == "un":
        return node[1] + _wrap(_render(node[2]), _level(node[2]) < 6)
    if kind == "cond":
        return f"{_wrap(_render(node[1]), _level(node[1]) < 1)} ? {_render(node[2])} : " + (
            _render(node[3])
        )
    op, a, b = node[1], node[2], node[3]
    level = _LEVEL[op]
    if op == "^":
        return f"{_wrap(_render(a), _level(a) < _ATOM)}^{_wrap(_render(b), _level(b) < 6)}"
    left_needed = _level(a) <= level if level == 3 else _level(a) < level
    return f"{_wrap(_render(a), left_needed)} {op} {_wrap(_render(b), _level(b) <= level)}"


def _checked(result: Any, operands: list[float]) -> float:
    if isinstance(result, complex):
        raise _ReferenceError
    if not math.isfinite(result) and all(math.isfinite(v) for v in operands):
        raise _ReferenceError
    return float(result)


def _reference(node: tuple, env: dict[str, float]) -> float:
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "var":
        return env[node[1]]
    if kind == "un":
        value = _reference(node[2], env)
        return {"-": -value, "+": value, "!": float(not value)}[node[1]]
    if kind == "cond":
        return _reference(node[2] if _reference(node[1], env) else node[3], env)
    if kind == "call":
        args = [_reference(a, env) for a in node[2]]
        function = {
            "min": min,
            "max": max,
            "sqrt": math.sqrt,
            "abs": abs,
            "log": math.log,
            "ceil": lambda v: float(math.ceil(v)),
        }[node[1]]
        try:
            return _checked(function(*args), args)
        except (ArithmeticError, ValueError) as exc:
            raise _ReferenceError from exc
    op = node[1]
    a = _reference(node[2], env)
    if op == "&&" and not a:
        return 0.0
    if op == "||" and a:
        return 1.0
    b = _reference(node[3], env)
    if op in ("&&", "||"):
        return float(bool(b))
    functions = {
        "+": lambda: a + b,
        "-": lambda: a - b,
        "*": lambda: a * b,
        "/": lambda: a / b,
        "%": lambda: math.fmod(a, b),
        "^": lambda: a**b,
        "==": lambda: float(a == b),
        "!=": lambda: float(a != b),
        "<": lambda: float(a < b),
        "<=": lambda: float(a <= b),
        ">": lambda: float(a > b),
        ">=": lambda: float(a >= b),
    }
    try:
        return _checked(functions[op](), [a, b])
    except (ArithmeticError, ValueError) as exc:
        raise _ReferenceError from exc


_LEAVES = st.one_of(
    st.sampled_from([0.0, 1.0, 2.0, 3.0, 0.5, 10.0, 1e300]).map(lambda v: ("num", v)),
    st.sampled_from(["x", "y", "z"]).map(lambda v: ("var", v)),
)


def _extend(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.tuples(st.just("bin"), st.sampled_from(sorted(_LEVEL)), children, children),
        st.tuples(st.just("un"), st.sampled_from(["-", "+", "!"]), children),
        st.tuples(st.just("cond"), children, children, children),
        st.tuples(
            st.just("call"),
            st.sampled_from(["min", "max"]),
            st.lists(children, min_size=2, max_size=3).map(tuple),
        ),
        st.tuples(
            st.just("call"),
            st.sampled_from(["sqrt", "abs", "log", "ceil"]),
            children.map(lambda c: (c,)),
        ),
    )


@_FUZZ
@given(st.recursive(_LEAVES, _extend, max_leaves=14))
def test_fuzz_grammar_agrees_with_reference(tree):
    env = {"x": 2.0, "y": -1.5, "z": 0.0}
    text = _render(tree)
    try:
        expected: float | None = _reference(tree, env)
    except _ReferenceError:
        expected = None
    result, error = bounded(lambda: evaluate(text, env))
    if expected is None:
        assert isinstance(error, ExpressionError), (text, result, error)
    else:
        assert error is None, (text, error)
        assert result == expected or (math.isnan(result) and math.isnan(expected)), text


# -- ElastiSim reader: the cases of the issue -------------------------------------------


def _example_folder() -> Path:
    folder = Path(os.environ.get("HPCNB_DATA", "/nonexistent")) / "elastisim-example"
    if not (folder / "jobs.json").is_file():
        pytest.skip("ElastiSim example absent: set HPCNB_DATA to a folder like ../shared/data")
    return folder


def _project(folder: Path, jobs: Any, model: Any, platform_xml: str | None = None) -> Path:
    """Write a project into ``folder``; ``jobs`` / ``model`` are JSON values or raw text."""
    folder.mkdir(parents=True, exist_ok=True)
    if platform_xml is None:
        platform_xml = (
            "<?xml version='1.0'?><platform version='4.1'><zone id='z' routing='Full'>"
            "<cluster id='c' prefix='n' radical='0-7' suffix='' speed='1Gf' bw='1GBps' "
            "lat='1us'/><link id='PFS_read' bandwidth='1GBps' latency='1ms'/>"
            "<link id='PFS_write' bandwidth='1GBps' latency='1ms'/></zone></platform>"
        )
    (folder / "platform.xml").write_text(platform_xml, encoding="utf-8")
    (folder / "configuration.json").write_text(json.dumps({"platform_file": "platform.xml"}))
    if isinstance(jobs, list):
        jobs = {"jobs": jobs}
    for name, value in (("jobs.json", jobs), ("app.json", model)):
        text = value if isinstance(value, str) else json.dumps(value)
        (folder / name).write_text(text, encoding="utf-8")
    return folder / "jobs.json"


def _job(**fields: Any) -> dict[str, Any]:
    job = {
        "type": "rigid",
        "submit_time": 0,
        "num_nodes": 2,
        "application_model": "app.json",
        "arguments": {"iterations": 3, "flops": 4e9, "alpha": 0.5},
    }
    job.update(fields)
    return job


_COMPUTE = {"type": "cpu", "flops": "flops / num_nodes^alpha", "computation_pattern": "uniform"}
_MODEL = {"phases": [{"iterations": "iterations", "tasks": [_COMPUTE]}]}


def _model(**phase: Any) -> dict[str, Any]:
    return {"phases": [{"iterations": "iterations", "tasks": [_COMPUTE], **phase}]}


_HOSTILE_PROJECTS = [
    (
        [_job(arguments={"iterations": [1], "flops": 1, "alpha": 1})],
        _MODEL,
        "jobs[0].arguments.iterations: expected a number, found a list",
    ),
    (
        [_job(arguments={"iterations": 1, "flops": "x", "alpha": 1})],
        _MODEL,
        "jobs[0].arguments.flops: expected a number",
    ),
    (
        '{"jobs": [{"type": "rigid", "submit_time": 0, "num_nodes": 2, "application_model": '
        '"app.json", "arguments": {"iterations": 1, "flops": 1' + "0" * 400 + ', "alpha": 1}}]}',
        _MODEL,
        "jobs[0].arguments.flops: expected a finite number",
    ),
    ([_job(num_nodes=-3)], _MODEL, "jobs[0].num_nodes: expected an integer >= 1"),
    ([_job(num_nodes=1.5)], _MODEL, "jobs[0].num_nodes: expected an integer"),
    ([_job(submit_time="soon")], _MODEL, "jobs[0].submit_time: expected a number"),
    ([_job(type="elastic")], _MODEL, "jobs[0].type"),
    ([_job(walltime=-1)], _MODEL, "jobs[0].walltime: expected a number >= 0"),
    ([1, 2], _MODEL, "jobs[0]: expected a job object"),
    ("[1, 2]", _MODEL, "expected an object with a 'jobs' list, found a list"),
    ('{"jobs": ' + "[" * 10_000 + "]" * 10_000 + "}", _MODEL, "JSON nested 10001 levels"),
    ('{"jobs": [}', _MODEL, "invalid JSON at line 1 column 11"),
    ('{"jobs": [NaN]}', _MODEL, "jobs[0]: expected a job object"),
    ([_job()], _model(iterations=[1]), "app.json: phases[0].iterations: in expression"),
    ([_job()], _model(iterations="1e300"), "app.json: phases[0].iterations: 1e+300 iter"),
    (
        [_job()],
        _model(iterations="(-8)^0.5"),
        "phases[0].iterations: in expression '(-8)^0.5' at position 5: -8.0 ^ 0.5: complex result",
    ),
    (
        [_job()],
        {"phases": [{"tasks": [{"type": "cpu", "flops": "1", "coupled": "yes"}]}]},
        "phases[0].tasks[0].coupled: expected true or false",
    ),
    (
        [_job()],
        {"phases": [{"tasks": [{"type": "bb_read"}]}]},
        "phases[0].tasks[0]: an I/O task needs 'bytes'",
    ),
    (
        [_job()],
        {"phases": [{"tasks": [{"type": "bb_read", "bytes": 8}]}]},
        "phases[0].tasks[0]: a burst-buffer task on a platform without burst buffers",
    ),
    ([_job()], {"phases": [{"tasks": [{"type": "nvme_read"}]}]}, "phases[0].tasks[0].type"),
    (
        [_job()],
        {"phases": [{"tasks": [{"type": "idle", "delay": "1e300", "iterations": "1e15"}]}]},
        "phases[0].tasks: time segment of inf",
    ),
    ([_job()], "[" * 200 + "]" * 200, "app.json: JSON nested 200 levels"),
    ([_job()], [], "app.json: expected an object with 'phases'"),
    (
        [_job(application_model="missing.json")],
        _MODEL,
        "jobs[0].application_model: file 'missing.json' not found",
    ),
    (
        [_job(type="malleable", num_nodes_min=1, num_nodes_max=4)],
        _model(iterations="1e12"),
        "phases[0].iterations: 1,000,000,000,000 iterations: a resizable job",
    ),
]


@pytest.mark.parametrize(("jobs", "model", "where"), _HOSTILE_PROJECTS)
def test_elastisim_hostile_cases_raise_workload_error(tmp_path, jobs, model, where):
    path = _project(tmp_path, jobs, model)
    _, error = bounded(lambda: read_elastisim(path))
    assert isinstance(error, WorkloadError), repr(error)
    assert isinstance(error, HpcnbError) and isinstance(error, ValueError)
    assert where in str(error), str(error)
    assert str(path.parent) in str(error) and "\n" not in str(error)


def test_elastisim_limits_are_overridable(tmp_path):
    path = _project(tmp_path, [_job()], _MODEL)
    with pytest.raises(WorkloadError, match=r"jobs\.json: .* bytes; at most 10 are read"):
        read_elastisim(path, limits=ElastiSimLimits(max_file_bytes=10))
    with pytest.raises(WorkloadError, match="nested 4 levels deep; at most 2"):
        read_elastisim(path, limits=ElastiSimLimits(max_json_depth=2))
    limits = ElastiSimLimits(max_iterations=2)
    with pytest.raises(WorkloadError, match=r"phases\[0\]\.iterations: 3 iterations; at most 2"):
        read_elastisim(path, limits=limits)
    with pytest.raises(ValueError, match="max_units"):
        ElastiSimLimits(max_units=0)
    assert json_depth('{"a": "[[[[", "b": [[1], {"c": "\\"]]"}]}') == 3


def test_elastisim_1e12_iterations_simulate_in_closed_form(tmp_path):
    model = {
        "on_init": {"tasks": [{"type": "idle", "delay": 5}]},
        "phases": [
            {"iterations": "1e12", "tasks": [_COMPUTE]},
            {"iterations": 2, "tasks": [{"type": "idle", "delay": 1}]},
        ],
    }
    second = _job(type="moldable", submit_time=1, num_nodes=8, num_nodes_min=8, num_nodes_max=8)
    path = _project(tmp_path, [_job(), second], model)
    data, error = bounded(lambda: read_elastisim(path))
    assert error is None, error
    assert data.jobs[0].work.num_units == data.jobs[1].work.num_units == 2  # a block per phase
    result, error = bounded(lambda: simulate(data.jobs, data.platform, FCFS()))
    assert error is None, error
    check_invariants(result, data.jobs)
    per_iteration = 4e9 / 2**0.5 / 1e9  # flops / num_nodes^alpha on 1 Gflop/s nodes
    closed_form = 5 + 1e12 * per_iteration + 2 * 1
    rows = result.jobs.set_index("id")
    assert rows.loc[0, "runtime"] == pytest.approx(closed_form, rel=1e-12)
    assert rows.loc[1, "start"] == pytest.approx(closed_form, rel=1e-12)
    estimate = data.jobs[0].work.estimate(2, _ctx(data))
    assert estimate == pytest.approx(closed_form, rel=1e-12)


def _ctx(data: Any) -> RunContext:
    return RunContext(data.platform)


def test_elastisim_huge_sequence_is_aggregated(tmp_path):
    sequence = {
        "type": "sequence",
        "iterations": "1e9",
        "tasks": [
            {"type": "idle", "delay": 1e-6},
            {"type": "pfs_write", "bytes": 1000, "pattern": "all_ranks"},
        ],
    }
    path = _project(tmp_path, [_job()], {"phases": [{"iterations": 3, "tasks": [sequence]}]})
    data, error = bounded(lambda: read_elastisim(path))
    assert error is None, error
    segments = data.jobs[0].work.unit_segments(0, 2, _ctx(data))
    assert len(segments) == 2  # time and PFS bytes in closed form, not 2e9 segments
    lat = data.platform.pfs_route_latency  # node link + PFS link
    assert segments[0] == ("time", pytest.approx(1e9 * (1e-6 + lat)))
    assert segments[1] == ("pfs_write", pytest.approx(1e12))


def test_elastisim_small_sequences_stay_exact(tmp_path):
    sequence = {
        "type": "sequence",
        "iterations": 3,
        "tasks": [{"type": "idle", "delay": 1}, {"type": "pfs_read", "bytes": 10}],
    }
    path = _project(tmp_path, [_job()], {"phases": [{"iterations": 2, "tasks": [sequence]}]})
    work = read_elastisim(path).jobs[0].work
    assert work.num_units == 2
    segments = work.unit_segments(1, 2, _ctx(read_elastisim(path)))
    assert [kind for kind, _ in segments] == ["time", "pfs_read"] * 3


def test_elastisim_jobs_larger_than_the_machine_skip_or_strict(tmp_path):
    jobs = [
        _job(),
        _job(num_nodes=14),
        _job(type="malleable", num_nodes=None, num_nodes_min=9, num_nodes_max=12),
        _job(type="moldable", num_nodes=None, num_nodes_min=2, num_nodes_max=64),
        _job(num_gpus_per_node=4),
    ]
    path = _project(tmp_path, jobs, _MODEL)
    data = read_elastisim(path)
    assert [j.id for j in data.jobs] == [0, 3]
    assert data.skipped == [
        "job 1: 14 nodes > machine of 8",
        "job 2: 9 nodes > machine of 8",
        "job 4: 4 GPUs per node > 0 per node of the machine",
    ]
    assert data.jobs[1].num_nodes_max == data.jobs[1].num_nodes == 8  # capped at the machine
    with pytest.raises(WorkloadError, match=r"jobs\[1\]: 14 nodes > machine of 8 \(strict"):
        read_elastisim(path, strict=True)
    assert [j.id for j in read_elastisim(path, num_nodes=16).jobs] == [0, 1, 2, 3]
    with pytest.raises(WorkloadError, match="num_nodes=0"):
        read_elastisim(path, num_nodes=0)


def test_elastisim_example_on_a_smaller_machine(tmp_path):
    folder = _example_folder()
    data = read_elastisim(folder / "jobs.json", num_nodes=8)
    assert data.skipped and data.skipped[0] == "job 1: 14 nodes > machine of 8"
    assert len(data.jobs) + len(data.skipped) == 500
    result = simulate(data.jobs, data.platform, FCFS(), **data.simulation_options())
    check_invariants(result, data.jobs)
    assert result.metrics()["completed"] == len(data.jobs)
    with pytest.raises(WorkloadError, match=r"jobs\[1\]: 14 nodes > machine of 8"):
        read_elastisim(folder / "jobs.json", num_nodes=8, strict=True)


# -- ElastiSim reader: fuzzing by mutation ----------------------------------------------

_NASTY = st.one_of(
    st.sampled_from(
        [
            None,
            True,
            False,
            0,
            -1,
            1.5,
            1e308,
            -1e308,
            1e12,
            "1e12",
            "1e300",
            "",
            "x",
            "(-8)^0.5",
            "1/0",
            "(" * 300 + "1" + ")" * 300,
            [],
            [1],
            {},
            {"a": 1},
            "num_nodes",
            "phase_iteration",
            "__import__('os')",
            2**70,
        ]
    ),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Return the paths of all values inside a JSON value (the root included)."""
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


def _mutate(value: Any, path: tuple, action: str, replacement: Any) -> Any:
    if not path:
        return replacement if action != "wrap" else [value]
    head, rest = path[0], path[1:]
    copy = list(value) if isinstance(value, list) else dict(value)
    if not rest and action == "delete":
        del copy[head]
        return copy
    copy[head] = _mutate(value[head], rest, action, replacement)
    return copy


def _base_project() -> tuple[dict, dict, str | None]:
    folder = Path(os.environ.get("HPCNB_DATA", "/nonexistent")) / "elastisim-example"
    if (folder / "jobs.json").is_file():
        jobs = json.loads((folder / "jobs.json").read_text(encoding="utf-8"))
        model = json.loads((folder / "application_model.json").read_text(encoding="utf-8"))
        platform = (folder / "crossbar.xml").read_text(encoding="utf-8")
        jobs = {"jobs": [dict(j, application_model="app.json") for j in jobs["jobs"][:6]]}
        return jobs, model, platform
    jobs = {"jobs": [_job(), _job(type="malleable", num_nodes_min=1, num_nodes_max=4)]}
    return jobs, _model(evolving_request="num_nodes + 1"), None


_BASE = _base_project()
_FUZZ_LIMITS = ElastiSimLimits(max_units=500, max_segments=200)


@settings(
    max_examples=120,
    deadline=timedelta(seconds=TIME_BOUND_S),
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    st.booleans(),
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(["replace", "replace", "replace", "delete", "wrap"]),
    _NASTY,
)
def test_fuzz_elastisim_mutations(in_model, index, action, replacement):
    jobs, model, platform = _BASE
    target = model if in_model else jobs
    paths = _paths(target)
    path = paths[index % len(paths)]
    if action == "delete" and not path:
        action = "replace"
    mutated = _mutate(target, path, action, replacement)
    folder = Path(tempfile.mkdtemp(prefix="hpcnb-fuzz-"))
    try:
        jobs_path = _project(
            folder, jobs if in_model else mutated, mutated if in_model else model, platform
        )
        data, error = bounded(lambda: read_elastisim(jobs_path, limits=_FUZZ_LIMITS))
        assert error is None or isinstance(error, WorkloadError), repr(error)
        if error is None and data.jobs:
            _, error = bounded(
                lambda: simulate(data.jobs, data.platform, FCFS(), **data.simulation_options())
            )
            allowed = WorkloadError | SimulationError
            assert error is None or isinstance(error, allowed), repr(error)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_elastisim_work_estimates_without_a_context(tmp_path):
    # make_malleable (CLI --malleable-fraction) asks for estimates with ctx=None
    from hpcnb.batchsim import MalleablePolicy
    from hpcnb.batchsim.workloads import make_malleable

    path = _project(tmp_path, [_job(), _job(num_nodes=4)], _MODEL)
    data = read_elastisim(path)
    work = data.jobs[0].work
    assert work.estimate(2, None) == work.estimate(2, _ctx(data)) == pytest.approx(3 * 4 / 2**0.5)
    jobs = make_malleable(data.jobs, data.platform.num_nodes, MalleablePolicy(1.0))
    assert [j.type.value for j in jobs] == ["malleable", "malleable"]


_LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
    + "".join(f'<!ENTITY {chr(98 + i)} "{f"&{chr(97 + i)};" * 10}">' for i in range(9))
    + ']><platform><cluster radical="0-3" speed="&j;"/></platform>'
)


@pytest.mark.parametrize(
    ("xml", "where"),
    [
        (_LAUGHS, "platform.xml: not a valid platform XML"),
        (
            "<platform><cluster radical='0-99999999999999' speed='1Gf'/></platform>",
            "platform.xml: a machine of 100,000,000,000,000 nodes; at most 2,147,483,647",
        ),
        ("<platform><cluster radical='0-3' speed='eGf'/></platform>", "platform.xml: "),
        ("\x00 not xml", "platform.xml: not a valid platform XML"),
        ("<platform>" + " " * 3 * 2**20 + "</platform>", "ElastiSimLimits.max_platform_bytes"),
    ],
)
def test_elastisim_hostile_platforms(tmp_path, xml, where):
    path = _project(tmp_path, [_job()], _MODEL, platform_xml=xml)
    _, error = bounded(lambda: read_elastisim(path))
    assert isinstance(error, WorkloadError) and where in str(error), repr(error)


def test_elastisim_huge_io_blocks_share_the_pfs_without_hanging(tmp_path):
    # The example's model with 1e8 iterations that each compute and checkpoint: blocks of
    # ~1e19 bytes share the PFS at times ~1e9 s, where a transfer's last bytes take less
    # than one step of the clock; the engine used to reschedule it at the same time forever.
    folder = _example_folder()
    model = json.loads((folder / "application_model.json").read_text(encoding="utf-8"))
    model["phases"][0]["iterations"] = "1e8"
    jobs = json.loads((folder / "jobs.json").read_text(encoding="utf-8"))["jobs"][:20]
    jobs = [
        dict(j, application_model="app.json") for j in jobs if j["type"] in ("rigid", "moldable")
    ][:12]
    platform = (folder / "crossbar.xml").read_text(encoding="utf-8")
    data = read_elastisim(_project(tmp_path, jobs, model, platform))
    outcome: list[Any] = []
    # a daemon thread, so that a regression fails the test instead of hanging the run
    worker = threading.Thread(
        target=lambda: outcome.append(bounded(lambda: simulate(data.jobs, data.platform, FCFS()))),
        daemon=True,
    )
    worker.start()
    worker.join(3 * TIME_BOUND_S)
    assert outcome, "the simulation did not finish (PFS transfers rescheduled at one time)"
    result, error = outcome[0]
    assert error is None, error
    check_invariants(result, data.jobs)
    assert result.metrics()["completed"] == len(jobs)
