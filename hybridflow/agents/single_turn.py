"""``single_turn_agent``: one prompt, one model turn -- the default loop, and plain GRPO/PPO's generation.

The prompt is the row's ``raw_prompt_ids`` (the dataset's own rendering, truncated to
``data.max_prompt_length`` as the dataset's ``truncation`` mode says) when the row has them and no tool
schemas must be shown; otherwise ``raw_prompt`` rendered with the chat template (and the schemas of
``data.tool_config_path``, as verl's single-turn loop does). A vision-language row's images (its
``multi_modal_data``) go to the rollout with the prompt and ride in the output's ``multi_modal_data``.
"""

from __future__ import annotations

import time
from typing import Any

from hybridflow.agents.base import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from hybridflow.agents.tool_session import load_tool_schemas
from hybridflow.agents.trajectory_images import row_images

__all__ = ["SingleTurnAgentLoop"]


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.response_length = int(self.typed_config.actor_rollout_ref.rollout.response_length)
        data = self.typed_config.data
        self.tool_schemas = load_tool_schemas(data.tool_config_path, getattr(data, "function_tool_path", None))

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        raw_ids = kwargs.get("raw_prompt_ids")
        images = row_images(kwargs) if self.processor is not None else []
        if raw_ids is not None and not self.tool_schemas:
            prompt_ids = [int(t) for t in raw_ids]
        else:
            prompt_ids = await self.apply_chat_template(list(kwargs["raw_prompt"]), tools=self.tool_schemas or None,
                                                        images=images or None)
        params = dict(sampling_params)
        params["max_tokens"] = min(int(params.get("max_tokens", self.response_length)), self.response_length)
        start = time.perf_counter()
        output = await self.server_manager.generate(request_id=kwargs["request_id"], prompt_ids=prompt_ids,
                                                    sampling_params=params, image_data=images or None)
        metrics = AgentLoopMetrics(generate_sequences=time.perf_counter() - start)
        tokens = output.token_ids[: self.response_length]
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=tokens,
            response_mask=[1] * len(tokens),
            response_logprobs=output.log_probs[: self.response_length] if output.log_probs is not None else None,
            multi_modal_data={"image": images} if images else None,
            num_turns=2,
            metrics=metrics,
            extra_fields={"finish_reason": output.finish_reason, "turn_scores": [], "tool_rewards": [],
                          # a partial rollout: tokens per weight version (the trainer's token_versions)
                          **({"weight_segments": list(output.weight_segments)} if output.weight_segments else {})},
        )
