"""``calc_gsm8k_reward``: the model submits a GSM8K answer and is told whether it is right (verl's Gsm8kTool).

Used by verl's multi-turn GSM8K examples: the sample's ``tools_kwargs.calc_gsm8k_reward.create_kwargs.
ground_truth`` is stored per trajectory; each call compares the submitted answer after numeric normalisation
(``"$1,234.00"`` == ``"1234"``). The trajectory reward (:meth:`calc_reward`) is the best answer's score; a
call that does not improve it gets a small negative step reward so that spamming the checker is discouraged
(the shaping verl uses).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hybridflow.tools.base_tool import BaseTool, ExecuteResult, merge_create_kwargs, parse_tool_config, register_tool
from hybridflow.tools.schemas import ToolResponse

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def normalize_answer(text: str) -> str:
    """Canonical form of an answer: the last number with ``$``, ``,`` and trailing zeros removed, else the
    lower-cased stripped text (so non-numeric answers still compare sensibly)."""
    cleaned = str(text).replace(",", "").replace("$", "").replace("####", " ").strip()
    numbers = _NUMBER.findall(cleaned)
    if not numbers:
        return cleaned.lower().rstrip(".")
    value = numbers[-1]
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    if value in ("-0", ""):
        value = "0"
    return value


def answers_match(answer: str, ground_truth: str) -> bool:
    return normalize_answer(answer) == normalize_answer(ground_truth)


@dataclass
class Gsm8kToolConfig:
    correct_reward: float = 1.0
    no_improvement_penalty: float = -0.05


@register_tool("calc_gsm8k_reward")
class Gsm8kTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "calc_gsm8k_reward",
            "description": "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if "
                           "parsed answer is incorrect or not correctly parsed)",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": "The model's answer to the GSM8K "
                                                                            "math problem, must be a digits"}},
                "required": ["answer"],
            },
        },
    }

    def __init__(self, config: dict | None = None, tool_schema=None):
        super().__init__(config, tool_schema)
        self.settings = parse_tool_config(Gsm8kToolConfig, self.config, self.name)

    async def create(self, instance_id: str | None = None, ground_truth: str | None = None,
                     **kwargs) -> tuple[str, ToolResponse]:
        """``ground_truth`` may come directly or nested in ``create_kwargs`` (both spellings appear in verl data)."""
        kwargs = merge_create_kwargs(kwargs)
        ground_truth = ground_truth if ground_truth is not None else kwargs.pop("ground_truth", None)
        if ground_truth is None:
            raise ValueError(
                f"{self.name}.create() needs ground_truth: put it in the sample's "
                f"extra_info.tools_kwargs.{self.name}.create_kwargs.ground_truth"
            )
        instance_id, response = await super().create(instance_id, **kwargs)
        self._instances[instance_id].update(ground_truth=str(ground_truth), answer=None)
        return instance_id, response

    def coerce_arguments(self, arguments: dict) -> dict:
        if type(arguments.get("answer")) in (int, float):
            return dict(arguments, answer=str(arguments["answer"]))  # 72 is as good an answer as "72"
        return arguments

    async def execute(self, instance_id: str, parameters: dict, **kwargs) -> ExecuteResult:
        args, bad = self.check_arguments(parameters)
        if bad is not None:
            return bad
        state = self._instance(instance_id)
        answer = str(args["answer"])
        score = self.settings.correct_reward if answers_match(answer, state["ground_truth"]) else 0.0
        step_reward = 0.0 if score > state["reward"] else self.settings.no_improvement_penalty
        state["reward"] = max(state["reward"], score)
        state["answer"] = answer
        text = f"Current parsed answer={normalize_answer(answer)!r} reward={score}"
        return ToolResponse(text=text), step_reward, {"correct": float(score > 0)}


__all__ = ["Gsm8kTool", "Gsm8kToolConfig", "normalize_answer", "answers_match"]
