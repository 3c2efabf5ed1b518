"""A safe, whitelisting evaluator for ElastiSim scaling expressions.

ElastiSim application models describe task sizes with expressions over the job's
arguments and the allocation, for instance ``flops/num_nodes^alpha`` or
``phase_iteration % 2 == 0 ? num_nodes - 4 : num_nodes + 4``. Such strings come
from files, so they are never handed to Python's ``eval``: this module tokenizes
them and parses them with a recursive-descent parser into a small tree that only
knows the operations listed below.

Grammar (lowest precedence first)::

    expr        := ternary
    ternary     := or_expr ( '?' expr ':' expr )?
    or_expr     := and_expr ( '||' and_expr )*
    and_expr    := comparison ( '&&' comparison )*
    comparison  := additive ( ('=='|'!='|'<'|'<='|'>'|'>=') additive )?
    additive    := term ( ('+'|'-') term )*
    term        := unary ( ('*'|'/'|'%') unary )*
    unary       := ('-'|'+'|'!') unary | power
    power       := atom ( '^' unary )?          # right-associative
    atom        := NUMBER | NAME | NAME '(' expr (',' expr)* ')' | '(' expr ')'

Functions: ``min``, ``max`` (two or more arguments), ``log`` (natural), ``log2``,
``log10``, ``sqrt``, ``ceil``, ``floor``, ``abs``. Anything else is rejected with an
:class:`ExpressionError` naming the expression and the 0-based character position.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["Expression", "ExpressionError", "evaluate", "parse_expression"]


class ExpressionError(ValueError):
    """An expression could not be parsed or evaluated.

    Attributes:
        expression: The full expression text.
        position: 0-based character offset of the problem.
    """

    def __init__(self, expression: str, position: int, message: str) -> None:
        self.expression = expression
        self.position = position
        pointer = " " * position + "^"
        super().__init__(f"in expression {expression!r} at position {position}: {message}\n"
                         f"    {expression}\n    {pointer}")  # fmt: skip


_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z_0-9]*)"
    r"|(?P<op>==|!=|<=|>=|&&|\|\||[-+*/%^()?:,<>!]))"
)

_FUNCTIONS: dict[str, tuple[int, int, Callable[..., float]]] = {
    # name: (min args, max args (-1 = any), implementation)
    "min": (2, -1, min),
    "max": (2, -1, max),
    "log": (1, 1, math.log),
    "log2": (1, 1, math.log2),
    "log10": (1, 1, math.log10),
    "sqrt": (1, 1, math.sqrt),
    "ceil": (1, 1, lambda x: float(math.ceil(x))),
    "floor": (1, 1, lambda x: float(math.floor(x))),
    "abs": (1, 1, abs),
}


@dataclass(frozen=True)
class _Token:
    kind: str  # "num", "name", "op", "end"
    text: str
    pos: int


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            bad = pos + (len(text[pos:]) - len(text[pos:].lstrip()))
            raise ExpressionError(text, bad, f"unexpected character {text[bad]!r}")
        kind = match.lastgroup or "op"
        start = match.start(kind)
        tokens.append(_Token(kind, match.group(kind), start))
        pos = match.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


# Node tuples: ("num", value) | ("var", name, pos) | ("un", op, a) | ("bin", op, a, b)
# | ("cond", c, a, b) | ("call", name, args, pos)
_Node = tuple


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def error(self, message: str, token: _Token | None = None) -> ExpressionError:
        return ExpressionError(self.text, (token or self.tok).pos, message)

    def eat(self, text: str) -> bool:
        if self.tok.kind == "op" and self.tok.text == text:
            self.i += 1
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.eat(text):
            found = self.tok.text or "end of expression"
            raise self.error(f"expected {text!r}, found {found!r}")

    def parse(self) -> _Node:
        if self.tok.kind == "end":
            raise self.error("empty expression")
        node = self.ternary()
        if self.tok.kind != "end":
            raise self.error(f"unexpected {self.tok.text!r}")
        return node

    def ternary(self) -> _Node:
        cond = self.binary_or()
        if self.eat("?"):
            yes = self.ternary()
            self.expect(":")
            no = self.ternary()
            return ("cond", cond, yes, no)
        return cond

    def binary_or(self) -> _Node:
        node = self.binary_and()
        while self.eat("||"):
            node = ("bin", "||", node, self.binary_and())
        return node

    def binary_and(self) -> _Node:
        node = self.comparison()
        while self.eat("&&"):
            node = ("bin", "&&", node, self.comparison())
        return node

    def comparison(self) -> _Node:
        node = self.additive()
        for op in ("==", "!=", "<=", ">=", "<", ">"):
            if self.eat(op):
                return ("bin", op, node, self.additive())
        return node

    def additive(self) -> _Node:
        node = self.term()
        while True:
            if self.eat("+"):
                node = ("bin", "+", node, self.term())
            elif self.eat("-"):
                node = ("bin", "-", node, self.term())
            else:
                return node

    def term(self) -> _Node:
        node = self.unary()
        while True:
            op = self.tok.text if self.tok.kind == "op" else ""
            if op in ("*", "/", "%"):
                self.i += 1
                node = ("bin", op, node, self.unary())
            else:
                return node

    def unary(self) -> _Node:
        for op in ("-", "+", "!"):
            if self.eat(op):
                return ("un", op, self.unary())
        return self.power()

    def power(self) -> _Node:
        base = self.atom()
        if self.eat("^"):
            return ("bin", "^", base, self.unary())
        return base

    def atom(self) -> _Node:
        tok = self.tok
        if tok.kind == "num":
            self.i += 1
            return ("num", float(tok.text))
        if tok.kind == "name":
            self.i += 1
            if self.eat("("):
                if tok.text not in _FUNCTIONS:
                    raise self.error(f"function {tok.text!r} is not allowed", tok)
                args = [self.ternary()]
                while self.eat(","):
                    args.append(self.ternary())
                self.expect(")")
                lo, hi, _ = _FUNCTIONS[tok.text]
                if len(args) < lo or (hi >= 0 and len(args) > hi):
                    raise self.error(f"{tok.text}() takes {lo} argument(s)"
                                     f"{'' if hi == lo else ' or more'}, got {len(args)}",
                                     tok)  # fmt: skip
                return ("call", tok.text, tuple(args), tok.pos)
            return ("var", tok.text, tok.pos)
        if self.eat("("):
            node = self.ternary()
            self.expect(")")
            return node
        found = tok.text or "end of expression"
        raise self.error(f"expected a number, a name or '(', found {found!r}")


_BINARY: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "%": lambda a, b: math.fmod(a, b),
    "^": lambda a, b: a**b,
    "==": lambda a, b: float(a == b),
    "!=": lambda a, b: float(a != b),
    "<": lambda a, b: float(a < b),
    "<=": lambda a, b: float(a <= b),
    ">": lambda a, b: float(a > b),
    ">=": lambda a, b: float(a >= b),
    "&&": lambda a, b: float(bool(a) and bool(b)),
    "||": lambda a, b: float(bool(a) or bool(b)),
}


@dataclass(frozen=True)
class Expression:
    """A parsed expression; call :meth:`evaluate` with the variable values.

    Attributes:
        text: The source text.
        names: The variable names it uses.
    """

    text: str
    tree: _Node
    names: frozenset[str]

    def evaluate(self, variables: Mapping[str, float]) -> float:
        """Evaluate with ``variables`` bound.

        Raises:
            ExpressionError: An unknown name, a division by zero or a math domain error;
                the message gives the position.
        """
        return self._eval(self.tree, variables)

    def _eval(self, node: _Node, env: Mapping[str, float]) -> float:
        kind = node[0]
        if kind == "num":
            return node[1]
        if kind == "var":
            try:
                return float(env[node[1]])
            except KeyError:
                known = ", ".join(sorted(env)) or "none"
                message = f"unknown name {node[1]!r} (known: {known})"
                raise ExpressionError(self.text, node[2], message) from None
        if kind == "bin":
            a = self._eval(node[2], env)
            op = node[1]
            if op == "&&" and not a:
                return 0.0
            if op == "||" and a:
                return 1.0
            b = self._eval(node[3], env)
            try:
                return float(_BINARY[op](a, b))
            except (ZeroDivisionError, OverflowError, ValueError) as exc:
                raise ExpressionError(self.text, 0, f"{a} {op} {b}: {exc}") from None
        if kind == "un":
            a = self._eval(node[2], env)
            return -a if node[1] == "-" else (float(not a) if node[1] == "!" else a)
        if kind == "cond":
            return self._eval(node[2] if self._eval(node[1], env) else node[3], env)
        # call
        args = [self._eval(arg, env) for arg in node[2]]
        try:
            return float(_FUNCTIONS[node[1]][2](*args))
        except (ValueError, OverflowError) as exc:
            raise ExpressionError(self.text, node[3], f"{node[1]}{tuple(args)}: {exc}") from None


def _names(node: _Node) -> set[str]:
    if node[0] == "var":
        return {node[1]}
    if node[0] == "num":
        return set()
    if node[0] == "call":
        return set().union(*(_names(a) for a in node[2]))
    return set().union(*(_names(a) for a in node[1:] if isinstance(a, tuple)))


@lru_cache(maxsize=4096)
def parse_expression(text: str | float | int) -> Expression:
    """Parse an expression (numbers are accepted as constant expressions).

    Raises:
        ExpressionError: The text uses anything outside the whitelist; the message
            names the expression and the position.
    """
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ExpressionError(repr(text), 0, f"expected a string or number, got {type(text)}")
    if not isinstance(text, str):
        return Expression(repr(text), ("num", float(text)), frozenset())
    tree = _Parser(text).parse()
    return Expression(text, tree, frozenset(_names(tree)))


def evaluate(text: str | float | int, variables: Mapping[str, float] | None = None) -> float:
    """Parse (cached) and evaluate ``text`` with ``variables``.

    Raises:
        ExpressionError: Parsing or evaluation failed.
    """
    return parse_expression(text).evaluate(variables or {})
