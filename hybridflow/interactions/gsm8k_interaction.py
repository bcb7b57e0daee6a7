"""``Gsm8kInteraction``: the user checks the model's GSM8K answer and asks it to retry (verl's behaviour).

After each assistant turn the latest answer is scored with the strict GSM8K rule (``#### <number>``): a correct
answer ends the conversation with "Your response is correct!" and score 1.0; otherwise the user says "Your
response is incorrect! You need to reflect on your answer and try again." (score 0.0) and the model gets
another turn. The sample's ``interaction_kwargs`` carry ``ground_truth`` (``hybridflow data gsm8k --tool``
writes it); without one the instance stores ``None`` (as verl) and no answer is ever judged correct, which is
logged once per interaction. The instances live in ``_instance_dict`` (verl's attribute: ``{"response",
"ground_truth", "reward"}`` per instance id), and ``response`` is the last assistant message's ``content`` as given
(``None`` when the message has none, as verl; it is scored as an empty answer).
"""

from __future__ import annotations

import logging
from typing import Any

from hybridflow.interactions.base import BaseInteraction, last_assistant_content
from hybridflow.rewards.scorers import gsm8k

CORRECT = "Your response is correct!"
INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again."

logger = logging.getLogger(__name__)


class Gsm8kInteraction(BaseInteraction):
    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        unknown = sorted(set(self.config) - {"name"})
        if unknown:
            raise ValueError(f"interaction '{self.name}' (Gsm8kInteraction) takes no config keys, got {unknown}")
        self._instance_dict: dict[str, dict[str, Any]] = {}
        self._warned_no_ground_truth = False

    async def start_interaction(self, instance_id: str | None = None, ground_truth: str | None = None,
                                **kwargs) -> str:
        if ground_truth is None and not self._warned_no_ground_truth:
            self._warned_no_ground_truth = True
            logger.warning("interaction '%s' started without ground_truth (the sample's "
                           "extra_info.interaction_kwargs.ground_truth): its answers can never be judged correct",
                           self.name)
        instance_id = await super().start_interaction(instance_id)
        truth = None if ground_truth is None else str(ground_truth)
        self._instance_dict[instance_id] = {"response": "", "ground_truth": truth, "reward": 0.0}
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs) -> tuple[bool, str, float, dict[str, Any]]:
        state = self._state(instance_id)
        last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
        state["response"] = "" if last is None else (None if last.get("content") is None
                                                     else last_assistant_content([last]))
        reward = await self.calculate_score(instance_id)
        state["reward"] = reward
        if reward == 1.0:
            return True, CORRECT, reward, {}
        return False, INCORRECT, reward, {}

    async def calculate_score(self, instance_id: str | None = None, **kwargs) -> float:
        state = self._state(instance_id)
        return gsm8k.compute_score(state["response"] or "", state["ground_truth"], method="strict", format_score=0.0,
                                   score=1.0)

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs) -> None:
        """Drop the instance; an id that was never started (or is already finalized) is a ``KeyError``."""
        self._state(instance_id)
        del self._instance_dict[instance_id]

    def _state(self, instance_id: str | None) -> dict[str, Any]:
        if instance_id not in self._instance_dict:
            raise KeyError(f"interaction '{self.name}': unknown instance {instance_id!r}; call start_interaction first")
        return self._instance_dict[instance_id]


__all__ = ["Gsm8kInteraction", "CORRECT", "INCORRECT"]
