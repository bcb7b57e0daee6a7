"""``calculator``: exact arithmetic for the model, evaluated from the syntax tree (never ``eval``).

Math-reasoning policies make arithmetic slips; a calculator tool lets RL learn to delegate them. The
expression is parsed with :mod:`ast` and only numbers, ``+ - * / // % **``, unary signs, parentheses and a
few pure functions are evaluated. Sizes are bounded (exponent, digits, expression length) so a call such as
``9**9**9`` returns an error instead of eating the trainer's CPU and memory.
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass

from hybridflow.tools.base_tool import BaseTool, ExecuteResult, error_result, parse_tool_config, register_tool
from hybridflow.tools.schemas import ToolResponse

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS = {
    "abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt, "log": math.log, "exp": math.exp,
    "floor": math.floor, "ceil": math.ceil,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}


class CalculatorError(ValueError):
    """The expression is not plain arithmetic or exceeds the size limits."""


def evaluate(expression: str, max_exponent: int = 1000, max_digits: int = 4000) -> int | float:
    """Value of an arithmetic ``expression``; raises :class:`CalculatorError` with a readable reason."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"not a valid expression: {e.msg}") from None
    return _Evaluator(max_exponent, max_digits).visit(tree.body)


class _Evaluator:
    def __init__(self, max_exponent: int, max_digits: int):
        self.max_exponent = max_exponent
        self.max_digits = max_digits

    def visit(self, node: ast.AST):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return self._bounded(node.value)
        if isinstance(node, ast.Name) and node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](self.visit(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return self._binary(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
            if node.keywords:
                raise CalculatorError(f"{node.func.id}() takes positional arguments only")
            try:
                return self._bounded(_FUNCTIONS[node.func.id](*[self.visit(a) for a in node.args]))
            except (TypeError, ValueError, OverflowError) as e:
                raise CalculatorError(f"{node.func.id}(): {e}") from None
        allowed = "numbers, + - * / // % **, parentheses, " + ", ".join(sorted(_FUNCTIONS) + sorted(_CONSTANTS))
        raise CalculatorError(f"unsupported element '{ast.unparse(node)}'; allowed: {allowed}")

    def _binary(self, node: ast.BinOp):
        left, right = self.visit(node.left), self.visit(node.right)
        if isinstance(node.op, ast.Pow):
            if abs(right) > self.max_exponent:
                raise CalculatorError(f"exponent {right} is larger than the limit {self.max_exponent}")
            if isinstance(left, int) and isinstance(right, int) and left.bit_length() * right > self.max_digits * 3.33:
                raise CalculatorError(f"result has more than {self.max_digits} digits")
        try:
            return self._bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result is too large") from None

    def _bounded(self, value):
        if isinstance(value, complex):
            raise CalculatorError("result is not a real number")
        if isinstance(value, int) and value.bit_length() > self.max_digits * 3.33:
            raise CalculatorError(f"result has more than {self.max_digits} digits")
        return value


def format_number(value: int | float) -> str:
    """Integers exactly; floats without binary noise (0.1+0.2 -> 0.3), integral floats as integers."""
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) < 1e16:
            return str(int(value))
        return f"{value:.12g}"
    return str(value)


@dataclass
class CalculatorConfig:
    max_expression_chars: int = 500
    max_exponent: int = 1000
    max_digits: int = 4000


@register_tool("calculator")
class CalculatorTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression, e.g. '(12 + 7) * 3 / 4'.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "the arithmetic expression"}},
                "required": ["expression"],
            },
        },
    }

    def __init__(self, config: dict | None = None, tool_schema=None):
        super().__init__(config, tool_schema)
        self.settings = parse_tool_config(CalculatorConfig, self.config, self.name)

    def coerce_arguments(self, arguments: dict) -> dict:
        if type(arguments.get("expression")) in (int, float):
            return dict(arguments, expression=str(arguments["expression"]))
        return arguments

    async def execute(self, instance_id: str, parameters: dict, **kwargs) -> ExecuteResult:
        args, bad = self.check_arguments(parameters)
        if bad is not None:
            return bad
        expression = args["expression"]
        if len(expression) > self.settings.max_expression_chars:
            return error_result(f"expression longer than {self.settings.max_expression_chars} characters")
        try:
            value = evaluate(expression, self.settings.max_exponent, self.settings.max_digits)
        except CalculatorError as e:
            return error_result(f"calculator: {e}")
        return ToolResponse(text=format_number(value)), 0.0, {}


__all__ = ["CalculatorTool", "CalculatorConfig", "CalculatorError", "evaluate", "format_number"]
