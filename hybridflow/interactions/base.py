"""``BaseInteraction``: the user side of a multi-turn conversation (verl's class, same signatures).

The agent loop starts one interaction instance per trajectory with the sample's ``interaction_kwargs``, asks
it for a reply after each assistant turn that made no tool call, and finalizes it at the end::

    instance_id = await interaction.start_interaction(request_id, **interaction_kwargs)
    should_terminate, reply, turn_score, metadata = await interaction.generate_response(
        instance_id, messages, **interaction_kwargs)
    ...
    await interaction.finalize_interaction(instance_id)

``reply`` becomes a ``user`` message; ``turn_score`` is appended to the trajectory's ``turn_scores`` (what the
reward function receives); ``should_terminate`` ends the trajectory.
"""

from __future__ import annotations

import uuid
from typing import Any


class BaseInteraction:
    """Subclasses override :meth:`generate_response` (and usually the other three methods).

    ``config`` is the ``config:`` mapping of the interaction YAML entry; the loader adds ``name``.
    """

    def __init__(self, config: dict[str, Any]):
        self.config = dict(config or {})
        self.name: str = str(self.config["name"]) if "name" in self.config else "interaction_agent"

    async def start_interaction(self, instance_id: str | None = None, **kwargs) -> str:
        """Begin a conversation; returns its instance id (a new one when none is given)."""
        return instance_id if instance_id is not None else str(uuid.uuid4())

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs) -> tuple[bool, str, float, dict[str, Any]]:
        """``(should_terminate_sequence, response_content, current_turn_score, additional_data)``."""
        return False, "Your current result seems acceptable.", 0.8, {}

    async def calculate_score(self, instance_id: str | None = None, **kwargs) -> float:
        """A score for the conversation so far (turn level)."""
        return 0.0

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs) -> None:
        """Release the conversation's state."""


def last_assistant_content(messages: list[dict[str, Any]]) -> str:
    """Text of the latest assistant message ("" when there is none); list contents are joined."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            content = message.get("content") or ""
            if isinstance(content, list):
                content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
            return str(content)
    return ""


__all__ = ["BaseInteraction", "last_assistant_content"]
