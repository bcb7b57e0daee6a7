"""A user's agent loop with a long tail: two model turns; between them every fourth prompt waits (a slow tool).

Written against verl's API (``verl`` -> ``hybridflow``); loaded by name from ``loops.yaml``.  The wait makes
trajectories finish out of order and straddle weight syncs, which is what async training must handle.
"""

import asyncio
from typing import Any

from hybridflow.experimental.agent_loop import AgentLoopBase, AgentLoopOutput


class SlowTurnsAgentLoop(AgentLoopBase):
    def __init__(self, *args, slow_seconds: float = 0.5, **kwargs):
        super().__init__(*args, **kwargs)
        self.slow_seconds = float(slow_seconds)
        self.response_length = int(self.config.actor_rollout_ref.rollout.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        prompt_ids = [int(t) for t in kwargs["raw_prompt_ids"]]
        request_id = kwargs["request_id"]
        half = max(1, self.response_length // 2)
        first = await self.server_manager.generate(request_id=request_id, prompt_ids=prompt_ids,
                                                   sampling_params=dict(sampling_params, max_tokens=half))
        if int(kwargs.get("index", 0)) % 4 == 0:
            await asyncio.sleep(self.slow_seconds)
        response = list(first.token_ids)
        logprobs = list(first.log_probs or [])
        left = self.response_length - len(response)
        if left > 0 and first.finish_reason != "stop":
            second = await self.server_manager.generate(request_id=request_id, prompt_ids=prompt_ids + response,
                                                        sampling_params=dict(sampling_params, max_tokens=left))
            response += list(second.token_ids)
            logprobs += list(second.log_probs or [])
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=response, response_mask=[1] * len(response),
                               response_logprobs=logprobs if first.log_probs is not None else None, num_turns=3)
