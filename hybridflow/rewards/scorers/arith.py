"""Safe evaluation of small arithmetic expressions (countdown answers) without ``eval``.

Model output is untrusted text: it is parsed with :mod:`ast` and only integer literals, ``+ - * /``, unary
minus and parentheses are accepted, so no name lookup, call or attribute access can ever run.
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_MAX_LEN = 200


class ExpressionError(ValueError):
    """The text is not a plain arithmetic expression over integers."""


def evaluate(expr: str) -> Fraction:
    """Exact value of ``expr`` (``Fraction`` so ``6/4*2`` is exactly 3); raises :class:`ExpressionError`."""
    if len(expr) > _MAX_LEN:
        raise ExpressionError("expression too long")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(str(exc)) from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div):
            if right == 0:
                raise ExpressionError("division by zero")
            return left / right
        return _OPS[type(node.op)](left, right)
    raise ExpressionError(f"unsupported element {type(node).__name__}")


def literals(expr: str) -> list[int]:
    """The integer literals of ``expr`` in order (used to check each given number is used exactly once)."""
    tree = ast.parse(expr.strip(), mode="eval")
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and type(n.value) is int]
