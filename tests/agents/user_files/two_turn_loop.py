"""A user's agent-loop file, written against verl's API with ``verl`` replaced by ``hybridflow``.

Two model turns with a fixed observation between them: the observation tokens must come back with
``response_mask == 0`` and log-prob 0, the model tokens with their rollout log-probs.
"""

from typing import Any
from uuid import uuid4

from hybridflow.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from hybridflow.utils.profiler import simple_timer
from hybridflow.utils.rollout_trace import rollout_trace_op

OBSERVATION = "|ok|"


@register("two_turn_decorated")
class TwoTurnAgentLoop(AgentLoopBase):
    def __init__(self, *args, first_turn_tokens: int = 2, **kwargs):
        super().__init__(*args, **kwargs)
        self.first_turn_tokens = first_turn_tokens
        self.response_length = self.config.actor_rollout_ref.rollout.response_length

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        prompt_ids = await self.apply_chat_template(list(kwargs["raw_prompt"]))
        request_id = uuid4().hex
        metrics: dict[str, float] = {}
        first = dict(sampling_params, max_tokens=self.first_turn_tokens)
        with simple_timer("generate_sequences", metrics):
            out1 = await self.server_manager.generate(request_id=request_id, prompt_ids=prompt_ids,
                                                      sampling_params=first)
        observation = self.tokenizer.encode(OBSERVATION, add_special_tokens=False)
        response = list(out1.token_ids) + observation
        mask = [1] * len(out1.token_ids) + [0] * len(observation)
        logprobs = list(out1.log_probs or []) + [0.0] * len(observation)
        budget = self.response_length - len(response)
        if budget > 0:
            second = dict(sampling_params, max_tokens=budget)
            with simple_timer("generate_sequences", metrics):
                out2 = await self.server_manager.generate(request_id=request_id, prompt_ids=prompt_ids + response,
                                                          sampling_params=second)
            response += out2.token_ids
            mask += [1] * len(out2.token_ids)
            logprobs += list(out2.log_probs or [])
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response[: self.response_length],
            response_mask=mask[: self.response_length],
            response_logprobs=logprobs[: self.response_length] if out1.log_probs is not None else None,
            num_turns=4,
            metrics=metrics,
        )
