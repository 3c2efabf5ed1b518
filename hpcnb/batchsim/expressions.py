"""A safe, whitelisting evaluator for ElastiSim scaling expressions.

ElastiSim application models describe task sizes with expressions over the job's
arguments and the allocation, for instance ``flops/num_nodes^alpha`` or
``phase_iteration % 2 == 0 ? num_nodes - 4 : num_nodes + 4``. Such strings come
from files, so they are never handed to Python's ``eval``: this module tokenizes
them and compiles them into a short stack program that only knows the operations
listed below.

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
``log10``, ``sqrt``, ``ceil``, ``floor``, ``abs``. ``&&``, ``||`` and ``?:``
evaluate only the operands they need.

**Errors.** Every problem, whatever the input, raises :class:`ExpressionError` (a
:class:`~hpcnb.errors.HpcnbError` and a :class:`ValueError`) that names the
expression and the 1-based character position: characters or functions outside
the whitelist, syntax errors, unknown names, non-numeric variables, division by zero,
domain errors (``log(0)``), complex results (``(-8)^0.5``), overflow (a finite
computation whose result is not finite, or a literal above 1.8e308) and inputs that
are not a string or a number.

**Limits** (:class:`ExpressionLimits`, overridable per call with ``limits=``):
``max_length`` characters (default 65,536) and ``max_depth`` nested groups
(default 256; parentheses, function calls and ``?:`` branches each count one level).
The tokenizer matches one regular expression at each position (linear in the length),
and both the compiler (a shunting-yard pass with explicit stacks) and the evaluator
are iterative, so no input can exhaust Python's recursion limit; long chains such as
20,000 ``+`` terms or 10,000 unary minus signs are fine within ``max_length``.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hpcnb.errors import HpcnbError, InvalidInputError, InvalidTypeError

__all__ = [
    "Expression",
    "ExpressionError",
    "ExpressionLimits",
    "evaluate",
    "parse_expression",
]

_EXCERPT = 200  # longer expressions are shown as a window around the position


class ExpressionError(HpcnbError, ValueError):
    """An expression could not be parsed or evaluated.

    Attributes:
        expression: The full expression text.
        position: 1-based character position of the problem (``len + 1`` for the end).
        reason: What is wrong, without the expression.
    """

    def __init__(self, expression: str, position: int, message: str) -> None:
        self.expression = expression
        self.position = position
        self.reason = message
        offset = max(0, position - 1)
        shown = expression
        if len(expression) > _EXCERPT:
            lo = max(0, offset - _EXCERPT // 2)
            shown = expression[lo : lo + _EXCERPT]
            offset -= lo
            head = "..." if lo > 0 else ""
            tail = "..." if lo + _EXCERPT < len(expression) else ""
            shown, offset = head + shown + tail, offset + len(head)
            summary = f"an expression of {len(expression):,} characters"
        else:
            summary = f"expression {expression!r}"
        shown = shown.replace("\n", " ").replace("\t", " ").replace("\r", " ")
        pointer = " " * offset + "^"
        super().__init__(
            f"in {summary} at position {position}: {message}\n    {shown}\n    {pointer}"
        )


@dataclass(frozen=True)
class ExpressionLimits:
    """Bounds on the expressions :func:`parse_expression` accepts.

    Attributes:
        max_length: Most characters in one expression.
        max_depth: Most nested groups: parentheses, function calls and the branches
            of ``?:`` each open one level.
    """

    max_length: int = 65_536
    max_depth: int = 256

    def __post_init__(self) -> None:
        for name in ("max_length", "max_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(
                    f"ExpressionLimits.{name}={value!r}: expected an integer >= 1"
                )


DEFAULT_LIMITS = ExpressionLimits()

_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z_0-9]*)"
    r"|(?P<op>==|!=|<=|>=|&&|\|\||[-+*/%^()?:,<>!])"
    r"|(?P<end>\Z)"
    r"|(?P<bad>.))",
    re.DOTALL,
)


def _ceil(x: float) -> float:
    return float(math.ceil(x))


def _floor(x: float) -> float:
    return float(math.floor(x))


_FUNCTIONS: dict[str, tuple[int, int, Callable[..., float]]] = {
    # name: (min args, max args (-1 = any), implementation)
    "min": (2, -1, min),
    "max": (2, -1, max),
    "log": (1, 1, math.log),
    "log2": (1, 1, math.log2),
    "log10": (1, 1, math.log10),
    "sqrt": (1, 1, math.sqrt),
    "ceil": (1, 1, _ceil),
    "floor": (1, 1, _floor),
    "abs": (1, 1, abs),
}

_BINARY: dict[str, Callable[[float, float], Any]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "%": math.fmod,
    "^": lambda a, b: a**b,
    "==": lambda a, b: float(a == b),
    "!=": lambda a, b: float(a != b),
    "<": lambda a, b: float(a < b),
    "<=": lambda a, b: float(a <= b),
    ">": lambda a, b: float(a > b),
    ">=": lambda a, b: float(a >= b),
}

# binary precedences (higher binds tighter); unary prefix operators sit at 6, '^' at 7
_PRECEDENCE = {
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
_UNARY_PRECEDENCE = 6
_COMPARISON = 3

# opcodes of the compiled program; an instruction is (opcode, argument, 1-based position)
_PUSH, _VAR, _NEG, _NOT, _BIN, _JZ, _JMP, _ANDJ, _ORJ, _BOOL, _CALL = range(11)
_Instruction = tuple[int, Any, int]

# operator-stack frames: (kind, text, position, extra)
# kind: "bin" | "un" | "(" | "call" | "?" | ":" ; extra: jump index / [name, argc]
_GROUPS = ("(", "call", "?", ":")


class _Compiler:
    """Shunting-yard compilation of the token stream into a stack program."""

    def __init__(self, text: str, limits: ExpressionLimits) -> None:
        self.text = text
        self.limits = limits
        self.program: list[_Instruction] = []
        self.stack: list[list[Any]] = []
        self.names: set[str] = set()
        self.depth = 0

    def error(self, position: int, message: str) -> ExpressionError:
        return ExpressionError(self.text, position, message)

    def _emit(self, opcode: int, argument: Any, position: int) -> int:
        self.program.append((opcode, argument, position))
        return len(self.program) - 1

    def _patch(self, index: int) -> None:
        opcode, _, position = self.program[index]
        self.program[index] = (opcode, len(self.program), position)

    def _open(self, frame: list[Any]) -> None:
        self.depth += 1
        if self.depth > self.limits.max_depth:
            raise self.error(
                frame[2],
                f"nested deeper than {self.limits.max_depth} levels (ExpressionLimits.max_depth)",
            )
        self.stack.append(frame)

    def _pop_operator(self) -> None:
        """Pop the top frame (an operator or a finished ``:`` branch) into the program."""
        kind, op, pos, extra = self.stack.pop()
        if kind == "bin":
            if op == "&&" or op == "||":
                self._emit(_BOOL, None, pos)
                self._patch(extra)
            else:
                self._emit(_BIN, (op, _BINARY[op]), pos)
        elif kind == "un":
            if op == "-":
                self._emit(_NEG, None, pos)
            elif op == "!":
                self._emit(_NOT, None, pos)
        else:  # ":" - the else branch is complete
            self.depth -= 1
            self._patch(extra)

    def _reduce(self, min_precedence: int) -> None:
        """Pop operators binding at least as tightly as ``min_precedence``.

        With ``min_precedence`` 0, finished ``:`` branches are popped too.
        """
        stack = self.stack
        while stack:
            kind, op = stack[-1][0], stack[-1][1]
            if kind == "bin":
                if _PRECEDENCE[op] < min_precedence:
                    return
            elif kind == "un":
                if min_precedence > _UNARY_PRECEDENCE:
                    return
            elif kind != ":" or min_precedence > 0:
                return
            self._pop_operator()

    def _close_group(self, token: str, pos: int) -> list[Any]:
        """Pop everything down to the innermost group frame and return that frame."""
        self._reduce(0)
        if not self.stack:
            raise self.error(pos, f"unexpected {token!r}")
        frame = self.stack[-1]
        if frame[0] == "?":
            raise self.error(pos, f"expected ':', found {token!r}")
        return frame

    def _tokenize(self) -> list[tuple[str, str, int]]:
        """Split the text into ``(kind, text, 0-based offset)`` tokens, ending with ``end``.

        One regular-expression match at each position: linear in the length.
        """
        text = self.text
        tokens: list[tuple[str, str, int]] = []
        append, match_at = tokens.append, _TOKEN.match
        pos = 0
        while True:
            m = match_at(text, pos)
            assert m is not None  # the pattern always matches (bad / end alternatives)
            kind = m.lastgroup or "bad"
            start = m.start(kind)
            if kind == "bad":
                raise self.error(start + 1, f"unexpected character {text[start]!r}")
            append((kind, m.group(kind), start))
            if kind == "end":
                return tokens
            pos = m.end()

    def compile(self) -> tuple[_Instruction, ...]:
        """Return the stack program of the text.

        Raises:
            ExpressionError: The text is malformed or exceeds the limits.
        """
        text, limits = self.text, self.limits
        if len(text) > limits.max_length:
            raise self.error(
                limits.max_length + 1,
                f"expression of {len(text):,} characters; "
                f"at most {limits.max_length:,} allowed "
                "(ExpressionLimits.max_length)",
            )
        tokens = self._tokenize()
        if tokens[0][0] == "end":
            raise self.error(tokens[0][2] + 1, "empty expression")
        expect_operand = True
        i = 0
        while True:
            kind, tok, start = tokens[i]
            i += 1
            where = start + 1
            if kind == "end":
                return self._finish(where, expect_operand)
            if expect_operand:
                i, expect_operand = self._operand(tokens, i, kind, tok, where)
            else:
                expect_operand = self._operator(kind, tok, where)

    def _finish(self, where: int, expect_operand: bool) -> tuple[_Instruction, ...]:
        """At the end of the text: close what is open and return the program."""
        if expect_operand:
            raise self.error(where, "expected a number, a name or '(', found 'end of expression'")
        self._reduce(0)
        if self.stack:
            frame = self.stack[-1]
            wanted = ":" if frame[0] == "?" else ")"
            raise self.error(where, f"expected {wanted!r}, found 'end of expression'")
        return tuple(self.program)

    def _operand(
        self, tokens: list[tuple[str, str, int]], i: int, kind: str, tok: str, where: int
    ) -> tuple[int, bool]:
        """Handle a token where an operand is expected (``tokens[i]`` comes next).

        Returns:
            The index of the next token and whether an operand is still expected.
        """
        if kind == "num":
            value = float(tok)
            if not math.isfinite(value):
                raise self.error(where, f"number {tok[:40]!r} is too large")
            self._emit(_PUSH, value, where)
            return i, False
        if kind == "name":
            if tokens[i][1] == "(" and tokens[i][0] == "op":
                if tok not in _FUNCTIONS:
                    raise self.error(where, f"function {tok!r} is not allowed")
                self._open(["call", tok, where, 1])
                return i + 1, True
            self.names.add(tok)
            self._emit(_VAR, tok, where)
            return i, False
        if tok in ("-", "+", "!"):
            self.stack.append(["un", tok, where, None])
        elif tok == "(":
            self._open(["(", tok, where, None])
        else:
            raise self.error(where, f"expected a number, a name or '(', found {tok!r}")
        return i, True

    def _operator(self, kind: str, tok: str, where: int) -> bool:
        """Handle a token where an operator is expected; return whether an operand follows."""
        if kind != "op":
            raise self.error(where, f"unexpected {tok!r}")
        if tok in _PRECEDENCE:
            self._binary(tok, where)
        elif tok == "?":
            self._reduce(1)
            self._open(["?", tok, where, self._emit(_JZ, None, where)])
        elif tok == ":":
            self._reduce(0)
            if not self.stack or self.stack[-1][0] != "?":
                raise self.error(where, "unexpected ':'")
            frame = self.stack[-1]
            jump = self._emit(_JMP, None, where)
            self._patch(frame[3])
            frame[0], frame[1], frame[3] = ":", ":", jump
        elif tok == ",":
            frame = self._close_group(",", where)
            if frame[0] != "call":
                raise self.error(where, "unexpected ','")
            frame[3] += 1
        elif tok == ")":
            self._close_paren(where)
            return False
        else:  # '(' or '!' where an operator belongs
            raise self.error(where, f"unexpected {tok!r}")
        return True

    def _binary(self, tok: str, where: int) -> None:
        """Push the binary operator ``tok`` after popping those that bind tighter."""
        prec = _PRECEDENCE[tok]
        # '^' is right-associative, comparisons do not chain, the rest is left-assoc.
        self._reduce(prec if prec not in (_COMPARISON, _PRECEDENCE["^"]) else prec + 1)
        top = self.stack[-1] if self.stack else None
        if prec == _COMPARISON and top and top[0] == "bin" and _PRECEDENCE[top[1]] == _COMPARISON:
            raise self.error(where, f"unexpected {tok!r}")
        jump = None
        if tok == "&&":
            jump = self._emit(_ANDJ, None, where)
        elif tok == "||":
            jump = self._emit(_ORJ, None, where)
        self.stack.append(["bin", tok, where, jump])

    def _close_paren(self, where: int) -> None:
        """Close the innermost ``(`` or function call; emit the call and check its arity."""
        frame = self._close_group(")", where)
        self.stack.pop()
        self.depth -= 1
        if frame[0] == "call":
            name, argc = frame[1], frame[3]
            lo, hi, _ = _FUNCTIONS[name]
            if argc < lo or (hi >= 0 and argc > hi):
                more = "" if hi == lo else " or more"
                message = f"{name}() takes {lo} argument(s){more}, got {argc}"
                raise self.error(frame[2], message)
            self._emit(_CALL, (name, argc), frame[2])


def _number(value: Any) -> float | None:
    """Return ``value`` as a float if it is a real number (not a bool or a string)."""
    cls = value.__class__
    if cls is float:
        return value
    if cls is int:
        try:
            return float(value)
        except OverflowError:
            return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except (OverflowError, ValueError, TypeError):
        return None


@dataclass(frozen=True)
class Expression:
    """A parsed expression; call :meth:`evaluate` with the variable values.

    Attributes:
        text: The source text.
        program: The compiled stack program (an implementation detail).
        names: The variable names it uses.
    """

    text: str
    program: tuple[_Instruction, ...]
    names: frozenset[str]

    def _error(self, position: int, message: str) -> ExpressionError:
        return ExpressionError(self.text, position, message)

    def _variable(self, env: Mapping[str, float], name: str, pos: int) -> float:
        try:
            raw = env[name]
        except (KeyError, TypeError, IndexError):
            try:
                known = ", ".join(sorted(str(k) for k in env)) or "none"
            except TypeError:
                known = "none"
            if len(known) > 400:
                known = known[:400] + ", ..."
            raise self._error(pos, f"unknown name {name!r} (known: {known})") from None
        value = _number(raw)
        if value is None:
            shown = repr(raw)
            shown = shown if len(shown) <= 60 else shown[:60] + "..."
            raise self._error(
                pos, f"variable {name!r} is {shown}, expected a finite number (below 1.8e308)"
            )
        return value

    def evaluate(self, variables: Mapping[str, float] | None = None) -> float:
        """Evaluate with ``variables`` bound.

        Raises:
            ExpressionError: An unknown or non-numeric name, a division by zero, a math
                domain error, a complex result or an overflow; the message gives the
                position.
        """
        env: Mapping[str, float] = {} if variables is None else variables
        if not isinstance(env, Mapping):
            raise self._error(
                1, f"variables must be a mapping of names to numbers, got {type(env).__name__}"
            )
        program = self.program
        stack: list[float] = []
        push, pop, isfinite = stack.append, stack.pop, math.isfinite
        pc, end = 0, len(program)
        while pc < end:
            opcode, arg, pos = program[pc]
            pc += 1
            if opcode == _VAR:
                try:
                    value = env[arg]
                except (KeyError, TypeError, IndexError):
                    value = None
                if value.__class__ is not float:  # ints, other numbers, errors
                    value = self._variable(env, arg, pos)
                push(value)
            elif opcode == _PUSH:
                push(arg)
            elif opcode == _BIN:
                b = pop()
                a = stack[-1]
                try:
                    result = arg[1](a, b)
                except (ArithmeticError, ValueError, TypeError) as exc:
                    raise self._binary_error(arg[0], a, b, pos, exc) from None
                if result.__class__ is not float or not isfinite(result):
                    result = self._checked(arg[0], a, b, result, pos)
                stack[-1] = result
            elif opcode == _JZ:
                if not pop():
                    pc = arg
            elif opcode == _JMP:
                pc = arg
            elif opcode == _NEG:
                stack[-1] = -stack[-1]
            elif opcode == _NOT:
                stack[-1] = float(not stack[-1])
            elif opcode == _ANDJ:
                if not stack[-1]:
                    stack[-1] = 0.0
                    pc = arg
                else:
                    pop()
            elif opcode == _ORJ:
                if stack[-1]:
                    stack[-1] = 1.0
                    pc = arg
                else:
                    pop()
            elif opcode == _BOOL:
                stack[-1] = float(bool(stack[-1]))
            else:  # _CALL
                name, argc = arg
                args = stack[-argc:]
                del stack[-argc:]
                push(self._call(name, args, pos))
        return stack[-1]

    def _binary_error(
        self, op: str, a: float, b: float, pos: int, exc: BaseException
    ) -> ExpressionError:
        if isinstance(exc, OverflowError):
            return self._error(pos, f"{a!r} {op} {b!r}: overflow")
        return self._error(pos, f"{a!r} {op} {b!r}: {exc or type(exc).__name__}")

    def _checked(self, op: str, a: float, b: float, result: Any, pos: int) -> float:
        """Check a result that is not a finite float: complex, or an overflow."""
        if isinstance(result, complex):
            raise self._error(pos, f"{a!r} {op} {b!r}: complex result")
        if not math.isfinite(result) and math.isfinite(a) and math.isfinite(b):
            raise self._error(pos, f"{a!r} {op} {b!r}: overflow (result is {result})")
        return float(result)

    def _call(self, name: str, args: list[float], pos: int) -> float:
        shown = f"{name}({', '.join(repr(a) for a in args[:8])}{', ...' if len(args) > 8 else ''})"
        try:
            result = float(_FUNCTIONS[name][2](*args))
        except OverflowError:
            raise self._error(pos, f"{shown}: overflow") from None
        except (ArithmeticError, ValueError, TypeError) as exc:
            raise self._error(pos, f"{shown}: {exc or type(exc).__name__}") from None
        if not math.isfinite(result) and all(math.isfinite(a) for a in args):
            raise self._error(pos, f"{shown}: overflow (result is {result})")
        return result


@lru_cache(maxsize=4096)
def _parse_cached(text: str, limits: ExpressionLimits) -> Expression:
    compiler = _Compiler(text, limits)
    program = compiler.compile()
    return Expression(text, program, frozenset(compiler.names))


_CACHED_LENGTH = 4096  # longer texts are compiled without being kept in the cache


def parse_expression(text: Any, *, limits: ExpressionLimits | None = None) -> Expression:
    """Parse an expression (numbers are accepted as constant expressions).

    Args:
        text: The expression, or a number.
        limits: Bounds on length and nesting (default :class:`ExpressionLimits`).

    Raises:
        ExpressionError: The text uses anything outside the whitelist, is malformed,
            exceeds the limits, or is neither a string nor a finite number; the message
            names the expression and the 1-based position.
    """
    limits = DEFAULT_LIMITS if limits is None else limits
    if not isinstance(limits, ExpressionLimits):
        raise InvalidTypeError(f"limits={limits!r}: expected an ExpressionLimits")
    if isinstance(text, str):
        if len(text) <= _CACHED_LENGTH:
            return _parse_cached(text, limits)
        compiler = _Compiler(text, limits)
        program = compiler.compile()
        return Expression(text, program, frozenset(compiler.names))
    shown = repr(text)
    shown = shown if len(shown) <= 80 else shown[:80] + "..."
    value = _number(text)
    if value is None:
        raise ExpressionError(
            shown, 1, f"expected a string or a finite number, got {type(text).__name__}"
        )
    if not math.isfinite(value):
        raise ExpressionError(shown, 1, "expected a finite number")
    return Expression(shown, ((_PUSH, value, 1),), frozenset())


def evaluate(
    text: Any,
    variables: Mapping[str, float] | None = None,
    *,
    limits: ExpressionLimits | None = None,
) -> float:
    """Parse (cached) and evaluate ``text`` with ``variables``.

    Args:
        text: The expression, or a number.
        variables: Values of the names the expression uses.
        limits: Bounds on length and nesting (default :class:`ExpressionLimits`).

    Raises:
        ExpressionError: Parsing or evaluation failed.
    """
    return parse_expression(text, limits=limits).evaluate(variables)
