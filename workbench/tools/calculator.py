"""`Calculator`: a built-in tool that evaluates arithmetic, safely.

The expression is parsed with `ast` and walked by hand; only numeric literals (int, float),
parentheses, the binary operators + - * / // % ** and unary + - are allowed. Names, calls,
attributes, subscripts, strings, comparisons and everything else are refused, so nothing can
run code, import, read files or reach the network. Sizes are bounded: the expression's length,
its nesting depth and node count, integer results (bits), exponents (checked before computing
a power), and float results must be finite. Every refusal is a `ToolError` with a short reason.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from workbench.tools.spec import ToolError, ToolSpec

MAX_LENGTH = 500  # characters of expression
MAX_DEPTH = 32  # nesting of operators
MAX_NODES = 200
MAX_INT_BITS = 4096  # |integer results| < 2**4096 (about 1233 digits)

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}

Number = int | float


def _check_size(value: Any) -> Number:
    if isinstance(value, complex):
        raise ToolError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("the result is too large (not a finite number)")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolError(f"the result is too large (more than {MAX_INT_BITS} bits)")
    return value


def _power(base: Number, exponent: Number) -> Number:
    """`base ** exponent`, refused before computing when the result could not fit."""
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1:
        if exponent * (abs(base).bit_length() - 1) > MAX_INT_BITS:
            raise ToolError(f"the result is too large (more than {MAX_INT_BITS} bits)")
    if isinstance(exponent, float) and abs(exponent) > 1e6 and abs(base) > 1:
        raise ToolError("the exponent is too large")
    try:
        return base ** exponent
    except OverflowError:
        raise ToolError("the result is too large (not a finite number)") from None
    except ZeroDivisionError:
        raise ToolError("zero cannot be raised to a negative power") from None


class _Evaluator:
    def __init__(self) -> None:
        self.nodes = 0

    def eval(self, node: ast.AST, depth: int = 0) -> Number:
        self.nodes += 1
        if depth > MAX_DEPTH:
            raise ToolError(f"the expression is nested too deeply (more than {MAX_DEPTH} levels)")
        if self.nodes > MAX_NODES:
            raise ToolError(f"the expression is too long (more than {MAX_NODES} parts)")
        if isinstance(node, ast.Constant):
            if type(node.value) not in (int, float):  # bool, str, complex, None, ...
                raise ToolError(f"only numbers are allowed, not {node.value!r}")
            return _check_size(node.value)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](self.eval(node.operand, depth + 1))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left = self.eval(node.left, depth + 1)
            right = self.eval(node.right, depth + 1)
            if isinstance(node.op, ast.Pow):
                return _check_size(_power(left, right))
            try:
                return _check_size(_BINARY[type(node.op)](left, right))
            except ZeroDivisionError:
                raise ToolError("division by zero") from None
            except OverflowError:
                raise ToolError("the result is too large (not a finite number)") from None
        if isinstance(node, ast.Name):
            raise ToolError(f"names are not allowed: {node.id!r}")
        raise ToolError(f"{type(node).__name__} is not allowed: only numbers, + - * / // % ** "
                        "and parentheses")


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression; `ToolError` for anything else.

    >>> evaluate("2 ** 10 - (3 + 4) * 5 // 2")
    1007
    >>> evaluate("__import__('os')")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    workbench.tools.spec.ToolError: Call is not allowed: only numbers, + - * / // % ** and ...
    """
    if not isinstance(expression, str):
        raise ToolError("the expression must be a string")
    if len(expression) > MAX_LENGTH:
        raise ToolError(f"the expression is too long (more than {MAX_LENGTH} characters)")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise ToolError(f"not an arithmetic expression: {getattr(exc, 'msg', exc)}") from None
    except (RecursionError, MemoryError):
        raise ToolError("the expression is nested too deeply") from None
    return _Evaluator().eval(tree.body)


def format_number(value: Number) -> str:
    """Integers in full, floats as Python's shortest repr (an integral float as `2.0`)."""
    return str(value) if isinstance(value, int) else repr(value)


class Calculator:
    """The `calculator` tool: `{"expression": "..."}` -> the value as text."""

    spec = ToolSpec(
        name="calculator",
        description=("Evaluates an arithmetic expression with numbers, parentheses and the "
                     "operators + - * / // % ** and returns its value."),
        parameters={"type": "object",
                    "properties": {"expression": {
                        "type": "string", "description": "for example (3 + 4) * 12 / 7",
                        "pattern": r"^[0-9.+\-*/%() ]+$", "maxLength": 80}},
                    "required": ["expression"], "additionalProperties": False})

    def run(self, arguments: dict[str, Any]) -> str:
        expression = arguments.get("expression")
        if expression is None:
            raise ToolError("missing argument 'expression'")
        if isinstance(expression, (int, float)) and not isinstance(expression, bool):
            expression = str(expression)
        return format_number(evaluate(expression))
