"""Notebook parameters: parse the ``parameters`` cell, validate and coerce overrides.

Every notebook has exactly one code cell tagged ``parameters`` holding annotated
literal assignments, one per line, each with a comment::

    SEED: int = 0  # RNG seed
    SMOKE: bool = False  # tiny inputs for CI

:func:`notebook_parameters` reads them; :func:`validate_overrides` checks user-given
values (strings from the command line, or already-typed values from a YAML grid)
against them before anything runs, so a typo fails in milliseconds, not after a
kernel start.

The cell is parsed with :mod:`ast` rather than with ``papermill.inspect_notebook``.
On this project's notebooks both find the same names, annotations, defaults and
comments (``tests/test_parameters.py`` checks that), but papermill reads each line
with a regular expression and gives less: a default comes back as source text, not a
value; a ``#`` inside a string default ends the value and the rest becomes the
comment; an annotation outside its pattern (``tuple[int, ...]``, ``str | None``)
drops the parameter without a word; and a non-literal default or a missing
annotation is accepted. Here every statement must be ``NAME: type = literal``, and
any other line fails with the notebook and line number.
"""

from __future__ import annotations

import ast
import io
import json
import math
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hpcnb.errors import HpcnbError

__all__ = [
    "Parameter",
    "ParameterError",
    "coerce",
    "notebook_parameters",
    "parameters_cell",
    "validate_overrides",
]

_SCALARS: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}


class ParameterError(HpcnbError, ValueError):
    """A parameters cell is malformed or an override does not fit it."""


@dataclass(frozen=True)
class Parameter:
    """One notebook parameter.

    Attributes:
        name: Variable name.
        type: The annotation as written (``"int"``, ``"float"``, ``"list[int]"``).
        default: The literal default.
        comment: The trailing comment describing it.
    """

    name: str
    type: str
    default: Any
    comment: str


def parameters_cell(nb: dict[str, Any], path: str | Path = "<notebook>") -> tuple[int, str]:
    """Return ``(index, source)`` of the single cell tagged ``parameters``.

    Raises:
        ParameterError: No cell or more than one cell carries the tag.
    """
    found = [
        (i, cell)
        for i, cell in enumerate(nb.get("cells", []))
        if "parameters" in cell.get("metadata", {}).get("tags", [])
    ]
    if len(found) != 1:
        raise ParameterError(
            f"{path}: expected exactly one cell tagged 'parameters', found {len(found)}"
        )
    index, cell = found[0]
    source = cell["source"]
    return index, source if isinstance(source, str) else "".join(source)


def _comments(source: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def notebook_parameters(path: str | Path) -> list[Parameter]:
    """Parse the parameters of a notebook file.

    Args:
        path: An ``.ipynb`` file.

    Raises:
        ParameterError: The parameters cell has a statement that is not
            ``NAME: type = literal``, naming the notebook and line.
    """
    path = Path(path)
    nb = json.loads(path.read_text(encoding="utf-8"))
    _, source = parameters_cell(nb, path)
    return parse_parameters(source, path)


def parse_parameters(source: str, path: str | Path = "<cell>") -> list[Parameter]:
    """Parse the source of a parameters cell (see :func:`notebook_parameters`)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ParameterError(f"{path}: parameters cell line {exc.lineno}: {exc.msg}") from exc
    comments = _comments(source)
    params: list[Parameter] = []
    for stmt in tree.body:
        where = f"{path}: parameters cell line {stmt.lineno}"
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            raise ParameterError(f"{where}: expected 'NAME: type = literal  # comment'")
        if stmt.value is None:
            raise ParameterError(f"{where}: {stmt.target.id} has no default value")
        try:
            default = ast.literal_eval(stmt.value)
        except ValueError as exc:
            raise ParameterError(f"{where}: default of {stmt.target.id} is not a literal") from exc
        annotation = ast.unparse(stmt.annotation)
        params.append(Parameter(stmt.target.id, annotation, default, comments.get(stmt.lineno, "")))
    return params


def coerce(param: Parameter, value: Any) -> Any:
    """Convert ``value`` to the parameter's declared type.

    Strings (from the command line) are parsed: ``int``/``float`` as numbers,
    ``bool`` from true/false/1/0/yes/no, other annotations as YAML. Typed values are
    checked against the declared type (an ``int`` is accepted for a ``float``).

    Raises:
        ParameterError: The value does not fit, naming the parameter and its type
            (NaN and infinity are refused for ``float`` parameters).
    """
    kind = _SCALARS.get(param.type)
    bad = ParameterError(
        f"parameter {param.name}: {value!r} is not a valid {param.type} "
        f"(default {param.default!r}; {param.comment})"
    )
    if isinstance(value, str) and kind is not str:
        text = value.strip()
        if kind is bool:
            lowered = text.lower()
            if lowered in {"true", "1", "yes", "on"}:
                return True
            if lowered in {"false", "0", "no", "off"}:
                return False
            raise bad
        if kind is int:
            try:
                return int(text)
            except ValueError:
                raise bad from None
        if kind is float:
            try:
                value = float(text)
            except ValueError:
                raise bad from None
        else:
            try:
                value = yaml.safe_load(text)
            except yaml.YAMLError:
                raise bad from None
    if kind is None:
        # Container annotations: compare with the default's container type.
        if param.default is not None and not isinstance(value, type(param.default)):
            if isinstance(param.default, tuple) and isinstance(value, list):
                return tuple(value)
            raise bad
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            value = float(value)
        except OverflowError:
            raise bad from None
    if kind is float and isinstance(value, float) and not math.isfinite(value):
        raise ParameterError(
            f"parameter {param.name}: {value!r} is not finite (a float parameter takes a "
            f"finite number; default {param.default!r}; {param.comment})"
        )
    if kind is int and isinstance(value, bool):
        raise bad
    if not isinstance(value, kind):
        raise bad
    return value


def validate_overrides(
    params: list[Parameter], overrides: dict[str, Any], path: str | Path = "<notebook>"
) -> dict[str, Any]:
    """Check overrides against a notebook's parameters and coerce their types.

    Args:
        params: The notebook's parameters.
        overrides: Name → value (strings are parsed per the declared type).
        path: The notebook, for messages.

    Returns:
        The overrides with values of the declared types.

    Raises:
        ParameterError: A name is unknown (the message lists the valid ones) or a
            value has the wrong type.
    """
    by_name = {p.name: p for p in params}
    unknown = sorted(set(overrides) - set(by_name))
    if unknown:
        valid = ", ".join(f"{p.name}: {p.type}" for p in params)
        raise ParameterError(f"{path}: unknown parameter(s) {', '.join(unknown)}; valid: {valid}")
    return {name: coerce(by_name[name], value) for name, value in overrides.items()}
