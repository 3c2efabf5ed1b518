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

Input is bounded before any work starts: a value given as text is at most
:data:`MAX_VALUE_BYTES`; YAML text (container values, sweep grids) is read by
:func:`load_yaml_bounded`, which refuses aliases and anchors (so a short text cannot
expand to billions of elements), nesting deeper than :data:`MAX_DEPTH`, more than
:data:`MAX_NODES` nodes and repeated mapping keys. Container parameters are checked
element by element against their annotation (``list[int]``, ``list[float]``,
``tuple[int, ...]``, ``dict[str, float]``, ``X | None``), and a ``float`` anywhere refuses
NaN and infinity. A parameter with a fixed set of values declares them,
``DATASET: Literal["digits", "cifar10"] = "digits"`` (the cell may then start with
``from typing import Literal``), and any other value is refused with the choices listed.
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
    "MAX_DEPTH",
    "MAX_NODES",
    "MAX_NOTEBOOK_BYTES",
    "MAX_VALUE_BYTES",
    "Parameter",
    "ParameterError",
    "choices",
    "coerce",
    "load_yaml_bounded",
    "notebook_parameters",
    "parameters_cell",
    "read_notebook",
    "validate_overrides",
]

_SCALARS: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}
#: Names a parameters cell may import from :mod:`typing` (for choice annotations).
_TYPING_NAMES = {"Literal"}

#: Largest parameter value given as text (a ``-p`` value), in bytes of UTF-8.
MAX_VALUE_BYTES = 1 << 20
#: Deepest nesting of YAML collections accepted in a value or a grid.
MAX_DEPTH = 32
#: Most YAML nodes (scalars and collections) accepted in one value or grid.
MAX_NODES = 200_000


class ParameterError(HpcnbError, ValueError):
    """A parameters cell is malformed or an override does not fit it."""


class _BoundedLoader(yaml.SafeLoader):
    """A safe YAML loader with no aliases or anchors, bounded depth and node count."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None,
                None,
                "YAML anchors and aliases (&name, *name) are not accepted",
                event.start_mark,
            )
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"more than {MAX_NODES} YAML nodes", event.start_mark
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: SafeLoader names it below
                repeated = False
            if repeated:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def load_yaml_bounded(text: str, where: str) -> Any:
    """Parse YAML text with the bounds of this module.

    Args:
        text: The YAML text.
        where: What the text is (a parameter, a grid file), for messages.

    Raises:
        ParameterError: The text is not valid YAML, uses anchors or aliases, nests deeper
            than :data:`MAX_DEPTH`, has more than :data:`MAX_NODES` nodes or repeats a key.
    """
    try:
        loader = _BoundedLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise ParameterError(f"{where}: not accepted as YAML ({detail[:300]})") from None
    except (ValueError, OverflowError) as exc:  # e.g. an integer of too many digits
        raise ParameterError(f"{where}: not accepted as YAML ({str(exc)[:300]})") from None


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

    Args:
        nb: The notebook as a JSON mapping.
        path: The notebook's path, for messages.

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
    _, source = parameters_cell(read_notebook(path), path)
    return parse_parameters(source, path)


#: Largest notebook file read to find its parameters (bytes).
MAX_NOTEBOOK_BYTES = 256 << 20


def read_notebook(path: str | Path) -> dict[str, Any]:
    """Read a notebook file as JSON and check its outline (a mapping with a cell list).

    Raises:
        ParameterError: The file cannot be read, is larger than
            :data:`MAX_NOTEBOOK_BYTES`, is not UTF-8 JSON, or is not a notebook (the
            message names the file and what is wrong).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise ParameterError(f"{path}: not a notebook file")
        if size > MAX_NOTEBOOK_BYTES:
            raise ParameterError(
                f"{path}: {size} bytes, more than a notebook may have here "
                f"({MAX_NOTEBOOK_BYTES} bytes)"
            )
        nb = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise ParameterError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ParameterError(f"{path}: not a notebook (not UTF-8 at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ParameterError(
            f"{path}: not a notebook (invalid JSON at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise ParameterError(f"{path}: not a notebook (JSON nested too deeply)") from None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise ParameterError(f"{path}: not a notebook (no list of cells)")
    for i, cell in enumerate(cells):
        src = cell.get("source", "")
        if not (
            isinstance(src, str)
            or (isinstance(src, list) and all(isinstance(line, str) for line in src))
        ):
            raise ParameterError(f"{path}: not a notebook (cell {i} has no text source)")
        meta = cell.get("metadata", {})
        if not isinstance(meta, dict) or not isinstance(meta.get("tags", []), list):
            raise ParameterError(f"{path}: not a notebook (cell {i} has malformed metadata)")
    return nb


def parse_parameters(source: str, path: str | Path = "<cell>") -> list[Parameter]:
    """Parse the source of a parameters cell (see :func:`notebook_parameters`).

    Args:
        source: The cell's source text.
        path: The notebook's path, for messages.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ParameterError(f"{path}: parameters cell line {exc.lineno}: {exc.msg}") from exc
    comments = _comments(source)
    params: list[Parameter] = []
    for stmt in tree.body:
        where = f"{path}: parameters cell line {stmt.lineno}"
        if _is_typing_import(stmt):
            continue
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            raise ParameterError(f"{where}: expected 'NAME: type = literal  # comment'")
        if stmt.value is None:
            raise ParameterError(f"{where}: {stmt.target.id} has no default value")
        try:
            default = ast.literal_eval(stmt.value)
        except ValueError as exc:
            raise ParameterError(f"{where}: default of {stmt.target.id} is not a literal") from exc
        annotation = ast.unparse(stmt.annotation)
        allowed = _literal_choices(stmt.annotation)
        if allowed is not None and default not in allowed:
            raise ParameterError(
                f"{where}: default {default!r} of {stmt.target.id} is not one of its choices"
            )
        params.append(Parameter(stmt.target.id, annotation, default, comments.get(stmt.lineno, "")))
    return params


def _is_typing_import(stmt: ast.stmt) -> bool:
    """Whether ``stmt`` is ``from typing import Literal`` (what a choice annotation needs)."""
    return (
        isinstance(stmt, ast.ImportFrom)
        and stmt.module == "typing"
        and all(alias.name in _TYPING_NAMES and alias.asname is None for alias in stmt.names)
    )


def choices(param: Parameter) -> tuple[Any, ...] | None:
    """The values a ``Literal[...]`` parameter accepts, or ``None`` for other annotations.

    Args:
        param: A parameter of a notebook.

    Example:
        >>> choices(Parameter("DATASET", 'Literal["digits", "cifar10"]', "digits", ""))
        ('digits', 'cifar10')
    """
    try:
        node = ast.parse(param.type, mode="eval").body
    except SyntaxError:
        return None
    return _literal_choices(node)


def _literal_choices(node: ast.expr | None) -> tuple[Any, ...] | None:
    if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)):
        return None
    if node.value.id != "Literal":
        return None
    elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    if not all(isinstance(e, ast.Constant) for e in elts):
        return None
    return tuple(e.value for e in elts if isinstance(e, ast.Constant))


def coerce(param: Parameter, value: Any) -> Any:
    """Convert ``value`` to the parameter's declared type.

    Strings (from the command line) are parsed: ``int``/``float`` as numbers,
    ``bool`` from true/false/1/0/yes/no, other annotations as YAML
    (:func:`load_yaml_bounded`). Typed values are checked against the declared type (an
    ``int`` is accepted for a ``float``); container values element by element.

    Args:
        param: The parameter (its declared type, default and comment).
        value: A text from the command line or a typed value from a grid.

    Raises:
        ParameterError: The value does not fit, naming the parameter and its type
            (NaN and infinity are refused wherever a ``float`` is declared; a text value
            over :data:`MAX_VALUE_BYTES` is refused).
    """
    kind = _SCALARS.get(param.type)
    allowed = choices(param)
    if allowed is not None and all(isinstance(c, str) for c in allowed):
        kind = str  # a choice of strings: the text is the value, checked against the choices
    if isinstance(value, str) and len(value) > MAX_VALUE_BYTES // 4:
        size = len(value.encode("utf-8", errors="surrogatepass"))
        if size > MAX_VALUE_BYTES:
            raise ParameterError(
                f"parameter {param.name}: value of {size} bytes is over the limit of "
                f"{MAX_VALUE_BYTES} bytes"
            )

    def bad(reason: str = "") -> ParameterError:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        why = f" ({reason})" if reason else ""
        return ParameterError(
            f"parameter {param.name}: {shown} is not a valid {param.type}{why} "
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
            raise bad()
        if kind is int:
            try:
                return int(text)
            except ValueError:
                raise bad() from None
        if kind is float:
            try:
                value = float(text)
            except ValueError:
                raise bad() from None
        else:
            value = load_yaml_bounded(text, f"parameter {param.name}")
    try:
        annotation = ast.parse(param.type, mode="eval").body
    except SyntaxError:
        annotation = None
    try:
        return _conform(annotation, value, param.default)
    except _MismatchError as exc:
        raise bad(str(exc)) from None


class _MismatchError(Exception):
    """A value does not fit an annotation (the message says where)."""


def _scalar(kind: type, value: Any) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            value = float(value)
        except OverflowError:
            raise _MismatchError("too large for a float") from None
    if kind is float and isinstance(value, float) and not math.isfinite(value):
        raise _MismatchError("not finite: a float takes a finite number")
    if kind is int and isinstance(value, bool):
        raise _MismatchError("a bool is not an int")
    if not isinstance(value, kind):
        raise _MismatchError(f"{type(value).__name__} where {kind.__name__} is declared")
    return value


def _conform(node: ast.expr | None, value: Any, default: Any) -> Any:
    """Return ``value`` converted to the annotation ``node``, else raise :class:`_MismatchError`.

    Understood: ``int``, ``float``, ``bool``, ``str``, ``None``, ``Literal[a, b, ...]``,
    ``list[T]``, ``tuple[T, ...]``, ``tuple[T1, T2]``, ``dict[K, V]``, ``T | None`` and
    ``Optional[T]``. Any other annotation is compared with the container type of ``default``.
    """
    allowed = _literal_choices(node)
    if allowed is not None:
        for choice in allowed:
            if value == choice and type(value) is type(choice):
                return choice
        listed = ", ".join(repr(c) for c in allowed)
        raise _MismatchError(f"not one of the choices {listed}")
    if isinstance(node, ast.Constant) and node.value is None:
        if value is not None:
            raise _MismatchError(f"{type(value).__name__} where None is declared")
        return None
    if isinstance(node, ast.Name) and node.id in _SCALARS:
        return _scalar(_SCALARS[node.id], value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        errors = []
        for side in (node.left, node.right):
            try:
                return _conform(side, value, default)
            except _MismatchError as exc:
                errors.append(str(exc))
        raise _MismatchError("; ".join(errors))
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        outer = node.value.id
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if outer == "Optional" and len(args) == 1:
            return None if value is None else _conform(args[0], value, default)
        if outer in {"list", "tuple"}:
            if not isinstance(value, list | tuple):
                raise _MismatchError(f"{type(value).__name__} where a {outer} is declared")
            if outer == "list" and len(args) == 1:
                items = [_item(args[0], v, i) for i, v in enumerate(value)]
                return items
            if outer == "tuple":
                if len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is ...:
                    return tuple(_item(args[0], v, i) for i, v in enumerate(value))
                if len(args) != len(value):
                    raise _MismatchError(f"{len(value)} elements where {len(args)} are declared")
                pairs = enumerate(zip(args, value, strict=True))
                return tuple(_item(a, v, i) for i, (a, v) in pairs)
        if outer == "dict" and len(args) == 2:
            if not isinstance(value, dict):
                raise _MismatchError(f"{type(value).__name__} where a dict is declared")
            out = {}
            for k, v in value.items():
                out[_item(args[0], k, f"key {k!r}")] = _item(args[1], v, f"[{k!r}]")
            return out
    # Another annotation: compare with the default's container type.
    if default is not None and not isinstance(value, type(default)):
        if isinstance(default, tuple) and isinstance(value, list):
            return tuple(value)
        raise _MismatchError(f"{type(value).__name__} where {type(default).__name__} is expected")
    return value


def _item(node: ast.expr, value: Any, where: int | str) -> Any:
    try:
        return _conform(node, value, None)
    except _MismatchError as exc:
        label = f"element {where}" if isinstance(where, int) else str(where)
        raise _MismatchError(f"{label}: {exc}") from None


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
